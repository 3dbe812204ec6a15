// Built-in candidates that are adapters run over the subprocess protocol (builtin:torch, its
// Python adapter; builtin:onnxruntime-*, their Node.js adapter): the adapter starts on first use,
// so that listing candidates does not import a framework, and an adapter that cannot start (no
// torch) makes every case UNSUPPORTED with its message instead of stopping the run.
#include "lazy_adapter.hpp"

#include <fmt/core.h>

#include "normcheck/conformance/candidate.hpp"
#include "subprocess/subprocess_candidate.hpp"

namespace normcheck::conf {
namespace {

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

}  // namespace

std::unique_ptr<Candidate> make_lazy_adapter(CandidateInfo info, std::vector<std::string> argv, double hello_timeout_s,
                                             std::string unavailable) {
  return std::make_unique<LazyAdapter>(std::move(info), std::move(argv), hello_timeout_s, std::move(unavailable));
}

}  // namespace normcheck::conf
