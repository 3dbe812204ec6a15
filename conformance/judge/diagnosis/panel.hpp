// The panel (../../DIAGNOSIS.md, "The panel"): every dialect the diagnosis evaluates, each a
// fault of the catalogue (normcheck/judge/faults.hpp, whose class it takes) applied to the case's
// semantics as a change of the knobs (fault_model.hpp), in variants where a parameter is fitted
// or enumerated. panel.cpp holds them as a table, one row per dialect.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fault_model.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/judge/diagnosis.hpp"

namespace normcheck::conf::diag {

// What a dialect builder sees.
struct Ctx {
  const fix::FixtureCase& fc;
  const ref::Case& c;
  const Outputs& got;
  const Knobs& spec;
  const ref::Geometry& g;
  const std::vector<std::int64_t>& rows;  // the rows a fit looks at (all, or the sample)
};

// A dialect may come in variants (fitted parameter values): each gives knobs and parameters.
struct Variant {
  Knobs k;
  std::map<std::string, double> parameters;
};

struct Dialect {
  DialectInfo info;
  std::function<std::vector<Variant>(const Ctx&)> variants;
};

// The dialects in panel order (the order names merged dialects: the earliest names the group).
const std::vector<Dialect>& panel();

// Names of the variants of contract_point_skipped and other_contract (their "point" and
// "contract" parameters).
std::string contract_name(std::size_t i);
std::string point_name(int p);

}  // namespace normcheck::conf::diag
