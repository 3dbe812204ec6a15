// normcheck: numerical verification of normalization layers. The CLI only parses arguments
// and calls the libraries.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "commands.hpp"
#include "normcheck/reference/heap.hpp"
#include "normcheck/version.hpp"

int main(int argc, char** argv) {
  normcheck::ref::keep_freed_memory();  // arrays of a case's size, freed and reused (heap.hpp)
  CLI::App app{"normcheck: certified conformance testing for LayerNorm, RMSNorm and residual placements"};
  app.require_subcommand(1);
  app.set_version_flag("--version", normcheck::kVersion);

  auto* version = app.add_subcommand("version", "Print the version of normcheck and of its formats");
  version->callback([] {});
  normcheck::cli::Runner run_reference = normcheck::cli::add_reference_command(app);
  normcheck::cli::Runner run_fixtures = normcheck::cli::add_fixtures_command(app);
  normcheck::cli::Runner run_worker = normcheck::cli::add_worker_command(app);
  std::vector<std::string> args(argv + 1, argv + argc);
  normcheck::cli::Runner run_harness = normcheck::cli::add_run_commands(app, args);
  normcheck::cli::Runner run_report = normcheck::cli::add_report_command(app);
  normcheck::cli::Runner run_audit = normcheck::cli::add_audit_command(app, args);
  normcheck::cli::Runner run_prop = normcheck::cli::add_prop_command(app, args);
  normcheck::cli::Runner run_study = normcheck::cli::add_study_command(app, args);
  normcheck::cli::Runner run_faults = normcheck::cli::add_faults_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : normcheck::cli::kExitBadInput;
  }
  try {
    if (version->parsed()) {
      fmt::print("normcheck {}\n", normcheck::kVersion);
      fmt::print("case-json 1\n");
      fmt::print("normcheck-fixtures 1\n");
      fmt::print("normcheck-results 1\n");
      fmt::print("normcheck-report-summary 1\n");
      fmt::print("normcheck-study-placement 1\n");
      fmt::print("candidate-abi 1\n");
      return 0;
    }
    if (app.got_subcommand("reference")) return run_reference();
    if (app.got_subcommand("fixtures")) return run_fixtures();
    if (app.got_subcommand("worker")) return run_worker();
    if (app.got_subcommand("report")) return run_report();
    if (app.got_subcommand("audit")) return run_audit();
    if (app.got_subcommand("prop")) return run_prop();
    if (app.got_subcommand("study")) return run_study();
    if (app.got_subcommand("faults")) return run_faults();
    for (const char* name : {"candidates", "run", "check"})
      if (app.got_subcommand(name)) return run_harness();
  } catch (const std::exception& e) {
    fmt::print(stderr, "normcheck: internal error: {}\n", e.what());
    return normcheck::cli::kExitInternal;
  }
  return normcheck::cli::kExitBadInput;
}
