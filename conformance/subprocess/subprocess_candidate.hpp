// The subprocess transport (conformance/PROTOCOL.md): what the rest of normcheck uses of it
// beyond make_subprocess_candidate() (src/transports.hpp).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

// CandidateDeclined (candidate.hpp): a `decline` reply; the runner maps it to UNSUPPORTED and
// serve_protocol() turns it back into a `decline` when a candidate it serves throws it.

struct SubprocessOptions {
  double timeout_s = 0;  // each case: request and reply (0: no limit)
  // Start-up, up to and including the hello; 0: the larger of timeout_s and 120 s. A separate
  // limit because starting an interpreter and importing a framework can take longer than a
  // case is allowed to.
  double hello_timeout_s = 0;
  std::size_t stderr_tail_bytes = 4096;  // how much of the child's stderr errors quote
};

// make_subprocess_candidate() with all the options.
std::unique_ptr<Candidate> make_subprocess_candidate(const std::vector<std::string>& argv,
                                                     const std::string& name, const SubprocessOptions& opt);

// Speaks the child role of the protocol for `cand` on the two file descriptors: sends the
// hello, then serves requests until `bye` or end of input. A candidate's exception becomes an
// `error` reply and serving goes on. Returns the exit status for the process: 0 after bye or
// end of input, 2 after a request it could not read (the stream is lost). Neither descriptor is
// closed. Used by `normcheck worker` (--isolate) and by tests.
int serve_protocol(Candidate& cand, int in_fd, int out_fd);

// The child role for a candidate that could not be made: one `error` message instead of the
// hello (PROTOCOL.md), so that the host reports `message` rather than a bare exit status.
void serve_startup_error(const std::string& message, int out_fd);

}  // namespace normcheck::conf
