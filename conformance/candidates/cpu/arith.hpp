// Arithmetic in a compute dtype, and the three reduction styles. Internal to the CPU kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels.hpp"
#include "normcheck/reference/dtype.hpp"

namespace normcheck::conf::cpu::detail {

// Native float32 / float64: every operation is one IEEE operation of `float` / `double` (the
// sources are built with -ffp-contract=off, so nothing is fused behind our back).
// Emulated float16 / bfloat16: every operation is computed in double and rounded once to the
// compute dtype with ref::round_to. Double has at least 2p+2 bits for p = 11 and p = 8, so the
// double rounding is innocuous for + - * / sqrt (Figueroa, 1995): each operation is correctly
// rounded, as a hardware fp16/bf16 unit would round it. erf and exp (blocks) are rounded libm
// values. Constants a kernel takes as arguments (eps, alpha, weight_offset) are float32 values
// for every compute dtype but float64, as in real kernels' signatures.
template <ref::DType C>
struct Arith {
  using T = double;
  static constexpr ref::DType kDType = C;
  static T r(double v) { return ref::round_to(v, C); }
  static T konst(double v) { return ref::round_to(v, ref::DType::float32); }
};
template <>
struct Arith<ref::DType::float32> {
  using T = float;
  static constexpr ref::DType kDType = ref::DType::float32;
  static T r(float v) { return v; }
  static T konst(double v) { return static_cast<float>(ref::round_to(v, ref::DType::float32)); }
};
template <>
struct Arith<ref::DType::float64> {
  using T = double;
  static constexpr ref::DType kDType = ref::DType::float64;
  static T r(double v) { return v; }
  static T konst(double v) { return v; }
};

// The operations, each rounded to the compute dtype.
template <class A>
struct Op {
  using T = typename A::T;
  static T add(T a, T b) { return A::r(a + b); }
  static T sub(T a, T b) { return A::r(a - b); }
  static T mul(T a, T b) { return A::r(a * b); }
  static T div(T a, T b) { return A::r(a / b); }
  static T sqrt(T a) { return A::r(std::sqrt(a)); }
  static T erf(T a) { return A::r(std::erf(a)); }
  static T exp(T a) { return A::r(std::exp(a)); }
  // A count N as a divisor: exact (an integer, as kernels hold it), not rounded to the dtype.
  static T count(std::int64_t n) { return static_cast<T>(n); }
  // An input value (exactly a value of `from`) into the compute dtype.
  static T in(double v, ref::DType from) {
    if constexpr (std::is_same_v<T, float>) {
      if (from != ref::DType::float64) return static_cast<float>(v);  // exact
      return static_cast<float>(ref::round_to(v, ref::DType::float32));
    } else {
      return A::r(v);
    }
  }
};

// A compute value rounded to `t` (a contract's rounding point, an output's dtype), as a T.
template <class T>
inline T round_as(T v, ref::DType t) {
  if constexpr (std::is_same_v<T, float>) {
    if (t == ref::DType::float32 || t == ref::DType::float64) return v;
  } else {
    if (t == ref::DType::float64) return v;
  }
  return static_cast<T>(ref::round_to(static_cast<double>(v), t));
}

// The same, as the binary64 an output tensor holds.
template <class T>
inline double to_output(T v, ref::DType t) {
  if constexpr (std::is_same_v<T, float>) {
    if (t == ref::DType::float32 || t == ref::DType::float64) return static_cast<double>(v);
  } else {
    if (t == ref::DType::float64) return v;
  }
  return ref::round_to(static_cast<double>(v), t);
}

// ---- reductions over f(0) .. f(n-1) -------------------------------------------------------

template <class A, class F>
typename A::T sum_seq(std::int64_t begin, std::int64_t end, const F& f) {
  typename A::T s = 0;
  for (std::int64_t i = begin; i < end; ++i) s = Op<A>::add(s, f(i));
  return s;
}

// Recursive halving down to sequential blocks of kPairwiseBase: error O(log n) u, not O(n) u.
template <class A, class F>
typename A::T sum_pairwise(std::int64_t begin, std::int64_t end, const F& f) {
  if (end - begin <= kPairwiseBase) return sum_seq<A>(begin, end, f);
  const std::int64_t mid = begin + (end - begin) / 2;
  return Op<A>::add(sum_pairwise<A>(begin, mid, f), sum_pairwise<A>(mid, end, f));
}

template <class A, class F>
typename A::T sum_of(Reduction r, std::int64_t n, const F& f) {
  return r == Reduction::pairwise ? sum_pairwise<A>(0, n, f) : sum_seq<A>(0, n, f);
}

// Running mean m_k = m_{k-1} + (f(k) - m_{k-1}) / k: Welford's update of the mean alone.
template <class A, class F>
typename A::T running_mean(std::int64_t begin, std::int64_t end, const F& f) {
  using O = Op<A>;
  typename A::T m = 0;
  for (std::int64_t i = begin; i < end; ++i) m = O::add(m, O::div(O::sub(f(i), m), O::count(i - begin + 1)));
  return m;
}

// mean of f over n values in the style r (n > 0).
template <class A, class F>
typename A::T mean_of(Reduction r, std::int64_t n, const F& f) {
  if (r == Reduction::welford) return running_mean<A>(0, n, f);
  return Op<A>::div(sum_of<A>(r, n, f), Op<A>::count(n));
}

// Welford's mean and M2 = sum (f - mean)^2 over [begin, end).
template <class A>
struct MeanM2 {
  typename A::T mean = 0, m2 = 0;
};
template <class A, class F>
MeanM2<A> welford(std::int64_t begin, std::int64_t end, const F& f) {
  using O = Op<A>;
  MeanM2<A> s;
  for (std::int64_t i = begin; i < end; ++i) {
    const auto v = f(i);
    const auto delta = O::sub(v, s.mean);
    s.mean = O::add(s.mean, O::div(delta, O::count(i - begin + 1)));
    s.m2 = O::add(s.m2, O::mul(delta, O::sub(v, s.mean)));
  }
  return s;
}

// Column sums over rows: each row adds at most one term per column, then end_row(). The three
// styles stream (no row-by-column scratch): two_pass adds in row order; welford keeps a running
// mean per column (sum = mean * rows); pairwise sums blocks of kPairwiseBase rows sequentially
// and merges the block sums like a binary counter, so it is a pairwise tree over blocks.
template <class A>
class ColumnSums {
 public:
  using T = typename A::T;
  ColumnSums(Reduction r, std::int64_t cols) : r_(r), cur_(static_cast<std::size_t>(cols), T(0)) {}

  void add(std::int64_t col, T v) {
    using O = Op<A>;
    T& c = cur_[static_cast<std::size_t>(col)];
    if (r_ == Reduction::welford)
      c = O::add(c, O::div(O::sub(v, c), O::count(rows_ + 1)));
    else
      c = O::add(c, v);
  }

  void end_row() {
    ++rows_;
    if (r_ != Reduction::pairwise || ++in_block_ < kPairwiseBase) return;
    std::vector<T> carry(cur_.size(), T(0));
    carry.swap(cur_);
    std::size_t k = 0;
    for (; k < levels_.size() && !levels_[k].empty(); ++k) {
      for (std::size_t j = 0; j < carry.size(); ++j) carry[j] = Op<A>::add(levels_[k][j], carry[j]);
      levels_[k].clear();
    }
    if (k == levels_.size()) levels_.emplace_back();
    levels_[k] = std::move(carry);
    in_block_ = 0;
  }

  std::vector<T> finish() const {
    using O = Op<A>;
    if (r_ == Reduction::two_pass) return cur_;
    std::vector<T> out(cur_);
    if (r_ == Reduction::welford) {
      for (auto& v : out) v = O::mul(v, O::count(rows_));
      return out;
    }
    // Older (larger) blocks first, the partial block last.
    bool any = false;
    for (std::size_t k = levels_.size(); k-- > 0;) {
      if (levels_[k].empty()) continue;
      if (!any) {
        out = levels_[k];
        any = true;
      } else {
        for (std::size_t j = 0; j < out.size(); ++j) out[j] = O::add(out[j], levels_[k][j]);
      }
    }
    if (any && in_block_ > 0)
      for (std::size_t j = 0; j < out.size(); ++j) out[j] = O::add(out[j], cur_[j]);
    return out;
  }

 private:
  Reduction r_;
  std::vector<T> cur_;
  std::vector<std::vector<T>> levels_;  // levels_[k]: sum of 2^k blocks, or empty
  std::int64_t rows_ = 0;
  int in_block_ = 0;
};

}  // namespace normcheck::conf::cpu::detail
