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

// A dialect may come in variants (fitted or enumerated parameter values): each gives knobs, the
// parameters a diagnosis reports, and, where a variant is best named by what it changes ("the
// contract's xhat rounding skipped"), its own title in place of the dialect's.
struct Variant {
  Knobs k;
  std::map<std::string, double> parameters;
  std::string title = {};  // empty: the dialect's title
};

struct Dialect {
  DialectInfo info;
  std::function<std::vector<Variant>(const Ctx&)> variants;
};

// The dialects in panel order (the order names merged dialects: the earliest names the group).
const std::vector<Dialect>& panel();

}  // namespace normcheck::conf::diag
