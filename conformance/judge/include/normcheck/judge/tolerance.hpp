// The tolerance model: for every element of every output of a case, the largest error that any
// correct algorithm in the case's compute dtype can make (any summation order; two-pass,
// Welford or pairwise statistics), from a forward error analysis. conformance/TOLERANCE.md
// derives each bound; the constants live in one table, kBounds, in tolerance.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
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

// Derives the allowances of every output of `c` (the outputs of ref::output_specs) from its
// inputs. Rows holding a non-finite value are compared under IEEE rules (an allowance of half
// an ulp plus one compute rounding). Throws ref::CaseError for an invalid case.
std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c);

// Spacing of the dtype's values at |v| (the ulp of v's binade; subnormal spacing below it).
double ulp_of(double v, ref::DType t);

}  // namespace normcheck::conf
