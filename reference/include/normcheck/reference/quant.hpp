// Fused norm + quantization: the quantization contract as data, the code formats, and exact
// conversion into them. README.md ("Quantized outputs") gives every choice with the kernels that
// make it and their source files.
//
// Nothing here depends on the norm: the pieces are exact functions of values the contract makes
// exact (a value of the activation dtype or of float32, a float32 scale), so every code, scale
// and boundary below is decided by comparisons and by products with powers of two, which are
// exact in binary64.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/reference/enum_table.hpp"

namespace normcheck::ref {

// The stored output format of the quantized tensor `q`.
enum class QFormat : std::uint8_t { float8_e4m3fn, float8_e5m2, int8, mxfp8_e4m3, mxfp8_e5m2, nvfp4_e2m1 };
// How the scale is obtained.
enum class ScaleKind : std::uint8_t {
  static_tensor,  // one float32 scale, an input (`inputs/scale`, shape [1])
  dynamic_token,  // one float32 scale per row: max(min(amax, ub) / qmax, min_scale)
  mx_block,       // one E8M0 scale per 32 consecutive elements of the normalized dim
  nvfp4_block,    // one E4M3 scale per 16 elements, times a float32 global scale 448*6/amax
};
// R1 / R2: is the residual sum h = x + residual rounded to the residual dtype before the norm?
enum class ResidualSum : std::uint8_t { rounded, unrounded };
// Q1 / Q2: the value quantized is the norm output rounded to the activation dtype (dtype_out),
// or rounded to float32 (a kernel that never rounds to the activation dtype).
enum class QuantValue : std::uint8_t { activation, float32 };
// How the float32 scale is applied to the value v (static and dynamic scales):
//   reciprocal: rn32(v * rn32(1/scale))   (vLLM static, vLLM int8, FlashInfer)
//   divide:     rn32(v / scale)           (vLLM dynamic per-token FP8)
//   multiply:   rn32(v * scale)           (TransformerEngine: the scale is the multiplier)
enum class ScaleApply : std::uint8_t { reciprocal, divide, multiply };
// MX shared exponent: OCP floor(log2 amax) - emax_elem, or TE/FlashInfer's round-up of
// amax * rn32(1/max) to a power of two (cvt.rp.satfinite.ue8m0).
enum class MxRule : std::uint8_t { floor, round_up };
// Code of a NaN value: the format's NaN code (E4M3FN 0x7F, E5M2 0x7F; the judge may accept any
// NaN code), or "unspecified" (the code of a NaN element is not judged). int8 and E2M1 have no
// NaN: their NaN elements are always unspecified.
enum class NanPolicy : std::uint8_t { nan_code, unspecified };

// The value tables (enum_table.hpp): a new value of any of these is one row here.
template <>
struct EnumTable<QFormat> {
  static constexpr std::array rows{
      Named<QFormat>{QFormat::float8_e4m3fn, "float8_e4m3fn"}, Named<QFormat>{QFormat::float8_e5m2, "float8_e5m2"},
      Named<QFormat>{QFormat::int8, "int8"},                   Named<QFormat>{QFormat::mxfp8_e4m3, "mxfp8_e4m3"},
      Named<QFormat>{QFormat::mxfp8_e5m2, "mxfp8_e5m2"},       Named<QFormat>{QFormat::nvfp4_e2m1, "nvfp4_e2m1"}};
};
template <>
struct EnumTable<ScaleKind> {
  static constexpr std::array rows{Named<ScaleKind>{ScaleKind::static_tensor, "static_tensor"},
                                   Named<ScaleKind>{ScaleKind::dynamic_token, "dynamic_token"},
                                   Named<ScaleKind>{ScaleKind::mx_block, "mx_block"},
                                   Named<ScaleKind>{ScaleKind::nvfp4_block, "nvfp4_block"}};
};
template <>
struct EnumTable<ResidualSum> {
  static constexpr std::array rows{Named<ResidualSum>{ResidualSum::rounded, "rounded"},
                                   Named<ResidualSum>{ResidualSum::unrounded, "unrounded"}};
};
template <>
struct EnumTable<QuantValue> {
  static constexpr std::array rows{Named<QuantValue>{QuantValue::activation, "activation"},
                                   Named<QuantValue>{QuantValue::float32, "float32"}};
};
template <>
struct EnumTable<ScaleApply> {
  static constexpr std::array rows{Named<ScaleApply>{ScaleApply::reciprocal, "reciprocal"},
                                   Named<ScaleApply>{ScaleApply::divide, "divide"},
                                   Named<ScaleApply>{ScaleApply::multiply, "multiply"}};
};
template <>
struct EnumTable<MxRule> {
  static constexpr std::array rows{Named<MxRule>{MxRule::floor, "floor"}, Named<MxRule>{MxRule::round_up, "round_up"}};
};
template <>
struct EnumTable<NanPolicy> {
  static constexpr std::array rows{Named<NanPolicy>{NanPolicy::nan_code, "nan_code"},
                                   Named<NanPolicy>{NanPolicy::unspecified, "unspecified"}};
};

inline std::string_view name_of(QFormat f) { return enum_name(f); }
inline std::string_view name_of(ScaleKind k) { return enum_name(k); }
inline std::string_view name_of(ResidualSum r) { return enum_name(r); }
inline std::string_view name_of(QuantValue v) { return enum_name(v); }
inline std::string_view name_of(ScaleApply a) { return enum_name(a); }
inline std::string_view name_of(MxRule r) { return enum_name(r); }
inline std::string_view name_of(NanPolicy p) { return enum_name(p); }
inline std::optional<QFormat> parse_qformat(std::string_view s) { return enum_parse<QFormat>(s); }
inline std::optional<ScaleKind> parse_scale_kind(std::string_view s) { return enum_parse<ScaleKind>(s); }
inline std::optional<ResidualSum> parse_residual_sum(std::string_view s) { return enum_parse<ResidualSum>(s); }
inline std::optional<QuantValue> parse_quant_value(std::string_view s) { return enum_parse<QuantValue>(s); }
inline std::optional<ScaleApply> parse_scale_apply(std::string_view s) { return enum_parse<ScaleApply>(s); }
inline std::optional<MxRule> parse_mx_rule(std::string_view s) { return enum_parse<MxRule>(s); }
inline std::optional<NanPolicy> parse_nan_policy(std::string_view s) { return enum_parse<NanPolicy>(s); }

// The quantization contract of a case: every point where real kernels differ, named.
struct QuantContract {
  QFormat format = QFormat::float8_e4m3fn;
  ScaleKind scale = ScaleKind::static_tensor;
  ResidualSum residual_sum = ResidualSum::rounded;
  QuantValue value = QuantValue::activation;
  ScaleApply apply = ScaleApply::reciprocal;
  MxRule mx_rule = MxRule::floor;
  NanPolicy nan = NanPolicy::nan_code;
  // dynamic_token: scale = max(rn32(min(amax, scale_ub) / qmax), min_scale). scale_ub = inf is
  // no bound; min_scale must be a float32 value (vLLM: rn32(1/(448*512)) FP8, FLT_EPSILON int8).
  double scale_ub = std::numeric_limits<double>::infinity();
  double min_scale = 0;
  bool amax = false;      // the kernel also writes amax (per tensor, per row or per block)
  bool y = false;         // the kernel also writes y in dtype_out
  std::string preset;     // the preset it started from ("" if none), for provenance only
};

// Named presets (the kernels they model are in README.md): vllm_static_fp8,
// vllm_fused_add_static_fp8, vllm_dynamic_fp8, vllm_dynamic_int8, flashinfer_fp8,
// flashinfer_fused_add_fp8, te_delayed_fp8, te_mxfp8, ocp_mxfp8, te_nvfp4.
const std::vector<std::pair<std::string, QuantContract>>& quant_presets();
std::optional<QuantContract> quant_preset(std::string_view name);

// ---- element formats ---------------------------------------------------------------------
enum class Elem : std::uint8_t { e4m3fn, e5m2, int8, e2m1, e8m0 };
Elem element_of(QFormat f);
std::string_view name_of(Elem e);
int block_size(QFormat f);        // 32 (MX), 16 (NVFP4), 0 otherwise
// Largest finite value: 448, 57344, 127, 6, 2^127.
double elem_max(Elem e);
// emax_elem of the OCP MX spec: the exponent of the largest normal (E4M3 8, E5M2 15, E2M1 2).
int elem_emax(Elem e);
// Decoded value of a code (E8M0: 2^(code-127), 0xFF NaN; int8: the code is the signed value).
// Codes out of range for the format (E2M1 > 15) give NaN.
double decode(Elem e, int code);
bool is_nan_code(Elem e, int code);
int nan_code(Elem e);  // -1 when the format has none (int8, E2M1)

// Round-to-nearest-even with saturation to the largest finite value (+-Inf saturate too; E5M2
// with SATFINITE never produces its infinity), of the exact binary64 value v. NaN gives the NaN
// code (or 0 for int8 and E2M1, which have none: callers mark those elements unspecified).
// int8 saturates at +-127 (the symmetric range of the contract).
int encode(Elem e, double v);

// The decision boundaries of a format, ascending: each is the midpoint between two adjacent
// values (or the saturation point, half an ulp above the largest finite one, where the code
// stops changing). A value strictly between two boundaries has one code; a value on a boundary
// is a tie broken by RNE (or saturates).
const std::vector<double>& boundaries(Elem e);

// Codes reachable by any value in [lo, hi] (lo <= hi, finite): the codes at lo and at hi and
// whether a boundary lies in [lo, hi]. `certain` when lo and hi give the same code and no
// boundary lies strictly inside or on an end (on an end: a tie, RNE decides, but any error moves
// it). This is what a judge calls with the allowance of the pre-quantization value.
struct CodeRange {
  int lo_code = 0, hi_code = 0;
  bool certain = true;
};
CodeRange code_range(Elem e, double lo, double hi);

// Packing of NVFP4: element 2k in the low nibble (bits 0-3) of byte k, element 2k+1 in the
// high nibble (bits 4-7), the order of PTX cvt.rn.satfinite.e2m1x2.f32 d, a, b (b, the
// first element, in the low half) and of TransformerEngine's and FlashInfer's fp4 buffers.
std::vector<std::uint8_t> pack_nvfp4(const std::vector<int>& codes);  // even count
std::vector<int> unpack_nvfp4(const std::vector<std::uint8_t>& bytes);

// ---- scales ------------------------------------------------------------------------------
// qmax of a format for dynamic scales: 448, 57344, 127.
double dynamic_qmax(QFormat f);
// The default min_scale of a dynamic scale: vLLM's rn32(1/(qmax*512)) for FP8, FLT_EPSILON for
// int8.
double default_min_scale(QFormat f);
// The dynamic per-row scale from the row's amax (a float32 value, NaN-free): float32.
double dynamic_scale(double amax, const QuantContract& q);
// The MX shared exponent (E8M0 code = exponent + 127) of a block from its amax (float32 value,
// >= 0, NaN-free): OCP floor rule (amax 0 -> as FP32_MIN_NORMAL, clamped to -127; > 127 is the
// NaN code 0xFF), or the round-up rule (amax 0 -> 0x00; clamped to 0xFE, satfinite).
int mx_scale_code(double amax, Elem elem, MxRule rule);
// NVFP4 global encode scale S_enc = rn32(448*6 / amax_g) (float32; 1 when amax_g is 0 or the
// quotient is 0 or not finite), TE's compute_global_encode_scaling_factor_FP4.
double nvfp4_global_scale(double amax_g);
// NVFP4 block scale code (E4M3FN) = e4m3(rn32(amax_b * rn32(S_enc * rn32(1/6)))).
int nvfp4_block_scale_code(double amax_b, double s_enc);
// The multiplier applied to the block's elements: rn32(1 / rn32(S_b * rn32(1/S_enc))) capped at
// FLT_MAX, or 0 when S_b is 0 (TE core_nvfp4.cuh).
double nvfp4_element_multiplier(int scale_code, double s_enc);

// The float32 value handed to the conversion for a value v (float32 value) under a
// static/dynamic scale: rn32(v * rn32(1/scale)), rn32(v / scale) or rn32(v * scale).
double apply_scale(double v, double scale, ScaleApply a);

}  // namespace normcheck::ref
