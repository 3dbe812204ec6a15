// normcheck-shard-check: the replay of a sharded property's counterexample (--emulate PLAN: the
// emulation of a plan checked on every case of a fixture file), and a compatibility alias for
// sharded outputs files, which `normcheck check --outputs` judges itself (the same
// check_sharded_file; conformance/sharding/README.md says why the alias stays).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

#include "normcheck/fixtures/error.hpp"
#include "normcheck/reference/heap.hpp"
#include "normcheck/sharding/shard.hpp"

using namespace normcheck;

int main(int argc, char** argv) {
  ref::keep_freed_memory();  // as the normcheck executable does (heap.hpp)
  CLI::App app{
      "Check sharded outputs files against unsharded certified fixtures (conformance/sharding/README.md)"};
  std::string fixtures, emulate_plan, fault;
  std::vector<std::string> outputs;
  bool expect_reject = false, quiet = false;
  app.add_option("--fixtures", fixtures, "The fixture file the runtime ran")->required();
  app.add_option("outputs", outputs, "Sharded outputs files (one per plan)");
  app.add_option("--emulate", emulate_plan,
                 "Instead of outputs files: check the C++ emulation of this shard plan on every case of the "
                 "fixture file (the replay of a sharded property's counterexample)");
  app.add_option(
      "--fault", fault,
      "With --emulate: plant this fault (rank_local, div_world, not_reduced, averaged, reduced_twice)");
  app.add_flag(
      "--expect-reject", expect_reject,
      "Exit 0 only if some case of the files is FAILED, CRASHED, TIMEOUT or MISSING (a mutant's plans)");
  app.add_flag("--quiet", quiet, "Only the summary line of each file");
  CLI11_PARSE(app, argc, argv);
  if (outputs.empty() == emulate_plan.empty()) {
    std::fprintf(stderr,
                 "normcheck-shard-check: give sharded outputs files or --emulate PLAN (one of the two)\n");
    return 2;
  }
  if (!fault.empty() && emulate_plan.empty()) {
    std::fprintf(stderr,
                 "normcheck-shard-check: --fault plants a fault in the emulation: it needs --emulate PLAN\n");
    return 2;
  }
  if (!emulate_plan.empty()) {
    bool known = fault.empty();
    for (const auto& f : shard::emulated_faults()) known = known || f.name == fault;
    if (!known) {
      std::fprintf(stderr,
                   "normcheck-shard-check: --fault %s: not a fault of the emulation (rank_local, div_world, "
                   "not_reduced, averaged, reduced_twice)\n",
                   fault.c_str());
      return 2;
    }
  }
  try {
    fix::FixtureReader fx(fixtures);
    bool all_ok = true, any_rejected = false;
    if (!emulate_plan.empty()) {
      // The emulation of the plan on every case of the file: what a sharded property's
      // counterexample ran (property_tests/README.md, "Sharded norms on the emulation").
      shard::Plan plan;
      try {
        plan = shard::parse_plan(emulate_plan);
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "normcheck-shard-check: --emulate: %s\n", e.what());
        return 2;
      }
      std::map<conf::Verdict, int> counts;
      for (const auto& id : fx.case_ids()) {
        const fix::FixtureCase fc = fx.read_case_later(id).finish_checked();  // a damaged fixture: exit 2
        shard::ShardedOutputs got;
        try {
          got = shard::emulate(fc.c, plan, fault);
        } catch (const std::invalid_argument& e) {
          throw fix::FixtureError(
              fixtures, fmt::format("case {}: cannot emulate plan {}: {}", id, emulate_plan, e.what()));
        }
        const conf::CaseResult r = shard::check_sharded(fc, plan, got);
        counts[r.verdict] += 1;
        if (r.verdict == conf::Verdict::passed || quiet) continue;
        fmt::print("{} {} [{}{}]: {}{}\n", fixtures, id, emulate_plan,
                   fault.empty() ? "" : ", fault " + fault, conf::name_of(r.verdict),
                   r.message.empty() ? "" : " " + r.message);
        for (const auto& o : r.outputs)
          if (o.verdict != conf::Verdict::passed)
            fmt::print("    {} {}: {}\n", o.name, conf::name_of(o.verdict), o.reason);
      }
      std::string summary;
      for (const auto& [v, n] : counts) {
        summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, conf::name_of(v));
        all_ok = all_ok && !conf::is_failure(v);
      }
      fmt::print("{} (emulated {}{}): {}\n", fixtures, emulate_plan, fault.empty() ? "" : ", fault " + fault,
                 summary.empty() ? "no cases" : summary);
      if (expect_reject) return all_ok ? 1 : 0;
      return all_ok ? 0 : 1;
    }
    for (const auto& path : outputs) {
      // The same judgement as `normcheck check --fixtures F --outputs PATH` (check_sharded_file),
      // printed one file after another as this alias always did.
      conf::RunOptions opt;
      opt.fixtures = fixtures;
      opt.outputs = path;
      conf::CandidateRun run;
      try {
        run = shard::check_sharded_file(opt);
      } catch (const std::invalid_argument& e) {
        throw fix::FixtureError(path, e.what());
      }
      if (!run.error.empty()) throw fix::FixtureError(fixtures, run.error);
      double seconds = 0;
      for (const auto& r : run.cases) {
        seconds += r.seconds;
        if (r.verdict == conf::Verdict::passed || quiet) continue;
        fmt::print("{} {}: {}{}\n", path, r.case_id, conf::name_of(r.verdict),
                   r.message.empty() ? "" : " " + r.message);
        for (const auto& o : r.outputs)
          if (o.verdict != conf::Verdict::passed)
            fmt::print("    {} {}: {}\n", o.name, conf::name_of(o.verdict), o.reason);
      }
      bool failed = false;
      std::string summary;
      std::int64_t cases = 0;
      for (const auto& [v, n] : run.summary) {
        summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, conf::name_of(v));
        failed = failed || conf::is_failure(v);
        cases += n;
      }
      fmt::print("{}: {} ({:.1f} ms per case in the ranks)\n", path, summary.empty() ? "no cases" : summary,
                 cases == 0 ? 0.0 : 1e3 * seconds / static_cast<double>(cases));
      all_ok = all_ok && !failed;
      any_rejected = any_rejected || failed;
    }
    if (expect_reject) return any_rejected ? 0 : 1;
    return all_ok ? 0 : 1;
  } catch (const fix::FixtureError& e) {
    std::fprintf(stderr, "normcheck-shard-check: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "normcheck-shard-check: internal error: %s\n", e.what());
    return 3;
  }
}
