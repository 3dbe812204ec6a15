// Constructors of the transports, each implemented in its own folder (plugin/, subprocess/);
// make_candidate() in ../candidates/spec.cpp dispatches on the spec's prefix.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

// plugin/: loads a shared library exporting the candidate.h descriptor. Throws
// std::invalid_argument naming the file and the problem (no symbol, other ABI version ...).
std::unique_ptr<Candidate> make_plugin_candidate(const std::string& path);

// subprocess/: runs `argv` as a child speaking PROTOCOL.md on its stdin/stdout. `name` is the
// spec shown in results; timeout_s bounds each request (0: no limit), startup_timeout_s the
// start-up up to the hello (0: the larger of timeout_s and 120 s). Throws std::invalid_argument
// when the child cannot be started or its handshake is wrong, CandidateStartError (one) when it
// died or hung before its hello.
std::unique_ptr<Candidate> make_subprocess_candidate(const std::vector<std::string>& argv,
                                                     const std::string& name, double timeout_s,
                                                     double startup_timeout_s = 0);

// Splits a command line into words: blanks separate, '...' and "..." quote, \ escapes.
// Throws std::invalid_argument on an unterminated quote.
std::vector<std::string> split_command(std::string_view line);

}  // namespace normcheck::conf
