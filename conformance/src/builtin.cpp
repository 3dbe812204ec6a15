// The registry of built-in candidates: each family of bundled kernels contributes its entries.
#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

const std::vector<BuiltinEntry>& builtin_candidates() {
  static const std::vector<BuiltinEntry> all = [] {
    std::vector<BuiltinEntry> v;
    return v;
  }();
  return all;
}

}  // namespace normcheck::conf
