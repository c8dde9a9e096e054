// The report behind `dfp compare`: the run files' records (the previous version's lines read and
// written unchanged, null for non-finite numbers, errors that name file, line and field),
// read_run on synthetic run directories (fp32; int16 with per-layer exponents and SQNR; fp16
// with skipped steps and a dynamic loss scale), the summary figures equal to the metrics files'
// numbers exactly, every artifact written (plots when gnuplot is installed, a
// "skipped" note when it is not), and malformed metrics rejected with the file and line named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dfp/status.hpp"
#include "tests/common/scoped_env.hpp"
#include "tests/common/temp_dir.hpp"
#include "dfp/model.hpp"
#include "dfp/trainer.hpp"
#include "apps/dfp/report/report.hpp"
#include "src/train/run_files.hpp"
#include "tests/common/expect_error.hpp"

using namespace dfp;
namespace fs = std::filesystem;

namespace {

// Fixture directories of this suite (tests/common/temp_dir.hpp).
class TempDir : public test::TempDir {
 public:
  TempDir() : test::TempDir("dfp report test ") {}
};

using test::ScopedEnv;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string config(const std::string& label_member) {
  return "{" + label_member +
         "\"model\":\"resnet20\",\"dataset\":\"fashion-mnist\",\"precision_policy\":\"precision=x\",\"epochs\":3,"
         "\"batch_size\":128,\"lr\":0.1,\"threads\":2,\"seed\":1}\n";
}

// fp32: no layers, scale 1, nothing skipped.
const char* kFp32Metrics =
    "{\"epoch\":1,\"lr\":0.1,\"train_loss\":0.61,\"train_top1\":77.9,\"test_loss\":0.45,\"test_top1\":83.6,"
    "\"test_top5\":99.1,\"images_per_second\":912.3,\"epoch_seconds\":65.7123,\"data_wait_seconds\":0.02,"
    "\"peak_rss_kib\":812345,\"loss_scale\":1,\"skipped_steps\":0,\"precision_policy\":\"precision=fp32\",\"layers\":[]}\n"
    "{\"epoch\":2,\"lr\":0.05,\"train_loss\":0.41,\"train_top1\":85.2,\"test_loss\":0.38,\"test_top1\":86.25,"
    "\"test_top5\":99.5,\"images_per_second\":930.1,\"epoch_seconds\":64.25,\"data_wait_seconds\":0.02,"
    "\"peak_rss_kib\":813000,\"loss_scale\":1,\"skipped_steps\":0,\"precision_policy\":\"precision=fp32\",\"layers\":[]}\n"
    "{\"epoch\":3,\"lr\":0.0,\"train_loss\":0.352134,\"train_top1\":87.4,\"test_loss\":0.33,\"test_top1\":88.7167,"
    "\"test_top5\":99.61,\"images_per_second\":925.7,\"epoch_seconds\":66.1,\"data_wait_seconds\":0.02,"
    "\"peak_rss_kib\":812999,\"loss_scale\":1,\"skipped_steps\":0,\"precision_policy\":\"precision=fp32\",\"layers\":[]}\n";

const char* kLayerNames[] = {"conv1", "layer1.0.conv1", "layer1.0.conv2", "layer2.0.conv1", "fc"};

std::string int16_line(int epoch, double loss, double top1, double seconds, long rss) {
  std::ostringstream o;
  o << "{\"epoch\":" << epoch << ",\"lr\":0.1,\"train_loss\":" << loss << ",\"train_top1\":70,\"test_loss\":0.5,"
    << "\"test_top1\":" << top1 << ",\"test_top5\":98.75,\"images_per_second\":" << 400 + epoch
    << ",\"epoch_seconds\":" << seconds << ",\"data_wait_seconds\":0.1,\"peak_rss_kib\":" << rss
    << ",\"precision_policy\":\"precision=int16\",\"layers\":[";
  for (int i = 0; i < 5; ++i) {
    o << (i ? "," : "") << "{\"layer\":\"" << kLayerNames[i] << "\",\"format\":\"int16\",\"exp_x\":" << -12 + (i % 3)
      << ",\"exp_w\":" << -15 - i << ",\"exp_dy\":" << -20 - i - (epoch > 2 ? 1 : 0)
      << ",\"chain_fwd\":64,\"chain_bwd\":64,\"chain_wgrad\":32,\"saturated\":" << i
      << ",\"overflow_events\":0,\"sqnr_x_db\":" << (epoch == 2 ? "null" : std::to_string(70.5 - i))
      << ",\"sqnr_w_db\":" << 75 + i << ",\"sqnr_dy_db\":" << 60 - 2 * i - epoch << ",\"overflow\":0,\"underflow\":" << 10 * i
      << ",\"nonzero\":123456}";
  }
  o << "]}\n";
  return o.str();
}

std::string fp16_line(int epoch, double scale, int skipped, const std::string& top1) {
  std::ostringstream o;
  o << "{\"epoch\":" << epoch << ",\"lr\":0.1,\"train_loss\":0." << 7 - epoch << "5,\"test_top1\":" << top1
    << ",\"test_top5\":99,\"images_per_second\":" << 600.5 + epoch << ",\"epoch_seconds\":40.125"
    << ",\"peak_rss_kib\":700000,\"loss_scale\":" << scale << ",\"skipped_steps\":" << skipped << ",\"layers\":[";
  for (int i = 0; i < 5; ++i)
    o << (i ? "," : "") << "{\"layer\":\"" << kLayerNames[i] << "\",\"format\":\"fp16\",\"sqnr_x_db\":" << 55 - i
      << ",\"sqnr_w_db\":null,\"sqnr_dy_db\":" << 40 - 3 * i + epoch << ",\"overflow\":" << (i == 4 ? 2 : 0)
      << ",\"underflow\":" << 100 * i << ",\"nonzero\":5000,\"underflow_x\":0,\"underflow_w\":0,\"underflow_dy\":"
      << 100 * i << ",\"nonzero_x\":2000,\"nonzero_w\":1000,\"nonzero_dy\":" << (epoch == 1 ? 4000 : 2000) << "}";
  o << "]}\n";
  return o.str();
}

// Three runs under <root>/cmp/<label>/ (the layout `dfp compare` writes).
std::vector<std::string> write_runs(const TempDir& t) {
  const std::string fp32 = t.file("cmp/fp32"), int16 = t.file("cmp/int16"), fp16 = t.file("cmp/fp16-dynamic");
  write(fp32 + "/config.json", config("\"label\":\"fp32\",\"device\":\"cpu\","));
  write(fp32 + "/metrics.jsonl", kFp32Metrics);
  // No label or device: the directory's name and "cpu".
  write(int16 + "/config.json", config(""));
  write(int16 + "/metrics.jsonl", int16_line(1, 0.9, 70.25, 120.5, 900000) + int16_line(2, 0.6, 80.5, 118.25, 901024) +
                                      int16_line(3, 0.45, 84.125, 119.0, 901000));
  write(fp16 + "/config.json", config("\"label\":\"fp16-dynamic\",\"device\":\"cpu\",\"loss_scaling\":\"dynamic\","));
  write(fp16 + "/metrics.jsonl",
        fp16_line(1, 65536, 0, "81.5") + fp16_line(2, 32768, 3, "84.0") + fp16_line(3, 32768, 5, "86.8833"));
  return {fp32, int16, fp16};
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// summary.csv as label -> column -> text (the test's values have no commas or quotes).
std::map<std::string, std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::map<std::string, std::map<std::string, std::string>> rows;
  std::istringstream in(read(path));
  std::string line;
  std::getline(in, line);
  const auto header = split(line, ',');
  EXPECT_EQ(header, summary_columns());
  while (std::getline(in, line)) {
    const auto cells = split(line, ',');
    EXPECT_EQ(cells.size(), header.size()) << line;
    for (size_t i = 0; i < cells.size() && i < header.size(); ++i) rows[cells[0]][header[i]] = cells[i];
  }
  return rows;
}

// summary.md's data rows as label -> cells ("-" marks an empty CSV field).
std::map<std::string, std::vector<std::string>> read_md(const std::string& path) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream in(read(path));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '|' || n++ < 2) continue;  // header and separator
    auto cells = split(line.substr(1, line.size() - 2), '|');
    for (auto& c : cells) c = trim(c);
    rows[cells[0]] = cells;
  }
  return rows;
}

using test::expect_error;

bool non_empty(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && fs::file_size(path, ec) > 0;
}

}  // namespace

// ---- run files (src/train/run_files.hpp) ------------------------------------------------------

namespace rf = run_files;

// A metrics line of the previous version's writer (hand-written JSON), byte for byte: its
// numbers as "%g" wrote them, a null SQNR, an INT16 layer and an FP32 layer without samples.
constexpr const char* kPreviousMetricsLine =
    "{\"epoch\":2,\"lr\":0.05,\"train_loss\":0.41,\"train_top1\":85.2,\"test_loss\":0.38,\"test_top1\":86.25,"
    "\"test_top5\":99.5,\"images_per_second\":930.1,\"epoch_seconds\":64.25,\"data_wait_seconds\":0.02,"
    "\"peak_rss_kib\":813000,\"loss_scale\":1,\"skipped_steps\":0,\"precision_policy\":\"precision=int16 \\\"q\\\"\","
    "\"layers\":[{\"layer\":\"conv1\",\"format\":\"int16\",\"exp_x\":-11,\"exp_w\":-14,\"exp_dy\":-25,\"chain_fwd\":9,"
    "\"chain_bwd\":0,\"chain_wgrad\":38,\"saturated\":3,\"overflow_events\":0,\"sqnr_x_db\":77.5,\"sqnr_w_db\":null,"
    "\"sqnr_dy_db\":71.25,\"overflow\":0,\"underflow\":21,\"nonzero\":97365},{\"layer\":\"fc\",\"format\":\"fp32\"}]}";

TEST(RunFiles, ReadsAndWritesThePreviousMetricsLineUnchanged) {
  const rf::EpochRecord r = rf::parse_epoch_line(kPreviousMetricsLine, "m.jsonl", 4);
  // The figures as written: epoch, lr, train_loss, test_top1, epoch_seconds; then the counts.
  EXPECT_EQ(std::make_tuple(r.epoch, *r.lr, r.train_loss, r.test_top1, r.epoch_seconds),
            std::make_tuple(2, 0.05, 0.41, 86.25, 64.25));
  EXPECT_EQ(std::make_tuple(*r.peak_rss_kib, *r.loss_scale, *r.skipped_steps), std::make_tuple(int64_t(813000), 1.0, int64_t(0)));
  EXPECT_EQ(r.precision_policy, "precision=int16 \"q\"");
  ASSERT_EQ(r.layers.size(), 2u);
  const rf::LayerRecord& c = r.layers[0];
  EXPECT_EQ(c.layer, "conv1");
  EXPECT_EQ(c.format, "int16");
  EXPECT_EQ(c.exp_dy, -25);
  EXPECT_EQ(c.saturated, 3);
  EXPECT_EQ(c.sqnr_x_db, 77.5);
  ASSERT_TRUE(c.sqnr_w_db.has_value());  // null: present, not finite
  EXPECT_TRUE(std::isnan(*c.sqnr_w_db));
  EXPECT_EQ(c.nonzero, 97365);
  const rf::LayerRecord& fc = r.layers[1];
  EXPECT_FALSE(fc.exp_x || fc.sqnr_x_db || fc.overflow);  // absent: not logged
  // The same record writes the same line: same keys, same order, same numbers.
  EXPECT_EQ(rf::to_line(r), kPreviousMetricsLine);
}

TEST(RunFiles, TheTrainersMetricsLineIsTheRecordsLine) {
  EpochMetrics em;
  em.epoch = 2;
  em.lr = 0.05;
  em.train_loss = 0.41;
  em.train_top1 = 85.2;
  em.test_loss = 0.38;
  em.test_top1 = 86.25;
  em.test_top5 = 99.5;
  em.images_per_second = 930.1;
  em.epoch_seconds = 64.25;
  em.data_wait_seconds = 0.02;
  em.peak_rss_kib = 813000;
  em.loss_scale = 1;
  em.skipped_steps = 0;
  LayerNumerics conv;
  conv.layer = "conv1";
  conv.format = "int16";
  conv.exp_x = -11, conv.exp_w = -14, conv.exp_dy = -25;
  conv.chain_fwd = 9, conv.chain_bwd = 0, conv.chain_wgrad = 38;
  conv.saturated = 3;
  conv.sampled = true;
  conv.sqnr_x_db = 77.5, conv.sqnr_w_db = INFINITY, conv.sqnr_dy_db = 71.25;
  conv.underflow = 21, conv.nonzero = 97365;
  conv.underflow_x = 1, conv.underflow_w = 0, conv.underflow_dy = 20;
  conv.nonzero_x = 50000, conv.nonzero_w = 432, conv.nonzero_dy = 46933;
  LayerNumerics fc;
  fc.layer = "fc";
  fc.format = "fp32";
  // The previous line, and each operand's counts after the sums.
  std::string want = kPreviousMetricsLine;
  const std::string sums = "\"nonzero\":97365";
  want.insert(want.find(sums) + sums.size(), ",\"underflow_x\":1,\"underflow_w\":0,\"underflow_dy\":20,"
                                           "\"nonzero_x\":50000,\"nonzero_w\":432,\"nonzero_dy\":46933");
  const std::string with_operands = metrics_line(em, "precision=int16 \"q\"", {conv, fc});
  EXPECT_EQ(with_operands, want);
  const rf::LayerRecord operands = rf::parse_epoch_line(with_operands, "m.jsonl", 1).layers.at(0);
  EXPECT_EQ(std::make_tuple(operands.underflow_x, operands.underflow_w, operands.underflow_dy),
            std::make_tuple(std::optional<int64_t>(1), std::optional<int64_t>(0), std::optional<int64_t>(20)));
  EXPECT_EQ(std::make_tuple(operands.nonzero_x, operands.nonzero_w, operands.nonzero_dy),
            std::make_tuple(std::optional<int64_t>(50000), std::optional<int64_t>(432), std::optional<int64_t>(46933)));
  // Exponents per slice (Granularity::slice) add the smallest, after the largest, and read back.
  conv.exp_x_min = -15, conv.exp_dy_min = -31;
  const std::string line = metrics_line(em, "p", {conv});
  EXPECT_NE(line.find("\"exp_dy\":-25,\"exp_x_min\":-15,\"exp_dy_min\":-31,\"chain_fwd\""), std::string::npos) << line;
  const rf::LayerRecord back = rf::parse_epoch_line(line, "m.jsonl", 1).layers.at(0);
  EXPECT_EQ(std::make_tuple(back.exp_x_min, back.exp_w_min, back.exp_dy_min),
            std::make_tuple(std::optional<int64_t>(-15), std::optional<int64_t>(), std::optional<int64_t>(-31)));
}

TEST(RunFiles, NonFiniteNumbersAreWrittenAsNullAndReadAsNaN) {
  rf::EpochRecord r;
  r.epoch = 1;
  r.train_loss = std::nan("");
  r.test_top1 = 10;
  r.epoch_seconds = 1.5;
  r.test_loss = INFINITY;
  r.loss_scale = -INFINITY;
  rf::LayerRecord l;
  l.layer = "conv1";
  l.sqnr_x_db = std::nan("");
  l.sqnr_w_db = 12.125;
  r.layers = {l};
  const std::string line = rf::to_line(r);
  for (const char* bad : {"nan", "inf"}) EXPECT_EQ(line.find(bad), std::string::npos) << line;
  for (const char* want : {"\"train_loss\":null", "\"test_loss\":null", "\"loss_scale\":null", "\"sqnr_x_db\":null"})
    EXPECT_NE(line.find(want), std::string::npos) << want << " in " << line;
  EXPECT_EQ(line.find("train_top1"), std::string::npos) << line;  // nullopt: left out
  const rf::EpochRecord back = rf::parse_epoch_line(line, "m.jsonl", 1);
  EXPECT_TRUE(std::isnan(back.train_loss));
  EXPECT_TRUE(back.test_loss && std::isnan(*back.test_loss));
  EXPECT_TRUE(back.loss_scale && std::isnan(*back.loss_scale));
  EXPECT_FALSE(back.train_top1);
  EXPECT_EQ(back.test_top1, 10);
  EXPECT_EQ(back.epoch_seconds, 1.5);
  ASSERT_EQ(back.layers.size(), 1u);
  EXPECT_TRUE(back.layers[0].sqnr_x_db && std::isnan(*back.layers[0].sqnr_x_db));
  EXPECT_EQ(back.layers[0].sqnr_w_db, 12.125);
  EXPECT_EQ(rf::to_line(back), line);
}

TEST(RunFiles, BareNonFiniteTokensOfOtherWritersReadAsNaN) {
  // C++ streams and Python's json module write these; inside strings they stay text.
  const rf::EpochRecord r = rf::parse_epoch_line(
      "{\"epoch\":1,\"train_loss\":nan,\"test_top1\":-nan,\"epoch_seconds\":Infinity,\"test_loss\":-inf,"
      "\"lr\":NaN,\"loss_scale\":inf,\"test_top5\":-Infinity,\"precision_policy\":\"nan inf \\\" -inf\","
      "\"layers\":[{\"layer\":\"inf\",\"sqnr_x_db\":nan}]}",
      "old.jsonl", 9);
  EXPECT_TRUE(std::isnan(r.train_loss));
  EXPECT_TRUE(std::isnan(r.test_top1));
  EXPECT_TRUE(std::isnan(r.epoch_seconds));
  for (const auto& v : {r.test_loss, r.lr, r.loss_scale, r.test_top5}) EXPECT_TRUE(v && std::isnan(*v));
  EXPECT_EQ(r.precision_policy, "nan inf \" -inf");
  ASSERT_EQ(r.layers.size(), 1u);
  EXPECT_EQ(r.layers[0].layer, "inf");
  EXPECT_TRUE(std::isnan(*r.layers[0].sqnr_x_db));
  // A word that only starts like one is not a number.
  expect_error([] { rf::parse_epoch_line("{\"epoch\":1,\"train_loss\":nanx}", "m.jsonl", 2); }, Status::corrupt_data,
               {"m.jsonl:2:", "malformed JSON"});
}

TEST(RunFiles, MalformedLinesNameFileLineAndField) {
  auto line_error = [](const std::string& line, std::initializer_list<std::string> parts) {
    expect_error([&] { rf::parse_epoch_line(line, "m.jsonl", 7); }, Status::corrupt_data, parts);
  };
  const std::string head = "{\"epoch\":1,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1";
  line_error("{\"a\":1,\"b\":", {"m.jsonl:7:12:", "malformed JSON", "unexpected end of input"});
  line_error("{\"a\":1 \"b\":2}", {"m.jsonl:7:10:", "malformed JSON", "expected '}'"});
  line_error("{\"epoch\": 01}", {"m.jsonl:7:", "malformed JSON"});
  line_error("{\"epoch\":1} x", {"m.jsonl:7:", "malformed JSON"});
  line_error("\"abc", {"m.jsonl:7:", "malformed JSON"});
  line_error("\"\\x\"", {"m.jsonl:7:", "malformed JSON"});
  line_error("\"\xff\"", {"m.jsonl:7:", "UTF-8"});
  line_error(std::string(1000, '['), {"m.jsonl:7:", "nest deeper than"});
  line_error(head + ",\"lr\":1e999}", {"m.jsonl:7:", "number overflow"});
  line_error("[1,2]", {"m.jsonl:7:", "expected one JSON object per line", "an array"});
  line_error("{\"epoch\":1,\"train_loss\":1,\"epoch_seconds\":1}", {"m.jsonl:7:", "required field 'test_top1' is missing"});
  line_error("{\"epoch\":\"one\",\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}",
             {"m.jsonl:7:", "field 'epoch' is a string (\"one\")", "expected a number"});
  line_error("{\"epoch\":0,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}", {"m.jsonl:7:", "integer >= 1"});
  line_error("{\"epoch\":null,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}", {"m.jsonl:7:", "'epoch' is null"});
  line_error(head + ",\"lr\":true}", {"m.jsonl:7:", "field 'lr' is a boolean (true); expected a number"});
  line_error(head + ",\"peak_rss_kib\":1.5}", {"m.jsonl:7:", "'peak_rss_kib'", "expected an integer"});
  line_error(head + ",\"skipped_steps\":18446744073709551615}", {"m.jsonl:7:", "'skipped_steps'", "expected an integer"});
  line_error(head + ",\"precision_policy\":3}", {"m.jsonl:7:", "'precision_policy' is a number", "expected a string"});
  line_error(head + ",\"layers\":{}}", {"m.jsonl:7:", "'layers' is an object", "expected an array"});
  line_error(head + ",\"layers\":[{\"layer\":\"a\"},7]}", {"m.jsonl:7:", "element 1 of 'layers'", "expected a JSON object"});
  line_error(head + ",\"layers\":[{\"format\":\"int16\"}]}", {"m.jsonl:7:", "element 0 of 'layers'", "\"layer\" name"});
  line_error(head + ",\"layers\":[{\"layer\":\"c\",\"exp_x\":\"-3\"}]}",
             {"m.jsonl:7:", "layer 'c': field 'exp_x' is a string (\"-3\"); expected an integer"});
  line_error(head + ",\"layers\":[{\"layer\":\"c\",\"sqnr_w_db\":[1]}]}", {"layer 'c'", "'sqnr_w_db' is an array"});
  // Absent optional fields and null layers are fine; an integral float counts as an integer.
  const rf::EpochRecord r = rf::parse_epoch_line(head + ",\"layers\":null,\"peak_rss_kib\":2.0,\"extra\":{}}", "m.jsonl", 1);
  EXPECT_TRUE(r.layers.empty());
  EXPECT_EQ(r.peak_rss_kib, 2);
}

TEST(RunFiles, ConfigKeepsItsMembersInOrderAndNamesTheLineOfABadOne) {
  rf::ConfigRecord c;
  c.add_string("model", "lenet");
  c.add_literal("lr", "0.05");
  c.add_literal("weight_decay", "1e-04");
  c.add_literal("label_smoothing", "0");
  c.add_literal("nesterov", "false");
  c.add_string("data", "/d\xff");  // not UTF-8: written as U+FFFD
  const std::string text = rf::to_text(c);
  EXPECT_EQ(text,
            "{\"model\":\"lenet\",\"lr\":0.05,\"weight_decay\":0.0001,\"label_smoothing\":0,\"nesterov\":false,"
            "\"data\":\"/d\xef\xbf\xbd\"}\n");
  const rf::ConfigRecord back = rf::parse_config(text, "c.json");
  ASSERT_EQ(back.members.size(), 6u);
  EXPECT_EQ(back.members[1].key, "lr");
  EXPECT_EQ(back.members[1].text, "0.05");
  EXPECT_FALSE(back.members[1].is_string);
  EXPECT_EQ(back.string_or("model", "?"), "lenet");
  EXPECT_EQ(back.string_or("label", "dflt"), "dflt");
  EXPECT_EQ(back.integer_or("label_smoothing", 9), 0);
  EXPECT_EQ(back.integer_or("epochs", 9), 9);

  const rf::ConfigRecord bad = rf::parse_config("{\n  \"model\": 3,\n  \"batch_size\": \"big\",\n  \"epochs\": 2.5,\n"
                                                "  \"label\": null, \"seed\": nan}", "run/config.json");
  expect_error([&] { bad.string_or("model", ""); }, Status::corrupt_data,
               {"run/config.json:2: field 'model' is a number (3); expected a string"});
  expect_error([&] { bad.integer_or("batch_size", 0); }, Status::corrupt_data,
               {"run/config.json:3: field 'batch_size' is a string (\"big\"); expected an integer"});
  expect_error([&] { bad.integer_or("epochs", 0); }, Status::corrupt_data, {"run/config.json:4:", "'epochs'", "2.5"});
  EXPECT_EQ(bad.string_or("label", "d"), "d");  // null: as absent
  EXPECT_EQ(bad.integer_or("seed", 5), 5);
  rf::ConfigRecord unwritable;
  unwritable.add_literal("lr", "0.1f");  // not JSON: a bug of the writer, refused
  expect_error([&] { rf::to_text(unwritable); }, Status::internal, {"'lr'", "not JSON text"});
  expect_error([] { rf::parse_config("[]", "c.json"); }, Status::corrupt_data, {"c.json:1:", "expected a JSON object"});
  expect_error([] { rf::parse_config("{\n\"a\": 01}", "c.json"); }, Status::corrupt_data, {"c.json:2:7:", "malformed JSON"});
}

TEST(RunFiles, ProfileRoundTripsAndNamesItsFields) {
  rf::ProfileRecord p;
  p.steps = 10;
  p.step_seconds = 0.0673291;
  p.optimizer_seconds = 0.0038957;
  p.data_wait_seconds = 0;
  p.layers = {{"conv1", "conv", "int16", "conv_s16 | a | b", 0.0115143, 0.00820382, 10}, {"loss", "loss", "fp32", "", 1e-05, 2, 10}};
  const std::string text = rf::to_text(p);
  EXPECT_EQ(text.rfind("{\"steps\":10,\"step_seconds\":0.0673291,", 0), 0u) << text;
  EXPECT_NE(text.find("{\"layer\":\"conv1\",\"kind\":\"conv\",\"precision\":\"int16\",\"implementation\":\"conv_s16 | a | b\","
                      "\"forward_seconds\":0.0115143,\"backward_seconds\":0.00820382,\"steps\":10}"),
            std::string::npos)
      << text;
  const rf::ProfileRecord back = rf::parse_profile(text, "profile.json");
  EXPECT_EQ(back.steps, 10u);
  EXPECT_EQ(back.step_seconds, 0.0673291);
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[1].forward_seconds, 1e-05);
  EXPECT_EQ(back.layers[1].implementation, "");
  EXPECT_EQ(rf::to_text(back), text);
  EXPECT_FALSE(back.communication);
  EXPECT_EQ(text.find("communication"), std::string::npos) << text;  // a one-process run has none
  // A data-parallel run's communication round-trips and names its fields.
  p.communication = rf::ProfileCommRecord{2, "dfp16", 5388760, 10777360, 0.0912, 0.0043};
  const std::string dist_text = rf::to_text(p);
  EXPECT_NE(dist_text.find("\"communication\":{\"ranks\":2,\"allreduce\":\"dfp16\",\"bytes\":5388760,\"fp32_bytes\":10777360,"
                           "\"in_flight_seconds\":0.0912,\"exposed_seconds\":0.0043}"),
            std::string::npos)
      << dist_text;
  const rf::ProfileRecord dist_back = rf::parse_profile(dist_text, "profile.json");
  ASSERT_TRUE(dist_back.communication);
  EXPECT_EQ(dist_back.communication->bytes, 5388760u);
  EXPECT_EQ(dist_back.communication->exposed_seconds, 0.0043);
  EXPECT_EQ(rf::to_text(dist_back), dist_text);
  expect_error([] { rf::parse_profile("{\"steps\":1,\"step_seconds\":1,\"optimizer_seconds\":1,\"data_wait_seconds\":1,\"layers\":[],"
                                      "\"communication\":{\"ranks\":2,\"allreduce\":\"fp32\",\"bytes\":-4}}", "p.json"); },
               Status::corrupt_data, {"p.json:1: communication: field 'bytes' is -4; expected a count >= 0"});
  expect_error([] { rf::parse_profile("{\"steps\":1,\n\"step_seconds\":1,\"optimizer_seconds\":1,\"data_wait_seconds\":1}", "p.json"); },
               Status::corrupt_data, {"p.json:1:", "required field 'layers' is missing"});
  expect_error([] { rf::parse_profile("{\"steps\":-1}", "p.json"); }, Status::corrupt_data, {"p.json:1:", "'steps'", ">= 0"});
  expect_error([] { rf::parse_profile("{\"steps\":1,\"step_seconds\":1,\"optimizer_seconds\":1,\n\"data_wait_seconds\":\"x\"}",
                                      "p.json"); },
               Status::corrupt_data, {"p.json:2: field 'data_wait_seconds' is a string"});
  expect_error([] { rf::parse_profile("{\"steps\":1,\"step_seconds\":1,\"optimizer_seconds\":1,\"data_wait_seconds\":1,\n"
                                      "\"layers\":[{\"layer\":\"a\"}]}", "p.json"); },
               Status::corrupt_data, {"p.json:2: element 0 of 'layers': required field 'kind' is missing"});
}

// ---- read_run --------------------------------------------------------------------------------

TEST(Report, ReadRunSummarizesTheMetricsFiles) {
  TempDir t;
  const auto dirs = write_runs(t);
  const RunSummary fp32 = read_run(dirs[0]);
  EXPECT_EQ(fp32.label, "fp32");
  EXPECT_EQ(fp32.model, "resnet20");
  EXPECT_EQ(fp32.batch_size, 128);
  EXPECT_EQ(fp32.epochs, 3);
  EXPECT_EQ(fp32.epochs_planned, 3);
  EXPECT_EQ(fp32.test_top1, 88.7167);
  EXPECT_EQ(fp32.test_top5, 99.61);
  EXPECT_EQ(fp32.final_train_loss, 0.352134);
  EXPECT_EQ(fp32.train_seconds, 196.0623);  // 65.7123 + 64.25 + 66.1, the exact decimal sum
  EXPECT_NEAR(fp32.train_seconds, 65.7123 + 64.25 + 66.1, 1e-9);
  EXPECT_EQ(fp32.images_per_second, (912.3 + 930.1 + 925.7) / 3);
  EXPECT_EQ(fp32.peak_rss_mib, 813000 / 1024.0);
  EXPECT_EQ(fp32.skipped_steps, 0);
  EXPECT_EQ(fp32.final_loss_scale, 1);
  EXPECT_TRUE(fp32.layers.empty());
  ASSERT_EQ(fp32.epochs_series.size(), 3u);
  EXPECT_EQ(fp32.epochs_series[1].lr, 0.05);

  const RunSummary int16 = read_run(dirs[1] + "/");  // a trailing slash still names the directory
  EXPECT_EQ(int16.label, "int16");
  EXPECT_EQ(int16.device, "cpu");
  EXPECT_EQ(int16.skipped_steps, -1);  // not logged
  EXPECT_TRUE(std::isnan(int16.final_loss_scale));
  ASSERT_EQ(int16.layers.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(int16.layers[i].name, kLayerNames[i]);
  EXPECT_EQ(int16.layers[1].format, "int16");
  EXPECT_EQ(int16.layers[4].points[2].exp_dy, -25);
  EXPECT_TRUE(std::isnan(int16.layers[0].points[1].sqnr_x_db));  // null: no sample
  EXPECT_EQ(int16.layers[0].points[2].sqnr_x_db, 70.5);
  EXPECT_EQ(int16.peak_rss_mib, 901024 / 1024.0);

  const RunSummary fp16 = read_run(dirs[2]);
  EXPECT_EQ(fp16.label, "fp16-dynamic");
  EXPECT_EQ(fp16.loss_scaling, "dynamic");
  EXPECT_EQ(fp16.skipped_steps, 5);
  EXPECT_EQ(fp16.final_loss_scale, 32768);
  EXPECT_EQ(fp16.test_top1, 86.8833);
  EXPECT_TRUE(std::isnan(fp16.layers[0].points[0].exp_x));
}

TEST(Report, ResumedRunsReplaceRepeatedEpochs) {
  TempDir t;
  const std::string dir = t.file("r");
  write(dir + "/config.json", "{}");
  write(dir + "/metrics.jsonl",
        "{\"epoch\":1,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1.5}\n"
        "{\"epoch\":2,\"train_loss\":0.9,\"test_top1\":51,\"epoch_seconds\":2}\n\n"
        "{\"epoch\":2,\"train_loss\":0.8,\"test_top1\":52,\"epoch_seconds\":2.25}\r\n"
        "{\"epoch\":3,\"train_loss\":0.7,\"test_top1\":53,\"epoch_seconds\":3}\n");
  const RunSummary r = read_run(dir);
  EXPECT_EQ(r.label, "r");
  ASSERT_EQ(r.epochs_series.size(), 3u);
  EXPECT_EQ(r.epochs_series[1].train_loss, 0.8);
  EXPECT_EQ(r.train_seconds, 6.75);
  EXPECT_TRUE(std::isnan(r.test_top5));
  EXPECT_TRUE(std::isnan(r.peak_rss_mib));
  // Optional figures missing: empty CSV fields.
  const auto row = summary_row(r);
  EXPECT_EQ(row[8], "");   // test_top5
  EXPECT_EQ(row[13], "");  // skipped_steps
}

TEST(Report, MalformedRunsNameTheFileAndLine) {
  TempDir t;
  const std::string dir = t.file("bad");
  const std::string metrics = dir + "/metrics.jsonl";
  write(dir + "/config.json", config("\"label\":\"bad\","));
  const std::string good = "{\"epoch\":1,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}\n";

  // A truncated line (a run killed while writing).
  write(metrics, good + "{\"epoch\":2,\"train_loss\":0.9,\"test_top1\":5");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":2:", "malformed JSON", "unexpected end of input"});
  // A missing required field.
  write(metrics, good + good + "{\"epoch\":3,\"train_loss\":0.9,\"epoch_seconds\":1}\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":3:", "required field 'test_top1' is missing"});
  // Wrong types.
  write(metrics, "{\"epoch\":\"one\",\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":1:", "'epoch' is a string", "expected a number"});
  write(metrics, "{\"epoch\":1,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1,\"layers\":[{\"layer\":\"c\",\"exp_x\":\"-3\"}]}\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":1:", "layer 'c'", "'exp_x'"});
  write(metrics, "{\"epoch\":1.5,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1}\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":1:", "integer >= 1"});
  write(metrics, "[1,2]\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics + ":1:", "expected one JSON object per line"});
  write(metrics, "\n\n");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {metrics, "no epochs"});
  // Missing and malformed config.json.
  write(metrics, good);
  write(dir + "/config.json", "{\"batch_size\":\"big\"}");
  expect_error([&] { read_run(dir); }, Status::corrupt_data, {dir + "/config.json:1:", "'batch_size'"});
  fs::remove(dir + "/config.json");
  expect_error([&] { read_run(dir); }, Status::io_error, {dir + "/config.json"});
  expect_error([&] { read_run(t.file("nowhere")); }, Status::io_error, {"nowhere"});
}

// ---- the report ------------------------------------------------------------------------------

TEST(Report, WritesEveryArtifactWithTheMetricsFigures) {
  TempDir t;
  const auto dirs = write_runs(t);
  std::vector<RunSummary> runs;
  for (const auto& d : dirs) runs.push_back(read_run(d));
  std::vector<std::string> logged;
  const std::string out = t.file("cmp");
  const ReportFiles f = write_report(out, runs, [&](const std::string& s) { logged.push_back(s); });

  for (const auto& p : {f.csv, f.markdown_table, f.html, f.markdown}) EXPECT_TRUE(non_empty(p)) << p;
  ASSERT_EQ(f.metrics.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(fs::path(f.metrics[i]), fs::path(dirs[i]) / "metrics.jsonl");
  EXPECT_FALSE(f.scripts.empty());
  for (const auto& p : f.scripts) EXPECT_TRUE(non_empty(p)) << p;
  EXPECT_TRUE(non_empty(out + "/plots/loss.gp"));
  EXPECT_TRUE(non_empty(out + "/plots/epochs_fp16-dynamic.dat"));

  // The table's figures are the metrics files' numbers, exactly.
  const auto csv = read_csv(f.csv);
  ASSERT_EQ(csv.size(), 3u);
  const auto& a = csv.at("fp32");
  EXPECT_EQ(a.at("test_top1"), "88.7167");
  EXPECT_EQ(a.at("test_top5"), "99.61");
  EXPECT_EQ(a.at("final_train_loss"), "0.352134");
  EXPECT_EQ(a.at("train_seconds"), "196.0623");
  EXPECT_EQ(a.at("peak_rss_mib"), "793.9453125");  // 813000 KiB
  EXPECT_EQ(a.at("skipped_steps"), "0");
  EXPECT_EQ(a.at("final_loss_scale"), "1");
  EXPECT_EQ(std::stod(a.at("images_per_second")), (912.3 + 930.1 + 925.7) / 3);
  EXPECT_EQ(a.at("batch_size"), "128");
  EXPECT_EQ(a.at("epochs"), "3");
  const auto& b = csv.at("int16");
  EXPECT_EQ(b.at("test_top1"), "84.125");
  EXPECT_EQ(b.at("test_top5"), "98.75");
  EXPECT_EQ(b.at("final_train_loss"), "0.45");
  EXPECT_EQ(b.at("train_seconds"), "357.75");
  EXPECT_EQ(b.at("peak_rss_mib"), "879.90625");  // 901024 KiB
  EXPECT_EQ(b.at("skipped_steps"), "");
  EXPECT_EQ(b.at("final_loss_scale"), "");
  const auto& c = csv.at("fp16-dynamic");
  EXPECT_EQ(c.at("test_top1"), "86.8833");
  EXPECT_EQ(c.at("final_train_loss"), "0.45");
  EXPECT_EQ(c.at("train_seconds"), "120.375");
  EXPECT_EQ(c.at("peak_rss_mib"), "683.59375");
  EXPECT_EQ(c.at("skipped_steps"), "5");
  EXPECT_EQ(c.at("final_loss_scale"), "32768");
  EXPECT_EQ(c.at("images_per_second"), "602.5");
  // Every exact figure also parses back to the summary's double.
  for (const auto& r : runs) {
    const auto& row = csv.at(r.label);
    EXPECT_EQ(std::stod(row.at("test_top1")), r.test_top1);
    EXPECT_EQ(std::stod(row.at("train_seconds")), r.train_seconds);
    EXPECT_EQ(std::stod(row.at("peak_rss_mib")), r.peak_rss_mib);
  }

  // summary.md holds the same strings.
  const auto md = read_md(f.markdown_table);
  ASSERT_EQ(md.size(), 3u);
  const auto cols = summary_columns();
  for (const auto& [label, row] : csv) {
    ASSERT_EQ(md.at(label).size(), cols.size()) << label;
    for (size_t i = 0; i < cols.size(); ++i)
      EXPECT_EQ(md.at(label)[i], row.at(cols[i]).empty() ? "-" : row.at(cols[i])) << label << " " << cols[i];
  }

  // The terminal table.
  const std::string table = format_table(runs);
  for (const char* s : {"fp32", "int16", "fp16-dynamic", "88.72", "32768", "model resnet20, dataset fashion-mnist"})
    EXPECT_NE(table.find(s), std::string::npos) << s << "\n" << table;

  // Plots, or the note that says why there are none.
  const std::string html = read(f.html), mdr = read(f.markdown);
  EXPECT_NE(html.find("<table>"), std::string::npos);
  EXPECT_NE(html.find("layer1.0.conv2"), std::string::npos);  // per-layer details
  EXPECT_NE(html.find("Overflow, saturation and underflow"), std::string::npos);
  // Each operand's underflow at the last sample, where the run logs it (fp16's lines, not int16's).
  EXPECT_NE(mdr.find("| underflow x % | underflow w % | underflow dy % |"), std::string::npos) << mdr;
  EXPECT_NE(mdr.find("| 1 | layer1.0.conv1 | fp16 | 54.0 | 40.0 | 0 | 300 | 15000 | 0.00 | 0.00 | 5.00 |"),
            std::string::npos) << mdr;
  const size_t int16_layers = mdr.find("\n### int16");
  ASSERT_NE(int16_layers, std::string::npos) << mdr;
  EXPECT_EQ(mdr.substr(int16_layers, mdr.find("\n###", int16_layers + 1) - int16_layers).find("underflow dy %"),
            std::string::npos) << mdr;
  EXPECT_NE(html.find("<th>loss_scaling</th><td>dynamic</td>"), std::string::npos);  // the runs' configuration
  if (!f.plots_skipped) {
    EXPECT_TRUE(f.plots_note.empty()) << f.plots_note;
    const std::string ext = fs::path(f.plots.at(0)).extension().string();
    for (const std::string stem : {"loss", "test_top1", "performance", "loss_scale", "exp_int16_x", "exp_int16_w",
                                   "exp_int16_dy", "sqnr_layers_x", "sqnr_layers_dy", "sqnr_layers_w",
                                   "sqnr_epochs_x", "sqnr_epochs_dy"}) {
      const std::string img = out + "/plots/" + stem + ext;
      EXPECT_TRUE(non_empty(img)) << img;
      EXPECT_NE(html.find("<img src=\"plots/" + stem + ext + "\""), std::string::npos) << stem;
      EXPECT_NE(mdr.find("](plots/" + stem + ext + ")"), std::string::npos) << stem;
    }
    for (const auto& p : f.plots) EXPECT_TRUE(non_empty(p)) << p;
    // No exponent plot for runs without exponents.
    EXPECT_FALSE(fs::exists(out + "/plots/exp_fp16-dynamic_x" + ext));
  } else {
    EXPECT_TRUE(f.plots.empty());
    EXPECT_NE(html.find("gnuplot not found: plots skipped (CSV/JSON written)"), std::string::npos);
    EXPECT_NE(std::find(logged.begin(), logged.end(), "gnuplot not found: plots skipped (CSV/JSON written)"),
              logged.end());
  }
}

TEST(Report, WithoutGnuplotEverythingElseIsWritten) {
  TempDir t;
  const auto dirs = write_runs(t);
  std::vector<RunSummary> runs;
  for (const auto& d : dirs) runs.push_back(read_run(d));
  ScopedEnv env("DFP_GNUPLOT", "");
  std::vector<std::string> logged;
  // Runs kept outside the output directory: their metrics are copied in.
  const std::string out = t.file("report");
  const ReportFiles f = write_report(out, runs, [&](const std::string& s) { logged.push_back(s); });
  EXPECT_TRUE(f.plots_skipped);
  EXPECT_TRUE(f.plots.empty());
  EXPECT_EQ(f.plots_note, "gnuplot not found: plots skipped (CSV/JSON written)");
  ASSERT_FALSE(logged.empty());
  EXPECT_EQ(logged[0], "gnuplot not found: plots skipped (CSV/JSON written)");
  for (const auto& p : {f.csv, f.markdown_table, f.html, f.markdown}) EXPECT_TRUE(non_empty(p)) << p;
  ASSERT_EQ(f.metrics.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(fs::path(f.metrics[i]), fs::path(out) / "metrics" / runs[i].label / "metrics.jsonl");
    EXPECT_EQ(read(f.metrics[i]), read(dirs[i] + "/metrics.jsonl"));
  }
  EXPECT_TRUE(non_empty(out + "/plots/loss.gp"));  // the scripts are written for later
  const std::string html = read(f.html);
  EXPECT_NE(html.find("gnuplot not found: plots skipped (CSV/JSON written)"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_NE(html.find("metrics/fp16-dynamic/metrics.jsonl"), std::string::npos);
  EXPECT_EQ(read_csv(f.csv).at("fp16-dynamic").at("skipped_steps"), "5");
}

TEST(Report, RejectsDuplicateLabels) {
  TempDir t;
  const auto dirs = write_runs(t);
  const RunSummary r = read_run(dirs[0]);
  ScopedEnv env("DFP_GNUPLOT", "");
  expect_error([&] { write_report(t.file("out"), {r, r}, nullptr); }, Status::invalid_argument, {"'fp32'"});
}

TEST(Report, RunsWithOnlyTheRequiredFieldsStillPlot) {
  TempDir t;
  const std::string dir = t.file("cmp/minimal");
  write(dir + "/config.json", "{}");
  write(dir + "/metrics.jsonl",
        "{\"epoch\":1,\"train_loss\":1,\"test_top1\":50,\"epoch_seconds\":1.5}\n"
        "{\"epoch\":2,\"train_loss\":0.8,\"test_top1\":60,\"epoch_seconds\":1.5,\"layers\":[{\"layer\":\"conv1\"}]}\n");
  const std::vector<RunSummary> runs = {read_run(dir), read_run(write_runs(t)[0])};
  const ReportFiles f = write_report(t.file("cmp"), runs, nullptr);
  for (const auto& p : {f.csv, f.markdown_table, f.html, f.markdown}) EXPECT_TRUE(non_empty(p)) << p;
  EXPECT_EQ(read_csv(f.csv).at("minimal").at("train_seconds"), "3");
  if (!f.plots_skipped) {
    EXPECT_EQ(f.plots_note, "");  // gnuplot drew every plot it was given
    EXPECT_GE(f.plots.size(), 3u);  // loss, top-1, performance
  }
  EXPECT_NE(format_table(runs).find("minimal"), std::string::npos);
}

// ---- granularity (DFP16 exponents per tensor or per slice) -------------------------------------

namespace {

std::string policy(const std::string& precision, const char* w, const char* x, const char* dy) {
  auto group = [](const char* name, const char* g) {
    return std::string(" ") + name + "{headroom=2,rounding=nearest,granularity=" + g + "}";
  };
  return precision + group("weights", w) + group("activations", x) + group("gradients", dy);
}

// An INT16 metrics line of layers conv1 and layer1.0.conv1. `slices`: the smallest exponents of a
// run with an exponent per slice, written where they differ from the largest (as the trainer
// writes them): x never, w in conv1 from epoch 2 (spread 2), dy in both layers (spreads 3 + epoch
// and 5).
std::string granularity_line(int epoch, const std::string& policy_text, bool slices) {
  std::ostringstream o;
  o << "{\"epoch\":" << epoch << ",\"train_loss\":0.5,\"test_top1\":80,\"epoch_seconds\":10,\"precision_policy\":\""
    << policy_text << "\",\"layers\":[";
  for (int i = 0; i < 2; ++i) {
    o << (i ? "," : "") << "{\"layer\":\"" << kLayerNames[i] << "\",\"format\":\"int16\",\"exp_x\":-10,\"exp_w\":-14,\"exp_dy\":"
      << -20 - i;
    if (slices && i == 0 && epoch >= 2) o << ",\"exp_w_min\":-16";
    if (slices) o << ",\"exp_dy_min\":" << (i == 0 ? -23 - epoch : -26);
    o << ",\"sqnr_x_db\":" << 70 + i << ",\"sqnr_w_db\":75,\"sqnr_dy_db\":" << (slices ? 66 : 55) + i << "}";
  }
  o << "]}\n";
  return o.str();
}

// Under <root>/cmp/: int16 (tensor), int16-slice (slice in every class), int16-w (slice in the
// weights; its policy only in the metrics lines), int16-old (a policy without granularity) and
// fp32 (a policy that names a granularity but runs no INT16 layer).
std::vector<std::string> write_granularity_runs(const TempDir& t) {
  const std::string tensor = policy("precision=int16", "tensor", "tensor", "tensor");
  const std::string slice = policy("precision=int16", "slice", "slice", "slice");
  const std::string w_only = policy("precision=fp32 override[conv1]=int16 override[layer1*]=int16", "slice", "tensor", "tensor");
  const std::vector<std::tuple<std::string, std::string, std::string, bool>> runs = {
      {"int16", tensor, tensor, false},
      {"int16-slice", slice, slice, true},
      {"int16-w", "", w_only, false},
      {"int16-old", "precision=int16", "precision=int16", false},
      {"fp32", policy("precision=fp32", "slice", "slice", "slice"), "precision=fp32", false}};
  std::vector<std::string> dirs;
  for (const auto& [label, config_policy, metrics_policy, slices] : runs) {
    const std::string dir = t.file("cmp/" + label);
    write(dir + "/config.json", "{\"label\":\"" + label + "\",\"model\":\"resnet20\"" +
                                    (config_policy.empty() ? "" : ",\"precision_policy\":\"" + config_policy + "\"") + "}\n");
    std::string lines;
    for (int e = 1; e <= 3; ++e)
      lines += label == "fp32" ? "{\"epoch\":" + std::to_string(e) + ",\"train_loss\":0.5,\"test_top1\":80,\"epoch_seconds\":10}\n"
                               : granularity_line(e, metrics_policy, slices);
    write(dir + "/metrics.jsonl", lines);
    dirs.push_back(dir);
  }
  return dirs;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(Report, ReadRunTakesTheGranularityTheRunRecorded) {
  TempDir t;
  const auto dirs = write_granularity_runs(t);
  std::vector<RunSummary> r;
  for (const auto& d : dirs) r.push_back(read_run(d));
  EXPECT_EQ(std::make_tuple(r[0].granularity_w, r[0].granularity_x, r[0].granularity_dy, r[0].int16),
            std::make_tuple(std::string("tensor"), std::string("tensor"), std::string("tensor"), true));
  EXPECT_EQ(std::make_tuple(r[1].granularity_w, r[1].granularity_x, r[1].granularity_dy),
            std::make_tuple(std::string("slice"), std::string("slice"), std::string("slice")));
  // No policy in config.json: the metrics lines'; INT16 through overrides.
  EXPECT_EQ(std::make_tuple(r[2].granularity_w, r[2].granularity_x, r[2].int16),
            std::make_tuple(std::string("slice"), std::string("tensor"), true));
  EXPECT_EQ(r[3].granularity_w, "");
  const std::vector<std::pair<std::string, std::string>> want = {{"tensor", "int16 (tensor)"},
                                                                 {"slice: w, x, dy", "int16-slice (slice: w, x, dy)"},
                                                                 {"slice: w; tensor: x, dy", "int16-w (slice: w; tensor: x, dy)"},
                                                                 {"", "int16-old"},  // not recorded: not guessed
                                                                 {"", "fp32"}};      // no INT16 layer
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(granularity_text(r[i]), want[i].first) << r[i].label;
    EXPECT_EQ(run_title(r[i]), want[i].second) << r[i].label;
  }
  EXPECT_FALSE(r[4].int16);
  // Block granularities group like slices, the finer classes first.
  RunSummary mixed;
  mixed.label = "int16-b";
  mixed.int16 = true;
  mixed.granularity_w = "tensor";
  mixed.granularity_x = "block64";
  mixed.granularity_dy = "block32";
  EXPECT_EQ(granularity_text(mixed), "block64: x; block32: dy; tensor: w");
  // The slices' smallest exponents as logged (NaN where the line has none).
  EXPECT_EQ(r[1].layers[0].points[2].exp_dy_min, -26);
  EXPECT_EQ(r[1].layers[0].points[1].exp_w_min, -16);
  EXPECT_TRUE(std::isnan(r[1].layers[0].points[0].exp_w_min));
}

TEST(Report, PlotsAndTablesNameTheGranularityAndShowTheSpread) {
  TempDir t;
  const auto dirs = write_granularity_runs(t);
  std::vector<RunSummary> runs;
  for (const auto& d : dirs) runs.push_back(read_run(d));
  const std::string out = t.file("cmp");
  const ReportFiles f = write_report(out, runs, nullptr);
  const std::string plots = out + "/plots/";

  // Every SQNR plot's legend, and the training curves', name each INT16 run's granularity.
  for (const char* gp : {"sqnr_layers_x.gp", "sqnr_layers_w.gp", "sqnr_layers_dy.gp", "loss.gp"}) {
    const std::string s = read(plots + gp);
    for (const char* title : {"title 'int16 (tensor)'", "title 'int16-slice (slice: w, x, dy)'",
                              "title 'int16-w (slice: w; tensor: x, dy)'", "title 'int16-old'"})
      EXPECT_TRUE(has(s, title)) << gp << ": " << title << "\n" << s;
  }
  for (const char* gp : {"sqnr_epochs_x.gp", "sqnr_epochs_w.gp", "sqnr_epochs_dy.gp"}) {
    const std::string s = read(plots + gp);
    for (const char* title : {"title 'int16 (tensor) mean'", "title 'int16 (tensor) worst layer'",
                              "title 'int16-slice (slice: w, x, dy) mean'", "title 'int16-slice (slice: w, x, dy) worst layer'"})
      EXPECT_TRUE(has(s, title)) << gp << ": " << title;
  }
  EXPECT_TRUE(has(read(plots + "exp_int16_dy.gp"), "set title 'int16 (tensor): DFP16 exponent e of the gradients (exp_dy)"));
  EXPECT_TRUE(has(read(plots + "exp_int16-slice_dy.gp"),
                  "set title 'int16-slice (slice: w, x, dy): DFP16 exponent e of the gradients, the largest of the slices'' (exp_dy)"));

  // Spread maps where a layer's slices differ: dy of int16-slice (every epoch), w of int16-slice
  // (conv1 from epoch 2); none for its x (one exponent among the slices) nor for the other runs.
  ASSERT_TRUE(fs::exists(plots + "exp_int16-slice_dy_spread.gp"));
  EXPECT_EQ(read(plots + "exp_int16-slice_dy_spread.dat"),
            "# int16-slice (slice: w, x, dy): spread of the slices' DFP16 exponents within each layer's gradients "
            "(exp_dy - exp_dy_min, bits)\n# epoch layer_row spread_bits largest smallest\n"
            "1 0 4 -20 -24\n1 1 5 -21 -26\n2 0 5 -20 -25\n2 1 5 -21 -26\n3 0 6 -20 -26\n3 1 5 -21 -26\n");
  EXPECT_EQ(read(plots + "exp_int16-slice_w_spread.dat"),
            "# int16-slice (slice: w, x, dy): spread of the slices' DFP16 exponents within each layer's weights "
            "(exp_w - exp_w_min, bits)\n# epoch layer_row spread_bits largest smallest\n"
            "1 0 0 -14 -14\n1 1 0 -14 -14\n2 0 2 -14 -16\n2 1 0 -14 -14\n3 0 2 -14 -16\n3 1 0 -14 -14\n");
  const std::string spread_gp = read(plots + "exp_int16-slice_dy_spread.gp");
  EXPECT_TRUE(has(spread_gp, "set cbrange [-0.5:6.5]")) << spread_gp;  // from 0 bits
  EXPECT_TRUE(has(spread_gp, "plot 'exp_int16-slice_dy_spread.dat' using 1:2:(0.5):(0.5):3 with boxxyerror")) << spread_gp;
  for (const char* none : {"exp_int16-slice_x_spread", "exp_int16_dy_spread", "exp_int16_w_spread", "exp_int16-w_w_spread",
                           "exp_int16-old_dy_spread"})
    EXPECT_FALSE(fs::exists(plots + none + ".gp")) << none;
  const std::string md = read(f.markdown), html = read(f.html);
  for (const std::string& report : {md, html}) {
    EXPECT_TRUE(has(report, "int16-slice (slice: w, x, dy): spread of the exponents within the gradients"));
    EXPECT_TRUE(has(report, "int16-slice (slice: w, x, dy): spread of the exponents within the weights"));
    EXPECT_FALSE(has(report, "spread of the exponents within the activations"));
    EXPECT_FALSE(has(report, "int16 (tensor): spread"));
    EXPECT_TRUE(has(report, "legend names its DFP16 exponent granularity: tensor (one exponent per tensor)"));
  }
  if (!f.plots_skipped) {
    EXPECT_EQ(f.plots_note, "");
    const std::string ext = fs::path(f.plots.at(0)).extension().string();
    EXPECT_TRUE(non_empty(plots + "exp_int16-slice_dy_spread" + ext));
    EXPECT_TRUE(has(html, "<img src=\"plots/exp_int16-slice_dy_spread" + ext + "\""));
  }

  // The per-layer tables: the slices' exponent range where there is more than one.
  EXPECT_TRUE(has(md, "\n### int16-slice (slice: w, x, dy)\n"));
  EXPECT_TRUE(has(md, "| # | layer | format | exp x | exp w (min..max) | exp dy (min..max) |"));
  EXPECT_TRUE(has(md, "| 0 | conv1 | int16 | -10 | -16..-14 | -26..-20 |"));
  EXPECT_TRUE(has(md, "| 1 | layer1.0.conv1 | int16 | -10 | -14 | -26..-21 |"));
  EXPECT_TRUE(has(md, "\n### int16 (tensor)\n"));
  EXPECT_TRUE(has(md, "| 0 | conv1 | int16 | -10 | -14 | -20 |"));
  EXPECT_TRUE(has(html, "<summary>int16-slice (slice: w, x, dy): 2 layers"));
  EXPECT_TRUE(has(html, "<th>exp dy (min..max)</th>"));
  EXPECT_TRUE(has(html, "<td class=\"n\">-26..-20</td>"));
  EXPECT_TRUE(has(html, "<summary>int16 (tensor): 2 layers"));
  // The summary: a granularity column; the terminal table names it after the label.
  const std::string csv = read(f.csv);
  EXPECT_TRUE(has(csv.substr(0, csv.find('\n')), ",final_loss_scale,granularity")) << csv;
  EXPECT_TRUE(has(csv, "\nint16,cpu,resnet20,,,3,,80,,0.5,30,,,,,tensor\n")) << csv;
  EXPECT_TRUE(has(csv, "\nint16-slice,cpu,resnet20,,,3,,80,,0.5,30,,,,,\"slice: w, x, dy\"\n")) << csv;
  EXPECT_TRUE(has(csv, "\nfp32,cpu,resnet20,,,3,,80,,0.5,30,,,,,\n")) << csv;
  EXPECT_TRUE(has(read(f.markdown_table), "| int16-w | cpu | resnet20 | - | - | 3 | - | 80 | - | 0.5 | 30 | - | - | - | - | slice: w; tensor: x, dy |"));
  EXPECT_TRUE(has(html, "<td>slice: w; tensor: x, dy</td>"));
  const std::string table = format_table(runs);
  EXPECT_TRUE(has(table, "\nint16-slice (slice: w, x, dy)  ")) << table;
  EXPECT_TRUE(has(table, "\nint16 (tensor)  ")) << table;
}
