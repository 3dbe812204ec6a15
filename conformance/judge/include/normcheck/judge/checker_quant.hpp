// The checker for quantized outputs (fused norm + quantization, reference/README.md "Quantized
// outputs"): verdicts on codes, scales, global scales and amax, derived in TOLERANCE.md,
// section 10. The value p a kernel hands to the scale is a value of the contract's dtype T
// (dtype_out, or float32) within the tolerance model's allowance of y; every later step is the
// contract's exact float32 arithmetic, so the codes a correct kernel can give are those of the
// values of T within that allowance, and nothing else.
#pragma once

#include "normcheck/judge/checker.hpp"

namespace normcheck::conf {

// At most this many accepted flips are explained one by one in OutputResult::flips (all are
// counted in flips_accepted).
inline constexpr std::size_t kMaxFlipsExplained = 8;

// Judges a case whose `quant` is set: q (codes), scale, global_scale and amax by the rules of
// TOLERANCE.md section 10, y and residual_out by the plain checker under the allowances of the
// norm part (ref::quant_norm_case). Codes the fixture does not certify (certified/q == 0: the
// contract leaves them to the kernel) are accepted and counted as uncertified. A scale within
// its allowance but different from the certified one makes the codes of its row or block be
// judged against the candidate's scale (OutputResult::own_scale); a scale beyond it FAILS and its
// codes are judged against the certified scale.
CaseResult check_quant_case(const fix::FixtureCase& fc, const Outputs& got, const CheckOptions& opt = {});

}  // namespace normcheck::conf
