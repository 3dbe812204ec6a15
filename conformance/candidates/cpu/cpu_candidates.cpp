#include "cpu_candidates.hpp"

#include <fmt/core.h>

#include <array>
#include <stdexcept>
#include <utility>

#include "normcheck/judge/fault_table.hpp"

namespace normcheck::conf::cpu {

namespace {

using R = Reduction;

// The candidates: the correct kernels, then a mutant for every row of the fault catalogue
// reproduced by one (normcheck/judge/fault_table.hpp), named mut_<id>, which gives its class and
// description. Every mutant is the two-pass kernel with exactly the faulty line(s) changed
// (`f == fault("<id>")` in the kernels), except a fault of Welford's merge, which only Welford's
// kernel has.
constexpr std::array kCorrect{
    std::pair{std::string_view("cpu_two_pass"), R::two_pass},
    std::pair{std::string_view("cpu_welford"), R::welford},
    std::pair{std::string_view("cpu_pairwise"), R::pairwise},
};

constexpr R mutant_base(Fault f) { return f == fault("welford_merge") ? R::welford : R::two_pass; }

std::vector<CpuSpec> make_specs() {
  std::vector<CpuSpec> v;
  for (const auto& [name, r] : kCorrect) v.push_back(CpuSpec{std::string(name), r, Fault{}});
  for (std::size_t i = 0; i < kFaultRows.size(); ++i) {
    if (kFaultRows[i].by != Reproduced::mutant) continue;
    const Fault f(i);
    v.push_back(CpuSpec{fmt::format("mut_{}", kFaultRows[i].id), mutant_base(f), f});
  }
  return v;
}

std::string describe(const CpuSpec& s) {
  const std::string_view style = s.reduction == R::two_pass
                                     ? "two-pass (sequential mean, then sum of squared deviations)"
                                 : s.reduction == R::welford ? "Welford (running mean and M2)"
                                                             : "pairwise (tree sums over blocks of 8)";
  if (s.fault.none())
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
  for (const auto& row : ref::EnumTable<ref::QFormat>::rows) caps.quant_formats.push_back(row.value);
  for (const auto& row : ref::EnumTable<ref::ScaleKind>::rows) caps.quant_scales.push_back(row.value);
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
  i.kind = s.fault.none() ? CandidateKind::correct : CandidateKind::mutant;
  i.description = describe(s);
  if (!s.fault.none()) {
    const FaultEntry& f = s.fault.entry();
    i.fault_id = std::string(f.id);
    i.fault_class = std::string(1, f.cls);
    i.fault = fault_line(f);
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

}  // namespace

std::string_view name_of(Fault f) { return f.none() ? "none" : f.entry().id; }

const std::vector<CpuSpec>& cpu_specs() {
  static const std::vector<CpuSpec> v = make_specs();
  return v;
}

const std::vector<BuiltinEntry>& cpu_builtins() {
  static const std::vector<BuiltinEntry> v = [] {
    std::vector<BuiltinEntry> out;
    for (const auto& s : cpu_specs())
      out.push_back(BuiltinEntry{info_of(s), [s] { return std::make_unique<CpuCandidate>(info_of(s), s.reduction, s.fault); }});
    return out;
  }();
  return v;
}

}  // namespace normcheck::conf::cpu
