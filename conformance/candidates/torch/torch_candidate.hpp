// builtin:torch, PyTorch through the Python adapter torch_adapter.py (README.md).
#pragma once

#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

std::vector<BuiltinEntry> torch_builtins();

}  // namespace normcheck::conf
