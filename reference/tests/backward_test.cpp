// Backward reference: exact identities that hold without finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "normcheck/reference/evaluate.hpp"
#include "test_util.hpp"

namespace normcheck::ref {
namespace {

using testing::normal_values;
using testing::set_affine;
using testing::simple_case;
using testing::tensor;

Case backward_case(Op op, std::int64_t rows, std::int64_t cols, std::mt19937_64& rng, double mean = 0) {
  Case c = simple_case(op, rows, cols, normal_values(rng, rows * cols, mean, 2, DType::float64), DType::float64);
  c.direction = Direction::backward;
  c.dtype_compute = DType::float64;
  c.inputs["dy"] = tensor(DType::float64, {rows, cols}, normal_values(rng, rows * cols, 0, 1, DType::float64));
  return c;
}

// Sum of binary64 values with the magnitude bound of its rounding error.
double sum_with_bound(const std::vector<double>& v, std::size_t begin, std::size_t n, double& bound) {
  long double s = 0, m = 0;
  for (std::size_t i = begin; i < begin + n; ++i) {
    s += v[i];
    m = std::max(m, static_cast<long double>(std::fabs(v[i])));
  }
  // Each value is its exact counterpart rounded to binary64 (relative error 2^-53); the long
  // double sum adds n * 2^-64 relative error more.
  bound = static_cast<double>(m) * static_cast<double>(n) * 0x1p-50;
  return static_cast<double>(s);
}

TEST(Backward, FastPathAgreesWithExactEverywhere) {
  // The double-double path against the exact rationals and MPFR for every output: dtypes,
  // both ops, large means (cancellation in d = h - mean), weight offset, residuals with alpha,
  // and rows the fast path must leave to the exact one: a constant row (K = 0 exactly), dy = 0,
  // x far outside the fast domain, dy too small for it, and two rows whose dweight terms cancel.
  std::mt19937_64 rng(27);
  Options slow;
  slow.fast_path = false;
  const std::int64_t rows = 9, cols = 23;
  for (DType t : {DType::float64, DType::float32, DType::float16, DType::bfloat16}) {
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      for (double mean : {0.0, 100.0, 3000.0}) {
        for (int variant = 0; variant < 4; ++variant) {
          Case c = simple_case(op, rows, cols, normal_values(rng, rows * cols, mean, 1, t), t);
          c.direction = Direction::backward;
          c.dtype_compute = DType::float32;
          std::vector<double> dy = normal_values(rng, rows * cols, 0, 1, t);
          auto& x = c.inputs["x"].data;
          for (std::int64_t col = 0; col < cols; ++col) {
            x[1 * cols + col] = x[1 * cols];  // constant row
            dy[2 * cols + col] = 0.0;         // no gradient
            x[4 * cols + col] = x[3 * cols + col];  // row 4 = row 3 with -dy: dweight terms cancel
            dy[4 * cols + col] = -dy[3 * cols + col];
          }
          if (t == DType::float64) {
            x[5 * cols + 3] = 0x1p-600;   // h outside the fast domain
            dy[6 * cols + 4] = 0x1p-1000;  // dy outside it
          }
          c.inputs["dy"] = tensor(t, {rows, cols}, dy);
          if (variant >= 1) set_affine(c, normal_values(rng, cols, 1, 0.5, t), normal_values(rng, cols, 0, 0.5, t));
          if (variant == 2) c.weight_offset = 1.0;
          if (variant == 3) {
            c.residual = Residual::add_bias;
            c.alpha = 0.75;
            c.inputs["residual"] = tensor(t, {rows, cols}, normal_values(rng, rows * cols, 0, 1, t));
            c.inputs["residual_bias"] = tensor(t, {cols}, normal_values(rng, cols, 0, 1, t));
          }
          const Result a = evaluate(c), b = evaluate(c, slow);
          const std::string what = std::string(name_of(t)) + " " + std::string(name_of(op)) + " mean " + std::to_string(mean) +
                                   " variant " + std::to_string(variant);
          EXPECT_GT(a.stats.fast, 0) << what;
          EXPECT_GT(a.stats.slow, 0) << what << ": the constant row goes to the exact path";
          testing::expect_same_bits(a, b, what);
        }
      }
    }
  }
}

TEST(Backward, LayerNormDxSumsToZeroWithUnitWeight) {
  // sum_i dx_i = rstd * (sum g - N mean(g) - mean(g*xhat) sum xhat) = 0 exactly.
  std::mt19937_64 rng(21);
  for (double mean : {0.0, 1e3, 1e6}) {
    Case c = backward_case(Op::layernorm, 5, 129, rng, mean);
    const Result r = evaluate(c);
    const auto& dx = r.outputs.at("dx").f64;
    for (int row = 0; row < 5; ++row) {
      double bound = 0;
      const double s = sum_with_bound(dx, row * 129, 129, bound);
      EXPECT_LE(std::fabs(s), bound) << "row " << row << " mean " << mean;
    }
    EXPECT_EQ(r.stats.uncertified, 0);
  }
}

TEST(Backward, RmsNormDxIsOrthogonalToXWithZeroEpsilon) {
  // With eps = 0: sum_i dx_i x_i = rstd * (sum g x - sum x^2 * mean(g x) / ms) = 0.
  std::mt19937_64 rng(22);
  Case c = backward_case(Op::rmsnorm, 3, 64, rng, 0.5);
  c.epsilon = 0;
  const Result r = evaluate(c);
  const auto& dx = r.outputs.at("dx").f64;
  const auto& x = c.inputs["x"].data;
  for (int row = 0; row < 3; ++row) {
    std::vector<double> prod(64);
    for (int i = 0; i < 64; ++i) prod[i] = dx[row * 64 + i] * x[row * 64 + i];
    double bound = 0;
    const double s = sum_with_bound(prod, 0, 64, bound);
    EXPECT_LE(std::fabs(s), 2 * bound) << row;
  }
}

TEST(Backward, DbiasIsTheColumnSumOfDyExactly) {
  std::mt19937_64 rng(23);
  Case c = backward_case(Op::layernorm, 6, 5, rng);
  // Small integers: every partial sum is exact in binary64, so the exact column sum is known.
  for (auto& v : c.inputs["dy"].data) v = std::round(v * 8);
  set_affine(c, {1, 2, 3, 4, 5}, {0, 0, 0, 0, 0});
  const Result r = evaluate(c);
  for (int col = 0; col < 5; ++col) {
    double s = 0;
    for (int row = 0; row < 6; ++row) s += c.inputs["dy"].data[row * 5 + col];
    EXPECT_EQ(r.outputs.at("dbias").value.data[col], s);
  }
}

TEST(Backward, DweightOfIdenticalRowsCombinesExactly) {
  // Two identical rows with opposite dy: dweight = dy*xhat - dy*xhat = 0 exactly, which an
  // enclosure of the sum could never certify; grouping equal q makes it exact.
  std::mt19937_64 rng(24);
  const auto x = normal_values(rng, 7, 0, 1, DType::float32);
  const auto dy = normal_values(rng, 7, 0, 1, DType::float32);
  std::vector<double> xx(x), dd(dy);
  xx.insert(xx.end(), x.begin(), x.end());
  for (double v : dy) dd.push_back(-v);
  Case c = simple_case(Op::layernorm, 2, 7, xx);
  c.direction = Direction::backward;
  c.inputs["dy"] = tensor(DType::float32, {2, 7}, dd);
  set_affine(c, normal_values(rng, 7, 1, 0.2, DType::float32));
  const Result r = evaluate(c);
  for (int col = 0; col < 7; ++col) {
    EXPECT_EQ(r.outputs.at("dweight").value.data[col], 0.0);
    EXPECT_EQ(r.outputs.at("dweight").certified[col], 1);
  }
}

TEST(Backward, DweightMatchesForwardXhat) {
  // dweight_j = sum_rows dy * xhat, with xhat from the forward reference (binary64, exact
  // contract): the binary64 sum differs from the exact one by at most the rounding bound.
  std::mt19937_64 rng(25);
  Case c = backward_case(Op::rmsnorm, 9, 17, rng, 1);
  set_affine(c, normal_values(rng, 17, 1, 0.3, DType::float64));
  Case fwd = c;
  fwd.direction = Direction::forward;
  fwd.affine = Affine::none;
  fwd.inputs.erase("dy");
  fwd.inputs.erase("weight");
  const Result f = evaluate(fwd), b = evaluate(c);
  for (int col = 0; col < 17; ++col) {
    std::vector<double> terms;
    for (int row = 0; row < 9; ++row)
      terms.push_back(c.inputs["dy"].data[row * 17 + col] * f.outputs.at("y").f64[row * 17 + col]);
    double bound = 0;
    const double s = sum_with_bound(terms, 0, 9, bound);
    EXPECT_NEAR(b.outputs.at("dweight").f64[col], s, 4 * bound + 1e-300) << col;
  }
}

TEST(Backward, ResidualGradientsFollowTheChainRule) {
  // h = alpha x + r + rb: dresidual = dh, dx = alpha dh, dresidual_bias = column sum of dh.
  std::mt19937_64 rng(26);
  Case c = backward_case(Op::layernorm, 4, 9, rng);
  c.residual = Residual::add_bias;
  c.alpha = 0.5;
  c.dtype_residual = DType::float64;
  c.inputs["residual"] = tensor(DType::float64, {4, 9}, normal_values(rng, 36, 0, 1, DType::float64));
  c.inputs["residual_bias"] = tensor(DType::float64, {9}, normal_values(rng, 9, 0, 1, DType::float64));
  c.dtype_param = DType::float64;
  const Result r = evaluate(c);
  const auto& dres = r.outputs.at("dresidual").value.data;
  const auto& dx = r.outputs.at("dx").value.data;
  for (int i = 0; i < 36; ++i) EXPECT_EQ(dx[i], dres[i] * 0.5) << "alpha = 1/2 scales exactly";
  for (int col = 0; col < 9; ++col) {
    std::vector<double> column;
    for (int row = 0; row < 4; ++row) column.push_back(dres[row * 9 + col]);
    double bound = 0;
    const double s = sum_with_bound(column, 0, 4, bound);
    EXPECT_NEAR(r.outputs.at("dresidual_bias").value.data[col], s, 2 * bound + 1e-300);
  }
}

}  // namespace
}  // namespace normcheck::ref
