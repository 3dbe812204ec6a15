// Bundled plugins: kernels that link heavy libraries (oneDNN, OpenCL, CUDA) are built as
// candidate.h plugins, `libnormcheck_<name>.so` in the plugin directory, so that normcheck itself
// links none of them; they are listed with the other built-ins as "builtin:<name>".
#pragma once

#include <filesystem>
#include <vector>

#include "normcheck/conformance/candidate.hpp"

namespace normcheck::conf {

// $NORMCHECK_PLUGIN_DIR when set and not empty; otherwise <dir of the running executable>/
// ../lib/normcheck/plugins (the build tree puts normcheck in bin/ and the plugins in
// lib/normcheck/plugins/, and an installation keeps that layout).
std::filesystem::path bundled_plugin_dir();

// One entry per `libnormcheck_<name>.so` in bundled_plugin_dir(), sorted by name (none when the
// directory does not exist). Each descriptor is loaded to fill the entry's CandidateInfo (kind
// correct, name "builtin:<name>"); its init runs only when make() makes the candidate. A plugin
// that fails to load is still listed, with a description saying why, and its make() returns a
// candidate that declines every case (UNSUPPORTED) with that reason.
std::vector<BuiltinEntry> bundled_plugin_entries();

}  // namespace normcheck::conf
