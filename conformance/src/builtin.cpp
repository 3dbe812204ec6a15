// The registry of built-in candidates: each family of bundled kernels contributes its entries.
#include "normcheck/conformance/candidate.hpp"
#include "candidates/cpu/cpu_candidates.hpp"
#include "onnxruntime/onnxruntime_candidates.hpp"
#include "plugin/bundled_plugins.hpp"
#include "python_candidates.hpp"

namespace normcheck::conf {

const std::vector<BuiltinEntry>& builtin_candidates() {
  static const std::vector<BuiltinEntry> all = [] {
    std::vector<BuiltinEntry> v;
    v.insert(v.end(), cpu::cpu_builtins().begin(), cpu::cpu_builtins().end());
    for (auto& e : python_builtins()) v.push_back(std::move(e));
    for (auto& e : bundled_plugin_entries()) v.push_back(std::move(e));
    for (auto& e : onnxruntime_builtins()) v.push_back(std::move(e));
    return v;
  }();
  return all;
}

}  // namespace normcheck::conf
