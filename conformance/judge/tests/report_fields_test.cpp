// What the checker records for the reports (reports/RESULTS.md: op/dtype/category, the error
// histograms, the per-row errors and each row's |mean|/sigma), on a case small enough to work out
// by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using test::certified;
using test::output;

// Rows: [1, 2, 3, 4] (mean 2.5, sigma sqrt(1.25)), [5, 5, 5, 5] (sigma 0),
// [100, 101, 102, 103] (mean 101.5, sigma sqrt(1.25)).
fix::FixtureCase three_rows() {
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::none;
  c.epsilon = 1e-5;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = c.dtype_compute = DType::float64;
  c.inputs["x"] = ref::Tensor{DType::float64, {3, 4}, {1, 2, 3, 4, 5, 5, 5, 5, 100, 101, 102, 103}};
  fix::FixtureCase fc;
  fc.id = "ln_f64_three_rows";
  fc.category = "hand_made";
  fc.c = c;
  fc.expected = ref::evaluate(c).outputs;
  return fc;
}

TEST(ReportFields, WhatTheCaseIsAndEachRowsMeanOverSigma) {
  const auto fc = three_rows();
  CaseResult r;
  describe_case(r, fc);
  EXPECT_EQ(r.op, "layernorm");
  EXPECT_EQ(r.direction, "forward");
  EXPECT_EQ(r.block, "");
  EXPECT_EQ(r.dtype, "float64");
  EXPECT_EQ(r.category, "hand_made");
  ASSERT_EQ(r.row_mean_over_sigma.size(), 3u);
  EXPECT_NEAR(r.row_mean_over_sigma[0], 2.5 / std::sqrt(1.25), 1e-12);
  EXPECT_TRUE(std::isinf(r.row_mean_over_sigma[1]));
  EXPECT_NEAR(r.row_mean_over_sigma[2], 101.5 / std::sqrt(1.25), 1e-9);
}

TEST(ReportFields, HistogramsAndRowsLocateAPlantedError) {
  const auto fc = three_rows();
  const auto allow = derive_allowances(fc.c);
  Outputs got = certified(fc);
  // Row 2, column 1: an error of 3 allowances (log2 3 in [1, 2): the bin of 2^1).
  const std::size_t k = 2 * 4 + 1;
  got["y"].data[k] = fc.expected.at("y").f64[k] + 3 * allow.at("y").abs[k];
  const auto r = check_case(fc, got, allow);
  const auto& y = output(r, "y");
  ASSERT_EQ(y.verdict, Verdict::failed);
  ASSERT_EQ(y.elements, 12);
  // The correctly rounded float64 values are the exact values here: no error but the planted one.
  EXPECT_EQ(y.hist_ratio.zero, 11);
  EXPECT_EQ(y.hist_ratio.inf, 0);
  for (int b = 0; b < kHistBins; ++b)
    EXPECT_EQ(y.hist_ratio.bins[static_cast<std::size_t>(b)], b == 1 - kHistLog2Min ? 1 : 0) << "bin " << b;
  std::int64_t ulp_total = y.hist_ulp.zero + y.hist_ulp.inf;
  for (auto n : y.hist_ulp.bins) ulp_total += n;
  EXPECT_EQ(ulp_total, 12);
  ASSERT_EQ(y.rows.size(), 3u);
  for (std::int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(y.rows[static_cast<std::size_t>(row)].row, row);
    // exact + 3a is rounded to binary64, which moves the ratio by up to half an ulp of y over a.
    if (row == 2) EXPECT_NEAR(y.rows[2].max_ratio, 3.0, 1e-3);
    else EXPECT_EQ(y.rows[static_cast<std::size_t>(row)].max_ratio, 0.0);
  }
  // The statistics have one element per row.
  EXPECT_EQ(output(r, "mean").rows.size(), 3u);
  EXPECT_EQ(output(r, "rstd").rows.size(), 3u);
}

TEST(ReportFields, ParameterGradientsHaveNoRows) {
  auto fc = three_rows();
  fc.c.direction = ref::Direction::backward;
  fc.c.affine = ref::Affine::weight_bias;
  fc.c.inputs["weight"] = ref::Tensor{DType::float64, {4}, {1, 2, 3, 4}};
  fc.c.inputs["bias"] = ref::Tensor{DType::float64, {4}, {0, 0, 0, 0}};
  fc.c.inputs["dy"] = ref::Tensor{DType::float64, {3, 4}, {1, -1, 1, -1, 1, 1, 1, 1, 0.5, 0.25, -1, 2}};
  fc.expected = ref::evaluate(fc.c).outputs;
  Outputs got = certified(fc);
  const auto r = check_case(fc, got, derive_allowances(fc.c));
  EXPECT_EQ(output(r, "dx").rows.size(), 3u);
  EXPECT_TRUE(output(r, "dweight").rows.empty());
  EXPECT_TRUE(output(r, "dbias").rows.empty());
}

}  // namespace
}  // namespace normcheck::conf
