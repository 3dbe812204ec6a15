// The runner: feeds the cases of a fixture file to candidates, checks their outputs, and
// collects verdicts; and the results file, format "normcheck-results" v1 (reports/RESULTS.md).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"

namespace normcheck::conf {

inline constexpr const char* kResultsFormat = "normcheck-results";
inline constexpr int kResultsFormatVersion = 1;

// All results of one candidate over one fixture file.
struct CandidateRun {
  CandidateInfo info;
  std::vector<CaseResult> cases;
  std::map<Verdict, std::int64_t> summary;
  std::string error;  // set when the run stopped early (bad fixture file ...): results so far are kept
  double seconds = 0;
  // Rejected: at least one FAILED / MISSING / CRASHED / TIMEOUT (what a mutant must be).
  bool rejected() const;
  // Held to recorded findings (apply_known_findings): the cases whose verdict is one, and the
  // recorded cases of this run that no longer show their recorded verdict.
  std::int64_t known_findings = 0;
  std::vector<std::string> stale_findings;
  // A failure that is not a recorded finding, or a recorded finding that no longer shows: what
  // fails a real library held to its findings (without any, the same as rejected()).
  bool failed_beyond_known() const;
};

struct RunOptions {
  std::string fixtures;                 // path of the fixture file
  std::vector<std::string> case_globs;  // fnmatch patterns on case ids; empty: every case
  std::string outputs;                  // `check`: an outputs file instead of candidates
  // `check`: the outputs file's producer flushes subnormal outputs to zero (the declaration a
  // candidate makes with Capabilities::flush_subnormal_outputs; `check --flush-subnormal-outputs`).
  bool outputs_flush_subnormals = false;
  // `--reduction CLASS`: the reduction class every candidate (`check`: the outputs' producer) is
  // judged under, in place of what it declares (TOLERANCE.md, section 9). nullopt: its own.
  std::optional<Reduction> reduction;
  // `run --ignore-flush-declaration`: judge every candidate as if it did not declare flush-to-zero
  // outputs (Capabilities::flush_subnormal_outputs): a flushed subnormal then FAILS. What the
  // declaration excuses, shown (a real library's recorded finding: docs/FINDINGS.md).
  bool ignore_flush_declaration = false;
  // Threads in all (0: hardware threads): cases read ahead, allowances derived and candidates run
  // concurrently; each candidate runs one case at a time, in case order. Results do not depend on it.
  int threads = 0;
  // Called after each checked case, on the calling thread, in case order (candidates in order).
  std::function<void(const CandidateRun&, const CaseResult&)> on_case;
  // Journal: one JSON line per checked case is appended here (flushed), so that results are
  // kept even if an in-process plugin kills the process. Empty: none.
  std::string journal;
  // FAILED cases get the diagnosis panel's best dialects (diagnosis.hpp).
  bool diagnose = true;
};

// Runs every candidate over the fixture cases. A candidate's failure on a case (exception,
// crash, timeout) becomes that case's verdict; the run goes on. A fixture file that cannot be
// read throws fix::FixtureError before anything runs; one that breaks mid-way stops the run with
// `error` set in each CandidateRun.
std::vector<CandidateRun> run_candidates(std::vector<std::unique_ptr<Candidate>>& candidates,
                                         const RunOptions& opt);

// `check`: checks an outputs file (fixtures/SCHEMA.md, "Outputs files") against the fixtures.
// Throws fix::FixtureError when the outputs file does not match the fixtures (a case or an
// output that the fixtures do not have).
CandidateRun check_outputs_file(const RunOptions& opt);

// The results file of one run. `command` is the command line; `repro` makes the one-line
// command that reruns one case (case id -> command).
struct ResultsContext {
  std::string command;
  std::string fixtures_path;
  fix::Provenance fixtures;
  std::function<std::string(const std::string&)> repro;
};
std::string results_json(const CandidateRun& run, const ResultsContext& ctx);
// The same text written to `os` a case at a time (no tree or text of the whole file in memory).
void write_results_json(std::ostream& os, const CandidateRun& run, const ResultsContext& ctx);
// A case's "diagnosis" list as the results file writes it (reports/RESULTS.md), as JSON text.
std::string diagnosis_json_text(const std::vector<Diagnosis>& diagnosis);
// Writes atomically (temporary file + rename); refuses to replace an existing file unless
// `overwrite`. Throws std::runtime_error.
void write_text_file(const std::string& path, const std::string& text, bool overwrite);
// The same with the contents written by `write` into the temporary file.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool overwrite);

// One-line description of a case result for people ("FAILED  ln_... y: 3 of 4096 elements ...").
std::string describe(const CaseResult& r);

}  // namespace normcheck::conf
