// The bundled CPU kernels: straightforward LayerNorm/RMSNorm kernels (forward, backward, fused
// residual add, residual blocks) in the case's compute dtype, and the same kernels with one
// deliberate fault each (the mutants). README.md in this folder lists them.
#pragma once

#include <cstdint>
#include <string_view>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/reference/case.hpp"

namespace normcheck::conf::cpu {

// How every sum is formed (row statistics, backward row means, column sums over rows).
enum class Reduction : std::uint8_t {
  two_pass,  // sequential sums: mean, then sum((h - mean)^2) in a second pass
  welford,   // sequential Welford updates of a running mean (and M2)
  pairwise,  // recursive pairwise (tree) sums over sequential blocks of kPairwiseBase
};

// One fault real kernels shipped, applied to the two-pass kernel (welford_merge to Welford's).
// `none` is the correct kernel. The comment names the faulty line; each value is named like its
// id in the fault catalogue (normcheck/judge/faults.hpp), which gives its description and issues.
enum class Fault : std::uint8_t {
  none,
  // A. Epsilon
  eps_outside_sqrt,    // rstd = 1 / (sqrt(var) + eps)
  eps_in_denominator,  // rstd = 1 / sqrt(sum / (N + eps))
  eps_hardcoded,       // eps = 1e-6 whatever the case says
  eps_dropped,         // eps = 0
  eps_fp16,            // eps rounded to float16 before use (1e-12 -> 0)
  // B. Variance and reductions
  one_pass_variance,  // var = sum(h^2)/N - mean^2
  unbiased_variance,  // var = sum((h - mean)^2) / (N - 1)
  padding_lanes,      // second pass over the next power of two lanes, zero-padded
  fp16_accumulation,  // row sums accumulated in float16
  welford_merge,      // two half-row Welford partials merged with equal weights
  // C. Axis and shape
  wrong_axis,            // statistics over dims [1, rank) for rank > 2 ("all but batch")
  last_dim_only,         // statistics over the last dim only, axis/axes ignored
  rms_centred,           // RMSNorm subtracts the mean
  weight_not_broadcast,  // weight/bias indexed in x's memory order (flat index mod N)
  // D. Mixed precision
  weight_before_downcast,  // the xhat rounding point skipped: weight applied in fp32
  offset_in_param_dtype,   // (offset + w) rounded to dtype_param
  rstd_bf16,               // rstd rounded to bfloat16 before the multiply
  h_kept_unrounded,        // the h rounding point skipped: statistics from the fp32 h
  // E. Residual and placement
  fused_add_rounds_h,          // h rounded to dtype_x before the statistics
  residual_out_missing_bias,   // residual_out = alpha*x + residual, without residual_bias
  residual_out_overwritten,    // fp32: residual_out holds xhat (normalized in place)
  pre_ln_residual_after_norm,  // pre block: u' = Norm(u) + F(Norm(u))
  deepnorm_alpha_on_f,         // deepnorm block: u' = Norm(u + alpha F(u))
  post_ln_double_norm,         // post block: an extra (non-affine) Norm after the last layer
  // G. Backward (and launch limits)
  dweight_bf16_reduction,  // dweight/dbias partials over blocks of 16 rows summed in bfloat16
  dweight_warp_width,      // dweight/dbias of columns 32..63 of every 64 dropped (0)
  dgamma_wrong_index,      // dweight's xhat rebuilt from y with gamma/beta of a transposed index
  rows_beyond_grid_limit,  // rows from 65535 on never computed (outputs 0)
  // H. Quantization (fused norm + quantization cases only; quant_kernel.cpp)
  activation_rounding_elided,  // the float32 value quantized where the contract rounds to dtype_out
  e5m2_clamped_448,            // E5M2 values clamped at +-448 (E4M3's max) before the cast
  nan_encoded_as_max,          // fminf(NaN, max) = max: a NaN element encodes as +max
  mx_rule_swapped,             // the MX floor and round-up scale rules exchanged
  min_scale_missing,           // dynamic scale without its min_scale clamp: amax 0 gives NaN codes
  e4m3fnuz_max,                // E4M3FNUZ's max (240) used for E4M3FN: clamp and qmax
};

// Whether a fault is one of the quantization step (class H): applied after the norm.
constexpr bool is_quant_fault(Fault f) { return f >= Fault::activation_rounding_elided; }

inline constexpr int kPairwiseBase = 8;               // sequential block of the pairwise sums
inline constexpr std::int64_t kGridRowLimit = 65535;  // rows_beyond_grid_limit

std::string_view name_of(Reduction r);
std::string_view name_of(Fault f);

// Computes every output of output_specs(c), each value rounded to its output's dtype.
// Throws ref::CaseError for a case it cannot read (missing input, wrong sizes, bad contract).
Outputs run_kernel(const ref::Case& c, Reduction r, Fault f = Fault::none);

}  // namespace normcheck::conf::cpu
