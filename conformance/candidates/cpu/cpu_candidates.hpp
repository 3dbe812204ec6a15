// The bundled CPU candidates: three correct kernels (two-pass, Welford, pairwise) and the
// mutants, each the two-pass kernel with one fault of the fault catalogue (docs/FAULTS.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kernels.hpp"
#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf::cpu {

// What one built-in CPU candidate is.
struct CpuSpec {
  std::string name;  // after "builtin:": cpu_two_pass ..., or mut_<its fault's catalogue id>
  Reduction reduction;
  Fault fault;  // Fault{} for the correct kernels
};
// The three correct kernels, then one mutant per catalogue row reproduced by a mutant, in
// catalogue order.
const std::vector<CpuSpec>& cpu_specs();

// The registry entries ("builtin:cpu_two_pass", ..., "builtin:mut_<fault>"), in cpu_specs() order.
const std::vector<BuiltinEntry>& cpu_builtins();

}  // namespace normcheck::conf::cpu
