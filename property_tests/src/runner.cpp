// Running a property with RapidCheck, and turning its shrunk counterexample into a fixture case.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <chrono>
#include <optional>
#include <rapidcheck.h>
#include <sstream>

#include "normcheck/properties/properties.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "property_support.hpp"

namespace normcheck::prop {

std::string_view name_of(PropVerdict v) {
  switch (v) {
    case PropVerdict::passed: return "PASSED";
    case PropVerdict::failed: return "FAILED";
    case PropVerdict::unsupported: return "UNSUPPORTED";
    case PropVerdict::crashed: return "CRASHED";
  }
  return "?";
}

namespace {

class Listener final : public rc::detail::TestListener {
 public:
  Listener(const std::function<void(int, int)>& progress, int& tests, int& shrinks)
      : progress_(progress), tests_(tests), shrinks_(shrinks) {}
  void onTestCaseFinished(const rc::detail::CaseDescription& d) override {
    if (d.result.type == rc::detail::CaseResult::Type::Success) ++tests_;
    if (progress_) progress_(tests_, shrinks_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    if (accepted) ++shrinks_;
    if (progress_) progress_(tests_, shrinks_);
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

 private:
  const std::function<void(int, int)>& progress_;
  int& tests_;
  int& shrinks_;
};

// RapidCheck's text for one reproduce entry (the value of its `reproduce=` configuration key).
std::string reproduce_text(const std::string& id, const rc::detail::Reproduce& r) {
  rc::detail::Configuration cfg;
  cfg.reproduce[id] = r;
  const std::string s = rc::detail::configToString(cfg);
  const auto at = s.find("reproduce=");
  if (at == std::string::npos) return "";
  const auto end = s.find(' ', at);
  return s.substr(at + 10, end == std::string::npos ? std::string::npos : end - at - 10);
}

}  // namespace

PropertyResult run_property(const Property& p, conf::Candidate& cand, const Options& opt) {
  PropertyResult r;
  r.name = p.name;
  r.description = p.description;
  r.seed = opt.seed;
  std::optional<Failure> last;
  CaseLimits lim;
  lim.max_hidden = opt.max_hidden;
  lim.quant_required = opt.quant_only;
  Context ctx{cand, lim, &last, &r.flushed_tests, &r.flushed_elements,
              opt.reduction.value_or(cand.info().caps.reduction)};
  rc::detail::TestParams params;
  params.seed = opt.seed;
  params.maxSuccess = opt.tests;
  params.maxSize = opt.max_size;
  // Properties that need a case of some kind (two rows, a LayerNorm ...) discard the others.
  params.maxDiscardRatio = 50;
  params.disableShrinking = !opt.shrink;
  rc::detail::TestMetadata md;
  md.id = p.name;
  md.description = p.description;
  std::unordered_map<std::string, rc::detail::Reproduce> repro;
  if (!opt.reproduce.empty()) {
    try {
      repro = rc::detail::configFromString("reproduce=" + opt.reproduce).reproduce;
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("--reproduce: not a reproduce string of normcheck prop: {}", e.what()));
    }
    if (!repro.count(p.name))
      throw std::invalid_argument(fmt::format("--reproduce: the string is not for property {}", p.name));
  }
  Listener listener(opt.progress, r.tests, r.shrinks);
  const auto t0 = std::chrono::steady_clock::now();
  // The last case's outcome: a replayed case (--reproduce) that no longer fails comes back from
  // RapidCheck as an error with no case result, so it is kept here.
  std::optional<rc::detail::CaseResult> outcome;
  // A property that no drawn case fits (the candidate declines every one, or none is of the kind
  // the property needs) gives up once kBarrenDraws draws in a row have been discarded before any
  // test passed: RapidCheck alone would draw maxDiscardRatio x tests (500000 at --tests 10000),
  // each a round trip to a subprocess candidate. The draws after that are discarded at once, so
  // the outcome is RapidCheck's "gave up", as with fewer tests. kBarrenDraws is what --tests 100
  // allows, so a property gives up the same way whatever --tests says.
  constexpr int kBarrenDraws = 5000;
  int passed = 0, discarded = 0;
  std::optional<rc::detail::CaseResult> barren;
  const auto property = rc::detail::toProperty([&] {
    if (barren) throw *barren;
    // A replay (--reproduce) runs the case again along its shrink path; the counts are those of
    // the last run, the replayed case.
    if (!opt.reproduce.empty()) r.flushed_tests = r.flushed_elements = r.quant_tests = 0;
    drawn_cases().clear();
    drawn_quant_cases() = 0;
    const auto t_test = std::chrono::steady_clock::now();
    try {
      p.test(ctx);
      ++passed;
      if (drawn_quant_cases() > 0 && !last) ++r.quant_tests;  // not the shrink's passing steps
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_test).count();
      if (took > r.slowest_seconds) {
        r.slowest_seconds = took;
        r.slowest_case = drawn_cases();
      }
      outcome = rc::detail::CaseResult(rc::detail::CaseResult::Type::Success, "");
    } catch (const rc::detail::CaseResult& c) {
      outcome = c;
      if (c.type == rc::detail::CaseResult::Type::Discard && ++discarded >= kBarrenDraws && passed == 0 &&
          opt.reproduce.empty())
        barren = c;
      throw;
    } catch (...) {
      outcome = rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, "exception");
      throw;
    }
  });
  const auto result = rc::detail::checkProperty(property, md, params, listener, repro);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  rc::detail::SuccessResult success;
  rc::detail::Error error;
  if (result.match(success)) {
    r.verdict = PropVerdict::passed;
    r.tests = success.numSuccess;
  } else if (result.match(failure)) {
    r.tests = failure.numSuccess;
    r.reproduce = reproduce_text(p.name, failure.reproduce);
    r.failure = std::move(last);
    r.verdict = r.failure && r.failure->crashed ? PropVerdict::crashed : PropVerdict::failed;
    r.message = r.failure ? r.failure->message : failure.description;
  } else if (result.match(gave_up)) {
    // Every drawn case was declined or did not fit the property: nothing was tested.
    r.verdict = PropVerdict::unsupported;
    r.tests = gave_up.numSuccess;
    // RapidCheck's description is "FILE:LINE:\n<the last discard's message>": keep the message.
    std::string why = gave_up.description;
    if (const auto nl = why.find_last_of('\n'); nl != std::string::npos) why = why.substr(nl + 1);
    r.message = fmt::format(
        "gave up after {} tests and {} discarded draws: the drawn cases were declined or did not apply (last: {})",
        gave_up.numSuccess, discarded, why);
  } else if (result.match(error) && !opt.reproduce.empty() && outcome &&
             outcome->type != rc::detail::CaseResult::Type::Failure) {
    if (outcome->type == rc::detail::CaseResult::Type::Success) {
      r.verdict = PropVerdict::passed;
      r.tests = 1;
      r.message = "the reproduced case no longer fails";
    } else {
      r.verdict = PropVerdict::unsupported;
      r.tests = 0;
      std::string why = outcome->description;
      if (const auto nl = why.find_last_of('\n'); nl != std::string::npos) why = why.substr(nl + 1);
      r.message = fmt::format("the reproduced case was declined or does not apply now ({})", why);
    }
  } else if (result.match(error)) {
    throw std::runtime_error(fmt::format("property {}: {}", p.name, error.description));
  }
  return r;
}

fix::FixtureCase counterexample_case(const PropertyResult& r, const std::string& case_id) {
  if (!r.failure) throw std::logic_error("counterexample_case: the property did not fail");
  fix::FixtureCase fc = detail::reference_case(r.failure->replay, case_id);
  fc.category = "property";
  fc.description = fmt::format("Counterexample of property {} (seed {}, x {}): {}", r.name, r.seed,
                               r.failure->family, r.failure->message);
  // One line: HDF5 attributes are read back as written, but keep them short for `fixtures list`.
  for (auto& ch : fc.description)
    if (ch == '\n') ch = ' ';
  if (fc.description.size() > 1000) fc.description = fc.description.substr(0, 997) + "...";
  return fc;
}

std::string counterexample_text(const Failure& f, std::size_t max_values) {
  std::ostringstream s;
  s << "  case: " << case_summary(f.replay, f.family) << "\n";
  if (!f.plan.empty()) s << "  plan: " << f.plan << (f.fault.empty() ? "" : ", fault " + f.fault) << "\n";
  for (const auto& [name, t] : f.replay.inputs) {
    s << fmt::format("  {} [{}] {}:", name, fmt::join(t.shape, ", "), ref::name_of(t.dtype));
    const std::size_t n = t.data.size();
    const std::size_t shown = std::min(n, max_values);
    for (std::size_t i = 0; i < shown; ++i)
      s << (i % 4 == 0 ? "\n    " : "  ") << fmt::format("{} ({})", ref::decimal_text(t.data[i], t.dtype),
                                                        ref::hex_text(t.data[i]));
    if (shown < n) s << fmt::format("\n    ... {} more values in the counterexample file", n - shown);
    s << "\n";
  }
  if (f.agreement) {
    s << "  against the reference: " << conf::name_of(f.agreement->verdict);
    if (f.agreement->verdict == conf::Verdict::passed || f.agreement->verdict == conf::Verdict::mistrusted)
      s << " (each side is within the tolerance model; the relation itself is what broke)";
    s << "\n";
  }
  return s.str();
}

}  // namespace normcheck::prop
