// The output pass for any x86-64 (and the dispatcher): Dekker's exact product without FMA.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <string>

#include "ddouble.hpp"
#include "row_kernel.hpp"

namespace normcheck::ref::detail {

// The FMA builds (row_kernel_fma.cpp, row_kernel_avx512.cpp via row_kernel_variant.inc).
#define NC_DECLARE_VARIANT(v)                                                                          \
  std::int64_t run_row_kernel_##v(const RowKernelArgs& a);                                             \
  void accumulate_row_##v(const double* h, std::int64_t n, BinnedSum& sum, BinnedSum& sumsq);          \
  bool narrow_sums_##v(const double* h, std::int64_t n, const RowScan& scan, bool need_sum, std::int64_t& s64, \
                       int& s_base, BinnedSum::i128& q128, int& q_base);                                 \
  void scan_row_##v(const double* h, std::int64_t n, RowScan& out);
NC_DECLARE_VARIANT(fma)
NC_DECLARE_VARIANT(avx512)

namespace {
#define NC_TWO_PROD(a, b, p, e) two_prod((a), (b), (p), (e))
#include "row_kernel_body.inc"
#undef NC_TWO_PROD

enum class Isa { base, fma, avx512 };

// NORMCHECK_ISA=base|fma|avx512 forces a build (the tests run every build this CPU can run).
Isa detect_isa() {
  if (const char* forced = std::getenv("NORMCHECK_ISA")) {
    const std::string f(forced);
    if (f == "base") return Isa::base;
    if (f == "fma") return Isa::fma;
    if (f == "avx512") return Isa::avx512;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma"))
    return Isa::avx512;
  if (__builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2")) return Isa::fma;
#endif
  return Isa::base;
}
}  // namespace

const Isa kIsa = detect_isa();

std::int64_t run_row_kernel(const RowKernelArgs& a) {
  switch (kIsa) {
    case Isa::avx512: return run_row_kernel_avx512(a);
    case Isa::fma: return run_row_kernel_fma(a);
    case Isa::base: break;
  }
  return nc_row_kernel(a);
}

RowScan scan_row(const double* h, std::int64_t n) {
  RowScan out;
  switch (kIsa) {
    case Isa::avx512: scan_row_avx512(h, n, out); break;
    case Isa::fma: scan_row_fma(h, n, out); break;
    case Isa::base: nc_scan_row(h, n, out); break;
  }
  return out;
}

void row_sums(const double* h, std::int64_t n, const RowScan& scan, bool need_sum, BinnedSum& sum,
              BinnedSum& sumsq, mpz_ptr zs, long& es, mpz_ptr zq, long& eq) {
  std::int64_t s64 = 0;
  BinnedSum::i128 q128 = 0;
  int s_base = 0, q_base = 0;
  bool narrow = false;
  switch (kIsa) {
    case Isa::avx512: narrow = narrow_sums_avx512(h, n, scan, need_sum, s64, s_base, q128, q_base); break;
    case Isa::fma: narrow = narrow_sums_fma(h, n, scan, need_sum, s64, s_base, q128, q_base); break;
    case Isa::base: narrow = nc_narrow_sums(h, n, scan, need_sum, s64, s_base, q128, q_base); break;
  }
  if (narrow) {
    mpz_set_si(zs, s64);
    es = s_base;
    // q128 >= 0 (a sum of squares): high and low 64-bit halves.
    const auto hi = static_cast<std::uint64_t>(q128 >> 64), lo = static_cast<std::uint64_t>(q128);
    mpz_set_ui(zq, hi);
    mpz_mul_2exp(zq, zq, 64);
    mpz_add_ui(zq, zq, lo);
    eq = q_base;
    return;
  }
  switch (kIsa) {
    case Isa::avx512: accumulate_row_avx512(h, n, sum, sumsq); break;
    case Isa::fma: accumulate_row_fma(h, n, sum, sumsq); break;
    case Isa::base: nc_accumulate_row(h, n, sum, sumsq); break;
  }
  sum.take(zs, es);
  sumsq.take(zq, eq);
}

BinnedSum::BinnedSum() : bins_(2048 + 2, 0), lo_(1 << 20), hi_(-1) {}

BinnedSum* BinnedSum::twin() {
  if (!twin_) twin_ = std::make_unique<BinnedSum>();
  return twin_.get();
}

void BinnedSum::take(mpz_ptr z, long& exp) {
  if (twin_ && twin_->hi_ >= 0) {  // merge the twin's bins into ours
    for (int i = twin_->lo_; i <= twin_->hi_; ++i) {
      bins_[i] += twin_->bins_[i];
      twin_->bins_[i] = 0;
    }
    lo_ = std::min(lo_, twin_->lo_);
    hi_ = std::max(hi_, twin_->hi_);
    twin_->lo_ = 1 << 20;
    twin_->hi_ = -1;
  }
  mpz_set_ui(z, 0);
  exp = 0;
  if (hi_ < 0) return;
  // Carry propagation turns the bins into the two's complement binary expansion of the sum.
  std::vector<std::uint64_t> words;
  std::uint64_t word = 0;
  int nbits = 0;
  i128 carry = 0;
  for (int i = lo_;; ++i) {
    i128 v = carry;
    if (i <= hi_) {
      v += bins_[i];
      bins_[i] = 0;
    }
    word |= static_cast<std::uint64_t>(v & 1) << (nbits % 64);
    ++nbits;
    if (nbits % 64 == 0) {
      words.push_back(word);
      word = 0;
    }
    carry = v >> 1;  // arithmetic shift: floor division by 2
    if (i >= hi_ && (carry == 0 || carry == -1)) break;
  }
  if (nbits % 64) words.push_back(word);
  mpz_import(z, words.size(), -1, sizeof(std::uint64_t), 0, 0, words.data());
  if (carry == -1) {  // negative: value = bits - 2^nbits
    // value = bits - 2^nbits
    mpz_t p;
    mpz_init(p);
    mpz_ui_pow_ui(p, 2, static_cast<unsigned long>(nbits));
    mpz_sub(z, z, p);
    mpz_clear(p);
  }
  exp = static_cast<long>(lo_) - 1075;
  lo_ = 1 << 20;
  hi_ = -1;
}

FastFormat::FastFormat(DType t) : dtype(t) {
  const Format f = format_of(t);
  precision = f.precision;
  min_exp = f.min_exp;
  max_finite = normcheck::ref::max_finite(t);
}

}  // namespace normcheck::ref::detail
