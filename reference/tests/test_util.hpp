// Building cases in tests.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::ref::testing {

inline Tensor tensor(DType t, std::vector<std::int64_t> shape, std::vector<double> data) {
  return Tensor{t, std::move(shape), std::move(data)};
}

// A forward case over the last dim of a [rows, cols] x, no affine, float32 unless changed.
inline Case simple_case(Op op, std::int64_t rows, std::int64_t cols, std::vector<double> x,
                        DType dt = DType::float32) {
  Case c;
  c.op = op;
  c.affine = Affine::none;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = dt;
  c.dtype_compute = DType::float32;
  c.inputs["x"] = tensor(dt, {rows, cols}, std::move(x));
  return c;
}

inline void set_affine(Case& c, std::vector<double> w, std::vector<double> b = {}) {
  const auto n = static_cast<std::int64_t>(w.size());
  c.affine = b.empty() ? Affine::weight : Affine::weight_bias;
  c.inputs["weight"] = tensor(c.dtype_param, {n}, std::move(w));
  if (!b.empty()) c.inputs["bias"] = tensor(c.dtype_param, {n}, std::move(b));
}

// n values of dtype t drawn from N(mean, sd), rounded to t.
inline std::vector<double> normal_values(std::mt19937_64& rng, std::size_t n, double mean, double sd, DType t) {
  std::normal_distribution<double> dist(mean, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = round_to(dist(rng), t);
  return v;
}

inline bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace normcheck::ref::testing
