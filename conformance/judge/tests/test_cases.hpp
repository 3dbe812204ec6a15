// Helpers the conformance unit tests share to build their cases: normal values already rounded
// to a dtype, and a one-case fixture whose expected outputs come from the certified reference.
#pragma once

#include <cstddef>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "normcheck/judge/checker.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::conf::test {

inline std::vector<double> normal(std::mt19937_64& rng, std::size_t n, double mean, double sd, ref::DType t) {
  std::normal_distribution<double> dist(mean, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = ref::round_to(dist(rng), t);
  return v;
}

// A LayerNorm case without affine over a [rows, cols] x of dtype `dt`, float32 compute.
inline ref::Case ln_case(std::int64_t rows, std::int64_t cols, std::vector<double> x,
                         ref::DType dt = ref::DType::float32) {
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::none;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = dt;
  c.dtype_compute = ref::DType::float32;
  c.inputs["x"] = ref::Tensor{dt, {rows, cols}, std::move(x)};
  return c;
}

// The result of output `name` in a checked case.
inline const OutputResult& output(const CaseResult& r, const std::string& name) {
  for (const auto& o : r.outputs)
    if (o.name == name) return o;
  throw std::runtime_error("no output " + name);
}

inline fix::FixtureCase fixture_of(const ref::Case& c) {
  fix::FixtureCase fc;
  fc.id = "t";
  fc.c = c;
  fc.expected = ref::evaluate(c).outputs;
  return fc;
}

// The certified outputs of `fc`, as a kernel that is right returns them.
inline Outputs certified(const fix::FixtureCase& fc) {
  Outputs o;
  for (const auto& [name, out] : fc.expected) o[name] = out.value;
  return o;
}

}  // namespace normcheck::conf::test
