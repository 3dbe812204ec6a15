// Test kernels for the declared reduction classes (conformance/TOLERANCE.md, section 9): correct
// float32 LayerNorm/RMSNorm kernels of unusual numerics, each declaring the class it belongs to,
// and kernels with one fault each (proposed catalogue mutants, fault ids in the table below),
// each declaring the class of the kernel it is built on (pairwise:16). One source, one plugin per
// kernel: RK_KIND selects it (CMakeLists.txt). Forward and backward, last axis, affine, offset,
// fused residual add, float32/float16/bfloat16 tensors, float32 compute, contract "exact".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "normcheck/candidate.h"

#ifndef RK_KIND
#error "RK_KIND selects the kernel"
#endif

namespace {

enum Kind : int {
  // Correct kernels, with the class they declare.
  kKahan = 0,     // two_pass: mean and variance by Kahan-compensated sums
  kChan = 1,      // welford: Welford over chunks of 64, chunks merged by Chan's formula
  kF64 = 2,       // accumulate_f64: every sum accumulated in double
  kFmaf = 3,      // two_pass: sequential sums, y = fmaf(xhat, scale, bias)
  kSorted = 4,    // two_pass: every sum taken in order of increasing magnitude
  kNewton = 5,    // two_pass: rstd by a bit-level estimate and Newton steps (no sqrt)
  kPairwise = 6,  // pairwise:16: groups of 16 summed sequentially, then a balanced tree
  kLanes = 7,     // blocked:8: 8 strided lanes of partial sums, added at the end
  // Faults, each on the pairwise:16 kernel (proposed fault ids for the catalogue).
  kUnbiasedLong = 10,    // B.unbiased_variance_long_rows: var / (n - 1) for rows over 1024
  kMeanNMinus1 = 11,     // B.mean_over_n_minus_1: mean = sum / (n - 1)
  kEps1e6 = 12,          // A.eps_hardcoded_1e6: eps = 1e-6 whatever the case says
  kDweightSubset = 13,   // G.dweight_first_1024_rows: dweight/dbias summed over rows 0..1023 only
  kF16Truncate = 14,     // D.fp16_output_truncated: float16 outputs truncated, not rounded
  kMeanXDtype = 15,      // D.mean_rounded_to_x_dtype: the mean rounded to x's dtype before use
};
constexpr int kKind = RK_KIND;
constexpr bool kFault = kKind >= 10;

// --- dtypes ---------------------------------------------------------------------------------
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
// float -> float16, round to nearest even (or toward zero for the truncation fault), via double:
// the value is scaled so that its float16 quantum is 1 and rounded as an integer.
std::uint16_t float_to_half(float f, bool truncate) {
  if (std::isnan(f)) return 0x7e00;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(f));
  int e;
  std::frexp(a, &e);                     // a = m 2^e, m in [0.5, 1)
  const int q = std::max(e - 11, -24);  // quantum 2^q (subnormals: 2^-24)
  double k = std::ldexp(a, -q);
  k = truncate ? std::floor(k) : std::nearbyint(k);
  a = std::ldexp(k, q);
  if (a >= 65520.0 || (truncate && a > 65504.0)) return truncate ? sign | 0x7bff : sign | 0x7c00;
  if (a == 0) return sign;
  int ee;
  std::frexp(a, &ee);
  if (ee - 1 < -14) return sign | static_cast<std::uint16_t>(std::ldexp(a, 24));  // subnormal
  const auto man = static_cast<std::uint16_t>(std::ldexp(a, 11 - ee) - 1024);   // 10 bits
  return sign | static_cast<std::uint16_t>((ee - 1 + 15) << 10) | man;
}
float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(u >> 16);
}
float round_as(float v, int dtype) {  // v rounded to dtype and back
  if (dtype == NC_FLOAT16) return half_to_float(float_to_half(v, false));
  if (dtype == NC_BFLOAT16) return bf16_to_float(float_to_bf16(v));
  return v;
}

struct View {  // a tensor seen as rows of its last dim
  const nc_tensor* t = nullptr;
  std::int64_t rows = 1, cols = 1;
  std::int64_t offset(std::int64_t r, std::int64_t j) const {
    std::int64_t off = 0;
    for (std::int32_t d = t->rank - 2; d >= 0; --d) {
      off += (r % t->shape[d]) * t->strides[d];
      r /= t->shape[d];
    }
    return off + j * t->strides[t->rank - 1];
  }
  float get(std::int64_t r, std::int64_t j) const {
    const std::int64_t k = offset(r, j);
    switch (t->dtype) {
      case NC_FLOAT32: return static_cast<const float*>(t->data)[k];
      case NC_FLOAT16: return half_to_float(static_cast<const std::uint16_t*>(t->data)[k]);
      case NC_BFLOAT16: return bf16_to_float(static_cast<const std::uint16_t*>(t->data)[k]);
      default: return static_cast<float>(static_cast<const double*>(t->data)[k]);
    }
  }
  void set(std::int64_t r, std::int64_t j, float v) const {
    const std::int64_t k = offset(r, j);
    switch (t->dtype) {
      case NC_FLOAT32: static_cast<float*>(t->data)[k] = v; break;
      case NC_FLOAT16: static_cast<std::uint16_t*>(t->data)[k] = float_to_half(v, kKind == kF16Truncate); break;
      case NC_BFLOAT16: static_cast<std::uint16_t*>(t->data)[k] = float_to_bf16(v); break;
      default: static_cast<double*>(t->data)[k] = v; break;
    }
  }
};
View view(const nc_tensor* t) {
  View v;
  v.t = t;
  if (!t) return v;
  v.cols = t->rank ? t->shape[t->rank - 1] : 1;
  for (std::int32_t d = 0; d + 1 < t->rank; ++d) v.rows *= t->shape[d];
  return v;
}

// --- sums -----------------------------------------------------------------------------------
float seq(const float* v, std::size_t n) {
  float s = 0;
  for (std::size_t i = 0; i < n; ++i) s += v[i];
  return s;
}
float pairwise16(const float* v, std::size_t n) {
  if (n <= 16) return seq(v, n);
  return pairwise16(v, n / 2) + pairwise16(v + n / 2, n - n / 2);
}
// The kernel's sum of t (which it may reorder).
float sum(std::vector<float>& t) {
  switch (kKind) {
    case kKahan: {
      float s = 0, c = 0;
      for (float x : t) {
        const float y = x - c;
        const float u = s + y;
        c = (u - s) - y;
        s = u;
      }
      return s;
    }
    case kF64: {
      double s = 0;
      for (float x : t) s += x;
      return static_cast<float>(s);
    }
    case kSorted:
      std::sort(t.begin(), t.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
      return seq(t.data(), t.size());
    case kLanes: {
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::size_t i = 0; i < t.size(); ++i) lane[i % 8] += t[i];
      return seq(lane, 8);
    }
    case kChan:
    case kFmaf:
    case kNewton: return seq(t.data(), t.size());
    default: return pairwise16(t.data(), t.size());  // kPairwise and the faults
  }
}

float rsqrt(float q) {
  if (kKind != kNewton) return 1.0f / std::sqrt(q);
  if (!(q > 0) || std::isinf(q)) return 1.0f / std::sqrt(q);
  // Scale q into [1, 4) so the estimate works for subnormal and huge q alike.
  int e;
  const float m = std::frexp(q, &e);  // q = m 2^e
  const int half = (e - 1) >> 1;      // floor
  const float s = std::ldexp(m, e - 2 * half);
  std::uint32_t i;
  std::memcpy(&i, &s, 4);
  i = 0x5f3759dfu - (i >> 1);
  float y;
  std::memcpy(&y, &i, 4);
  for (int k = 0; k < 3; ++k) y = y * (1.5f - 0.5f * s * y * y);
  const float err = std::fma(s * y, y, -1.0f);  // s y^2 - 1
  y = std::fma(-0.5f * y, err, y);
  return std::ldexp(y, -half);
}

struct Stats {
  float mean = 0, rstd = 0;
};

// Row statistics of h (LayerNorm centres, RMSNorm does not).
Stats stats(const std::vector<float>& h, bool ln, float eps, int dtype_x) {
  const auto n = static_cast<std::int64_t>(h.size());
  const float nf = static_cast<float>(n);
  Stats s;
  float var = 0;
  if (kKind == kChan) {
    // Welford over chunks of 64, merged by Chan's formula (RMSNorm: running mean of h^2).
    float mean = 0, m2 = 0, count = 0;
    for (std::int64_t b = 0; b < n; b += 64) {
      float cm = 0, cm2 = 0, k = 0;
      for (std::int64_t j = b; j < std::min(n, b + 64); ++j) {
        const float v = ln ? h[j] : h[j] * h[j];
        k += 1;
        const float d = v - cm;
        cm += d / k;
        if (ln) cm2 += d * (v - cm);
      }
      const float tot = count + k;
      const float delta = cm - mean;
      mean += delta * (k / tot);
      if (ln) m2 = m2 + cm2 + delta * (delta * (count / tot)) * k;
      count = tot;
    }
    if (ln) {
      s.mean = mean;
      var = m2 / nf;
    } else {
      var = mean;
    }
  } else {
    std::vector<float> t(h.begin(), h.end());
    if (ln) {
      const float total = kKind == kF64 ? 0 : sum(t);
      double total64 = 0;
      if (kKind == kF64)
        for (float v : h) total64 += v;
      s.mean = kKind == kF64 ? static_cast<float>(total64 / static_cast<double>(n))
                             : total / (kKind == kMeanNMinus1 ? nf - 1 : nf);
      if (kKind == kMeanXDtype) s.mean = round_as(s.mean, dtype_x);
    }
    if (kKind == kF64) {
      double ss = 0;
      for (float v : h) ss += (static_cast<double>(v) - s.mean) * (static_cast<double>(v) - s.mean);
      var = static_cast<float>(ss / static_cast<double>(n));
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        const float d = h[j] - s.mean;
        t[j] = d * d;
      }
      var = sum(t) / (kKind == kUnbiasedLong && ln && n > 1024 ? nf - 1 : nf);
    }
  }
  s.rstd = rsqrt(var + (kKind == kEps1e6 ? 1e-6f : eps));
  return s;
}

const nc_tensor* find(const nc_named_tensor* list, std::int32_t n, const char* name) {
  for (std::int32_t i = 0; i < n; ++i)
    if (std::strcmp(list[i].name, name) == 0) return &list[i].tensor;
  return nullptr;
}

int supports(void*, const nc_case* c, char* reason, std::size_t len) {
  if (c->rank < 1 || c->n_norm_dims != 1 || c->norm_dims[0] != c->rank - 1) {
    std::snprintf(reason, len, "normalizes over the last dim only");
    return 1;
  }
  return 0;
}

int run(void*, const nc_case* c, const nc_named_tensor* in, std::int32_t n_in, nc_named_tensor* out,
        std::int32_t n_out, char* err, std::size_t err_len) {
  const View x = view(find(in, n_in, "x")), w = view(find(in, n_in, "weight")), b = view(find(in, n_in, "bias")),
             res = view(find(in, n_in, "residual")), rb = view(find(in, n_in, "residual_bias")),
             dy = view(find(in, n_in, "dy"));
  if (!x.t) {
    std::snprintf(err, err_len, "no input x");
    return 1;
  }
  const bool ln = c->op == NC_LAYERNORM, bwd = c->direction == NC_BACKWARD;
  const float eps = static_cast<float>(c->epsilon), alpha = static_cast<float>(c->alpha);
  const float offset = static_cast<float>(c->weight_offset);
  const std::int64_t R = x.rows, n = x.cols;
  std::vector<float> scale(n, 1.0f), bias(n, 0.0f), rbias(n, 0.0f);
  for (std::int64_t j = 0; j < n; ++j) {
    if (w.t) scale[j] = offset + w.get(0, j);
    if (b.t) bias[j] = b.get(0, j);
    if (rb.t) rbias[j] = rb.get(0, j);
  }
  auto output = [&](const char* name) { return view(find(out, n_out, name)); };
  const View y = output("y"), mean = output("mean"), rstd = output("rstd"), ro = output("residual_out"),
             dx = output("dx"), dw = output("dweight"), db = output("dbias"), dres = output("dresidual"),
             drb = output("dresidual_bias");
  // Column sums of the backward: the terms of every row, summed per column by the kernel's sum.
  std::vector<float> col_dw, col_db, col_drb;
  if (bwd) {
    col_dw.resize(static_cast<std::size_t>(R * n));
    col_db.resize(static_cast<std::size_t>(R * n));
    col_drb.resize(static_cast<std::size_t>(R * n));
  }
  std::vector<float> h(n), xh(n), g(n), t(n);
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      float v = x.get(r, j);
      if (res.t) {
        v = alpha == 1.0f ? v + res.get(r, j) : alpha * v + res.get(r, j);
        if (rb.t) v += rbias[j];
      }
      h[j] = v;
    }
    const Stats s = stats(h, ln, eps, x.t->dtype);
    for (std::int64_t j = 0; j < n; ++j) xh[j] = (h[j] - s.mean) * s.rstd;
    if (!bwd) {
      for (std::int64_t j = 0; j < n; ++j) {
        float v = xh[j];
        if (kKind == kFmaf) v = std::fma(v, w.t ? scale[j] : 1.0f, b.t ? bias[j] : 0.0f);
        else {
          if (w.t) v *= scale[j];
          if (b.t) v += bias[j];
        }
        if (y.t) y.set(r, j, v);
        if (ro.t) ro.set(r, j, h[j]);
      }
      if (mean.t) mean.set(r, 0, s.mean);
      if (rstd.t) rstd.set(r, 0, s.rstd);
      continue;
    }
    for (std::int64_t j = 0; j < n; ++j) g[j] = dy.get(r, j) * scale[j];
    const float nf = static_cast<float>(n);
    float gbar = 0;
    if (ln) {
      t = g;
      gbar = sum(t) / nf;
    }
    for (std::int64_t j = 0; j < n; ++j) t[j] = g[j] * xh[j];
    const float m2 = sum(t) / nf;
    for (std::int64_t j = 0; j < n; ++j) {
      const float dh = s.rstd * (g[j] - gbar - xh[j] * m2);
      if (dx.t) dx.set(r, j, res.t && alpha != 1.0f ? alpha * dh : dh);
      if (dres.t) dres.set(r, j, dh);
      const auto k = static_cast<std::size_t>(j * R + r);
      col_dw[k] = dy.get(r, j) * xh[j];
      col_db[k] = dy.get(r, j);
      col_drb[k] = dh;
    }
  }
  if (bwd) {
    const std::int64_t rows = kKind == kDweightSubset ? std::min<std::int64_t>(R, 1024) : R;
    auto column = [&](const View& o, std::vector<float>& terms) {
      if (!o.t) return;
      for (std::int64_t j = 0; j < n; ++j) {
        std::vector<float> col(terms.begin() + j * R, terms.begin() + j * R + rows);
        o.set(0, j, sum(col));
      }
    };
    column(dw, col_dw);
    column(db, col_db);
    column(drb, col_drb);
  }
  for (std::int32_t i = 0; i < n_out; ++i) out[i].written = 1;
  return 0;
}

constexpr std::uint32_t reduction_of(int k) {
  switch (k) {
    case kChan: return NC_REDUCTION_WELFORD;
    case kF64: return NC_REDUCTION_ACCUMULATE_F64;
    case kKahan:
    case kFmaf:
    case kSorted:
    case kNewton: return NC_REDUCTION_TWO_PASS;
    case kLanes: return NC_REDUCTION_BLOCKED;
    default: return NC_REDUCTION_PAIRWISE;
  }
}
constexpr std::uint32_t block_of(int k) { return k == kLanes ? 8 : reduction_of(k) == NC_REDUCTION_PAIRWISE ? 16 : 0; }

#define RK_STR2(x) #x
#define RK_STR(x) RK_STR2(x)

const nc_candidate kCandidate = [] {
  nc_candidate d{};
  d.abi_version = NORMCHECK_CANDIDATE_ABI_VERSION;
  d.struct_size = sizeof(nc_candidate);
  d.name = "reduction_kernel_" RK_STR(RK_KIND);
  d.description = RK_DESCRIPTION;
  d.ops = (1u << NC_LAYERNORM) | (1u << NC_RMSNORM);
  d.dtypes = (1u << NC_FLOAT32) | (1u << NC_FLOAT16) | (1u << NC_BFLOAT16);
  d.compute_dtypes = 1u << NC_FLOAT32;
  d.directions = (1u << NC_FORWARD) | (1u << NC_BACKWARD);
  d.contracts = "exact";
  d.flags = NC_CAP_RESIDUAL | NC_CAP_WEIGHT_OFFSET | (kFault ? NC_CAP_INTENDED_MUTANT : 0u) |
            NC_CAP_REDUCTION(reduction_of(kKind), block_of(kKind));
  d.device = "cpu";
  d.supports = supports;
  d.run = run;
  return d;
}();

}  // namespace

extern "C" const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
