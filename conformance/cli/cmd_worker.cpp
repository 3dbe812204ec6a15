// `normcheck worker SPEC`: serves one candidate over the subprocess protocol on stdin/stdout.
#include "commands.hpp"

namespace normcheck::cli {

Runner add_worker_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("worker", "Serve a candidate over the subprocess protocol (used by --isolate)");
  cmd->group("");  // internal: not listed in --help
  return [] { return kExitBadInput; };
}

}  // namespace normcheck::cli
