// Building cases in tests.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
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

// Two evaluations of one case give the same outputs bit for bit (the sign of a zero too), with
// the same certified flags: how a fast path is held to the exact one.
inline void expect_same_bits(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size()) << what;
  for (const auto& [name, out] : a.outputs) {
    const Output& other = b.outputs.at(name);
    ASSERT_EQ(out.value.data.size(), other.value.data.size()) << what << " " << name;
    for (std::size_t i = 0; i < out.value.data.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(out.value.data[i]), std::bit_cast<std::uint64_t>(other.value.data[i]))
          << what << " " << name << "[" << i << "]: " << std::hexfloat << out.value.data[i] << " vs "
          << other.value.data[i];
      EXPECT_EQ(std::bit_cast<std::uint64_t>(out.f64[i]), std::bit_cast<std::uint64_t>(other.f64[i]))
          << what << " " << name << " f64[" << i << "]";
      EXPECT_EQ(out.certified[i], other.certified[i]) << what << " " << name << " certified[" << i << "]";
    }
  }
}

}  // namespace normcheck::ref::testing
