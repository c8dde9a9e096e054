// The precision policy: names, parsing, resolution per layer and its text forms
// (include/dfp/precision.hpp); what each precision runs on this CPU is in precision_notes.cpp.
#include "dfp/precision.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "dfp/conv.hpp"
#include "dfp/status.hpp"
#include "base/named_enum.hpp"
#include "src/numerics/precision_internal.hpp"
#include <iterator>

namespace dfp {

namespace {
// Every precision once: its name, and the 16-bit float format a float precision rounds its
// operands to (fp32: none).
// (fp8's and MX's recipes give the gradients a format of their own).
struct PrecisionInfo {
  Precision value;
  const char* name;
  FloatFormat operands, gradients;
  bool mx;
};
constexpr PrecisionInfo kPrecisions[] = {
    {Precision::fp32, "fp32", FloatFormat::fp32, FloatFormat::fp32, false},
    {Precision::int16, "int16", FloatFormat::fp32, FloatFormat::fp32, false},
    {Precision::bf16, "bf16", FloatFormat::bf16, FloatFormat::bf16, false},
    {Precision::fp16, "fp16", FloatFormat::fp16, FloatFormat::fp16, false},
    {Precision::fp8, "fp8", FloatFormat::e4m3, FloatFormat::e5m2, false},
    {Precision::mxfp8, "mxfp8", FloatFormat::e4m3, FloatFormat::e5m2, true},
    {Precision::mxfp6, "mxfp6", FloatFormat::e2m3, FloatFormat::e3m2, true},
    {Precision::mxfp4, "mxfp4", FloatFormat::e2m1, FloatFormat::e2m1, true},
    {Precision::mxint8, "mxint8", FloatFormat::int8, FloatFormat::int8, true},
    {Precision::posit16, "posit16", FloatFormat::posit16, FloatFormat::posit16, false},
    {Precision::posit16es2, "posit16es2", FloatFormat::posit16es2, FloatFormat::posit16es2, false},
};
const PrecisionInfo* info(Precision p) noexcept {
  for (const PrecisionInfo& i : kPrecisions)
    if (i.value == p) return &i;
  return nullptr;
}
}  // namespace

const char* precision_name(Precision p) noexcept {
  const PrecisionInfo* i = info(p);
  return i ? i->name : "?";
}

FloatFormat operand_format(Precision p) noexcept {
  const PrecisionInfo* i = info(p);
  return i ? i->operands : FloatFormat::fp32;
}

bool is_mx(Precision p) noexcept {
  const PrecisionInfo* i = info(p);
  return i && i->mx;
}

Precision parse_precision(const std::string& text, const std::string& origin) {
  std::string expected;
  const size_t n = std::size(kPrecisions);
  for (size_t k = 0; k < n; ++k) {
    if (text == kPrecisions[k].name) return kPrecisions[k].value;
    expected += (k == 0 ? "" : k + 1 == n ? " or " : ", ") + std::string(kPrecisions[k].name);
  }
  fail(Status::invalid_argument, origin + ": unknown precision '" + text + "'; expected " + expected);
}

const char* float8_scaling_name(Float8Scaling s) noexcept {
  switch (s) {
    case Float8Scaling::none: return "none";
    case Float8Scaling::current: return "current";
    case Float8Scaling::delayed: return "delayed";
  }
  return "?";
}

Float8Scaling parse_float8_scaling(const std::string& text, const std::string& origin) {
  return parse_named(text, {Float8Scaling::none, Float8Scaling::current, Float8Scaling::delayed}, float8_scaling_name,
                     origin, "fp8 scaling");
}

std::string Float8Options::text() const {
  return std::string(float8_scaling_name(scaling)) + "," + std::to_string(amax_history) + "," + std::to_string(margin) +
         "," + overflow_name(overflow);
}

namespace {
int parse_int_in(const std::string& text, int lo, int hi, const std::string& origin) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  DFP_CHECK(!text.empty() && end && *end == 0 && errno == 0 && v >= lo && v <= hi, Status::invalid_argument,
            origin + ": expected an integer " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" + text + "'");
  return int(v);
}
}  // namespace

Float8Options Float8Options::parse(const std::string& text, const std::string& origin) {
  std::vector<std::string> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(item);
  DFP_CHECK(v.size() == 4, Status::invalid_argument,
            origin + ": expected SCALING,HISTORY,MARGIN,OVERFLOW (e.g. delayed,1024,0,saturate), got '" + text + "'");
  Float8Options o;
  o.scaling = parse_float8_scaling(v[0], origin);
  o.amax_history = parse_int_in(v[1], 1, kFloat8MaxHistory, origin + " (amax history)");
  o.margin = parse_int_in(v[2], 0, kFloat8MaxMargin, origin + " (margin)");
  o.overflow = parse_overflow(v[3], origin);
  return o;
}

void Float8Options::validate(const std::string& origin) const {
  DFP_CHECK(amax_history >= 1 && amax_history <= kFloat8MaxHistory, Status::invalid_argument,
            origin + ": fp8 amax history must be 1.." + std::to_string(kFloat8MaxHistory) + ", got " +
                std::to_string(amax_history));
  DFP_CHECK(margin >= 0 && margin <= kFloat8MaxMargin, Status::invalid_argument,
            origin + ": fp8 margin must be 0.." + std::to_string(kFloat8MaxMargin) + ", got " + std::to_string(margin));
}

namespace {
bool glob_match(const char* p, const char* s) {
  for (; *p; ++p, ++s) {
    if (*p == '*') {
      for (; *s; ++s)
        if (glob_match(p + 1, s)) return true;
      return glob_match(p + 1, s);
    }
    if (!*s || (*p != '?' && *p != *s)) return false;
  }
  return !*s;
}
}  // namespace

Precision PrecisionPolicy::resolve(const std::string& layer) const {
  for (const auto& [pattern, p] : overrides)
    if (glob_match(pattern.c_str(), layer.c_str())) return p;
  return precision;
}

bool PrecisionPolicy::matches(const std::string& pattern, const std::string& layer) {
  return glob_match(pattern.c_str(), layer.c_str());
}

LayerPrecision PrecisionPolicy::for_layer(const std::string& layer) const {
  LayerPrecision l;
  l.precision = resolve(layer);
  if (l.is_float()) l.formats = class_formats(l.precision);
  l.options = dfp;
  l.fp8 = fp8;
  return l;
}

DfpConvOptions LayerPrecision::options_for(const std::string& layer) const {
  DfpConvOptions o = options;
  for (QuantOptions* q : {&o.weights, &o.activations, &o.gradients}) {
    q->name = layer + "." + q->name;
    q->seed ^= std::hash<std::string>{}(q->name);
  }
  return o;
}

std::string ClassFormats::names() const {
  return std::string(float_format_name(weights)) + "/" + float_format_name(activations) + "/" +
         float_format_name(gradients);
}

ClassFormats PrecisionPolicy::class_formats(Precision p) const {
  const FloatFormat own = operand_format(p);
  const PrecisionInfo* i = info(p);
  const FloatFormat own_gradients = i ? i->gradients : own;
  return {weights_format.value_or(own), activations_format.value_or(own), gradients_format.value_or(own_gradients)};
}

namespace detail {
std::vector<Precision> used_precisions(const PrecisionPolicy& policy) {
  std::vector<Precision> used = {policy.precision};
  for (const auto& o : policy.overrides)
    if (std::find(used.begin(), used.end(), o.second) == used.end()) used.push_back(o.second);
  return used;
}
}  // namespace detail

bool PrecisionPolicy::uses_float8() const {
  for (Precision p : detail::used_precisions(*this)) {
    if (operand_format(p) == FloatFormat::fp32 || is_mx(p)) continue;  // MX scales by blocks
    const ClassFormats f = class_formats(p);
    if (is_float8(f.weights) || is_float8(f.activations) || is_float8(f.gradients)) return true;
  }
  return false;
}

void PrecisionPolicy::validate(const std::string& origin) const {
  bool any_float = operand_format(precision) != FloatFormat::fp32;
  for (const auto& o : overrides) any_float |= operand_format(o.second) != FloatFormat::fp32;
  const bool class_formats_set = weights_format || activations_format || gradients_format;
  DFP_CHECK(!class_formats_set || any_float, Status::invalid_argument,
            origin + ": per-class formats (weights/activations/gradients) apply to bf16/fp16/fp8 layers, but the policy "
                     "has none (precision " + precision_name(precision) + ")");
  for (const QuantOptions* q : {&dfp.weights, &dfp.activations, &dfp.gradients}) q->validate(origin);
  fp8.validate(origin);
  // Posits round to nearest even only (the kernels have no stochastic form).
  for (Precision p : detail::used_precisions(*this)) {
    if (operand_format(p) == FloatFormat::fp32) continue;
    const ClassFormats f = class_formats(p);
    const std::pair<FloatFormat, const QuantOptions*> classes[] = {
        {f.weights, &dfp.weights}, {f.activations, &dfp.activations}, {f.gradients, &dfp.gradients}};
    for (const auto& [fmt, q] : classes)
      DFP_CHECK(!posit_es(fmt) || q->rounding == Rounding::nearest_even, Status::invalid_argument,
                origin + ": " + q->name + " rounding '" + rounding_name(q->rounding) + "': " + float_format_name(fmt) +
                    " rounds to nearest even only");
  }
  // Block DFP: nearest or biased rounding (the block kernels have no stochastic stream), and no
  // INT16-operator slices beside emulated blocks.
  const QuantOptions* const classes[] = {&dfp.weights, &dfp.activations, &dfp.gradients};
  const bool any_block = std::any_of(std::begin(classes), std::end(classes),
                                     [](const QuantOptions* q) { return granularity_block(q->granularity) > 0; });
  for (const QuantOptions* q : classes) {
    DFP_CHECK(!granularity_block(q->granularity) || q->rounding != Rounding::stochastic, Status::invalid_argument,
              origin + ": " + q->name + " granularity '" + granularity_name(q->granularity) +
                  "' rounds to nearest or biased; stochastic rounding has no block form");
    DFP_CHECK(!any_block || q->granularity != Granularity::slice, Status::invalid_argument,
              origin + ": " + q->name + " granularity 'slice' beside a block granularity: a layer with DFP16 blocks is "
                                        "emulated and takes tensor or block classes");
  }
  if (any_float)
    for (const QuantOptions* q : {&dfp.weights, &dfp.activations, &dfp.gradients})
      DFP_CHECK(q->rounding != Rounding::biased || (precision == Precision::int16 && !class_formats_set), Status::invalid_argument,
                origin + ": " + q->name + " rounding 'biased' is defined for DFP16 only; bf16/fp16 take nearest or stochastic");
}

std::string PrecisionPolicy::describe() const {
  std::ostringstream o;
  o << "precision=" << precision_name(precision);
  for (const auto& [pattern, p] : overrides) o << " override[" << pattern << "]=" << precision_name(p);
  auto q = [&](const char* what, const QuantOptions& x, const std::optional<FloatFormat>& f) {
    o << " " << what << "{";
    if (f) o << "format=" << float_format_name(*f) << ",";
    o << "headroom=" << x.headroom << ",rounding=" << rounding_name(x.rounding)
      << ",granularity=" << granularity_name(x.granularity) << "}";
  };
  q("weights", dfp.weights, weights_format);
  q("activations", dfp.activations, activations_format);
  q("gradients", dfp.gradients, gradients_format);
  if (uses_float8()) o << " fp8{" << fp8.text() << "}";
  if (dfp.chain_override > 0) o << " chain=" << dfp.chain_override;
  if (dfp.verify) o << " verify";
  return o.str();
}

std::vector<std::pair<std::string, Precision>> PrecisionPolicy::parse_overrides(const std::string& text,
                                                                               const std::string& origin) {
  std::vector<std::pair<std::string, Precision>> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    DFP_CHECK(eq != std::string::npos && eq > 0, Status::invalid_argument,
              origin + ": expected PATTERN=PRECISION items separated by commas, got '" + item + "'");
    out.emplace_back(item.substr(0, eq), parse_precision(item.substr(eq + 1), origin));
  }
  return out;
}

std::map<std::string, std::string> PrecisionPolicy::fields() const {
  std::map<std::string, std::string> f;
  f["precision"] = precision_name(precision);
  std::string ov;
  for (const auto& [pattern, prec] : overrides) ov += (ov.empty() ? "" : ",") + pattern + "=" + precision_name(prec);
  f["overrides"] = ov;
  auto fmt = [](const std::optional<FloatFormat>& x) { return x ? std::string(float_format_name(*x)) : std::string(); };
  f["formats"] = fmt(weights_format) + "," + fmt(activations_format) + "," + fmt(gradients_format);
  const QuantOptions* q[3] = {&dfp.weights, &dfp.activations, &dfp.gradients};
  f["headroom"] = std::to_string(q[0]->headroom) + "," + std::to_string(q[1]->headroom) + "," + std::to_string(q[2]->headroom);
  f["rounding"] = std::string(rounding_name(q[0]->rounding)) + "," + rounding_name(q[1]->rounding) + "," +
                  rounding_name(q[2]->rounding);
  f["granularity"] = std::string(granularity_name(q[0]->granularity)) + "," + granularity_name(q[1]->granularity) +
                     "," + granularity_name(q[2]->granularity);
  if (uses_float8()) f["fp8"] = fp8.text();  // absent otherwise: other policies' checkpoints keep their bytes
  return f;
}

PrecisionPolicy PrecisionPolicy::from_fields(const std::map<std::string, std::string>& fields, const std::string& origin) {
  PrecisionPolicy p;
  const std::string where = origin + " field ";
  const auto prec = fields.find("precision");
  DFP_CHECK(prec != fields.end(), Status::corrupt_data, origin + ": meta field 'precision' missing");
  p.precision = parse_precision(prec->second, where + "precision");
  if (fields.count("overrides")) p.overrides = parse_overrides(fields.at("overrides"), where + "overrides");
  auto split3 = [&](const std::string& key) {
    std::vector<std::string> v;
    if (!fields.count(key)) return v;
    std::stringstream ss(fields.at(key));
    std::string item;
    while (std::getline(ss, item, ',')) v.push_back(item);
    while (v.size() < 3) v.emplace_back();
    DFP_CHECK(v.size() == 3, Status::corrupt_data, where + key + ": expected 3 comma-separated values");
    return v;
  };
  const std::vector<std::string> f = split3("formats"), h = split3("headroom"), r = split3("rounding"),
                                 g = split3("granularity");
  std::optional<FloatFormat>* fs[3] = {&p.weights_format, &p.activations_format, &p.gradients_format};
  QuantOptions* q[3] = {&p.dfp.weights, &p.dfp.activations, &p.dfp.gradients};
  for (int i = 0; i < 3; ++i) {
    if (!f.empty() && !f[i].empty()) *fs[i] = parse_float_format(f[i], where + "formats");
    if (!h.empty()) {
      char* end = nullptr;
      const long v = std::strtol(h[i].c_str(), &end, 10);
      DFP_CHECK(end && *end == 0 && !h[i].empty() && v >= 0 && v <= kDfpMaxHeadroom, Status::corrupt_data,
                where + "headroom: expected integers 0.." + std::to_string(kDfpMaxHeadroom) + ", got '" + h[i] + "'");
      q[i]->headroom = int(v);
    }
    if (!r.empty()) q[i]->rounding = parse_rounding(r[i], where + "rounding");
    if (!g.empty()) q[i]->granularity = parse_granularity(g[i], where + "granularity");
  }
  if (fields.count("fp8")) {
    try {
      p.fp8 = Float8Options::parse(fields.at("fp8"), where + "fp8");
    } catch (const Error& e) {
      fail(Status::corrupt_data, e.what());
    }
  }
  return p;
}

}  // namespace dfp
