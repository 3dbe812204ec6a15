// Judging a candidate that declares its reduction class (tolerance.hpp, Reduction; TOLERANCE.md,
// section 9): the allowances of the class, and where an output fails them but not the bound of
// every correct algorithm, a reason that says the declaration is what failed.
#pragma once

#include <map>
#include <string>

#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"

namespace normcheck::conf {

// check_case under `allow` = derive_allowances(fc.c, red). When `red` is not `any` and an
// output FAILED, the outputs are checked again under the bound of `any`: an output within it
// has its reason start with "the declared reduction class C is what failed" (and say, where
// `any` MISTRUSTS it, that only the declaration makes it comparable), one beyond it says that it
// fails `any` too. Verdicts are those under `allow`.
CaseResult check_declared(const fix::FixtureCase& fc, const Outputs& got,
                          const std::map<std::string, OutputAllowance>& allow, const Reduction& red,
                          const CheckOptions& opt = {});
// The second half of check_declared, for a result `res` that check_case already made under the
// class's allowances: nothing when `red` is `any` or nothing FAILED.
void explain_declared(CaseResult& res, const fix::FixtureCase& fc, const Outputs& got, const Reduction& red,
                      const CheckOptions& opt = {});

}  // namespace normcheck::conf
