// The results file is written a case at a time (write_results_json): its text must be exactly
// what one JSON tree of the whole file dumps (keys in the order written; reports/RESULTS.md),
// whatever the cases hold.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "../judge/tests/test_cases.hpp"

namespace normcheck::conf {
namespace {

// A run with a passing case, a FAILED one with its diagnosis, and an UNSUPPORTED one whose
// reason holds characters JSON escapes (quote, backslash, newline, tab).
CandidateRun three_cases() {
  std::mt19937_64 rng(7);
  auto fc = test::fixture_of(test::ln_case(4, 64, test::normal(rng, 256, 3, 1, ref::DType::float32)));
  const auto allow = derive_allowances(fc.c);
  CandidateRun run;
  run.info.name = "builtin:test";
  fc.id = "passes";
  Outputs right = test::certified(fc);
  run.cases.push_back(check_case(fc, right, allow));
  describe_case(run.cases.back(), fc);
  Outputs wrong = right;
  for (auto& v : wrong.at("y").data) v *= 1 + 0x1p-9;
  fc.id = "fails";
  CaseResult failed = check_case(fc, wrong, allow);
  describe_case(failed, fc);
  failed.diagnosis = diagnose(fc, wrong, allow);
  failed.diagnosed = true;
  EXPECT_EQ(failed.verdict, Verdict::failed);
  EXPECT_FALSE(failed.diagnosis.empty());
  run.cases.push_back(std::move(failed));
  CaseResult unsupported;
  unsupported.case_id = "declined";
  unsupported.verdict = Verdict::unsupported;
  unsupported.message = "a \"quoted\" C:\\path\nsecond line\tand a tab";
  run.cases.push_back(std::move(unsupported));
  for (const auto& c : run.cases) ++run.summary[c.verdict];
  return run;
}

ResultsContext context() {
  ResultsContext ctx;
  ctx.command = "normcheck run --fixtures \"a b.h5\"";
  ctx.fixtures_path = "a b.h5";
  ctx.repro = [](const std::string& id) { return "normcheck run --cases " + id; };
  return ctx;
}

TEST(ResultsFile, WrittenCaseByCaseIsTheWholeTreesText) {
  const CandidateRun run = three_cases();
  std::ostringstream os;
  write_results_json(os, run, context());
  const std::string text = os.str();
  const auto tree = nlohmann::ordered_json::parse(text);
  ASSERT_EQ(tree.at("cases").size(), 3u);
  EXPECT_EQ(tree["cases"][1]["case_id"], "fails");
  EXPECT_EQ(tree["cases"][2]["message"], "a \"quoted\" C:\\path\nsecond line\tand a tab");
  EXPECT_EQ(text, tree.dump(1) + "\n");
  EXPECT_EQ(results_json(run, context()), text);
}

TEST(ResultsFile, NoCases) {
  CandidateRun run;
  run.info.name = "builtin:test";
  const std::string text = results_json(run, context());
  const auto tree = nlohmann::ordered_json::parse(text);
  EXPECT_TRUE(tree.at("cases").empty());
  EXPECT_EQ(text, tree.dump(1) + "\n");
}

}  // namespace
}  // namespace normcheck::conf
