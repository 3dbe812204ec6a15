// Built-in candidates that run ONNX Runtime's normalization kernels through the Node.js adapter
// (builtin:onnxruntime-layernorm, -rmsnorm, -skip-layernorm, -skip-rmsnorm).
#pragma once

#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

std::vector<BuiltinEntry> onnxruntime_builtins();

}  // namespace normcheck::conf
