// Loading candidate.h plugins, shared by the `plugin:` transport (plugin_candidate.cpp) and the
// discovery of bundled plugins (../candidates/bundled_plugins.cpp), its only user outside plugin/.
#pragma once

#include <memory>
#include <string>

#include "normcheck/candidate.h"
#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf::plugin {

// A dlopen'ed library; candidates made from one file share it, and its lock (candidate.h: the
// host calls into one library from one thread at a time).
class Library;

struct Loaded {
  std::shared_ptr<Library> library;
  const nc_candidate* descriptor = nullptr;  // validated: ABI 1, struct_size, run present
};

// Loads `path` and checks its descriptor. Throws std::invalid_argument "plugin PATH: problem".
Loaded load(const std::string& path);

// The CandidateInfo a descriptor declares; `name` and `kind` come from the caller.
CandidateInfo info_of(const nc_candidate& d, std::string name, CandidateKind kind);

// Loads `path` and calls its init: the candidate behind "plugin:PATH" and "builtin:NAME".
// Throws std::invalid_argument as load() does.
std::unique_ptr<Candidate> make_candidate_from(const std::string& path, std::string name, CandidateKind kind);

// A candidate that declines every case with `reason`, and whose run() throws CandidateDeclined
// with it: a bundled plugin that failed to load is listed this way rather than hidden.
std::unique_ptr<Candidate> make_declining(CandidateInfo info, std::string reason);

}  // namespace normcheck::conf::plugin
