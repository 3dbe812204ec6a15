// Quantization formats, presets and scale rules (quant.hpp). Every function here is exact:
// products of two float32 values and products with powers of two are exact in binary64, and
// every quotient is correctly rounded (div32: binary64 where double rounding is proved
// innocuous, a GMP rational elsewhere), so no rounding of binary64 arithmetic ever reaches a
// golden code or scale.
#include "normcheck/reference/quant.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>

#include "exact.hpp"
#include "normcheck/reference/dtype.hpp"

namespace normcheck::ref {
namespace {

double rn32(double v) { return round_to(v, DType::float32); }
bool is_float32(double v) { return std::isfinite(v) && static_cast<double>(static_cast<float>(v)) == v; }

// rn32(a / b), exactly (a, b finite, b != 0). Where a and b are float32 values and the quotient
// is a normal float32 number, binary64's correctly rounded quotient rounded to binary32 is the
// correctly rounded binary32 quotient: double rounding is innocuous for a quotient of p-bit
// numbers computed with q >= 2p + 2 bits (Figueroa, "When is double rounding innocuous?",
// 1995; 53 >= 50). Elsewhere (wider operands, a subnormal or overflowing quotient) the exact
// rational. The judge divides every code's value this way (TOLERANCE.md 10.1).
double div32(double a, double b) {
  if (is_float32(a) && is_float32(b) && b != 0) {
    const double q = a / b, m = std::fabs(q);
    if (m >= FLT_MIN && m <= FLT_MAX) return rn32(q);
  }
  return detail::round_rational(detail::exact(a) / detail::exact(b), DType::float32);
}

// Sign-magnitude minifloats: the non-negative finite values by code (code = index), ascending.
struct Mini {
  int exp_bits, man_bits, bias;
  int max_code;  // largest finite positive code
};
Mini mini_of(Elem e) {
  switch (e) {
    case Elem::e4m3fn: return {4, 3, 7, 0x7E};  // 0x7F is NaN: S.1111.111
    case Elem::e5m2: return {5, 2, 15, 0x7B};   // 0x7C inf, 0x7D-0x7F NaN
    case Elem::e2m1: return {2, 1, 1, 0x7};     // no inf, no NaN
    default: break;
  }
  throw std::logic_error("not a minifloat");
}
double mini_value(const Mini& m, int code) {  // code without its sign bit
  const int e = code >> m.man_bits, f = code & ((1 << m.man_bits) - 1);
  if (e == 0) return std::ldexp(f, 1 - m.bias - m.man_bits);
  return std::ldexp((1 << m.man_bits) + f, e - m.bias - m.man_bits);
}
int sign_bit(Elem e) { return e == Elem::e2m1 ? 0x8 : 0x80; }

const std::vector<double>& positive_values(Elem e) {
  static const auto make = [](Elem el) {
    std::vector<double> v;
    if (el == Elem::int8) {
      for (int k = 0; k <= 127; ++k) v.push_back(k);
    } else {
      const Mini m = mini_of(el);
      for (int k = 0; k <= m.max_code; ++k) v.push_back(mini_value(m, k));
    }
    return v;
  };
  static const std::vector<double> t[4] = {make(Elem::e4m3fn), make(Elem::e5m2), make(Elem::int8), make(Elem::e2m1)};
  return t[static_cast<int>(e)];
}

}  // namespace

std::string_view name_of(Elem e) {
  switch (e) {
    case Elem::e4m3fn: return "e4m3fn";
    case Elem::e5m2: return "e5m2";
    case Elem::int8: return "int8";
    case Elem::e2m1: return "e2m1";
    case Elem::e8m0: return "e8m0";
  }
  return "?";
}


const std::vector<std::pair<std::string, QuantContract>>& quant_presets() {
  static const auto table = [] {
    std::vector<std::pair<std::string, QuantContract>> t;
    const auto add = [&](const char* name, QuantContract q) {
      q.preset = name;
      t.emplace_back(name, q);
    };
    QuantContract q;  // vLLM rms_norm_static_fp8_quant: y rounded to T, times rn32(1/scale)
    add("vllm_static_fp8", q);
    add("vllm_fused_add_static_fp8", q);  // the same with h = rn_T(x + r) (R1)
    q.scale = ScaleKind::dynamic_token;   // rms_norm_dynamic_per_token_quant: R2, true divide
    q.residual_sum = ResidualSum::unrounded;
    q.apply = ScaleApply::divide;
    q.min_scale = default_min_scale(QFormat::float8_e4m3fn);
    add("vllm_dynamic_fp8", q);
    q.format = QFormat::int8;  // int8: reciprocal multiply, min scale FLT_EPSILON
    q.apply = ScaleApply::reciprocal;
    q.min_scale = default_min_scale(QFormat::int8);
    add("vllm_dynamic_int8", q);
    q = QuantContract{};  // FlashInfer rmsnorm_quant / fused_add_rmsnorm_quant: fp32 value, R2
    q.value = QuantValue::float32;
    q.residual_sum = ResidualSum::unrounded;
    add("flashinfer_fp8", q);
    add("flashinfer_fused_add_fp8", q);
    q.apply = ScaleApply::multiply;  // TE delayed scaling: fp32 value times the scale, amax out
    q.amax = true;
    add("te_delayed_fp8", q);
    q = QuantContract{};  // TE MXFP8: the norm written in T, then the quantizer (round-up rule)
    q.format = QFormat::mxfp8_e4m3;
    q.scale = ScaleKind::mx_block;
    q.mx_rule = MxRule::round_up;
    add("te_mxfp8", q);
    q.mx_rule = MxRule::floor;  // the OCP MX spec's rule
    add("ocp_mxfp8", q);
    q = QuantContract{};  // TE NVFP4: 16-blocks, E4M3 block scale, fp32 global scale
    q.format = QFormat::nvfp4_e2m1;
    q.scale = ScaleKind::nvfp4_block;
    add("te_nvfp4", q);
    return t;
  }();
  return table;
}

std::optional<QuantContract> quant_preset(std::string_view name) {
  for (const auto& [n, q] : quant_presets())
    if (n == name) return q;
  return std::nullopt;
}

Elem element_of(QFormat f) {
  switch (f) {
    case QFormat::float8_e4m3fn:
    case QFormat::mxfp8_e4m3: return Elem::e4m3fn;
    case QFormat::float8_e5m2:
    case QFormat::mxfp8_e5m2: return Elem::e5m2;
    case QFormat::int8: return Elem::int8;
    case QFormat::nvfp4_e2m1: return Elem::e2m1;
  }
  return Elem::e4m3fn;
}

int block_size(QFormat f) {
  if (f == QFormat::mxfp8_e4m3 || f == QFormat::mxfp8_e5m2) return 32;
  return f == QFormat::nvfp4_e2m1 ? 16 : 0;
}

double elem_max(Elem e) {
  switch (e) {
    case Elem::e4m3fn: return 448;
    case Elem::e5m2: return 57344;
    case Elem::int8: return 127;
    case Elem::e2m1: return 6;
    case Elem::e8m0: return std::ldexp(1.0, 127);
  }
  return 0;
}

int elem_emax(Elem e) {
  switch (e) {
    case Elem::e4m3fn: return 8;
    case Elem::e5m2: return 15;
    case Elem::e2m1: return 2;
    default: return 0;
  }
}

double decode(Elem e, int code) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  switch (e) {
    case Elem::int8: return code >= -128 && code <= 127 ? code : nan;
    case Elem::e8m0: return code >= 0 && code < 255 ? std::ldexp(1.0, code - 127) : nan;
    default: break;
  }
  const int sign = sign_bit(e), limit = 2 * sign;
  if (code < 0 || code >= limit) return nan;
  const Mini m = mini_of(e);
  const int mag = code & (sign - 1);
  double v;
  if (mag <= m.max_code) v = mini_value(m, mag);
  else if (e == Elem::e5m2 && mag == 0x7C) v = std::numeric_limits<double>::infinity();
  else return nan;
  return (code & sign) ? -v : v;
}

bool is_nan_code(Elem e, int code) {
  if (e == Elem::int8 || e == Elem::e2m1) return false;
  if (e == Elem::e8m0) return code == 0xFF;
  return std::isnan(decode(e, code));
}

int nan_code(Elem e) {
  switch (e) {
    case Elem::e4m3fn:
    case Elem::e5m2: return 0x7F;
    case Elem::e8m0: return 0xFF;
    default: return -1;
  }
}

int encode(Elem e, double v) {
  if (e == Elem::e8m0) throw std::logic_error("encode: E8M0 scales come from mx_scale_code");
  if (std::isnan(v)) return std::max(nan_code(e), 0);
  const std::vector<double>& vals = positive_values(e);
  const bool neg = std::signbit(v);
  const double a = std::fabs(v);
  int k;
  if (a >= vals.back()) {
    k = static_cast<int>(vals.size()) - 1;  // saturation (SATFINITE; int8 .sat), Inf included
  } else {
    // vals[k] <= a < vals[k+1]; then the nearer, ties to the even code (mantissa LSB = code LSB).
    k = static_cast<int>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin()) - 1;
    const double mid = (vals[k] + vals[k + 1]) / 2;  // exact: adjacent values differ in one ulp
    if (a > mid || (a == mid && (k & 1))) ++k;
  }
  if (e == Elem::int8) return neg ? -k : k;
  return neg ? (k | sign_bit(e)) : k;
}

const std::vector<double>& boundaries(Elem e) {
  static const auto make = [](Elem el) {
    const std::vector<double>& vals = positive_values(el);
    std::vector<double> pos;
    for (std::size_t k = 0; k + 1 < vals.size(); ++k) pos.push_back((vals[k] + vals[k + 1]) / 2);
    std::vector<double> all;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    if (el != Elem::int8) all.push_back(0.0);  // -0 and +0 have different codes
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  };
  static const std::vector<double> t[4] = {make(Elem::e4m3fn), make(Elem::e5m2), make(Elem::int8), make(Elem::e2m1)};
  if (e == Elem::e8m0) throw std::logic_error("boundaries: not for E8M0");
  return t[static_cast<int>(e)];
}

CodeRange code_range(Elem e, double lo, double hi) {
  CodeRange r;
  r.lo_code = encode(e, lo);
  r.hi_code = encode(e, hi);
  const auto& b = boundaries(e);
  const auto it = std::lower_bound(b.begin(), b.end(), lo);
  r.certain = r.lo_code == r.hi_code && (it == b.end() || *it > hi);
  return r;
}

std::vector<std::uint8_t> pack_nvfp4(const std::vector<int>& codes) {
  if (codes.size() % 2) throw std::invalid_argument("pack_nvfp4: odd number of elements");
  std::vector<std::uint8_t> out(codes.size() / 2);
  for (std::size_t k = 0; k < out.size(); ++k)
    out[k] = static_cast<std::uint8_t>((codes[2 * k] & 0xF) | ((codes[2 * k + 1] & 0xF) << 4));
  return out;
}

std::vector<int> unpack_nvfp4(const std::vector<std::uint8_t>& bytes) {
  std::vector<int> out(bytes.size() * 2);
  for (std::size_t k = 0; k < bytes.size(); ++k) {
    out[2 * k] = bytes[k] & 0xF;
    out[2 * k + 1] = bytes[k] >> 4;
  }
  return out;
}

double dynamic_qmax(QFormat f) { return elem_max(element_of(f)); }

double default_min_scale(QFormat f) {
  if (f == QFormat::int8) return FLT_EPSILON;
  return div32(1.0, dynamic_qmax(f) * 512);  // vLLM min_scaling_factor: 1.0f / (max * 512.f)
}

double dynamic_scale(double amax, const QuantContract& q) {
  const double a = std::min(amax, q.scale_ub);
  return std::max(div32(a, dynamic_qmax(q.format)), q.min_scale);
}

int mx_scale_code(double amax, Elem elem, MxRule rule) {
  if (std::isnan(amax)) return 0xFF;
  if (rule == MxRule::floor) {
    if (std::isinf(amax)) return 0xFF;
    // microxcaling mx_ops.py: amax 0 is replaced by FP32_MIN_NORMAL (2^-126).
    const int lg = amax == 0 ? -126 : std::ilogb(amax);  // floor(log2 amax), exact
    const int e = lg - elem_emax(elem);
    if (e > 127) return 0xFF;
    return std::max(e, -127) + 127;
  }
  // TE: e8m0 = cvt.rp.satfinite.ue8m0(amax * max_norm_rcp), max_norm_rcp = rn32(1/max).
  const double t = rn32(amax * div32(1.0, elem_max(elem)));
  if (std::isinf(t)) return 0xFE;
  if (t <= std::ldexp(1.0, -127)) return 0;
  int e = std::ilogb(t);
  if (std::ldexp(1.0, e) != t) ++e;  // round up to a power of two
  return std::min(e, 127) + 127;
}

double nvfp4_global_scale(double amax_g) {
  if (amax_g == 0 || !std::isfinite(amax_g)) return 1.0;
  const double s = std::min(div32(448.0 * 6.0, amax_g), static_cast<double>(FLT_MAX));
  return s == 0 ? 1.0 : s;
}

int nvfp4_block_scale_code(double amax_b, double s_enc) {
  const double k = rn32(s_enc * div32(1.0, 6.0));
  return encode(Elem::e4m3fn, rn32(amax_b * k));
}

double nvfp4_element_multiplier(int scale_code, double s_enc) {
  const double sb = decode(Elem::e4m3fn, scale_code);
  const double t = rn32(sb * div32(1.0, s_enc));
  if (t == 0) return 0.0;
  return std::min(div32(1.0, t), static_cast<double>(FLT_MAX));
}

double apply_scale(double v, double scale, ScaleApply a) {
  if (!std::isfinite(v)) return a == ScaleApply::multiply ? v * scale : v / scale;  // IEEE, as fp32
  switch (a) {
    case ScaleApply::reciprocal: return rn32(v * div32(1.0, scale));
    case ScaleApply::divide: return div32(v, scale);
    case ScaleApply::multiply: return rn32(v * scale);
  }
  return v;
}

}  // namespace normcheck::ref
