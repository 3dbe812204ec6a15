// The harness tests itself: the checker on planted errors of known size, NaN mismatches,
// missing and malformed outputs; the tolerance model against its derivation (TOLERANCE.md) and
// against independent float32 kernels written here: correct ones must pass on the hard rows,
// a one-pass variance must fail where TOLERANCE.md says it fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using test::certified;
using test::fixture_of;
using test::ln_case;
using test::output;
using test::normal;

TEST(Checker, PerfectOutputsPass) {
  std::mt19937_64 rng(1);
  const auto c = ln_case(4, 64, normal(rng, 256, 0, 1, DType::float32));
  const auto fc = fixture_of(c);
  const auto r = check_case(fc, certified(fc), derive_allowances(c));
  EXPECT_EQ(r.verdict, Verdict::passed);
  for (const auto& o : r.outputs) EXPECT_LE(o.max_ulp, 0.5) << o.name;
}

// An error planted just inside and just outside the allowance of one element.
TEST(Checker, PlantedErrorsOfKnownSize) {
  std::mt19937_64 rng(2);
  const auto c = ln_case(4, 64, normal(rng, 256, 0, 1, DType::float64), DType::float64);
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  const std::size_t k = 3 * 64 + 17;  // row 3, column 17
  const double exact = fc.expected.at("y").f64[k], a = allow.at("y").abs[k];
  ASSERT_GT(a, 0);
  for (const double f : {0.9, 1.1}) {
    Outputs got = certified(fc);
    got["y"].data[k] = exact + f * a;  // float64 output: representable to far below a
    const auto r = check_case(fc, got, allow);
    const auto& y = output(r, "y");
    if (f < 1) {
      EXPECT_EQ(y.verdict, Verdict::passed);
      EXPECT_NEAR(y.max_ratio, 0.9, 1e-6);
    } else {
      EXPECT_EQ(r.verdict, Verdict::failed);
      EXPECT_EQ(y.failed, 1);
      EXPECT_EQ(y.worst_index, static_cast<std::int64_t>(k));
      EXPECT_EQ(y.worst_coords, (std::vector<std::int64_t>{3, 17}));
      EXPECT_NEAR(y.max_ratio, 1.1, 1e-6);
      EXPECT_NEAR(y.max_abs, 1.1 * a, 1e-9 * a);
    }
  }
}

TEST(Checker, NanMismatchesFailBothWays) {
  auto c = ln_case(2, 4, {1, 2, 3, 4, NAN, 1, 2, 3});
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  ASSERT_TRUE(std::isnan(fc.expected.at("y").value.data[5]));
  EXPECT_EQ(check_case(fc, certified(fc), allow).verdict, Verdict::passed);  // NaN == NaN
  Outputs got = certified(fc);
  got["y"].data[5] = 0;  // a number where the row must be NaN
  EXPECT_EQ(output(check_case(fc, got, allow), "y").failed, 1);
  got = certified(fc);
  got["y"].data[1] = NAN;  // NaN leaking into a finite row
  const auto r = check_case(fc, got, allow);
  EXPECT_EQ(output(r, "y").failed, 1);
  EXPECT_EQ(output(r, "y").worst_index, 1);
}

TEST(Checker, MissingWrongShapeWrongDtype) {
  std::mt19937_64 rng(3);
  const auto c = ln_case(2, 8, normal(rng, 16, 0, 1, DType::float32));
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  Outputs got = certified(fc);
  got.erase("rstd");
  auto r = check_case(fc, got, allow);
  EXPECT_EQ(r.verdict, Verdict::missing);
  EXPECT_EQ(output(r, "rstd").verdict, Verdict::missing);
  got = certified(fc);
  got["y"].shape = {16};
  r = check_case(fc, got, allow);
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_NE(output(r, "y").reason.find("shape [16]"), std::string::npos);
  got = certified(fc);
  got["mean"].dtype = DType::float16;
  EXPECT_NE(output(check_case(fc, got, allow), "mean").reason.find("dtype float16"), std::string::npos);
}

// An outputs file may store a bfloat16 output as float64 (reject_unrepresentable): exact
// bfloat16 values stored wider pass; a value no bfloat16 holds (the final rounding skipped: here
// halfway to the exact value, inside the allowance) FAILS as "not a bfloat16 value" naming
// the element, unless the output is declared wider on purpose.
TEST(Checker, ValuesTheDtypeCannotHoldFail) {
  std::mt19937_64 rng(4);
  const auto c = ln_case(2, 8, normal(rng, 16, 0, 1, DType::bfloat16), DType::bfloat16);
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  Outputs got = certified(fc);  // every value a bfloat16 value, held in doubles
  auto r = check_case(fc, got, allow);
  reject_unrepresentable(r, got, {});
  EXPECT_EQ(r.verdict, Verdict::passed);
  const std::size_t k = 9;  // row 1, column 1
  const double exact = fc.expected.at("y").f64[k];
  ASSERT_NE(got["y"].data[k], exact);
  got["y"].data[k] = (got["y"].data[k] + exact) / 2;  // closer to the exact value than a bfloat16
  ASSERT_FALSE(ref::representable(got["y"].data[k], DType::bfloat16));
  r = check_case(fc, got, allow);
  EXPECT_EQ(r.verdict, Verdict::passed) << "the value itself is within its allowance";
  reject_unrepresentable(r, got, {});
  EXPECT_EQ(r.verdict, Verdict::failed);
  const auto& y = output(r, "y");
  EXPECT_TRUE(y.malformed);
  EXPECT_NE(y.reason.find("not a bfloat16 value: element [1, 1] (flat 9) holds " + ref::hex_text(got["y"].data[k])),
            std::string::npos)
      << y.reason;
  EXPECT_FALSE(diagnosable(r));
  r = check_case(fc, got, allow);
  reject_unrepresentable(r, got, {"y"});  // declared wider on purpose
  EXPECT_EQ(r.verdict, Verdict::passed);
}

// Declared flush-to-zero outputs (CheckOptions, TOLERANCE.md "Declared flush-to-zero"): a bfloat16
// LayerNorm with eps = 1 over a row of subnormal values (y ~ x - mean, subnormal in bfloat16) and a
// row of normal values. Zeros in place of the subnormal outputs FAIL unless declared; declared,
// they pass and are counted as flushed; a zero where a normal value is expected fails even so.
TEST(Checker, DeclaredFlushToZeroAcceptsOnlySubnormalZeros) {
  std::mt19937_64 rng(4);
  std::vector<double> x;
  for (int k : {3, -5, 2, 7, -1, 0, 4, -6}) x.push_back(std::ldexp(k, -133));  // bfloat16 subnormals
  for (double v : normal(rng, 8, 0, 1, DType::bfloat16)) x.push_back(v);
  auto c = ln_case(2, 8, x, DType::bfloat16);
  c.epsilon = 1;
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  const double min_normal = std::ldexp(1.0, -126);
  Outputs got = certified(fc);
  int subnormal = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    double& v = got["y"].data[i];
    ASSERT_LT(std::fabs(v), min_normal) << "row 0's y must be subnormal in bfloat16";
    subnormal += v != 0;
    v = std::copysign(0.0, v);
  }
  ASSERT_GE(subnormal, 6);
  const auto strict = check_case(fc, got, allow);
  EXPECT_EQ(strict.verdict, Verdict::failed);
  EXPECT_EQ(output(strict, "y").flushed, 0);
  EXPECT_GE(output(strict, "y").failed, 1);

  const CheckOptions ftz{.flush_subnormal_outputs = true};
  const auto declared = check_case(fc, got, allow, ftz);
  EXPECT_EQ(declared.verdict, Verdict::passed);
  EXPECT_EQ(output(declared, "y").failed, 0);
  EXPECT_EQ(output(declared, "y").flushed, output(strict, "y").failed);
  EXPECT_LE(output(declared, "y").max_ratio, 1.0);

  // A flushed zero where the value is normal: still a failure.
  Outputs wrong = got;
  ASSERT_GE(std::fabs(wrong["y"].data[9]), min_normal);
  wrong["y"].data[9] = 0;
  const auto r = check_case(fc, wrong, allow, ftz);
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_EQ(output(r, "y").failed, 1);
  EXPECT_EQ(output(r, "y").worst_index, 9);

  // The slack itself, and the relations' widening of zeros only.
  EXPECT_EQ(flush_slack(-0.0, DType::float16), std::ldexp(1.0, -14));
  EXPECT_EQ(flush_slack(0.0, DType::float32), min_normal);
  EXPECT_EQ(flush_slack(0x1p-140, DType::float32), 0.0);
  auto widened = allow;
  widen_for_flushed_zeros(widened, got);
  EXPECT_EQ(widened.at("y").abs[0], allow.at("y").abs[0] + min_normal);
  EXPECT_EQ(widened.at("y").abs[9], allow.at("y").abs[9]);
}
// The table against its derivation: the mean of a row of n = 4 values 1, 2, 3, 4 in float32
// compute: e_mean = gam(5) A + 4 eta (TOLERANCE.md 3.2), plus half an ulp of the fp32 output.
TEST(Tolerance, MeanBoundIsTheDerivedFormula) {
  const auto c = ln_case(1, 4, {1, 2, 3, 4});
  const auto allow = derive_allowances(c);
  const double u = std::ldexp(1.0, -24), eta = std::ldexp(1.0, -149);  // a full subnormal spacing
  const double e_mean = 5 * u / (1 - 5 * u) * 2.5 + 4 * eta;
  const double expected = e_mean + 0.5 * std::ldexp(1.0, 1 - 23);  // ulp of 2.5 in fp32 is 2^-22
  EXPECT_DOUBLE_EQ(allow.at("mean").abs[0], expected);
  EXPECT_EQ(ulp_of(2.5, DType::float32), std::ldexp(1.0, -22));
  EXPECT_EQ(ulp_of(0, DType::float16), std::ldexp(1.0, -24));
  EXPECT_EQ(ulp_of(65504, DType::float16), 32);
}

// Rows too ill-conditioned for fp32 (mean 1e4, sigma 1e-3 over 4096 values: a correct kernel's
// x-hat may be off by more than half a standard deviation) make y MISTRUSTED with a reason;
// mean stays checked.
TEST(Tolerance, IllConditionedRowsAreMistrusted) {
  std::mt19937_64 rng(4);
  const auto c = ln_case(2, 4096, normal(rng, 8192, 1e4, 1e-3, DType::float32));
  const auto fc = fixture_of(c);
  const auto r = check_case(fc, certified(fc), derive_allowances(c));
  EXPECT_EQ(output(r, "y").verdict, Verdict::mistrusted);
  EXPECT_NE(output(r, "y").reason.find("too ill-conditioned for float32"), std::string::npos);
  EXPECT_EQ(output(r, "mean").verdict, Verdict::passed);
  EXPECT_EQ(r.verdict, Verdict::mistrusted);
}

// Independent float32 kernels (forward LayerNorm, no affine), to test the model both ways.
enum class Algo { sequential_two_pass, welford, pairwise, one_pass };

float pairwise_sum(const float* v, std::size_t n) {
  if (n <= 8) {
    float s = 0;
    for (std::size_t i = 0; i < n; ++i) s += v[i];
    return s;
  }
  return pairwise_sum(v, n / 2) + pairwise_sum(v + n / 2, n - n / 2);
}

Outputs fp32_layernorm(const ref::Case& c, Algo algo) {
  const auto& x = c.inputs.at("x");
  const std::int64_t rows = x.shape[0], n = x.shape[1];
  Outputs o;
  o["y"] = ref::Tensor{DType::float32, x.shape, std::vector<double>(x.data.size())};
  o["mean"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(rows)};
  o["rstd"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(rows)};
  const float eps = static_cast<float>(c.epsilon);
  std::vector<float> h(n), d(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) h[j] = static_cast<float>(x.data[r * n + j]);
    float mean = 0, var = 0;
    const float nf = static_cast<float>(n);
    switch (algo) {
      case Algo::sequential_two_pass: {
        for (float v : h) mean += v;
        mean /= nf;
        for (float v : h) var += (v - mean) * (v - mean);
        var /= nf;
        break;
      }
      case Algo::pairwise: {
        mean = pairwise_sum(h.data(), h.size()) / nf;
        for (std::int64_t j = 0; j < n; ++j) d[j] = (h[j] - mean) * (h[j] - mean);
        var = pairwise_sum(d.data(), d.size()) / nf;
        break;
      }
      case Algo::welford: {
        float m2 = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          const float delta = h[j] - mean;
          mean += delta / static_cast<float>(j + 1);
          m2 += delta * (h[j] - mean);
        }
        var = m2 / nf;
        break;
      }
      case Algo::one_pass: {
        float s = 0, s2 = 0;
        for (float v : h) {
          s += v;
          s2 += v * v;
        }
        mean = s / nf;
        var = s2 / nf - mean * mean;
        break;
      }
    }
    const float rstd = 1.0f / std::sqrt(var + eps);
    o["mean"].data[r] = mean;
    o["rstd"].data[r] = rstd;
    for (std::int64_t j = 0; j < n; ++j) o["y"].data[r * n + j] = (h[j] - mean) * rstd;
  }
  return o;
}

// Rows that stress the bound: constant rows (sequential sums of 0.1f drift), sorted rows
// (Welford's running mean far from the mean), large means at the edge of what fp32 can resolve,
// and ordinary rows; n up to 4096.
std::vector<ref::Case> hard_cases() {
  std::mt19937_64 rng(5);
  std::vector<ref::Case> cases;
  for (std::int64_t n : {17, 256, 4096}) {
    cases.push_back(ln_case(1, n, std::vector<double>(n, ref::round_to(0.1, DType::float32))));
    auto sorted = normal(rng, n, 3, 1, DType::float32);
    std::sort(sorted.begin(), sorted.end());
    cases.push_back(ln_case(1, n, sorted));
    for (double mean : {0.0, 10.0, 100.0, 1000.0}) cases.push_back(ln_case(2, n, normal(rng, 2 * n, mean, 1, DType::float32)));
  }
  for (auto& c : cases) c.epsilon = 1e-5;
  return cases;
}

TEST(Tolerance, CorrectFloat32KernelsNeverFail) {
  for (const auto& c : hard_cases()) {
    const auto fc = fixture_of(c);
    const auto allow = derive_allowances(c);
    for (Algo a : {Algo::sequential_two_pass, Algo::welford, Algo::pairwise}) {
      const auto r = check_case(fc, fp32_layernorm(c, a), allow);
      EXPECT_FALSE(is_failure(r.verdict)) << "algorithm " << static_cast<int>(a) << " n "
                                          << c.inputs.at("x").shape[1] << ": " << r.outputs[0].reason;
      for (const auto& o : r.outputs) EXPECT_LE(o.max_ratio, 1.0) << o.name;
    }
  }
}

// TOLERANCE.md, "What it catches": at mean 1000 and sigma 1 over 256 values the one-pass
// variance loses about u * kappa^2 = 0.06 of the variance, above the allowance of a correct kernel.
TEST(Tolerance, OnePassVarianceFailsOnLargeMeanRows) {
  std::mt19937_64 rng(6);
  const auto c = ln_case(8, 256, normal(rng, 8 * 256, 1000, 1, DType::float32));
  const auto fc = fixture_of(c);
  const auto r = check_case(fc, fp32_layernorm(c, Algo::one_pass), derive_allowances(c));
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_EQ(output(r, "rstd").verdict, Verdict::failed);
}


// Contract rounding points (TOLERANCE.md section 2): under `llama` a correct kernel rounds x-hat
// to bfloat16 before the weight multiply and passes; one that skips the rounding (transformers
// #33133 vs TransformerEngine #1132) errs by up to half a bfloat16 ulp of x-hat times |w| on
// most elements, far from their rounding boundaries, and fails.
TEST(Tolerance, SkippedContractRoundingFails) {
  std::mt19937_64 rng(7);
  const std::int64_t rows = 4, n = 256;
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.contract = "llama";
  c.affine = ref::Affine::weight;
  c.dtype_x = c.dtype_residual = DType::bfloat16;
  c.dtype_param = c.dtype_out = c.dtype_compute = DType::float32;
  c.epsilon = 1e-6;
  c.inputs["x"] = ref::Tensor{DType::bfloat16, {rows, n}, normal(rng, rows * n, 0, 1, DType::bfloat16)};
  c.inputs["weight"] = ref::Tensor{DType::float32, {n}, normal(rng, n, 1, 0.3, DType::float32)};
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  for (const bool round_xhat : {true, false}) {
    Outputs o;
    o["y"] = ref::Tensor{DType::float32, {rows, n}, std::vector<double>(rows * n)};
    o["rstd"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(rows)};
    const auto& x = c.inputs.at("x").data;
    const auto& w = c.inputs.at("weight").data;
    for (std::int64_t r = 0; r < rows; ++r) {
      float ss = 0;
      for (std::int64_t j = 0; j < n; ++j) ss += static_cast<float>(x[r * n + j]) * static_cast<float>(x[r * n + j]);
      const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(c.epsilon));
      o["rstd"].data[r] = rstd;
      for (std::int64_t j = 0; j < n; ++j) {
        double xh = static_cast<float>(x[r * n + j]) * rstd;
        if (round_xhat) xh = ref::round_to(xh, DType::bfloat16);
        o["y"].data[r * n + j] = static_cast<float>(static_cast<float>(w[j]) * static_cast<float>(xh));
      }
    }
    const auto res = check_case(fc, o, allow);
    if (round_xhat) {
      EXPECT_EQ(res.verdict, Verdict::passed) << output(res, "y").reason;
    } else {
      EXPECT_EQ(output(res, "y").verdict, Verdict::failed);
      EXPECT_GT(output(res, "y").failed, rows * n / 2) << "most elements are far from a boundary";
    }
  }
}


// An infinity passes only where the exact value is within its allowance of the overflow
// threshold (65520 in float16), never in place of an ordinary value.
TEST(Checker, InfinityOnlyWhereTheValueOverflows) {
  std::mt19937_64 rng(8);
  auto c = ln_case(2, 16, normal(rng, 32, 0, 1, DType::float16), DType::float16);
  c.affine = ref::Affine::weight;
  std::vector<double> w(16, 1.0);
  w[3] = 65504;  // the largest float16: y = xhat * w overflows where |xhat| > ~1.0002
  c.inputs["weight"] = ref::Tensor{DType::float16, {16}, w};
  const auto fc = fixture_of(c);
  const auto allow = derive_allowances(c);
  Outputs got = certified(fc);
  got["y"].data[0] = INFINITY;  // an ordinary element (|y| <= ~4): infinity is wrong
  EXPECT_EQ(output(check_case(fc, got, allow), "y").failed, 1);
  // Where the reference overflows, an infinity of the right sign is right.
  got = certified(fc);
  const auto& y = fc.expected.at("y");
  int overflowing = 0;
  for (std::size_t i = 0; i < y.value.data.size(); ++i)
    if (std::isinf(y.value.data[i])) {
      got["y"].data[i] = y.value.data[i];
      ++overflowing;
    }
  ASSERT_GT(overflowing, 0);
  EXPECT_EQ(output(check_case(fc, got, allow), "y").verdict, Verdict::passed);
}

// A float16 two-pass LayerNorm that rounds every operation to float16 (no affine): a correct
// kernel in float16 compute.
std::vector<double> fp16_two_pass(const std::vector<double>& x, double eps) {
  auto r = [](double v) { return ref::round_to(v, DType::float16); };
  double s = 0;
  for (double v : x) s = r(s + v);
  const double mean = r(s / static_cast<double>(x.size()));
  double q = 0;
  for (double v : x) q = r(q + r(r(v - mean) * r(v - mean)));
  const double rstd = r(1 / r(std::sqrt(r(r(q / static_cast<double>(x.size())) + r(eps)))));
  std::vector<double> y;
  for (double v : x) y.push_back(r(r(v - mean) * rstd));
  return y;
}

// TOLERANCE.md section 5: a row whose sum of squared deviations may reach 65504 overflows the
// accumulator of a correct float16 kernel (y = 0 instead of +-1): MISTRUSTED with the reason,
// never FAILED; a row just below the limit stays trusted and passes.
TEST(Tolerance, Float16AccumulatorOverflowIsMistrusted) {
  for (const double a : {100.0, 80.0}) {  // 8 a^2 = 80000 (beyond 65504) and 51200 (below)
    auto c = ln_case(1, 8, {a, -a, a, -a, a, -a, a, -a}, DType::float16);
    c.dtype_compute = DType::float16;
    const auto fc = fixture_of(c);
    const auto allow = derive_allowances(c);
    Outputs got = certified(fc);
    got["y"].data = fp16_two_pass(c.inputs.at("x").data, c.epsilon);
    const auto r = check_case(fc, got, allow);
    if (a == 100) {
      EXPECT_EQ(got["y"].data[0], 0.0);  // the kernel's sum overflowed: rstd = 1/inf
      EXPECT_EQ(output(r, "y").verdict, Verdict::mistrusted);
      EXPECT_NE(output(r, "y").reason.find("may overflow the float16 accumulator of a correct kernel"),
                std::string::npos)
          << output(r, "y").reason;
      EXPECT_EQ(output(r, "rstd").verdict, Verdict::mistrusted);
      EXPECT_EQ(output(r, "mean").verdict, Verdict::passed);  // sum |h| = 800 does not overflow
    } else {
      EXPECT_EQ(std::fabs(got["y"].data[0]), 1.0);
      EXPECT_EQ(output(r, "y").verdict, Verdict::passed) << output(r, "y").reason;
    }
  }
}

}  // namespace
}  // namespace normcheck::conf
