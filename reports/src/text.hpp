// Text shared by the writers: numbers, the description of a failing case, escaping.
#pragma once

#include <string>

#include "normcheck/reports/report.hpp"

namespace normcheck::reports::text {

// A number for people: %.3g, "inf", "nan".
std::string num(double v);
// "[0, 5]"
std::string coords(const std::vector<std::int64_t>& c);
// One line: "y at [0, 5] (flat 5): got 1 (0x1p+0), expected ..., exact ...; error 3 ulp = 2.1 x the allowance 1e-07"
std::string worst_line(const Output& o);
// One line per dialect: "eps_outside_sqrt (class A, eps added outside the sqrt): explains the failure, score 0.4 — evidence"
std::string diagnosis_line(const Diagnosis& d);
// The whole story of a case that did not pass: verdict, message, each output that did not pass
// with its worst element, the diagnosis, the repro command. Several lines.
std::string case_detail(const Case& c);
// Property verdict, counterexample, diagnosis, reproduce.
std::string property_detail(const Property& p);

// The conformance matrix of one run: verdict counts per (op, dtype, category), sorted.
struct MatrixRow {
  std::string op, dtype, category;
  std::map<std::string, std::int64_t> counts;  // every verdict of kVerdictColumns
  std::int64_t total = 0;
};
std::vector<MatrixRow> matrix_of(const Run& r);

// Cases that did not pass (failures; for mutants too), most severe first: by verdict failure,
// then by the worst output's max_ratio.
struct Ranked {
  const Run* run;
  const Case* c;
};
std::vector<Ranked> failing_cases(const Report& r, bool mutants);

// Sensitivity of one candidate (RESULTS.md, "sensitivity"; TOLERANCE.md 6.1): for y, rstd and
// dweight, the smallest relative fault its comparisons were sure to catch, summarised over the
// cases at production sizes (normalized size >= kProductionSize; over every case when it ran
// none), and how many cases of n >= 1024 would catch a variance divided by n - 1 (rstd's probe
// variance_over_n_minus_1 above 1).
inline constexpr std::int64_t kProductionSize = 4096;
struct SensitivityOutput {
  std::string name;
  std::int64_t cases = 0;       // cases with a sensitivity for this output in the summarised set
  double best = 0, median = 0;  // the smallest and the median over them
};
struct SensitivitySummary {
  const Run* run = nullptr;
  bool production = false;                // summarised over n >= kProductionSize
  std::vector<SensitivityOutput> outputs;  // y, rstd, dweight (those present)
  std::int64_t n1_cases = 0, n1_caught = 0;
};
// Correct and external candidates of modes run/check with at least one sensitivity.
std::vector<SensitivitySummary> sensitivity_of(const Report& r);

std::string xml_escape(const std::string& s);   // also drops characters XML 1.0 forbids
std::string html_escape(const std::string& s);
std::string md_cell(const std::string& s);      // a Markdown table cell: | escaped, newlines -> <br>
std::string md_code(const std::string& s);      // an inline code span, backticks in s kept

// Text inlined into a page: nothing in it may end the <script> element ("</" escaped) or the
// HTML comment ("--" broken) early.
std::string script_safe(std::string s);
std::string comment_safe(std::string s);

// The start of every page's script (html.cpp, study_placement.cpp): it opens the function the
// page's own script closes, and defines the page check (#nc-status: data-status, data-errors,
// data-charts, data-blank, data-views; update(), record(), the error hooks), `data` (parsed from
// #nc-data), `charts`, num(), drawn(), make(parent, title, config, width) (a titled canvas,
// counted and checked for pixels) and decade(); it returns early when Chart.js is missing.
const char* page_script_prologue();

}  // namespace normcheck::reports::text
