// A declared reduction class that the outputs violate (declared.hpp; TOLERANCE.md, section 9).
#include <fmt/core.h>

#include "normcheck/judge/declared.hpp"

namespace normcheck::conf {

CaseResult check_declared(const fix::FixtureCase& fc, const Outputs& got,
                          const std::map<std::string, OutputAllowance>& allow, const Reduction& red,
                          const CheckOptions& opt) {
  CaseResult res = check_case(fc, got, allow, opt);
  explain_declared(res, fc, got, red, opt);
  return res;
}

void explain_declared(CaseResult& res, const fix::FixtureCase& fc, const Outputs& got, const Reduction& red,
                      const CheckOptions& opt) {
  if (red.is_any() || res.verdict != Verdict::failed) return;
  const CaseResult plain = check_case(fc, got, derive_allowances(fc.c), opt);
  for (auto& o : res.outputs) {
    if (o.verdict != Verdict::failed) continue;
    const OutputResult* a = nullptr;
    for (const auto& p : plain.outputs)
      if (p.name == o.name) a = &p;
    if (a && a->verdict == Verdict::mistrusted)
      // Under `any` the output is not compared at all: no bound of `any` to be "within".
      o.reason = fmt::format(
          "the declared reduction class {} is what failed: {}; under the bound of any correct algorithm "
          "this output is MISTRUSTED, not compared ({}): the declaration is what makes it comparable",
          name_of(red), o.reason, a->reason);
    else if (a && a->verdict != Verdict::failed)
      o.reason = fmt::format(
          "the declared reduction class {} is what failed: {}; within the bound of any correct algorithm "
          "(largest error {:.3g} of that allowance), so a kernel of another class would conform",
          name_of(red), o.reason, a->max_ratio);
    else
      o.reason = fmt::format("{} (beyond the bound of any correct algorithm as well, not only of the declared "
                             "reduction class {})",
                             o.reason, name_of(red));
  }
}

}  // namespace normcheck::conf
