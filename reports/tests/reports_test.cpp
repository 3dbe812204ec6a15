// The reader and the merge of results files, and the text the writers share.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "normcheck/reports/report.hpp"
#include "text.hpp"

namespace nr = normcheck::reports;

namespace {

// A minimal valid results file with the given cases (JSON text) and summary counts.
std::string results(const std::string& spec, const std::string& kind, const std::string& cases, int passed, int failed) {
  return R"({"format": "normcheck-results", "format_version": 1, "candidate": {"spec": ")" + spec + R"(", "kind": ")" +
         kind + R"("}, "cases": [)" + cases + R"(], "summary": {"PASSED": )" + std::to_string(passed) +
         R"(, "FAILED": )" + std::to_string(failed) +
         R"(, "UNSUPPORTED": 0, "MISTRUSTED": 0, "CRASHED": 0, "TIMEOUT": 0, "MISSING": 0}})";
}

const std::string kPassed = R"({"case_id": "a", "verdict": "PASSED", "outputs": [{"name": "y", "verdict": "PASSED",
  "max_ulp": 0.5, "max_ratio": 0.25}]})";
const std::string kFailed = R"({"case_id": "b", "verdict": "FAILED", "outputs": [
  {"name": "mean", "verdict": "PASSED", "max_ratio": 0.9},
  {"name": "y", "verdict": "FAILED", "reason": "1 of 4 elements beyond their allowance", "max_ulp": "inf", "max_ratio": "inf",
   "worst": {"index": 3, "coords": [1, 1], "got": {"decimal": "nan", "hex": "nan"}, "expected": {"decimal": "0.5", "hex": "0x1p-1"},
             "exact": {"decimal": "0.5", "hex": "0x1p-1"}, "allowance": 1e-7}},
  {"name": "rstd", "verdict": "PASSED", "max_ratio": 0.1}],
  "repro": "normcheck run --candidate builtin:x --fixtures f.h5 --cases b"})";

std::string error_of(const std::string& text) {
  try {
    nr::parse_results(text, "r.json");
  } catch (const nr::ReportError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Reader, ReadsCasesOutputsAndNonFiniteNumbers) {
  const nr::Run r = nr::parse_results(results("builtin:x", "correct", kFailed + "," + kPassed, 1, 1), "r.json");
  EXPECT_EQ(r.mode, "run");  // absent: run/check
  ASSERT_EQ(r.cases.size(), 2u);
  EXPECT_EQ(r.cases[0].case_id, "a");  // sorted by id
  const nr::Case& b = r.cases[1];
  ASSERT_EQ(b.outputs.size(), 3u);
  EXPECT_TRUE(std::isinf(b.outputs[1].max_ulp));
  ASSERT_TRUE(b.outputs[1].worst.has_value());
  EXPECT_EQ(b.outputs[1].worst->coords, (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(b.outputs[1].worst->expected.hex, "0x1p-1");
  // The worst output is the failing one, not the passing output with a larger finite ratio.
  ASSERT_NE(b.worst_output(), nullptr);
  EXPECT_EQ(b.worst_output()->name, "y");
  EXPECT_EQ(r.failures(), 1);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.outcome(), "FAILED");
  EXPECT_EQ(b.op_label(), "—");  // a results file without the op field
}

TEST(Reader, MutantMustBeRejected) {
  EXPECT_TRUE(nr::parse_results(results("builtin:m", "mutant", kFailed, 0, 1), "m.json").ok());
  const nr::Run missed = nr::parse_results(results("builtin:m", "mutant", kPassed, 1, 0), "m.json");
  EXPECT_FALSE(missed.ok());
  EXPECT_EQ(missed.outcome(), "NOT REJECTED");
}

// Zeros accepted under a declared flush-to-zero (additive v1 field `flushed`): counted, and said
// in the outcome; a file without the field reads as 0.
TEST(Reader, FlushedZerosAreCountedAndNamedInTheOutcome) {
  const std::string flushed = R"({"case_id": "f", "verdict": "PASSED", "outputs": [{"name": "y", "verdict": "PASSED",
    "flushed": 3, "max_ratio": 0.9}, {"name": "rstd", "verdict": "PASSED", "flushed": 1}]})";
  const nr::Run r = nr::parse_results(results("plugin:k.so", "external", kPassed + "," + flushed, 2, 0), "r.json");
  ASSERT_EQ(r.cases.size(), 2u);
  EXPECT_EQ(r.cases[0].outputs[0].flushed, 0);
  EXPECT_EQ(r.cases[1].outputs[0].flushed, 3);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.outcome(), "conforms (4 zeros accepted as flushed subnormals)");
}

// Sensitivity and rstd's probes (additive v1): read, summarised over the cases of n >= 4096 (the
// median and the best), the n - 1 probe counted on cases of n >= 1024 (caught above 1), the
// declared class shown; older files without the fields give no summary; mutants have none.
TEST(Reader, SensitivityIsSummarisedOverProductionSizes) {
  const auto g = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  const auto c = [&](const std::string& id, int n, double sy, double sr, double probe) {
    return R"({"case_id": ")" + id + R"(", "verdict": "PASSED", "normalized_size": )" + std::to_string(n) +
           R"(, "outputs": [{"name": "y", "verdict": "PASSED", "sensitivity": )" + g(sy) +
           R"(}, {"name": "rstd", "verdict": "PASSED", "sensitivity": )" + g(sr) +
           R"(, "probes": {"variance_over_n_minus_1": )" + g(probe) + R"(, "eps_1e-6": "inf"}}]})";
  };
  std::string text = results("builtin:k", "correct",
                             c("a", 128, 1e-7, 1e-8, 50) + "," + c("b", 4096, 1e-3, 2e-4, 0.5) + "," +
                                 c("c", 8192, 3e-3, 4e-7, 183) + "," + c("d", 4096, 2e-3, 1e-4, 0.9) + "," +
                                 c("e", 1024, 1e-4, 1e-5, 2),
                             5, 0);
  text.replace(text.find(R"("kind": "correct")"), 17, R"("kind": "correct", "reduction": "two_pass")");
  const nr::Run r = nr::parse_results(text, "r.json");
  EXPECT_EQ(r.reduction, "two_pass");
  ASSERT_EQ(r.cases.size(), 5u);
  ASSERT_TRUE(r.cases[0].outputs[1].sensitivity.has_value());
  EXPECT_EQ(r.cases[0].normalized_size, 128);
  EXPECT_TRUE(std::isinf(r.cases[0].outputs[1].probes.at("eps_1e-6")));
  nr::Report rep;
  rep.runs.push_back(r);
  rep.runs.push_back(nr::parse_results(results("builtin:m", "mutant", kFailed, 0, 1), "m.json"));
  rep.runs.push_back(nr::parse_results(results("builtin:old", "correct", kPassed, 1, 0), "o.json"));
  const auto sens = nr::text::sensitivity_of(rep);
  ASSERT_EQ(sens.size(), 1u);  // the mutant and the file without the fields have none
  EXPECT_TRUE(sens[0].production);
  ASSERT_EQ(sens[0].outputs.size(), 2u);
  EXPECT_EQ(sens[0].outputs[0].name, "y");
  EXPECT_EQ(sens[0].outputs[0].cases, 3);  // b, c, d: n >= 4096 only
  EXPECT_DOUBLE_EQ(sens[0].outputs[0].best, 1e-3);
  EXPECT_DOUBLE_EQ(sens[0].outputs[0].median, 2e-3);
  EXPECT_DOUBLE_EQ(sens[0].outputs[1].best, 4e-7);
  EXPECT_EQ(sens[0].n1_cases, 4);  // b, c, d, e (n >= 1024)
  EXPECT_EQ(sens[0].n1_caught, 2);  // c and e
  const std::string md = nr::markdown(rep);
  EXPECT_NE(md.find("| `builtin:k` | `two_pass` | 0.002 (best 0.001) | 0.0001 (best 4e-07) | — | 2 of 4 |"), std::string::npos)
      << md;
}

TEST(Reader, ErrorsNameTheFileAndTheField) {
  EXPECT_NE(error_of("{\"format\": \"normcheck-results\", \"format_ver").find("r.json: not a results file: invalid or truncated JSON"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("the top level is not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "normcheck-fixtures", "format_version": 1})").find("format is \"normcheck-fixtures\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "normcheck-results", "format_version": 2})").find("format_version 2 is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "normcheck-results", "format_version": "1"})").find("format_version \"1\""),
            std::string::npos);
  std::string bad = results("builtin:x", "correct", kPassed, 1, 0);
  bad.replace(bad.find("\"max_ulp\": 0.5"), 14, "\"max_ulp\": [1]");
  EXPECT_NE(error_of(bad).find("r.json: cases[0].outputs[0].max_ulp: expected a number"), std::string::npos) << error_of(bad);
  std::string verdict = results("builtin:x", "correct", kPassed, 1, 0);
  verdict.replace(verdict.find("\"PASSED\", \"outputs\""), 8, "\"PASSD\"");
  EXPECT_NE(error_of(verdict).find("cases[0].verdict: 'PASSD' is not one of"), std::string::npos) << error_of(verdict);
  EXPECT_NE(error_of(results("builtin:x", "correct", kPassed, 2, 0)).find("summary.PASSED: says 2 but the file holds 1"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "normcheck-results", "format_version": 1, "cases": []})").find("candidate: missing"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "normcheck-results", "format_version": 1, "mode": "bench"})").find("mode: 'bench' is not one of"),
            std::string::npos);
}

TEST(Reader, PropertyAndAuditModes) {
  const nr::Run p = nr::parse_results(R"({"format": "normcheck-results", "format_version": 1, "mode": "prop",
    "candidate": {"spec": "builtin:cpu_welford", "kind": "correct"},
    "properties": [{"name": "p1", "verdict": "PASSED", "tests": 100, "seed": 7},
                   {"name": "p2", "verdict": "CRASHED", "message": "segfault"}],
    "summary": {"PASSED": 1, "FAILED": 0, "UNSUPPORTED": 0, "CRASHED": 1}})", "p.json");
  EXPECT_EQ(p.properties.size(), 2u);
  EXPECT_EQ(*p.properties[0].seed, 7u);
  EXPECT_EQ(p.failures(), 1);
  EXPECT_EQ(p.counts().at("CRASHED"), 1);
  const nr::Run a = nr::parse_results(R"({"format": "normcheck-results", "format_version": 1, "mode": "audit",
    "checkpoint": {"path": "m.gguf", "format": "gguf"},
    "findings": [{"severity": "warning", "check": "c", "tensors": ["t"], "message": "m"}],
    "summary": {"error": 0, "warning": 1, "info": 0}})", "a.json");
  EXPECT_EQ(a.name(), "m.gguf");
  EXPECT_TRUE(a.ok());  // warnings are not failures
  EXPECT_EQ(a.outcome(), "no errors");
  EXPECT_NE(error_of(R"({"format": "normcheck-results", "format_version": 1, "mode": "audit", "checkpoint": {"path": "m"},
    "findings": [{"severity": "fatal", "check": "c"}]})").find("findings[0].severity: 'fatal' is not one of"),
            std::string::npos);
}

TEST(Merge, ShardsJoinCandidatesStayApartDuplicatesAreErrors) {
  std::vector<nr::Run> runs;
  runs.push_back(nr::parse_results(results("builtin:x", "correct", kPassed, 1, 0), "s1.json"));
  runs.push_back(nr::parse_results(results("builtin:y", "correct", kPassed, 1, 0), "y.json"));
  runs.push_back(nr::parse_results(results("builtin:x", "correct", kFailed, 0, 1), "s2.json"));
  const nr::Report rep = nr::merge(runs);
  ASSERT_EQ(rep.runs.size(), 2u);
  EXPECT_EQ(rep.runs[0].name(), "builtin:x");
  EXPECT_EQ(rep.runs[0].cases.size(), 2u);
  EXPECT_EQ(rep.runs[0].sources, (std::vector<std::string>{"s1.json", "s2.json"}));
  EXPECT_FALSE(rep.ok());
  runs.push_back(nr::parse_results(results("builtin:x", "correct", kPassed, 1, 0), "again.json"));
  EXPECT_THROW(nr::merge(runs), nr::ReportError);
}

TEST(Text, EscapingAndNumbers) {
  namespace t = nr::text;
  EXPECT_EQ(t::xml_escape("a<b & \"c\" 'd'\x01"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;?");
  EXPECT_EQ(t::md_cell("a|b\nc"), "a\\|b<br>c");
  EXPECT_EQ(t::md_code("x `y`"), "`` x `y` ``");
  EXPECT_EQ(t::num(INFINITY), "inf");
  EXPECT_EQ(t::num(NAN), "nan");
  EXPECT_EQ(t::num(12.5), "12.5");
  EXPECT_EQ(t::num(1234567), "1.23e+06");
}

TEST(Write, AtomicAndNeverOverwritesWithoutForce) {
  const auto dir = std::filesystem::temp_directory_path() / ("nc_reports_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / "r.md").string();
  nr::write_file_atomic(p, "one", false);
  EXPECT_THROW(nr::write_file_atomic(p, "two", false), nr::ReportError);
  std::ifstream in(p);
  std::string got;
  std::getline(in, got);
  EXPECT_EQ(got, "one");
  nr::write_file_atomic(p, "two", true);
  std::ifstream in2(p);
  std::getline(in2, got);
  EXPECT_EQ(got, "two");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}
