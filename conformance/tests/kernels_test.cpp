// The judge against the bundled correct kernels, where the fault-free behaviour to be judged is
// a real kernel's rather than values written in the judge's own tests: a float16 accumulation
// that overflows in a correct kernel is MISTRUSTED, not FAILED. The judge's own tests (no
// candidate, no transport) are in conformance/judge/tests/.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "../judge/tests/test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using namespace test;  // fixture_of, ln_case, output

// The same rule in the backward pass: a float16 column sum of dbias whose |terms| add up beyond
// 65504 (dy = +-40000 in column 0 over four rows; the exact sum is 0) overflows in the correct
// two-pass kernel, which sums the rows in order: 40000 + 40000 = inf. That column is MISTRUSTED
// with the reason; below the limit (+-10000) every output is compared and passes.
TEST(Tolerance, Float16BackwardColumnSumOverflowIsMistrusted) {
  const auto kernel = make_candidate("builtin:cpu_two_pass");
  for (const double d : {40000.0, 10000.0}) {
    std::vector<double> x, dy;
    for (int r = 0; r < 4; ++r) {
      for (double v : {0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.0}) x.push_back(v);  // x-hat of column 0 is 0
      for (int j = 0; j < 8; ++j) dy.push_back(j == 0 ? (r < 2 ? d : -d) : 0.25 * (j - 4));
    }
    auto c = ln_case(4, 8, x, DType::float16);
    c.dtype_compute = DType::float16;
    c.affine = ref::Affine::weight_bias;
    c.direction = ref::Direction::backward;
    c.inputs["weight"] = ref::Tensor{DType::float16, {8}, std::vector<double>(8, 1.0)};
    c.inputs["bias"] = ref::Tensor{DType::float16, {8}, std::vector<double>(8, 0.0)};
    c.inputs["dy"] = ref::Tensor{DType::float16, {4, 8}, dy};
    const auto fc = fixture_of(c);
    const auto got = kernel->run(c);
    const auto r = check_case(fc, got, derive_allowances(c));
    if (d == 40000) {
      EXPECT_TRUE(std::isinf(got.at("dbias").data[0])) << "the kernel's float16 sum must overflow here";
      EXPECT_EQ(fc.expected.at("dbias").value.data[0], 0.0);
      EXPECT_EQ(output(r, "dbias").verdict, Verdict::mistrusted);
      EXPECT_EQ(output(r, "dbias").mistrusted, 1);
      EXPECT_NE(output(r, "dbias").reason.find("may overflow the float16 accumulator"), std::string::npos)
          << output(r, "dbias").reason;
      EXPECT_EQ(output(r, "dweight").verdict, Verdict::passed);
      EXPECT_EQ(output(r, "dx").verdict, Verdict::passed);
    } else {
      EXPECT_EQ(r.verdict, Verdict::passed);
    }
  }
  // A row sum: dy = 20000 across a row of x-hat = +-1, sum |dy| = 160000. The kernel's sum dy
  // overflows (its dx comes out NaN); the exact dx is 0. That row's dx is MISTRUSTED.
  auto c = ln_case(1, 8, {1, -1, 1, -1, 1, -1, 1, -1}, DType::float16);
  c.dtype_compute = DType::float16;
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = ref::Tensor{DType::float16, {1, 8}, std::vector<double>(8, 20000.0)};
  const auto fc = fixture_of(c);
  const auto got = kernel->run(c);
  const auto r = check_case(fc, got, derive_allowances(c));
  EXPECT_FALSE(std::isfinite(got.at("dx").data[0])) << "the kernel's float16 row sum must overflow here";
  EXPECT_EQ(fc.expected.at("dx").value.data[0], 0.0);
  EXPECT_EQ(output(r, "dx").verdict, Verdict::mistrusted) << output(r, "dx").reason;
}

}  // namespace
}  // namespace normcheck::conf
