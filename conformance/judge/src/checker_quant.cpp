// The checker for quantized outputs (checker_quant.hpp). TOLERANCE.md, section 10, derives every
// rule used here; the notation follows it: p the value of dtype T handed to the scale, a its
// allowance (the tolerance model's allowance of y in T), u(p) the contract's float32 value,
// code(u) round-to-nearest-even with saturation.
//
// Everything a correct kernel may do differently lies in p (its sums, its rsqrt) and in what p
// implies (amax, hence a dynamic or block scale); the rest is the contract's exact arithmetic.
// So the codes it can give for an element are those of u(p) for the values p of T within a of
// the exact y; u and code are monotone in p, so those codes are the interval between the codes
// of the smallest and of the largest such p.
#include "normcheck/judge/checker_quant.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/quant.hpp"
#include "quant_values.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using ref::Elem;
using ref::QuantContract;
using ref::ScaleApply;
using ref::ScaleKind;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using quant_detail::ceil_to;
using quant_detail::floor_to;

// The values of T p may take for one element: [lo, hi] (values of T), or not constrained.
struct PRange {
  double lo = 0, hi = 0;
  bool trusted = false;  // false: the allowance is NaN (MISTRUSTED) or y is not finite
};

// How a scale turns p into u: the contract's float32 operation, exactly (quant.hpp apply_scale;
// p * m is exact in binary64 for a float32 or power-of-two m and p of at most 24 bits).
struct Scaler {
  ScaleApply apply = ScaleApply::multiply;
  double s = 1;  // the scale as the contract applies it (divide: the divisor)
  double m = 1;  // the multiplier: u = rn32(p * m) (reciprocal: rn32(1/s); multiply: s)
  bool valid = false;
  double u(double p) const {
    if (apply == ScaleApply::divide) return ref::apply_scale(p, s, apply);
    if (!std::isfinite(p)) return p * m;
    return ref::round_to(p * m, DType::float32);
  }
  // The exact value in code units of an exact y (binary64): y * m (divide: y / s).
  double exact(double y) const { return apply == ScaleApply::divide ? y / s : y * m; }
  double units() const { return apply == ScaleApply::divide ? 1 / s : m; }
};
Scaler scaler_of(double s, ScaleApply a) {
  Scaler sc;
  sc.apply = a;
  sc.s = s;
  // A candidate's scale may be anything (0, NaN, negative): only a finite positive one is used
  // (the exact reciprocal of 0 would divide by zero).
  if (!(std::isfinite(s) && s > 0) && !(a == ScaleApply::multiply && s == 0)) return sc;
  sc.m = a == ScaleApply::reciprocal ? ref::apply_scale(1.0, s, ScaleApply::reciprocal) : s;
  sc.valid = std::isfinite(s) && s > 0 && (a == ScaleApply::divide || (std::isfinite(sc.m) && sc.m > 0));
  if (a == ScaleApply::multiply) sc.valid = std::isfinite(s) && s >= 0;
  return sc;
}

std::string code_text(Elem e, double code) {
  if (e == Elem::int8) return fmt::format("{}", code);
  return fmt::format("0x{:02X}", static_cast<int>(code));
}

// One output of the case, being judged.
struct Out {
  OutputResult r;
  const ref::Output* exp = nullptr;
  const ref::Tensor* got = nullptr;
  double worst = -1;
  std::string first_failure;
  bool present() const { return got != nullptr; }
  void fail(std::int64_t i, double ratio, double g, double e, double exact, double allowance, std::string why) {
    ++r.failed;
    if (first_failure.empty()) first_failure = std::move(why);
    see(i, std::max(ratio, std::nextafter(1.0, 2.0)), g, e, exact, allowance);
  }
  void see(std::int64_t i, double ratio, double g, double e, double exact, double allowance) {
    r.hist_ratio.add(ratio);
    if (ratio > worst) {
      worst = ratio;
      r.max_ratio = ratio;
      r.worst_index = i;
      r.worst_got = g;
      r.worst_expected = e;
      r.worst_exact = exact;
      r.worst_allowance = allowance;
    }
  }
};

class QuantJudge {
 public:
  QuantJudge(const fix::FixtureCase& fc, const Outputs& got, const CheckOptions& opt)
      : fc_(fc), got_(got), opt_(opt), q_(*fc.c.quant), elem_(ref::element_of(q_.format)) {}

  CaseResult run() {
    CaseResult res;
    res.case_id = fc_.id;
    norm_ = ref::quant_norm_case(fc_.c);
    t_ = norm_.dtype_out;
    g_ = ref::geometry_of(fc_.c);
    allow_ = derive_allowances(norm_);
    yal_ = &allow_.at("y");
    for (const char* name : {"q", "scale", "global_scale", "amax"}) open(name);
    if (!outs_.at("q").r.malformed && outs_.at("q").present()) {
      recover_y();
      judge();
    }
    for (const char* name : {"q", "scale", "global_scale", "amax"}) {
      auto it = outs_.find(name);
      if (it == outs_.end()) continue;
      finish(it->second);
      res.outputs.push_back(std::move(it->second.r));
    }
    plain_outputs(res);
    for (const auto& o : res.outputs) res.verdict = std::max(res.verdict, o.verdict);
    return res;
  }

 private:
  // Registers output `name` if the case has it: MISSING, or FAILED for its shape or dtype.
  void open(const std::string& name) {
    const auto e = fc_.expected.find(name);
    if (e == fc_.expected.end()) return;
    Out& o = outs_[name];
    o.exp = &e->second;
    o.r.name = name;
    o.r.dtype = e->second.value.dtype;
    const auto it = got_.find(name);
    if (it == got_.end()) {
      o.r.verdict = Verdict::missing;
      o.r.reason = "the candidate did not produce it";
      return;
    }
    const ref::Tensor& t = it->second;
    if (t.shape != e->second.value.shape || t.dtype != e->second.value.dtype ||
        t.data.size() != e->second.value.data.size()) {
      o.r.verdict = Verdict::failed;
      o.r.malformed = true;
      o.r.reason = fmt::format("{} [{}] where {} [{}] is expected", ref::name_of(t.dtype), fmt::join(t.shape, ", "),
                               ref::name_of(e->second.value.dtype), fmt::join(e->second.value.shape, ", "));
      return;
    }
    o.got = &t;
  }

  bool judged(const char* name) {
    const auto it = outs_.find(name);
    return it != outs_.end() && it->second.present() && !it->second.r.malformed;
  }

  // The exact y of every element (binary64), from expected_f64/q and the certified scale: the
  // fixture stores y's binary64 value times the multiplier; dividing back costs at most two more
  // binary64 roundings, covered by the slop of p_range.
  void recover_y() {
    const ref::Output& q = *outs_.at("q").exp;
    q_exp_ = &q;
    y_.assign(q.f64.size(), kNaN);
    const std::int64_t gs = group_size();
    Scaler sc;
    for (std::size_t i = 0; i < y_.size(); ++i) {
      if (static_cast<std::int64_t>(i) % gs == 0) sc = certified_scaler(static_cast<std::int64_t>(i) / gs);
      const double f = q.f64[i];
      if (f == 0 && sc.m == 0) y_[i] = 0;  // an all-zero NVFP4 block: S_b = 0, every y of it 0
      if (!sc.valid || std::isnan(f)) continue;
      y_[i] = sc.apply == ScaleApply::divide ? f * sc.s : f / sc.m;
      if (std::isinf(f)) y_[i] = f;  // y itself infinite (f64 holds u there)
    }
  }

  std::int64_t group_size() const {
    const std::int64_t total = g_.rows * g_.cols;
    switch (q_.scale) {
      case ScaleKind::static_tensor: return std::max<std::int64_t>(total, 1);
      case ScaleKind::dynamic_token: return g_.cols;
      default: return ref::block_size(q_.format);
    }
  }

  std::vector<std::int64_t> coords(std::size_t i) const {
    const auto& shape = outs_.at("q").exp->value.shape;
    std::vector<std::int64_t> c(shape.size());
    auto f = static_cast<std::int64_t>(i);
    for (std::size_t d = c.size(); d-- > 0;) {
      c[d] = shape[d] > 0 ? f % shape[d] : 0;
      f = shape[d] > 0 ? f / shape[d] : 0;
    }
    return c;
  }

  // The scaler of group k under the certified scale (or, for NVFP4, the given global scale and
  // block scale code).
  Scaler certified_scaler(std::int64_t k) const {
    switch (q_.scale) {
      case ScaleKind::static_tensor: return scaler_of(fc_.c.inputs.at("scale").data[0], q_.apply);
      case ScaleKind::dynamic_token: return scaler_of(outs_.at("scale").exp->value.data[k], q_.apply);
      case ScaleKind::mx_block: return mx_scaler(outs_.at("scale").exp->value.data[k]);
      case ScaleKind::nvfp4_block:
        return nvfp4_scaler(outs_.at("scale").exp->value.data[k], outs_.at("global_scale").exp->value.data[0]);
    }
    return {};
  }
  static Scaler mx_scaler(double e8) {
    if (!(e8 >= 0 && e8 < 255) || e8 != std::floor(e8)) return {};
    return scaler_of(std::ldexp(1.0, 127 - static_cast<int>(e8)), ScaleApply::multiply);
  }
  static Scaler nvfp4_scaler(double code, double s_enc) {
    if (!(code >= 0 && code < 256) || code != std::floor(code) || !(s_enc > 0) || !std::isfinite(s_enc)) return {};
    Scaler sc = scaler_of(ref::nvfp4_element_multiplier(static_cast<int>(code), s_enc), ScaleApply::multiply);
    if (sc.m == 0) sc.valid = false;  // an underflowed block scale: the codes are the kernel's
    return sc;
  }

  // The values of T that p may take at element i (TOLERANCE.md 10.1).
  PRange p_range(std::size_t i) const {
    PRange r;
    const double y = y_[i], a = yal_->abs[i];
    if (!std::isfinite(y) || std::isnan(a)) return r;
    // y is known to 3 * 2^-53 relative (recover_y): widen by kBounds.quant_slop |y| (and the
    // smallest binary64 subnormal), far below any spacing of T (TOLERANCE.md 10.1).
    const double slop = kBounds.quant_slop * std::fabs(y) + 4.9e-324;
    r.lo = ceil_to(y - a - slop, t_);
    r.hi = floor_to(y + a + slop, t_);
    if (r.lo > r.hi) r.lo = r.hi = ref::round_to(y, t_);  // a is at least y's own rounding
    r.trusted = true;
    return r;
  }

  // amax of a group as a correct kernel may compute it: max |p| over the group's p ranges.
  struct AmaxRange {
    double lo = 0, hi = 0;
    bool trusted = true;        // every element has an allowance (none MISTRUSTED)
    bool finite = true;         // every y of the group is finite
    bool nan_possible = false;  // the norm may give NaN in the group (a row holding a NaN or an Inf)
    bool unknown = false;       // some y is not recoverable (an underflowed NVFP4 block: small values)
  };
  AmaxRange amax_range(std::int64_t first, std::int64_t n) const {
    AmaxRange a;
    for (std::int64_t i = first; i < first + n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (yal_->nan_ok[k]) a.nan_possible = true;
      if (std::isnan(y_[k]) && !ref::is_nan_code(elem_, static_cast<int>(q_exp_->value.data[k]))) {
        a.unknown = true;  // not a NaN y: a value the fixture leaves unspecified (f64 NaN)
        continue;
      }
      if (!std::isfinite(y_[k])) {
        a.finite = false;
        continue;
      }
      const PRange p = p_range(k);
      if (!p.trusted) {
        a.trusted = false;
        continue;
      }
      const double mn = p.lo <= 0 && p.hi >= 0 ? 0.0 : std::min(std::fabs(p.lo), std::fabs(p.hi));
      a.lo = std::max(a.lo, mn);
      a.hi = std::max(a.hi, std::max(std::fabs(p.lo), std::fabs(p.hi)));
    }
    return a;
  }

  // Whether row r's input (x, and the residual where the case adds one) holds a NaN: scanned once
  // per row on first use (it is asked per element, only where y's allowance is MISTRUSTED).
  bool nan_input_row(std::int64_t r) {
    const auto k = static_cast<std::size_t>(r);
    if (k >= g_.row_base.size()) return false;
    if (nan_rows_.empty()) nan_rows_.assign(g_.row_base.size(), -1);
    if (nan_rows_[k] < 0) {
      nan_rows_[k] = 0;
      for (const char* name : {"x", "residual"}) {
        const auto it = fc_.c.inputs.find(name);
        if (it == fc_.c.inputs.end()) continue;
        for (const std::int64_t d : g_.col_delta) {
          const auto off = static_cast<std::size_t>(g_.row_base[k] + d);
          if (off < it->second.data.size() && std::isnan(it->second.data[off])) nan_rows_[k] = 1;
        }
      }
    }
    return nan_rows_[k] == 1;
  }

  void judge();
  Scaler judge_scale(std::int64_t k, const AmaxRange& am, const Scaler& cert, double s_enc_got, bool s_enc_own);
  void judge_codes(std::int64_t first, std::int64_t n, const Scaler& sc, bool own);
  void judge_code(Out& o, std::size_t i, const Scaler& sc, bool own);
  void judge_value(Out& o, std::int64_t k, double lo, double hi, const std::string& what);
  void finish(Out& o);
  void plain_outputs(CaseResult& res);

  const fix::FixtureCase& fc_;
  const Outputs& got_;
  const CheckOptions& opt_;
  const QuantContract& q_;
  Elem elem_;
  ref::Case norm_;
  DType t_ = DType::float32;
  ref::Geometry g_;
  std::map<std::string, OutputAllowance> allow_;
  const OutputAllowance* yal_ = nullptr;  // allow_.at("y"), looked up once (read per element)
  const ref::Output* q_exp_ = nullptr;    // the expected q (set by recover_y)
  std::vector<std::int8_t> nan_rows_;     // nan_input_row's answers: -1 not yet asked
  std::map<std::string, Out> outs_;
  std::vector<double> y_;
};

// A float32 output element (a dynamic scale, the NVFP4 global scale, amax) against the range
// [lo, hi] a correct kernel can give (TOLERANCE.md 10.2).
void QuantJudge::judge_value(Out& o, std::int64_t k, double lo, double hi, const std::string& what) {
  const auto i = static_cast<std::size_t>(k);
  const double g = o.got->data[i], e = o.exp->value.data[i];
  ++o.r.elements;
  if (!o.exp->certified[i]) {
    ++o.r.uncertified;
    return;
  }
  if (g == e || (g >= lo && g <= hi)) {
    const double width = std::max(e - lo, hi - e);
    o.see(k, g == e ? 0.0 : (width > 0 ? std::fabs(g - e) / width : INFINITY), g, e, e, width);
    return;
  }
  o.fail(k, INFINITY, g, e, e, std::max(e - lo, hi - e),
         fmt::format("[{}]: got {} ({}), expected {} ({}); a correct kernel gives [{}, {}] ({})", k,
                     ref::decimal_text(g, DType::float32), ref::hex_text(g), ref::decimal_text(e, DType::float32),
                     ref::hex_text(e), ref::hex_text(lo), ref::hex_text(hi), what));
}

// The scale of group k: judged (if an output) and the scaler its codes are judged under.
Scaler QuantJudge::judge_scale(std::int64_t k, const AmaxRange& am, const Scaler& cert, double s_enc, bool s_enc_own) {
  const bool has = judged("scale");
  if (!has) return cert;
  Out& o = outs_.at("scale");
  const auto i = static_cast<std::size_t>(k);
  const double e = o.exp->value.data[i], g = o.got->data[i];
  const auto amax_text = [&] { return fmt::format("amax in [{}, {}]", ref::hex_text(am.lo), ref::hex_text(am.hi)); };
  if (!o.exp->certified[i] || am.nan_possible) {
    // Uncertified, or a group where the norm itself may give NaN (nan_ok): fmaxf drops a NaN,
    // a NaN-propagating max keeps it, so the scale is the kernel's.
    ++o.r.elements;
    ++o.r.uncertified;
    // The contract leaves this scale to the kernel: its codes are judged (where certified)
    // against the kernel's own scale when it is usable, else not at all.
    if (q_.scale == ScaleKind::dynamic_token) return scaler_of(g, q_.apply);
    if (q_.scale == ScaleKind::mx_block) return mx_scaler(g);
    return nvfp4_scaler(g, s_enc);
  }
  if (!am.finite || am.unknown) {  // a NaN or Inf in the group (OCP: 0xFF), or unknown values: exact
    ++o.r.elements;
    if (g == e) return cert;
    o.fail(k, INFINITY, g, e, e, 0, fmt::format("[{}]: got {}, expected {} (a non-finite value in the group)", k,
                                                ref::hex_text(g), ref::hex_text(e)));
    return cert;
  }
  if (!am.trusted) {
    ++o.r.mistrusted;
    return g == e ? cert : Scaler{};
  }
  if (q_.scale == ScaleKind::dynamic_token) {
    const double lo = ref::dynamic_scale(am.lo, q_), hi = ref::dynamic_scale(am.hi, q_);
    judge_value(o, k, lo, hi, amax_text());
    if (g == e) return cert;
    return g >= lo && g <= hi ? scaler_of(g, q_.apply) : cert;
  }
  // Block scales are codes: the codes of the amax range's ends (the scale rules are monotone).
  int lo = 0, hi = 0;
  if (q_.scale == ScaleKind::mx_block) {
    lo = ref::mx_scale_code(am.lo, elem_, q_.mx_rule);
    hi = ref::mx_scale_code(am.hi, elem_, q_.mx_rule);
  } else {
    lo = ref::nvfp4_block_scale_code(am.lo, s_enc);
    hi = ref::nvfp4_block_scale_code(am.hi, s_enc);
  }
  ++o.r.elements;
  const bool ok = g == e || (g == std::floor(g) && g >= lo && g <= hi);
  if (!ok) {
    o.fail(k, INFINITY, g, e, e, 0,
           fmt::format("block {}: got {}, expected {}; a correct kernel gives {} to {} ({}{})", k, code_text(Elem::e8m0, g),
                       code_text(Elem::e8m0, e), code_text(Elem::e8m0, lo), code_text(Elem::e8m0, hi), amax_text(),
                       s_enc_own ? ", under the candidate's global scale" : ""));
    return cert;
  }
  o.see(k, g == e ? 0.0 : 1.0, g, e, e, 0);
  if (g == e && !s_enc_own) return cert;
  if (g != e) {
    ++o.r.flips_accepted;
    if (o.r.flips.size() < kMaxFlipsExplained)
      o.r.flips.push_back(fmt::format("block {}: {} for {}, {} reaches the step between them", k,
                                      code_text(Elem::e8m0, g), code_text(Elem::e8m0, e), amax_text()));
  }
  return q_.scale == ScaleKind::mx_block ? mx_scaler(g) : nvfp4_scaler(g, s_enc);
}

void QuantJudge::judge() {
  const std::int64_t total = g_.rows * g_.cols, gs = group_size(), groups = total / gs;
  // The NVFP4 global scale S_enc = rn32(2688 / amax_g): decreasing in amax_g, 1 at amax_g = 0.
  double s_enc = 1;
  bool s_enc_own = false;
  if (q_.scale == ScaleKind::nvfp4_block) {
    s_enc = outs_.at("global_scale").exp->value.data[0];
    if (judged("global_scale")) {
      Out& o = outs_.at("global_scale");
      const AmaxRange am = amax_range(0, total);
      // Unknown values (underflowed blocks) are below every block scale's threshold, never the
      // tensor's amax; a tensor where the norm may give NaN has the kernel's global scale.
      if (!o.exp->certified[0] || am.nan_possible) {
        ++o.r.elements;
        ++o.r.uncertified;
        const double g = o.got->data[0];
        if (g != s_enc && std::isfinite(g) && g > 0) s_enc = g, s_enc_own = true;
      } else if (!am.trusted || !am.finite) {
        ++o.r.mistrusted;
      } else {
        const double lo = ref::nvfp4_global_scale(am.hi);
        const double hi = am.lo > 0 ? ref::nvfp4_global_scale(am.lo) : FLT_MAX;
        const double g = o.got->data[0];
        if (am.lo == 0 && g == 1 && o.exp->certified[0]) {  // a tensor whose amax may be 0: S_enc = 1
          ++o.r.elements;
          o.see(0, 0, g, s_enc, s_enc, 0);
        } else {
          judge_value(o, 0, lo, hi, fmt::format("global amax in [{}, {}]", ref::hex_text(am.lo), ref::hex_text(am.hi)));
        }
        if (g != s_enc && std::isfinite(g) && g > 0 && o.r.failed == 0 && o.exp->certified[0]) {
          s_enc = g;
          s_enc_own = true;
          ++o.r.own_scale;
        }
      }
    }
  }
  Out* amax = judged("amax") ? &outs_.at("amax") : nullptr;
  const std::int64_t amax_group =
      amax && !amax->exp->value.data.empty() ? total / static_cast<std::int64_t>(amax->exp->value.data.size()) : 0;
  for (std::int64_t k = 0; k < groups; ++k) {
    const AmaxRange am = amax_range(k * gs, gs);
    const Scaler cert = certified_scaler(k);
    Scaler sc = cert;
    if (q_.scale != ScaleKind::static_tensor) sc = judge_scale(k, am, cert, s_enc, s_enc_own);
    const bool own = sc.valid && (s_enc_own || !cert.valid || sc.m != cert.m || sc.s != cert.s);
    if (own && judged("scale")) ++outs_.at("scale").r.own_scale;
    // An NVFP4 block scale of 0 that passed (the block's amax may be 0 within the allowance) has
    // no multiplier: its codes are the kernel's, as under a certified underflowed scale
    // (TOLERANCE.md 10.3).
    if (q_.scale == ScaleKind::nvfp4_block && !sc.valid && cert.valid && judged("scale") &&
        outs_.at("scale").got->data[static_cast<std::size_t>(k)] == 0) {
      Out& o = outs_.at("q");
      for (std::int64_t i = k * gs; i < (k + 1) * gs; ++i) {
        ++o.r.elements;
        ++o.r.uncertified;
      }
      continue;
    }
    judge_codes(k * gs, gs, sc, own);
  }
  if (amax) {
    for (std::size_t k = 0; k < amax->exp->value.data.size(); ++k) {
      const AmaxRange am = amax_range(static_cast<std::int64_t>(k) * amax_group, amax_group);
      if (!amax->exp->certified[k] || am.nan_possible) {
        ++amax->r.elements;
        ++amax->r.uncertified;
        continue;
      }
      if (!am.trusted || !am.finite) {
        ++amax->r.mistrusted;
        continue;
      }
      judge_value(*amax, static_cast<std::int64_t>(k), am.lo, am.hi, "max |p| over the p a correct kernel can give");
    }
  }
}

void QuantJudge::judge_codes(std::int64_t first, std::int64_t n, const Scaler& sc, bool own) {
  Out& o = outs_.at("q");
  if (own) ++o.r.own_scale;
  for (std::int64_t i = first; i < first + n; ++i) judge_code(o, static_cast<std::size_t>(i), sc, own);
}

// One code (TOLERANCE.md 10.1): the certified code, or any code between those of u(p) at the
// ends of p's range; NaN codes only where the value is NaN.
void QuantJudge::judge_code(Out& o, std::size_t i, const Scaler& sc, bool own) {
  const auto k = static_cast<std::int64_t>(i);
  const double g = o.got->data[i], e = o.exp->value.data[i];
  const auto& yal = *yal_;
  if (!o.exp->certified[i]) {  // the contract leaves this code to the kernel (SCHEMA.md)
    ++o.r.elements;
    ++o.r.uncertified;
    return;
  }
  const bool g_int = g == std::floor(g) && std::fabs(g) < 256;
  const double gv = g_int ? ref::decode(elem_, static_cast<int>(g)) : kNaN;
  const bool g_nan = g_int && ref::is_nan_code(elem_, static_cast<int>(g));
  const bool e_nan = ref::is_nan_code(elem_, static_cast<int>(e));
  // The norm's allowance is MISTRUSTED here (a correct kernel's y is not bounded: a float16
  // accumulator that may overflow, TOLERANCE.md): its code is not judged, NaN codes included, as
  // check_case leaves such an element of y uncompared whatever the candidate gives.
  // Only a NaN the input makes certain (a NaN in the row's x or residual: every kernel's y is NaN
  // there) is still required where the allowance is MISTRUSTED; a NaN of the exact arithmetic (0/0
  // of a constant row with eps 0) is not, since a kernel's rounding errors may give a number there.
  if (std::isnan(yal.abs[i]) && !(e_nan && nan_input_row(static_cast<std::int64_t>(i) / g_.cols))) {
    ++o.r.mistrusted;
    return;
  }
  if (e_nan || g_nan) {  // NaN: any NaN code of the format, where y is NaN or may be (nan_ok)
    ++o.r.elements;
    if (g_nan && (e_nan || yal.nan_ok[i])) return o.see(k, 0, g, e, kNaN, 0);
    return o.fail(k, INFINITY, g, e, kNaN, 0,
                  fmt::format("[{}]: got {}, expected {} ({})", fmt::join(coords(i), ", "), code_text(elem_, g),
                              code_text(elem_, e), e_nan ? "y is NaN" : "y is not NaN"));
  }
  if (std::isnan(yal.abs[i])) {  // the norm's allowance is MISTRUSTED here
    ++o.r.mistrusted;
    return;
  }
  ++o.r.elements;
  if (!own && g == e) return o.see(k, 0, g, e, o.exp->f64[i], 0);
  if (!sc.valid || std::isnan(y_[i])) {  // no usable scale, or no exact value: the certified code only
    // (+0 and -0 both: an all-zero NVFP4 block multiplies by 0, and the sign of y = 0 is free)
    if (g == e || (gv == 0 && ref::decode(elem_, static_cast<int>(e)) == 0)) return o.see(k, 0, g, e, o.exp->f64[i], 0);
    return o.fail(k, INFINITY, g, e, o.exp->f64[i], 0,
                  fmt::format("[{}]: got {}, expected {}", fmt::join(coords(i), ", "), code_text(elem_, g),
                              code_text(elem_, e)));
  }
  const PRange p = p_range(i);
  const double exact = sc.exact(y_[i]);
  const double allowance = p.trusted ? yal.abs[i] * std::fabs(sc.units()) : 0.0;
  // y infinite: u(y) saturates (or is NaN under a zero multiplier): that code only.
  const int clo = ref::encode(elem_, sc.u(p.trusted ? p.lo : y_[i]));
  const int chi = ref::encode(elem_, sc.u(p.trusted ? p.hi : y_[i]));
  double vlo = ref::decode(elem_, clo);
  const double vhi = ref::decode(elem_, chi);
  // int8: the reference saturates at -127 (the symmetric range of the contract), a kernel that
  // converts with cvt.rni.sat.s8 at -128; where a value p within the allowance gives u <= -127.5,
  // -128 is a correct kernel's code too (for y itself there the fixture leaves the code
  // uncertified: SCHEMA.md).
  if (elem_ == Elem::int8 && sc.u(p.trusted ? p.lo : y_[i]) <= -127.5) vlo = -128;
  const double ref_code = own ? ref::encode(elem_, sc.u(ref::round_to(y_[i], t_))) : e;
  // The boundary between the candidate's value and the reference's that lies nearest the exact value.
  const double rv = ref::decode(elem_, static_cast<int>(ref_code));
  double boundary = kNaN;
  if (!std::isnan(gv)) {
    const auto& bs = ref::boundaries(elem_);
    const double a = std::min(gv, rv), b = std::max(gv, rv);
    for (auto it = std::upper_bound(bs.begin(), bs.end(), a); it != bs.end() && *it < b; ++it)
      if (std::isnan(boundary) || std::fabs(*it - exact) < std::fabs(boundary - exact)) boundary = *it;
    if (std::isnan(boundary) && a == 0 && b == 0) boundary = 0;  // +0 against -0
  }
  const double dist = std::isnan(boundary) ? 0.0 : std::fabs(boundary - exact);
  const double ratio = dist == 0 ? 0.0 : (allowance > 0 ? dist / allowance : INFINITY);
  const auto where = [&] {
    return fmt::format("[{}]: got {}, expected {}; exact {} ({:.9g}), allowance {}, boundary {}",
                       fmt::join(coords(i), ", "), code_text(elem_, g), code_text(elem_, ref_code), ref::hex_text(exact),
                       exact, ref::hex_text(allowance), ref::hex_text(boundary));
  };
  if (!std::isnan(gv) && gv >= vlo && gv <= vhi) {
    o.see(k, g == ref_code ? 0.0 : std::min(ratio, 1.0), g, ref_code, exact, allowance);
    if (g != ref_code) {
      ++o.r.flips_accepted;
      if (o.r.flips.size() < kMaxFlipsExplained)
        o.r.flips.push_back(where() + ": a value of " + std::string(ref::name_of(t_)) +
                            " within the allowance crosses it");
    }
    return;
  }
  o.fail(k, ratio, g, ref_code, exact, allowance, where() + (own ? " (under the candidate's own scale)" : ""));
}

void QuantJudge::finish(Out& o) {
  if (o.r.verdict != Verdict::passed) return;
  if (o.r.worst_index >= 0) {
    std::vector<std::int64_t> c(o.exp->value.shape.size());
    std::int64_t f = o.r.worst_index;
    for (std::size_t d = c.size(); d-- > 0;) {
      const auto n = o.exp->value.shape[d];
      c[d] = n > 0 ? f % n : 0;
      f = n > 0 ? f / n : 0;
    }
    o.r.worst_coords = std::move(c);
  }
  std::string flips = fmt::format("flips accepted: {}, each explained", o.r.flips_accepted);
  if (o.r.own_scale > 0) flips += fmt::format("; {} judged under the candidate's own scale", o.r.own_scale);
  if (o.r.failed > 0) {
    o.r.verdict = Verdict::failed;
    o.r.reason = fmt::format("{} of {} beyond their allowance; first {}; {}", o.r.failed, o.r.elements,
                             o.first_failure, flips);
  } else if (o.r.mistrusted > 0) {
    o.r.verdict = Verdict::mistrusted;
    o.r.reason = fmt::format("{} elements whose value before quantization has no trusted allowance ({})",
                             o.r.mistrusted, allow_.at("y").reason);
  } else if (o.r.flips_accepted > 0 || o.r.own_scale > 0) {
    o.r.reason = flips;
  }
}

// y and residual_out: the plain checker under the norm part's allowances (y in dtype_out).
void QuantJudge::plain_outputs(CaseResult& res) {
  fix::FixtureCase sub;
  sub.id = fc_.id;
  sub.c = norm_;
  std::map<std::string, OutputAllowance> allow;
  for (const char* name : {"y", "residual_out"}) {
    const auto it = fc_.expected.find(name);
    if (it == fc_.expected.end()) continue;
    sub.expected.emplace(name, it->second);
    if (std::string_view(name) == "y" && norm_.dtype_out != fc_.c.dtype_out) {
      ref::Case ny = norm_;
      ny.dtype_out = fc_.c.dtype_out;
      allow.emplace(name, derive_allowances(ny).at(name));
    } else {
      allow.emplace(name, allow_.at(name));
    }
  }
  if (sub.expected.empty()) return;
  CaseResult r = check_case(sub, got_, allow, opt_);
  for (auto& o : r.outputs) res.outputs.push_back(std::move(o));
}

}  // namespace

CaseResult check_quant_case(const fix::FixtureCase& fc, const Outputs& got, const CheckOptions& opt) {
  if (!fc.c.quant) return check_case(fc, got, derive_allowances(fc.c), opt);
  return QuantJudge(fc, got, opt).run();
}

}  // namespace normcheck::conf
