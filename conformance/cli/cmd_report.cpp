// `normcheck report`: results files into JUnit XML, a Markdown summary, a JSON summary and a
// self-contained HTML page (reports/README.md). Also the --junit/--markdown/--html flags that
// `run` and `check` share with it.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "commands.hpp"
#include "normcheck/reports/report.hpp"

namespace normcheck::cli {

void add_report_flags(CLI::App* cmd, ReportFlags& f) {
  cmd->add_option("--junit", f.junit, "Write a JUnit XML report (GitLab, Jenkins, GitHub test reporters) here");
  cmd->add_option("--markdown", f.markdown, "Write a Markdown summary (a CI job summary) here");
  cmd->add_option("--html", f.html_dir, "Write a self-contained HTML report, DIR/index.html");
  cmd->add_option("--summary-json", f.summary_json, "Write the summary as JSON (normcheck-report-summary v1) here");
}

bool ReportFlags::any() const { return !junit.empty() || !markdown.empty() || !html_dir.empty() || !summary_json.empty(); }

int check_report_targets(const ReportFlags& f, bool force) {
  if (!f.html_dir.empty()) {
    try {
      reports::load_plot_library();  // before a run, not after it
    } catch (const reports::ReportError& e) {
      fmt::print(stderr, "normcheck: {}\n", e.what());
      return kExitBadInput;
    }
  }
  if (force) return kExitOk;
  for (const auto& p : {f.junit, f.markdown, f.html_dir.empty() ? std::string() : f.html_dir + "/index.html", f.summary_json})
    if (!p.empty() && std::filesystem::exists(p)) {
      fmt::print(stderr, "normcheck: {} exists; pass --force to replace it\n", p);
      return kExitBadInput;
    }
  return kExitOk;
}

int write_report(const ReportFlags& f, const std::vector<std::pair<std::string, std::string>>& results, bool force) {
  try {
    std::vector<reports::Run> runs;
    for (const auto& [text, source] : results) runs.push_back(reports::parse_results(text, source));
    const reports::Report rep = reports::merge(std::move(runs));
    reports::Targets t;
    t.junit = f.junit;
    t.markdown = f.markdown;
    t.html_dir = f.html_dir;
    t.summary_json = f.summary_json;
    t.overwrite = force;
    for (const auto& p : reports::write_reports(rep, t)) fmt::print("report: {}\n", p);
    return rep.ok() ? kExitOk : kExitFailed;
  } catch (const reports::ReportError& e) {
    fmt::print(stderr, "normcheck: {}\n", e.what());
    return kExitBadInput;
  }
}

Runner add_report_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> results;
    ReportFlags flags;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("report",
                                 "Write reports (JUnit XML, Markdown, HTML) from results files; shards and candidates "
                                 "merge into one report. Exit 1 when a correct candidate failed or a mutant passed");
  cmd->add_option("results", a->results, "Results files (normcheck-results v1)")->required();
  add_report_flags(cmd, a->flags);
  cmd->add_flag("--force", a->force, "Replace existing report files");
  return [a]() {
    if (!a->flags.any()) {
      fmt::print(stderr, "normcheck report: give at least one of --junit FILE, --markdown FILE, --html DIR, "
                         "--summary-json FILE\n");
      return kExitBadInput;
    }
    std::vector<std::pair<std::string, std::string>> texts;
    for (const auto& p : a->results) {
      std::ifstream in(p, std::ios::binary);
      if (!in) {
        fmt::print(stderr, "normcheck: {}: cannot open the results file\n", p);
        return kExitBadInput;
      }
      std::ostringstream ss;
      ss << in.rdbuf();
      texts.emplace_back(ss.str(), p);
    }
    return write_report(a->flags, texts, a->force);
  };
}

}  // namespace normcheck::cli
