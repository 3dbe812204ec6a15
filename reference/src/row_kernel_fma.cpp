// The output pass built for x86-64-v3 (AVX2 + FMA): the exact product is one FMA.
#include <bit>
#include <cmath>

#include "row_kernel.hpp"

namespace normcheck::ref::detail {
namespace {
#define NC_TWO_PROD(a, b, p, e) \
  do {                          \
    (p) = (a) * (b);            \
    (e) = std::fma((a), (b), -(p)); \
  } while (0)
#include "row_kernel_body.inc"
#undef NC_TWO_PROD
}  // namespace

std::int64_t run_row_kernel_fma(const RowKernelArgs& a) { return nc_row_kernel(a); }
void accumulate_row_fma(const double* h, std::int64_t n, BinnedSum& sum, BinnedSum& sumsq) {
  nc_accumulate_row(h, n, sum, sumsq);
}
bool narrow_sums_fma(const double* h, std::int64_t n, std::int64_t& s64, int& s_base, BinnedSum::i128& q128,
                     int& q_base) {
  return nc_narrow_sums(h, n, s64, s_base, q128, q_base);
}

}  // namespace normcheck::ref::detail
