#include "normcheck/conformance/runner.hpp"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "normcheck/fixtures/error.hpp"
#include "normcheck/fixtures/pipeline.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/declared.hpp"
#include "normcheck/version.hpp"

namespace normcheck::conf {

bool CandidateRun::rejected() const {
  for (const auto& [v, n] : summary)
    if (n > 0 && is_failure(v)) return true;
  return false;
}

bool CandidateRun::failed_beyond_known() const {
  if (!stale_findings.empty()) return true;
  return std::any_of(cases.begin(), cases.end(),
                     [](const CaseResult& c) { return is_failure(c.verdict) && c.known_finding.empty(); });
}

namespace {

using Json = nlohmann::ordered_json;

bool selected(const std::string& id, const std::vector<std::string>& globs) {
  if (globs.empty()) return true;
  for (const auto& g : globs)
    if (::fnmatch(g.c_str(), id.c_str(), 0) == 0) return true;
  return false;
}

// A JSON number, or a string for values JSON cannot hold.
Json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

Json value_json(double v, ref::DType t) {
  return Json{{"decimal", ref::decimal_text(v, t)}, {"hex", ref::hex_text(v)}};
}

Json histogram_json(const ErrorHistogram& h) {
  return Json{{"zero", h.zero}, {"bins", h.bins}, {"inf", h.inf}};
}

// At most this many rows per output go into a results file (evenly spaced, the worst row always
// among them): enough for the reports' error-against-mean/sigma plot, small for 65537-row cases.
constexpr std::size_t kMaxRowsPerOutput = 256;

Json rows_json(const std::vector<RowError>& rows, const std::vector<double>& mean_over_sigma) {
  std::vector<std::size_t> keep;
  if (rows.size() <= kMaxRowsPerOutput) {
    for (std::size_t i = 0; i < rows.size(); ++i) keep.push_back(i);
  } else {
    std::size_t worst = 0;
    for (std::size_t i = 1; i < rows.size(); ++i)
      if (rows[i].max_ratio > rows[worst].max_ratio) worst = i;
    for (std::size_t k = 0; k < kMaxRowsPerOutput - 1; ++k) keep.push_back(k * rows.size() / (kMaxRowsPerOutput - 1));
    keep.push_back(worst);
    std::sort(keep.begin(), keep.end());
    keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  }
  Json row = Json::array(), mos = Json::array(), ulp = Json::array(), ratio = Json::array();
  for (std::size_t i : keep) {
    const auto& re = rows[i];
    row.push_back(re.row);
    const auto r = static_cast<std::size_t>(re.row);
    mos.push_back(number(r < mean_over_sigma.size() ? mean_over_sigma[r] : NAN));
    ulp.push_back(number(re.max_ulp));
    ratio.push_back(number(re.max_ratio));
  }
  return Json{{"count", rows.size()}, {"row", row}, {"mean_over_sigma", mos}, {"max_ulp", ulp}, {"max_ratio", ratio}};
}

Json diagnosis_to_json(const std::vector<Diagnosis>& diagnosis) {
  Json d = Json::array();
  for (const auto& e : diagnosis) {
    Json je{{"dialect", e.dialect},   {"fault_class", e.fault_class}, {"title", e.title},
            {"score", number(e.score)}, {"explains", e.explains},      {"evidence", e.evidence}};
    if (!e.parameters.empty()) {
      Json p;
      for (const auto& [k, v] : e.parameters) p[k] = number(v);
      je["parameters"] = std::move(p);
    }
    if (!e.same_as.empty()) je["same_as"] = e.same_as;
    if (!e.output.empty()) je["output"] = e.output;
    d.push_back(std::move(je));
  }
  return d;
}

Json case_json(const CaseResult& r, const std::function<std::string(const std::string&)>& repro) {
  Json j;
  j["case_id"] = r.case_id;
  j["verdict"] = name_of(r.verdict);
  if (!r.op.empty()) {
    j["op"] = r.op;
    j["direction"] = r.direction;
    if (!r.block.empty()) j["block"] = r.block;
    j["dtype"] = r.dtype;
    j["category"] = r.category;
    if (r.normalized_size > 0) j["normalized_size"] = r.normalized_size;
  }
  if (!r.message.empty()) j["message"] = r.message;
  j["seconds"] = r.seconds;
  Json outs = Json::array();
  for (const auto& o : r.outputs) {
    Json jo;
    jo["name"] = o.name;
    jo["verdict"] = name_of(o.verdict);
    if (!o.reason.empty()) jo["reason"] = o.reason;
    jo["dtype"] = ref::name_of(o.dtype);
    jo["elements"] = o.elements;
    jo["failed"] = o.failed;
    jo["mistrusted"] = o.mistrusted;
    jo["uncertified"] = o.uncertified;
    jo["flushed"] = o.flushed;
    if (o.flips_accepted > 0) jo["flips_accepted"] = o.flips_accepted;
    if (!o.flips.empty()) jo["flips"] = o.flips;
    if (o.own_scale > 0) jo["own_scale"] = o.own_scale;
    jo["max_ulp"] = number(o.max_ulp);
    jo["max_abs"] = number(o.max_abs);
    jo["max_rel"] = number(o.max_rel);
    jo["max_ratio"] = number(o.max_ratio);
    if (std::isfinite(o.sensitivity)) jo["sensitivity"] = o.sensitivity;
    if (!o.probes.empty()) {
      Json p;
      for (const auto& [k, v] : o.probes) p[k] = number(v);
      jo["probes"] = std::move(p);
    }
    if (o.worst_index >= 0) {
      jo["worst"] = Json{{"index", o.worst_index},
                         {"coords", o.worst_coords},
                         {"got", value_json(o.worst_got, o.dtype)},
                         {"expected", value_json(o.worst_expected, o.dtype)},
                         {"exact", value_json(o.worst_exact, ref::DType::float64)},
                         {"allowance", number(o.worst_allowance)}};
    }
    if (o.elements > 0) {
      jo["histogram"] = Json{{"log2_min", kHistLog2Min}, {"ulp", histogram_json(o.hist_ulp)},
                             {"ratio", histogram_json(o.hist_ratio)}};
      if (!o.rows.empty()) jo["rows"] = rows_json(o.rows, r.row_mean_over_sigma);
    }
    outs.push_back(std::move(jo));
  }
  j["outputs"] = std::move(outs);
  if (r.verdict == Verdict::failed && r.diagnosed) j["diagnosis"] = diagnosis_to_json(r.diagnosis);
  if ((is_failure(r.verdict) || r.verdict == Verdict::mistrusted) && repro) j["repro"] = repro(r.case_id);
  if (!r.known_finding.empty()) j["known_finding"] = Json{{"finding", r.known_finding}, {"what", r.known_what}};
  return j;
}

// Outputs an outputs file marks unsupported (an attribute with the reason): UNSUPPORTED with that
// reason instead of MISSING; a case whose other outputs pass is UNSUPPORTED, its message naming them.
void mark_unsupported(CaseResult& res, const std::map<std::string, std::string>& marked) {
  if (marked.empty()) return;
  std::vector<std::string> names;
  for (auto& o : res.outputs) {
    const auto it = marked.find(o.name);
    if (it == marked.end()) continue;
    o.verdict = Verdict::unsupported;
    o.reason = it->second;
    names.push_back(o.name);
  }
  res.verdict = Verdict::passed;
  for (const auto& o : res.outputs) res.verdict = std::max(res.verdict, o.verdict);
  if (res.verdict == Verdict::unsupported)
    res.message = fmt::format("the outputs file marks {} unsupported", fmt::join(names, ", "));
}

void tally(CandidateRun& run, const CaseResult& r) {
  ++run.summary[r.verdict];
  run.cases.push_back(r);
}

}  // namespace

std::string describe(const CaseResult& r) {
  std::string s = fmt::format("{:<11} {}", name_of(r.verdict), r.case_id);
  if (!r.message.empty()) s += ": " + r.message;
  for (const auto& o : r.outputs) {
    if (o.verdict == Verdict::passed && !o.reason.empty()) {  // quantized outputs: accepted flips
      s += fmt::format("\n    {} PASSED: {}", o.name, o.reason);
      for (const auto& f : o.flips) s += "\n      " + f;
    }
    if (o.verdict == Verdict::passed) continue;
    s += fmt::format("\n    {} {}: {}", o.name, name_of(o.verdict), o.reason);
    if (o.verdict == Verdict::failed && o.worst_index >= 0) {
      s += fmt::format(
          "\n      worst at [{}] (flat {}): got {} ({}), expected {} ({}), exact {}; error {:.3g} ulp = {:.3g} x "
          "the allowance {:.3g}",
          fmt::join(o.worst_coords, ", "), o.worst_index, ref::decimal_text(o.worst_got, o.dtype),
          ref::hex_text(o.worst_got), ref::decimal_text(o.worst_expected, o.dtype), ref::hex_text(o.worst_expected),
          ref::hex_text(o.worst_exact), o.max_ulp, o.max_ratio, o.worst_allowance);
    }
  }
  if (r.verdict == Verdict::failed && r.diagnosed) s += "\n    " + describe_diagnosis(r.diagnosis);
  return s;
}

std::vector<CandidateRun> run_candidates(std::vector<std::unique_ptr<Candidate>>& candidates,
                                         const RunOptions& opt) {
  fix::FixtureReader reader(opt.fixtures);
  std::vector<CandidateRun> runs(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    runs[i].info = candidates[i]->info();
    if (opt.reduction) runs[i].info.caps.reduction = *opt.reduction;
    if (opt.ignore_flush_declaration && runs[i].info.caps.flush_subnormal_outputs) {
      runs[i].info.caps.flush_subnormal_outputs = false;
      runs[i].info.flush_declaration_ignored = true;
    }
  }
  // The declared reduction classes other than `any` (TOLERANCE.md, section 9): each gets its own
  // allowances, derived once per case.
  std::vector<Reduction> classes;
  for (const auto& r : runs)
    if (!r.info.caps.reduction.is_any() &&
        std::find(classes.begin(), classes.end(), r.info.caps.reduction) == classes.end())
      classes.push_back(r.info.caps.reduction);
  std::vector<std::string> ids;
  for (const auto& id : reader.case_ids())
    if (selected(id, opt.case_globs)) ids.push_back(id);

  std::FILE* journal = nullptr;
  if (!opt.journal.empty()) {
    journal = std::fopen(opt.journal.c_str(), "a");
    if (!journal)
      throw std::runtime_error(fmt::format("{}: cannot open the journal for writing: {}", opt.journal,
                                           std::strerror(errno)));
  }
  const auto t_start = std::chrono::steady_clock::now();
  // Cases go through the ordered pipeline (fixtures/pipeline.hpp): this thread reads them (HDF5,
  // one thread at a time) a few cases ahead; their checksums, conversions and allowances are
  // computed on any of `threads` threads; each candidate then runs the case and has it judged
  // in its turn: one case at a time and in case order for each candidate, its case i + 1 only
  // after its case i was judged and journaled (so that an in-process candidate that kills the
  // process loses no case checked before it), while other candidates and other cases' reading
  // go on beside it. Results are reported (tally, on_case) on this thread in case order.
  struct Slot {
    std::optional<fix::PendingCase> pending;
    std::exception_ptr read_error;
    std::string stop;                 // the run stops at this case with this message
    std::vector<CaseResult> results;  // one per candidate
  };
  struct Stop {};
  std::mutex turn_mutex;
  std::condition_variable turn_cv;
  std::vector<std::size_t> turn(candidates.size(), 0);  // the case each candidate runs next
  std::size_t stop_at = ids.size();                     // cases from here on run no candidate
  std::mutex journal_mutex;
  std::vector<std::uint64_t> weights;  // elements of each case's x, from its dataspace
  for (const auto& id : ids) weights.push_back(reader.input_elements(id, "x"));
  auto judge_case = [&](std::size_t ci, Slot& slot) {
    const std::string& id = ids[ci];
    slot.stop.clear();
    slot.results.assign(candidates.size(), CaseResult{});
    fix::FixtureCase fc;
    std::map<std::string, OutputAllowance> allow_any;  // any correct algorithm
    std::map<Reduction, std::map<std::string, OutputAllowance>> declared;
    try {
      if (slot.read_error) std::rethrow_exception(slot.read_error);
      fc = std::move(*slot.pending).finish_checked();  // a damaged fixture stops the run (exit 2)
      slot.pending.reset();
      if (!fc.c.quant) {  // quantized cases derive their own allowances (check_quant_case)
        allow_any = derive_allowances(fc.c);
        for (const auto& r : classes) declared[r] = derive_allowances(fc.c, r);
      }
    } catch (const std::exception& e) {
      slot.stop = fmt::format("stopped at case {}: {}", id, e.what());
    }
    CaseResult about;  // what the case is (op, dtype, rows' mean/sigma), the same for every candidate
    if (slot.stop.empty()) describe_case(about, fc);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      {
        std::unique_lock lock(turn_mutex);
        turn_cv.wait(lock, [&] { return turn[i] == ci; });
        if (!slot.stop.empty()) stop_at = std::min(stop_at, ci);
      }
      // Gives the candidate's turn to the next case however this one ends.
      struct NextTurn {
        std::mutex& m;
        std::condition_variable& cv;
        std::size_t& t;
        ~NextTurn() {
          {
            std::lock_guard lock(m);
            ++t;
          }
          cv.notify_all();
        }
      } next_turn{turn_mutex, turn_cv, turn[i]};
      {
        std::lock_guard lock(turn_mutex);
        if (ci >= stop_at) continue;
      }
      CaseResult& res = slot.results[i];
      res.case_id = id;
      double diagnosis_s = 0;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        if (auto why = candidates[i]->declines(fc.c)) {
          res.verdict = Verdict::unsupported;
          res.message = *why;
        } else if (fc.c.quant) {
          // Codes and scales (TOLERANCE.md, section 10), diagnosed by the dialects of class H.
          const Outputs got = candidates[i]->run(fc.c);
          res = check_quant_case(fc, got, check_options_of(runs[i].info.caps));
          if (opt.diagnose && diagnosable(res)) {
            const auto d0 = std::chrono::steady_clock::now();
            res.diagnosis = diagnose_quant(fc, got, res);
            res.diagnosed = true;
            diagnosis_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
          }
        } else {
          const Outputs got = candidates[i]->run(fc.c);
          const auto judged = judged_outputs(fc, candidates[i]->info().caps);
          const fix::FixtureCase& jc = judged ? *judged : fc;
          // Judged under its reduction class (TOLERANCE.md, section 9): the class's allowances.
          const Reduction& red = runs[i].info.caps.reduction;
          const auto& allow = red.is_any() ? allow_any : declared.at(red);
          res = check_case(jc, got, allow, check_options_of(runs[i].info.caps));
          if (opt.diagnose && diagnosable(res)) {
            const auto d0 = std::chrono::steady_clock::now();
            res.diagnosis = diagnose(jc, got, allow);
            res.diagnosed = true;
            diagnosis_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
          }
          explain_declared(res, jc, got, red, check_options_of(runs[i].info.caps));
        }
      } catch (const CandidateDeclined& e) {
        res.verdict = Verdict::unsupported;
        res.message = e.what();
      } catch (const CandidateTimeout& e) {
        res.verdict = Verdict::timeout;
        res.message = e.what();
      } catch (const std::exception& e) {
        res.verdict = Verdict::crashed;
        res.message = e.what();
      }
      res.case_id = id;
      // The candidate's time with the check (as before the diagnosis existed), not the diagnosis's.
      res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - diagnosis_s;
      res.op = about.op;
      res.direction = about.direction;
      res.block = about.block;
      res.dtype = about.dtype;
      res.category = about.category;
      res.normalized_size = about.normalized_size;
      res.row_mean_over_sigma = about.row_mean_over_sigma;
      if (journal) {
        Json line = case_json(res, nullptr);
        line["candidate"] = runs[i].info.name;
        std::lock_guard lock(journal_mutex);
        std::fputs((line.dump() + "\n").c_str(), journal);
        std::fflush(journal);
      }
    }
  };
  try {
    fix::pipeline<Slot>(
        ids.size(), fix::thread_count(opt.threads), judge_case,
        [&](std::size_t, Slot& slot) {
          if (!slot.stop.empty()) {
            for (auto& r : runs) r.error = slot.stop;
            throw Stop{};
          }
          for (std::size_t i = 0; i < candidates.size(); ++i) {
            tally(runs[i], slot.results[i]);
            if (opt.on_case) opt.on_case(runs[i], slot.results[i]);
          }
        },
        [&](std::size_t ci, Slot& slot) {
          slot.pending.reset();
          slot.read_error = nullptr;
          try {
            slot.pending = reader.read_case_later(ids[ci]);
          } catch (...) {
            slot.read_error = std::current_exception();
          }
        },
        &weights);
  } catch (const Stop&) {
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  for (auto& r : runs) r.seconds = secs;
  if (journal) std::fclose(journal);
  return runs;
}

CandidateRun check_outputs_file(const RunOptions& opt) {
  fix::FixtureReader fixtures(opt.fixtures);
  fix::FixtureReader outputs(opt.outputs, fix::FixtureReader::Kind::outputs);
  CandidateRun run;
  run.info.name = "outputs:" + opt.outputs;
  run.info.description = "outputs file " + opt.outputs;
  run.info.caps.flush_subnormal_outputs = opt.outputs_flush_subnormals;
  if (opt.reduction) run.info.caps.reduction = *opt.reduction;
  const auto& fids = fixtures.case_ids();
  for (const auto& id : outputs.case_ids())
    if (!std::binary_search(fids.begin(), fids.end(), id))
      throw fix::FixtureError(opt.outputs, fmt::format("case {} is not in the fixture file {}", id, opt.fixtures));
  const auto& oids = outputs.case_ids();
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<std::string> ids;
  for (const auto& id : fids)
    if (selected(id, opt.case_globs)) ids.push_back(id);
  // Cases go through the ordered pipeline (fixtures/pipeline.hpp): this thread reads them (HDF5,
  // one thread at a time) a few cases ahead; their checksums, conversions, allowances, verdicts
  // and diagnoses are computed on `threads` threads in any order; and each case is reported
  // (tally, on_case) here in case order, so the results do not depend on the thread count.
  struct Slot {
    std::optional<fix::PendingCase> fixture, outputs;
    std::exception_ptr read_error;  // what reading the case threw, judged on a computing thread
    std::string stop;               // the run stops at this case with this message
    CaseResult res;
  };
  struct Stop {};
  std::vector<std::uint64_t> weights;  // elements of each case's x, from its dataspace
  for (const auto& id : ids) weights.push_back(fixtures.input_elements(id, "x"));
  auto judge_case = [&](std::size_t ci, Slot& slot) {
    const std::string& id = ids[ci];
    slot.stop.clear();
    using Pair = std::pair<fix::FixtureCase, std::optional<fix::OutputsCase>>;
    Pair loaded;
    try {
      if (slot.read_error) std::rethrow_exception(slot.read_error);
      // A damaged fixture stops the run. An outputs file's attributes are not ours (SCHEMA.md:
      // a checksum copied with the expected values it replaced is ignored, like any other).
      loaded.first = std::move(*slot.fixture).finish_checked();
      if (slot.outputs) loaded.second = std::move(*slot.outputs).finish_outputs(nullptr);
    } catch (const fix::FixtureError& e) {
      // A broken outputs file is the user's input error; a broken fixture file stops the run.
      if (std::string(e.what()).rfind(opt.outputs, 0) == 0) throw;
      slot.stop = fmt::format("stopped at case {}: {}", id, e.what());
      return;
    } catch (const std::exception& e) {
      slot.stop = fmt::format("stopped at case {}: {}", id, e.what());
      return;
    }
    slot.fixture.reset();
    slot.outputs.reset();
    fix::FixtureCase& fc = loaded.first;
    Outputs got;
    if (loaded.second) {
      fix::FixtureCase& oc = loaded.second->fc;
      for (auto& [name, o] : oc.expected) {
        if (!fc.expected.count(name))
          throw fix::FixtureError(opt.outputs,
                                  fmt::format("case {}: output {} is not an output of this case", id, name));
        // Values are taken as stored (any float type); the output's dtype is the case's.
        o.value.dtype = fc.expected.at(name).value.dtype;
        got.emplace(name, std::move(o.value));
      }
    }
    const std::map<std::string, std::string> no_marks;
    const auto& marked = loaded.second ? loaded.second->unsupported : no_marks;  // SCHEMA.md, "Outputs files"
    CaseResult& res = slot.res;
    res = CaseResult{};
    if (marked.count("")) {
      res.case_id = id;
      res.verdict = Verdict::unsupported;
      res.message = marked.at("");
    } else if (got.empty() && marked.empty()) {
      res.case_id = id;
      res.verdict = Verdict::missing;
      res.message = "the outputs file has no outputs for this case";
      for (const auto& [name, e] : fc.expected) {
        OutputResult o;
        o.name = name;
        o.dtype = e.value.dtype;
        o.verdict = Verdict::missing;
        o.reason = "not in the outputs file";
        res.outputs.push_back(o);
      }
    } else if (fc.c.quant) {  // codes and scales (TOLERANCE.md, section 10)
      res = check_quant_case(fc, got, check_options_of(run.info.caps));
      mark_unsupported(res, marked);
      if (opt.diagnose && diagnosable(res)) {
        res.diagnosis = diagnose_quant(fc, got, res);
        res.diagnosed = true;
      }
    } else {
      const auto allow = derive_allowances(fc.c, run.info.caps.reduction);
      res = check_case(fc, got, allow, check_options_of(run.info.caps));
      reject_unrepresentable(res, got, loaded.second ? loaded.second->wider_values : std::set<std::string>{});
      mark_unsupported(res, marked);
      if (opt.diagnose && diagnosable(res)) {
        res.diagnosis = diagnose(fc, got, allow);
        res.diagnosed = true;
      }
      // A declared class that the outputs violate, where `any` would pass them, says so.
      explain_declared(res, fc, got, run.info.caps.reduction, check_options_of(run.info.caps));
    }
    describe_case(res, fc);
  };
  try {
    fix::pipeline<Slot>(
        ids.size(), fix::thread_count(opt.threads), judge_case,
        [&](std::size_t, Slot& slot) {
          if (!slot.stop.empty()) {
            run.error = std::move(slot.stop);
            throw Stop{};
          }
          tally(run, slot.res);
          if (opt.on_case) opt.on_case(run, slot.res);
        },
        [&](std::size_t ci, Slot& slot) {
          slot.fixture.reset();
          slot.outputs.reset();
          slot.read_error = nullptr;
          try {
            slot.fixture = fixtures.read_case_later(ids[ci]);
            if (std::binary_search(oids.begin(), oids.end(), ids[ci]))
              slot.outputs = outputs.read_outputs_case_later(ids[ci]);
          } catch (...) {
            slot.read_error = std::current_exception();
          }
        },
        &weights);
  } catch (const Stop&) {
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return run;
}

std::string diagnosis_json_text(const std::vector<Diagnosis>& diagnosis) {
  return diagnosis_to_json(diagnosis).dump();
}

void write_results_json(std::ostream& os, const CandidateRun& run, const ResultsContext& ctx) {
  Json j;
  j["format"] = kResultsFormat;
  j["format_version"] = kResultsFormatVersion;
  j["generator"] = "normcheck";
  j["generator_version"] = kVersion;
  j["command"] = ctx.command;
  j["fixtures"] = Json{{"path", ctx.fixtures_path},
                       {"tier", ctx.fixtures.tier},
                       {"seed", ctx.fixtures.seed},
                       {"generator_version", ctx.fixtures.generator_version},
                       {"command", ctx.fixtures.command}};
  const auto& in = run.info;
  Json cand{{"spec", in.name}, {"kind", name_of(in.kind)}, {"description", in.description}, {"device", in.caps.device}};
  if (in.caps.flush_subnormal_outputs) cand["flush_subnormal_outputs"] = true;
  if (in.flush_declaration_ignored) cand["flush_declaration_ignored"] = true;
  if (!in.caps.reduction.is_any()) cand["reduction"] = name_of(in.caps.reduction);
  if (in.kind == CandidateKind::mutant) {
    cand["fault_class"] = in.fault_class;
    cand["fault"] = in.fault;
  }
  j["candidate"] = std::move(cand);
  j["cases"] = Json::array();  // written below, one case at a time
  Json summary;
  for (Verdict v : {Verdict::passed, Verdict::failed, Verdict::unsupported, Verdict::mistrusted, Verdict::crashed,
                    Verdict::timeout, Verdict::missing}) {
    const auto it = run.summary.find(v);
    summary[std::string(name_of(v))] = it == run.summary.end() ? 0 : it->second;
  }
  j["summary"] = std::move(summary);
  if (run.known_findings > 0 || !run.stale_findings.empty()) {
    j["known_findings"] = run.known_findings;
    j["stale_findings"] = run.stale_findings;
  }
  j["seconds"] = run.seconds;
  if (!run.error.empty()) j["error"] = run.error;
  // The text of j.dump(1) with the cases in place, each case's tree built and written alone: a
  // tree of every case held at once took about five times the file's size (a 38 MB results
  // file of 4002 cases raised `check`'s peak from 67 to 225 MB; conformance/README.md, Memory).
  const std::string text = j.dump(1) + "\n";
  constexpr std::string_view kSlot = "\n \"cases\": []";  // a top-level key: indent 1
  const std::size_t at = text.find(kSlot);
  if (at == std::string::npos || run.cases.empty()) {
    os << text;
    return;
  }
  os.write(text.data(), static_cast<std::streamsize>(at + kSlot.size() - 1));  // up to '['
  std::string lines;
  for (std::size_t i = 0; i < run.cases.size(); ++i) {
    const std::string one = case_json(run.cases[i], ctx.repro).dump(1);
    // Each line two levels in (the array's elements), as j.dump(1) indents them; JSON strings
    // hold no raw newline, so every '\n' of `one` starts a line.
    lines.assign(i ? ",\n  " : "\n  ");
    for (char ch : one) {
      lines += ch;
      if (ch == '\n') lines += "  ";
    }
    os << lines;
  }
  os << "\n ]";
  os.write(text.data() + at + kSlot.size(), static_cast<std::streamsize>(text.size() - at - kSlot.size()));
}

std::string results_json(const CandidateRun& run, const ResultsContext& ctx) {
  std::ostringstream os;
  write_results_json(os, run, ctx);
  return std::move(os).str();
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool overwrite) {
  namespace fs = std::filesystem;
  if (!overwrite && fs::exists(path))
    throw std::runtime_error(fmt::format("{} exists; pass --force to replace it", path));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(fmt::format("{}: cannot open for writing", tmp));
    write(f);
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error(fmt::format("{}: write failed", tmp));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw std::runtime_error(fmt::format("{}: cannot rename into place", path));
  }
}

void write_text_file(const std::string& path, const std::string& text, bool overwrite) {
  write_file_atomically(path, [&](std::ostream& f) { f << text; }, overwrite);
}

}  // namespace normcheck::conf
