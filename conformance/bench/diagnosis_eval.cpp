// Measures the diagnosis panel on the bundled CPU mutants (conformance/DIAGNOSIS.md):
//   - for every FAILED case of every mutant, the rank of the planted fault among the dialects
//     (top-1 and top-3 rates), and whether the best dialect "explains" the outputs (score <= 1);
//   - that no passing case of any candidate (correct kernels included) gets a diagnosis, through
//     the runner's own path (run_candidates);
//   - the time of the diagnosis against the time of checking the same failing cases
//     (derive_allowances + check_case), in CPU time of the thread.
//
//   diagnosis_eval FIXTURES.h5 [--assert] [--verbose]
// --assert exits 1 when top-1 < 97 % or top-3 < 99 % (over the mutants whose fault has a
// dialect; the smoke tier measures 98.3 % and 99.6 %, DIAGNOSIS.md), a passing case carries a
// diagnosis, a FAILED one has none, or a correct kernel fails. Times are printed, not asserted (CI machines are shared).
//
// The planted fault of each mutant is named by the fault catalogue (normcheck/judge/faults.hpp):
// the mutant names its fault id, and the catalogue the dialects that name that fault.
#include <fmt/core.h>
#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <ctime>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/faults.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/reference/heap.hpp"

using namespace normcheck;

namespace {

// The dialects that name a mutant's planted fault: the catalogue's (its fault id is the
// mutant's metadata, not read from its code). Empty: the panel has no dialect for it.
std::set<std::string> planted(const conf::CandidateInfo& mutant) {
  const auto d = conf::dialects_naming(mutant.fault_id);
  return {d.begin(), d.end()};
}

// Whether a mutant's planted fault is one of the quantization step (class H).
bool quant_fault(const conf::CandidateInfo& mutant) {
  const conf::FaultEntry* f = conf::find_fault(mutant.fault_id);
  return f && f->cls == 'H';
}

struct Tally {
  int failing = 0, top1 = 0, top3 = 0, explained = 0, nothing = 0;
};

// CPU time of this thread: the machines that run this are shared, wall time is not comparable.
double now() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

static constexpr const char* kUsage =
    "usage: diagnosis_eval FIXTURES.h5 [--assert] [--verbose] [--cases GLOB] [--repeat N] [--no-runner]\n"
    "  --repeat N    time each failing case's check and diagnosis N times, the least CPU time of each\n"
    "                counted (on a shared machine the spread of one timing is larger than a change)\n"
    "  --no-runner   skip the last pass (the runner's path: diagnoses attached to the right cases)\n";

static int evaluate(int argc, char** argv) {
  std::string path;
  bool assert_targets = false, verbose = false, runner_pass = true;
  int repeat = 1;
  std::string glob = "*";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      fmt::print("{}", kUsage);
      return 0;
    } else if (!std::strcmp(argv[i], "--assert")) {
      assert_targets = true;
    } else if (!std::strcmp(argv[i], "--verbose")) {
      verbose = true;
    } else if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) {
      glob = argv[++i];
    } else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) {
      char* end = nullptr;
      const long r = std::strtol(argv[++i], &end, 10);
      if (!end || *end || r < 1 || r > 1000) {
        fmt::print(stderr, "diagnosis_eval: --repeat takes a count from 1 to 1000, not {}\n{}", argv[i], kUsage);
        return 2;
      }
      repeat = static_cast<int>(r);
    } else if (!std::strcmp(argv[i], "--no-runner")) {
      runner_pass = false;
    } else if (argv[i][0] != '-' && path.empty()) {
      path = argv[i];
    } else {
      fmt::print(stderr, "diagnosis_eval: unknown argument {}\n{}", argv[i], kUsage);
      return 2;
    }
  }
  if (assert_targets && !runner_pass) {
    fmt::print(stderr, "diagnosis_eval: --assert needs the runner's pass (drop --no-runner)\n{}", kUsage);
    return 2;
  }
  if (path.empty()) {
    fmt::print(stderr, "diagnosis_eval: no fixture file given\n{}", kUsage);
    return 2;
  }
  std::vector<const conf::BuiltinEntry*> cands;
  for (const auto& e : conf::builtin_candidates())
    if (e.info.name.rfind("builtin:cpu_", 0) == 0 || e.info.name.rfind("builtin:mut_", 0) == 0)
      cands.push_back(&e);
  std::map<std::string, std::set<std::string>> want_of;  // mutant (after "builtin:") -> dialects
  for (const auto* e : cands)
    if (e->info.kind == conf::CandidateKind::mutant) want_of[e->info.name.substr(8)] = planted(e->info);

  fix::FixtureReader reader(path);
  std::map<std::string, Tally> per_mutant;
  Tally total;
  double t_check = 0, t_diag = 0, worst_ratio = 0;
  std::string worst_ratio_case;
  int correct_failures = 0, unrepresentable = 0, norm_on_quant = 0, norm_on_quant_named = 0;
  for (const auto& id : reader.case_ids()) {
    if (::fnmatch(glob.c_str(), id.c_str(), 0) != 0) continue;
    const fix::FixtureCase fc = reader.read_case(id);
    // Quantized cases (`q_*`) are judged by check_quant_case and diagnosed by the quantization
    // dialects (DIAGNOSIS.md, "Quantized outputs (class H)"), as `run` does.
    const bool quant = fc.c.quant.has_value();
    double t0 = now();
    const auto allow = quant ? std::map<std::string, conf::OutputAllowance>{} : conf::derive_allowances(fc.c);
    const double t_allow = now() - t0;
    for (const auto* e : cands) {
      auto cand = e->make();
      if (cand->declines(fc.c)) continue;
      conf::Outputs got;
      try {
        got = cand->run(fc.c);
      } catch (const std::exception&) {
        continue;
      }
      t0 = now();
      const auto res = quant ? conf::check_quant_case(fc, got) : conf::check_case(fc, got, allow);
      double tc = now() - t0 + t_allow;
      if (res.verdict != conf::Verdict::failed) continue;
      const std::string name = e->info.name.substr(8);
      if (e->info.kind != conf::CandidateKind::mutant) {
        ++correct_failures;
        fmt::print("correct kernel {} FAILED {}\n", name, id);
        continue;
      }
      if (quant && !quant_fault(e->info)) {
        // A fault of the norm on a quantized case: the quantization dialects must not take the
        // blame (DIAGNOSIS.md, "Quantized outputs (class H)"); not counted in the ranks.
        ++norm_on_quant;
        const auto d = conf::diagnose_quant(fc, got, res);
        if (!d.empty() && d.front().explains) {
          ++norm_on_quant_named;
          fmt::print("{:<32} {:<40} a norm fault named by {}\n", name, id, d.front().dialect);
        }
        continue;
      }
      t0 = now();
      const auto d = quant ? conf::diagnose_quant(fc, got, res) : conf::diagnose(fc, got, allow);
      double td = now() - t0;
      for (int rep = 1; rep < repeat; ++rep) {  // the least of `repeat` timings of each
        t0 = now();
        const auto a = quant ? std::map<std::string, conf::OutputAllowance>{} : conf::derive_allowances(fc.c);
        const auto r2 = quant ? conf::check_quant_case(fc, got) : conf::check_case(fc, got, a);
        tc = std::min(tc, now() - t0);
        t0 = now();
        const auto d2 = quant ? conf::diagnose_quant(fc, got, r2) : conf::diagnose(fc, got, a);
        td = std::min(td, now() - t0);
      }
      t_check += tc;
      t_diag += td;
      if (td / tc > worst_ratio) {
        worst_ratio = td / tc;
        worst_ratio_case = name + " " + id;
      }
      const auto& want = want_of.at(name);
      int rank = 0;
      for (std::size_t i = 0; i < d.size() && !rank; ++i) {
        if (want.count(d[i].dialect)) rank = static_cast<int>(i) + 1;
        for (const auto& alias : d[i].same_as)
          if (!rank && want.count(alias)) rank = static_cast<int>(i) + 1;
      }
      if (want.empty()) {  // the panel has no dialect for this fault: reported, not counted
        ++per_mutant[name].failing;
        ++unrepresentable;
        fmt::print("{:<32} {:<40} (no dialect for this fault) best: {}\n", name, id,
                   d.empty() ? std::string("(none)") : d[0].dialect);
        continue;
      }
      for (Tally* t : {&per_mutant[name], &total}) {
        ++t->failing;
        if (rank == 1) ++t->top1;
        if (rank >= 1 && rank <= 3) ++t->top3;
        if (!d.empty() && d.front().explains) ++t->explained;
        if (d.empty()) ++t->nothing;
      }
      if (verbose || rank != 1) {
        fmt::print("{:<32} {:<40} {:6.2f} ms (check {:6.2f} ms) planted rank {}; best: {}\n", name, id,
                   1e3 * td, 1e3 * tc, rank ? std::to_string(rank) : "-",
                   d.empty() ? std::string("(none)")
                             : fmt::format("{} {:.3g}{}", d[0].dialect, d[0].score,
                                           d[0].explains ? "" : " (not explained)"));
        if (verbose)
          for (const auto& x : d) fmt::print("      {:<34} {:.4g}  {}\n", x.dialect, x.score, x.evidence);
      }
    }
  }

  // The runner's path: no passing case carries a diagnosis; every FAILED one does.
  int passing_with = 0, failed_without = 0, passing = 0;
  if (runner_pass) {
    std::vector<std::unique_ptr<conf::Candidate>> run_cands;
    for (const auto* e : cands) run_cands.push_back(e->make());
    conf::RunOptions ro;
    ro.fixtures = path;
    ro.threads = 1;
    if (glob != "*") ro.case_globs = {glob};
    for (const auto& run : conf::run_candidates(run_cands, ro))
      for (const auto& c : run.cases) {
        if (c.verdict == conf::Verdict::failed)
          failed_without += !c.diagnosed;
        else {
          ++passing;
          passing_with += c.diagnosed || !c.diagnosis.empty();
        }
      }
  }

  fmt::print("\n{:<32} {:>7} {:>6} {:>6} {:>9}\n", "mutant", "failing", "top-1", "top-3", "explained");
  for (const auto& [name, t] : per_mutant)
    fmt::print("{:<32} {:>7} {:>6} {:>6} {:>9}\n", name, t.failing, t.top1, t.top3, t.explained);
  std::set<std::string> silent;
  for (const auto& [name, want] : want_of)
    if (!per_mutant.count(name)) silent.insert(name);
  for (const auto& s : silent) fmt::print("{:<32} {:>7}   (no FAILED case in this tier)\n", s, 0);
  const double top1 = total.failing ? 100.0 * total.top1 / total.failing : 0;
  const double top3 = total.failing ? 100.0 * total.top3 / total.failing : 0;
  int mut_top1 = 0, mut_top3 = 0;
  int represented = 0;
  for (const auto& [name, t] : per_mutant) {
    if (want_of.at(name).empty()) continue;
    ++represented;
    mut_top1 += 2 * t.top1 > t.failing;  // planted fault top-ranked on most of its failing cases
    mut_top3 += t.top3 == t.failing;
  }
  fmt::print(
      "\nfailing (mutant, case) pairs: {} (and {} of mutants whose fault no dialect represents); planted "
      "fault top-1: {} ({:.1f} %), top-3: {} ({:.1f} %), best dialect explains (score <= 1): {}\n",
      total.failing, unrepresentable, total.top1, top1, total.top3, top3, total.explained);
  fmt::print(
      "mutants with a FAILED case: {} ({} with a dialect for their fault); planted fault top-1 on most of "
      "its cases: {}, top-3 on all: {}\n",
      per_mutant.size(), represented, mut_top1, mut_top3);
  if (runner_pass)
    fmt::print("passing cases (all candidates): {}, with a diagnosis: {}; FAILED cases without one: {}\n",
               passing, passing_with, failed_without);
  else
    fmt::print("passing cases: not run (--no-runner)\n");
  fmt::print("correct kernels' FAILED cases: {}\n", correct_failures);
  fmt::print("norm mutants' FAILED quantized cases: {}, named by a quantization dialect: {}\n", norm_on_quant,
             norm_on_quant_named);
  fmt::print(
      "CPU time on the failing cases{}: check (allowances + compare) {:.3f} s, diagnosis {:.3f} s, ratio "
      "{:.2f}; "
      "worst single case {:.2f} ({})\n",
      repeat > 1 ? fmt::format(" (least of {} per case)", repeat) : std::string(), t_check, t_diag, t_check > 0 ? t_diag / t_check : 0.0, worst_ratio, worst_ratio_case);
  if (!assert_targets) return 0;
  bool ok = true;
  // The targets are top-1 >= 90 % and top-3 = 100 %; the thresholds are what the smoke
  // tier meets (one (mutant, case) pair misses the top 3: DIAGNOSIS.md).
  if (top1 < 97) ok = false, fmt::print("FAIL: top-1 {:.1f} % < 97 %\n", top1);
  if (top3 < 99) ok = false, fmt::print("FAIL: top-3 {:.1f} % < 99 %\n", top3);
  if (passing_with || failed_without) ok = false, fmt::print("FAIL: diagnoses attached to the wrong cases\n");
  if (correct_failures) ok = false, fmt::print("FAIL: a correct kernel failed\n");
  if (norm_on_quant_named) ok = false, fmt::print("FAIL: a norm fault named as a quantization fault\n");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  ref::keep_freed_memory();  // as the normcheck executable does (heap.hpp)
  try {
    return evaluate(argc, argv);
  } catch (const std::exception& e) {  // an unreadable or damaged fixture file, a bad case
    fmt::print(stderr, "diagnosis_eval: {}\n", e.what());
    return 2;
  }
}
