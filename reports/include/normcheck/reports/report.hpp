// The reports: results files (normcheck-results v1, reports/RESULTS.md) read into one model,
// merged (shards, candidates), and written as JUnit XML, a Markdown summary, a JSON summary and
// a self-contained HTML page. Reads results files only: no other normcheck library is used.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace normcheck::reports {

// Invalid input (not JSON, truncated, another format or version, a field of the wrong type,
// the same case twice in a merge): the message names the file and the field. Exit 2.
class ReportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kResultsFormat = "normcheck-results";
inline constexpr int kResultsFormatVersion = 1;
inline constexpr const char* kSummaryFormat = "normcheck-report-summary";
inline constexpr int kSummaryFormatVersion = 1;

// Verdicts of cases, in increasing severity, and of properties.
inline const std::vector<std::string> kCaseVerdicts = {"PASSED",  "UNSUPPORTED", "MISTRUSTED", "MISSING",
                                                        "FAILED",  "TIMEOUT",     "CRASHED"};
// The order of the columns in every table (the results file's summary order).
inline const std::vector<std::string> kVerdictColumns = {"PASSED",  "FAILED",  "MISTRUSTED", "UNSUPPORTED",
                                                          "CRASHED", "TIMEOUT", "MISSING"};
bool is_failure(const std::string& verdict);  // FAILED, MISSING, CRASHED, TIMEOUT

struct Value {
  std::string decimal, hex;
};
struct Worst {
  std::int64_t index = -1;
  std::vector<std::int64_t> coords;
  Value got, expected, exact;
  double allowance = 0;
};
struct Histogram {
  std::int64_t zero = 0, inf = 0;
  std::vector<std::int64_t> bins;
};
struct Rows {
  std::int64_t count = 0;
  std::vector<std::int64_t> row;
  std::vector<double> mean_over_sigma, max_ulp, max_ratio;
};
struct Output {
  std::string name, verdict, reason, dtype;
  std::int64_t elements = 0, failed = 0, mistrusted = 0, uncertified = 0;
  std::int64_t flushed = 0;  // zeros accepted under a declared flush-to-zero (additive v1; 0 when absent)
  double max_ulp = 0, max_abs = 0, max_rel = 0, max_ratio = 0;
  // The smallest relative fault the comparison is sure to catch (RESULTS.md, "sensitivity";
  // additive v1): absent (nullopt) in older files and where no element qualifies.
  std::optional<double> sensitivity;
  // rstd's probes (RESULTS.md, "probes"): fault name -> its certain error over the allowance.
  std::map<std::string, double> probes;
  std::optional<Worst> worst;
  int log2_min = -20;
  std::optional<Histogram> hist_ulp, hist_ratio;
  std::optional<Rows> rows;
};
// One dialect of the diagnosis (issue 6), best first in a case.
struct Diagnosis {
  std::string dialect, fault_class, title, evidence;
  double score = 0;  // max error in tolerance units against the dialect
  bool explains = false;
  std::string parameters;  // JSON text of the optional parameters object ("" when absent)
};
struct Case {
  std::string case_id, verdict, message, repro;
  std::string op, direction, block, dtype, category;  // "" when the results file lacks them
  std::int64_t normalized_size = 0;                   // 0 when the results file lacks it
  double seconds = 0;
  std::vector<Output> outputs;
  std::vector<Diagnosis> diagnosis;
  // A recorded finding of a real library this verdict is (`run --known-findings`): its docs
  // anchor and what it is; "" when none (RESULTS.md, "known_finding").
  std::string known_finding, known_what;
  const Output* worst_output() const;  // the output with the largest max_ratio (nullptr: none)
  std::string op_label() const;        // "layernorm", "rmsnorm backward", "layernorm post block", "—"
};
struct Property {
  std::string name, verdict, reproduce, message;
  std::int64_t tests = 0;
  std::optional<std::uint64_t> seed;
  bool has_counterexample = false;
  std::string cx_fixture, cx_case_id, cx_summary;
  std::vector<std::int64_t> cx_shape;
  std::vector<Diagnosis> diagnosis;
};
struct Finding {
  std::string severity, check, message;
  std::vector<std::string> tensors;
};

// One candidate (or one audited checkpoint) in one mode, from one or more results files.
struct Run {
  std::vector<std::string> sources;  // the results files merged into it
  std::string mode;                  // run, check, prop, audit ("run" when the file has none)
  std::string spec, kind, description, device, fault_class, fault;  // candidate
  std::string reduction = "any";  // the declared reduction class it was judged under
  std::string checkpoint_path, checkpoint_format, checkpoint_profile;  // audit
  std::string fixtures_path, fixtures_tier, generator_version, command;
  std::optional<std::uint64_t> fixtures_seed;
  std::vector<Case> cases;  // sorted by case id
  std::vector<Property> properties;
  std::vector<Finding> findings;
  std::vector<std::string> errors;  // runs that stopped early: what happened
  // Recorded findings (`run --known-findings`) whose case ran with another verdict.
  std::vector<std::string> stale_findings;
  double seconds = 0;

  std::string name() const;  // the candidate's spec, or the checkpoint's path
  bool is_mutant() const { return kind == "mutant"; }
  // Verdict counts of cases (modes run/check), of properties (prop), of severities (audit).
  std::map<std::string, std::int64_t> counts() const;
  // Cases, properties or error findings that failed; for a candidate held to recorded findings,
  // the failing cases that are none, and each recorded finding that no longer shows.
  std::int64_t failures() const;
  std::int64_t known_findings() const;  // cases whose verdict is a recorded finding
  // What the run means: a mutant must be rejected (at least one failure), anything else must
  // have none; a run with no case compared conforms vacuously and says so.
  bool ok() const;
  std::string outcome() const;  // "conforms", "FAILED", "rejected (as it must be)", "NOT REJECTED" ...
};

struct Report {
  std::vector<Run> runs;  // in the order of their first results file
  bool ok() const;
};

// Parses one results file's text; `source` names it in messages. Throws ReportError.
Run parse_results(const std::string& text, const std::string& source);
// Reads one results file. Throws ReportError.
Run read_results(const std::string& path);
// Merges runs of the same candidate (or checkpoint) and mode: the cases of shards join (the same
// case twice is an error); runs of other candidates stay apart. Throws ReportError.
Report merge(std::vector<Run> runs);

// The writers. Each returns the whole document as text.
std::string junit_xml(const Report& r);
std::string markdown(const Report& r);
std::string summary_json(const Report& r);
// `plot_library`: the JavaScript of the plotting library, inlined into the page; `license` its
// license text, inlined as a comment. An empty `plot_library` gives the page without plots and a
// note saying why.
std::string html(const Report& r, const std::string& plot_library, const std::string& license);

// The plotting library bundled with normcheck (reports/web, installed by scripts/install-deps.sh):
// its JavaScript and license text, read from NORMCHECK_CHARTJS_DIR or the build's default.
// Throws ReportError when it is not installed.
struct PlotLibrary {
  std::string name, version, js, license;
};
PlotLibrary load_plot_library();

// Writes `text` to `path` atomically (temporary file + rename); an existing file is replaced only
// with `overwrite`. Throws ReportError.
void write_file_atomic(const std::string& path, const std::string& text, bool overwrite);

// What `normcheck report` and the --junit/--markdown/--html/--summary-json flags of run and check
// write: every path that is not empty. Checks first that no output exists (without
// `overwrite`), then writes each atomically. `html_dir` gets index.html. Returns the paths
// written. Throws ReportError.
struct Targets {
  std::string junit, markdown, html_dir, summary_json;
  bool overwrite = false;
  bool any() const { return !junit.empty() || !markdown.empty() || !html_dir.empty() || !summary_json.empty(); }
};
std::vector<std::string> write_reports(const Report& r, const Targets& t);

}  // namespace normcheck::reports
