#include "exact.hpp"

#include "normcheck/reference/evaluate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace normcheck::ref::detail {


Rational exact(double v) {
  Rational q;
  mpq_set_d(q.backend().data(), v);  // exact for every finite binary64
  return q;
}

double round_rational(const Rational& q, DType t) {
  const Format f = format_of(t);
  const mpq_srcptr qq = q.backend().data();
  const int sign = mpq_sgn(qq);
  if (sign == 0) return 0.0;
  Integer num, den;
  mpz_abs(num.backend().data(), mpq_numref(qq));
  mpz_set(den.backend().data(), mpq_denref(qq));
  // e with 2^(e-1) <= |q| < 2^e: start from the bit lengths, then correct by one comparison.
  long e = static_cast<long>(mpz_sizeinbase(num.backend().data(), 2)) -
           static_cast<long>(mpz_sizeinbase(den.backend().data(), 2));
  // Now 2^(e-1) < |q| < 2^(e+1). Is |q| >= 2^e ?
  {
    Integer a = num, b = den;
    if (e >= 0) mpz_mul_2exp(b.backend().data(), b.backend().data(), static_cast<mp_bitcnt_t>(e));
    else mpz_mul_2exp(a.backend().data(), a.backend().data(), static_cast<mp_bitcnt_t>(-e));
    if (mpz_cmp(a.backend().data(), b.backend().data()) >= 0) ++e;
  }
  if (e - 1 > f.max_exp + 1) return sign * std::numeric_limits<double>::infinity();
  if (e - 1 < f.min_exp - f.precision - 1) return sign > 0 ? 0.0 : -0.0;  // below half min subnormal
  const long u = std::max(e - 1, static_cast<long>(f.min_exp)) - (f.precision - 1);
  // |q| / 2^u = num * 2^-u / den, rounded to an integer, ties to even.
  Integer a = num, b = den;
  if (u < 0) mpz_mul_2exp(a.backend().data(), a.backend().data(), static_cast<mp_bitcnt_t>(-u));
  else mpz_mul_2exp(b.backend().data(), b.backend().data(), static_cast<mp_bitcnt_t>(u));
  Integer quo, rem;
  mpz_fdiv_qr(quo.backend().data(), rem.backend().data(), a.backend().data(), b.backend().data());
  mpz_mul_2exp(rem.backend().data(), rem.backend().data(), 1);
  const int c = mpz_cmp(rem.backend().data(), b.backend().data());
  if (c > 0 || (c == 0 && mpz_odd_p(quo.backend().data()))) mpz_add_ui(quo.backend().data(), quo.backend().data(), 1);
  // quo <= 2^precision fits a double exactly.
  const double m = mpz_get_d(quo.backend().data());
  const double r = std::ldexp(m, static_cast<int>(u));
  if (r > max_finite(t)) return sign * std::numeric_limits<double>::infinity();
  return sign > 0 ? r : -r;
}

double round_real(mpfr_srcptr x, DType t) {
  if (mpfr_nan_p(x)) return std::numeric_limits<double>::quiet_NaN();
  if (mpfr_inf_p(x)) return mpfr_sgn(x) > 0 ? std::numeric_limits<double>::infinity()
                                            : -std::numeric_limits<double>::infinity();
  if (mpfr_zero_p(x)) return mpfr_signbit(x) ? -0.0 : 0.0;
  // The same steps as round_rational, on the binary value directly: 2^(e-1) <= |x| < 2^e
  // (MPFR's exponent), the target's ulp there is 2^u, so `bits` = e - u significant bits are
  // kept; MPFR's round to nearest (ties to even) at that precision is the rounding wanted.
  const Format f = format_of(t);
  const bool negative = mpfr_signbit(x);
  const double inf = std::numeric_limits<double>::infinity();
  const long e = mpfr_get_exp(x);
  if (e - 1 > f.max_exp + 1) return negative ? -inf : inf;
  const long u = std::max(e - 1, static_cast<long>(f.min_exp)) - (f.precision - 1);
  const long bits = e - u;
  double r = 0.0;
  if (bits == 0) {
    // 2^(u-1) <= |x| < 2^u: the least subnormal, or 0 at the tie (even).
    const bool tie = mpfr_cmp_si_2exp(x, negative ? -1 : 1, u - 1) == 0;
    r = tie ? 0.0 : std::ldexp(1.0, static_cast<int>(u));
  } else if (bits > 0) {
    // bits <= precision <= 53: one limb, on the stack (MPFR's custom interface).
    mp_limb_t limbs[(53 + GMP_NUMB_BITS - 1) / GMP_NUMB_BITS];
    mpfr_t k;
    mpfr_custom_init(limbs, static_cast<mpfr_prec_t>(bits));
    mpfr_custom_init_set(k, MPFR_ZERO_KIND, 0, static_cast<mpfr_prec_t>(bits), limbs);
    mpfr_abs(k, x, MPFR_RNDN);  // rounds |x| to `bits` bits
    r = mpfr_get_d(k, MPFR_RNDN);  // exact below 2^1024, inf at or above
  }  // bits < 0: below half the least subnormal, 0
  if (r > max_finite(t)) r = inf;
  return negative ? -r : r;
}

void enclose(Enclosure& e, const Rational& q) {
  mpfr_set_q(e.lo.get(), q.backend().data(), MPFR_RNDD);
  mpfr_set_q(e.hi.get(), q.backend().data(), MPFR_RNDU);
}

void enclose(Enclosure& e, double v) {
  mpfr_set_d(e.lo.get(), v, MPFR_RNDD);
  mpfr_set_d(e.hi.get(), v, MPFR_RNDU);
}

void enclose_rstd(Enclosure& e, const Rational& q) {
  // 1/sqrt is decreasing: the lower end comes from an upper bound of q and vice versa.
  const int bits = static_cast<int>(mpfr_get_prec(e.lo.get()));
  Real qlo(bits), qhi(bits);
  mpfr_set_q(qlo.get(), q.backend().data(), MPFR_RNDD);
  mpfr_set_q(qhi.get(), q.backend().data(), MPFR_RNDU);
  mpfr_rec_sqrt(e.lo.get(), qhi.get(), MPFR_RNDD);
  mpfr_rec_sqrt(e.hi.get(), qlo.get(), MPFR_RNDU);
}

void mul(Enclosure& out, const Enclosure& a, const Enclosure& b) {
  // Sign-general interval product: the extremes are among the four endpoint products.
  const int bits = static_cast<int>(mpfr_get_prec(out.lo.get()));
  Real t(bits), lo(bits), hi(bits);
  mpfr_srcptr as[2] = {a.lo.get(), a.hi.get()};
  mpfr_srcptr bs[2] = {b.lo.get(), b.hi.get()};
  mpfr_set_inf(lo.get(), 1);
  mpfr_set_inf(hi.get(), -1);
  for (auto x : as)
    for (auto y : bs) {
      mpfr_mul(t.get(), x, y, MPFR_RNDD);
      if (mpfr_less_p(t.get(), lo.get())) mpfr_set(lo.get(), t.get(), MPFR_RNDD);
      mpfr_mul(t.get(), x, y, MPFR_RNDU);
      if (mpfr_greater_p(t.get(), hi.get())) mpfr_set(hi.get(), t.get(), MPFR_RNDU);
    }
  mpfr_set(out.lo.get(), lo.get(), MPFR_RNDD);
  mpfr_set(out.hi.get(), hi.get(), MPFR_RNDU);
}

void add(Enclosure& out, const Enclosure& a, const Enclosure& b) {
  mpfr_add(out.lo.get(), a.lo.get(), b.lo.get(), MPFR_RNDD);
  mpfr_add(out.hi.get(), a.hi.get(), b.hi.get(), MPFR_RNDU);
}

std::int64_t count_zero_bytes(const std::vector<std::uint8_t>& v) {
  constexpr std::uint64_t k7f = 0x7f7f7f7f7f7f7f7f, k01 = 0x0101010101010101;
  std::int64_t nonzero = 0;
  std::size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, v.data() + i, 8);
    // (b & 0x7f) + 0x7f carries into a byte's high bit when its low 7 bits are nonzero, | b adds
    // the high bit itself: bit 0 of each byte of t says the byte is nonzero; one multiplication
    // adds the eight.
    const std::uint64_t t = ((((w & k7f) + k7f) | w) >> 7) & k01;
    nonzero += static_cast<std::int64_t>((t * k01) >> 56);
  }
  for (; i < v.size(); ++i) nonzero += v[i] != 0;
  return static_cast<std::int64_t>(v.size()) - nonzero;
}

bool decide(const Enclosure& e, DType t, double& out) {
  const double lo = round_real(e.lo.get(), t);
  const double hi = round_real(e.hi.get(), t);
  if (lo != hi) return false;
  // Both zero: +0 unless the whole enclosure is negative.
  out = (lo == 0.0) ? (mpfr_sgn(e.hi.get()) < 0 ? -0.0 : 0.0) : lo;
  return true;
}

}  // namespace normcheck::ref::detail

namespace normcheck::ref {

void release_thread_caches() { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); }

}  // namespace normcheck::ref
