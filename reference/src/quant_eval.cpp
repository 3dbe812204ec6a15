// Fused norm + quantization: the certified codes, scales and masks of a quant case.
//
// The norm is evaluated by the certified reference with y rounded to the dtype the contract
// quantizes (dtype_out, or float32); that value p is exact wherever y is certified. Every later
// step is a float32 operation on exact float32 values (quant.cpp, exact), so a code is
// certified exactly when the p values it depends on (its own, and those of its scale's amax)
// are, and no kernel-dependent case applies (a NaN under a dynamic scale, int8 below -127.5,
// an NVFP4 block whose scale underflows to 0).
#include "quant_eval.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "exact.hpp"
#include "normcheck/reference/contract.hpp"

namespace normcheck::ref::detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool contract_rounds_h(const std::string& spec) {
  const auto k = parse_contract(spec);
  if (!k) return false;
  for (const auto& p : k->points)
    if (p.point == Point::h) return true;
  return false;
}

DType quant_value_dtype(const Case& c) {
  return c.quant->value == QuantValue::activation ? c.dtype_out : DType::float32;
}

std::vector<std::int64_t> block_shape(const Geometry& g, int bs) {
  auto s = g.shape;
  s.back() /= bs;
  return s;
}

// One output tensor of codes or float32 values, all elements written by the caller.
Output make(const OutputSpec& spec) {
  Output o;
  o.value.dtype = spec.dtype;
  o.value.shape = spec.shape;
  o.codes = spec.codes;
  std::int64_t n = 1;
  for (auto d : spec.shape) n *= d;
  o.value.data.assign(static_cast<std::size_t>(n), 0.0);
  o.f64.assign(static_cast<std::size_t>(n), 0.0);
  o.certified.assign(static_cast<std::size_t>(n), 0);
  return o;
}

// The exact multiplier m with u_real = y_real * m for a scale s applied as `a`.
Rational multiplier(double s, ScaleApply a) {
  switch (a) {
    case ScaleApply::reciprocal:
      return exact(round_rational(Rational(1) / exact(s), DType::float32));
    case ScaleApply::divide: return Rational(1) / exact(s);
    case ScaleApply::multiply: return exact(s);
  }
  return Rational(1);
}

class Quantizer {
 public:
  Quantizer(const Case& c, const Output& p, const Geometry& g)
      : c_(c), q_(*c.quant), p_(p), g_(g), elem_(element_of(q_.format)) {}

  // The code of element i under scale s (applied as a), and its masks. scale_ok: the scale is
  // certified.
  void code(Output& q, std::int64_t i, double s, ScaleApply a, bool scale_ok) {
    const double v = p_.value.data[i];
    if (std::isnan(v)) {
      nan_element(q, i);
      return;
    }
    const Scale& sc = scale_of(s, a);
    // The contract's float32 value: rn32(v * rn32(1/s)), rn32(v / s) or rn32(v * s). v * m is
    // exact in binary64 (two float32 significands); the quotient goes through a rational.
    const double u = !std::isfinite(v) || a == ScaleApply::divide ? apply_scale(v, s, a)
                                                                  : round_to(v * sc.m_double, DType::float32);
    const int k = encode(elem_, u);
    q.value.data[i] = k;
    bool ok = scale_ok && p_.certified[i];
    // cvt.rni.sat.s8 clamps at -128, the symmetric contract at -127: kernels differ below -127.5.
    if (elem_ == Elem::int8 && u <= -127.5) ok = false;
    q.certified[i] = ok;
    const double y64 = p_.f64[i];
    if (!std::isfinite(y64)) {
      q.f64[i] = u;
      return;
    }
    // y64 * m rounded to binary64: one IEEE operation (correctly rounded; no contraction in
    // this file), the same value as rounding the rational product.
    const double u64 = a == ScaleApply::divide ? y64 / s : y64 * sc.m_double;
    q.f64[i] = u64;
    q.ties[i] = near_boundary(y64, u64, sc.m);
  }

  void nan_element(Output& q, std::int64_t i) {
    const int nc = nan_code(elem_);
    const bool coded = nc >= 0 && q_.nan == NanPolicy::nan_code;
    q.value.data[i] = coded ? nc : 0;
    q.f64[i] = kNaN;
    q.certified[i] = coded && p_.certified[i];
  }

  // A code whose value the contract leaves to the kernel (a NaN scale, an underflowed NVFP4
  // block scale): NaN elements still get the NaN code (NaN times anything is NaN).
  void unspecified(Output& q, std::int64_t i) {
    if (std::isnan(p_.value.data[i])) return nan_element(q, i);
    q.value.data[i] = encode(elem_, 0.0);
    q.f64[i] = kNaN;
    q.certified[i] = 0;
  }

  // The multiplier of a scale, computed once per scale (rows and blocks repeat it).
  struct Scale {
    double s = kNaN;
    ScaleApply a = ScaleApply::reciprocal;
    Rational m;          // exact: y_real * m is the exact pre-quantization value
    double m_double = 0;  // m when it is a binary64 (reciprocal, multiply): always so there
  };
  const Scale& scale_of(double s, ScaleApply a) {
    if (!(cache_.s == s && cache_.a == a)) {
      cache_.s = s;
      cache_.a = a;
      cache_.m = multiplier(s, a);
      cache_.m_double = a == ScaleApply::divide ? 0.0 : round_rational(cache_.m, DType::float64);
    }
    return cache_;
  }

  // Does the exact real value y_real * m lie on a code boundary, to within y's rounding to
  // binary64? y_real lies in [y64 - h, y64 + h] with h half an ulp of binary64 on each side.
  // u64 = rn64(y64 * m) is within 2^-52 |u64| of every point of that interval times m (two
  // roundings of 2^-53 relative each): a boundary farther than 2^-48 |u64| from u64 is outside
  // it, which decides almost every element without rationals; the rest are decided exactly.
  std::uint8_t near_boundary(double y64, double u64, const Rational& m) const {
    const auto& bs = boundaries(elem_);
    const auto next = std::lower_bound(bs.begin(), bs.end(), u64);
    const double margin = std::ldexp(std::fabs(u64), -48);
    const bool far_above = next == bs.end() || *next - u64 > margin;
    const bool far_below = next == bs.begin() || u64 - *(next - 1) > margin;
    if (far_above && far_below && u64 != 0) return 0;
    const double below = std::nextafter(y64, -INFINITY), above = std::nextafter(y64, INFINITY);
    Rational lo = (exact(y64) + exact(below)) / 2, hi = (exact(y64) + exact(above)) / 2;
    lo *= m;
    hi *= m;
    if (hi < lo) std::swap(lo, hi);
    // A boundary b (a binary64) in [lo, hi] lies in [rn64(lo), rn64(hi)] (rounding is monotone).
    const double dlo = round_rational(lo, DType::float64), dhi = round_rational(hi, DType::float64);
    const auto& b = boundaries(elem_);
    for (auto it = std::lower_bound(b.begin(), b.end(), dlo); it != b.end() && *it <= dhi; ++it) {
      const Rational eb = exact(*it);
      if (lo <= eb && eb <= hi) return 1;
    }
    return 0;
  }

  // Range of elements [first, first + n) of row-major p: its amax over the finite values, and
  // whether they are all finite and certified.
  struct Group {
    double amax = 0;
    double amax64 = 0;  // max |y_real| rounded to binary64 (rounding is monotone)
    bool finite = true;
    bool certified = true;
  };
  Group group(std::int64_t first, std::int64_t n) const {
    Group r;
    for (std::int64_t i = first; i < first + n; ++i) {
      const double v = p_.value.data[i];
      if (!std::isfinite(v)) {
        r.finite = false;
        continue;
      }
      r.amax = std::max(r.amax, std::fabs(v));
      r.amax64 = std::max(r.amax64, std::fabs(p_.f64[i]));
      r.certified &= p_.certified[i] != 0;
    }
    return r;
  }

  // Does the exact amax of a group (max |y_real|, known to within its binary64 rounding amax64)
  // lie on a step of the scale function f, to within one float32 ulp? f is evaluated at the
  // float32 values just below and just above; the scale functions are monotone in amax, so a
  // step between them shows as different results.
  template <typename F>
  static std::uint8_t scale_tie(const Group& gr, F f) {
    if (!gr.finite) return 0;
    const double a = gr.amax64;
    const double r = round_to(a, DType::float32);
    const float rf = static_cast<float>(r);
    const double lo = r < a ? r : static_cast<double>(std::nextafter(rf, 0.0f));
    const double hi = r > a ? r : static_cast<double>(std::nextafter(rf, INFINITY));
    return f(std::max(lo, 0.0)) != f(hi);
  }

  static void set_f32(Output& o, std::int64_t i, double v, double v64, bool ok) {
    o.value.data[i] = v;
    o.f64[i] = v64;
    o.certified[i] = ok;
  }

  void run(Result& out, const std::map<std::string, OutputSpec>& specs) {
    Output q = make(specs.at("q"));
    q.ties.assign(q.certified.size(), 0);
    const std::int64_t rows = g_.rows, cols = g_.cols, total = rows * cols;
    std::optional<Output> amax;
    if (specs.count("amax")) amax = make(specs.at("amax"));
    switch (q_.scale) {
      case ScaleKind::static_tensor: {
        const double s = c_.inputs.at("scale").data[0];
        for (std::int64_t i = 0; i < total; ++i) code(q, i, s, q_.apply, true);
        if (amax) {
          const Group gr = group(0, total);
          set_f32(*amax, 0, gr.amax, gr.amax64, gr.finite && gr.certified);
        }
        break;
      }
      case ScaleKind::dynamic_token: {
        Output scale = make(specs.at("scale"));
        for (std::int64_t r = 0; r < rows; ++r) {
          const Group gr = group(r * cols, cols);
          // A NaN or Inf in the row: fmaxf drops NaN (vLLM), torch.amax keeps it; min(Inf, ub)
          // depends on ub. Kernels differ, so the scale and the row's finite codes are not judged.
          const double s = dynamic_scale(gr.amax, q_);
          // No ties mask: rn32(amax / qmax) changes at nearly every float32 step of amax, so a
          // dynamic scale is judged within the allowance derived from amax's (expected_f64/amax).
          set_f32(scale, r, s, s, gr.finite && gr.certified);
          for (std::int64_t i = r * cols; i < (r + 1) * cols; ++i) {
            if (gr.finite) code(q, i, s, q_.apply, gr.certified);
            else unspecified(q, i);
          }
          if (amax) set_f32(*amax, r, gr.amax, gr.amax64, gr.finite && gr.certified);
        }
        out.outputs.emplace("scale", std::move(scale));
        break;
      }
      case ScaleKind::mx_block: {
        Output scale = make(specs.at("scale"));
        scale.ties.assign(scale.certified.size(), 0);
        const std::int64_t bs = block_size(q_.format), nb = total / bs;
        for (std::int64_t b = 0; b < nb; ++b) {
          const Group gr = group(b * bs, bs);
          scale.ties[b] = scale_tie(gr, [&](double a) { return mx_scale_code(a, elem_, q_.mx_rule); });
          // OCP: a NaN or Inf in the block makes the shared scale NaN (0xFF), all elements NaN.
          // The round-up rule's kernels take amax with fmaxf: a NaN or Inf block is not judged.
          const bool floor = q_.mx_rule == MxRule::floor;
          const int e8 = !gr.finite ? (floor ? 0xFF : 0xFE) : mx_scale_code(gr.amax, elem_, q_.mx_rule);
          const bool scale_ok = gr.certified && (gr.finite || floor);
          scale.value.data[b] = e8;
          scale.f64[b] = decode(Elem::e8m0, e8);
          scale.certified[b] = scale_ok;
          for (std::int64_t i = b * bs; i < (b + 1) * bs; ++i) {
            if (e8 == 0xFF || !gr.finite) unspecified(q, i);
            else code(q, i, std::ldexp(1.0, 127 - e8), ScaleApply::multiply, scale_ok);
          }
          if (amax) set_f32(*amax, b, gr.amax, gr.amax64, gr.finite && gr.certified);
        }
        out.outputs.emplace("scale", std::move(scale));
        break;
      }
      case ScaleKind::nvfp4_block: {
        Output scale = make(specs.at("scale"));
        Output global = make(specs.at("global_scale"));
        scale.ties.assign(scale.certified.size(), 0);
        const std::int64_t bs = block_size(q_.format), nb = total / bs;
        const Group all = group(0, total);
        // The global amax of a tensor with a NaN or Inf: kernels differ (fmaxf or not), and
        // every scale depends on it, so nothing of the tensor is judged.
        const bool global_ok = all.finite && all.certified;
        const double s_enc = nvfp4_global_scale(all.amax);
        set_f32(global, 0, s_enc, s_enc, global_ok);  // continuous in amax_g, like a dynamic scale
        for (std::int64_t b = 0; b < nb; ++b) {
          const Group gr = group(b * bs, bs);
          const int sc = nvfp4_block_scale_code(gr.amax, s_enc);
          scale.ties[b] = scale_tie(gr, [&](double a) { return nvfp4_block_scale_code(a, s_enc); });
          const bool scale_ok = global_ok && gr.certified;
          scale.value.data[b] = sc;
          scale.f64[b] = decode(Elem::e4m3fn, sc);
          scale.certified[b] = scale_ok;
          const double mult = nvfp4_element_multiplier(sc, s_enc);
          // S_b = 0 with a nonzero amax: TE multiplies by FLT_MAX, TRT-LLM by 0: not judged.
          // An all-zero block has S_b = 0 too, and every kernel gives its zeros code 0 (or -0).
          const bool underflow = gr.amax > 0 && (mult == 0 || decode(Elem::e4m3fn, sc) == 0);
          for (std::int64_t i = b * bs; i < (b + 1) * bs; ++i) {
            if (!global_ok || underflow) unspecified(q, i);
            else code(q, i, mult, ScaleApply::multiply, scale_ok);
          }
        }
        if (amax) set_f32(*amax, 0, all.amax, all.amax64, global_ok);
        out.outputs.emplace("scale", std::move(scale));
        out.outputs.emplace("global_scale", std::move(global));
        break;
      }
    }
    out.outputs.emplace("q", std::move(q));
    if (amax) out.outputs.emplace("amax", std::move(*amax));
  }

 private:
  const Case& c_;
  const QuantContract& q_;
  const Output& p_;
  const Geometry& g_;
  Elem elem_;
  Scale cache_;
};

}  // namespace

void validate_quant(const Case& c, const Geometry& g) {
  const QuantContract& q = *c.quant;
  const auto rank = static_cast<std::int64_t>(g.shape.size());
  if (c.direction != Direction::forward) throw CaseError("quant", "quantized outputs are forward only");
  if (g.norm_dims.size() != 1 || g.norm_dims[0] != rank - 1)
    throw CaseError("quant", "quantization blocks and rows run along the last dim: normalize over it alone");
  if (c.dtype_out == DType::float64)
    throw CaseError("dtype_out", "a quantized case's activation dtype must be float32, float16 or bfloat16");
  const int bs = block_size(q.format);
  const bool mx = bs == 32, nv = bs == 16;
  if (mx != (q.scale == ScaleKind::mx_block) || nv != (q.scale == ScaleKind::nvfp4_block))
    throw CaseError("quant/scale", "'" + std::string(name_of(q.scale)) + "' does not go with format '" +
                                       std::string(name_of(q.format)) +
                                       "' (mxfp8_* take mx_block, nvfp4_e2m1 nvfp4_block, the others static or dynamic)");
  if (bs && g.cols % bs)
    throw CaseError("quant/format", "the normalized dim (" + std::to_string(g.cols) + ") must be a multiple of the " +
                                        std::to_string(bs) + "-element block");
  if (q.residual_sum == ResidualSum::unrounded && contract_rounds_h(c.contract))
    throw CaseError("quant/residual_sum", "'unrounded' but contract '" + c.contract + "' rounds h");
  if (q.scale == ScaleKind::static_tensor) {
    const double s = c.inputs.at("scale").data[0];
    if (!(std::isfinite(s) && s > 0)) throw CaseError("inputs/scale", "must be a finite float32 value > 0");
  }
  if (q.scale == ScaleKind::dynamic_token) {
    if (!(q.min_scale >= 0 && std::isfinite(q.min_scale) && representable(q.min_scale, DType::float32)))
      throw CaseError("quant/min_scale", hex_text(q.min_scale) + " must be a finite float32 value >= 0");
    if (!(q.scale_ub > 0 && representable(q.scale_ub, DType::float32)))
      throw CaseError("quant/scale_ub", hex_text(q.scale_ub) + " must be a float32 value > 0 (or inf)");
    if (q.min_scale == 0)  // an all-zero row has amax 0: a zero scale would divide by zero
      throw CaseError("quant/min_scale", "must be > 0 for a dynamic scale");
  }
}

std::map<std::string, OutputSpec> quant_output_specs(const Case& c, const Geometry& g) {
  const QuantContract& q = *c.quant;
  std::map<std::string, OutputSpec> out;
  out["q"] = {DType::float64, g.shape, std::string(name_of(q.format))};
  const int bs = block_size(q.format);
  switch (q.scale) {
    case ScaleKind::static_tensor:
      if (q.amax) out["amax"] = {DType::float32, {1}};
      break;
    case ScaleKind::dynamic_token:
      out["scale"] = {DType::float32, g.stat_shape};
      if (q.amax) out["amax"] = {DType::float32, g.stat_shape};
      break;
    case ScaleKind::mx_block:
      out["scale"] = {DType::float64, block_shape(g, bs), "e8m0"};
      if (q.amax) out["amax"] = {DType::float32, block_shape(g, bs)};
      break;
    case ScaleKind::nvfp4_block:
      out["scale"] = {DType::float64, block_shape(g, bs), "float8_e4m3fn"};
      out["global_scale"] = {DType::float32, {1}};
      if (q.amax) out["amax"] = {DType::float32, {1}};
      break;
  }
  if (q.y) out["y"] = {c.dtype_out, g.shape};
  if (c.residual != Residual::none) out["residual_out"] = {c.dtype_residual, g.shape};
  return out;
}

Case norm_case_of(const Case& c) {
  Case n = c;
  n.quant.reset();
  n.inputs.erase("scale");
  if (c.residual != Residual::none && c.quant->residual_sum == ResidualSum::rounded && !contract_rounds_h(c.contract))
    n.contract = c.contract == "exact" ? "fused_add_lowp" : c.contract + "+fused_add_lowp";
  n.dtype_out = quant_value_dtype(c);
  return n;
}

void evaluate_quant(const Case& c, const Options& opt, Result& out) {
  const Geometry g = geometry_of(c);
  const auto specs = quant_output_specs(c, g);
  const Case n = norm_case_of(c);
  Result norm = evaluate(n, opt);
  out.outputs.clear();
  out.stats = norm.stats;  // fast/slow/bits of the norm; elements counted below, outputs only
  out.stats.elements = out.stats.uncertified = 0;
  Quantizer(c, norm.outputs.at("y"), g).run(out, specs);
  if (specs.count("residual_out")) out.outputs.emplace("residual_out", std::move(norm.outputs.at("residual_out")));
  if (specs.count("y")) {
    if (n.dtype_out == c.dtype_out) {
      out.outputs.emplace("y", std::move(norm.outputs.at("y")));
    } else {
      Case ny = n;
      ny.dtype_out = c.dtype_out;
      Result r = evaluate(ny, opt);
      out.outputs.emplace("y", std::move(r.outputs.at("y")));
    }
  }
  for (const auto& [name, o] : out.outputs) {
    (void)name;
    out.stats.elements += static_cast<std::int64_t>(o.certified.size());
    out.stats.uncertified += count_zero_bytes(o.certified);
  }
}

}  // namespace normcheck::ref::detail

namespace normcheck::ref {
Case quant_norm_case(const Case& c) { return detail::norm_case_of(c); }
}  // namespace normcheck::ref
