// Subcommands of the normcheck CLI. Each adds itself to the app and returns the callback that
// runs it; a callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace normcheck::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // the command ran and found failures (later: run/check)
inline constexpr int kExitBadInput = 2;  // invalid input: the message names the problem
inline constexpr int kExitInternal = 3;  // a bug in normcheck

using Runner = std::function<int()>;

// Shared text helpers of the subcommands (cli_text.cpp).
// `s` quoted for a POSIX shell when it needs quoting (repro and reproduce commands).
std::string quote(const std::string& s);
// `s` with every character but [A-Za-z0-9_.-] replaced by '_' (file names from candidate specs).
std::string slug(const std::string& s);
// Path of the running normcheck executable ("normcheck" when /proc/self/exe cannot be read).
std::string self_exe();

Runner add_reference_command(CLI::App& app);
Runner add_fixtures_command(CLI::App& app);
Runner add_worker_command(CLI::App& app);
// candidates, run, check; argv_all (the arguments after the program name) goes into results files.
Runner add_run_commands(CLI::App& app, std::vector<std::string>& argv_all);
// audit: checkpoint norm parameters (conformance/audit/).
Runner add_audit_command(CLI::App& app, std::vector<std::string>& argv_all);

// report; and the report flags run and check share with it.
Runner add_report_command(CLI::App& app);
struct ReportFlags {
  std::string junit, markdown, html_dir, summary_json;
  bool any() const;
};
void add_report_flags(CLI::App* cmd, ReportFlags& flags);
// Parses results (text, and the name it goes by in messages), merges them and writes the reports;
// returns the exit code (2 for bad input, 1 when a candidate is not as expected).
int write_report(const ReportFlags& flags, const std::vector<std::pair<std::string, std::string>>& results,
                 bool force);
// 2 with a message when a report file exists and `force` is not given (checked before a run).
int check_report_targets(const ReportFlags& flags, bool force);
// prop (property_tests/); argv_all as for run.
Runner add_prop_command(CLI::App& app, std::vector<std::string>& argv_all);
// faults: the fault catalogue (text, markdown, json).
Runner add_faults_command(CLI::App& app);
// study placement (conformance/study/); argv_all as for run.
Runner add_study_command(CLI::App& app, std::vector<std::string>& argv_all);

}  // namespace normcheck::cli
