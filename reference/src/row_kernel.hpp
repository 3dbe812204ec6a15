// The reference's hot loops for rows whose h values are binary64 (internal):
//  - exact row sums of h and h^2 in integer bins, one per binary64 exponent;
//  - the forward output pass y = (h - mean) * rstd * scale + bias in double-double with a
//    closed-form error bound, and the decision of its rounding to the output dtype and to
//    binary64 from the bits of the result.
// Two builds of the output pass: one with hardware FMA (x86-64-v3), one with Dekker's product
// for any x86-64; the choice is made once at run time.
#pragma once

#include <gmp.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "normcheck/reference/dtype.hpp"

// This header is included by the per-ISA builds (row_kernel_fma.cpp, row_kernel_avx512.cpp,
// compiled with -march=x86-64-v3/v4). It must not pull in C++ code the compiler could emit as
// a weak symbol there (Boost.Multiprecision, for one): the linker may keep that AVX-512 copy
// for the whole program, which would then crash on CPUs without AVX-512. GMP's C interface
// (mpz_ptr) is all it uses; the test reference.isa_objects_have_no_weak_symbols checks the
// objects with nm.

namespace normcheck::ref::detail {

// Exact sum of binary64 values: bin e (a 128-bit integer) counts units of 2^(e-1075), e the
// biased exponent (subnormals share bin 1). A bin absorbs 2^74 additions of a 53-bit
// significand, far more than the 2^31 elements a case may have.
class BinnedSum {
 public:
  __extension__ typedef __int128 i128;
  BinnedSum();
  BinnedSum(BinnedSum&&) = default;
  BinnedSum& operator=(BinnedSum&&) = default;
  void add(double v) {
    const auto u = std::bit_cast<std::uint64_t>(v);
    int e = static_cast<int>((u >> 52) & 0x7ff);
    std::uint64_t m = u & ((std::uint64_t{1} << 52) - 1);
    if (e) m |= std::uint64_t{1} << 52;
    else e = 1;
    if (m == 0) return;
    bins_[e] += (u >> 63) ? -static_cast<i128>(m) : static_cast<i128>(m);
    lo_ = e < lo_ ? e : lo_;
    hi_ = e > hi_ ? e : hi_;
  }
  // Raw access for the hot loop, which tracks the range of bins it touched in registers and
  // reports it with note_range().
  i128* bins() { return bins_.data(); }
  void note_range(int lo, int hi) {
    lo_ = lo < lo_ ? lo : lo_;
    hi_ = hi > hi_ ? hi : hi_;
  }
  // The exact sum (its own and its twin's) as z * 2^exp; clears both.
  void take(mpz_ptr z, long& exp);
  // A second set of bins that take() merges in, for interleaved accumulation.
  BinnedSum* twin();

 private:
  std::vector<i128> bins_;
  int lo_, hi_;
  std::unique_ptr<BinnedSum> twin_;
};

// Rounding targets of the output pass.
struct FastFormat {
  DType dtype;
  int precision;
  int min_exp;
  double max_finite;
  explicit FastFormat(DType t);
};

struct RowKernelArgs {
  std::int64_t n = 0;
  const double* h = nullptr;       // the row, gathered
  double mu_hi = 0, mu_lo = 0;     // |mean - (hi+lo)| <= 2^-104 |mean|
  double r_hi = 0, r_lo = 0;       // |rstd - (hi+lo)| <= 2^-104 rstd
  const double* s_hi = nullptr;    // scale per column (exact as s_hi + s_lo), or null (scale 1)
  const double* s_lo = nullptr;    // or null when every s_lo is 0 (the scale is a binary64)
  const double* b = nullptr;       // bias per column, or null
  FastFormat out{DType::float32};
  double* y = nullptr;             // per column: value in the output dtype
  double* y64 = nullptr;           // per column: value rounded to binary64
  std::uint8_t* decided = nullptr; // per column: 1 when both roundings are decided
};

// Returns the number of undecided columns.
std::int64_t run_row_kernel(const RowKernelArgs& a);

// One pass over a row: the range of biased exponents of its nonzero values (emin = 0x7ff
// when all are zero; emax = 0x7ff when one is NaN or infinite), and whether every value has
// at most 24 significant bits (the low 29 bits of every significand are zero).
struct RowScan {
  int emin = 0x7ff, emax = 0;
  bool narrow_bits = true;
  bool special() const { return emax == 0x7ff; }
  // Every nonzero |h| in [2^-480, 2^480): h*h splits exactly into two binary64 values.
  bool in_fast_domain() const { return emin >= 1023 - 480 && emax <= 1023 + 479; }
};
RowScan scan_row(const double* h, std::int64_t n);

// The exact sum and sum of squares of a row of finite binary64 values in the fast domain, as
// zs * 2^es and zq * 2^eq; `scan` is scan_row's result for the row. With need_sum = false
// (RMSNorm) the sum may be left 0.
void row_sums(const double* h, std::int64_t n, const RowScan& scan, bool need_sum, BinnedSum& sum,
              BinnedSum& sumsq, mpz_ptr zs, long& es, mpz_ptr zq, long& eq);

}  // namespace normcheck::ref::detail
