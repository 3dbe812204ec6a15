// `normcheck candidates`, `normcheck run`, `normcheck check`: the conformance harness.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "normcheck/conformance/known_findings.hpp"
#include "normcheck/conformance/candidate.hpp"
#include "normcheck/conformance/capabilities_json.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/fixtures/error.hpp"
#include "normcheck/sharding/shard.hpp"

namespace normcheck::cli {
namespace {

struct RunArgs {
  std::vector<std::string> candidates;
  std::string builtins;  // correct | mutants | all
  std::string fixtures, outputs, json, json_dir;
  std::vector<std::string> cases;
  bool isolate = false, force = false, json_list = false, verbose = false, expect_reject = false;
  bool no_diagnosis = false;
  bool allow_empty = false;  // a run that checked nothing may exit 0
  bool flush_subnormals = false;  // check: the outputs' producer flushes subnormal outputs
  std::string reduction;  // --reduction CLASS: judge every candidate under this class
  bool ignore_flush_declaration = false;  // run: judge without declared flush-to-zero outputs
  std::vector<std::string> known_findings;  // --known-findings FILE (known_findings.hpp)
  double timeout = 0, startup_timeout = 0;
  int threads = 0, max_print = 20;
  ReportFlags report;  // --junit, --markdown, --html, --summary-json
};

// Cases whose outputs were compared with the reference (PASSED, FAILED, MISTRUSTED, MISSING);
// UNSUPPORTED, CRASHED and TIMEOUT compared nothing, except an UNSUPPORTED case of an outputs
// file that marks some outputs unsupported and has the others compared (fixtures/SCHEMA.md).
std::int64_t checked_count(const conf::CandidateRun& r) {
  std::int64_t n = 0;
  for (auto v : {conf::Verdict::passed, conf::Verdict::failed, conf::Verdict::mistrusted, conf::Verdict::missing})
    if (auto it = r.summary.find(v); it != r.summary.end()) n += it->second;
  for (const auto& c : r.cases)
    if (c.verdict == conf::Verdict::unsupported &&
        std::any_of(c.outputs.begin(), c.outputs.end(), [](const conf::OutputResult& o) { return o.elements > 0; }))
      ++n;
  return n;
}

int run_list(const RunArgs& a) {
  const auto& all = conf::builtin_candidates();
  if (a.json_list) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& e : all) {
      nlohmann::ordered_json item{{"name", e.info.name},
                                  {"kind", conf::name_of(e.info.kind)},
                                  {"description", e.info.description},
                                  {"capabilities", conf::capabilities_json<nlohmann::ordered_json>(e.info.caps)}};
      if (e.info.kind == conf::CandidateKind::mutant) {
        if (!e.info.fault_id.empty()) item["fault_id"] = e.info.fault_id;
        item["fault_class"] = e.info.fault_class;
        item["fault"] = e.info.fault;
      }
      j.push_back(std::move(item));
    }
    fmt::print("{}\n", j.dump(1));
    return kExitOk;
  }
  for (auto kind : {conf::CandidateKind::correct, conf::CandidateKind::mutant, conf::CandidateKind::external}) {
    if (kind == conf::CandidateKind::external &&
        std::none_of(all.begin(), all.end(), [&](const auto& e) { return e.info.kind == kind; }))
      continue;
    fmt::print("{}\n", kind == conf::CandidateKind::correct ? "Correct candidates:"
                        : kind == conf::CandidateKind::mutant
                            ? "Mutant candidates:"
                            : "External candidates (real libraries, run by name and held to their recorded "
                              "findings with --known-findings; docs/FINDINGS.md):");
    for (const auto& e : all) {
      if (e.info.kind != kind) continue;
      fmt::print("  {:<34} {}\n", e.info.name, e.info.description);
      if (kind == conf::CandidateKind::mutant) fmt::print("  {:<34} class {}: {}\n", "", e.info.fault_class, e.info.fault);
      fmt::print("  {:<34} supports: {}\n", "", conf::capabilities_text(e.info.caps));
    }
  }
  return kExitOk;
}

void print_table(const std::vector<conf::CandidateRun>& runs) {
  using conf::Verdict;
  const Verdict cols[] = {Verdict::passed, Verdict::failed, Verdict::mistrusted, Verdict::unsupported,
                          Verdict::crashed, Verdict::timeout, Verdict::missing};
  std::size_t w = 9;
  for (const auto& r : runs) w = std::max(w, r.info.name.size());
  fmt::print("\n{:<{}} {:<8}", "candidate", w, "kind");
  for (auto v : cols) fmt::print(" {:>11}", conf::name_of(v));
  fmt::print("  outcome\n");
  for (const auto& r : runs) {
    fmt::print("{:<{}} {:<8}", r.info.name, w, conf::name_of(r.info.kind));
    for (auto v : cols) {
      const auto it = r.summary.find(v);
      fmt::print(" {:>11}", it == r.summary.end() ? 0 : it->second);
    }
    const bool mutant = r.info.kind == conf::CandidateKind::mutant;
    const std::int64_t compared = checked_count(r);
    const std::string known =
        r.known_findings > 0 ? fmt::format(" ({} known finding{})", r.known_findings, r.known_findings == 1 ? "" : "s")
                             : std::string();
    const std::string stale =
        r.stale_findings.empty()
            ? std::string()
            : fmt::format(" (recorded finding no longer shows: {})", fmt::join(r.stale_findings, ", "));
    const std::string outcome = mutant ? (r.rejected() ? "rejected (as it must be)" : "NOT REJECTED")
                                : r.failed_beyond_known() ? "FAILED" + known + stale
                                : !r.error.empty()        ? std::string("stopped early")  // as the reports say
                                : compared == 0           ? "nothing run (every case declined)"
                                                          : "conforms" + known;
    std::int64_t flushed = 0;
    for (const auto& c : r.cases)
      for (const auto& o : c.outputs) flushed += o.flushed;
    const std::string flush_note =
        flushed > 0 ? fmt::format(" ({} zero{} accepted as flushed subnormals)", flushed, flushed == 1 ? "" : "s") : "";
    fmt::print("  {}{}{}\n", outcome, flush_note, r.error.empty() ? "" : " (run stopped: " + r.error + ")");
  }
}

// A run that checked nothing must not turn CI green: a --cases glob with a typo, a candidate
// that declines every case. It fails (exit 1) when no case was checked at all, or when a
// candidate the user named (--candidate, or the outputs file of `check`) checked none;
// candidates that --builtins brings in and that cannot run here (no GPU, a library not
// installed) are shown as "nothing run" and do not fail the run. --allow-empty: exit 0.
bool nothing_checked(const std::vector<conf::CandidateRun>& runs, std::size_t named, const RunArgs& a, const char* cmd) {
  std::int64_t total = 0;
  std::size_t cases = 0;
  for (const auto& r : runs) total += checked_count(r), cases = std::max(cases, r.cases.size());
  std::string globs;
  for (const auto& g : a.cases) globs += (globs.empty() ? "" : " ") + quote(g);
  bool empty = false;
  if (total == 0 && cases == 0) {
    fmt::print(stderr, "normcheck {}: nothing was checked: {}\n", cmd,
               a.cases.empty() ? fmt::format("{} holds no case", a.fixtures)
                               : fmt::format("no case of {} matches --cases {}", a.fixtures, globs));
    empty = true;
  } else {
    // Each candidate the user named that compared nothing, with the first reason it gave; when
    // nothing at all was compared, every candidate.
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (checked_count(runs[i]) > 0 || (i >= named && total > 0)) continue;
      std::map<std::string, int> reasons;  // the most common one is the likeliest cause
      for (const auto& c : runs[i].cases)
        if (!c.message.empty()) ++reasons[c.message];
      std::string why;
      int most = 0;
      for (const auto& [m, n] : reasons)
        if (n > most) most = n, why = fmt::format(": {} ({} of {} cases)", m, n, runs[i].cases.size());
      fmt::print(stderr, "normcheck {}: nothing was checked for {} (every case declined, crashed or timed out{})\n", cmd,
                 runs[i].info.name, why);
      empty = true;
    }
  }
  if (empty) fmt::print(stderr, "normcheck {}: pass --allow-empty if an empty run is what you meant\n", cmd);
  return empty;
}

int run_run(const RunArgs& a, const std::vector<std::string>& argv_all, bool offline) {
  if (offline && a.outputs.empty()) {
    fmt::print(stderr, "normcheck check: --outputs is required\n");
    return kExitBadInput;
  }
  conf::KnownFindings known_by_spec;  // --known-findings
  try {
    for (const auto& f : a.known_findings) conf::read_known_findings(f, known_by_spec);
  } catch (const std::exception& e) {
    fmt::print(stderr, "normcheck: {}\n", e.what());
    return kExitBadInput;
  }
  conf::SpecOptions so;
  so.isolate = a.isolate;
  so.timeout_s = a.timeout;
  so.startup_timeout_s = a.startup_timeout;
  so.self_exe = self_exe();
  std::vector<std::unique_ptr<conf::Candidate>> cands;
  std::vector<std::string> specs = a.candidates;
  if (!a.builtins.empty()) {
    if (a.builtins != "correct" && a.builtins != "mutants" && a.builtins != "all" && a.builtins != "quant-mutants") {
      fmt::print(stderr, "normcheck run: --builtins takes correct, mutants, all or quant-mutants\n");
      return kExitBadInput;
    }
    for (const auto& e : conf::builtin_candidates()) {
      // correct: the kernels held to conform; all adds the mutants and the external libraries
      // with recorded findings (builtin:ggml-*: conformance/candidates/bundled_plugins.cpp).
      // mutants and all include the quantization mutants (class H): the smoke and ci tiers hold
      // quantized cases that reject each of them. quant-mutants selects those six alone (the
      // quant tier, whose other cases no other mutant is meant for).
      const bool mutant = e.info.kind == conf::CandidateKind::mutant, quant = mutant && e.info.fault_class == "H";
      const bool take = a.builtins == "quant-mutants" ? quant
                        : a.builtins == "all"         ? true
                        : a.builtins == "mutants"     ? mutant
                                                      : e.info.kind == conf::CandidateKind::correct;
      if (take) specs.push_back(e.info.name);
    }
  }
  if (!offline && specs.empty()) {
    fmt::print(stderr, "normcheck run: give --candidate SPEC (one or more) or --builtins\n");
    return kExitBadInput;
  }
  if (!a.json.empty() && specs.size() > 1) {
    fmt::print(stderr, "normcheck run: --json takes one candidate; use --json-dir DIR for {}\n", specs.size());
    return kExitBadInput;
  }
  if (!std::filesystem::exists(a.fixtures)) {
    fmt::print(stderr, "normcheck: {}: no such fixture file\n", a.fixtures);
    return kExitBadInput;
  }
  // Refuse to overwrite results before spending time on the run.
  auto json_path = [&](const std::string& spec) {
    return !a.json.empty() ? a.json : a.json_dir.empty() ? std::string() : a.json_dir + "/" + slug(spec) + ".json";
  };
  if (!a.json_dir.empty()) std::filesystem::create_directories(a.json_dir);
  for (const auto& s : offline ? std::vector<std::string>{"outputs"} : specs) {
    const auto p = json_path(s);
    if (!p.empty() && !a.force && std::filesystem::exists(p)) {
      fmt::print(stderr, "normcheck: {} exists; pass --force to replace it\n", p);
      return kExitBadInput;
    }
  }
  if (int rc = check_report_targets(a.report, a.force); rc != kExitOk) return rc;
  for (const auto& s : specs) {
    try {
      cands.push_back(conf::make_candidate(s, so));
    } catch (const conf::CandidateStartError& e) {
      // It exists but died or hung before its hello: every case fails with the reason, and the
      // results file says so (a CI dashboard then shows it; exit 1, not a usage error).
      fmt::print(stderr, "normcheck: {}\nnormcheck: every case of {} is {}\n", e.what(), s, e.hung() ? "TIMEOUT" : "CRASHED");
      cands.push_back(conf::make_unstarted_candidate(s, e));
    } catch (const std::exception& e) {
      fmt::print(stderr, "normcheck: {}\n", e.what());
      return kExitBadInput;
    }
  }
  std::string command = "normcheck";
  for (const auto& w : argv_all) command += " " + quote(w);
  conf::RunOptions opt;
  opt.fixtures = a.fixtures;
  opt.outputs = a.outputs;
  opt.outputs_flush_subnormals = a.flush_subnormals;
  opt.ignore_flush_declaration = a.ignore_flush_declaration;
  if (!a.reduction.empty()) {
    try {
      opt.reduction = conf::parse_reduction(a.reduction);
    } catch (const std::invalid_argument& e) {
      fmt::print(stderr, "normcheck: --reduction: {}\n", e.what());
      return kExitBadInput;
    }
  }
  opt.case_globs = a.cases;
  opt.threads = a.threads;
  opt.diagnose = !a.no_diagnosis;
  // The one-line command that reruns one case the way this run ran it.
  const std::string declared = (a.reduction.empty() ? std::string() : " --reduction " + quote(a.reduction)) +
                               (a.ignore_flush_declaration ? " --ignore-flush-declaration" : "");
  auto repro = [&](const std::string& spec, const std::string& id) {
    if (offline)
      return fmt::format("normcheck check --fixtures {} --outputs {} --cases {}{}", quote(a.fixtures), quote(a.outputs),
                         quote(id), declared);
    std::string isolation = (a.isolate ? " --isolate" : "") + declared;
    if (a.timeout > 0) isolation += fmt::format(" --timeout {}", a.timeout);
    if (a.startup_timeout > 0) isolation += fmt::format(" --startup-timeout {}", a.startup_timeout);
    return fmt::format("normcheck run --candidate {}{} --fixtures {} --cases {}", quote(spec), isolation,
                       quote(a.fixtures), quote(id));
  };
  const bool tty = ::isatty(STDERR_FILENO);
  std::map<std::string, int> printed;
  opt.on_case = [&](const conf::CandidateRun& run, const conf::CaseResult& r) {
    const auto kf = known_by_spec.find(run.info.name);
    const conf::KnownFinding* known = kf == known_by_spec.end() ? nullptr : conf::known_finding_of(kf->second, run, r);
    const bool show = r.verdict != conf::Verdict::passed && r.verdict != conf::Verdict::unsupported &&
                      (a.verbose || (conf::is_failure(r.verdict) && run.info.kind != conf::CandidateKind::mutant &&
                                     !known));
    if (tty) fmt::print(stderr, "\r\033[K{} {}", run.info.name, r.case_id);
    if (!show) return;
    if (tty) fmt::print(stderr, "\r\033[K");
    int& n = printed[run.info.name];
    if (++n > a.max_print && !a.verbose) {
      if (n == a.max_print + 1) fmt::print("[{}] ... more in the results file (--verbose prints all)\n", run.info.name);
      return;
    }
    fmt::print("[{}] {}\n", run.info.name, conf::describe(r));
    if (known) fmt::print("    known finding: {} ({})\n", known->finding, known->what);
    fmt::print("    repro: {}\n", repro(run.info.name, r.case_id));
    std::fflush(stdout);
  };
  // While the run goes on, every checked case is appended to a journal beside the results
  // (JSON lines, flushed): if the process dies (an in-process plugin that segfaults), what was
  // checked so far is kept there. Removed once the results files are written.
  if (!a.json.empty()) opt.journal = a.json + ".partial.jsonl";
  else if (!a.json_dir.empty()) opt.journal = a.json_dir + "/run.partial.jsonl";
  if (!opt.journal.empty()) {
    std::error_code ec;
    std::filesystem::remove(opt.journal, ec);
  }
  std::vector<conf::CandidateRun> runs;
  fix::Provenance prov;
  try {
    {
      fix::FixtureReader r(a.fixtures);
      prov = r.provenance();
    }
    // A sharded outputs file (SCHEMA.md, "Sharded outputs": cases with a shard_plan) is judged
    // against the unsharded reference under each case's plan (conformance/sharding/README.md).
    if (offline)
      runs.push_back(shard::is_sharded_outputs(a.outputs) ? shard::check_sharded_file(opt)
                                                          : conf::check_outputs_file(opt));
    else runs = conf::run_candidates(cands, opt);
    for (auto& r : runs)
      if (const auto kf = known_by_spec.find(r.info.name); kf != known_by_spec.end())
        conf::apply_known_findings(r, kf->second);
    // A candidate the file names that this run does not have is most likely a spec spelled
    // another way (ggml-cpu for builtin:ggml-cpu): its findings were not applied; say so.
    for (const auto& [spec, findings] : known_by_spec)
      if (!findings.empty() &&
          std::none_of(runs.begin(), runs.end(), [&](const conf::CandidateRun& r) { return r.info.name == spec; }))
        fmt::print(stderr, "normcheck: note: --known-findings names {}, which this run does not have (its findings "
                           "apply to a candidate of exactly that spec)\n", spec);
  } catch (const std::exception& e) {
    if (tty) fmt::print(stderr, "\r\033[K");
    fmt::print(stderr, "normcheck: {}\n", e.what());
    return kExitBadInput;
  }
  if (tty) fmt::print(stderr, "\r\033[K");
  bool bad_input = false;
  std::vector<std::pair<std::string, std::string>> results_texts;  // for the reports
  for (const auto& r : runs) {
    const std::string p = offline ? a.json : json_path(r.info.name);
    if (!r.error.empty()) {
      fmt::print(stderr, "normcheck: {}: {}\n", r.info.name, r.error);
      bad_input = true;
    }
    if (p.empty() && !a.report.any()) continue;
    conf::ResultsContext ctx;
    ctx.command = command;
    ctx.fixtures_path = a.fixtures;
    ctx.fixtures = prov;
    const std::string spec = r.info.name;
    ctx.repro = [&, spec](const std::string& id) { return repro(spec, id); };
    try {
      if (a.report.any()) {  // the reports read the text
        std::string text = conf::results_json(r, ctx);
        if (!p.empty()) conf::write_text_file(p, text, a.force);
        results_texts.emplace_back(std::move(text), p.empty() ? r.info.name : p);
      } else {
        conf::write_file_atomically(p, [&](std::ostream& f) { conf::write_results_json(f, r, ctx); }, a.force);
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "normcheck: {}\n", e.what());
      return kExitBadInput;
    }
  }
  if (!opt.journal.empty()) {
    std::error_code ec;
    std::filesystem::remove(opt.journal, ec);
  }
  print_table(runs);
  if (a.report.any()) {
    fmt::print("\n");
    if (write_report(a.report, results_texts, a.force) == kExitBadInput) return kExitBadInput;
  }
  if (bad_input) return kExitBadInput;
  bool fail = !a.allow_empty && nothing_checked(runs, offline ? runs.size() : a.candidates.size(), a, offline ? "check" : "run");
  for (const auto& r : runs) {
    if (a.expect_reject) fail |= !r.rejected();
    else fail |= r.failed_beyond_known();
  }
  return fail ? kExitFailed : kExitOk;
}

}  // namespace

Runner add_run_commands(CLI::App& app, std::vector<std::string>& argv_all) {
  auto a = std::make_shared<RunArgs>();
  auto* list = app.add_subcommand("candidates", "List the built-in candidates: correct kernels and mutants");
  list->add_flag("--json", a->json_list, "Print the list as JSON");

  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("--fixtures", a->fixtures, "Fixture file (HDF5, normcheck-fixtures v1)")->required();
    cmd->add_option("--cases", a->cases, "Only cases whose id matches this glob (repeatable)");
    cmd->add_option("--json", a->json, "Write the results file (normcheck-results v1) here");
    cmd->add_flag("--force", a->force, "Replace existing results files");
    cmd->add_flag("--verbose", a->verbose, "Print every case that did not pass, mutants included");
    cmd->add_option("--max-print", a->max_print, "Failing cases printed per candidate (default 20)");
    add_report_flags(cmd, a->report);
    cmd->add_flag("--no-diagnosis", a->no_diagnosis, "Do not run the diagnosis panel on failing cases");
    cmd->add_option("--reduction", a->reduction,
                    "Judge under this reduction class instead of the candidate's declaration: any, two_pass, welford, "
                    "pairwise:B, blocked:B or accumulate_f64 (conformance/TOLERANCE.md, section 9)");
    cmd->add_flag("--allow-empty", a->allow_empty, "Exit 0 even when nothing was checked (no case matched --cases, or "
                                                   "a candidate declined every case)");
  };
  auto* run = app.add_subcommand("run", "Run candidates over a fixture file and check their outputs");
  add_common(run);
  run->add_option("--candidate", a->candidates, "builtin:NAME, plugin:PATH.so or 'cmd:COMMAND ARGS...' (repeatable)");
  run->add_option("--builtins", a->builtins, "Also run the built-in candidates: correct, mutants, all, or quant-mutants (the quantization mutants of class H alone, for the quant tier)");
  run->add_option("--json-dir", a->json_dir, "Write one results file per candidate into this directory");
  run->add_flag("--isolate", a->isolate, "Run plugins and builtins in a child process: crashes and hangs become "
                                          "CRASHED / TIMEOUT for that case");
  run->add_option("--timeout", a->timeout, "Seconds allowed per case for subprocess candidates (0: none)");
  run->add_option("--startup-timeout", a->startup_timeout,
                  "Seconds a subprocess candidate may take to start, up to its hello (0: the larger of --timeout "
                  "and 120); one that dies or hangs before its hello fails every case (CRASHED / TIMEOUT)");
  run->add_option("--known-findings", a->known_findings,
                  "Hold real libraries to their recorded findings (a normcheck-known-findings file, repeatable): "
                  "a failure that is one is reported as a known finding and does not fail the run; one that is "
                  "none, or a recorded finding that no longer shows, does");
  run->add_flag("--ignore-flush-declaration", a->ignore_flush_declaration,
                "Judge every candidate as if it did not declare flush-to-zero outputs: a zero where the correctly "
                "rounded value is a subnormal FAILS (shows what the declaration excuses; conformance/TOLERANCE.md)");
  run->add_option("--threads", a->threads,
                  "Threads in all (default: all cores): candidates and cases run concurrently, each candidate one case "
                  "at a time in case order; the results do not depend on it");
  run->add_flag("--expect-reject", a->expect_reject,
                "Exit 0 only if every candidate is rejected (the mutation test of the suite)");
  auto* check = app.add_subcommand("check", "Check an outputs file written by any program against the fixtures");
  add_common(check);
  check->add_option("--outputs", a->outputs,
                    "Outputs file (fixtures/SCHEMA.md, \"Outputs files\"), or a sharded outputs file (\"Sharded "
                    "outputs\": each case under its shard_plan, conformance/sharding/README.md)")
      ->required();
  check->add_flag("--expect-reject", a->expect_reject,
                  "Exit 0 only if some case is FAILED, CRASHED, TIMEOUT or MISSING (a mutant's outputs)");
  check->add_flag("--flush-subnormal-outputs", a->flush_subnormals,
                  "The program that wrote the outputs flushes subnormal results to zero: accept such zeros and count "
                  "them as flushed (conformance/TOLERANCE.md)");
  check->add_option("--threads", a->threads, "Threads that judge cases (default: all cores); the results do not depend on it");
  return [a, list, run, check, &argv_all]() {
    if (list->parsed()) return run_list(*a);
    if (run->parsed()) return run_run(*a, argv_all, false);
    if (check->parsed()) return run_run(*a, argv_all, true);
    return kExitBadInput;
  };
}

}  // namespace normcheck::cli
