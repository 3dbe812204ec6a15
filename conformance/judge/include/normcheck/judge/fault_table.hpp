// The rows of the fault catalogue (faults.hpp), as constant data: the catalogue's functions read
// them, and the bundled CPU mutants are made from them at compile time (a mutant is
// `builtin:mut_<id>` for each row reproduced by one, and its kernels test `fault("<id>")`, which
// does not compile for an id without such a row: conformance/candidates/cpu/kernels.hpp).
//
// A new fault is a row here, and then either a mutant (the row says `mutant`; the faulty line in
// the CPU kernels and a test) or a panel row that names it (judge/diagnosis/panel.cpp). The text
// and refs of a mutant's row are its `fault` metadata ("text (refs)").
#pragma once

#include <array>

#include "normcheck/judge/faults.hpp"

namespace normcheck::conf {
namespace catalogue_rows {

using enum Reproduced;

inline constexpr std::array kFaults{
    // A. Epsilon
    FaultEntry{"eps_outside_sqrt", 'A', "`rstd = 1/(sqrt(var) + eps)`",
               "eps added to the standard deviation outside the sqrt, (h-mu)/(sigma+eps)",
               "codertimo/BERT-pytorch #30", "variance 1e-4 eps (`*_var_below_eps_*`)", mutant},
    FaultEntry{"eps_outside_sqrt_unbiased", 'A', "`rstd = 1/(s + eps)`, s the N-1 standard deviation",
               "eps outside the sqrt of the unbiased variance, the tutorials' (x - mean)/(x.std(-1) + eps)",
               "annotated-transformer copies, CNTK #3816", "", dialect_only},
    FaultEntry{"eps_in_denominator", 'A', "`rstd = 1/sqrt(sum/(N + eps))`",
               "eps added to the element count, rsqrt(sum/(N+eps)), instead of to the variance",
               "LeetCUDA #309", "variance 1e-4 eps", mutant},
    FaultEntry{"eps_hardcoded", 'A', "eps = 1e-6 always", "eps hard-coded to 1e-6 instead of the configured value",
               "llama.cpp #2373", "N(0, 0.003) rows, eps 1e-5 (`*_eps1e-05_*`)", mutant},
    FaultEntry{"eps_dropped", 'A', "eps = 0", "eps dropped by a fusion (0): constant rows give 0 * inf = NaN",
               "onnxruntime #3768, TIM-VX #589", "constant rows: NaN instead of the bias", mutant},
    FaultEntry{"eps_fp16", 'A', "eps rounded to float16 (1e-12 -> 0)",
               "eps converted to float16 before use: 1e-12 underflows to 0, zero rows give NaN", "pytorch #41527",
               "zero float16 rows, eps 1e-12 (`*_f16_zeros_eps1e-12_*`)", mutant, "eps_missing"},
    // B. Variance and reductions
    FaultEntry{"one_pass_variance", 'B', "`var = E[h^2] - E[h]^2`",
               "variance as E[h^2] - E[h]^2 in the compute dtype: cancellation when |mean| >> sigma",
               "pytorch #51102", "mean 1000, sigma 1 (`ln_*_cond*`, `*_mean1e4_*`)", mutant},
    FaultEntry{"unbiased_variance", 'B', "`var = sum((h-mu)^2)/(N - 1)`",
               "unbiased variance sum((h-mu)^2)/(N-1) in a LayerNorm", "lbann #2024", "any LayerNorm; N = 4",
               mutant},
    FaultEntry{"padding_lanes", 'B', "variance pass over next_pow2(N) zero-padded lanes",
               "variance pass over next_pow2(N) lanes, masked lanes loaded as 0 add (P-N)*mu^2",
               "triton #9838, Liger-Kernel #518", "N = 17, mean 1 (`ln_*_h17`)", mutant},
    FaultEntry{"fp16_accumulation", 'B', "row sums accumulated in float16",
               "row sums accumulated in float16: the sum of squares overflows for |x| > 256", "pytorch #133085",
               "abs(x) in [256, 2000]: x^2 overflows (`*_fp16_overflow_*`)", mutant},
    FaultEntry{"bf16_accumulation", 'B', "row sums accumulated in bfloat16",
               "row sums (mean, sum of squares) held in bfloat16 between additions", "", "", dialect_only},
    FaultEntry{"welford_merge", 'B', "two half-row Welford partials merged with weights 1/2, N/4",
               "two half-row Welford partials merged with equal weights 1/2 and N/4: wrong for odd N",
               "Welford merge bugs, the parallel-statistics class of apex #1184",
               "odd N with a trend, x_i = i (`*_h17`, `*_h127`)", mutant},
    FaultEntry{"rstd_holds_std", 'B', "the rstd output holds sqrt(var + eps)",
               "the saved statistic is the standard deviation where the interface says rstd", "", "",
               dialect_only},
    FaultEntry{"rstd_holds_variance", 'B', "the rstd output holds var",
               "the saved statistic is the variance where the interface says rstd", "", "", dialect_only},
    // C. Axis and shape
    FaultEntry{"wrong_axis", 'C', "statistics over dims [1, rank) for rank > 2",
               "statistics over every dim but the first for rank > 2, normalized_shape taken as 'all but batch'",
               "espnet #3183", "[2, 3, 4] over the last dim (`*_axis_*`)", mutant},
    FaultEntry{"last_dim_only", 'C', "statistics over the last dim, axis ignored",
               "statistics over the last dim only, the axis/axes attribute not honoured", "onnxruntime #26407",
               "[2, 3, 4], axis -2 (`*_axis_m2_*`)", mutant},
    FaultEntry{"rms_centred", 'C', "RMSNorm subtracts the mean", "RMSNorm computed with mean centring",
               "keras #21234", "RMSNorm rows of mean 5", mutant},
    FaultEntry{"layernorm_uncentred", 'C', "LayerNorm without mean centring (an RMSNorm)",
               "LayerNorm computed without mean centring", "", "", dialect_only},
    FaultEntry{"weight_not_broadcast", 'C', "gamma/beta indexed in x's memory order",
               "gamma/beta laid along x's memory order instead of broadcast over a non-last axis", "keras #19643",
               "axes [1] of [2, 3, 4] (`*_axes_1_*`)", mutant},
    // D. Mixed precision
    FaultEntry{"weight_before_downcast", 'D', "llama's x-hat rounding skipped",
               "weight multiplied in fp32 before the downcast where the contract casts x-hat first",
               "transformers #33133 vs TransformerEngine #1132",
               "llama contract, bfloat16 x, float32 out (`rms_bf16_w32_o32_llama_fwd`)", mutant,
               "contract_point_skipped other_contract"},
    FaultEntry{"offset_in_param_dtype", 'D', "`1 + w` rounded to the weight dtype",
               "Gemma scale (1 + w) computed in the weight dtype (bf16) instead of fp32", "transformers #29402",
               "gemma contract, bfloat16 w, float32 out (no ci case today: with a bfloat16 output it is about 1 ulp)", mutant,
               "other_contract"},
    FaultEntry{"rstd_bf16", 'D', "rstd rounded to bfloat16 before the multiply",
               "inv_rms rounded to bfloat16 before the multiply, a coherent error per norm", "amd/IRON #139",
               "any float32 case", mutant},
    FaultEntry{"rstd_fp16", 'D', "rstd rounded to float16 before the multiply",
               "rstd rounded to float16 before the multiply", "", "", dialect_only},
    FaultEntry{"stats_saved_in_x_dtype", 'D', "mean and rstd saved in x's half dtype",
               "mean and rstd saved for the backward in the input's half-precision dtype instead of float32: "
               "the returned statistics and the backward's x-hat carry its rounding",
               "flagos-ai/FlagGems #221",
               "float16/bfloat16 x with float32 statistics: the mean/rstd outputs (`ln_f16_normal`, `rms_bf16_normal`), dweight of a backward", mutant},
    FaultEntry{"fp16_output_truncated", 'D', "float16 y truncated toward zero, not rounded to nearest even",
               "float16 output converted by truncation (the extra significand bits dropped, round toward "
               "zero) instead of round to nearest even",
               "dmlc/mshadow #368 (float2half), pocl/pocl #2211 (pocl_float_to_half)",
               "float16 y under a declared class (`ln_f16_*`, `*_f16_prod_*`): an exact y just below a "
               "float16 value is truncated a whole ulp down",
               mutant},
    FaultEntry{"h_kept_unrounded", 'D', "fused_add_lowp's h rounding skipped",
               "statistics from the fp32 x + residual where the contract rounds h to the residual dtype first",
               "the unfused path of vllm #52104", "`rms_fused_add_lowp_bf16_fwd`", mutant,
               "contract_point_skipped other_contract"},
    FaultEntry{"contract_point_skipped", 'D', "one rounding point of the case's contract left out",
               "a rounding point of the precision contract skipped", "", "", dialect_only},
    FaultEntry{"other_contract", 'D', "the rounding points of another built-in contract",
               "the casts of another precision contract than the model's", "transformers #38131", "",
               dialect_only},
    // E. Residual and placement
    FaultEntry{"residual_not_added", 'E', "`h = alpha x (+ residual_bias)`",
               "the residual never added before the norm", "", "", dialect_only},
    FaultEntry{"residual_after_norm", 'E', "`y = Norm(alpha x + rb) + residual`",
               "the residual added after the norm instead of before", "", "", dialect_only},
    FaultEntry{"alpha_on_residual", 'E', "`h = x + alpha residual`",
               "the DeepNorm/residual scale alpha applied to the residual instead of x", "", "", dialect_only},
    FaultEntry{"fused_add_rounds_h", 'E', "h rounded to dtype_x before the statistics",
               "fused add rounds h = x + residual to the activation dtype before the statistics", "vllm #52104",
               "bfloat16 x, float32 residual and out (`rms_bf16_res32_*`)", mutant},
    FaultEntry{"residual_out_missing_bias", 'E', "residual_out without residual_bias",
               "residual output (input + skip + bias sum) written without its bias", "onnxruntime #14156",
               "`*_add_bias_*`, residual_out", mutant},
    FaultEntry{"residual_out_overwritten", 'E', "float32: residual_out holds x-hat (in-place normalize)",
               "fp32 input normalized in place, so the residual aliasing it holds x-hat", "nano-vllm #170",
               "float32 fused add, residual_out", mutant, "residual_out_holds_y"},
    FaultEntry{"residual_out_holds_y", 'E', "residual_out overwritten with y",
               "the residual output written to the wrong slot: it holds the norm's output", "onnxruntime #17320",
               "", dialect_only},
    FaultEntry{"pre_ln_residual_after_norm", 'E', "pre block `u' = Norm(u) + F(Norm(u))`",
               "Pre-LN residual taken after the norm: u' = Norm(u) + F(Norm(u))", "pytorch #61165",
               "`*_pre_*` blocks", mutant},
    FaultEntry{"deepnorm_alpha_on_f", 'E', "deepnorm `u' = Norm(u + alpha F(u))`",
               "DeepNorm alpha applied to the sublayer, Norm(u + alpha F(u))",
               "labmlai/annotated_deep_learning_paper_implementations #145", "`*_deepnorm_*` blocks (alpha != 1)",
               mutant},
    FaultEntry{"post_ln_double_norm", 'E', "post block output normalized again",
               "Post-LN stack followed by another LayerNorm: the block output normalized twice", "pytorch #74092",
               "`*_post_*` blocks", mutant},
    // F. Parameters as loaded
    FaultEntry{"weight_missing", 'F', "weight not applied (scale 1)",
               "the weight lost in loading or renamed and re-initialized to 1", "transformers #29554", "",
               dialect_only},
    FaultEntry{"bias_missing", 'F', "bias not added", "the bias lost in loading or renamed and re-initialized to 0",
               "transformers #29554", "", dialect_only},
    FaultEntry{"weight_bias_swapped", 'F', "weight and bias exchanged", "weight and bias loaded into each other's slot",
               "", "", dialect_only},
    FaultEntry{"affine_reinitialized", 'F', "neither weight nor bias applied (scale 1, shift 0)",
               "gamma/beta renamed to weight/bias in loading and both silently re-initialized to 1 and 0",
               "transformers #29554", "", dialect_only},
    FaultEntry{"bias_before_weight", 'F', "`(x-hat + bias) * weight`", "the bias added before the weight multiply",
               "", "", dialect_only},
    FaultEntry{"offset_missing", 'F', "scale w where the convention is offset + w",
               "a zero-centred weight (Gemma's 1 + w) used without its offset", "llama.cpp #23758, NeMo #7523", "",
               dialect_only},
    FaultEntry{"offset_doubled", 'F', "scale 2 offset + w",
               "the +1 baked into the weights by a converter and applied again by the loader",
               "llama.cpp #5631, vllm #26189, #31464, #37220", "", dialect_only},
    FaultEntry{"offset_spurious", 'F', "scale 1 + w for weights that hold the scale",
               "an offset 1 + w applied to weights converted to hold the scale itself", "llama.cpp #23758", "",
               dialect_only},
    // G. Backward and launch limits
    FaultEntry{"dx_without_mean_term", 'G', "`dx = rstd (g - x-hat mean(g x-hat))`",
               "dx without the mean(g) term", "", "", dialect_only},
    FaultEntry{"dx_without_projection_term", 'G', "`dx = rstd (g - mean(g))`",
               "dx without the x-hat mean(g x-hat) term", "", "", dialect_only},
    FaultEntry{"dweight_bf16_reduction", 'G', "dW/dB partials over 16 rows summed in bfloat16",
               "dweight/dbias partial sums over blocks of rows reduced in bfloat16", "Liger-Kernel #950",
               "any backward with float32 or float64 parameters", mutant},
    FaultEntry{"dweight_warp_width", 'G', "dW/dB of columns 32..63 of every 64 dropped",
               "gamma/beta backward with a hard-coded 64-wide block on 32-lane warps: columns 32..63 of every 64 "
               "dropped",
               "pytorch #183861", "backward with more than 32 columns", mutant},
    FaultEntry{"dgamma_wrong_index", 'G', "dW's x-hat rebuilt with gamma/beta of the row's tile lane",
               "dgamma from x-hat rebuilt with gamma/beta at the row's lane of the tile instead of the column",
               "DeepSpeed #692", "backward with unequal weights", mutant},
    FaultEntry{"dweight_first_rows_only", 'G', "dweight/dbias summed over the first 1024 rows only",
               "column sums (dweight, dbias) over the rows one launch grid covers, the first 1024, the rest never added",
               "the silent partial-grid class of ROCm/rocm-libraries #10198 and PaddlePaddle #31144; lavapipe's "
               "shader loop limit under ggml-vulkan, the first 21845 rows (docs/FINDINGS.md#lavapipe-loop-limit)",
               "backward over more than 1024 rows (`*_prod_rows1040_bwd`)", mutant},
    FaultEntry{"rows_beyond_grid_limit", 'G', "rows from 65535 on never computed",
               "launch grid capped at 65535 rows: rows from 65535 on never computed", "apex #411", "`*_rows65537`",
               mutant},
    // H. Quantization (fused norm + quantization; the quant tier, `fixtures/cases/quant.json`)
    FaultEntry{"activation_rounding_elided", 'H', "the float32 norm output quantized where the contract rounds it to T",
               "the rounding of the norm output to the activation dtype elided before the FP8 cast: 1-ulp code flips",
               "vllm #37838, TensorRT-LLM #14464", "`q_vllm_*` bfloat16 and float16 cases", mutant},
    FaultEntry{"e5m2_clamped_448", 'H', "E5M2 values clamped at +-448 before the cast",
               "E5M2 output clamped at E4M3's max (448) instead of 57344", "flashinfer #2612, #4056",
               "`q_static_e5m2_*`, `q_ocp_mxfp8_e5m2_*` (values above 448)", mutant},
    FaultEntry{"nan_encoded_as_max", 'H', "`fminf(NaN, 448)`: a NaN encodes as +448",
               "a clamp with fminf/fmaxf before the FP8 cast (added against overflow NaNs, as in transformers #42775 "
               "and pytorch #160957; vLLM's quant_utils.cuh clamps so) turns a NaN element into +448",
               "transformers #42775, pytorch #160957", "`q_*_bf16_nan_row` (static FP8 presets)", mutant},
    FaultEntry{"mx_rule_swapped", 'H', "the MX floor and round-up scale rules exchanged",
               "E8M0 block scale by another rounding rule than the contract's (OCP floor against cvt.rp round-up): "
               "saturation where it must not, or none where it must",
               "ml-explore/mlx #4353, ROCm/aiter #3212, jax-ml/ml_dtypes #298",
               "`q_*mxfp8*_bf16_straddle_saturation`, `q_*mxfp8*_normal`", mutant},
    FaultEntry{"min_scale_missing", 'H', "dynamic scale without its min_scale clamp",
               "per-token scale amax / qmax without the minimum: an all-zero row gets scale 0 and 0/0 = NaN codes",
               "huggingface/kernels-community #681, InternLM/lmdeploy #3652", "`q_vllm_dynamic_*_bf16_zero_rows`",
               mutant},
    FaultEntry{"e4m3fnuz_max", 'H', "E4M3FNUZ's max (240) used for E4M3FN",
               "the two E4M3 variants' maxima confused: E4M3FN values clamped at 240 and dynamic scales of amax / 240",
               "modelscope/DiffSynth-Studio #1528", "`q_vllm_dynamic_fp8_*`, static FP8 cases with values above 240",
               mutant},
    FaultEntry{"bf16_round_trip_before_fp8", 'H', "the scaled value rounded to bfloat16 before the E4M3 cast",
               "a packed float2 to E4M3 cast that goes through bfloat16 after the scale is applied (TRT-LLM's "
               "cudaTypeUtils.cuh, as vendored by FlashInfer): a second rounding that moves values across E4M3 "
               "code boundaries",
               "flashinfer #4167, #5128", "the float32-value presets (`q_flashinfer_fp8_*`, `q_te_delayed_fp8_*`)",
               mutant},
    FaultEntry{"amax_unrounded", 'H', "amax over the float32 norm output where the contract takes it over y in T",
               "the fused amax taken on the compute-type value instead of the output-type value the codes are made "
               "from: per-token and block scales (and the amax output) from values the kernel never quantizes",
               "NVIDIA/TransformerEngine #2355", "`q_vllm_dynamic_*`, `q_te_nvfp4_*` (bfloat16 and float16)", mutant},
    FaultEntry{"reciprocal_for_divide", 'H', "`u = p * rn32(1/s)` where the contract divides `u = p / s`",
               "a reciprocal multiply where the contract's kernel divides: the quotient differs by an ulp, enough to "
               "cross a code boundary",
               "hw-native-sys/pypto-lib #866", "`q_vllm_dynamic_fp8_bf16_midpoints` (y / 7 on E4M3 midpoints)", mutant},
    FaultEntry{"mx_block_wrong_dim", 'H', "MX blocks of 32 consecutive elements of the column-major order",
               "the MX block taken along the other dimension (an axis or row-wise flag read wrong): each E8M0 scale "
               "covers elements of several rows",
               "AMD-AGI/Primus-Turbo #373, flashinfer #3882", "`q_*mxfp8*_*` with more than one row", mutant},
    FaultEntry{"stochastic_rounding_forward", 'H', "codes rounded stochastically",
               "stochastic rounding, meant for gradients, applied to the forward codes: a code may be the far "
               "neighbour of the value",
               "sii-research/Metis #2", "any quantized case", mutant},
};

static_assert(kFaults.size() < 255, "cpu::Fault holds a row index in 8 bits");

}  // namespace catalogue_rows

// Every row, in catalogue order (class order).
inline constexpr const auto& kFaultRows = catalogue_rows::kFaults;

}  // namespace normcheck::conf
