// The bundled CPU kernels: straightforward LayerNorm/RMSNorm kernels (forward, backward, fused
// residual add, residual blocks) in the case's compute dtype, and the same kernels with one
// deliberate fault each (the mutants). README.md in this folder lists them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/fault_table.hpp"
#include "normcheck/reference/case.hpp"

namespace normcheck::conf::cpu {

// How every sum is formed (row statistics, backward row means, column sums over rows).
enum class Reduction : std::uint8_t {
  two_pass,  // sequential sums: mean, then sum((h - mean)^2) in a second pass
  welford,   // sequential Welford updates of a running mean (and M2)
  pairwise,  // recursive pairwise (tree) sums over sequential blocks of kPairwiseBase
};

// One fault real kernels shipped, applied to the two-pass kernel (welford_merge to Welford's):
// a row of the fault catalogue reproduced by a mutant (normcheck/judge/fault_table.hpp), held as
// its row index. Fault{} is none: the correct kernel. A kernel's faulty line tests
// `f == fault("<id>")`, and the mutants are made from the catalogue's rows (cpu_candidates.cpp),
// so a new mutant is its catalogue row, its faulty line and a test.
class Fault {
 public:
  constexpr Fault() = default;
  constexpr explicit Fault(std::size_t row) : row_(static_cast<std::uint8_t>(row)) {}
  constexpr bool none() const { return row_ == kNone; }
  constexpr const FaultEntry& entry() const { return kFaultRows[row_]; }  // not for none()
  friend constexpr bool operator==(Fault, Fault) = default;

 private:
  static constexpr std::uint8_t kNone = 0xff;
  std::uint8_t row_ = kNone;
};

// The fault with catalogue id `id`. Evaluated at compile time: an id the catalogue does not
// have, or has as dialect only, does not compile (the throw is not a constant expression).
consteval Fault fault(std::string_view id) {
  for (std::size_t i = 0; i < kFaultRows.size(); ++i) {
    if (kFaultRows[i].id != id) continue;
    if (kFaultRows[i].by != Reproduced::mutant) throw "this catalogue row is dialect only: a mutant needs `mutant`";
    return Fault(i);
  }
  throw "no row of the fault catalogue has this id";
}

// Whether a fault is one of the quantization step (class H): applied after the norm.
constexpr bool is_quant_fault(Fault f) { return !f.none() && f.entry().cls == 'H'; }

inline constexpr int kPairwiseBase = 8;               // sequential block of the pairwise sums
inline constexpr std::int64_t kGridRowLimit = 65535;  // rows_beyond_grid_limit
inline constexpr std::int64_t kColumnSumRows = 1024;  // dweight_first_rows_only

std::string_view name_of(Reduction r);
std::string_view name_of(Fault f);

// Computes every output of output_specs(c), each value rounded to its output's dtype.
// Throws ref::CaseError for a case it cannot read (missing input, wrong sizes, bad contract).
Outputs run_kernel(const ref::Case& c, Reduction r, Fault f = Fault{});

}  // namespace normcheck::conf::cpu
