// The registry of built-in candidates: each family of bundled kernels contributes its entries
// (README.md lists the folders): the CPU kernels and mutants linked in, the adapters started on
// first use (torch/, onnxruntime/), and the bundled plugins found beside the executable.
#include "normcheck/conformance/candidate.hpp"
#include "candidates/bundled_plugins.hpp"
#include "candidates/cpu/cpu_candidates.hpp"
#include "candidates/onnxruntime/onnxruntime_candidates.hpp"
#include "candidates/torch/torch_candidate.hpp"

namespace normcheck::conf {

const std::vector<BuiltinEntry>& builtin_candidates() {
  static const std::vector<BuiltinEntry> all = [] {
    std::vector<BuiltinEntry> v;
    v.insert(v.end(), cpu::cpu_builtins().begin(), cpu::cpu_builtins().end());
    for (auto& e : torch_builtins()) v.push_back(std::move(e));
    for (auto& e : bundled_plugin_entries()) v.push_back(std::move(e));
    for (auto& e : onnxruntime_builtins()) v.push_back(std::move(e));
    return v;
  }();
  return all;
}

}  // namespace normcheck::conf
