// The JSON summary (format normcheck-report-summary v1, reports/README.md): the numbers of the
// Markdown summary for programs (dashboards, trend tracking).
#include <nlohmann/json.hpp>

#include "normcheck/reports/report.hpp"
#include "text.hpp"

namespace normcheck::reports {

namespace {

using Json = nlohmann::ordered_json;

Json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

}  // namespace

std::string summary_json(const Report& r) {
  Json j;
  j["format"] = kSummaryFormat;
  j["format_version"] = kSummaryFormatVersion;
  j["ok"] = r.ok();
  Json runs = Json::array();
  for (const auto& run : r.runs) {
    Json x;
    x["name"] = run.name();
    x["mode"] = run.mode;
    if (!run.kind.empty()) x["kind"] = run.kind;
    if (!run.fault_class.empty()) x["fault_class"] = run.fault_class;
    x["sources"] = run.sources;
    Json counts = Json::object();
    const auto n = run.counts();
    if (run.mode == "run" || run.mode == "check") {
      for (const auto& v : kVerdictColumns) counts[v] = n.at(v);
    } else {
      for (const auto& [k, v] : n) counts[k] = v;
    }
    x["counts"] = std::move(counts);
    x["failures"] = run.failures();
    x["ok"] = run.ok();
    x["outcome"] = run.outcome();
    Json matrix = Json::array();
    for (const auto& m : text::matrix_of(run)) {
      Json cell = Json::object();  // the verdicts that occur, in the results file's order
      for (const auto& v : kVerdictColumns)
        if (m.counts.at(v)) cell[v] = m.counts.at(v);
      matrix.push_back(Json{{"op", m.op}, {"dtype", m.dtype}, {"category", m.category}, {"counts", cell}});
    }
    x["matrix"] = std::move(matrix);
    Json failing = Json::array();
    for (const auto& c : run.cases) {
      if (!is_failure(c.verdict)) continue;
      Json f{{"case_id", c.case_id}, {"verdict", c.verdict}};
      if (const Output* o = c.worst_output()) {
        f["output"] = o->name;
        f["max_ulp"] = number(o->max_ulp);
        f["max_ratio"] = number(o->max_ratio);
      }
      if (!c.diagnosis.empty()) f["diagnosis"] = c.diagnosis.front().dialect;
      if (!c.repro.empty()) f["repro"] = c.repro;
      failing.push_back(std::move(f));
    }
    x["failing_cases"] = std::move(failing);
    if (run.mode == "prop") {
      Json props = Json::array();
      for (const auto& p : run.properties)
        if (p.verdict == "FAILED" || p.verdict == "CRASHED") props.push_back(Json{{"name", p.name}, {"verdict", p.verdict}});
      x["failing_properties"] = std::move(props);
    }
    if (run.mode == "audit") {
      Json errs = Json::array();
      for (const auto& f : run.findings)
        if (f.severity == "error") errs.push_back(Json{{"check", f.check}, {"tensors", f.tensors}});
      x["error_findings"] = std::move(errs);
    }
    if (!run.errors.empty()) x["errors"] = run.errors;
    runs.push_back(std::move(x));
  }
  j["runs"] = std::move(runs);
  return j.dump(1) + "\n";
}

}  // namespace normcheck::reports
