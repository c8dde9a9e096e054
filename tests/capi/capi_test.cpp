// The C API (include/dfp/dfp.h): its errors (NULL handles, bad names, wrong shapes, calls out of
// order, running out of memory) as status codes and per-thread messages, and its results against
// the C++ Model's, bit for bit: inference, training steps, backward from the caller's gradient,
// the input gradient, the views, and state files.
#include "dfp/dfp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dfp/context.hpp"
#include "dfp/models.hpp"
#include "dfp/optim.hpp"
#include "dfp/state.hpp"
#include "tests/common/model_helpers.hpp"
#include "tests/common/temp_dir.hpp"

// Allocation failure on demand: while fail_allocations is set, operator new throws std::bad_alloc
// (replacing it here replaces it for the library linked into this program). GCC takes the
// replacements' malloc/free pairing for a mismatch with the built-in operator new.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<bool> fail_allocations{false};
}
// Every unaligned form is replaced, so that each pairs with its delete (a sanitizer's own forms
// would not); the aligned forms stay the library's.
void* operator new(size_t n) {
  if (fail_allocations.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (fail_allocations.load(std::memory_order_relaxed)) return nullptr;
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using dfp::test::cross_entropy_grad;

// Owning handles for the tests.
struct Free {
  void operator()(dfp_context* p) const { dfp_context_destroy(p); }
  void operator()(dfp_model* p) const { dfp_model_destroy(p); }
  void operator()(dfp_sgd* p) const { dfp_sgd_destroy(p); }
};
using Ctx = std::unique_ptr<dfp_context, Free>;
using CModel = std::unique_ptr<dfp_model, Free>;
using CSgd = std::unique_ptr<dfp_sgd, Free>;

constexpr int kThreads = 2;
constexpr const char* kPrecisions[] = {"fp32", "int16", "bf16", "fp16"};

Ctx context(uint64_t seed = 1) {
  dfp_context* c = nullptr;
  EXPECT_EQ(dfp_context_create(kThreads, seed, &c), DFP_OK) << dfp_last_error();
  return Ctx(c);
}

dfp::PrecisionPolicy policy_of(const std::string& precision) {
  dfp::PrecisionPolicy p;
  p.precision = dfp::parse_precision(precision, "test");
  return p;
}

// A zoo model through the C API, built.
CModel zoo(dfp_context* ctx, const char* arch, int c, int hw, int batch, const char* precision) {
  dfp_model* m = nullptr;
  EXPECT_EQ(dfp_model_create_zoo(ctx, arch, c, hw, hw, 10, &m), DFP_OK) << dfp_last_error();
  EXPECT_EQ(dfp_model_build(m, batch, precision, nullptr), DFP_OK) << dfp_last_error();
  return CModel(m);
}

// The same through the C++ API.
std::unique_ptr<dfp::Model> zoo_cpp(const dfp::Context& ctx, const char* arch, int c, int hw, int batch,
                                    const char* precision) {
  auto m = std::make_unique<dfp::Model>(ctx, arch);
  dfp::build_model(*m, arch, c, hw, hw, 10);
  m->build(batch, policy_of(precision));
  return m;
}

// N(0, 1) NCHW images, and the same in the blocked layout for the C++ Model.
std::vector<float> images(int n, int c, int hw, uint32_t seed) {
  std::vector<float> x(size_t(n) * c * hw * hw);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : x) v = nd(g);
  return x;
}
std::vector<float> blocked(const std::vector<float>& nchw, int n, int c, int hw) {
  std::vector<float> b(dfp::blocked_size(n, c, hw, hw));
  dfp::to_blocked(nchw.data(), b.data(), n, c, hw, hw);
  return b;
}

std::vector<int32_t> labels(int n) {
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = (i * 7 + 3) % 10;
  return y;
}

std::vector<dfp_tensor_view> views(const dfp_model* m) {
  size_t n = 0;
  EXPECT_EQ(dfp_model_tensor_count(m, &n), DFP_OK) << dfp_last_error();
  std::vector<dfp_tensor_view> v(n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(dfp_model_tensor_at(m, i, &v[i]), DFP_OK) << dfp_last_error();
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The C call `status` failed with `want`, and the thread's message names every one of `parts`.
void expect_failure(dfp_status status, dfp_status want, const std::vector<std::string>& parts) {
  EXPECT_EQ(status, want) << dfp_status_name(status) << ": " << dfp_last_error();
  const std::string message = dfp_last_error();
  for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

TEST(CApi, StatusNamesAndAFreshThreadsMessage) {
  EXPECT_STREQ(dfp_status_name(DFP_OK), "ok");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_IO), "io_error");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_CORRUPT_DATA), "corrupt_data");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_UNSUPPORTED), "unsupported");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_NUMERICAL), "numerical_error");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_INTERNAL), "internal");
  EXPECT_STREQ(dfp_status_name(DFP_ERR_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_STREQ(dfp_status_name(static_cast<dfp_status>(99)), "unknown");
  std::string fresh = "unset";
  std::thread([&] { fresh = dfp_last_error(); }).join();
  EXPECT_EQ(fresh, "");
}

TEST(CApi, NullHandlesAndPointersAreRefused) {
  const Ctx ctx = context();
  const CModel m = zoo(ctx.get(), "lenet", 1, 28, 4, "fp32");
  int i = 0;
  size_t n = 0;
  dfp_model* out = nullptr;
  dfp_sgd* sgd = nullptr;
  std::vector<float> x(4 * 28 * 28), z(40);
  expect_failure(dfp_context_create(1, 1, nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_context_create: out: NULL"});
  expect_failure(dfp_context_threads(nullptr, &i), DFP_ERR_INVALID_ARGUMENT, {"dfp_context_threads: ctx: NULL"});
  expect_failure(dfp_context_isa(ctx.get(), nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_context_isa: isa: NULL"});
  expect_failure(dfp_model_create(nullptr, "m", &out), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_create: ctx: NULL"});
  expect_failure(dfp_model_create_zoo(ctx.get(), nullptr, 1, 28, 28, 10, &out), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_create_zoo: arch: NULL"});
  expect_failure(dfp_model_input(nullptr, 1, 8, 8, &i), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_input: model: NULL"});
  expect_failure(dfp_model_build(nullptr, 4, "fp32", nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_build: model: NULL"});
  expect_failure(dfp_model_batch(m.get(), nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_batch: batch: NULL"});
  expect_failure(dfp_model_predict(nullptr, x.data(), x.size(), 4, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_predict: model: NULL"});
  expect_failure(dfp_model_predict(m.get(), nullptr, x.size(), 4, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_predict: images: NULL"});
  expect_failure(dfp_model_predict(m.get(), x.data(), x.size(), 4, nullptr, z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_predict: logits: NULL"});
  expect_failure(dfp_model_forward(m.get(), x.data(), x.size(), nullptr, 4, 1, nullptr), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_forward: labels: NULL"});
  expect_failure(dfp_model_backward_logits(m.get(), nullptr, 40, nullptr), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_backward_logits: logits_grad: NULL"});
  expect_failure(dfp_model_tensor(m.get(), nullptr, nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_tensor: name: NULL"});
  expect_failure(dfp_model_tensor_count(m.get(), nullptr), DFP_ERR_INVALID_ARGUMENT, {"count: NULL"});
  expect_failure(dfp_model_save(m.get(), nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_save: path: NULL"});
  expect_failure(dfp_model_load(nullptr, "x"), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_load: model: NULL"});
  expect_failure(dfp_sgd_create(nullptr, 0.9f, 0.f, 0, &sgd), DFP_ERR_INVALID_ARGUMENT, {"dfp_sgd_create: model: NULL"});
  expect_failure(dfp_sgd_step(nullptr, 0.1f), DFP_ERR_INVALID_ARGUMENT, {"dfp_sgd_step: sgd: NULL"});
  expect_failure(dfp_zoo_names(nullptr, 0, nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_zoo_names: length: NULL"});
  expect_failure(dfp_zoo_names(nullptr, 8, &n), DFP_ERR_INVALID_ARGUMENT, {"buffer: NULL with size 8"});
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(sgd, nullptr);
  // Releasing NULL does nothing, as free().
  EXPECT_EQ(dfp_context_destroy(nullptr), DFP_OK);
  EXPECT_EQ(dfp_model_destroy(nullptr), DFP_OK);
  EXPECT_EQ(dfp_sgd_destroy(nullptr), DFP_OK);
}

TEST(CApi, BadNamesAreRefused) {
  const Ctx ctx = context();
  dfp_model* out = nullptr;
  expect_failure(dfp_model_create_zoo(ctx.get(), "resnet99", 3, 32, 32, 10, &out), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_create_zoo", "resnet99", "resnet20"});
  EXPECT_EQ(out, nullptr);
  dfp_model* m = nullptr;
  ASSERT_EQ(dfp_model_create_zoo(ctx.get(), "lenet", 1, 28, 28, 10, &m), DFP_OK);
  const CModel owned(m);
  expect_failure(dfp_model_build(m, 4, "int8", nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_build", "precision", "int8"});
  expect_failure(dfp_model_build(m, 4, "int16", "conv1:fp32"), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_build", "overrides", "conv1:fp32"});
  expect_failure(dfp_model_build(m, 4, "int16", "conv1=fp64"), DFP_ERR_INVALID_ARGUMENT, {"overrides", "fp64"});
  ASSERT_EQ(dfp_model_build(m, 4, "int16", "conv1=fp32"), DFP_OK) << dfp_last_error();
  dfp_tensor_view v{};
  expect_failure(dfp_model_tensor(m, "conv9.weight", &v), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_tensor", "conv9.weight", "conv1.weight"});
  EXPECT_EQ(v.name, nullptr);
  // A layer name used twice.
  dfp_model* b = nullptr;
  ASSERT_EQ(dfp_model_create(ctx.get(), "twice", &b), DFP_OK);
  const CModel owned_b(b);
  int x = -1, y = -1;
  ASSERT_EQ(dfp_model_input(b, 3, 8, 8, &x), DFP_OK);
  ASSERT_EQ(dfp_model_conv(b, x, 8, 3, 1, 1, 0, 1, "conv", &y), DFP_OK);
  expect_failure(dfp_model_conv(b, y, 8, 3, 1, 1, 0, 1, "conv", &y), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_conv", "conv"});
}

TEST(CApi, WrongShapesAreRefused) {
  const Ctx ctx = context();
  const CModel m = zoo(ctx.get(), "lenet", 1, 28, 4, "int16");
  std::vector<float> x(4 * 28 * 28), z(40), dz(40), dx(4 * 28 * 28);
  const std::vector<int32_t> y = labels(4);
  expect_failure(dfp_model_predict(m.get(), x.data(), 3 * 32 * 32, 1, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_predict: images: expected 1 x 1 x 28 x 28 = 784 floats (NCHW), got 3072"});
  expect_failure(dfp_model_predict(m.get(), x.data(), x.size(), 5, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"count: expected 1 .. 4", "got 5"});
  expect_failure(dfp_model_predict(m.get(), x.data(), 0, 0, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT, {"got 0"});
  expect_failure(dfp_model_predict(m.get(), x.data(), x.size(), 4, z.data(), 39), DFP_ERR_INVALID_ARGUMENT,
                 {"logits: room for 39 floats, 40 needed"});
  expect_failure(dfp_model_forward(m.get(), x.data(), 3 * 784, y.data(), 3, 1, nullptr), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_forward", "batch"});
  const std::vector<int32_t> bad_label = {0, 1, 10, 2};
  expect_failure(dfp_model_forward(m.get(), x.data(), x.size(), bad_label.data(), 4, 1, nullptr),
                 DFP_ERR_INVALID_ARGUMENT, {"dfp_model_forward: labels: label 10 of image 2 outside [0, 10)"});
  ASSERT_EQ(dfp_model_logits(m.get(), x.data(), x.size(), 4, 1, z.data(), z.size()), DFP_OK) << dfp_last_error();
  expect_failure(dfp_model_backward_logits(m.get(), dz.data(), 30, nullptr), DFP_ERR_INVALID_ARGUMENT,
                 {"logits_grad: expected 4 x 10 = 40 floats (batch x classes), got 30"});
  expect_failure(dfp_model_input_grad(m.get(), dx.data(), dx.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_input_grad", "set_input_grad"});
  dfp_tensor_view v{};
  size_t n = 0;
  ASSERT_EQ(dfp_model_tensor_count(m.get(), &n), DFP_OK);
  expect_failure(dfp_model_tensor_at(m.get(), n, &v), DFP_ERR_INVALID_ARGUMENT,
                 {"index: expected 0 .. " + std::to_string(n - 1), "got " + std::to_string(n)});
  int c = 0, h = 0, w = 0;
  expect_failure(dfp_model_node_shape(m.get(), 1000, &c, &h, &w), DFP_ERR_INVALID_ARGUMENT, {"node", "1000"});
  expect_failure(dfp_model_node_shape(m.get(), -1, &c, &h, &w), DFP_ERR_INVALID_ARGUMENT, {"node", "-1"});
  // Shapes the builder refuses: an input too small for the architecture, groups that do not
  // divide the channels, a loss on a node that is not classes x 1 x 1.
  dfp_model* out = nullptr;
  expect_failure(dfp_model_create_zoo(ctx.get(), "lenet", 1, 4, 4, 10, &out), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_create_zoo", "conv2", "2x2"});
  dfp_model* b = nullptr;
  ASSERT_EQ(dfp_model_create(ctx.get(), nullptr, &b), DFP_OK);
  const CModel owned_b(b);
  int in = -1, node = -1;
  ASSERT_EQ(dfp_model_input(b, 6, 8, 8, &in), DFP_OK);
  expect_failure(dfp_model_conv(b, in, 8, 3, 1, 1, 0, 4, "g", &node), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_conv", "groups"});
  expect_failure(dfp_model_softmax_cross_entropy(b, in, 0.f), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_softmax_cross_entropy"});
  expect_failure(dfp_model_conv(b, 7, 8, 3, 1, 1, 0, 1, "c", &node), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_conv"});
  const int none[1] = {0};
  expect_failure(dfp_model_concat(b, none, 0, nullptr, &node), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_concat", "count"});
  // A zero stride is refused as a status (it used to reach a division: SIGFPE).
  expect_failure(dfp_model_conv(b, in, 8, 3, 0, 1, 0, 1, "c0", &node), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_conv", "conv 'c0': stride expected >= 1, got 0"});
  expect_failure(dfp_model_maxpool(b, in, 2, 0, 0, 0, "p0", &node), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_maxpool", "stride expected >= 1, got 0"});
  expect_failure(dfp_model_avgpool(b, in, 2, 0, 0, "p1", &node), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_avgpool", "stride expected >= 1, got 0"});
  expect_failure(dfp_model_shortcut_pad(b, in, 8, 0, "s0", &node), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_shortcut_pad", "stride expected >= 1, got 0"});
  EXPECT_EQ(node, -1);
  expect_failure(dfp_context_create(-1, 1, nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_context_create"});
  dfp_context* c2 = nullptr;
  expect_failure(dfp_context_create(-1, 1, &c2), DFP_ERR_INVALID_ARGUMENT, {"dfp_context_create: threads", "-1"});
  expect_failure(dfp_context_create(100000, 1, &c2), DFP_ERR_INVALID_ARGUMENT, {"threads", "100000"});
  EXPECT_EQ(c2, nullptr);
}

TEST(CApi, CallsOutOfOrderAreRefused) {
  const Ctx ctx = context();
  dfp_model* m = nullptr;
  ASSERT_EQ(dfp_model_create_zoo(ctx.get(), "lenet", 1, 28, 28, 10, &m), DFP_OK);
  const CModel owned(m);
  std::vector<float> x(4 * 784), z(40);
  dfp_sgd* sgd = nullptr;
  int finite = -1;
  expect_failure(dfp_model_predict(m, x.data(), x.size(), 4, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_predict: model 'lenet' is not built (call dfp_model_build first)"});
  expect_failure(dfp_sgd_create(m, 0.9f, 0.f, 0, &sgd), DFP_ERR_INVALID_ARGUMENT, {"dfp_sgd_create", "not built"});
  expect_failure(dfp_model_save(m, "never.dfp"), DFP_ERR_INVALID_ARGUMENT, {"not built"});
  expect_failure(dfp_model_backward(m, &finite), DFP_ERR_INVALID_ARGUMENT, {"not built"});
  ASSERT_EQ(dfp_model_build(m, 4, "fp32", nullptr), DFP_OK);
  expect_failure(dfp_model_build(m, 4, "fp32", nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_build", "twice"});
  int node = -1;
  expect_failure(dfp_model_relu(m, 1, nullptr, &node), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_relu", "after build"});
  expect_failure(dfp_model_set_input_grad(m, 1), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_set_input_grad", "after build"});
  expect_failure(dfp_model_backward(m, &finite), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_backward"});
  expect_failure(dfp_model_logits(m, x.data(), 3 * 784, 3, 1, z.data(), z.size()), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_logits"});
  EXPECT_EQ(sgd, nullptr);
  EXPECT_EQ(finite, -1);
  EXPECT_EQ(node, -1);
  expect_failure(dfp_model_build(nullptr, 4, nullptr, nullptr), DFP_ERR_INVALID_ARGUMENT, {"model: NULL"});
  dfp_model* empty = nullptr;
  ASSERT_EQ(dfp_model_create(ctx.get(), "empty", &empty), DFP_OK);
  const CModel owned_empty(empty);
  expect_failure(dfp_model_build(empty, 4, nullptr, nullptr), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_build", "empty"});
  int classes = -1;
  expect_failure(dfp_model_classes(empty, &classes), DFP_ERR_INVALID_ARGUMENT, {"dfp_model_classes"});
  EXPECT_EQ(classes, -1);
}

// As errno: the message stays until the thread's next failure, and a failed call leaves its outputs.
TEST(CApi, AFailureKeepsItsMessageAndLeavesOutputs) {
  const Ctx ctx = context();
  dfp_model* m = nullptr;
  ASSERT_EQ(dfp_model_create_zoo(ctx.get(), "lenet", 1, 28, 28, 10, &m), DFP_OK);
  const CModel owned(m);
  int batch = -7;
  EXPECT_EQ(dfp_model_batch(m, &batch), DFP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(batch, -7);
  const std::string message = dfp_last_error();
  int threads = 0;
  ASSERT_EQ(dfp_context_threads(ctx.get(), &threads), DFP_OK);
  EXPECT_EQ(threads, kThreads);
  EXPECT_EQ(dfp_last_error(), message);
  const char* isa = nullptr;
  ASSERT_EQ(dfp_context_isa(ctx.get(), &isa), DFP_OK);
  dfp::Context cpp(dfp::ContextOptions{.threads = kThreads});
  EXPECT_STREQ(isa, dfp::isa_name(cpp.isa()));
}

TEST(CApi, MessagesArePerThread) {
  const Ctx ctx = context();
  std::string other;
  std::thread([&] {
    dfp_model* m = nullptr;
    dfp_model_create_zoo(ctx.get(), "resnet99", 3, 32, 32, 10, &m);
    other = dfp_last_error();
  }).join();
  dfp_model* m = nullptr;
  dfp_model_create_zoo(ctx.get(), "vgg99", 3, 32, 32, 10, &m);
  EXPECT_NE(other.find("resnet99"), std::string::npos) << other;
  EXPECT_NE(std::string(dfp_last_error()).find("vgg99"), std::string::npos) << dfp_last_error();
}

TEST(CApi, RunningOutOfMemoryIsAStatus) {
  const Ctx ctx = context();
  dfp_model* m = nullptr;
  fail_allocations = true;
  const dfp_status s = dfp_model_create_zoo(ctx.get(), "lenet", 1, 28, 28, 10, &m);
  fail_allocations = false;
  expect_failure(s, DFP_ERR_OUT_OF_MEMORY, {"dfp_model_create_zoo: out of memory"});
  EXPECT_EQ(m, nullptr);
}

TEST(CApi, TextOutWorksAsSnprintf) {
  std::string all;
  for (const std::string& n : dfp::model_names()) all.append(all.empty() ? "" : ",").append(n);
  size_t length = 0;
  ASSERT_EQ(dfp_zoo_names(nullptr, 0, &length), DFP_OK);
  EXPECT_EQ(length, all.size());
  char small[6] = "xxxxx";
  ASSERT_EQ(dfp_zoo_names(small, sizeof small, &length), DFP_OK);
  EXPECT_EQ(std::string(small), all.substr(0, 5));
  EXPECT_EQ(length, all.size());
  std::vector<char> whole(length + 1);
  ASSERT_EQ(dfp_zoo_names(whole.data(), whole.size(), &length), DFP_OK);
  EXPECT_EQ(std::string(whole.data()), all);

  const Ctx ctx = context();
  const CModel m = zoo(ctx.get(), "lenet", 1, 28, 4, "int16");
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads});
  const auto cpp = zoo_cpp(cpp_ctx, "lenet", 1, 28, 4, "int16");
  ASSERT_EQ(dfp_model_summary(m.get(), nullptr, 0, &length), DFP_OK);
  std::vector<char> summary(length + 1);
  ASSERT_EQ(dfp_model_summary(m.get(), summary.data(), summary.size(), &length), DFP_OK);
  EXPECT_EQ(std::string(summary.data()), cpp->summary());
  size_t params = 0;
  ASSERT_EQ(dfp_model_parameter_count(m.get(), &params), DFP_OK);
  EXPECT_EQ(params, cpp->parameter_count());
}

TEST(CApi, PredictEqualsTheCppModelBitForBit) {
  const Ctx ctx = context(5);
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 5});
  const std::vector<float> x = images(4, 3, 16, 11);
  const std::vector<float> xb = blocked(x, 4, 3, 16);
  for (const char* p : kPrecisions) {
    SCOPED_TRACE(p);
    const CModel m = zoo(ctx.get(), "resnet20", 3, 16, 4, p);
    const auto cpp = zoo_cpp(cpp_ctx, "resnet20", 3, 16, 4, p);
    int classes = 0, batch = 0;
    ASSERT_EQ(dfp_model_classes(m.get(), &classes), DFP_OK);
    ASSERT_EQ(dfp_model_batch(m.get(), &batch), DFP_OK);
    EXPECT_EQ(classes, 10);
    EXPECT_EQ(batch, 4);
    for (int count : {4, 3}) {
      std::vector<float> z(size_t(count) * 10, -1.f), zl(z.size(), -2.f), want(z.size());
      ASSERT_EQ(dfp_model_predict(m.get(), x.data(), size_t(count) * 3 * 256, count, z.data(), z.size()), DFP_OK)
          << dfp_last_error();
      ASSERT_EQ(dfp_model_logits(m.get(), x.data(), size_t(count) * 3 * 256, count, 0, zl.data(), zl.size()), DFP_OK);
      cpp->predict(xb.data(), count, want.data());
      EXPECT_TRUE(same_bits(z.data(), want.data(), want.size())) << count << " images";
      EXPECT_TRUE(same_bits(zl.data(), want.data(), want.size())) << count << " images";
    }
    dfp_step_result r{};
    const std::vector<int32_t> y = labels(4);
    ASSERT_EQ(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 4, 0, &r), DFP_OK);
    const dfp::StepResult want = cpp->forward(xb.data(), y.data(), 4, false);
    EXPECT_EQ(r.loss, want.loss);
    EXPECT_EQ(r.correct1, want.correct1);
    EXPECT_EQ(r.correct5, want.correct5);
    EXPECT_EQ(r.count, 4);
  }
}

// A small net with every kind of parameter and buffer, built through the C builder and through
// the C++ one.
void small_net_c(dfp_model* m) {
  int x = 0, n = 0;
  ASSERT_EQ(dfp_model_input(m, 3, 8, 8, &x), DFP_OK);
  ASSERT_EQ(dfp_model_conv(m, x, 16, 3, 1, 1, 1, 1, "conv1", &x), DFP_OK);
  ASSERT_EQ(dfp_model_batchnorm(m, x, "bn1", &x), DFP_OK);
  ASSERT_EQ(dfp_model_relu(m, x, "relu1", &x), DFP_OK);
  ASSERT_EQ(dfp_model_conv(m, x, 32, 3, 2, 1, 0, 4, "conv2", &n), DFP_OK);
  ASSERT_EQ(dfp_model_relu(m, n, nullptr, &x), DFP_OK);
  ASSERT_EQ(dfp_model_global_avgpool(m, x, "gap", &x), DFP_OK);
  ASSERT_EQ(dfp_model_linear(m, x, 10, 1, "fc", &x), DFP_OK);
  ASSERT_EQ(dfp_model_softmax_cross_entropy(m, x, 0.f), DFP_OK);
  int c = 0, h = 0, w = 0;
  ASSERT_EQ(dfp_model_node_shape(m, n, &c, &h, &w), DFP_OK);
  EXPECT_EQ(c, 32);
  EXPECT_EQ(h, 4);
  EXPECT_EQ(w, 4);
}
void small_net_cpp(dfp::Model& m) {
  auto x = m.input(3, 8, 8);
  x = m.relu(m.batchnorm(m.conv(x, 16, 3, 1, 1, true, "conv1"), "bn1"), "relu1");
  x = m.relu(m.conv(x, 32, 3, 2, 1, false, "conv2", 4));
  m.softmax_cross_entropy(m.linear(m.global_avgpool(x, "gap"), 10, true, "fc"));
}

// dfp_model_layer: any kind by name, its parameters as "name=value" pairs; the same model, bit for
// bit, as the C++ builders make; bad parameter text refused by name; dfp_layer_kinds lists them.
TEST(CApi, AnyLayerKindByNameWithItsParametersAsText) {
  const Ctx ctx = context(5);
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 5});
  dfp_model* raw = nullptr;
  ASSERT_EQ(dfp_model_create(ctx.get(), "kinds", &raw), DFP_OK);
  const CModel m(raw);
  int x = 0, y = 0, z = 0;
  ASSERT_EQ(dfp_model_input(raw, 3, 8, 8, &x), DFP_OK);
  ASSERT_EQ(dfp_model_layer(raw, "conv", &x, 1, "out_channels=16, kernel=3, pad=1, bias=true", "conv1", &y), DFP_OK)
      << dfp_last_error();
  ASSERT_EQ(dfp_model_layer(raw, "batchnorm", &y, 1, "eps=1e-3", "bn1", &y), DFP_OK) << dfp_last_error();
  ASSERT_EQ(dfp_model_layer(raw, "lrn", &y, 1, "size=3,alpha=0.001,beta=0.75,k=2", "lrn1", &y), DFP_OK)
      << dfp_last_error();
  ASSERT_EQ(dfp_model_layer(raw, "relu", &y, 1, nullptr, nullptr, &z), DFP_OK) << dfp_last_error();
  const int pair[2] = {y, z};
  ASSERT_EQ(dfp_model_layer(raw, "add", pair, 2, "", "sum", &y), DFP_OK) << dfp_last_error();
  ASSERT_EQ(dfp_model_layer(raw, "gap", &y, 1, "", "gap", &y), DFP_OK) << dfp_last_error();
  ASSERT_EQ(dfp_model_layer(raw, "linear", &y, 1, "out_features=10", "fc", &y), DFP_OK) << dfp_last_error();
  ASSERT_EQ(dfp_model_softmax_cross_entropy(raw, y, 0.f), DFP_OK);
  ASSERT_EQ(dfp_model_build(raw, 4, "int16", nullptr), DFP_OK) << dfp_last_error();

  dfp::Model cpp(cpp_ctx, "kinds");
  auto a = cpp.batchnorm(cpp.conv(cpp.input(3, 8, 8), 16, 3, 1, 1, true, "conv1"), "bn1", 1e-3);
  a = cpp.lrn(a, 3, 0.001f, 0.75f, 2.f, "lrn1");
  a = cpp.add(a, cpp.relu(a), "sum");
  cpp.softmax_cross_entropy(cpp.linear(cpp.global_avgpool(a, "gap"), 10, true, "fc"));
  cpp.build(4, policy_of("int16"));

  const std::vector<float> in = images(4, 3, 8, 3);
  const std::vector<float> inb = blocked(in, 4, 3, 8);
  std::vector<float> got(40), want(40);
  ASSERT_EQ(dfp_model_predict(raw, in.data(), in.size(), 4, got.data(), got.size()), DFP_OK) << dfp_last_error();
  cpp.predict(inb.data(), 4, want.data());
  EXPECT_TRUE(same_bits(got.data(), want.data(), want.size()));

  int n = 0;
  expect_failure(dfp_model_layer(raw, "relu", &y, 1, nullptr, nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_layer", "after build()"});
  dfp_model* b = nullptr;
  ASSERT_EQ(dfp_model_create(ctx.get(), "bad", &b), DFP_OK);
  const CModel owned_b(b);
  ASSERT_EQ(dfp_model_input(b, 3, 8, 8, &x), DFP_OK);
  expect_failure(dfp_model_layer(b, "lrn", &x, 1, "size=5,alpha", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_layer: params: 'alpha' expected name=value"});
  expect_failure(dfp_model_layer(b, "lrn", &x, 1, "size=five", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_layer: params: 'size' expected a number, got 'five'"});
  expect_failure(dfp_model_layer(b, "lrn", &x, 1, "size=5,,k=2", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"params: '' expected name=value"});
  expect_failure(dfp_model_layer(b, "lrn", &x, 1, "size=5,width=2", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"lrn has no parameter 'width' (it takes size, alpha, beta, k)"});
  expect_failure(dfp_model_layer(b, "pool", &x, 1, "", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"layer kind 'pool' is not one of dfp's", "maxpool"});
  expect_failure(dfp_model_layer(b, nullptr, &x, 1, "", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"dfp_model_layer: kind: NULL"});
  expect_failure(dfp_model_layer(b, "add", nullptr, 2, "", nullptr, &n), DFP_ERR_INVALID_ARGUMENT,
                 {"inputs: NULL with count 2"});
  expect_failure(dfp_model_layer(b, "add", &x, 1, "", "a", &n), DFP_ERR_INVALID_ARGUMENT,
                 {"add 'a': inputs expected 2 node(s), got 1"});
  EXPECT_EQ(n, 0) << "a refused call leaves *node alone";

  size_t length = 0;
  ASSERT_EQ(dfp_layer_kinds(nullptr, 0, &length), DFP_OK);
  std::string text(length + 1, '\0');
  ASSERT_EQ(dfp_layer_kinds(text.data(), text.size(), &length), DFP_OK);
  EXPECT_NE(text.find("lrn inputs=1 size=(required) alpha=0.0001 beta=0.75 k=1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("concat inputs=1+\n"), std::string::npos) << text;
}

struct SmallPair {
  CModel c;
  std::unique_ptr<dfp::Model> cpp;
};
SmallPair small_pair(dfp_context* ctx, const dfp::Context& cpp_ctx, const char* precision, int batch,
                     bool input_grad = false) {
  dfp_model* m = nullptr;
  EXPECT_EQ(dfp_model_create(ctx, "small", &m), DFP_OK);
  small_net_c(m);
  EXPECT_EQ(dfp_model_set_input_grad(m, input_grad), DFP_OK);
  EXPECT_EQ(dfp_model_build(m, batch, precision, nullptr), DFP_OK) << dfp_last_error();
  auto cpp = std::make_unique<dfp::Model>(cpp_ctx, "small");
  small_net_cpp(*cpp);
  cpp->set_input_grad(input_grad);
  cpp->build(batch, policy_of(precision));
  return {CModel(m), std::move(cpp)};
}

// The views: the C++ state's names, shapes and memory (no copy); writes picked up by
// dfp_model_weights_updated, as by Model::weights_updated.
TEST(CApi, ViewsAreTheModelsMemory) {
  const Ctx ctx = context(3);
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 3});
  auto [m, cpp] = small_pair(ctx.get(), cpp_ctx, "int16", 4);
  const std::vector<dfp_tensor_view> v = views(m.get());
  const std::vector<dfp::TensorView> want = cpp->state();
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < v.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_STREQ(v[i].name, want[i].name.c_str());
    ASSERT_EQ(v[i].ndim, int(want[i].shape.size()));
    for (int d = 0; d < DFP_MAX_DIMS; ++d) EXPECT_EQ(v[i].shape[d], d < v[i].ndim ? want[i].shape[d] : 0);
    EXPECT_EQ(v[i].size, want[i].size);
    EXPECT_EQ(v[i].trainable, want[i].trainable ? 1 : 0);
    EXPECT_EQ(v[i].grad != nullptr, want[i].trainable);
    EXPECT_TRUE(same_bits(v[i].data, want[i].data, v[i].size));
    dfp_tensor_view named{};
    ASSERT_EQ(dfp_model_tensor(m.get(), want[i].name.c_str(), &named), DFP_OK);
    EXPECT_EQ(named.data, v[i].data);
    EXPECT_EQ(named.name, v[i].name);
  }
  dfp_tensor_view w{};
  ASSERT_EQ(dfp_model_tensor(m.get(), "conv2.weight", &w), DFP_OK);
  EXPECT_EQ(w.ndim, 4);
  EXPECT_EQ(w.shape[0], 32);
  EXPECT_EQ(w.shape[1], 4);  // 16 inputs in 4 groups
  EXPECT_EQ(w.shape[2], 3);

  const std::vector<float> x = images(4, 3, 8, 2);
  const std::vector<float> xb = blocked(x, 4, 3, 8);
  std::vector<float> before(40), after(40), want_after(40);
  ASSERT_EQ(dfp_model_predict(m.get(), x.data(), x.size(), 4, before.data(), 40), DFP_OK);
  dfp::TensorView cw = cpp->tensor("conv2.weight");
  for (size_t i = 0; i < w.size; ++i) {
    w.data[i] *= -1.5f;
    cw.data[i] *= -1.5f;
  }
  ASSERT_EQ(dfp_model_weights_updated(m.get()), DFP_OK);
  cpp->weights_updated();
  ASSERT_EQ(dfp_model_predict(m.get(), x.data(), x.size(), 4, after.data(), 40), DFP_OK);
  cpp->predict(xb.data(), 4, want_after.data());
  EXPECT_FALSE(same_bits(before.data(), after.data(), 40));
  EXPECT_TRUE(same_bits(after.data(), want_after.data(), 40));
}

// A training pass refused for a label changes nothing (no BatchNorm statistics updated); one with
// good labels does.
TEST(CApi, ARefusedPassChangesNothing) {
  const Ctx ctx = context();
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads});
  auto [m, cpp] = small_pair(ctx.get(), cpp_ctx, "int16", 4);
  dfp_tensor_view mean{};
  ASSERT_EQ(dfp_model_tensor(m.get(), "bn1.running_mean", &mean), DFP_OK);
  const std::vector<float> before(mean.data, mean.data + mean.size);
  const std::vector<float> x = images(4, 3, 8, 1);
  std::vector<int32_t> y = {1, 2, -1, 3};
  expect_failure(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 4, 1, nullptr), DFP_ERR_INVALID_ARGUMENT,
                 {"label -1 of image 2"});
  EXPECT_TRUE(same_bits(before.data(), mean.data, mean.size));
  y[2] = 0;
  ASSERT_EQ(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 4, 1, nullptr), DFP_OK);
  EXPECT_FALSE(same_bits(before.data(), mean.data, mean.size));
}

// Training through the C API (forward, backward, SGD) gives the C++ Model's bits, step by step.
TEST(CApi, TrainingStepsEqualTheCppModelBitForBit) {
  const Ctx ctx = context(7);
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 7});
  for (const char* p : kPrecisions) {
    SCOPED_TRACE(p);
    auto [m, cpp] = small_pair(ctx.get(), cpp_ctx, p, 8);
    dfp_sgd* s = nullptr;
    ASSERT_EQ(dfp_sgd_create(m.get(), 0.9f, 5e-4f, 1, &s), DFP_OK) << dfp_last_error();
    const CSgd sgd(s);
    dfp::Sgd cpp_sgd(cpp_ctx, *cpp, {0.9f, 5e-4f, true});
    const std::vector<int32_t> y = labels(8);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = images(8, 3, 8, 20 + step);
      const std::vector<float> xb = blocked(x, 8, 3, 8);
      dfp_step_result r{};
      int finite = -1;
      ASSERT_EQ(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 8, 1, &r), DFP_OK) << dfp_last_error();
      ASSERT_EQ(dfp_model_backward(m.get(), &finite), DFP_OK) << dfp_last_error();
      ASSERT_EQ(finite, 1);
      ASSERT_EQ(dfp_sgd_step(sgd.get(), 0.05f), DFP_OK);
      const dfp::StepResult want = cpp->forward(xb.data(), y.data(), 8, true);
      ASSERT_TRUE(cpp->backward());
      cpp_sgd.step(0.05f);
      EXPECT_EQ(r.loss, want.loss) << "step " << step;
    }
    const std::vector<dfp_tensor_view> v = views(m.get());
    const std::vector<dfp::TensorView> want = cpp->state();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(same_bits(v[i].data, want[i].data, v[i].size)) << want[i].name;
  }
  dfp_sgd* s = nullptr;
  const CModel built = zoo(ctx.get(), "lenet", 1, 28, 4, "fp32");
  ASSERT_EQ(dfp_sgd_create(built.get(), 0.9f, 0.f, 0, &s), DFP_OK);
  const CSgd sgd(s);
  expect_failure(dfp_sgd_step(s, NAN), DFP_ERR_INVALID_ARGUMENT, {"dfp_sgd_step: lr", "nan"});
  expect_failure(dfp_sgd_create(built.get(), -0.5f, 0.f, 0, &s), DFP_ERR_INVALID_ARGUMENT, {"dfp_sgd_create", "momentum"});
}

// Backward from the caller's loss: the built-in loss's gradient gives dfp_model_backward's bits,
// and the input gradient is the C++ Model's.
TEST(CApi, BackwardFromTheCallersGradient) {
  const Ctx ctx = context(9);
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 9});
  for (const char* p : {"fp32", "int16"}) {
    SCOPED_TRACE(p);
    auto [m, cpp] = small_pair(ctx.get(), cpp_ctx, p, 8, true);
    const std::vector<float> x = images(8, 3, 8, 4);
    const std::vector<int32_t> y = labels(8);
    int finite = -1;
    ASSERT_EQ(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 8, 1, nullptr), DFP_OK);
    ASSERT_EQ(dfp_model_backward(m.get(), &finite), DFP_OK);
    std::vector<std::vector<float>> builtin;
    for (const dfp_tensor_view& v : views(m.get()))
      if (v.grad) builtin.emplace_back(v.grad, v.grad + v.size);
    std::vector<float> dx_builtin(8 * 3 * 64);
    ASSERT_EQ(dfp_model_input_grad(m.get(), dx_builtin.data(), dx_builtin.size()), DFP_OK) << dfp_last_error();

    std::vector<float> z(80);
    ASSERT_EQ(dfp_model_logits(m.get(), x.data(), x.size(), 8, 1, z.data(), z.size()), DFP_OK);
    const std::vector<float> dz = cross_entropy_grad(z, y, 8, 10);
    finite = -1;
    ASSERT_EQ(dfp_model_backward_logits(m.get(), dz.data(), dz.size(), &finite), DFP_OK) << dfp_last_error();
    EXPECT_EQ(finite, 1);
    size_t k = 0;
    for (const dfp_tensor_view& v : views(m.get()))
      if (v.grad) {
        EXPECT_TRUE(same_bits(v.grad, builtin[k++].data(), v.size)) << v.name;
      }
    std::vector<float> dx(8 * 3 * 64), want(dx.size());
    ASSERT_EQ(dfp_model_input_grad(m.get(), dx.data(), dx.size()), DFP_OK);
    EXPECT_TRUE(same_bits(dx.data(), dx_builtin.data(), dx.size()));

    const std::vector<float> xb = blocked(x, 8, 3, 8);
    std::vector<float> zc(80);
    cpp->logits(xb.data(), 8, true, zc.data());
    ASSERT_TRUE(same_bits(zc.data(), z.data(), 80));
    cpp->backward(dz.data());
    cpp->input_grad(want.data());
    EXPECT_TRUE(same_bits(dx.data(), want.data(), dx.size()));
    expect_failure(dfp_model_input_grad(m.get(), dx.data(), dx.size() - 1), DFP_ERR_INVALID_ARGUMENT,
                   {"out: room for 1535 floats, 1536 needed"});
  }
}

// A few steps on one batch with the caller's cross-entropy: the loss falls.
TEST(CApi, TrainingStepsReduceTheLoss) {
  const Ctx ctx = context(2);
  const CModel m = zoo(ctx.get(), "lenet", 1, 28, 16, "int16");
  dfp_sgd* s = nullptr;
  ASSERT_EQ(dfp_sgd_create(m.get(), 0.9f, 5e-4f, 0, &s), DFP_OK);
  const CSgd sgd(s);
  const std::vector<float> x = images(16, 1, 28, 6);
  std::vector<int32_t> y(16);
  for (int i = 0; i < 16; ++i) y[i] = i % 10;
  std::vector<float> z(160);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    dfp_step_result r{};
    ASSERT_EQ(dfp_model_forward(m.get(), x.data(), x.size(), y.data(), 16, 0, &r), DFP_OK);
    (step == 0 ? first : last) = r.loss;
    ASSERT_EQ(dfp_model_logits(m.get(), x.data(), x.size(), 16, 1, z.data(), z.size()), DFP_OK);
    const std::vector<float> dz = cross_entropy_grad(z, y, 16, 10);
    int finite = 0;
    ASSERT_EQ(dfp_model_backward_logits(m.get(), dz.data(), dz.size(), &finite), DFP_OK);
    ASSERT_EQ(finite, 1);
    ASSERT_EQ(dfp_sgd_step(sgd.get(), 0.05f), DFP_OK);
  }
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

TEST(CApi, StateFilesRoundTrip) {
  dfp::test::TempDir dir("dfp capi ");
  const Ctx ctx = context(4), other = context(8);
  const CModel a = zoo(ctx.get(), "resnet20", 3, 16, 4, "int16");
  dfp_sgd* s = nullptr;
  ASSERT_EQ(dfp_sgd_create(a.get(), 0.9f, 5e-4f, 0, &s), DFP_OK);
  const CSgd sgd(s);
  const std::vector<float> x = images(4, 3, 16, 5);
  const std::vector<int32_t> y = labels(4);
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(dfp_model_forward(a.get(), x.data(), x.size(), y.data(), 4, 1, nullptr), DFP_OK);
    ASSERT_EQ(dfp_model_backward(a.get(), nullptr), DFP_OK);
    ASSERT_EQ(dfp_sgd_step(sgd.get(), 0.1f), DFP_OK);
  }
  const std::string path = dir.file("state.dfp");
  ASSERT_EQ(dfp_model_save(a.get(), path.c_str()), DFP_OK) << dfp_last_error();

  // Another seed: other initial weights, until the file is read.
  const CModel b = zoo(other.get(), "resnet20", 3, 16, 4, "int16");
  std::vector<float> za(40), zb(40);
  ASSERT_EQ(dfp_model_predict(a.get(), x.data(), x.size(), 4, za.data(), 40), DFP_OK);
  ASSERT_EQ(dfp_model_predict(b.get(), x.data(), x.size(), 4, zb.data(), 40), DFP_OK);
  EXPECT_FALSE(same_bits(za.data(), zb.data(), 40));
  ASSERT_EQ(dfp_model_load(b.get(), path.c_str()), DFP_OK) << dfp_last_error();
  const std::vector<dfp_tensor_view> va = views(a.get()), vb = views(b.get());
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_TRUE(same_bits(va[i].data, vb[i].data, va[i].size)) << va[i].name;
  ASSERT_EQ(dfp_model_predict(b.get(), x.data(), x.size(), 4, zb.data(), 40), DFP_OK);
  EXPECT_TRUE(same_bits(za.data(), zb.data(), 40));

  // The C++ API reads the file, and the C API reads the C++ API's.
  dfp::Context cpp_ctx(dfp::ContextOptions{.threads = kThreads, .seed = 8});
  const auto cpp = zoo_cpp(cpp_ctx, "resnet20", 3, 16, 4, "int16");
  dfp::load_state(*cpp, path);
  std::vector<float> zc(40);
  cpp->predict(blocked(x, 4, 3, 16).data(), 4, zc.data());
  EXPECT_TRUE(same_bits(za.data(), zc.data(), 40));
  EXPECT_EQ(dfp::read_state_policy(path).precision, dfp::Precision::int16);

  // Errors name the file and the tensor; a failed load changes nothing.
  const std::string missing = dir.file("missing.dfp");
  expect_failure(dfp_model_load(b.get(), missing.c_str()), DFP_ERR_IO, {"dfp_model_load", missing});
  const CModel lenet = zoo(other.get(), "lenet", 3, 16, 4, "int16");
  const std::vector<dfp_tensor_view> vl = views(lenet.get());
  std::vector<float> conv1(vl[0].data, vl[0].data + vl[0].size);
  expect_failure(dfp_model_load(lenet.get(), path.c_str()), DFP_ERR_CORRUPT_DATA, {"dfp_model_load", path});
  EXPECT_TRUE(same_bits(conv1.data(), vl[0].data, conv1.size()));
  const std::string bad_dir = dir.file("no such dir/state.dfp");
  expect_failure(dfp_model_save(a.get(), bad_dir.c_str()), DFP_ERR_IO, {"dfp_model_save", "no such dir"});
}

// One context serves models on two threads at once (each model on one thread): the same bits as
// one after the other.
TEST(CApi, ModelsOfOneContextRunOnTwoThreads) {
  const Ctx ctx = context(6);
  const std::vector<float> x = images(8, 3, 16, 3);
  const std::vector<int32_t> y = labels(8);
  auto train_and_predict = [&](dfp_model* m, std::vector<float>& z) {
    dfp_sgd* s = nullptr;
    if (dfp_sgd_create(m, 0.9f, 0.f, 0, &s) != DFP_OK) return;
    for (int step = 0; step < 3; ++step) {
      dfp_model_forward(m, x.data(), x.size(), y.data(), 8, 1, nullptr);
      dfp_model_backward(m, nullptr);
      dfp_sgd_step(s, 0.05f);
    }
    dfp_sgd_destroy(s);
    dfp_model_predict(m, x.data(), x.size(), 8, z.data(), z.size());
  };
  for (const char* p : {"int16", "fp32"}) {
    SCOPED_TRACE(p);
    std::vector<float> alone(80, -1.f), a(80, -2.f), b(80, -3.f);
    train_and_predict(zoo(ctx.get(), "resnet20", 3, 16, 8, p).get(), alone);
    const CModel ma = zoo(ctx.get(), "resnet20", 3, 16, 8, p), mb = zoo(ctx.get(), "resnet20", 3, 16, 8, p);
    std::thread ta([&] { train_and_predict(ma.get(), a); }), tb([&] { train_and_predict(mb.get(), b); });
    ta.join();
    tb.join();
    EXPECT_TRUE(same_bits(a.data(), alone.data(), 80));
    EXPECT_TRUE(same_bits(b.data(), alone.data(), 80));
  }
}

// A handle keeps alive what it was made from: release in any order.
TEST(CApi, HandlesMayBeReleasedInAnyOrder) {
  dfp_context* ctx = nullptr;
  ASSERT_EQ(dfp_context_create(kThreads, 1, &ctx), DFP_OK);
  dfp_model* m = nullptr;
  ASSERT_EQ(dfp_model_create_zoo(ctx, "lenet", 1, 28, 28, 10, &m), DFP_OK);
  ASSERT_EQ(dfp_context_destroy(ctx), DFP_OK);
  ASSERT_EQ(dfp_model_build(m, 4, "int16", nullptr), DFP_OK);
  dfp_sgd* sgd = nullptr;
  ASSERT_EQ(dfp_sgd_create(m, 0.9f, 0.f, 0, &sgd), DFP_OK);
  const std::vector<float> x = images(4, 1, 28, 1);
  const std::vector<int32_t> y = labels(4);
  ASSERT_EQ(dfp_model_forward(m, x.data(), x.size(), y.data(), 4, 1, nullptr), DFP_OK);
  ASSERT_EQ(dfp_model_backward(m, nullptr), DFP_OK);
  dfp_tensor_view w{};
  ASSERT_EQ(dfp_model_tensor_at(m, 0, &w), DFP_OK);
  const std::vector<float> before(w.data, w.data + w.size);
  ASSERT_EQ(dfp_model_destroy(m), DFP_OK);
  ASSERT_EQ(dfp_sgd_step(sgd, 0.1f), DFP_OK) << dfp_last_error();
  EXPECT_FALSE(same_bits(before.data(), w.data, w.size));  // the model lives while its optimizer does
  ASSERT_EQ(dfp_sgd_destroy(sgd), DFP_OK);
}

}  // namespace
