// builtin:torch: PyTorch through its Python adapter (torch_adapter.py, beside this file; installed
// to <prefix>/share/normcheck/python), a subprocess-protocol child started on first use
// (make_lazy_adapter), run by Debian's python3 with numpy and torch.
#include "torch_candidate.hpp"

#include <cstdlib>
#include <string>

#include "candidates/lazy_adapter.hpp"
#include "normcheck/fixtures/install_paths.hpp"

namespace normcheck::conf {
namespace {

// The folder holding torch_adapter.py: $NORMCHECK_PYTHON_DIR, else an installation's
// share/normcheck/python (beside normcheck_protocol.py), else this folder of the source tree.
std::string python_dir() {
  if (const char* env = std::getenv("NORMCHECK_PYTHON_DIR")) return env;
  if (auto installed = fix::installed_data_dir("python"); !installed.empty()) return installed.string();
  return NORMCHECK_SOURCE_DIR "/conformance/candidates/torch";
}

CandidateInfo torch_info() {
  CandidateInfo i;
  i.name = "builtin:torch";
  i.kind = CandidateKind::correct;
  i.description =
      "PyTorch through the Python adapter (conformance/candidates/torch/torch_adapter.py, CPU): F.layer_norm with "
      "autograd, RMSNorm as Hugging Face writes it";
  i.caps.dtypes = {ref::DType::float64, ref::DType::float32, ref::DType::float16, ref::DType::bfloat16};
  i.caps.compute_dtypes = {ref::DType::float32};
  i.caps.contracts = {"exact", "llama", "gemma", "fused_add_lowp"};
  i.caps.blocks = false;
  i.caps.device = "cpu";
  return i;
}

std::unique_ptr<Candidate> make_torch() {
  // 120 s: importing torch on a loaded 2-core machine.
  return make_lazy_adapter(torch_info(), {NORMCHECK_PYTHON_EXE, python_dir() + "/torch_adapter.py"}, 120);
}

}  // namespace

std::vector<BuiltinEntry> torch_builtins() { return {{torch_info(), &make_torch}}; }

}  // namespace normcheck::conf
