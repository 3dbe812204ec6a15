// The checker for quantized outputs (fused norm + quantization, reference/README.md "Quantized
// outputs"): verdicts on codes, scales, global scales and amax, derived in TOLERANCE.md,
// section 10. The value p a kernel hands to the scale is a value of the contract's dtype T
// (dtype_out, or float32) within the tolerance model's allowance of y; every later step is the
// contract's exact float32 arithmetic, so the codes a correct kernel can give are those of the
// values of T within that allowance, and nothing else.
#pragma once

#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/diagnosis.hpp"

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

// Which quantization fault (class H) explains a quantized case that check_quant_case FAILED
// (`judged` is its result): each dialect is the contract's quantization with one catalogue fault,
// run on the certified norm output rounded as the contract says (DIAGNOSIS.md, "Quantized
// outputs"). Best first, at most opt.keep; empty for a case that is not a FAILED quantized one or
// that the emulation cannot read (never throws). It evaluates the case's norm part with the
// reference once.
std::vector<Diagnosis> diagnose_quant(const fix::FixtureCase& fc, const Outputs& got, const CaseResult& judged,
                                      const DiagnoseOptions& opt = {});

// The quantization dialects (class H), in catalogue order; dialect_panel() lists them after the
// norm's.
const std::vector<DialectInfo>& quant_dialect_panel();

}  // namespace normcheck::conf
