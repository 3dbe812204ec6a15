// Built-in candidates that run an adapter over the subprocess protocol, started on first use
// (builtin:torch, builtin:onnxruntime-*).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

// A candidate that starts the adapter `argv` (a subprocess-protocol child) on first use, so that
// listing candidates starts nothing; an adapter that cannot start makes every case UNSUPPORTED
// with its message. A non-empty `unavailable` is that message from the start (the adapter's
// package is not installed): the child is never started.
std::unique_ptr<Candidate> make_lazy_adapter(CandidateInfo info, std::vector<std::string> argv, double hello_timeout_s,
                                             std::string unavailable = {});

}  // namespace normcheck::conf
