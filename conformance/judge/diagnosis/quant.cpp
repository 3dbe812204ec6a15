// The diagnosis of a FAILED quantized case (../DIAGNOSIS.md, "Quantized outputs"): the dialects
// of class H, each the contract's quantization step with one catalogue fault applied, run on the
// certified norm output. Everything before the quantization is the spec's (the value p is y
// rounded to the contract's dtype T, as a correct norm gives it), so these dialects name faults
// of the quantization step; a fault in the norm shows in y and is named by the norm's panel.
//
// A dialect predicts every code and scale exactly (one value each; stochastic rounding predicts
// the pair of codes around the value). It is scored by the elements it gets wrong per output,
// against what a correct kernel may legitimately change there: for an output the judge PASSED,
// every element where the candidate differs from the correct quantization of rn_T(y); for a
// FAILED output, its accepted flips and the codes judged under the candidate's own scale. A
// dialect explains the case when it stays within that on every output and gets fewer elements
// wrong than the correct quantization does.
#include <fmt/core.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/faults.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/quant.hpp"
#include "../src/quant_values.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using ref::Elem;
using ref::QuantContract;
using ref::ScaleApply;
using ref::ScaleKind;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The faults of class H, as knobs of the emulated quantization.
enum class QFault {
  none,
  activation_rounding_elided,
  e5m2_clamped_448,
  nan_encoded_as_max,
  mx_rule_swapped,
  min_scale_missing,
  e4m3fnuz_max,
  bf16_round_trip_before_fp8,
  amax_unrounded,
  reciprocal_for_divide,
  mx_block_wrong_dim,
  stochastic_rounding_forward,
};

struct QDialect {
  const char* id;  // the dialect's name and its catalogue fault
  QFault f;
  bool interval = false;  // predicts a pair of codes (stochastic rounding), ranked after exact ones
};

// In panel order (the catalogue's order of class H).
constexpr QDialect kQuantDialects[] = {
    {"activation_rounding_elided", QFault::activation_rounding_elided},
    {"e5m2_clamped_448", QFault::e5m2_clamped_448},
    {"nan_encoded_as_max", QFault::nan_encoded_as_max},
    {"mx_rule_swapped", QFault::mx_rule_swapped},
    {"min_scale_missing", QFault::min_scale_missing},
    {"e4m3fnuz_max", QFault::e4m3fnuz_max},
    {"bf16_round_trip_before_fp8", QFault::bf16_round_trip_before_fp8},
    {"amax_unrounded", QFault::amax_unrounded},
    {"reciprocal_for_divide", QFault::reciprocal_for_divide},
    {"mx_block_wrong_dim", QFault::mx_block_wrong_dim},
    {"stochastic_rounding_forward", QFault::stochastic_rounding_forward, true},
};

DialectInfo info_of(const QDialect& d) {
  const FaultEntry* f = find_fault(d.id);
  return DialectInfo{d.id, f ? std::string(1, f->cls) : "H", f ? std::string(f->what) : d.id, d.id};
}

// Whether a dialect can change anything under this contract (otherwise it is not evaluated).
bool applies(QFault f, const QuantContract& q, DType t, std::int64_t rows) {
  const Elem e = ref::element_of(q.format);
  switch (f) {
    case QFault::none: return true;
    case QFault::activation_rounding_elided: return q.value == ref::QuantValue::activation && t != DType::float32;
    case QFault::e5m2_clamped_448: return e == Elem::e5m2;
    case QFault::nan_encoded_as_max: return ref::nan_code(e) >= 0;
    case QFault::mx_rule_swapped: return q.scale == ScaleKind::mx_block;
    case QFault::min_scale_missing: return q.scale == ScaleKind::dynamic_token && q.min_scale > 0;
    case QFault::e4m3fnuz_max: return e == Elem::e4m3fn;  // E4M3 elements (not NVFP4's E4M3 block scales)
    case QFault::bf16_round_trip_before_fp8: return e == Elem::e4m3fn;
    case QFault::amax_unrounded: return t != DType::float32 && (q.scale != ScaleKind::static_tensor || q.amax);
    case QFault::reciprocal_for_divide: return q.apply == ScaleApply::divide;
    case QFault::mx_block_wrong_dim: return q.scale == ScaleKind::mx_block && rows > 1;
    case QFault::stochastic_rounding_forward: return true;
  }
  return false;
}

// What a dialect predicts: every output it models, in the fixture's element order (codes as
// their integer values); `q_other` the second code stochastic rounding may give (NaN: none).
struct QPred {
  std::map<std::string, std::vector<double>> v;
  // The float32 value each code is made from, and how the code is made: `v["q"]` holds the codes
  // only for a run with all codes (the others make one when it is asked for: code()).
  std::vector<double> u;
  QFault f = QFault::none;
  Elem elem = Elem::e4m3fn;
  double mx = 0;  // the largest element value the conversion saturates at
  double code(std::size_t i) const;
  std::vector<double> q_other;
  std::vector<std::uint8_t> q_far;  // stochastic: picking q_other is a sign of it (other_code)
};

// The code on the other side of u from code c (the neighbour stochastic rounding may pick), and
// whether u lies at least 1/8 of the step from the midpoint between them (t < 3/8, t the distance
// from u to c in steps). An error of p smaller than that never picks the neighbour there;
// stochastic rounding picks it with probability t, so 56 % of its neighbour picks are there.
std::pair<double, bool> other_code(Elem e, int c, double u) {
  const double v = ref::decode(e, c);
  if (!std::isfinite(u) || !std::isfinite(v) || u == v) return {kNaN, false};
  const auto& bs = ref::boundaries(e);
  double b = kNaN;
  if (u > v) {
    const auto it = std::upper_bound(bs.begin(), bs.end(), v);
    if (it == bs.end()) return {kNaN, false};
    b = *it;
    const int o = ref::encode(e, std::nextafter(b, INFINITY));
    const double w = ref::decode(e, o);
    if (o == c || !(w > v)) return {kNaN, false};
    return {o, (u - v) < 0.375 * (w - v)};
  }
  auto it = std::lower_bound(bs.begin(), bs.end(), v);
  if (it == bs.begin()) return {kNaN, false};
  b = *--it;
  const int o = ref::encode(e, std::nextafter(b, -INFINITY));
  const double w = ref::decode(e, o);
  if (o == c || !(w < v)) return {kNaN, false};
  return {o, (v - u) < 0.375 * (v - w)};
}

double rn32(double v) { return ref::round_to(v, DType::float32); }

// max |v| over a group as fmaxf computes it (a NaN is dropped), and whether every v is finite.
struct Amax {
  double a = 0;
  bool finite = true;
  void see(double v) {
    if (!std::isfinite(v)) finite = false;
    if (!std::isnan(v)) a = std::max(a, std::fabs(v));
  }
};

// Which p the emulation takes for every element: the correctly rounded y, or the value of the
// dtype within y's allowance nearest to zero or farthest from it (a correct kernel's p lies
// between; the scales are monotone in amax and the codes in p, so a run at each end bounds what a
// correct kernel's quantization gives under the dialect).
enum class PChoice { nearest, small, big };

// The code of u under a dialect: its clamp, its NaN handling, its bfloat16 round trip.
int code_of(QFault f, Elem e, double mx, double u) {
  if (std::isnan(u)) return f == QFault::nan_encoded_as_max && ref::nan_code(e) >= 0 ? ref::encode(e, mx) : ref::encode(e, u);
  if (f == QFault::bf16_round_trip_before_fp8 && e == Elem::e4m3fn) u = ref::round_to(u, DType::bfloat16);
  if (std::fabs(u) > mx) u = std::copysign(mx, u);
  return ref::encode(e, u);
}

double QPred::code(std::size_t i) const { return code_of(f, elem, mx, u[i]); }

class Emulator {
 public:
  // `a`, `a32`: the allowance of y in T and in float32 per element (NaN where MISTRUSTED: y's
  // rounding only).
  Emulator(const ref::Case& c, const std::vector<double>& y, const std::vector<double>& a,
           const std::vector<double>& a32, DType t)
      : c_(c), q_(*c.quant), y_(y), a_(a), a32_(a32), t_(t), e_(ref::element_of(q_.format)), g_(ref::geometry_of(c)) {}

  // `codes`: make every code (otherwise QPred::code makes one on demand).
  QPred run(QFault f, PChoice pc = PChoice::nearest, bool codes = true) const {
    QPred out;
    const std::size_t n = y_.size();
    std::vector<double> p(n), pa(n);
    const DType tp = f == QFault::activation_rounding_elided ? DType::float32 : t_;
    const std::vector<double>& ap = tp == t_ ? a_ : a32_;
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = pick(y_[i], ap[i], tp, pc);
      pa[i] = f == QFault::amax_unrounded ? pick(y_[i], a32_[i], DType::float32, pc) : p[i];
    }
    double mx = ref::elem_max(e_);
    if (f == QFault::e5m2_clamped_448 && e_ == Elem::e5m2) mx = 448;
    if (f == QFault::e4m3fnuz_max && e_ == Elem::e4m3fn) mx = 240;
    out.f = f;
    out.elem = e_;
    out.mx = mx;
    out.u.assign(n, kNaN);
    const auto put = [&](std::size_t i, double u) { out.u[i] = u; };
    const ScaleApply apply =
        f == QFault::reciprocal_for_divide && q_.apply == ScaleApply::divide ? ScaleApply::reciprocal : q_.apply;
    // A zero scale (min_scale_missing on an all-zero row) divides as float32 does: 0/0 is NaN.
    const auto scaled = [&](double v, double s) {
      if (s == 0 && apply != ScaleApply::multiply) return v == 0 || std::isnan(v) ? kNaN : std::copysign(INFINITY, v);
      return ref::apply_scale(v, s, apply);
    };
    const std::int64_t total = g_.rows * g_.cols;
    switch (q_.scale) {
      case ScaleKind::static_tensor: {
        const double s = c_.inputs.at("scale").data[0];
        Amax am;
        for (std::int64_t i = 0; i < total; ++i) {
          put(static_cast<std::size_t>(i), scaled(p[i], s));
          am.see(pa[i]);
        }
        if (q_.amax) out.v["amax"] = {am.a};
        break;
      }
      case ScaleKind::dynamic_token: {
        auto& scale = out.v["scale"];
        auto& amax = out.v["amax"];
        const double qmax = e_ == Elem::int8 ? 127 : mx;
        const double min_scale = f == QFault::min_scale_missing ? 0 : q_.min_scale;
        for (std::int64_t r = 0; r < g_.rows; ++r) {
          Amax am;
          for (std::int64_t j = 0; j < g_.cols; ++j) am.see(pa[r * g_.cols + j]);
          double s = 0;
          if (qmax == ref::dynamic_qmax(q_.format) && min_scale == q_.min_scale) {
            s = ref::dynamic_scale(am.a, q_);
          } else {
            s = std::max(rn32(std::min(am.a, q_.scale_ub) / qmax), min_scale);
          }
          scale.push_back(s);
          amax.push_back(am.a);
          for (std::int64_t j = 0; j < g_.cols; ++j) {
            const std::int64_t i = r * g_.cols + j;
            put(static_cast<std::size_t>(i), scaled(p[i], s));
          }
        }
        if (!q_.amax) out.v.erase("amax");
        break;
      }
      case ScaleKind::mx_block: {
        const std::int64_t bs = ref::block_size(q_.format);
        const ref::MxRule rule = f == QFault::mx_rule_swapped
                                     ? (q_.mx_rule == ref::MxRule::floor ? ref::MxRule::round_up : ref::MxRule::floor)
                                     : q_.mx_rule;
        const bool wrong = f == QFault::mx_block_wrong_dim;
        const auto at = [&](std::int64_t b, std::int64_t k) {
          const std::int64_t x = b * bs + k;
          return wrong ? (x % g_.rows) * g_.cols + x / g_.rows : x;
        };
        auto& scale = out.v["scale"];
        auto& amax = out.v["amax"];
        for (std::int64_t b = 0; b < total / bs; ++b) {
          Amax am;
          for (std::int64_t k = 0; k < bs; ++k) am.see(pa[static_cast<std::size_t>(at(b, k))]);
          const int e8 = am.finite ? mx_code(am.a, rule, mx) : 0xFF;
          scale.push_back(e8);
          amax.push_back(am.a);
          for (std::int64_t k = 0; k < bs; ++k) {
            const auto i = static_cast<std::size_t>(at(b, k));
            put(i, e8 == 0xFF ? kNaN : rn32(std::ldexp(p[i], 127 - e8)));
          }
        }
        if (!q_.amax) out.v.erase("amax");
        break;
      }
      case ScaleKind::nvfp4_block: {
        const std::int64_t bs = ref::block_size(q_.format);
        Amax ag;
        for (std::int64_t i = 0; i < total; ++i) ag.see(pa[i]);
        const double s_enc = ref::nvfp4_global_scale(ag.a);
        out.v["global_scale"] = {s_enc};
        auto& scale = out.v["scale"];
        for (std::int64_t b = 0; b < total / bs; ++b) {
          Amax am;
          for (std::int64_t k = 0; k < bs; ++k) am.see(pa[b * bs + k]);
          const int code = ref::nvfp4_block_scale_code(am.a, s_enc);
          scale.push_back(code);
          const double m = ref::nvfp4_element_multiplier(code, s_enc);
          for (std::int64_t k = 0; k < bs; ++k) {
            const auto i = static_cast<std::size_t>(b * bs + k);
            put(i, rn32(p[i] * m));
          }
        }
        if (q_.amax) out.v["amax"] = {ag.a};
        break;
      }
    }
    std::vector<double>& q = out.v["q"];
    q.assign(n, kNaN);
    if (!codes) return out;
    for (std::size_t i = 0; i < n; ++i) q[i] = out.code(i);
    if (f == QFault::stochastic_rounding_forward) {
      out.q_other.assign(n, kNaN);
      out.q_far.assign(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        double u = out.u[i];
        if (std::fabs(u) > mx) u = std::copysign(mx, u);
        const auto [o, far] = other_code(e_, static_cast<int>(q[i]), u);
        out.q_other[i] = o;
        out.q_far[i] = far ? 1 : 0;
      }
    }
    return out;
  }

 private:
  static double pick(double y, double a, DType t, PChoice pc) {
    const double r = ref::round_to(y, t);
    if (pc == PChoice::nearest || !std::isfinite(y) || !(a >= 0)) return r;
    const double lo = quant_detail::ceil_to(y - a, t), hi = quant_detail::floor_to(y + a, t);
    if (!(lo <= hi)) return r;
    if (pc == PChoice::small) return lo <= 0 && hi >= 0 ? 0.0 : (std::fabs(lo) < std::fabs(hi) ? lo : hi);
    return std::fabs(lo) > std::fabs(hi) ? lo : hi;
  }

  // The E8M0 code of a block's amax; with a largest element value other than the format's
  // (e4m3fnuz_max) the round-up rule divides by that one: rn32(amax * rn32(1/max)) rounded up to
  // a power of two (cvt.rp.satfinite.ue8m0). The floor rule does not read the maximum.
  int mx_code(double amax, ref::MxRule rule, double mx) const {
    if (mx == ref::elem_max(e_) || rule == ref::MxRule::floor) return ref::mx_scale_code(amax, e_, rule);
    const double t = rn32(amax * rn32(1 / mx));
    if (std::isinf(t)) return 0xFE;
    if (t <= std::ldexp(1.0, -127)) return 0;
    int ex = 0;
    const double fr = std::frexp(t, &ex);
    return std::min(fr == 0.5 ? ex - 1 : ex, 127) + 127;
  }

  const ref::Case& c_;
  const QuantContract& q_;
  const std::vector<double>& y_;
  const std::vector<double>& a_;
  const std::vector<double>& a32_;
  DType t_;
  Elem e_;
  ref::Geometry g_;
};

// How near a float output (a dynamic or global scale, amax) must be to a prediction to match it.
// The emulation takes p from the exact y; a kernel's float32 norm output carries a few float32
// ulps of its own error (the allowance of a float32 y is of that order), which moves an amax
// and the scales made from it by as much. 2^-18 is 32 ulps: far below what any dialect changes
// in a scale (a bfloat16 or float16 rounding of amax, 2^-12 and more; 448 against 240).
constexpr double kFloatMatch = 0x1p-18;

bool same_value(Elem e, bool code, double a, double b) {
  if (a == b) return true;
  if (code) {
    const bool an = a == std::floor(a) && std::fabs(a) < 256 && ref::is_nan_code(e, static_cast<int>(a));
    const bool bn = b == std::floor(b) && std::fabs(b) < 256 && ref::is_nan_code(e, static_cast<int>(b));
    return an && bn;
  }
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= kFloatMatch * std::fabs(b);
}

struct Count {
  std::int64_t wrong = 0, compared = 0, far = 0, picks = 0;  // picks: neighbour codes (stochastic)
  // Rows whose neighbour picks go both ways, in value and in magnitude: no error of the norm that
  // is coherent over a row (a wrong rstd scales it, a wrong mean shifts it) gives those.
  std::int64_t mixed_rows = 0;
  std::string first;  // the first element wrong: "q[3]: got 0x5C, predicted 0x5B"
};

// One output as the scoring sees it.
struct Scored {
  std::string name;
  const ref::Tensor* got = nullptr;
  const ref::Output* exp = nullptr;
  bool code = false;         // compared as codes (q, block scales)
  Elem elem = Elem::e4m3fn;  // the code format
  double allowed = 0;        // the elements a correct kernel may change (see the file's comment)
  Count spec;                // the spec's own runs against it
};


std::string value_text(const Scored& s, double v) {
  if (s.code) return s.elem == Elem::int8 ? fmt::format("{}", v) : fmt::format("0x{:02X}", static_cast<int>(v));
  return ref::hex_text(v);
}

// A dialect's three runs (PChoice): what it predicts for a correct kernel's p and both ends.
struct Runs {
  QPred mid, small, big;
};

// Whether g is one of a dialect's predictions for an element or lies between them (in value
// order; NaN codes match NaN codes only).
bool predicted(const Scored& s, double g, double a, double b, double c) {
  if (same_value(s.elem, s.code, g, a) || same_value(s.elem, s.code, g, b) || same_value(s.elem, s.code, g, c))
    return true;
  const auto value = [&](double v) {
    if (!s.code) return v;
    if (!(v == std::floor(v) && std::fabs(v) < 256) || ref::is_nan_code(s.elem, static_cast<int>(v))) return kNaN;
    return ref::decode(s.elem, static_cast<int>(v));
  };
  const double gv = value(g), av = value(a), bv = value(b), cv = value(c);
  if (std::isnan(gv) || std::isnan(av) || std::isnan(bv) || std::isnan(cv)) return false;
  const double lo = std::min({av, bv, cv}), hi = std::max({av, bv, cv});
  const double slack = s.code ? 0.0 : kFloatMatch;
  return gv >= lo - slack * std::fabs(lo) && gv <= hi + slack * std::fabs(hi);
}

Count count(const Scored& s, const Runs& r, bool stochastic, std::int64_t row = 1) {
  Count c;
  const auto& mid = r.mid.v.at(s.name);
  const auto& sm = r.small.v.at(s.name);
  const auto& bg = r.big.v.at(s.name);
  const bool q = s.name == "q";  // the end runs make a code only where the middle one misses
  const bool pairs = stochastic && q;
  unsigned dirs = 0;  // this row's neighbour picks: bit 0/1 down/up in value, 2/3 in magnitude
  for (std::size_t i = 0; i < mid.size() && i < s.got->data.size(); ++i) {
    if (row > 0 && static_cast<std::int64_t>(i) % row == 0) {
      if (dirs == 0xF) ++c.mixed_rows;
      dirs = 0;
    }
    if (!s.exp->certified[i]) continue;
    ++c.compared;
    const double g = s.got->data[i];
    bool ok = same_value(s.elem, s.code, g, mid[i]) ||
              (q ? predicted(s, g, mid[i], r.small.code(i), r.big.code(i)) : predicted(s, g, mid[i], sm[i], bg[i]));
    if (!ok && pairs && !std::isnan(r.mid.q_other[i]) && g == r.mid.q_other[i]) {
      ok = true;
      ++c.picks;
      if (r.mid.q_far[i]) ++c.far;
      const double a = ref::decode(s.elem, static_cast<int>(g)), b = ref::decode(s.elem, static_cast<int>(mid[i]));
      dirs |= a > b ? 2u : 1u;
      dirs |= std::fabs(a) > std::fabs(b) ? 8u : 4u;
    }
    if (ok) continue;
    if (c.wrong++ == 0)
      c.first = fmt::format("{}[{}]: got {}, predicted {}", s.name, i, value_text(s, g), value_text(s, mid[i]));
  }
  if (dirs == 0xF) ++c.mixed_rows;
  return c;
}

}  // namespace

const std::vector<DialectInfo>& quant_dialect_panel() {
  static const std::vector<DialectInfo> v = [] {
    std::vector<DialectInfo> out;
    for (const auto& d : kQuantDialects) out.push_back(info_of(d));
    return out;
  }();
  return v;
}

std::vector<Diagnosis> diagnose_quant(const fix::FixtureCase& fc, const Outputs& got, const CaseResult& judged,
                                      const DiagnoseOptions& opt) {
  std::vector<Diagnosis> result;
  if (!fc.c.quant || judged.verdict != Verdict::failed) return result;
  try {
    const ref::Case& c = fc.c;
    const QuantContract& q = *c.quant;
    const ref::Geometry g = ref::geometry_of(c);
    if (static_cast<std::size_t>(g.rows * g.cols) > opt.max_elements) return result;
    // The certified norm output (y in binary64), from the reference: the value every correct
    // kernel's p is a rounding of.
    const ref::Case norm = ref::quant_norm_case(c);
    const ref::Result r = ref::evaluate(norm);
    const std::vector<double>& y = r.outputs.at("y").f64;
    // p's allowance in T, and in float32 for the dialects that take the float32 value (its
    // allowance is the float32 kernel's error, far below T's rounding).
    const auto allow = derive_allowances(norm);
    ref::Case norm32 = norm;
    norm32.dtype_out = DType::float32;
    const auto allow32 = norm.dtype_out == DType::float32 ? allow : derive_allowances(norm32);
    const Emulator em(c, y, allow.at("y").abs, allow32.at("y").abs, norm.dtype_out);
    const auto runs = [&](QFault f) {
      return Runs{em.run(f), em.run(f, PChoice::small, false), em.run(f, PChoice::big, false)};
    };
    const Runs spec = runs(QFault::none);
    const Elem elem = ref::element_of(q.format);
    std::vector<Scored> outs;
    for (const auto& [name, pred] : spec.mid.v) {
      const auto e = fc.expected.find(name);
      const auto gt = got.find(name);
      if (e == fc.expected.end() || gt == got.end() || gt->second.data.size() != pred.size()) continue;
      Scored s;
      s.name = name;
      s.got = &gt->second;
      s.exp = &e->second;
      s.code = name == "q" || (name == "scale" && (q.scale == ScaleKind::mx_block || q.scale == ScaleKind::nvfp4_block));
      s.elem = name == "q" ? elem : q.scale == ScaleKind::mx_block ? Elem::e8m0 : Elem::e4m3fn;
      const OutputResult* o = nullptr;
      for (const auto& x : judged.outputs)
        if (x.name == name) o = &x;
      if (!o) continue;
      // A FAILED output: only the judge's accepted flips (a scale within its allowance is covered
      // by the runs at the allowance's ends; the codes judged under it are not noise).
      s.spec = count(s, spec, false);
      s.allowed = static_cast<double>(o->verdict == Verdict::passed ? s.spec.wrong : o->flips_accepted);
      outs.push_back(s);
    }
    if (outs.empty()) return result;
    std::int64_t spec_wrong = 0;
    double spec_score = 0;
    for (const auto& s : outs) {
      const Count& k = s.spec;
      spec_wrong += k.wrong;
      spec_score = std::max(spec_score, k.wrong == 0 ? 0.0 : (s.allowed > 0 ? static_cast<double>(k.wrong) / s.allowed : INFINITY));
    }
    struct Entry {
      Diagnosis d;
      bool interval;
      std::size_t order;
      Runs pred;
    };
    std::vector<Entry> entries;
    for (std::size_t di = 0; di < std::size(kQuantDialects); ++di) {
      const QDialect& qd = kQuantDialects[di];
      if (!applies(qd.f, q, norm.dtype_out, g.rows)) continue;
      Runs pred = runs(qd.f);
      if (!qd.interval && pred.mid.v == spec.mid.v) continue;  // changes nothing on this case
      Diagnosis d;
      const DialectInfo info = info_of(qd);
      d.dialect = info.name;
      d.fault_class = info.fault_class;
      d.title = info.title;
      d.spec_score = spec_score;
      std::int64_t wrong = 0, compared = 0, far = 0, picks = 0, mixed_rows = 0;
      std::string first, worst_name;
      double score = 0;
      for (const auto& s : outs) {
        const Count k = count(s, pred, qd.interval, g.cols);
        wrong += k.wrong;
        compared += k.compared;
        far += k.far;
        picks += k.picks;
        mixed_rows += k.mixed_rows;
        if (first.empty()) first = k.first;
        const double ratio = k.wrong == 0 ? 0.0 : (s.allowed > 0 ? static_cast<double>(k.wrong) / s.allowed : INFINITY);
        score = std::max(score, ratio);
      }
      d.score = score;
      // The pair prediction holds for every correct kernel too: stochastic rounding is named only
      // by what a small error of p does not give (neighbour picks at least 1/8 of a step from
      // the midpoint, a quarter of all picks or more: 56 % under stochastic rounding) together
      // with what a row-coherent error does not give (picks both ways within a row).
      const std::int64_t far_needed = std::max<std::int64_t>(3, (picks + 3) / 4);
      const bool signature = !qd.interval || (far >= far_needed && mixed_rows > 0);
      d.explains = score <= 1 && wrong < spec_wrong && signature;
      d.evidence = fmt::format(
          "reproduces {} of {} compared elements of {} ({} differ{}); the correct quantization differs at {}",
          compared - wrong, compared, [&] {
            std::string names;
            for (const auto& s : outs) names += (names.empty() ? "" : ", ") + s.name;
            return names;
          }(),
          wrong, first.empty() ? "" : ", first " + first, spec_wrong);
      if (qd.interval)
        d.evidence += fmt::format(
            "; {} of the {} neighbour codes lie 1/8 step or more from the midpoint (named from {}), {} rows pick "
            "neighbours both ways (named from 1)",
            far, picks, far_needed, mixed_rows);
      entries.push_back(Entry{std::move(d), qd.interval, di, std::move(pred)});
    }
    std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      if (a.d.explains != b.d.explains) return a.d.explains;
      if (a.d.score != b.d.score) return a.d.score < b.d.score;
      if (a.interval != b.interval) return !a.interval;
      return a.order < b.order;
    });
    // Dialects that predict the same outputs here are one entry (the earliest names it).
    std::vector<bool> merged(entries.size(), false);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (merged[i]) continue;
      for (std::size_t j = i + 1; j < entries.size(); ++j)
        if (!merged[j] && !entries[j].interval && !entries[i].interval && entries[j].pred.mid.v == entries[i].pred.mid.v) {
          merged[j] = true;
          entries[i].d.same_as.push_back(entries[j].d.dialect);
        }
      result.push_back(std::move(entries[i].d));
      if (result.size() >= opt.keep) break;
    }
  } catch (const std::exception&) {
    result.clear();  // a case the emulation cannot read is not diagnosed (never throws)
  }
  return result;
}

}  // namespace normcheck::conf
