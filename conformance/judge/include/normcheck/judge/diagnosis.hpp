// Diagnosis: which known fault explains a failing candidate's outputs.
//
// A *dialect* is the case's semantics with one known fault applied (eps outside the
// sqrt, N-1 variance, a one-pass variance in float32, the residual added after the norm ...).
// For a FAILED case every dialect of the panel that applies to it predicts every output; its
// *score* is the largest |got - predicted| / allowance over the compared elements, with the
// allowance of the checker (derive_allowances): a score <= 1 means the dialect explains the
// outputs as well as the spec explains a correct kernel's. conformance/DIAGNOSIS.md lists the
// dialects and how each is evaluated.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "normcheck/judge/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"

namespace normcheck::conf {

// One dialect's verdict on a case. Serialized as an element of the case's "diagnosis" list in
// the results file (reports/RESULTS.md).
struct Diagnosis {
  std::string dialect;      // "eps_outside_sqrt"
  std::string fault_class;  // "A" .. "H", the fault classes of conformance/DIAGNOSIS.md
  std::string title;        // "eps added outside the sqrt"
  double score = 0;         // max error / allowance over the compared elements (inf: NaN mismatch)
  bool explains = false;    // score <= 1
  std::string evidence;     // the numbers in words, with the spec's score beside this one
  double spec_score = 0;    // the spec's own score on the case (on `output`, when set), same units
  // Set when the dialect explains the failing outputs alone, where no dialect explains the whole
  // case (a fault that shows in y and rstd while residual_out is right): their names, "y, rstd".
  std::string output;
  std::map<std::string, double> parameters;  // fitted values ("epsilon"), when the dialect has any
  std::vector<std::string> same_as;          // other dialects that predict identical outputs here
};

struct DiagnoseOptions {
  std::size_t keep = 5;  // the best this many dialects are returned
  // Cases of more than `sample_above` elements are screened on a sample of rows (the rows where
  // the outputs depart most from the spec, at most `sample_rows` and an eighth of the rows, and
  // as many spread over the case): a sample score is a lower bound of the full one. Entries are
  // then scored on every row in ranking order until the best `exact_top` are exact (branch and
  // bound: the ranking of those is the one every row would give), with every entry that may
  // merge into the best one; the entries after them may keep their sample score
  // (explains = false, the evidence says "at least").
  std::size_t sample_above = 256;
  std::size_t sample_rows = 8;
  std::size_t exact_top = 1;
  // Cases larger than this (elements of x) are not diagnosed: the predictions of a few dialects
  // are held in memory at once (8 bytes per element each).
  std::size_t max_elements = std::size_t{1} << 24;
};

// Ranks the panel's dialects on one case, best (lowest score) first, and returns the best
// `keep`. `allow` is derive_allowances(fc.c) (the runner has it already). Outputs of `got` with
// a wrong shape or dtype, and missing ones, are not scored. Returns an empty list for a case the
// panel does not model (no dialect applies, more than max_elements); never
// throws.
std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got,
                                const std::map<std::string, OutputAllowance>& allow,
                                const DiagnoseOptions& opt = {});
std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got,
                                const DiagnoseOptions& opt = {});

// The score of the spec itself (the checker's largest error / allowance), in the same units.
double spec_score(const fix::FixtureCase& fc, const Outputs& got,
                  const std::map<std::string, OutputAllowance>& allow);

// One line for people: "best explained by eps_outside_sqrt (A, eps added outside the sqrt):
// max 0.4 tolerance units from it, 2.1e5 from the spec", or that no dialect explains it.
std::string describe_diagnosis(const std::vector<Diagnosis>& d);

// The panel's dialects with the fault each names (an id of the fault catalogue, faults.hpp), its
// class and the dialect's title (documentation, tests).
struct DialectInfo {
  std::string name, fault_class, title;
  std::string fault;
};
const std::vector<DialectInfo>& dialect_panel();

}  // namespace normcheck::conf
