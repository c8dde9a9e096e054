// The layer registry (dfp/layer_kind.hpp, src/graph/layer_registry.cpp): every kind is built by its
// row, by kind and by name, with the bits of its named builder; parameters by name are checked
// against the row's fields.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/layer_kind.hpp"
#include "dfp/model.hpp"
#include "tests/common/expect_error.hpp"
#include "tests/common/model_helpers.hpp"

namespace dfp {
namespace {

using test::batch_images;
using test::ctx2;
using Values = std::vector<std::pair<std::string, double>>;

// One graph with every kind, made by `add`(kind name, inputs, named parameters).
Model::Node every_kind(Model& m, const std::function<Model::Node(const char*, std::vector<Model::Node>, Values)>& add) {
  const Model::Node x = m.input(4, 8, 8);
  const auto c = add("conv", {x}, {{"out_channels", 8}, {"kernel", 3}, {"pad", 1}, {"bias", 1}, {"groups", 2}});
  const auto b = add("batchnorm", {c}, {{"eps", 1e-3}});
  const auto r = add("relu", {b}, {});
  const auto l = add("lrn", {r}, {{"size", 3}, {"alpha", 1e-3}, {"beta", 0.75}, {"k", 2}});
  const auto mp = add("maxpool", {l}, {{"kernel", 2}, {"stride", 2}, {"ceil_mode", 1}});
  const auto ap = add("avgpool", {l}, {{"kernel", 3}, {"stride", 2}, {"pad", 1}});
  const auto s = add("add", {mp, ap}, {});
  const auto sp = add("shortcut_pad", {x}, {{"out_channels", 8}, {"stride", 2}});
  const auto cat = add("concat", {s, sp}, {});
  const auto d = add("dropout", {cat}, {{"p", 0.25}});
  const auto g = add("global_avgpool", {d}, {});
  const auto f = add("flatten", {g}, {});
  return add("linear", {f}, {{"out_features", 5}, {"bias", 1}});
}

std::vector<float> trained_logits(Model& m, Model::Node z) {
  m.softmax_cross_entropy(z);
  m.build(2, PrecisionPolicy{});
  const std::vector<float> x = batch_images(m, 7);
  const int32_t labels[2] = {1, 3};
  m.forward(x.data(), labels, 2, true);  // dropout's mask and BatchNorm's batch statistics
  m.backward();
  std::vector<float> out(2 * 5);
  m.predict(x.data(), 2, out.data());
  return out;
}

TEST(LayerRegistry, EveryKindByNameIsItsNamedBuilderBitForBit) {
  Model named(ctx2(), "m"), by_name(ctx2(), "m"), by_kind(ctx2(), "m");
  const Model::Node z1 = every_kind(named, [&](const char* k, std::vector<Model::Node> in, Values) -> Model::Node {
    const std::string s = k;
    const int x = in[0];
    if (s == "conv") return named.conv(x, 8, 3, 1, 1, true, "", 2);
    if (s == "batchnorm") return named.batchnorm(x, "", 1e-3);
    if (s == "relu") return named.relu(x);
    if (s == "lrn") return named.lrn(x, 3, 1e-3f, 0.75f, 2.f);
    if (s == "maxpool") return named.maxpool(x, 2, 2, 0, true);
    if (s == "avgpool") return named.avgpool(x, 3, 2, 1);
    if (s == "add") return named.add(in[0], in[1]);
    if (s == "shortcut_pad") return named.shortcut_pad(x, 8, 2);
    if (s == "concat") return named.concat(in);
    if (s == "dropout") return named.dropout(x, 0.25f);
    if (s == "global_avgpool") return named.global_avgpool(x);
    if (s == "flatten") return named.flatten(x);
    return named.linear(x, 5, true);
  });
  std::set<std::string> seen;
  const Model::Node z2 = every_kind(by_name, [&](const char* k, std::vector<Model::Node> in, Values v) {
    seen.insert(k);
    return by_name.layer(k, std::move(in), v);
  });
  const Model::Node z3 = every_kind(by_kind, [&](const char* k, std::vector<Model::Node> in, Values v) {
    const LayerKind kind = layer_kind(k).kind;
    return by_kind.layer(kind, std::move(in), layer_params(kind, v, "test"));
  });
  std::set<std::string> all;
  for (const LayerKindInfo& k : layer_kinds()) all.insert(k.name);
  EXPECT_EQ(seen, all) << "the graph above covers every kind the registry has";
  EXPECT_EQ(named.summary(), by_name.summary());
  EXPECT_EQ(named.summary(), by_kind.summary());
  const std::vector<LayerSpec> g1 = named.graph(), g2 = by_name.graph();
  ASSERT_EQ(g1.size(), g2.size());
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_EQ(g1[i].kind, g2[i].kind) << i;
    EXPECT_EQ(g1[i].params.index(), g2[i].params.index()) << i;
  }
  EXPECT_EQ(g1[1].get<ConvParams>().groups, 2);
  EXPECT_EQ(g2[4].get<LrnParams>().k, 2.f);
  EXPECT_TRUE(g2[5].get<PoolParams>().ceil_mode);
  const std::vector<float> a = trained_logits(named, z1), b = trained_logits(by_name, z2),
                           c = trained_logits(by_kind, z3);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

TEST(LayerRegistry, RowsDescribeTheirKinds) {
  const LayerKindInfo& bn = layer_kind("bn");
  EXPECT_EQ(bn.kind, LayerKind::batchnorm);
  EXPECT_EQ(&bn, &layer_kind("batchnorm"));
  EXPECT_EQ(bn.torch_module, "BatchNorm2d");
  const LayerKindInfo& lrn = layer_kind(LayerKind::lrn);
  EXPECT_EQ(lrn.torch_module, "LocalResponseNorm");
  ASSERT_EQ(lrn.fields.size(), 4u);
  EXPECT_TRUE(lrn.fields[0].required);
  EXPECT_EQ(lrn.fields[3].name, "k");
  EXPECT_EQ(lrn.fields[3].default_value, 1.0);  // torch's default
  EXPECT_EQ(layer_kind(LayerKind::concat).inputs, -1);
  EXPECT_EQ(layer_kind(LayerKind::add).inputs, 2);
  for (const LayerKindInfo& k : layer_kinds()) {
    EXPECT_NE(k.kind, LayerKind::input);
    EXPECT_EQ(&layer_kind(k.kind), &layer_kind(k.name));
  }
  // Defaults apply where a field is not given.
  const LayerParams p = layer_params(LayerKind::lrn, {{"size", 5}}, "t");
  EXPECT_EQ(std::get<LrnParams>(p).alpha, 1e-4f);
  EXPECT_EQ(std::get<LrnParams>(p).beta, 0.75f);
}

TEST(LayerRegistry, ParametersByNameAreCheckedAgainstTheRow) {
  const Status bad = Status::invalid_argument;
  auto refused = [&](const std::function<void(Model&, Model::Node)>& call, std::vector<std::string> parts) {
    Model m(ctx2(), "r");
    const Model::Node x = m.input(4, 8, 8);
    test::expect_error([&] { call(m, x); }, bad, parts);
  };
  refused([](Model& m, int x) { m.layer("lrm", {x}, {}); },
          {"layer kind 'lrm' is not one of dfp's (conv, batchnorm, relu,", "lrn, shortcut_pad)"});
  refused([](Model& m, int x) { m.layer("lrn", {x}, {{"siz", 5}}, "n"); },
          {"model 'r': layer 'n': lrn has no parameter 'siz' (it takes size, alpha, beta, k)"});
  refused([](Model& m, int x) { m.layer("relu", {x}, {{"inplace", 1}}); }, {"relu has no parameter 'inplace' (it takes none)"});
  refused([](Model& m, int x) { m.layer("lrn", {x}, {{"alpha", 1e-4}}); }, {"lrn: parameter 'size' is required"});
  refused([](Model& m, int x) { m.layer("conv", {x}, {{"out_channels", 8.5}, {"kernel", 3}}); },
          {"conv: parameter 'out_channels' expected an integer, got 8.5"});
  refused([](Model& m, int x) { m.layer("conv", {x}, {{"out_channels", 1e12}, {"kernel", 3}}); },
          {"parameter 'out_channels' expected an integer"});
  refused([](Model& m, int x) { m.layer("linear", {m.flatten(x)}, {{"out_features", 3}, {"bias", 2}}); },
          {"linear: parameter 'bias' expected a boolean (0 or 1), got 2"});
  refused([](Model& m, int x) { m.layer("dropout", {x}, {{"p", 0.1}, {"p", 0.2}}); },
          {"dropout: parameter 'p' given twice"});
  // The builders' own range checks run as for the named builders.
  refused([](Model& m, int x) { m.layer("maxpool", {x}, {{"kernel", 2}, {"stride", 0}}, "mp"); },
          {"model 'r': maxpool 'mp': stride expected >= 1, got 0"});
  refused([](Model& m, int x) { m.layer("avgpool", {x}, {{"kernel", 2}, {"stride", 2}, {"ceil_mode", 1}}); },
          {"avgpool has no parameter 'ceil_mode'"});
  refused([](Model& m, int x) { m.layer(LayerKind::avgpool, {x}, PoolParams{2, 2, 0, true}); },
          {"avgpool: ceil_mode expected false"});
  refused([](Model& m, int x) { m.layer("add", {x}, {}, "a"); }, {"add 'a': inputs expected 2 node(s), got 1"});
  refused([](Model& m, int) { m.layer("concat", {}, {}, "c"); }, {"concat 'c': inputs expected at least one node, got none"});
  refused([](Model& m, int x) { m.layer(LayerKind::lrn, {x}, ConvParams{8, 3}); },
          {"lrn: parameters expected the kind's own type, got another kind's"});
  refused([](Model& m, int x) { m.layer(LayerKind::input, {x}); }, {"the input is made by input(), not as a layer"});
  refused([](Model& m, int x) { m.layer("input", {x}, {}); }, {"the input is made by input(), not as a layer"});
  refused([](Model& m, int x) { m.layer(LayerKind(200), {x}); }, {"layer kind 200 is not one of dfp's"});
  // Asking a spec for another kind's parameters is an error, not undefined behaviour.
  Model m(ctx2(), "r");
  m.relu(m.input(4, 8, 8), "r1");
  test::expect_error([&] { (void)m.graph()[1].get<ConvParams>(); }, bad,
                     {"layer 'r1' of kind relu holds no parameters, not the parameters asked for"});
}

}  // namespace
}  // namespace dfp
