// Built-in candidates that run a Python adapter over the subprocess protocol (builtin:torch).
#pragma once

#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

std::vector<BuiltinEntry> python_builtins();

}  // namespace normcheck::conf
