// JUnit XML: the dialect GitLab, Jenkins and GitHub test reporters read (reports/junit.xsd).
//
// One <testsuite> per candidate (or checkpoint), one <testcase> per case (per property, per
// audit finding). FAILED and MISSING cases are <failure>s, CRASHED and TIMEOUT <error>s,
// UNSUPPORTED cases and recorded findings (`run --known-findings`) <skipped>; the failure text
// carries each failing output's worst element (decimal and hex float), the diagnosis and the
// repro command. A mutant must be rejected: its cases are
// testcases that pass, with what caught it in <system-out>, and one more testcase, "rejected",
// fails when no case did. The verdicts thus agree with `run --expect-reject`.
#include <fmt/core.h>

#include <cmath>

#include "normcheck/reports/report.hpp"
#include "text.hpp"

namespace normcheck::reports {

namespace {

using text::xml_escape;

struct Suite {
  std::string body;
  int tests = 0, failures = 0, errors = 0, skipped = 0;
  double time = 0;
};

std::string seconds(double s) { return fmt::format("{:.6f}", s >= 0 && std::isfinite(s) ? s : 0.0); }

// One testcase; `kind`: "" (passed), "failure", "error", "skipped".
void testcase(Suite& s, const std::string& classname, const std::string& name, double time, const std::string& kind,
              const std::string& type, const std::string& message, const std::string& detail,
              const std::string& out) {
  ++s.tests;
  s.time += time;
  s.body += fmt::format("    <testcase name=\"{}\" classname=\"{}\" time=\"{}\"", xml_escape(name),
                        xml_escape(classname), seconds(time));
  if (kind.empty() && out.empty()) {
    s.body += "/>\n";
    return;
  }
  s.body += ">\n";
  if (!kind.empty()) {
    if (kind == "failure") ++s.failures;
    if (kind == "error") ++s.errors;
    if (kind == "skipped") ++s.skipped;
    s.body += fmt::format("      <{} type=\"{}\" message=\"{}\">{}</{}>\n", kind, xml_escape(type), xml_escape(message),
                          xml_escape(detail), kind);
  }
  if (!out.empty()) s.body += "      <system-out>" + xml_escape(out) + "</system-out>\n";
  s.body += "    </testcase>\n";
}

// The one-line message of a case that did not pass: its first non-passing output's reason.
std::string case_message(const Case& c) {
  if (!c.message.empty()) return c.verdict + ": " + c.message;
  for (const auto& o : c.outputs)
    if (o.verdict == c.verdict) return c.verdict + ": " + o.name + ": " + o.reason;
  return c.verdict;
}

Suite suite_of(const Run& r) {
  Suite s;
  const std::string cls = r.name();
  for (const auto& c : r.cases) {
    const std::string detail = text::case_detail(c);
    if (r.is_mutant()) {
      const bool caught = is_failure(c.verdict);
      testcase(s, cls, c.case_id, c.seconds, c.verdict == "UNSUPPORTED" ? "skipped" : "", c.verdict,
               case_message(c), detail, c.verdict == "PASSED" ? "" : (caught ? "caught the mutant: " : "") + detail);
      continue;
    }
    if (!c.known_finding.empty() && is_failure(c.verdict))  // `run --known-findings`: recorded, not a failure
      testcase(s, cls, c.case_id, c.seconds, "skipped", c.verdict,
               "known finding " + c.known_finding + (c.known_what.empty() ? "" : ": " + c.known_what) + " (" +
                   c.verdict + ")",
               "", "");
    else if (c.verdict == "FAILED" || c.verdict == "MISSING")
      testcase(s, cls, c.case_id, c.seconds, "failure", c.verdict, case_message(c), detail, "");
    else if (c.verdict == "CRASHED" || c.verdict == "TIMEOUT")
      testcase(s, cls, c.case_id, c.seconds, "error", c.verdict, case_message(c), detail, "");
    else if (c.verdict == "UNSUPPORTED")
      testcase(s, cls, c.case_id, c.seconds, "skipped", c.verdict, case_message(c), "", "");
    else  // PASSED; MISTRUSTED compares what it can trust and is not a failure
      testcase(s, cls, c.case_id, c.seconds, "", "", "", "", c.verdict == "MISTRUSTED" ? detail : "");
  }
  for (const auto& p : r.properties) {
    const std::string detail = text::property_detail(p);
    const std::string msg = p.verdict + (p.message.empty() ? "" : ": " + p.message);
    const std::string kind = p.verdict == "FAILED"      ? "failure"
                             : p.verdict == "CRASHED"   ? "error"
                             : p.verdict == "UNSUPPORTED" ? "skipped"
                                                          : "";
    if (r.is_mutant())  // a mutant is caught by a failing property: that is what must happen
      testcase(s, cls, p.name, 0, p.verdict == "UNSUPPORTED" ? "skipped" : "", p.verdict, msg, detail,
               p.verdict == "PASSED" ? "" : detail);
    else
      testcase(s, cls, p.name, 0, kind, p.verdict, msg, detail, "");
  }
  for (std::size_t i = 0; i < r.findings.size(); ++i) {
    const auto& f = r.findings[i];
    std::string tensors;
    for (const auto& t : f.tensors) tensors += (tensors.empty() ? "" : ", ") + t;
    const std::string name = fmt::format("{} {}{}", f.check, i + 1, tensors.empty() ? "" : " (" + tensors + ")");
    const std::string detail = f.severity + " " + f.check + ": " + f.message + (tensors.empty() ? "" : "\n  tensors: " + tensors);
    testcase(s, cls, name, 0, f.severity == "error" ? "failure" : "", f.severity, f.message, detail,
             f.severity == "error" ? "" : detail);
  }
  if (r.mode == "audit" && r.findings.empty()) testcase(s, cls, "audit", r.seconds, "", "", "", "", "");
  if (r.is_mutant()) {
    const bool rejected = r.failures() > 0;
    testcase(s, cls, "rejected", 0, rejected ? "" : "failure", "NOT REJECTED",
             "the mutant passed every case: the suite does not detect its fault",
             fmt::format("mutant {} (class {}: {}) passed every case it ran", r.spec, r.fault_class, r.fault),
             rejected ? fmt::format("rejected: {} failing case{} or propert{}", r.failures(), r.failures() == 1 ? "" : "s",
                                      r.failures() == 1 ? "y" : "ies")
                      : "");
  }
  for (const auto& e : r.errors)
    testcase(s, cls, "run", 0, "error", "stopped early", e, e, "");
  return s;
}

}  // namespace

std::string junit_xml(const Report& r) {
  std::string body;
  int tests = 0, failures = 0, errors = 0, skipped = 0;
  double time = 0;
  for (const auto& run : r.runs) {
    const Suite s = suite_of(run);
    tests += s.tests;
    failures += s.failures;
    errors += s.errors;
    skipped += s.skipped;
    time += s.time;
    std::string name = run.name();
    if (!run.kind.empty()) name += " (" + run.kind + ")";
    if (run.mode != "run") name += " [" + run.mode + "]";
    body += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{}\">\n",
                        xml_escape(name), s.tests, s.failures, s.errors, s.skipped, seconds(s.time));
    body += "    <properties>\n";
    auto prop = [&](const char* k, const std::string& v) {
      if (!v.empty()) body += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", k, xml_escape(v));
    };
    prop("mode", run.mode);
    prop("kind", run.kind);
    prop("description", run.description);
    prop("device", run.device);
    prop("fault_class", run.fault_class);
    prop("fault", run.fault);
    prop("checkpoint_format", run.checkpoint_format);
    prop("checkpoint_profile", run.checkpoint_profile);
    prop("fixtures", run.fixtures_path);
    prop("outcome", run.outcome());
    for (const auto& src : run.sources) prop("results_file", src);
    body += "    </properties>\n";
    body += s.body;
    body += "  </testsuite>\n";
  }
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                     "<testsuites name=\"normcheck\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" "
                     "time=\"{}\">\n{}</testsuites>\n",
                     tests, failures, errors, skipped, seconds(time), body);
}

}  // namespace normcheck::reports
