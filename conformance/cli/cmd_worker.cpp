// `normcheck worker SPEC`: serves one candidate over the subprocess protocol on stdin/stdout
// (conformance/PROTOCOL.md). `--isolate` runs plugins and built-ins in such a child, so that a
// crash or a hang of the kernel costs one case instead of the whole run.
#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "../subprocess/subprocess_candidate.hpp"
#include "commands.hpp"
#include "normcheck/conformance/candidate.hpp"

namespace normcheck::cli {

Runner add_worker_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("worker", "Serve a candidate over the subprocess protocol (used by --isolate)");
  cmd->group("");  // internal: not listed in --help
  auto spec = std::make_shared<std::string>();
  cmd->add_option("spec", *spec, "builtin:NAME or plugin:PATH.so")->required();
  return [spec] {
    // The protocol owns file descriptor 1. Kernels and libraries that print to stdout would
    // corrupt it, so they get stderr there instead (the host keeps its tail for error messages).
    const int proto_out = ::dup(STDOUT_FILENO);
    if (proto_out < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      fmt::print(stderr, "normcheck worker: cannot set up stdout\n");
      return kExitInternal;
    }
    // A host that went away shows as a write error (and the worker exits), not as a signal.
    ::signal(SIGPIPE, SIG_IGN);
    // A host killed outright (SIGKILL, a cancelled CI job) cannot stop its worker, and a kernel
    // that never returns (or a lavapipe graph of minutes) would not read stdin's end for a long
    // time: the worker watches its parent and exits once it has been orphaned (reparented).
    const pid_t host = ::getppid();
    std::thread([host] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (::getppid() != host) ::_exit(kExitInternal);
      }
    }).detach();
    std::unique_ptr<conf::Candidate> cand;
    try {
      cand = conf::make_candidate(*spec);  // in process: the worker is the isolation
    } catch (const std::exception& e) {
      conf::serve_startup_error(e.what(), proto_out);
      return kExitBadInput;
    }
    return conf::serve_protocol(*cand, STDIN_FILENO, proto_out) == 0 ? kExitOk : kExitBadInput;
  };
}

}  // namespace normcheck::cli
