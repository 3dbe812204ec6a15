// Fused norm + quantization on the CPU (reference/README.md "Quantized outputs"): the norm
// kernel on the case's norm part (ref::quant_norm_case: its y is the value p the contract
// quantizes), then the quantization in float arithmetic, as the real kernels write it (vLLM
// csrc/quantization/fused_kernels/quant_conversions.cuh, TransformerEngine quantize_mxfp8.cuh and
// core_nvfp4.cuh), with a converter to the code formats built here from their bit layouts (not
// the reference's table search). The quantization faults of class H live here.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <stdexcept>

#include "kernel_impl.hpp"
#include "kernels.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::conf::cpu::detail {
namespace {

using ref::DType;
using ref::QFormat;
using ref::ScaleKind;

// A sign-magnitude minifloat: mantissa bits, exponent bias, largest finite value, its NaN code.
struct Mini {
  int man, bias;
  double max;
  int nan;   // -1: none (E2M1)
  int sign;  // the sign bit
};
constexpr Mini kE4M3{3, 7, 448, 0x7F, 0x80}, kE5M2{2, 15, 57344, 0x7F, 0x80}, kE2M1{1, 1, 6, -1, 0x8};

// Round to nearest even with saturation to the largest finite value (cvt.rn.satfinite). With a
// dither d in [0, 1) instead: stochastic rounding, floor(a / quantum + d) (cvt.rs).
int to_mini(double v, const Mini& m, double dither = -1) {
  if (std::isnan(v)) return m.nan >= 0 ? m.nan : 0;
  const int sign = std::signbit(v) ? m.sign : 0;
  const double a = std::fabs(v);
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): the binade's exponent is e - 1
  const int binade = std::max(e - 1, 1 - m.bias);  // subnormals share the smallest normal's quantum
  const double quantum = std::ldexp(1.0, binade - m.man);
  const double steps = dither >= 0 ? std::floor(a / quantum + dither) : std::nearbyint(a / quantum);  // ties to even
  double r = a >= m.max ? m.max : steps * quantum;
  if (r > m.max) r = m.max;
  if (r == 0) return sign;
  std::frexp(r, &e);
  if (e - 1 < 1 - m.bias) return sign | static_cast<int>(r / std::ldexp(1.0, 1 - m.bias - m.man));
  const int frac = static_cast<int>(r / std::ldexp(1.0, e - 1 - m.man)) - (1 << m.man);
  return sign | ((e - 1 + m.bias) << m.man) | frac;
}

double from_e4m3(int code) {
  const int mag = code & 0x7F, e = mag >> 3, f = mag & 7;
  if (mag == 0x7F) return NAN;
  const double v = e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10);
  return code & 0x80 ? -v : v;
}

// int8: cvt.rni.sat.s8.f32 (round half to even, saturating to [-128, 127]; NaN gives 0); with a
// dither d in [0, 1), stochastic rounding floor(v + d).
int to_int8(float v, double dither = -1) {
  if (std::isnan(v)) return 0;
  const double r = dither >= 0 ? std::floor(static_cast<double>(v) + dither) : std::nearbyint(static_cast<double>(v));
  return static_cast<int>(std::clamp(r, -128.0, 127.0));
}

// The uniform draw of stochastic rounding for element i of value u, in [0, 1): a hash
// (splitmix64) of both, as a counter-based generator (Philox) keyed by the element gives, so a
// run is reproducible.
double dither_of(float u, std::int64_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(i) << 32 | std::bit_cast<std::uint32_t>(u)) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

struct Quantizer {
  const ref::QuantContract& q;
  Fault f;
  Mini mini() const {
    Mini m = ref::element_of(q.format) == ref::Elem::e5m2 ? kE5M2 : q.format == QFormat::nvfp4_e2m1 ? kE2M1 : kE4M3;
    // E5M2 clamped at +-448 before the cast (FlashInfer #2612, #4056).
    if (f == fault("e5m2_clamped_448") && m.max == 57344) m.max = 448;
    // E4M3FNUZ's largest value (240) taken for E4M3FN.
    if (f == fault("e4m3fnuz_max") && m.max == 448) m.max = 240;
    return m;
  }
  double qmax() const {
    if (q.format == QFormat::int8) return 127;
    return mini().max;
  }
  int code(float u, std::int64_t i) const {
    // Stochastic rounding (meant for gradients) in the forward cast (sii-research/Metis #2).
    const double d = f == fault("stochastic_rounding_forward") ? dither_of(u, i) : -1;
    if (q.format == QFormat::int8) return to_int8(u, d);
    const Mini m = mini();
    // vLLM's clamp with fminf/fmaxf before the cast: fminf(NaN, 448) = 448 (quant_utils.cuh).
    if (f == fault("nan_encoded_as_max") && std::isnan(u)) return to_mini(m.max, m);
    // The packed float2 -> E4M3 cast through bfloat16 (FlashInfer #4167, #5128).
    if (f == fault("bf16_round_trip_before_fp8") && ref::element_of(q.format) == ref::Elem::e4m3fn)
      u = static_cast<float>(ref::round_to(u, DType::bfloat16));
    return to_mini(u, m, d);
  }
  float apply(float p, float s) const {
    switch (q.apply) {
      case ref::ScaleApply::reciprocal: return p * (1.0f / s);
      case ref::ScaleApply::divide:  // a reciprocal multiply where the contract divides (pypto-lib #866)
        return f == fault("reciprocal_for_divide") ? p * (1.0f / s) : p / s;
      case ref::ScaleApply::multiply: return p * s;
    }
    return p;
  }
  float dynamic_scale(float amax) const {
    const float s = std::fmin(amax, static_cast<float>(q.scale_ub)) / static_cast<float>(qmax());
    // The min-scale clamp dropped: an all-zero row gets scale 0 and 0/0 = NaN codes.
    if (f == fault("min_scale_missing")) return s;
    return std::fmax(s, static_cast<float>(q.min_scale));
  }
  // The E8M0 code of a block's amax (NaN-free; NaN and Inf blocks are handled by the caller).
  int mx_code(float amax) const {
    const ref::MxRule rule = f == fault("mx_rule_swapped")
                                 ? (q.mx_rule == ref::MxRule::floor ? ref::MxRule::round_up : ref::MxRule::floor)
                                 : q.mx_rule;
    if (rule == ref::MxRule::floor) {  // OCP: floor(log2 amax) - emax_elem; amax 0 as FP32_MIN_NORMAL
      const int lg = amax == 0 ? -126 : std::ilogb(amax);
      const int e = lg - ref::elem_emax(ref::element_of(q.format));
      return e > 127 ? 0xFF : std::max(e, -127) + 127;
    }
    const float t = amax * (1.0f / static_cast<float>(mini().max));  // cvt.rp.satfinite.ue8m0
    if (std::isinf(t)) return 0xFE;
    if (t <= std::ldexp(1.0f, -127)) return 0;
    int e = 0;
    const float fr = std::frexp(t, &e);
    const int up = fr == 0.5f ? e - 1 : e;
    return std::min(up, 127) + 127;
  }
};

float amax_of(const std::vector<float>& p, std::int64_t first, std::int64_t n, bool* finite) {
  float a = 0;
  for (std::int64_t i = first; i < first + n; ++i) {
    const float v = p[static_cast<std::size_t>(i)];
    if (!std::isfinite(v)) *finite = false;
    a = std::fmax(a, std::fabs(v));  // fmaxf drops NaN
  }
  return a;
}

// The flat index of element k of MX block b: 32 consecutive elements along the normalized dim,
// or (mx_block_wrong_dim) along the column-major order, so a block spans rows (Primus-Turbo
// #373: a row-wise flag read wrong).
struct MxBlocks {
  std::int64_t rows, cols, bs;
  bool wrong_dim;
  std::int64_t at(std::int64_t b, std::int64_t k) const {
    const std::int64_t t = b * bs + k;
    return wrong_dim ? (t % rows) * cols + t / rows : t;
  }
};

}  // namespace

Outputs run_quant(const ref::Case& c, Reduction r, Fault f) {
  const ref::QuantContract& q = *c.quant;
  ref::Case n = ref::quant_norm_case(c);
  // The rounding to the activation dtype elided: the float32 value quantized (vLLM #37838,
  // TensorRT-LLM #14464).
  if (f == fault("activation_rounding_elided")) n.dtype_out = DType::float32;
  // A fault of the norm (classes A-G) is the norm kernel's; those of class H are applied here.
  const Fault norm_fault = is_quant_fault(f) ? Fault{} : f;
  Outputs norm = run_kernel(n, r, norm_fault);
  const ref::Geometry g = ref::geometry_of(c);
  const std::int64_t total = g.rows * g.cols;
  std::vector<float> p(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) p[static_cast<std::size_t>(i)] = static_cast<float>(norm.at("y").data[i]);
  // amax over the float32 norm output where the contract takes it over y in T (TransformerEngine
  // #2355): the scales come from values the kernel does not quantize.
  std::vector<float> p_unrounded;
  if (f == fault("amax_unrounded") && n.dtype_out != DType::float32) {
    ref::Case n32 = n;
    n32.dtype_out = DType::float32;
    const ref::Tensor y32 = run_kernel(n32, r, norm_fault).at("y");
    p_unrounded.assign(y32.data.begin(), y32.data.end());
  }
  const std::vector<float>& pa = p_unrounded.empty() ? p : p_unrounded;  // what amax is taken of
  const Quantizer qz{q, f};
  Outputs out;
  ref::Tensor codes = make_tensor(DType::float64, g.shape);
  auto put = [&](std::int64_t i, float u) { codes.data[static_cast<std::size_t>(i)] = qz.code(u, i); };
  const int bs = ref::block_size(q.format);
  std::vector<std::int64_t> bshape = g.shape;
  if (bs) bshape.back() /= bs;
  switch (q.scale) {
    case ScaleKind::static_tensor: {
      const float s = static_cast<float>(c.inputs.at("scale").data[0]);
      for (std::int64_t i = 0; i < total; ++i) put(i, qz.apply(p[i], s));
      if (q.amax) {
        bool fin = true;
        out["amax"] = make_tensor(DType::float32, {1});
        out["amax"].data[0] = amax_of(pa, 0, total, &fin);
      }
      break;
    }
    case ScaleKind::dynamic_token: {
      ref::Tensor scale = make_tensor(DType::float32, g.stat_shape), amax = scale;
      for (std::int64_t row = 0; row < g.rows; ++row) {
        bool fin = true;
        const float a = amax_of(pa, row * g.cols, g.cols, &fin), s = qz.dynamic_scale(a);
        scale.data[row] = s;
        amax.data[row] = a;
        for (std::int64_t i = row * g.cols; i < (row + 1) * g.cols; ++i) put(i, qz.apply(p[i], s));
      }
      out["scale"] = std::move(scale);
      if (q.amax) out["amax"] = std::move(amax);
      break;
    }
    case ScaleKind::mx_block: {
      ref::Tensor scale = make_tensor(DType::float64, bshape), amax = make_tensor(DType::float32, bshape);
      const MxBlocks blocks{g.rows, g.cols, bs, f == fault("mx_block_wrong_dim")};
      for (std::int64_t b = 0; b < total / bs; ++b) {
        bool fin = true;
        float a = 0;
        for (std::int64_t k = 0; k < bs; ++k) {
          const float v = pa[static_cast<std::size_t>(blocks.at(b, k))];
          if (!std::isfinite(v)) fin = false;
          a = std::fmax(a, std::fabs(v));  // fmaxf drops NaN
        }
        const int e8 = fin ? qz.mx_code(a) : 0xFF;  // OCP: a NaN or Inf makes the block NaN
        scale.data[b] = e8;
        amax.data[b] = a;
        for (std::int64_t k = 0; k < bs; ++k) {
          const std::int64_t i = blocks.at(b, k);
          put(i, e8 == 0xFF ? NAN : std::ldexp(p[i], 127 - e8));
        }
      }
      out["scale"] = std::move(scale);
      if (q.amax) out["amax"] = std::move(amax);
      break;
    }
    case ScaleKind::nvfp4_block: {  // TE core_nvfp4.cuh
      ref::Tensor scale = make_tensor(DType::float64, bshape), global = make_tensor(DType::float32, {1});
      bool fin = true;
      const float ag = amax_of(pa, 0, total, &fin);
      float s_enc = ag == 0 ? 1.0f : std::fmin(448.0f * 6.0f / ag, FLT_MAX);
      if (s_enc == 0 || !std::isfinite(s_enc)) s_enc = 1.0f;
      global.data[0] = s_enc;
      for (std::int64_t b = 0; b < total / bs; ++b) {
        bool bf = true;
        const float ab = amax_of(pa, b * bs, bs, &bf);
        const int sc = to_mini(ab * (s_enc * (1.0f / 6.0f)), kE4M3);
        scale.data[b] = sc;
        const float t = static_cast<float>(from_e4m3(sc)) * (1.0f / s_enc);
        const float mult = t == 0 ? 0.0f : std::fmin(1.0f / t, FLT_MAX);
        for (std::int64_t i = b * bs; i < (b + 1) * bs; ++i) put(i, p[i] * mult);
      }
      out["scale"] = std::move(scale);
      out["global_scale"] = std::move(global);
      if (q.amax) {
        out["amax"] = make_tensor(DType::float32, {1});
        out["amax"].data[0] = ag;
      }
      break;
    }
  }
  out["q"] = std::move(codes);
  if (c.residual != ref::Residual::none) out["residual_out"] = std::move(norm.at("residual_out"));
  if (q.y) {
    if (n.dtype_out == c.dtype_out) {
      out["y"] = std::move(norm.at("y"));
    } else {
      ref::Case ny = ref::quant_norm_case(c);
      ny.dtype_out = c.dtype_out;
      out["y"] = std::move(run_kernel(ny, r, norm_fault).at("y"));
    }
  }
  return out;
}

}  // namespace normcheck::conf::cpu::detail
