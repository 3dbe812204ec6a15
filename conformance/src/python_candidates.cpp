// Built-in candidates that are Python adapters run over the subprocess protocol: the adapter
// starts on first use, so that listing candidates does not import a framework, and an adapter
// that cannot start (no torch) makes every case UNSUPPORTED with its message instead of
// stopping the run.
#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/fixtures/install_paths.hpp"
#include "python_candidates.hpp"
#include "subprocess/subprocess_candidate.hpp"

namespace normcheck::conf {
namespace {

std::string python_dir() {
  if (const char* env = std::getenv("NORMCHECK_PYTHON_DIR")) return env;
  if (auto installed = fix::installed_data_dir("python"); !installed.empty()) return installed.string();
  return NORMCHECK_SOURCE_DIR "/conformance/python";
}

class LazyAdapter : public Candidate {
 public:
  LazyAdapter(CandidateInfo info, std::vector<std::string> argv, double hello_timeout_s, std::string unavailable)
      : info_(std::move(info)), argv_(std::move(argv)), hello_timeout_s_(hello_timeout_s),
        start_error_(std::move(unavailable)) {}
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case& c) const override {
    if (auto why = unsupported_reason(info_.caps, c)) return why;
    start();
    if (!child_) return start_error_;
    return child_->declines(c);
  }
  Outputs run(const ref::Case& c) override {
    start();
    if (!child_) throw CandidateDeclined(start_error_);
    return child_->run(c);
  }

 private:
  void start() const {
    if (child_ || !start_error_.empty()) return;
    try {
      SubprocessOptions opt;
      opt.hello_timeout_s = hello_timeout_s_;
      child_ = make_subprocess_candidate(argv_, info_.name, opt);
    } catch (const std::exception& e) {
      start_error_ = fmt::format("cannot start the adapter: {}", e.what());
    }
  }
  CandidateInfo info_;
  std::vector<std::string> argv_;
  double hello_timeout_s_;
  mutable std::unique_ptr<Candidate> child_;
  mutable std::string start_error_;
};

CandidateInfo torch_info() {
  CandidateInfo i;
  i.name = "builtin:torch";
  i.kind = CandidateKind::correct;
  i.description =
      "PyTorch through the Python adapter (conformance/python/torch_adapter.py, CPU): F.layer_norm with autograd, "
      "RMSNorm as Hugging Face writes it";
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

std::unique_ptr<Candidate> make_lazy_adapter(CandidateInfo info, std::vector<std::string> argv, double hello_timeout_s,
                                             std::string unavailable) {
  return std::make_unique<LazyAdapter>(std::move(info), std::move(argv), hello_timeout_s, std::move(unavailable));
}

std::vector<BuiltinEntry> python_builtins() { return {{torch_info(), &make_torch}}; }

}  // namespace normcheck::conf
