// Subcommands of the normcheck CLI. Each adds itself to the app and returns the callback that
// runs it; a callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace normcheck::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // the command ran and found failures (later: run/check)
inline constexpr int kExitBadInput = 2;  // invalid input: the message names the problem
inline constexpr int kExitInternal = 3;  // a bug in normcheck

using Runner = std::function<int()>;

Runner add_reference_command(CLI::App& app);
Runner add_fixtures_command(CLI::App& app);
Runner add_worker_command(CLI::App& app);
// candidates, run, check; argv_all (the arguments after the program name) goes into results files.
Runner add_run_commands(CLI::App& app, std::vector<std::string>& argv_all);
// prop (property_tests/); argv_all as for run.
Runner add_prop_command(CLI::App& app, std::vector<std::string>& argv_all);

}  // namespace normcheck::cli
