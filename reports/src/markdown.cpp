// The Markdown summary: what a CI job summary shows (GitHub's step summary, a GitLab MR note).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "normcheck/reports/report.hpp"
#include "text.hpp"

namespace normcheck::reports {

namespace {

using text::md_cell;

std::string code(const std::string& s) {
  std::string c = text::md_code(s), o;
  for (char ch : c) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return o;
}

constexpr std::size_t kMaxListed = 20;

std::string provenance(const Report& r) {
  std::set<std::string> fixtures, versions;
  std::size_t files = 0;
  for (const auto& run : r.runs) {
    files += run.sources.size();
    if (!run.fixtures_path.empty()) {
      std::string f = run.fixtures_path;
      if (!run.fixtures_tier.empty() || run.fixtures_seed)
        f += fmt::format(" (tier {}{})", run.fixtures_tier.empty() ? "?" : run.fixtures_tier,
                         run.fixtures_seed ? fmt::format(", seed {}", *run.fixtures_seed) : "");
      fixtures.insert(f);
    }
    if (!run.generator_version.empty()) versions.insert(run.generator_version);
  }
  std::string s = fmt::format("{} candidate{} from {} results file{}", r.runs.size(), r.runs.size() == 1 ? "" : "s",
                              files, files == 1 ? "" : "s");
  for (const auto& f : fixtures) s += " · fixtures " + code(f);
  for (const auto& v : versions) s += " · normcheck " + v;
  return s;
}

std::string counts_cells(const std::map<std::string, std::int64_t>& n, const std::vector<std::string>& cols) {
  std::string s;
  for (const auto& v : cols) {
    const auto it = n.find(v);
    const std::int64_t k = it == n.end() ? 0 : it->second;
    s += k == 0 ? " · |" : fmt::format(" {} |", k);
  }
  return s;
}

std::string header(const std::vector<std::string>& first, const std::vector<std::string>& cols,
                   const std::vector<std::string>& last) {
  std::string h = "|", rule = "|";
  for (const auto& c : first) h += " " + c + " |", rule += "---|";
  for (const auto& c : cols) h += " " + c + " |", rule += "---:|";
  for (const auto& c : last) h += " " + c + " |", rule += "---|";
  return h + "\n" + rule + "\n";
}

std::string best_diagnosis(const std::vector<Diagnosis>& d) {
  if (d.empty()) return "—";
  const auto& b = d.front();
  return md_cell(fmt::format("{}{}{}: {}", b.dialect, b.fault_class.empty() ? "" : " (class " + b.fault_class + ")",
                             b.explains ? " explains it" : " does not explain it",
                             std::isnan(b.score) ? "" : "score " + text::num(b.score)));
}

}  // namespace

std::string markdown(const Report& r) {
  std::string s = "# normcheck report\n\n" + provenance(r) + "\n\n";
  std::int64_t bad = 0;
  for (const auto& run : r.runs) bad += !run.ok();
  s += r.ok() ? "**All as expected**: every correct or external candidate conforms and every mutant is rejected.\n\n"
              : fmt::format("**{} of {} not as expected** (see the outcome column).\n\n", bad, r.runs.size());

  // Outcome of each candidate.
  std::vector<const Run*> checks, props, audits;
  for (const auto& run : r.runs)
    (run.mode == "prop" ? props : run.mode == "audit" ? audits : checks).push_back(&run);
  if (!checks.empty() || !props.empty()) {
    // Property runs count property verdicts in the same columns (PASSED, FAILED, UNSUPPORTED, CRASHED).
    s += "## Candidates\n\n" + header({"candidate", "kind", "mode"}, kVerdictColumns, {"outcome"});
    for (const auto* list : {&checks, &props})
      for (const Run* run : *list)
        s += fmt::format("| {} | {} | {} |{} {}{} |\n", code(run->name()), md_cell(run->kind), run->mode,
                         counts_cells(run->counts(), kVerdictColumns), run->ok() ? "" : "**",
                         run->outcome() + (run->ok() ? "" : "**"));
    s += "\n";
  }

  // The failures that matter most: those of candidates that must conform.
  const auto fails = text::failing_cases(r, false);
  if (!checks.empty()) {
    s += "## Failures of correct and external candidates\n\n";
    if (fails.empty()) {
      s += "None.\n\n";
    } else {
      s += "Worst first (largest error over its allowance).\n\n";
      s += "| candidate | case | verdict | output | error | worst element: got / expected | diagnosis | repro |\n"
           "|---|---|---|---|---:|---|---|---|\n";
      for (std::size_t i = 0; i < fails.size() && i < kMaxListed; ++i) {
        const Case& c = *fails[i].c;
        const Output* o = c.worst_output();
        std::string err = "—", worst = md_cell(c.message.empty() ? "—" : c.message), out = "—";
        if (o) {
          out = code(o->name);
          err = fmt::format("{} ulp = {}× allowance", text::num(o->max_ulp), text::num(o->max_ratio));
          if (!o->worst && !o->reason.empty()) worst = md_cell(o->reason);
        }
        if (o && o->worst)
          worst = fmt::format("at {}: {} ({}) / {} ({})", text::coords(o->worst->coords), code(o->worst->got.decimal),
                              code(o->worst->got.hex), code(o->worst->expected.decimal), code(o->worst->expected.hex));
        const std::string verdict =
            c.known_finding.empty() ? c.verdict : c.verdict + " (known finding: " + md_cell(c.known_finding) + ")";
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", code(fails[i].run->name()), code(c.case_id),
                         verdict, out, err, worst, best_diagnosis(c.diagnosis), c.repro.empty() ? "—" : code(c.repro));
      }
      if (fails.size() > kMaxListed) s += fmt::format("\n…and {} more in the results files.\n", fails.size() - kMaxListed);
      s += "\n";
    }
  }

  // Mutants: which case caught each, and what the diagnosis made of it.
  bool any_mutant = false;
  for (const Run* run : checks) any_mutant |= run->is_mutant();
  if (any_mutant) {
    s += "## Mutants: the case that caught each\n\n"
         "| mutant | class | fault | caught by | worst case | error | diagnosis |\n"
         "|---|---|---|---:|---|---:|---|\n";
    for (const Run* run : checks) {
      if (!run->is_mutant()) continue;
      const Case* worst = nullptr;
      double wr = -1;
      std::int64_t caught = 0;
      for (const auto& c : run->cases) {
        if (!is_failure(c.verdict)) continue;
        ++caught;
        const Output* o = c.worst_output();
        const double ratio = o ? (std::isnan(o->max_ratio) ? INFINITY : o->max_ratio) : INFINITY;
        if (ratio > wr) wr = ratio, worst = &c;
      }
      const Output* o = worst ? worst->worst_output() : nullptr;
      s += fmt::format("| {} | {} | {} | {} of {} | {} | {} | {} |\n", code(run->name()), md_cell(run->fault_class),
                       md_cell(run->fault), caught, run->cases.size(), worst ? code(worst->case_id) : "**not caught**",
                       o ? text::num(o->max_ratio) + "× allowance" : (worst ? worst->verdict : "—"),
                       worst ? best_diagnosis(worst->diagnosis) : "—");
    }
    s += "\n";
  }

  // What a pass rules out: the smallest relative fault each candidate's comparisons would catch.
  if (const auto sens = text::sensitivity_of(r); !sens.empty()) {
    s += "## Sensitivity: what \"conforms\" rules out\n\n"
         "The smallest relative fault in an output that the verdict is sure to catch (a kernel whose every value is "
         "the exact one times 1 + d, correctly rounded, fails for |d| at or above it; conformance/TOLERANCE.md, "
         "section 6.1): the median and the best over the cases at normalized size 4096 and above (* where the "
         "candidate ran none: over every case). It depends on the data and on the declared reduction class, not "
         "on the candidate's values. Last column: the cases of n ≥ 1024 on which a kernel that divides the variance by n − 1 "
         "(rstd off by about 1/(2n) where the variance dominates eps) and is otherwise exact would be caught; on arbitrary data only a class whose bound is "
         "below 1/n (`pairwise`, `accumulate_f64`, or data whose sums are exact) can see it.\n\n"
         "| candidate | reduction | y | rstd | dweight | n − 1 variance caught |\n|---|---|---:|---:|---:|---:|\n";
    for (const auto& x : sens) {
      std::string cells;
      for (const char* name : {"y", "rstd", "dweight"}) {
        const auto it = std::find_if(x.outputs.begin(), x.outputs.end(), [&](const auto& o) { return o.name == name; });
        cells += it == x.outputs.end()
                     ? " — |"
                     : fmt::format(" {} (best {}){} |", text::num(it->median), text::num(it->best), x.production ? "" : "*");
      }
      s += fmt::format("| {} | {} |{} {} |\n", code(x.run->name()), code(x.run->reduction), cells,
                       x.n1_cases ? fmt::format("{} of {}", x.n1_caught, x.n1_cases) : "—");
    }
    s += "\n";
  }

  // Every diagnosis of a failing case of a candidate that must conform (mutants: above).
  std::string diag;
  std::size_t nd = 0;
  for (const auto& f : fails) {
    for (const auto& d : f.c->diagnosis) {
      if (++nd > kMaxListed) break;
      diag += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", code(f.run->name()), code(f.c->case_id),
                          code(d.dialect), md_cell(d.fault_class), std::isnan(d.score) ? "—" : text::num(d.score),
                          d.explains ? "yes" : "no", md_cell(d.title + (d.evidence.empty() ? "" : ": " + d.evidence)));
    }
  }
  if (!diag.empty())
    s += "## Diagnoses\n\nDialects that could explain the failures, best first (score: the largest error in tolerance "
         "units against the dialect).\n\n| candidate | case | dialect | class | score | explains | evidence |\n"
         "|---|---|---|---|---:|---|---|\n" + diag + "\n";

  if (!props.empty()) {
    s += "## Properties\n\n| candidate | property | verdict | tests | seed | counterexample | diagnosis | reproduce |\n"
         "|---|---|---|---:|---:|---|---|---|\n";
    for (const Run* run : props)
      for (const auto& p : run->properties)
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", code(run->name()), code(p.name), p.verdict,
                         p.tests, p.seed ? std::to_string(*p.seed) : "—",
                         p.has_counterexample ? md_cell(p.cx_case_id + (p.cx_summary.empty() ? "" : ": " + p.cx_summary)) : "—",
                         best_diagnosis(p.diagnosis), p.reproduce.empty() ? "—" : code(p.reproduce));
    s += "\n";
  }
  if (!audits.empty()) {
    s += "## Checkpoint audit\n\n";
    for (const Run* run : audits) {
      const auto n = run->counts();
      s += fmt::format("{} ({}{}): {} error, {} warning, {} info — **{}**\n\n", code(run->checkpoint_path),
                       md_cell(run->checkpoint_format), run->checkpoint_profile.empty() ? "" : ", profile " + md_cell(run->checkpoint_profile),
                       n.at("error"), n.at("warning"), n.at("info"), run->outcome());
      if (run->findings.empty()) continue;
      s += "| severity | check | tensors | message |\n|---|---|---|---|\n";
      for (const auto& f : run->findings) {
        std::string t;
        for (const auto& x : f.tensors) t += (t.empty() ? "" : ", ") + code(x);
        s += fmt::format("| {} | {} | {} | {} |\n", f.severity, code(f.check), t.empty() ? "—" : t, md_cell(f.message));
      }
      s += "\n";
    }
  }

  // The conformance matrix, one collapsible table per candidate.
  if (!checks.empty()) {
    s += "## Conformance matrix\n\nVerdict counts per op, dtype and category (· is 0).\n\n";
    for (const Run* run : checks) {
      s += fmt::format("<details><summary>{} ({}): {}</summary>\n\n", text::html_escape(run->name()),
                       text::html_escape(run->kind.empty() ? "—" : run->kind), text::html_escape(run->outcome()));
      s += header({"op", "dtype", "category"}, kVerdictColumns, {});
      for (const auto& m : text::matrix_of(*run))
        s += fmt::format("| {} | {} | {} |{}\n", md_cell(m.op), md_cell(m.dtype), md_cell(m.category),
                         counts_cells(m.counts, kVerdictColumns));
      s += "\n</details>\n\n";
    }
  }
  for (const auto& run : r.runs)
    for (const auto& e : run.errors) s += fmt::format("> **{} stopped early**: {}\n\n", md_cell(run.name()), md_cell(e));
  return s;
}

}  // namespace normcheck::reports
