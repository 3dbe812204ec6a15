#include "cpu_candidates.hpp"

#include <fmt/core.h>

#include <array>
#include <utility>

namespace normcheck::conf::cpu {

namespace {

using R = Reduction;
using F = Fault;

// The table of candidates. Every mutant is the two-pass kernel (welford_merge: Welford's) with
// exactly the faulty line(s) changed; README.md has the same table with the inputs that show it.
constexpr std::array kSpecs{
    CpuSpec{"cpu_two_pass", R::two_pass, F::none, "", ""},
    CpuSpec{"cpu_welford", R::welford, F::none, "", ""},
    CpuSpec{"cpu_pairwise", R::pairwise, F::none, "", ""},
    // A. Epsilon
    CpuSpec{"mut_eps_outside_sqrt", R::two_pass, F::eps_outside_sqrt, "A",
            "eps added to the standard deviation outside the sqrt, (h-mu)/(sigma+eps) "
            "(codertimo/BERT-pytorch #30)"},
    CpuSpec{"mut_eps_in_denominator", R::two_pass, F::eps_in_denominator, "A",
            "eps added to the element count, rsqrt(sum/(N+eps)), instead of to the variance (LeetCUDA #309)"},
    CpuSpec{"mut_eps_hardcoded", R::two_pass, F::eps_hardcoded, "A",
            "eps hard-coded to 1e-6 instead of the configured value (llama.cpp #2373)"},
    CpuSpec{"mut_eps_dropped", R::two_pass, F::eps_dropped, "A",
            "eps dropped by a fusion (0): constant rows give 0 * inf = NaN (onnxruntime #3768, TIM-VX #589)"},
    CpuSpec{
        "mut_eps_fp16", R::two_pass, F::eps_fp16, "A",
        "eps converted to float16 before use: 1e-12 underflows to 0, zero rows give NaN (pytorch #41527)"},
    // B. Variance and reductions
    CpuSpec{"mut_one_pass_variance", R::two_pass, F::one_pass_variance, "B",
            "variance as E[h^2] - E[h]^2 in the compute dtype: cancellation when |mean| >> sigma (pytorch "
            "#51102)"},
    CpuSpec{"mut_unbiased_variance", R::two_pass, F::unbiased_variance, "B",
            "unbiased variance sum((h-mu)^2)/(N-1) in a LayerNorm (lbann #2024)"},
    CpuSpec{"mut_padding_lanes", R::two_pass, F::padding_lanes, "B",
            "variance pass over next_pow2(N) lanes, masked lanes loaded as 0 add (P-N)*mu^2 (triton #9838, "
            "Liger-Kernel #518)"},
    CpuSpec{"mut_fp16_accumulation", R::two_pass, F::fp16_accumulation, "B",
            "row sums accumulated in float16: the sum of squares overflows for |x| > 256 (pytorch #133085)"},
    CpuSpec{
        "mut_welford_merge", R::welford, F::welford_merge, "B",
        "two half-row Welford partials merged with equal weights 1/2 and N/4: wrong for odd N (Welford merge "
        "bugs, the parallel-statistics class of apex #1184)"},
    // C. Axis and shape
    CpuSpec{"mut_wrong_axis", R::two_pass, F::wrong_axis, "C",
            "statistics over every dim but the first for rank > 2, normalized_shape taken as 'all but batch' "
            "(espnet "
            "#3183)"},
    CpuSpec{"mut_last_dim_only", R::two_pass, F::last_dim_only, "C",
            "statistics over the last dim only, the axis/axes attribute not honoured (onnxruntime #26407)"},
    CpuSpec{"mut_rms_centred", R::two_pass, F::rms_centred, "C",
            "RMSNorm computed with mean centring (keras #21234)"},
    CpuSpec{
        "mut_weight_not_broadcast", R::two_pass, F::weight_not_broadcast, "C",
        "gamma/beta laid along x's memory order instead of broadcast over a non-last axis (keras #19643)"},
    // D. Mixed precision
    CpuSpec{"mut_weight_before_downcast", R::two_pass, F::weight_before_downcast, "D",
            "weight multiplied in fp32 before the downcast where the contract casts x-hat first "
            "(transformers #33133 "
            "vs TransformerEngine #1132)"},
    CpuSpec{"mut_offset_in_param_dtype", R::two_pass, F::offset_in_param_dtype, "D",
            "Gemma scale (1 + w) computed in the weight dtype (bf16) instead of fp32 (transformers #29402)"},
    CpuSpec{"mut_rstd_bf16", R::two_pass, F::rstd_bf16, "D",
            "inv_rms rounded to bfloat16 before the multiply, a coherent error per norm (amd/IRON #139)"},
    CpuSpec{
        "mut_h_kept_unrounded", R::two_pass, F::h_kept_unrounded, "D",
        "statistics from the fp32 x + residual where the contract rounds h to the residual dtype first (the "
        "unfused path of vllm #52104)"},
    // E. Residual and placement
    CpuSpec{"mut_fused_add_rounds_h", R::two_pass, F::fused_add_rounds_h, "E",
            "fused add rounds h = x + residual to the activation dtype before the statistics (vllm #52104)"},
    CpuSpec{"mut_residual_out_missing_bias", R::two_pass, F::residual_out_missing_bias, "E",
            "residual output (input + skip + bias sum) written without its bias (onnxruntime #14156)"},
    CpuSpec{"mut_residual_out_overwritten", R::two_pass, F::residual_out_overwritten, "E",
            "fp32 input normalized in place, so the residual aliasing it holds x-hat (nano-vllm #170)"},
    CpuSpec{"mut_pre_ln_residual_after_norm", R::two_pass, F::pre_ln_residual_after_norm, "E",
            "Pre-LN residual taken after the norm: u' = Norm(u) + F(Norm(u)) (pytorch #61165)"},
    CpuSpec{"mut_deepnorm_alpha_on_f", R::two_pass, F::deepnorm_alpha_on_f, "E",
            "DeepNorm alpha applied to the sublayer, Norm(u + alpha F(u)) "
            "(labmlai/annotated_deep_learning_paper_implementations #145)"},
    CpuSpec{
        "mut_post_ln_double_norm", R::two_pass, F::post_ln_double_norm, "E",
        "Post-LN stack followed by another LayerNorm: the block output normalized twice (pytorch #74092)"},
    // G. Backward and launch limits
    CpuSpec{"mut_dweight_bf16_reduction", R::two_pass, F::dweight_bf16_reduction, "G",
            "dweight/dbias partial sums over blocks of rows reduced in bfloat16 (Liger-Kernel #950)"},
    CpuSpec{
        "mut_dweight_warp_width", R::two_pass, F::dweight_warp_width, "G",
        "gamma/beta backward with a hard-coded 64-wide block on 32-lane warps: columns 32..63 of every 64 "
        "dropped (pytorch #183861)"},
    CpuSpec{"mut_dgamma_wrong_index", R::two_pass, F::dgamma_wrong_index, "G",
            "dgamma from x-hat rebuilt with gamma/beta at the row's lane of the tile instead of the column "
            "(DeepSpeed #692)"},
    CpuSpec{"mut_rows_beyond_grid_limit", R::two_pass, F::rows_beyond_grid_limit, "G",
            "launch grid capped at 65535 rows: rows from 65535 on never computed (apex #411)"},
};

std::string describe(const CpuSpec& s) {
  const std::string_view style = s.reduction == R::two_pass
                                     ? "two-pass (sequential mean, then sum of squared deviations)"
                                 : s.reduction == R::welford ? "Welford (running mean and M2)"
                                                             : "pairwise (tree sums over blocks of 8)";
  if (s.fault == F::none)
    return fmt::format("CPU LayerNorm/RMSNorm, {} statistics, arithmetic in the case's compute dtype", style);
  return fmt::format("CPU {} kernel with one deliberate fault ({}); correct elsewhere", style,
                     name_of(s.fault));
}

Capabilities cpu_caps() {
  using ref::DType;
  Capabilities caps;
  caps.dtypes = {DType::float64, DType::float32, DType::float16, DType::bfloat16};
  caps.compute_dtypes = caps.dtypes;
  caps.contracts = {"*"};
  caps.residual = true;
  caps.blocks = true;
  caps.general_axes = true;
  caps.weight_offset = true;
  caps.device = "cpu";
  return caps;
}

class CpuCandidate final : public Candidate {
 public:
  CpuCandidate(CandidateInfo info, Reduction r, Fault f) : info_(std::move(info)), r_(r), f_(f) {}
  const CandidateInfo& info() const override { return info_; }
  Outputs run(const ref::Case& c) override {
    try {
      return run_kernel(c, r_, f_);
    } catch (const std::exception& e) {  // a case it cannot read, or out of memory
      throw CandidateError(fmt::format("{}: {}", info_.name, e.what()));
    }
  }

 private:
  CandidateInfo info_;
  Reduction r_;
  Fault f_;
};

CandidateInfo info_of(const CpuSpec& s) {
  CandidateInfo i;
  i.name = fmt::format("builtin:{}", s.name);
  i.kind = s.fault == F::none ? CandidateKind::correct : CandidateKind::mutant;
  i.description = describe(s);
  i.fault_class = std::string(s.fault_class);
  i.fault = std::string(s.fault_text);
  i.caps = cpu_caps();
  return i;
}

template <std::size_t I>
std::unique_ptr<Candidate> make() {
  return std::make_unique<CpuCandidate>(info_of(kSpecs[I]), kSpecs[I].reduction, kSpecs[I].fault);
}

template <std::size_t... I>
std::vector<BuiltinEntry> entries(std::index_sequence<I...>) {
  return {BuiltinEntry{info_of(kSpecs[I]), &make<I>}...};
}

}  // namespace

std::string_view name_of(Fault f) {
  if (f == F::none) return "none";
  for (const auto& s : kSpecs)
    if (s.fault == f) return s.name.substr(4);  // after "mut_"
  return "?";
}

const std::vector<CpuSpec>& cpu_specs() {
  static const std::vector<CpuSpec> v(kSpecs.begin(), kSpecs.end());
  return v;
}

const std::vector<BuiltinEntry>& cpu_builtins() {
  static const std::vector<BuiltinEntry> v = entries(std::make_index_sequence<kSpecs.size()>{});
  return v;
}

}  // namespace normcheck::conf::cpu
