// The checker: compares a candidate's outputs with the certified expected values of a fixture
// case under the tolerance model and gives each output and the case a verdict.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/conformance/diagnosis.hpp"
#include "normcheck/conformance/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"

namespace normcheck::conf {

// Ordered by severity: a case takes the most severe verdict of its outputs.
enum class Verdict { passed, unsupported, mistrusted, missing, failed, timeout, crashed };
std::string_view name_of(Verdict v);  // "PASSED", "FAILED" ...
std::optional<Verdict> parse_verdict(std::string_view name);
// FAILED, MISSING, CRASHED and TIMEOUT make `run`/`check` exit 1.
bool is_failure(Verdict v);

// One output of one case.
struct OutputResult {
  std::string name;
  Verdict verdict = Verdict::passed;
  std::string reason;            // FAILED / MISSING / MISTRUSTED: why, with the numbers
  std::int64_t elements = 0;     // compared elements (not mistrusted)
  std::int64_t failed = 0;       // elements beyond their allowance
  std::int64_t mistrusted = 0;   // elements not compared
  std::int64_t uncertified = 0;  // elements whose reference rounding was undecided (either neighbour)
  double max_ulp = 0;            // largest error in ulps of the output dtype (at the exact value)
  double max_abs = 0;            // largest absolute error
  double max_rel = 0;            // largest relative error (elements with a non-zero exact value)
  double max_ratio = 0;          // largest error / allowance: > 1 fails; the separation margin
  // The worst element (largest error/allowance): flat index, coordinates, values.
  std::int64_t worst_index = -1;
  std::vector<std::int64_t> worst_coords;
  double worst_got = 0, worst_expected = 0, worst_exact = 0, worst_allowance = 0;
  ref::DType dtype = ref::DType::float32;
};

struct CaseResult {
  std::string case_id;
  Verdict verdict = Verdict::passed;
  std::string message;  // UNSUPPORTED / CRASHED / TIMEOUT: the reason
  std::vector<OutputResult> outputs;
  double seconds = 0;  // time the candidate took
  // FAILED cases: the best dialects of the diagnosis panel (diagnosis.hpp), best first.
  std::vector<Diagnosis> diagnosis;
  bool diagnosed = false;  // the panel ran (an empty `diagnosis` then: no dialect applies)
};

// Error of `got` against the exact value `exact` (whose correctly rounded value is `expected`),
// in value units, as the checker measures it: infinite when the kinds differ (NaN against a
// number, an infinity where the value does not overflow).
double element_error(double got, double exact, double expected, ref::DType t);

// Compares `got` with `fc.expected` under `allow` (derive_allowances(fc.c)). Extra outputs are
// ignored; a wrong shape or dtype FAILS that output; NaN where a finite value is expected (or
// the reverse) fails the element.
CaseResult check_case(const fix::FixtureCase& fc, const Outputs& got,
                      const std::map<std::string, OutputAllowance>& allow);

}  // namespace normcheck::conf
