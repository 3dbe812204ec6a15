// Exact and directed-rounding arithmetic for the reference (internal).
//
// Rationals and integers are Boost.Multiprecision's GMP backends; enclosures are MPFR numbers
// held by Boost's mpfr_float and operated on with MPFR's own calls (directed rounding).
#pragma once

#include <mpfr.h>

#include <boost/multiprecision/gmp.hpp>
#include <boost/multiprecision/mpfr.hpp>
#include <cstdint>
#include <vector>

#include "normcheck/reference/dtype.hpp"

namespace normcheck::ref::detail {

using Integer = boost::multiprecision::mpz_int;
using Rational = boost::multiprecision::mpq_rational;

// An MPFR number of a chosen precision in bits. Only MPFR calls touch it (Boost's operators
// would round at the default precision and to nearest).
class Real {
 public:
  explicit Real(int bits) { mpfr_set_prec(v_.backend().data(), bits); }
  // Copies keep the source's precision and value exactly.
  Real(const Real& o) : Real(static_cast<int>(mpfr_get_prec(o.get()))) { mpfr_set(get(), o.get(), MPFR_RNDN); }
  Real& operator=(const Real& o) {
    if (this != &o) {
      mpfr_set_prec(get(), mpfr_get_prec(o.get()));
      mpfr_set(get(), o.get(), MPFR_RNDN);
    }
    return *this;
  }
  mpfr_ptr get() { return v_.backend().data(); }
  mpfr_srcptr get() const { return v_.backend().data(); }

 private:
  boost::multiprecision::mpfr_float v_;
};

// A closed interval [lo, hi] with MPFR endpoints that contains an exact value.
struct Enclosure {
  Real lo, hi;
  explicit Enclosure(int bits) : lo(bits), hi(bits) {}
};

Rational exact(double v);  // v finite
// Correct rounding (nearest-even, gradual underflow, overflow to inf) of an exact value.
double round_rational(const Rational& q, DType t);
double round_real(mpfr_srcptr x, DType t);  // x is taken as exact

void enclose(Enclosure& e, const Rational& q);                 // e ⊇ {q}
void enclose(Enclosure& e, double v);                           // exact when bits >= 53
void enclose_rstd(Enclosure& e, const Rational& q);            // e ⊇ {1/sqrt(q)}, q > 0
void mul(Enclosure& out, const Enclosure& a, const Enclosure& b);
void add(Enclosure& out, const Enclosure& a, const Enclosure& b);

// Rounds both ends of `e` to `t`; true (and the value in `out`) when they agree, i.e. the
// rounding of the enclosed exact value is decided. The sign of a zero result is not decided.
bool decide(const Enclosure& e, DType t, double& out);

// The number of zero bytes (uncertified flags), eight at a time: a byte loop adding into
// Result::stats cannot keep its counter in a register, as the flags may alias it (1.7 ms of a
// 4 M-element case).
std::int64_t count_zero_bytes(const std::vector<std::uint8_t>& v);

}  // namespace normcheck::ref::detail
