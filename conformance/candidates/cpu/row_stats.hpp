// Row statistics (mean, rstd) of the CPU kernels, with the faults of classes A and B. Shared by
// the plain kernels (norm_kernel.cpp) and the blocks' norms (block_kernel.cpp).
#pragma once

#include <bit>
#include <cstdint>

#include "arith.hpp"

namespace normcheck::conf::cpu::detail {

// The eps a kernel uses: the case's, or the faulty one.
inline double kernel_epsilon(double eps, Fault f) {
  if (f == fault("eps_hardcoded")) return 1e-6;  // llama.cpp #2373: 1e-6 for a model trained with 1e-5
  if (f == fault("eps_dropped")) return 0.0;     // a fusion pass dropped the eps input
  if (f == fault("eps_fp16")) return ref::round_to(eps, ref::DType::float16);  // 1e-12 -> 0
  return eps;
}

template <class A>
struct RowStats {
  typename A::T mean = 0;  // 0 for RMSNorm
  typename A::T rstd = 0;
};

// Statistics of h[0..n) for a normalization that centres (LayerNorm) or not (RMSNorm).
template <class A>
RowStats<A> row_stats(const typename A::T* h, std::int64_t n, bool centre, Reduction red, Fault f,
                      typename A::T eps) {
  using T = typename A::T;
  using O = Op<A>;
  RowStats<A> s;
  const T count = O::count(n);
  auto sq = [&](std::int64_t i) { return O::mul(h[i], h[i]); };
  T var = 0;  // the biased variance (RMSNorm: the mean square)
  T ss = 0;   // the sum it divides by N (eps_in_denominator needs it)
  if (f == fault("welford_merge")) {
    // Two halves reduced by Welford, merged as if they held N/2 elements each: the weights
    // nb/N and na*nb/N become 1/2 and N/4, wrong when N is odd (the halves then differ).
    const std::int64_t half = n / 2;
    const T half_n = O::div(count, T(4));
    if (centre) {
      const auto a = welford<A>(0, half, [&](std::int64_t i) { return h[i]; });
      const auto b = welford<A>(half, n, [&](std::int64_t i) { return h[i]; });
      const T delta = O::sub(b.mean, a.mean);
      s.mean = O::add(a.mean, O::mul(delta, T(0.5)));
      ss = O::add(O::add(a.m2, b.m2), O::mul(O::mul(delta, delta), half_n));
    } else {
      const T ma = running_mean<A>(0, half, sq), mb = running_mean<A>(half, n, sq);
      ss = O::mul(O::mul(O::add(ma, mb), T(0.5)), count);
    }
    var = O::div(ss, count);
  } else if (red == Reduction::welford) {
    if (centre) {
      const auto w = welford<A>(0, n, [&](std::int64_t i) { return h[i]; });
      s.mean = w.mean;
      ss = w.m2;
      var = O::div(ss, count);
    } else {
      var = running_mean<A>(0, n, sq);
      ss = O::mul(var, count);
    }
  } else {
    if (f == fault("fp16_accumulation")) {
      // Accumulator stored in float16 between additions (pytorch #133085): each partial sum
      // rounds to binary16, x^2 > 65504 overflows.
      auto acc16 = [&](std::int64_t len, auto term) {
        T a = 0;
        for (std::int64_t i = 0; i < len; ++i) a = round_as(O::add(a, term(i)), ref::DType::float16);
        return a;
      };
      if (centre) s.mean = O::div(acc16(n, [&](std::int64_t i) { return h[i]; }), count);
      ss = centre ? acc16(n,
                          [&](std::int64_t i) {
                            const T d = O::sub(h[i], s.mean);
                            return O::mul(d, d);
                          })
                  : acc16(n, sq);
      var = O::div(ss, count);
    } else {
      if (centre) s.mean = O::div(sum_of<A>(red, n, [&](std::int64_t i) { return h[i]; }), count);
      if (centre && f == fault("one_pass_variance")) {
        // E[h^2] - E[h]^2: cancels catastrophically when |mean| >> sigma (pytorch #51102).
        ss = sum_of<A>(red, n, sq);
        var = O::sub(O::div(ss, count), O::mul(s.mean, s.mean));
      } else if (centre && f == fault("padding_lanes")) {
        // The second pass runs over the block of the next power of two lanes; masked-off lanes
        // load 0 and contribute (0 - mean)^2 (triton #9838, Liger-Kernel #518).
        const std::int64_t lanes = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n)));
        ss = sum_of<A>(red, lanes, [&](std::int64_t i) {
          const T d = O::sub(i < n ? h[i] : T(0), s.mean);
          return O::mul(d, d);
        });
        var = O::div(ss, count);
      } else {
        ss = centre ? sum_of<A>(red, n,
                                [&](std::int64_t i) {
                                  const T d = O::sub(h[i], s.mean);
                                  return O::mul(d, d);
                                })
                    : sum_of<A>(red, n, sq);
        // unbiased_variance: Bessel's N - 1 (lbann #2024); N = 1 gives 0/0.
        var = O::div(ss, centre && f == fault("unbiased_variance") ? O::count(n - 1) : count);
      }
    }
  }
  const T one(1);
  if (f == fault("eps_outside_sqrt")) s.rstd = O::div(one, O::add(O::sqrt(var), eps));
  else if (f == fault("eps_in_denominator")) s.rstd = O::div(one, O::sqrt(O::div(ss, O::add(count, eps))));
  else s.rstd = O::div(one, O::sqrt(O::add(var, eps)));
  return s;
}

}  // namespace normcheck::conf::cpu::detail
