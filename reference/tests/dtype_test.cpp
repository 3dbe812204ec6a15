// Rounding into the formats, checked three independent ways: the hardware's conversions
// (double->float, double->_Float16), the GMP-rational rounding, and the nearbyint rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "exact.hpp"
#include "row_kernel.hpp"
#include "normcheck/reference/case_json.hpp"
#include "normcheck/reference/dtype.hpp"

namespace normcheck::ref {
namespace {

double random_double(std::mt19937_64& rng, int min_exp, int max_exp) {
  std::uniform_int_distribution<int> e(min_exp, max_exp);
  std::uniform_int_distribution<std::uint64_t> m(0, (std::uint64_t{1} << 52) - 1);
  std::bernoulli_distribution sign(0.5);
  double v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m(rng)), -52), e(rng));
  // Every few values, land exactly on a midpoint or a representable value of a narrow format.
  return sign(rng) ? -v : v;
}

TEST(Rounding, Float32MatchesHardwareConversion) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const double v = random_double(rng, -160, 130);
    const double want = static_cast<double>(static_cast<float>(v));
    ASSERT_EQ(round_to(v, DType::float32), want) << std::hexfloat << v;
  }
}

TEST(Rounding, Float16MatchesHardwareConversion) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 200000; ++i) {
    const double v = random_double(rng, -28, 17);
    const double want = static_cast<double>(static_cast<_Float16>(v));
    ASSERT_EQ(round_to(v, DType::float16), want) << std::hexfloat << v;
  }
}

// Toward zero: the largest float16 value not above |v| in magnitude (max finite beyond it), from
// a table of every float16 built from its bits, not from round_to.
TEST(Rounding, TowardZeroIsTheLargestValueNotAbove) {
  std::vector<double> values;
  for (std::uint32_t bits = 0; bits < 0x7c00; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    _Float16 h;
    std::memcpy(&h, &b, sizeof h);
    values.push_back(static_cast<double>(h));
  }
  std::mt19937_64 rng(4);
  for (int i = 0; i < 200000; ++i) {
    const double v = random_double(rng, -28, 17);
    const auto it = std::upper_bound(values.begin(), values.end(), std::fabs(v));
    const double want = std::copysign(*(it - 1), v);
    ASSERT_EQ(round_toward_zero(v, DType::float16), want) << std::hexfloat << v;
  }
  EXPECT_EQ(round_toward_zero(1e6, DType::float16), 65504.0);
  EXPECT_EQ(round_toward_zero(-0.0, DType::float16), 0.0);
  EXPECT_TRUE(std::signbit(round_toward_zero(-0.0, DType::float16)));
}

TEST(Rounding, MidpointsGoToEven) {
  // 1 + 2^-11 is halfway between the float16 neighbours 1 and 1 + 2^-10: even is 1.
  EXPECT_EQ(round_to(1.0 + 0x1p-11, DType::float16), 1.0);
  EXPECT_EQ(round_to(1.0 + 3 * 0x1p-11, DType::float16), 1.0 + 2 * 0x1p-10);
  // bfloat16 keeps 8 bits: 1 + 2^-8 is a midpoint.
  EXPECT_EQ(round_to(1.0 + 0x1p-8, DType::bfloat16), 1.0);
  EXPECT_EQ(round_to(1.0 + 3 * 0x1p-8, DType::bfloat16), 1.0 + 0x1p-6);
  // Overflow: float16 max is 65504; 65520 is the midpoint to 65536 (= infinity).
  EXPECT_EQ(round_to(65519.99, DType::float16), 65504.0);
  EXPECT_TRUE(std::isinf(round_to(65520.0, DType::float16)));
  // Subnormals: the smallest float16 subnormal is 2^-24; half of it rounds to even (zero).
  EXPECT_EQ(round_to(0x1p-25, DType::float16), 0.0);
  EXPECT_EQ(round_to(0x1.0001p-25, DType::float16), 0x1p-24);
  EXPECT_EQ(round_to(-0x1p-26, DType::float16), 0.0);
  EXPECT_TRUE(std::signbit(round_to(-0x1p-26, DType::float16)));
}

TEST(Rounding, RationalRoundingAgreesWithBinary64Rounding) {
  std::mt19937_64 rng(3);
  for (DType t : {DType::float32, DType::float16, DType::bfloat16, DType::float64}) {
    for (int i = 0; i < 20000; ++i) {
      const double v = random_double(rng, -160, 140);
      ASSERT_EQ(detail::round_rational(detail::exact(v), t), round_to(v, t))
          << name_of(t) << " " << std::hexfloat << v;
    }
  }
}

TEST(Rounding, RealRoundingAgreesWithRationalRounding) {
  // round_real rounds an MPFR value on its bits; round_rational is the exact definition.
  // Random values of 60 to 300 bits around every format's edges (subnormal range, the least
  // subnormal, the overflow threshold), exact midpoints and their neighbours, powers of two.
  std::mt19937_64 rng(31);
  const DType types[] = {DType::float64, DType::float32, DType::float16, DType::bfloat16};
  int checked = 0;
  for (DType t : types) {
    const Format f = format_of(t);
    const long centres[] = {0, f.min_exp, f.min_exp - f.precision, f.min_exp - f.precision + 1,
                            f.min_exp - f.precision - 1, f.max_exp, f.max_exp + 1, 7, -3};
    for (long centre : centres) {
      for (int trial = 0; trial < 400; ++trial) {
        const int bits = 60 + static_cast<int>(rng() % 241);
        detail::Real x(bits);
        // A random significand of `bits` bits; a third of the trials are made a midpoint of
        // the target (or one unit of x's last place beside it) by clearing low bits.
        detail::Integer m;
        mpz_set_ui(m.backend().data(), 1);
        for (int i = 1; i < bits; ++i) {
          mpz_mul_2exp(m.backend().data(), m.backend().data(), 1);
          if (rng() & 1) mpz_add_ui(m.backend().data(), m.backend().data(), 1);
        }
        const int kind = static_cast<int>(trial % 6);
        if (kind <= 2) {
          // keep precision+1 leading bits (a midpoint when the last kept bit is 1), then nudge
          const int keep = f.precision + 1 + static_cast<int>(rng() % 3) - 1;
          mpz_fdiv_q_2exp(m.backend().data(), m.backend().data(), static_cast<mp_bitcnt_t>(bits - keep));
          mpz_setbit(m.backend().data(), 0);
          mpz_mul_2exp(m.backend().data(), m.backend().data(), static_cast<mp_bitcnt_t>(bits - keep));
          if (kind == 1) mpz_add_ui(m.backend().data(), m.backend().data(), 1);
          if (kind == 2) mpz_sub_ui(m.backend().data(), m.backend().data(), 1);
        } else if (kind == 3) {
          mpz_set_ui(m.backend().data(), 1);
          mpz_mul_2exp(m.backend().data(), m.backend().data(), static_cast<mp_bitcnt_t>(bits - 1));
        }
        const long shift = static_cast<long>(rng() % 9) - 4;
        mpfr_set_z_2exp(x.get(), m.backend().data(), centre + shift - bits, MPFR_RNDN);  // exact
        if (rng() & 1) mpfr_neg(x.get(), x.get(), MPFR_RNDN);
        detail::Rational q;
        mpfr_get_q(q.backend().data(), x.get());
        const double want = detail::round_rational(q, t), got = detail::round_real(x.get(), t);
        ASSERT_EQ(std::bit_cast<std::uint64_t>(got), std::bit_cast<std::uint64_t>(want))
            << name_of(t) << " centre " << centre << " trial " << trial << ": " << std::hexfloat << got << " vs "
            << want;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 9 * 400);
}

TEST(Rounding, RationalRoundingOfNonDyadicValues) {
  // 1/3 to float32 is 0x1.555556p-2 (the next bit pattern 0101... rounds up).
  EXPECT_EQ(detail::round_rational(detail::Rational(1, 3), DType::float32), 0x1.555556p-2);
  EXPECT_EQ(detail::round_rational(detail::Rational(1, 3), DType::float64), 1.0 / 3.0);
  EXPECT_EQ(detail::round_rational(detail::Rational(-2, 3), DType::bfloat16), -0x1.56p-1);
  // 1e-8 is below half the smallest float16 subnormal (2^-25 ~ 2.98e-8).
  EXPECT_EQ(detail::round_rational(detail::Rational(1, 100000000), DType::float16), 0.0);
  EXPECT_TRUE(std::isinf(detail::round_rational(detail::Rational(70000), DType::float16)));
}

TEST(Rounding, BFloat16MatchesTheBitTrickOnFloat32Values) {
  // The usual float32 -> bfloat16 conversion: add 0x7fff + lsb, truncate (RNE for finite values).
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffffffffu);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t b = bits(rng);
    const float f = std::bit_cast<float>(b);
    if (!std::isfinite(f)) continue;
    const std::uint32_t lsb = (b >> 16) & 1u;
    const std::uint32_t r = (b + 0x7fffu + lsb) & 0xffff0000u;
    const float want = std::bit_cast<float>(r);
    ASSERT_EQ(round_to(static_cast<double>(f), DType::bfloat16), static_cast<double>(want)) << std::hexfloat << f;
  }
}

TEST(RoundingGap, BitsAgreeWithTheDefinition) {
  // rounding_gap's fast path (from t's bits) against rounding_gap_general (frexp/ldexp) over
  // random values of every binade of binary64, subnormals, powers of two, each format's edges.
  std::mt19937_64 rng(32);
  std::vector<double> values = {0.0, -0.0, 0x1p-1074, 0x1p-1022, 0x1.fffffffffffffp-1023, 1.0, -1.0,
                                0x1.fffffffffffffp+1023, 0x1p-126, 0x1p-149, 0x1p-14, 0x1p-24, 0x1p-133,
                                65504.0, 0x1.fffffep+127, 0x1p-127, 0x1p-125, 0x1p-15, 0x1p-13};
  for (int i = 0; i < 200000; ++i) {
    auto bits = rng();
    if (i % 4 == 0) bits &= ~0xfffffffffffffULL;  // a power of two
    values.push_back(std::bit_cast<double>(bits));
  }
  for (DType t : {DType::float64, DType::float32, DType::float16, DType::bfloat16})
    for (double v : values) {
      if (!std::isfinite(v)) continue;
      const RoundingGap a = rounding_gap(v, t), b = rounding_gap_general(v, t);
      ASSERT_EQ(std::bit_cast<std::uint64_t>(a.below), std::bit_cast<std::uint64_t>(b.below))
          << name_of(t) << " " << std::hexfloat << v;
      ASSERT_EQ(std::bit_cast<std::uint64_t>(a.above), std::bit_cast<std::uint64_t>(b.above))
          << name_of(t) << " " << std::hexfloat << v;
    }
}

TEST(RoundingGap, BoundariesAreWhereRoundingChanges) {
  std::mt19937_64 rng(5);
  for (DType t : {DType::float32, DType::float16, DType::bfloat16}) {
    const Format f = format_of(t);
    for (int i = 0; i < 20000; ++i) {
      const double t0 = round_to(random_double(rng, f.min_exp - f.precision, f.max_exp - 1), t);
      if (!std::isfinite(t0) || std::fabs(t0) == max_finite(t)) continue;
      const RoundingGap g = rounding_gap(t0, t);
      ASSERT_EQ(round_to(t0 + g.above * 0.999, t), t0);
      ASSERT_EQ(round_to(t0 - g.below * 0.999, t), t0);
      ASSERT_NE(round_to(t0 + g.above * 1.001, t), t0);
      ASSERT_NE(round_to(t0 - g.below * 1.001, t), t0);
    }
  }
}

TEST(ParseNumber, DecimalsRoundDirectlyToTheTarget) {
  EXPECT_EQ(*parse_number("0.1", DType::float32), static_cast<double>(0.1f));
  EXPECT_EQ(*parse_number("0x1.8p+0", DType::float16), 1.5);
  // Exactly the float16 midpoint 1 + 2^-11: ties to even.
  EXPECT_EQ(*parse_number("1.00048828125", DType::float16), 1.0);
  // A hair above the midpoint: up. Going through binary64 first would give 1.0 (double rounding).
  EXPECT_EQ(*parse_number("1.000488281250000000000001", DType::float16), 1.0009765625);
  EXPECT_TRUE(std::isnan(*parse_number("nan", DType::float32)));
  EXPECT_EQ(*parse_number("-inf", DType::bfloat16), -INFINITY);
  EXPECT_TRUE(std::signbit(*parse_number("-0", DType::float32)));
  EXPECT_FALSE(parse_number("1.5x", DType::float32));
  EXPECT_FALSE(parse_number("", DType::float32));
}

}  // namespace
}  // namespace normcheck::ref

namespace normcheck::ref {
namespace {

detail::Rational value_of(const detail::Integer& z, long e) {
  detail::Rational v;
  mpq_set_z(v.backend().data(), z.backend().data());
  if (e >= 0) mpq_mul_2exp(v.backend().data(), v.backend().data(), static_cast<mp_bitcnt_t>(e));
  else mpq_div_2exp(v.backend().data(), v.backend().data(), static_cast<mp_bitcnt_t>(-e));
  return v;
}

// The exact row sums, through both the narrow (register) and the binned path, against GMP.
TEST(RowSums, AgreeWithRationalSumsOnNarrowAndWideRows) {
  std::mt19937_64 rng(7);
  detail::BinnedSum s, q;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 700);
    const int span = static_cast<int>(rng() % 60);  // exponent spread: narrow path up to ~25
    const DType t = (trial % 3 == 0) ? DType::float64 : (trial % 3 == 1 ? DType::float32 : DType::bfloat16);
    std::vector<double> h(n);
    for (auto& v : h) {
      const int e = static_cast<int>(rng() % (span + 1)) - span / 2;
      v = round_to(std::ldexp(static_cast<double>(rng() % (1u << 30)) / (1u << 30) + 0.5, e), t);
      if (rng() % 2) v = -v;
      if (rng() % 17 == 0) v = 0;
    }
    detail::Rational want_s, want_q;
    for (double v : h) {
      want_s += detail::exact(v);
      want_q += detail::exact(v) * detail::exact(v);
    }
    detail::Integer zs, zq;
    long es = 0, eq = 0;
    detail::row_sums(h.data(), n, detail::scan_row(h.data(), n), true, s, q, zs.backend().data(), es, zq.backend().data(), eq);
    ASSERT_EQ(value_of(zs, es), want_s) << "trial " << trial;
    ASSERT_EQ(value_of(zq, eq), want_q) << "trial " << trial;
  }
}

TEST(CountZeroBytes, AgreesWithAByteLoop) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::uint8_t> v(rng() % 70);
    for (auto& b : v) b = (rng() % 3 == 0) ? 0 : static_cast<std::uint8_t>(rng() % 2 ? 1 : rng() % 256);
    std::int64_t want = 0;
    for (auto b : v) want += b == 0;
    ASSERT_EQ(detail::count_zero_bytes(v), want) << "trial " << trial;
  }
  EXPECT_EQ(detail::count_zero_bytes(std::vector<std::uint8_t>(17, 0x80)), 0);
  EXPECT_EQ(detail::count_zero_bytes(std::vector<std::uint8_t>(17, 0)), 17);
}

// The output pass's rounding decisions (row_kernel_body.inc, nc_decide_pass) at their edges,
// against exact rationals: y = (h - mean) * rstd * scale + bias with rstd, scale and mean
// given exactly as doubles (so the kernel's bound holds with room), for float32, bfloat16 and
// float64 outputs. Every element the kernel decides must carry the correct rounding to the
// output dtype and to binary64; exact powers of two, ties of either format, values just past
// a midpoint below a power of two, subnormal and overflowing results must be left undecided
// (they go to the general path); plain values well inside their interval must be decided.
struct KernelRun {
  std::vector<double> y, y64;
  std::vector<std::uint8_t> ok;
};

// with_lo: pass the (zero) low parts of the scale, as for a scale that is not a binary64; else
// null, as for one that is (the pass then leaves those terms out).
KernelRun run_kernel(const std::vector<double>& h, double mean, double rstd, const std::vector<double>& scale,
                     const std::vector<double>& bias, DType out, bool with_lo = true) {
  const auto n = static_cast<std::int64_t>(h.size());
  KernelRun r{std::vector<double>(n), std::vector<double>(n), std::vector<std::uint8_t>(n)};
  const std::vector<double> zero(n, 0.0);
  detail::RowKernelArgs k;
  k.n = n;
  k.h = h.data();
  k.mu_hi = mean;
  k.r_hi = rstd;
  k.s_hi = scale.data();
  k.s_lo = with_lo ? zero.data() : nullptr;
  k.b = bias.data();
  k.out = detail::FastFormat(out);
  k.y = r.y.data();
  k.y64 = r.y64.data();
  k.decided = r.ok.data();
  std::int64_t open = detail::run_row_kernel(k);
  for (auto v : r.ok) open -= v == 0;
  EXPECT_EQ(open, 0) << "the returned count of undecided elements";
  return r;
}

detail::Rational kernel_exact(double h, double mean, double rstd, double scale, double bias) {
  return (detail::exact(h) - detail::exact(mean)) * detail::exact(rstd) * detail::exact(scale) + detail::exact(bias);
}

TEST(RowKernel, DecisionsAtTheEdgesAreRightOrLeftOpen) {
  const double u = 0x1p-23;  // float32 ulp of [1, 2); below 1 it is u/2
  // (h, bias, must): y = h + bias (mean 0, rstd 1, scale 1); must: +1 decided, -1 undecided,
  // 0 either (checked for correctness when decided).
  struct Edge {
    double h, b;
    int must;
    const char* what;
  };
  const std::vector<Edge> f32_edges = {
      {1.5, 0, 1, "a plain float32 value"},
      {1 + 3 * u / 2, 0x1p-60, 1, "just above a float32 tie"},
      {1 + 3 * u / 2, -0x1p-40, 1, "just below a float32 tie"},
      {1 + 3 * u / 2, -0x1p-60, 0, "just below a float32 tie, y1 on it"},
      {1.25 + 0.3 * u, 0x1p-70, 1, "well inside"},
      {1.0, 0, -1, "exactly a power of two"},
      {1 + u / 2, 0, -1, "a float32 tie (to a power of two)"},
      {1 + 3 * u / 2, 0, -1, "a float32 tie"},
      {1 + 3 * u / 2, 0x1p-120, -1, "a float32 tie within the bound"},
      {1 - u / 4, -0x1p-60, -1, "just past the midpoint below a power of two"},
      {1 - u / 4, 0x1p-60, -1, "rounds up to a power of two"},
      {1 - u / 8, 0, -1, "rounds to a power of two from below"},
      {1.5 + 0x1p-52, 0x1p-53, -1, "a binary64 tie"},
      {1.5 + 0x1p-52, 0x1p-53 - 0x1p-90, 1, "just inside a binary64 tie"},
      {1.5 + 0x1p-52, 0x1p-53 - 0x1p-110, -1, "a binary64 tie within the bound"},
      {0x1p-130 * 1.5, 0, -1, "a float32 subnormal"},
      {0x1p128, 0, -1, "float32 overflow"},
      {0x1.fffffep127, 0x1p103, -1, "rounds to float32 overflow"},
  };
  // binary64 outputs: only the binary64 decision. A power-of-two y1 has a narrower rounding
  // interval below; the one within the bound of that midpoint must stay open.
  const std::vector<Edge> f64_edges = {
      {1.5, 0x1p-60, 1, "a plain value"},
      {2.0, 0, -1, "exactly a power of two"},
      {2.0, -(0x1p-53 - 0x1p-105), -1, "within the bound above the midpoint below a power of two"},
      {2.0, -(0x1p-54 - 0x1p-106), -1, "below a power of two, y1 on it"},
      {1.5 + 0x1p-52, 0x1p-53, -1, "a tie"},
      {1.5 + 0x1p-52, 0x1p-53 - 0x1p-90, 1, "just inside a tie"},
  };
  for (const int sign : {1, -1}) {
    std::vector<double> h, b;
    for (const auto& e : f64_edges) {
      h.push_back(sign * e.h);
      b.push_back(sign * e.b);
    }
    const std::vector<double> ones(h.size(), 1.0);
    const KernelRun r = run_kernel(h, 0, 1, ones, b, DType::float64);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const detail::Rational y = kernel_exact(h[i], 0, 1, 1, b[i]);
      if (r.ok[i]) {
        EXPECT_EQ(r.y[i], detail::round_rational(y, DType::float64)) << f64_edges[i].what << " sign " << sign;
        EXPECT_EQ(r.y64[i], r.y[i]) << f64_edges[i].what << " sign " << sign;
      }
      EXPECT_EQ(r.ok[i] != 0, f64_edges[i].must > 0) << f64_edges[i].what << " sign " << sign;
    }
  }
  for (const int sign : {1, -1}) {
    std::vector<double> h, b;
    for (const auto& e : f32_edges) {
      h.push_back(sign * e.h);
      b.push_back(sign * e.b);
    }
    const std::vector<double> ones(h.size(), 1.0);
    const KernelRun r = run_kernel(h, 0, 1, ones, b, DType::float32);
    for (std::size_t i = 0; i < h.size(); ++i) {
      const detail::Rational y = kernel_exact(h[i], 0, 1, 1, b[i]);
      if (r.ok[i]) {
        EXPECT_EQ(r.y[i], detail::round_rational(y, DType::float32)) << f32_edges[i].what << " sign " << sign;
        EXPECT_EQ(r.y64[i], detail::round_rational(y, DType::float64)) << f32_edges[i].what << " sign " << sign;
      }
      if (f32_edges[i].must != 0) {
        EXPECT_EQ(r.ok[i] != 0, f32_edges[i].must > 0) << f32_edges[i].what << " sign " << sign;
      }
    }
  }
}

// Random values near the rounding boundaries of each output format (midpoints and powers of
// two, at distances from 2^-20 to 2^-110 relative), through every variant of the pass
// (centered or not, scale, bias): no decided element may be wrong, and most must be decided.
TEST(RowKernel, NearBoundaryValuesAreNeverDecidedWrongly) {
  std::mt19937_64 rng(5);
  std::int64_t decided = 0, total = 0;
  for (const DType out : {DType::float32, DType::bfloat16, DType::float16, DType::float64}) {
    const Format f = format_of(out);
    for (int trial = 0; trial < 60; ++trial) {
      const double mean = (trial % 2) ? 0.0 : std::ldexp(1.0 + static_cast<double>(rng() % 1000) / 1000, -3);
      const double rstd = std::ldexp(1.0, static_cast<int>(rng() % 5) - 2);
      const int n = 257;
      std::vector<double> h(n), scale(n), bias(n);
      for (int i = 0; i < n; ++i) {
        // A target near a boundary of the output format: t + k ulp/2 with k in {-1, 0, 1}.
        const int e = static_cast<int>(rng() % 20) - 10;
        const double ulp = std::ldexp(1.0, e - (f.precision - 1));
        double t = std::ldexp(1.0 + static_cast<double>(rng() % 1024) / 1024, e);
        if (rng() % 4 == 0) t = std::ldexp(1.0, e);
        const double k = static_cast<double>(static_cast<int>(rng() % 3) - 1) * 0.5;
        const double nudge = std::ldexp(static_cast<double>(rng() % 3) - 1.0, e - 20 - static_cast<int>(rng() % 90));
        scale[i] = (trial % 3 == 0) ? 1.0 : std::ldexp(1.0, static_cast<int>(rng() % 3) - 1) * ((rng() % 2) ? 1 : -1);
        bias[i] = (trial % 4 == 0) ? 0.0 : nudge;
        // h - mean = (t + k ulp) / (rstd scale), rounded: the exact value below is what counts.
        h[i] = (t + k * ulp) / (rstd * scale[i]) + mean;
        if ((trial % 4) == 0) h[i] += nudge;
        if (rng() % 2) h[i] = -h[i];
      }
      const KernelRun r = run_kernel(h, mean, rstd, scale, bias, out, trial % 5 < 2);
      for (int i = 0; i < n; ++i) {
        ++total;
        if (!r.ok[i]) continue;
        ++decided;
        const detail::Rational y = kernel_exact(h[i], mean, rstd, scale[i], bias[i]);
        ASSERT_EQ(r.y[i], detail::round_rational(y, out)) << name_of(out) << " trial " << trial << " i " << i;
        ASSERT_EQ(r.y64[i], detail::round_rational(y, DType::float64)) << name_of(out) << " trial " << trial << " i " << i;
      }
    }
  }
  EXPECT_GT(decided, total / 2);
}

// The narrow sum of squares in two 64-bit words (row_kernel_body.inc, nc_split_square_sum) at
// the edges of its capacity: rows of several 1024-value blocks, exponent spans of 28 to 31 (the
// split path takes squares' shifts up to 60, i.e. spans up to 29; 30 and 31 take the 128-bit
// loop), full 24-bit significands massed at the top and the bottom of the span (each word's
// block sum near 2^64), and squares whose shift lands on the split bit 54 and either side.
TEST(RowSums, SplitSumOfSquaresAtItsCapacity) {
  std::mt19937_64 rng(11);
  detail::BinnedSum s, q;
  const double full = 0x1.fffffep0;  // the largest float32 significand
  for (int trial = 0; trial < 48; ++trial) {
    const int span = 28 + trial % 4;
    const int n = 1 + static_cast<int>(rng() % 4000) + (trial % 2) * 1024;
    const int base = -10 - static_cast<int>(rng() % 20);
    std::vector<double> h(n);
    for (int i = 0; i < n; ++i) {
      int e = base + span;
      switch (rng() % 8) {
        case 0: e = base; break;                                      // the bottom
        case 1: e = base + static_cast<int>(rng() % (span + 1)); break;
        case 2: e = base + 26 + static_cast<int>(rng() % 3); break;   // squares' shifts near 54
        default: break;                                               // the top
      }
      const bool top = e == base + span;
      const double sig = (top || rng() % 3) ? full : 1 + static_cast<double>(rng() % (1u << 23)) / (1u << 23);
      h[i] = round_to(std::ldexp(sig, e), DType::float32);
      if (rng() % 2) h[i] = -h[i];
    }
    h[0] = std::ldexp(full, base);  // pin the span
    h[n - 1] = std::ldexp(1.0, base + span);
    detail::Rational want_s, want_q;
    for (double v : h) {
      want_s += detail::exact(v);
      want_q += detail::exact(v) * detail::exact(v);
    }
    detail::Integer zs, zq;
    long es = 0, eq = 0;
    const auto scan = detail::scan_row(h.data(), n);
    ASSERT_EQ(scan.emax - scan.emin, n == 1 ? 0 : span) << "trial " << trial;
    // need_sum = false (RMSNorm) keeps rows of every span here on the narrow path; with the
    // sum, spans this wide leave it for the binned one unless the row is short.
    for (const bool need_sum : {false, true}) {
      detail::row_sums(h.data(), n, scan, need_sum, s, q, zs.backend().data(), es, zq.backend().data(), eq);
      if (need_sum) {
        ASSERT_EQ(value_of(zs, es), want_s) << "trial " << trial;
      }
      ASSERT_EQ(value_of(zq, eq), want_q) << "trial " << trial << " span " << span << " n " << n << " sum " << need_sum;
    }
  }
}

}  // namespace
}  // namespace normcheck::ref

namespace normcheck::ref {
namespace {

// Storage encodings: every 16-bit pattern of float16 and bfloat16 decodes to a value of its
// dtype and encodes back to itself (NaNs to the canonical quiet NaN); binary32 likewise for a
// sample, through memory as well.
TEST(Storage, SixteenBitPatternsRoundTrip) {
  for (DType t : {DType::float16, DType::bfloat16}) {
    EXPECT_EQ(storage_bytes(t), 2u);
    const std::uint64_t canonical_nan = t == DType::float16 ? 0x7e00 : 0x7fc0;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
      const double v = from_storage_bits(b, t);
      if (std::isnan(v)) {
        EXPECT_EQ(storage_bits(v, t), canonical_nan);
        continue;
      }
      ASSERT_TRUE(representable(v, t)) << b;
      ASSERT_EQ(storage_bits(v, t), b) << name_of(t) << " " << hex_text(v);
      std::uint16_t mem = 0;
      store_native(v, t, &mem);
      ASSERT_EQ(mem, b);
      ASSERT_EQ(load_native(&mem, t), v);
    }
  }
  EXPECT_EQ(storage_bits(-0.0, DType::float32), 0x80000000u);
  EXPECT_EQ(storage_bits(std::ldexp(1.0, -149), DType::float32), 1u);
  EXPECT_EQ(from_storage_bits(0x3c00, DType::float16), 1.0);
  EXPECT_EQ(from_storage_bits(0x3f80, DType::bfloat16), 1.0);
  EXPECT_EQ(storage_bits(-std::numeric_limits<double>::quiet_NaN(), DType::float64), 0x7ff8000000000000u);
}

}  // namespace
}  // namespace normcheck::ref
