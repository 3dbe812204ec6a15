// Scoring a dialect (../../DIAGNOSIS.md, "How a dialect is scored"): the largest |got -
// prediction| / allowance over the compared elements, with the checker's allowances; whether the
// outputs tell two predictions apart.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/judge/tolerance.hpp"

namespace normcheck::conf::diag {

// Columns of a backward case's cheap column-sum bound (worst_spec_columns).
inline constexpr std::size_t kBoundColumns = 16;

// Predictions closer than this many allowances everywhere cannot be told apart by the outputs.
inline constexpr double kSameWithin = 0.5;

struct Score {
  double score = 0;
  std::int64_t beyond = 0;  // elements beyond their allowance (ranks dialects of equal score)
  bool distinct = false;    // some element tells the dialect from the spec (see distinguishable)
  std::int64_t unpredicted = 0;  // elements the dialect makes no prediction for (not scored)
  std::string worst_output;
  std::int64_t worst_index = -1;
  bool partial = false;  // Scorer::score stopped at stop_at: `score` is a lower bound
};

// The score of one output, and the running maximum it is merged into (see score_of).
struct OutputScore {
  Score s;
  double worst = -1;  // the largest ratio seen (-1: no scored element)
};
// Per output, the spec's own contribution over a layout: an output a dialect predicts exactly as
// the engine's spec (bit for bit) scores exactly this, and is not scored again.
using SpecScores = std::map<std::string, OutputScore>;

// The prediction for element i: the certified value where the dialect agrees with the engine's
// spec, the certified value plus the fault's effect where both are finite, the dialect's own
// value otherwise. Inline: it runs for every element of every dialect scored.
inline double predicted(double dialect, double spec, double exact, bool wide) {
  if (std::bit_cast<std::uint64_t>(dialect) == std::bit_cast<std::uint64_t>(spec) ||
      (std::isnan(dialect) && std::isnan(spec)))
    return exact;
  if (std::isfinite(dialect) && std::isfinite(spec) && std::isfinite(exact)) {
    // Summed in binary64 the prediction errs by half a binary64 ulp, far below the allowance of
    // any narrower output; float64 outputs (`wide`) take the long double sum.
    if (!wide) return exact + (dialect - spec);
    return static_cast<double>(static_cast<Wide>(exact) +
                               (static_cast<Wide>(dialect) - static_cast<Wide>(spec)));
  }
  return dialect;
}

// Whether output `name` of `got` can be scored: present, with the expected shape and dtype, and
// an allowance of its size.
bool scorable(const ref::Output& exp, const Outputs& got, const std::string& name,
              const std::map<std::string, OutputAllowance>& allow);

// The error the checker measures, against a prediction p (element_error where either is not
// finite; error_against_slow).
double error_against_slow(double got, double p, DType t);
inline double error_against(double got, double p, DType t) {
  if (std::isfinite(got) && std::isfinite(p)) return std::fabs(got - p);  // element_error then is this
  return error_against_slow(got, p, t);
}

// The checker's allowance of element i (NaN: mistrusted), one ulp more where the reference's
// rounding is undecided.
double a_abs(const OutputAllowance& a, const ref::Output& exp, std::size_t i, DType t);

// What scoring reads of one output, gathered once per case: the candidate's values, the
// certified values, the allowances with a_abs's extra ulp where the reference's rounding is
// undecided (NaN: mistrusted). A dialect's score reads every element of every output it
// predicts, for 40 or so variants per case: the allowances are not derived again for each.
struct OutputTable {
  const ref::Output* exp = nullptr;
  const OutputAllowance* a = nullptr;
  const std::vector<double>* got = nullptr;
  DType t = DType::float32;
  std::vector<double> al;  // a_abs of every element
};

// The scoring of one case's outputs: score_of with the tables of the outputs it meets (made on
// first use, kept for the next dialect).
class Scorer {
 public:
  Scorer(const fix::FixtureCase& fc, const Outputs& got, const std::map<std::string, OutputAllowance>& allow)
      : fc_(fc), got_(got), allow_(allow) {}
  // score_of's arguments after `allow`, and its result. stop_at (NaN: never): the scoring ends
  // as soon as some element's ratio reaches it (a variant that cannot beat an earlier one), and
  // the score returned is that ratio, `partial` set: a lower bound, its other fields incomplete.
  Score score(const Layout* lay, const Predictions* dialect, const Predictions* spec,
              SpecScores* same_as_spec = nullptr, const std::string& only = {}, bool need_distinct = true,
              double stop_at = std::numeric_limits<double>::quiet_NaN()) const;
  // Largest error / allowance of the certified values per row (per-element and per-row
  // outputs): the rows where the candidate departs most from the spec, where faults show.
  // spec_max: the spec's score; spec_others: that of the outputs not per row (column sums).
  std::vector<double> spec_row_ratios(const ref::Geometry& g, const Layout& all, double* spec_max,
                                      double* spec_others = nullptr) const;

 private:
  // The table of output `name`, or nullptr where it cannot be scored (scorable).
  const OutputTable* table(const std::string& name, const ref::Output& exp) const;
  const fix::FixtureCase& fc_;
  const Outputs& got_;
  const std::map<std::string, OutputAllowance>& allow_;
  mutable std::map<std::string, std::optional<OutputTable>> tables_;
};

// Largest error / allowance of a dialect's predictions over the elements of `lay` (dialect ==
// nullptr: the certified values over every element). Scorer::score with tables of its own. `same_as_spec` holds (and receives) the
// spec's own score of outputs the dialect predicts bit for bit as the spec; `only` scores one
// output; need_distinct = false skips the test whether the dialect can be told from the spec.
Score score_of(const fix::FixtureCase& fc, const Outputs& got,
               const std::map<std::string, OutputAllowance>& allow, const Layout* lay,
               const Predictions* dialect, const Predictions* spec, SpecScores* same_as_spec = nullptr,
               const std::string& only = {}, bool need_distinct = true);


// The `k` columns where the certified dweight and dbias depart most from the candidate's (in
// allowances; ascending order), or none when there are not more than 2k columns: the columns a
// cheap bound of a backward dialect's column sums looks at first.
std::vector<std::int64_t> worst_spec_columns(const fix::FixtureCase& fc, const Outputs& got,
                                             const std::map<std::string, OutputAllowance>& allow,
                                             std::int64_t cols, std::size_t k);

// Whether two scores are those of identical predictions could be (a cheap test before hashing).
bool same_score(const Score& a, const Score& b);

// Whether some element of `lay` tells predictions a and b apart (b == nullptr: the certified
// values): they differ by more than kSameWithin allowance and round to different values of the
// output's dtype.
bool distinguishable(const fix::FixtureCase& fc, const Outputs& got,
                     const std::map<std::string, OutputAllowance>& allow, const Layout& lay,
                     const Predictions* a, const Predictions* b, const Predictions& spec);

// A hash of the predictions (dialects with identical predictions are one entry).
std::uint64_t hash_of(const Predictions& p);

}  // namespace normcheck::conf::diag
