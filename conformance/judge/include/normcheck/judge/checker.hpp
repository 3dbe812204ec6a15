// The checker: compares a candidate's outputs with the certified expected values of a fixture
// case under the tolerance model and gives each output and the case a verdict.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"

namespace normcheck::conf {

// Ordered by severity: a case takes the most severe verdict of its outputs.
enum class Verdict { passed, unsupported, mistrusted, missing, failed, timeout, crashed };
std::string_view name_of(Verdict v);  // "PASSED", "FAILED" ...
std::optional<Verdict> parse_verdict(std::string_view name);
// FAILED, MISSING, CRASHED and TIMEOUT make `run`/`check` exit 1.
bool is_failure(Verdict v);

// Histogram of one error measure over the compared elements of an output, for the reports
// (reports/RESULTS.md, "histogram"): `zero` exact, `bins[k]` with 2^(kHistLog2Min + k) <= v <
// 2^(kHistLog2Min + k + 1) (values below the first bin counted in bins[0], above the last in
// the last), `inf` infinite (NaN against a number).
inline constexpr int kHistLog2Min = -20;
inline constexpr int kHistBins = 41;  // 2^-20 ... 2^20
struct ErrorHistogram {
  std::int64_t zero = 0, inf = 0;
  std::vector<std::int64_t> bins = std::vector<std::int64_t>(kHistBins, 0);
  // Inline: the checker adds two values per element.
  void add(double v) {
    if (v == 0) {
      ++zero;
    } else if (!std::isfinite(v)) {
      ++inf;
    } else {
      // The binary exponent read from the bits (v > 0) rather than a libm call per element.
      // Subnormals read as -1023 and land in bins[0] like every value below 2^kHistLog2Min.
      const int e = static_cast<int>((std::bit_cast<std::uint64_t>(v) >> 52) & 0x7ff) - 1023;
      const int k = std::clamp(e - kHistLog2Min, 0, kHistBins - 1);
      ++bins[static_cast<std::size_t>(k)];
    }
  }
};

// The largest errors of one row (the index set of the non-normalized dims, reference/case.hpp
// Geometry) of an output that has rows: outputs of x's shape and the statistics (mean, rstd).
struct RowError {
  std::int64_t row = 0;
  double max_ulp = 0, max_ratio = 0;
};

// One output of one case.
struct OutputResult {
  std::string name;
  Verdict verdict = Verdict::passed;
  std::string reason;            // FAILED / MISSING / MISTRUSTED: why, with the numbers
  bool malformed = false;        // FAILED for its shape or dtype, not for its values
  std::int64_t elements = 0;     // compared elements (not mistrusted)
  std::int64_t failed = 0;       // elements beyond their allowance
  std::int64_t mistrusted = 0;   // elements not compared
  std::int64_t uncertified = 0;  // elements whose reference rounding was undecided (either neighbour)
  // Zeros accepted only because the candidate declares flush-to-zero outputs (CheckOptions): the
  // element would have failed, but its exact value is within allowance + the dtype's smallest
  // normal of 0. Counted among `elements`, not among `failed`.
  std::int64_t flushed = 0;
  double max_ulp = 0;            // largest error in ulps of the output dtype (at the exact value)
  double max_abs = 0;            // largest absolute error
  double max_rel = 0;            // largest relative error (elements with a non-zero exact value)
  double max_ratio = 0;          // largest error / allowance: > 1 fails; the separation margin
  // Sensitivity (TOLERANCE.md, section 6.1): the smallest relative fault this comparison is sure
  // to catch. A candidate whose value of this output is the exact value times (1 + d), correctly
  // rounded, is FAILED for every |d| in [sensitivity, 1) at the element where the allowance is
  // relatively narrowest (and so for such a fault on every element): the minimum over compared
  // elements with a normal exact value of (allowance + ulp) / |exact|. It depends on the inputs
  // and the declared reduction class only, never on the candidate's values; infinite when no
  // element qualifies.
  double sensitivity = INFINITY;
  // Probes (TOLERANCE.md, section 6.1), on `rstd` of a case with one statistic per row: for a few
  // faults whose effect on rstd follows from the exact rstd alone, the largest over rows of the
  // certain error of a kernel that makes that fault and is otherwise exact (its rstd correctly
  // rounded) divided by the row's allowance: above 1 the verdict is sure to catch the fault.
  // "variance_over_n_minus_1": the variance (RMSNorm: the mean square) divided by n - 1;
  // "eps_1e-6": eps hard-coded to 1e-6 (absent where the case's eps is 1e-6).
  std::map<std::string, double> probes;
  // The worst element (largest error/allowance): flat index, coordinates, values.
  std::int64_t worst_index = -1;
  std::vector<std::int64_t> worst_coords;
  double worst_got = 0, worst_expected = 0, worst_exact = 0, worst_allowance = 0;
  ref::DType dtype = ref::DType::float32;
  // Quantized outputs (checker_quant.hpp): codes that differ from the certified code and were
  // accepted because the allowance of the value before quantization reaches the code boundary
  // between them (TOLERANCE.md, section 10), each explained in `flips` (the first few); and the
  // rows/blocks whose scale legitimately differs, so that their codes were judged against the
  // candidate's own scale.
  std::int64_t flips_accepted = 0;
  std::vector<std::string> flips;
  std::int64_t own_scale = 0;
  // For the reports: histograms of the error in ulps and of error / allowance, and per row
  // (outputs with rows only) the largest errors.
  ErrorHistogram hist_ulp, hist_ratio;
  std::vector<RowError> rows;
};

struct CaseResult {
  std::string case_id;
  Verdict verdict = Verdict::passed;
  std::string message;  // UNSUPPORTED / CRASHED / TIMEOUT: the reason
  std::vector<OutputResult> outputs;
  double seconds = 0;  // time the candidate took
  // What the case is, for the reports' matrix (set by describe_case from the fixture case).
  std::string op, direction, block, dtype, category;
  std::int64_t normalized_size = 0;  // elements a row's statistics are taken over (0: unknown)
  // Per row of the case: |mean| / sigma of the row's normalized input (x, or the residual sum
  // h = alpha x + residual (+ residual_bias)); infinite for a constant row, NaN for a row with a
  // non-finite value. The variance's condition number is sqrt(1 + (mean/sigma)^2).
  std::vector<double> row_mean_over_sigma;
  // FAILED cases: the best dialects of the diagnosis panel (diagnosis.hpp), best first.
  std::vector<Diagnosis> diagnosis;
  bool diagnosed = false;  // the panel ran (an empty `diagnosis` then: no dialect applies)
  // A recorded finding of a real library this verdict is (run --known-findings; conformance/
  // known_findings.hpp): the docs anchor that explains it and what it is; "" when none.
  std::string known_finding, known_what;
};

// Whether a FAILED case is one for the diagnosis: it failed on values, with every output of the
// expected shape and dtype. A wrong shape or dtype is reported as what it is (the output's
// reason), never explained by a fault of the panel.
bool diagnosable(const CaseResult& r);

// Sets the descriptive fields of `r` (op, direction, block, dtype, category, the rows' mean/sigma)
// from the fixture case; the verdicts are untouched.
void describe_case(CaseResult& r, const fix::FixtureCase& fc);

// Error of `got` against the exact value `exact` (whose correctly rounded value is `expected`),
// in value units, as the checker measures it: infinite when the kinds differ (NaN against a
// number, an infinity where the value does not overflow).
double element_error(double got, double exact, double expected, ref::DType t);

// What the candidate declared that changes the comparison (conformance/candidate.hpp,
// Capabilities; check_options_of makes one from them).
struct CheckOptions {
  // Capabilities::flush_subnormal_outputs: a +-0 output is accepted where its exact value lies
  // within its allowance plus the output dtype's smallest normal of 0 (flush_slack).
  bool flush_subnormal_outputs = false;
};

// The extra allowance of an output value `got` of dtype `t` from a candidate that may flush
// subnormal outputs: the smallest normal of `t` (2^-126 for float32 and bfloat16, 2^-14 for
// float16) when `got` is +-0, else 0. Sound: the candidate's unflushed value r is within the
// allowance a of the exact value, and it flushes only |r| < smallest normal, so the exact value
// is within a + smallest normal of the zero it returns.
double flush_slack(double got, ref::DType t);
// Adds flush_slack to the allowance of every zero element of `got` (outputs present in both),
// for relations between outputs of a candidate that declares flush-to-zero outputs.
void widen_for_flushed_zeros(std::map<std::string, OutputAllowance>& allow, const Outputs& got);

// Compares `got` with `fc.expected` under `allow` (derive_allowances(fc.c)). Extra outputs are
// ignored; a wrong shape or dtype FAILS that output; NaN where a finite value is expected (or
// the reverse) fails the element.
CaseResult check_case(const fix::FixtureCase& fc, const Outputs& got,
                      const std::map<std::string, OutputAllowance>& allow, const CheckOptions& opt = {});

// Values an output's dtype cannot hold: an outputs file (fixtures/SCHEMA.md, "Outputs files")
// may store a bfloat16, float16 or float32 output in a wider dataset (float64), and a value there
// that is not a value of the dtype (the final rounding skipped, or done to another format) makes
// the output FAILED "not a bfloat16 value", naming the first such element and its value in hex
// (malformed: for its dtype, never diagnosed). Outputs named in `wider` (declared wider on
// purpose) and outputs already FAILED for their shape are left as they are. The case's verdict
// is recomputed.
void reject_unrepresentable(CaseResult& res, const Outputs& got, const std::set<std::string>& wider);

}  // namespace normcheck::conf
