// Helpers the conformance unit tests share to build their cases: normal values already rounded
// to a dtype, and a one-case fixture whose expected outputs come from the certified reference.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "normcheck/conformance/checker.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::conf::test {

inline std::vector<double> normal(std::mt19937_64& rng, std::size_t n, double mean, double sd, ref::DType t) {
  std::normal_distribution<double> dist(mean, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = ref::round_to(dist(rng), t);
  return v;
}

inline fix::FixtureCase fixture_of(const ref::Case& c) {
  fix::FixtureCase fc;
  fc.id = "t";
  fc.c = c;
  fc.expected = ref::evaluate(c).outputs;
  return fc;
}

}  // namespace normcheck::conf::test
