// The bundled CPU candidates: three correct kernels (two-pass, Welford, pairwise) and the
// mutants, each the two-pass kernel with one fault real kernels shipped (README.md's table).
#pragma once

#include <string_view>
#include <vector>

#include "kernels.hpp"
#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf::cpu {

// What one built-in CPU candidate is.
struct CpuSpec {
  std::string_view name;  // after "builtin:"
  Reduction reduction;
  Fault fault;                   // Fault::none for the correct kernels
  std::string_view fault_class;  // "A" .. "G"; empty for the correct kernels
  std::string_view fault_text;   // the fault in one line, with its public issue
};
const std::vector<CpuSpec>& cpu_specs();

// The registry entries ("builtin:cpu_two_pass", ..., "builtin:mut_<fault>"), in cpu_specs() order.
const std::vector<BuiltinEntry>& cpu_builtins();

}  // namespace normcheck::conf::cpu
