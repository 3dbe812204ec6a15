// Declared reduction classes and the exactness rule (TOLERANCE.md, section 9): independent
// float32 kernels of each class conform under their declaration on exact-friendly rows of 4096
// and 8192, a 1/n fault that `any` cannot see fails by far more than 10x under the declaration
// (with a reason naming the declaration), and exactness comes from the data alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "normcheck/judge/declared.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using test::fixture_of;
using test::ln_case;
using test::output;

// Rows of the fixtures' exact_sums family: mean + k 2^-5, k in [-64, 64] paired with -k.
std::vector<double> exact_rows(std::int64_t rows, std::int64_t n, double mean, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<double> x;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<double> row(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n / 2; ++j) {
      row[j] = k(rng);
      row[n / 2 + j] = -row[j];
    }
    std::shuffle(row.begin(), row.end(), rng);
    for (double v : row) x.push_back(mean + std::ldexp(v, -5));
  }
  return x;
}

enum class Kernel { sequential, pairwise16, kahan, f64, welford, unbiased, mean_over_n_minus_1 };  // kahan: Neumaier; welford: Chan-merged halves

float pairwise16(const float* v, std::size_t n) {
  if (n <= 16) {
    float s = 0;
    for (std::size_t i = 0; i < n; ++i) s += v[i];
    return s;
  }
  return pairwise16(v, n / 2) + pairwise16(v + n / 2, n - n / 2);
}
// Neumaier's compensated sum (Kahan's, robust to terms larger than the running sum).
float neumaier(const std::vector<float>& v) {
  float s = 0, c = 0;
  for (float x : v) {
    const float t = s + x;
    c += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
    s = t;
  }
  return s + c;
}

// LayerNorm forward without affine, float32 compute, float32 outputs.
Outputs layernorm(const ref::Case& c, Kernel k) {
  const auto& x = c.inputs.at("x");
  const std::int64_t rows = x.shape[0], n = x.shape[1];
  Outputs o;
  o["y"] = ref::Tensor{DType::float32, x.shape, std::vector<double>(x.data.size())};
  o["mean"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(rows)};
  o["rstd"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(rows)};
  const float nf = static_cast<float>(n);
  std::vector<float> h(n), d(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) h[j] = static_cast<float>(x.data[r * n + j]);
    float mean = 0, var = 0;
    const auto sq = [&] {
      for (std::int64_t j = 0; j < n; ++j) d[j] = (h[j] - mean) * (h[j] - mean);
    };
    switch (k) {
      case Kernel::sequential:
      case Kernel::unbiased:
      case Kernel::mean_over_n_minus_1: {
        for (float v : h) mean += v;
        mean /= k == Kernel::mean_over_n_minus_1 ? nf - 1 : nf;
        for (float v : h) var += (v - mean) * (v - mean);
        var /= k == Kernel::unbiased ? nf - 1 : nf;
        break;
      }
      case Kernel::pairwise16:
        mean = pairwise16(h.data(), h.size()) / nf;
        sq();
        var = pairwise16(d.data(), d.size()) / nf;
        break;
      case Kernel::kahan:
        mean = neumaier(h) / nf;
        sq();
        var = neumaier(d) / nf;
        break;
      case Kernel::f64: {
        double s = 0, s2 = 0;
        for (float v : h) s += v;
        mean = static_cast<float>(s / static_cast<double>(n));
        for (float v : h) s2 += (static_cast<double>(v) - mean) * (static_cast<double>(v) - mean);
        var = static_cast<float>(s2 / static_cast<double>(n));
        break;
      }
      case Kernel::welford: {
        // Two halves by Welford's updates, merged by Chan's formula.
        float ma = 0, mb = 0, sa = 0, sb = 0;
        const std::int64_t half = n / 2;
        for (std::int64_t j = 0; j < n; ++j) {
          float& m = j < half ? ma : mb;
          float& s2 = j < half ? sa : sb;
          const float cnt = static_cast<float>(j < half ? j + 1 : j - half + 1);
          const float before = m;
          m += (h[j] - before) / cnt;
          s2 += (h[j] - before) * (h[j] - m);
        }
        const float delta = mb - ma, fa = static_cast<float>(half), fb = static_cast<float>(n - half);
        mean = ma + delta * (fb / nf);
        var = (sa + sb + delta * delta * (fa * fb / nf)) / nf;
        break;
      }
    }
    const float rstd = 1.0f / std::sqrt(var + static_cast<float>(c.epsilon));
    o["mean"].data[r] = mean;
    o["rstd"].data[r] = rstd;
    for (std::int64_t j = 0; j < n; ++j) o["y"].data[r * n + j] = (h[j] - mean) * rstd;
  }
  return o;
}

CaseResult judge(const fix::FixtureCase& fc, Kernel k, const Reduction& red) {
  return check_declared(fc, layernorm(fc.c, k), derive_allowances(fc.c, red), red);
}

TEST(Reduction, ParsesAndNames) {
  for (const char* s : {"any", "two_pass", "welford", "pairwise:128", "blocked:8", "accumulate_f64"})
    EXPECT_EQ(name_of(parse_reduction(s)), s);
  EXPECT_TRUE(parse_reduction("any").is_any());
  for (const char* bad : {"", "pairwise", "pairwise:", "pairwise:0", "pairwise:-3", "blocked:x", "two_pass:4",
                          "kahan", "any:1"})
    EXPECT_THROW(parse_reduction(bad), std::invalid_argument) << bad;
}

// Every kernel of its class conforms under its declaration on exact-friendly rows; the 1/n
// faults that `any` passes at n = 4096 and 8192 fail under it by far more than 10x.
TEST(Reduction, ExactRowsSeparateOneOverNFaults) {
  const Reduction pairwise{ReductionKind::pairwise, 16}, two_pass{ReductionKind::two_pass, 0},
      f64{ReductionKind::accumulate_f64, 0}, welford{ReductionKind::welford, 0};
  for (std::int64_t n : {4096, 8192}) {
    const auto fc = fixture_of(ln_case(3, n, exact_rows(3, n, 2.0, 7 + n)));
    EXPECT_EQ(judge(fc, Kernel::pairwise16, pairwise).verdict, Verdict::passed) << n;
    EXPECT_EQ(judge(fc, Kernel::sequential, two_pass).verdict, Verdict::passed) << n;
    EXPECT_EQ(judge(fc, Kernel::kahan, two_pass).verdict, Verdict::passed) << n;
    EXPECT_EQ(judge(fc, Kernel::f64, f64).verdict, Verdict::passed) << n;
    EXPECT_EQ(judge(fc, Kernel::welford, welford).verdict, Verdict::passed) << n;
    for (Kernel k : {Kernel::pairwise16, Kernel::sequential, Kernel::kahan, Kernel::f64, Kernel::welford})
      EXPECT_EQ(judge(fc, k, Reduction{}).verdict, Verdict::passed) << n;
    // The unbiased variance: rstd off by 1/(2n) relative.
    const auto any_unbiased = judge(fc, Kernel::unbiased, Reduction{});
    EXPECT_EQ(any_unbiased.verdict, Verdict::passed) << "any cannot tell it at n = " << n;
    const auto r = judge(fc, Kernel::unbiased, two_pass);
    ASSERT_EQ(r.verdict, Verdict::failed) << n;
    EXPECT_GT(output(r, "rstd").max_ratio, 10) << n;
    EXPECT_NE(output(r, "rstd").reason.find("the declared reduction class two_pass is what failed"), std::string::npos)
        << output(r, "rstd").reason;
    // The mean over n - 1: the mean of rows of mean 2 off by 2/n.
    const auto m = judge(fc, Kernel::mean_over_n_minus_1, two_pass);
    ASSERT_EQ(m.verdict, Verdict::failed) << n;
    EXPECT_GT(output(m, "mean").max_ratio, 10) << n;
  }
}

// The rule reads the data, not the case's name: one element off the common grid (a multiple of
// 2^-30, not of 2^-5, whose sum with the rest is no longer exact in float32) or a row length that
// is not a power of two and the bound is the ordinary one of the class again.
TEST(Reduction, ExactnessComesFromTheData) {
  const Reduction two_pass{ReductionKind::two_pass, 0};
  const std::int64_t n = 4096;
  auto x = exact_rows(1, n, 2.0, 11);
  const auto exact = derive_allowances(ln_case(1, n, x), two_pass).at("rstd").abs[0];
  x[17] += std::ldexp(1.0, -20);
  const auto off_grid = derive_allowances(ln_case(1, n, x), two_pass).at("rstd").abs[0];
  EXPECT_GT(off_grid, 100 * exact);
  const auto odd = exact_rows(1, 4094, 2.0, 11);
  const auto plain = derive_allowances(ln_case(1, 4094, odd), two_pass).at("rstd").abs[0];
  EXPECT_GT(plain, 100 * exact);
  // The same data under `any` (Welford's running mean divides at every step: nothing is exact).
  x[17] -= std::ldexp(1.0, -20);
  EXPECT_GT(derive_allowances(ln_case(1, n, x)).at("rstd").abs[0], 100 * exact);
}

// A pairwise or blocked bound is below the any-order bound on arbitrary data, and a kernel of the
// class stays within it on hard rows (normal, large mean, sorted).
TEST(Reduction, PairwiseBoundHoldsOnArbitraryRows) {
  const Reduction pairwise{ReductionKind::pairwise, 16}, f64{ReductionKind::accumulate_f64, 0};
  std::mt19937_64 rng(3);
  for (double mean : {0.0, 300.0}) {
    auto x = test::normal(rng, 4 * 4096, mean, 1.0, DType::float32);
    std::sort(x.begin() + 4096, x.begin() + 8192);
    const auto fc = fixture_of(ln_case(4, 4096, x));
    const auto a_any = derive_allowances(fc.c).at("rstd").abs[0];
    const auto a_pw = derive_allowances(fc.c, pairwise).at("rstd").abs[0];
    EXPECT_LT(a_pw, a_any / 5);
    EXPECT_EQ(judge(fc, Kernel::pairwise16, pairwise).verdict, Verdict::passed) << mean;
    EXPECT_EQ(judge(fc, Kernel::f64, f64).verdict, Verdict::passed) << mean;
  }
}

// Sensitivity (TOLERANCE.md 6.1) is a promise: every output scaled by 1 + d, |d| just above its
// sensitivity, correctly rounded, fails, on exact rows and on arbitrary ones, under `any` and a
// declared class. And the rstd probe for a variance over n - 1 says what the checker then does to
// a kernel with that fault: caught under two_pass on exact rows of 4096 (by more than 10x), not
// under `any` there.
TEST(Reduction, SensitivityIsAPromiseAndTheProbeIsTheVerdict) {
  const Reduction two_pass{ReductionKind::two_pass, 0};
  std::mt19937_64 rng(5);
  const auto exact_fc = fixture_of(ln_case(3, 4096, exact_rows(3, 4096, 2.0, 21)));
  const auto normal_fc = fixture_of(ln_case(4, 1024, test::normal(rng, 4 * 1024, 3.0, 1.0, DType::float32)));
  for (const auto* fc : {&exact_fc, &normal_fc}) {
    for (const Reduction& red : {Reduction{}, two_pass}) {
      const auto allow = derive_allowances(fc->c, red);
      Outputs exact;
      for (const auto& [name, e] : fc->expected) exact[name] = ref::Tensor{e.value.dtype, e.value.shape, e.value.data};
      const CaseResult base = check_declared(*fc, exact, allow, red);
      ASSERT_EQ(base.verdict, Verdict::passed);
      for (const auto& o : base.outputs) {
        ASSERT_TRUE(std::isfinite(o.sensitivity)) << o.name;
        ASSERT_LT(o.sensitivity, 1) << o.name;
        for (double sign : {1.0, -1.0}) {
          const double d = sign * o.sensitivity * (1 + 1e-6);
          Outputs faulty = exact;
          const auto& e = fc->expected.at(o.name);
          for (std::size_t i = 0; i < e.f64.size(); ++i)
            faulty[o.name].data[i] = ref::round_to(e.f64[i] * (1 + d), e.value.dtype);
          const auto r = check_declared(*fc, faulty, allow, red);
          EXPECT_EQ(output(r, o.name).verdict, Verdict::failed)
              << o.name << " d " << d << " under " << name_of(red) << ": " << output(r, o.name).reason;
        }
      }
    }
  }
  const auto probe = [&](const Reduction& red) {
    Outputs exact;
    for (const auto& [name, e] : exact_fc.expected) exact[name] = ref::Tensor{e.value.dtype, e.value.shape, e.value.data};
    return output(check_declared(exact_fc, exact, derive_allowances(exact_fc.c, red), red), "rstd")
        .probes.at("variance_over_n_minus_1");
  };
  EXPECT_GT(probe(two_pass), 10);
  EXPECT_EQ(judge(exact_fc, Kernel::unbiased, two_pass).verdict, Verdict::failed);
  EXPECT_LT(probe(Reduction{}), 1);
  EXPECT_EQ(judge(exact_fc, Kernel::unbiased, Reduction{}).verdict, Verdict::passed);
}

}  // namespace
}  // namespace normcheck::conf
