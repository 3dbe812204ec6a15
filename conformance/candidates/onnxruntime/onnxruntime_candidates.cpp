// ONNX Runtime's CPU normalization kernels as built-in candidates (builtin:onnxruntime-*): each
// runs ort_adapter.js (beside this file) under Node.js over the subprocess protocol, started
// on first use. Where Node or the npm package onnxruntime-node is missing (it is installed by
// scripts/install-onnxruntime.sh, which may fail without a network), the candidates are still
// listed and every case is UNSUPPORTED with the reason; nothing else of the suite depends on it.
#include "onnxruntime_candidates.hpp"

#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>

#include "candidates/lazy_adapter.hpp"

namespace normcheck::conf {
namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// The folder with ort_adapter.js, ort_models.py and node_modules/.
std::string ort_dir() { return env_or("NORMCHECK_ORT_DIR", NORMCHECK_SOURCE_DIR "/conformance/candidates/onnxruntime"); }

// Empty when the adapter can start; otherwise why it cannot.
std::string unavailable_reason() {
  std::error_code ec;
  const std::string node = NORMCHECK_NODE_EXE;
  if (node.empty() || !fs::exists(node, ec))
    return "ONNX Runtime candidates need Node.js, which was not found when normcheck was configured "
           "(scripts/install-deps.sh installs it)";
  const fs::path pkg = fs::path(ort_dir()) / "node_modules" / "onnxruntime-node" / "package.json";
  if (!fs::exists(pkg, ec))
    return fmt::format("ONNX Runtime is not installed: {} is missing (scripts/install-onnxruntime.sh installs "
                       "onnxruntime-node with npm)",
                       pkg.string());
  return {};
}

struct OrtKernel {
  const char* name;  // builtin:onnxruntime-NAME, ort_adapter.js --kernel NAME
  const char* op;
  ref::Op norm_op;
  bool residual;
  const char* what;
};

constexpr OrtKernel kKernels[] = {
    {"layernorm", "LayerNormalization", ref::Op::layernorm, false,
     "ONNX LayerNormalization (opset 17, stash_type 1): Y, Mean, InvStdDev"},
    {"rmsnorm", "SimplifiedLayerNormalization", ref::Op::rmsnorm, false,
     "SimplifiedLayerNormalization (ONNX Runtime's RMSNorm): Y, InvStdDev"},
    {"skip-layernorm", "SkipLayerNormalization", ref::Op::layernorm, true,
     "com.microsoft SkipLayerNormalization: input + skip (+ bias), then LayerNorm; Y, Mean, InvStdDev, the sum"},
    {"skip-rmsnorm", "SkipSimplifiedLayerNormalization", ref::Op::rmsnorm, true,
     "com.microsoft SkipSimplifiedLayerNormalization: input + skip (+ bias), then RMSNorm; Y, InvStdDev, the sum"},
};

CandidateInfo info_of(const OrtKernel& k, const std::string& unavailable) {
  CandidateInfo i;
  i.name = fmt::format("builtin:onnxruntime-{}", k.name);
  i.kind = CandidateKind::correct;
  i.description = fmt::format(
      "ONNX Runtime (onnxruntime-node, CPU) through conformance/candidates/onnxruntime/ort_adapter.js: {}{}", k.what,
      unavailable.empty() ? "" : " [skipped: " + unavailable + "]");
  i.caps.ops = {k.norm_op};
  // float64 and bfloat16 reach the adapter, which declines them with the reason.
  i.caps.dtypes = {ref::DType::float64, ref::DType::float32, ref::DType::float16, ref::DType::bfloat16};
  i.caps.compute_dtypes = {ref::DType::float32};
  i.caps.directions = {ref::Direction::forward};
  i.caps.contracts = {"exact", "llama", "onnx", "gemma", "te", "te_wdtype", "fused_add_lowp"};
  i.caps.residual = k.residual;
  i.caps.blocks = false;
  i.caps.general_axes = !k.residual;
  i.caps.weight_offset = false;
  i.caps.device = "cpu";
  return i;
}

}  // namespace

std::vector<BuiltinEntry> onnxruntime_builtins() {
  const std::string unavailable = unavailable_reason();
  std::vector<BuiltinEntry> v;
  for (const auto& k : kKernels) {
    CandidateInfo info = info_of(k, unavailable);
    std::vector<std::string> argv{NORMCHECK_NODE_EXE, ort_dir() + "/ort_adapter.js", "--kernel", k.name,
                                  "--cache", env_or("NORMCHECK_ORT_CACHE", NORMCHECK_ORT_CACHE_DIR),
                                  "--python", NORMCHECK_PYTHON_EXE};
    v.push_back({info, [info, argv, unavailable] { return make_lazy_adapter(info, argv, 60, unavailable); }});
  }
  return v;
}

}  // namespace normcheck::conf
