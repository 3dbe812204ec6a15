// The tolerance model: for every element of every output of a case, the largest error that any
// correct algorithm in the case's compute dtype can make (any summation order; two-pass,
// Welford or pairwise statistics), from a forward error analysis. conformance/TOLERANCE.md
// derives each bound; the constants live in one table, kBounds, in tolerance.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::conf {

// The outputs of a case are the reference's (reference/outputs.hpp); the judge's interfaces
// name them in this namespace.
using ref::Outputs;
using ref::OutputSpec;
using ref::output_specs;

// The constants of the derivation (TOLERANCE.md, "The table").
struct BoundConstants {
  double welford;      // |dvar| <= welford * n * u * kappa * var: Welford's first-order term
  double sqrt_div;     // rstd from q: sqrt and division (or rsqrt) within sqrt_div * u (2 ulp)
  double mistrust;     // an output is MISTRUSTED where the bound on x-hat (or rel. rstd) >= this
  // Section 9 (declared reduction classes):
  double f64_result;   // accumulate_f64: roundings of a binary64 sum's result into the compute dtype
  double exact_round;  // an exact sum of squares: roundings (a margin; the division by 2^k is exact)
  // Section 10 (quantized outputs):
  double quant_slop;   // relative widening of p's interval: y recovered from expected_f64/q in binary64
};
extern const BoundConstants kBounds;

// Allowance of one output: per element, the absolute error a correct candidate may make
// against the exact value (expected_f64). NaN marks a MISTRUSTED element.
struct OutputAllowance {
  std::vector<double> abs;
  // 1 where NaN is accepted whatever the reference says: elements of rows that hold a NaN or
  // an infinity, where the IEEE result depends on the order of operations (a Welford mean of a
  // row with +inf meets inf - inf). A number there must still match the reference.
  std::vector<std::uint8_t> nan_ok;
  std::int64_t mistrusted = 0;  // elements with NaN allowance
  std::string reason;           // why they are mistrusted, with the numbers of the worst row
};

// How a candidate declares it reduces (TOLERANCE.md, section 9, "Declared reduction class"):
// `any` holds it to every correct algorithm (the default); the other classes narrow the
// algorithms it may use and so the bound. The numbers are part of the plugin ABI
// (candidate.h NC_REDUCTION_*).
enum class ReductionKind : std::uint32_t {
  any = 0,             // any summation order; two-pass, Welford or merged statistics
  two_pass = 1,        // mean = sum / n, then the sum of squared deviations; sums in any order
  welford = 2,         // Welford's running mean and M2, sequential or chunks merged by Chan's formula
  pairwise = 3,        // two-pass, each sum over groups of <= block terms, then a balanced tree
  blocked = 4,         // two-pass, each sum over groups of <= block terms, then the group sums
  accumulate_f64 = 5,  // two-pass or Welford with every sum accumulated in binary64
};
struct Reduction {
  ReductionKind kind = ReductionKind::any;
  std::int64_t block = 0;  // pairwise / blocked: the most terms a group holds (>= 1)
  bool is_any() const { return kind == ReductionKind::any; }
  friend bool operator==(const Reduction&, const Reduction&) = default;
  friend auto operator<=>(const Reduction&, const Reduction&) = default;
};
// "any", "two_pass", "welford", "pairwise:128", "blocked:8", "accumulate_f64".
std::string name_of(const Reduction& r);
// Parses name_of's form; throws std::invalid_argument naming the problem (an unknown class, a
// missing or non-positive block size, a block size on a class that has none).
Reduction parse_reduction(std::string_view s);

// A tensor-parallel all-reduce of the row statistics' partial sums (TOLERANCE.md, section 11):
// each of `ranks` ranks sums its part of the row in the compute dtype, and the partials of every
// row sum (LayerNorm's sum of h and of squared deviations, RMSNorm's sum of squares; backward,
// the sums of g and g x-hat) are added by an all-reduce that rounds each partial and each add to
// `dtype`, flushing that dtype's subnormals to zero where `flush_subnormals`. A plain (unsharded)
// case has ranks = 1: no term.
struct StatsAllReduce {
  int ranks = 1;
  ref::DType dtype = ref::DType::float32;
  bool flush_subnormals = false;
  // Whether it adds anything to the model: 2 or more ranks, and a dtype narrower than the
  // compute dtype or a flush (an all-reduce in the compute dtype is one more summation order).
  bool active(ref::DType compute) const;
};

// Derives the allowances of every output of `c` (the outputs of ref::output_specs) from its
// inputs. Rows holding a non-finite value are compared under IEEE rules (an allowance of half
// an ulp plus one compute rounding). `red` is the candidate's declared reduction class: `any`
// (the default) gives the bound of every correct algorithm. Throws ref::CaseError for an
// invalid case.
std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c, const Reduction& red = {});
// The same, for a case whose row statistics are all-reduced over tensor-parallel ranks (`ar`):
// section 11's term added to every row sum (plain norms only; a block throws ref::CaseError).
std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c, const Reduction& red,
                                                         const StatsAllReduce& ar);

// Spacing of the dtype's values at |v| (the ulp of v's binade; subnormal spacing below it).
// Inline: the checker and the allowances take it for every element.
inline double ulp_of(double v, ref::DType t) {
  const auto f = ref::format_of(t);
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  // The binade from the exponent field (binary64 subnormals are far below every min_exp here).
  int e = static_cast<int>((bits >> 52) & 0x7ff);
  e = e == 0x7ff ? f.max_exp : std::max(e - 1023, f.min_exp);
  const int q = e - f.precision + 1;  // >= -1074 for every format here: a normal binary64 or 2^-1074
  if (q < -1022) return std::ldexp(1.0, q);
  const std::uint64_t r = static_cast<std::uint64_t>(q + 1023) << 52;
  double out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

}  // namespace normcheck::conf
