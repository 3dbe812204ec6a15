#include "cpu_candidates.hpp"

#include <fmt/core.h>

#include <array>
#include <stdexcept>
#include <utility>

#include "normcheck/judge/faults.hpp"

namespace normcheck::conf::cpu {

namespace {

using R = Reduction;
using F = Fault;

// The table of candidates. Every mutant is the two-pass kernel (welford_merge: Welford's) with
// exactly the faulty line(s) changed; its name is mut_<id> of the fault it has in the fault
// catalogue (normcheck/judge/faults.hpp, docs/FAULTS.md), which gives its class and description.
constexpr std::array kSpecs{
    CpuSpec{"cpu_two_pass", R::two_pass, F::none},
    CpuSpec{"cpu_welford", R::welford, F::none},
    CpuSpec{"cpu_pairwise", R::pairwise, F::none},
    CpuSpec{"mut_eps_outside_sqrt", R::two_pass, F::eps_outside_sqrt},
    CpuSpec{"mut_eps_in_denominator", R::two_pass, F::eps_in_denominator},
    CpuSpec{"mut_eps_hardcoded", R::two_pass, F::eps_hardcoded},
    CpuSpec{"mut_eps_dropped", R::two_pass, F::eps_dropped},
    CpuSpec{"mut_eps_fp16", R::two_pass, F::eps_fp16},
    CpuSpec{"mut_one_pass_variance", R::two_pass, F::one_pass_variance},
    CpuSpec{"mut_unbiased_variance", R::two_pass, F::unbiased_variance},
    CpuSpec{"mut_padding_lanes", R::two_pass, F::padding_lanes},
    CpuSpec{"mut_fp16_accumulation", R::two_pass, F::fp16_accumulation},
    CpuSpec{"mut_welford_merge", R::welford, F::welford_merge},
    CpuSpec{"mut_wrong_axis", R::two_pass, F::wrong_axis},
    CpuSpec{"mut_last_dim_only", R::two_pass, F::last_dim_only},
    CpuSpec{"mut_rms_centred", R::two_pass, F::rms_centred},
    CpuSpec{"mut_weight_not_broadcast", R::two_pass, F::weight_not_broadcast},
    CpuSpec{"mut_weight_before_downcast", R::two_pass, F::weight_before_downcast},
    CpuSpec{"mut_offset_in_param_dtype", R::two_pass, F::offset_in_param_dtype},
    CpuSpec{"mut_rstd_bf16", R::two_pass, F::rstd_bf16},
    CpuSpec{"mut_h_kept_unrounded", R::two_pass, F::h_kept_unrounded},
    CpuSpec{"mut_fused_add_rounds_h", R::two_pass, F::fused_add_rounds_h},
    CpuSpec{"mut_residual_out_missing_bias", R::two_pass, F::residual_out_missing_bias},
    CpuSpec{"mut_residual_out_overwritten", R::two_pass, F::residual_out_overwritten},
    CpuSpec{"mut_pre_ln_residual_after_norm", R::two_pass, F::pre_ln_residual_after_norm},
    CpuSpec{"mut_deepnorm_alpha_on_f", R::two_pass, F::deepnorm_alpha_on_f},
    CpuSpec{"mut_post_ln_double_norm", R::two_pass, F::post_ln_double_norm},
    CpuSpec{"mut_dweight_bf16_reduction", R::two_pass, F::dweight_bf16_reduction},
    CpuSpec{"mut_dweight_warp_width", R::two_pass, F::dweight_warp_width},
    CpuSpec{"mut_dgamma_wrong_index", R::two_pass, F::dgamma_wrong_index},
    CpuSpec{"mut_rows_beyond_grid_limit", R::two_pass, F::rows_beyond_grid_limit},
    CpuSpec{"mut_activation_rounding_elided", R::two_pass, F::activation_rounding_elided},
    CpuSpec{"mut_e5m2_clamped_448", R::two_pass, F::e5m2_clamped_448},
    CpuSpec{"mut_nan_encoded_as_max", R::two_pass, F::nan_encoded_as_max},
    CpuSpec{"mut_mx_rule_swapped", R::two_pass, F::mx_rule_swapped},
    CpuSpec{"mut_min_scale_missing", R::two_pass, F::min_scale_missing},
    CpuSpec{"mut_e4m3fnuz_max", R::two_pass, F::e4m3fnuz_max},
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
  caps.quant = true;
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
  if (s.fault != F::none) {
    const FaultEntry* f = find_fault(name_of(s.fault));
    if (!f || f->by != Reproduced::mutant)  // cpu_kernels_test's catalogue test names the row
      throw std::logic_error(fmt::format("{}: no mutant row in the fault catalogue", s.name));
    i.fault_id = std::string(f->id);
    i.fault_class = std::string(1, f->cls);
    i.fault = fault_line(*f);
  }
  i.caps = cpu_caps();
  // The reduction class (conformance/TOLERANCE.md, section 9) of the kernel's sums (arith.hpp):
  // two-pass sequential sums; Welford updates. A mutant declares the class of the kernel it is
  // built on, as its author would: the fault is what breaks it. The pairwise kernel declares
  // nothing: its column sums' final combination of levels is not a balanced tree, so the
  // pairwise depth is not proven for them (../reduction/README.md).
  if (s.reduction == R::two_pass) i.caps.reduction = conf::Reduction{conf::ReductionKind::two_pass, 0};
  if (s.reduction == R::welford) i.caps.reduction = conf::Reduction{conf::ReductionKind::welford, 0};
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
