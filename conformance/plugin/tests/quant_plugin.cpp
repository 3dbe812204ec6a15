// A fused RMSNorm + quantization plugin written from candidate.h alone (nc_quant), for the
// transport's tests: static per-tensor FP8 (E4M3FN, E5M2; reciprocal, divide or multiply, amax),
// MXFP8 (E4M3, E5M2; the OCP floor and the round-up rule) and NVFP4 (packed two codes a byte).
// The norm is evaluated in binary64 and rounded once to the dtype the contract quantizes; the
// quantization follows reference/README.md ("Quantized outputs") in float32 arithmetic, with a
// converter to the code formats built here from their bit layouts. One source, several
// plugins (tests/CMakeLists.txt):
//   (none)                 correct: conforms on the quant tier (conformance.plugin.quant_tier)
//   QUANT_WRONG            every nonzero finite code of q moved to its neighbour: must FAIL
//   QUANT_UNPACKED         NVFP4 codes written one a byte (past the end of the packed buffer)
//   QUANT_CHANGES_DTYPE    sets q's nc_tensor dtype to NC_FLOAT32 (as if it returned floats)
//   QUANT_OLD_DESCRIPTOR   a descriptor as a plugin built before nc_quant: struct_size ends
//                          before quant_formats, so the host must not see quantization
//   QUANT_BAD_BITS         quant_formats with a bit of no format: refused at load
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "normcheck/candidate.h"

namespace {

// ---- element access -------------------------------------------------------------------------
double half_to_double(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
double load(const nc_tensor& t, std::int64_t off) {
  switch (t.dtype) {
    case NC_FLOAT64: return static_cast<const double*>(t.data)[off];
    case NC_FLOAT32: return static_cast<const float*>(t.data)[off];
    case NC_FLOAT16: return half_to_double(static_cast<const std::uint16_t*>(t.data)[off]);
    default: {
      const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(t.data)[off]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
}
// Round a binary64 value to nearest even with `prec` significand bits and smallest normal
// exponent `emin` (overflow to infinity at `emax`).
double round_fmt(double v, int prec, int emin, int emax) {
  if (!std::isfinite(v) || v == 0) return v;
  const int e = std::max(std::ilogb(v), emin);
  const double q = std::ldexp(1.0, e - prec + 1);
  const double r = std::nearbyint(v / q) * q;
  const double max = std::ldexp(2.0 - std::ldexp(1.0, 1 - prec), emax);
  if (std::fabs(r) > max) return std::copysign(INFINITY, v);
  return r;
}
double round_to(double v, int dtype) {
  switch (dtype) {
    case NC_FLOAT32: return static_cast<float>(v);
    case NC_FLOAT16: return round_fmt(v, 11, -14, 15);
    case NC_BFLOAT16: return round_fmt(v, 8, -126, 127);
    default: return v;
  }
}
void store(const nc_tensor& t, std::int64_t off, double v) {  // v is a value of t's dtype
  switch (t.dtype) {
    case NC_FLOAT64: static_cast<double*>(t.data)[off] = v; return;
    case NC_FLOAT32: static_cast<float*>(t.data)[off] = static_cast<float>(v); return;
    case NC_BFLOAT16: {
      const float f = static_cast<float>(v);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      static_cast<std::uint16_t*>(t.data)[off] = static_cast<std::uint16_t>(bits >> 16);
      return;
    }
    default: {  // float16 from an exact value
      std::uint16_t h = std::signbit(v) ? 0x8000 : 0;
      const double a = std::fabs(v);
      if (std::isnan(v)) h = 0x7E00;
      else if (std::isinf(a)) h |= 0x7C00;
      else if (a < std::ldexp(1.0, -14)) h |= static_cast<std::uint16_t>(a / std::ldexp(1.0, -24));
      else {
        const int e = std::ilogb(a);
        h |= static_cast<std::uint16_t>(((e + 15) << 10) | (static_cast<int>(a / std::ldexp(1.0, e - 10)) - 1024));
      }
      static_cast<std::uint16_t*>(t.data)[off] = h;
    }
  }
}
// Offset of element (row, col) of a tensor whose last dim is the column: row is the flat index
// over the other dims, unravelled with the tensor's strides.
std::int64_t offset(const nc_tensor& t, std::int64_t row, std::int64_t col) {
  std::int64_t off = col * t.strides[t.rank - 1];
  for (int d = t.rank - 2; d >= 0; --d) {
    off += (row % t.shape[d]) * t.strides[d];
    row /= t.shape[d];
  }
  return off;
}

// ---- code formats ---------------------------------------------------------------------------
struct Mini {
  int man, bias;
  double max;
  int nan, sign;
};
constexpr Mini kE4M3{3, 7, 448, 0x7F, 0x80}, kE5M2{2, 15, 57344, 0x7F, 0x80}, kE2M1{1, 1, 6, -1, 0x8};

// cvt.rn.satfinite: round to nearest even, saturating to the largest finite value.
int to_mini(double v, const Mini& m) {
  if (std::isnan(v)) return m.nan >= 0 ? m.nan : 0;
  const int sign = std::signbit(v) ? m.sign : 0;
  const double a = std::min(std::fabs(v), m.max);
  const int binade = a == 0 ? 1 - m.bias : std::max(std::ilogb(a), 1 - m.bias);
  const double quantum = std::ldexp(1.0, binade - m.man);
  const double r = std::min(std::nearbyint(a / quantum) * quantum, m.max);
  if (r == 0) return sign;
  const int e = std::ilogb(r);
  if (e < 1 - m.bias) return sign | static_cast<int>(r / std::ldexp(1.0, 1 - m.bias - m.man));
  return sign | ((e + m.bias) << m.man) | (static_cast<int>(r / std::ldexp(1.0, e - m.man)) - (1 << m.man));
}
double from_e4m3(int code) {
  const int mag = code & 0x7F, e = mag >> 3, f = mag & 7;
  if (mag == 0x7F) return NAN;
  const double v = e == 0 ? std::ldexp(f, -9) : std::ldexp(8 + f, e - 10);
  return code & 0x80 ? -v : v;
}

#if defined(QUANT_WRONG)
// The deliberate fault: the magnitude's last bit flipped, so each nonzero finite code becomes
// its neighbour (one code up or down).
int wrong(int code, const Mini& m) {
  const int mag = code & (m.sign - 1);
  if (mag == 0 || mag == m.nan) return code;
  return code ^ 1;
}
#endif

float amax_of(const std::vector<float>& p, std::size_t first, std::size_t n, bool* finite) {
  float a = 0;
  for (std::size_t i = first; i < first + n; ++i) {
    if (!std::isfinite(p[i])) *finite = false;
    a = std::fmax(a, std::fabs(p[i]));
  }
  return a;
}

nc_named_tensor* find(nc_named_tensor* ts, int32_t n, const char* name) {
  for (int32_t i = 0; i < n; ++i)
    if (std::strcmp(ts[i].name, name) == 0) return &ts[i];
  return nullptr;
}
const nc_tensor* find_in(const nc_named_tensor* ts, int32_t n, const char* name) {
  for (int32_t i = 0; i < n; ++i)
    if (std::strcmp(ts[i].name, name) == 0) return &ts[i].tensor;
  return nullptr;
}

int supports(void*, const nc_case* c, char* reason, size_t len) {
  if (c->struct_size < offsetof(nc_case, quant) + sizeof(c->quant) || !c->quant) {
    std::snprintf(reason, len, "quantized cases only");
    return 1;
  }
  if (c->affine == NC_AFFINE_WEIGHT_BIAS) {
    std::snprintf(reason, len, "no bias");
    return 1;
  }
  return 0;
}

int run(void*, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs, nc_named_tensor* outputs,
        int32_t n_outputs, char* err, size_t err_len) {
  const nc_quant& q = *c->quant;
  const nc_tensor* x = find_in(inputs, n_inputs, "x");
  const nc_tensor* w = find_in(inputs, n_inputs, "weight");
  nc_named_tensor* qo = find(outputs, n_outputs, "q");
  if (!x || !qo) {
    std::snprintf(err, err_len, "no x input or q output");
    return 1;
  }
  const std::int64_t cols = c->shape[c->rank - 1];
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < c->rank; ++d) rows *= c->shape[d];
  // p: the norm output rounded to the dtype the contract quantizes.
  const int pdtype = q.value == NC_QV_FLOAT32 ? NC_FLOAT32 : c->dtype_out;
  std::vector<float> p(static_cast<std::size_t>(rows * cols));
  std::vector<double> y(p.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double v = load(*x, offset(*x, r, j));
      ss += v * v;
    }
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(cols) + c->epsilon);
    for (std::int64_t j = 0; j < cols; ++j) {
      double v = load(*x, offset(*x, r, j)) * rs;
      if (w) v *= load(*w, j * w->strides[0]);
      y[static_cast<std::size_t>(r * cols + j)] = v;
      p[static_cast<std::size_t>(r * cols + j)] = static_cast<float>(round_to(v, pdtype));
    }
  }
  const Mini m = q.format == NC_Q_NVFP4_E2M1 ? kE2M1
                 : (q.format == NC_Q_FLOAT8_E5M2 || q.format == NC_Q_MXFP8_E5M2) ? kE5M2
                                                                                  : kE4M3;
  const std::size_t total = p.size();
  std::vector<int> codes(total);
  auto put = [&](std::size_t i, float u) { codes[i] = to_mini(u, m); };
  std::vector<int> block_codes;
  std::vector<float> block_amax;  // MX: amax per block
  const int bs = q.scale == NC_QS_MX_BLOCK ? 32 : q.scale == NC_QS_NVFP4_BLOCK ? 16 : 0;
  float amax_all = 0;
  bool fin_all = true;
  switch (q.scale) {
    case NC_QS_STATIC_TENSOR: {
      const nc_tensor* st = find_in(inputs, n_inputs, "scale");
      const float s = static_cast<const float*>(st->data)[0];
      for (std::size_t i = 0; i < total; ++i)
        put(i, q.apply == NC_QA_RECIPROCAL ? p[i] * (1.0f / s) : q.apply == NC_QA_DIVIDE ? p[i] / s : p[i] * s);
      amax_all = amax_of(p, 0, total, &fin_all);
      break;
    }
    case NC_QS_MX_BLOCK: {
      const int emax = m.man == 3 ? 8 : 15;
      for (std::size_t b = 0; b < total / 32; ++b) {
        bool fin = true;
        const float a = amax_of(p, b * 32, 32, &fin);
        block_amax.push_back(a);
        int e8 = 0xFF;
        if (fin && q.mx_rule == NC_QMX_FLOOR) {
          const int e = (a == 0 ? -126 : std::ilogb(a)) - emax;
          e8 = e > 127 ? 0xFF : std::max(e, -127) + 127;
        } else if (fin) {
          const float t = a * (1.0f / static_cast<float>(m.max));
          if (std::isinf(t)) e8 = 0xFE;
          else if (t <= std::ldexp(1.0f, -127)) e8 = 0;
          else {
            int e = 0;
            const float fr = std::frexp(t, &e);
            e8 = std::min(fr == 0.5f ? e - 1 : e, 127) + 127;
          }
        }
        block_codes.push_back(e8);
        for (std::size_t i = b * 32; i < (b + 1) * 32; ++i) put(i, e8 == 0xFF ? NAN : std::ldexp(p[i], 127 - e8));
      }
      break;
    }
    case NC_QS_NVFP4_BLOCK: {
      amax_all = amax_of(p, 0, total, &fin_all);
      float s_enc = amax_all == 0 ? 1.0f : std::fmin(448.0f * 6.0f / amax_all, FLT_MAX);
      if (s_enc == 0 || !std::isfinite(s_enc)) s_enc = 1.0f;
      if (nc_named_tensor* g = find(outputs, n_outputs, "global_scale")) {
        static_cast<float*>(g->tensor.data)[0] = s_enc;
        g->written = 1;
      }
      for (std::size_t b = 0; b < total / 16; ++b) {
        bool fin = true;
        const float ab = amax_of(p, b * 16, 16, &fin);
        const int sc = to_mini(ab * (s_enc * (1.0f / 6.0f)), kE4M3);
        block_codes.push_back(sc);
        const float t = static_cast<float>(from_e4m3(sc)) * (1.0f / s_enc);
        const float mult = t == 0 ? 0.0f : std::fmin(1.0f / t, FLT_MAX);
        for (std::size_t i = b * 16; i < (b + 1) * 16; ++i) put(i, p[i] * mult);
      }
      break;
    }
    default:
      std::snprintf(err, err_len, "scale kind %d not implemented", q.scale);
      return 1;
  }
#if defined(QUANT_WRONG)
  for (auto& code : codes) code = wrong(code, m);
#endif

  // q: one byte a code, NVFP4 two a byte (element 2k in the low nibble), dense as allocated.
  nc_tensor& qt = qo->tensor;
  auto* qb = static_cast<std::uint8_t*>(qt.data);
  if (q.format == NC_Q_NVFP4_E2M1) {
#if defined(QUANT_UNPACKED)
    for (std::size_t i = 0; i < total; ++i) qb[i] = static_cast<std::uint8_t>(codes[i]);
#else
    for (std::size_t i = 0; i < total / 2; ++i) qb[i] = static_cast<std::uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
#endif
  } else {
    for (std::size_t i = 0; i < total; ++i) qb[i] = static_cast<std::uint8_t>(codes[i]);
  }
#if defined(QUANT_CHANGES_DTYPE)
  qt.dtype = NC_FLOAT32;
#endif
  qo->written = 1;
  if (nc_named_tensor* s = find(outputs, n_outputs, "scale"); s && bs) {
    auto* sb = static_cast<std::uint8_t*>(s->tensor.data);
    for (std::size_t b = 0; b < block_codes.size(); ++b) sb[b] = static_cast<std::uint8_t>(block_codes[b]);
    s->written = 1;
  }
  if (nc_named_tensor* a = find(outputs, n_outputs, "amax")) {  // [1] static and NVFP4, per block MX
    auto* ab = static_cast<float*>(a->tensor.data);
    if (bs == 32)
      for (std::size_t b = 0; b < block_amax.size(); ++b) ab[b] = block_amax[b];
    else
      ab[0] = amax_all;
    a->written = 1;
  }
  if (nc_named_tensor* yo = find(outputs, n_outputs, "y")) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j)
        store(yo->tensor, offset(yo->tensor, r, j), round_to(y[static_cast<std::size_t>(r * cols + j)], c->dtype_out));
    yo->written = 1;
  }
  return 0;
}

nc_candidate make_descriptor() {
  nc_candidate d{};
  d.abi_version = NORMCHECK_CANDIDATE_ABI_VERSION;
  d.struct_size = sizeof(nc_candidate);
#if defined(QUANT_OLD_DESCRIPTOR)
  d.struct_size = offsetof(nc_candidate, quant_formats);  // as a plugin built before nc_quant
#endif
  d.name = "quant_plugin";
#if defined(QUANT_WRONG)
  d.description = "fused RMSNorm + FP8/MXFP8/NVFP4 quantization with every nonzero code moved to its neighbour";
  d.flags = NC_CAP_INTENDED_MUTANT;
#else
  d.description = "fused RMSNorm + static FP8, MXFP8 and NVFP4 quantization (the transport's test plugin)";
#endif
  d.ops = 1u << NC_RMSNORM;
  d.dtypes = (1u << NC_FLOAT32) | (1u << NC_FLOAT16) | (1u << NC_BFLOAT16);
  d.compute_dtypes = 1u << NC_FLOAT32;
  d.directions = 1u << NC_FORWARD;
  d.contracts = "exact";
  d.supports = supports;
  d.run = run;
  d.quant_formats = (1u << NC_Q_FLOAT8_E4M3FN) | (1u << NC_Q_FLOAT8_E5M2) | (1u << NC_Q_MXFP8_E4M3) |
                    (1u << NC_Q_MXFP8_E5M2) | (1u << NC_Q_NVFP4_E2M1);
  d.quant_scales = (1u << NC_QS_STATIC_TENSOR) | (1u << NC_QS_MX_BLOCK) | (1u << NC_QS_NVFP4_BLOCK);
#if defined(QUANT_BAD_BITS)
  d.quant_formats |= 1u << 9;
#endif
  return d;
}

const nc_candidate kCandidate = make_descriptor();

}  // namespace

const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
