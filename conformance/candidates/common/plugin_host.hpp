// Host-side helpers shared by the bundled hardware plugins (onednn/, opencl/, cuda/): finding
// named tensors, the row/column geometry of a case, exact widening of float16/bfloat16 and
// correct rounding (round to nearest, ties to even) into every dtype, and packing strided host
// tensors into the dense [rows, cols] buffers a device kernel reads.
//
// Header-only and free of the rest of normcheck on purpose: a plugin is a candidate under test,
// so it must not borrow the reference's rounding (a shared bug would then pass unnoticed).
// The rounding here is integer arithmetic on the bits, so it does not depend on the caller's
// rounding mode.
#pragma once

#include <bit>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "normcheck/candidate.h"

namespace normcheck::plugin_host {

// The named tensor of a list, or nullptr when the case has none.
inline nc_named_tensor* find(const nc_named_tensor* list, std::int32_t n, std::string_view name) {
  for (std::int32_t i = 0; i < n; ++i)
    if (name == list[i].name) return const_cast<nc_named_tensor*>(&list[i]);
  return nullptr;
}

// Writes a reason, printf-style, and returns 1: `return decline(reason, reason_len, "...", ...);`
// in a plugin's supports().
[[gnu::format(printf, 3, 4)]] inline int decline(char* reason, std::size_t reason_len, const char* format,
                                                 ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(reason, reason_len, format, args);
  va_end(args);
  return 1;
}

inline std::size_t size_of(std::int32_t dtype) {
  switch (dtype) {
    case NC_FLOAT64: return 8;
    case NC_FLOAT32: return 4;
    case NC_UINT8:
    case NC_INT8: return 1;  // codes of quantized outputs (candidate.h nc_quant)
    default: return 2;
  }
}

inline const char* dtype_name(std::int32_t dtype) {
  switch (dtype) {
    case NC_FLOAT64: return "float64";
    case NC_FLOAT32: return "float32";
    case NC_FLOAT16: return "float16";
    case NC_BFLOAT16: return "bfloat16";
  }
  return "?";
}

// ---- Exact widening -------------------------------------------------------------------------

inline float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t{b} << 16); }

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp == 0) {
    if (man == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalize (the value m * 2^-24 is a normal float).
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while (!(man & 0x400u));
    return std::bit_cast<float>(sign | ((127u - 15u - static_cast<std::uint32_t>(e)) << 23) |
                                ((man & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 127u - 15u) << 23) | (man << 13));
}

// The value of element `off` of a tensor of `dtype`, exactly, as a binary64.
inline double load(const void* data, std::int32_t dtype, std::int64_t off) {
  switch (dtype) {
    case NC_FLOAT64: return static_cast<const double*>(data)[off];
    case NC_FLOAT32: return static_cast<const float*>(data)[off];
    case NC_FLOAT16: return half_to_float(static_cast<const std::uint16_t*>(data)[off]);
    default: return bf16_to_float(static_cast<const std::uint16_t*>(data)[off]);
  }
}

// ---- Correct rounding -----------------------------------------------------------------------

// Rounds a binary64 to the binary format with `man_bits` stored mantissa bits and `exp_bits`
// exponent bits (float16: 10/5, bfloat16: 7/8, float32: 23/8), to nearest, ties to even, with
// gradual underflow and overflow to infinity; returns the format's bit pattern. One rounding
// from the binary64 value: never through float32, which would round twice.
inline std::uint64_t round_bits(double v, int man_bits, int exp_bits) {
  const std::uint64_t b = std::bit_cast<std::uint64_t>(v);
  const std::uint64_t sign = (b >> 63) << (man_bits + exp_bits);
  const int e = static_cast<int>((b >> 52) & 0x7ff);
  const std::uint64_t m = b & ((std::uint64_t{1} << 52) - 1);
  const std::uint64_t exp_all = (std::uint64_t{1} << exp_bits) - 1;
  if (e == 0x7ff) {  // inf stays inf; NaN becomes the quiet NaN (payload not kept)
    const std::uint64_t quiet = m ? std::uint64_t{1} << (man_bits - 1) : 0;
    return sign | (exp_all << man_bits) | quiet;
  }
  if (e == 0) return sign;  // binary64 subnormals lie far below every target's subnormals
  const int bias = static_cast<int>(exp_all >> 1);
  int ue = e - 1023;
  const std::uint64_t full = (std::uint64_t{1} << 52) | m;
  // Bits dropped: 52 - man_bits for a normal result, more for a subnormal one.
  int shift = 52 - man_bits;
  const bool subnormal = ue < 1 - bias;
  if (subnormal) shift += (1 - bias) - ue;
  if (shift > 54) return sign;  // below half the smallest subnormal: rounds to zero
  std::uint64_t r = full >> shift;
  const std::uint64_t rem = full & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) ++r;
  if (subnormal) return sign | r;  // r == 2^man_bits encodes the smallest normal: still right
  if (r == (std::uint64_t{1} << (man_bits + 1))) {  // carried into the next binade
    r >>= 1;
    ++ue;
  }
  const int field = ue + bias;
  if (field >= static_cast<int>(exp_all)) return sign | (exp_all << man_bits);  // overflow
  return sign | (static_cast<std::uint64_t>(field) << man_bits) | (r & ((std::uint64_t{1} << man_bits) - 1));
}

inline std::uint16_t to_half(double v) { return static_cast<std::uint16_t>(round_bits(v, 10, 5)); }
inline std::uint16_t to_bf16(double v) { return static_cast<std::uint16_t>(round_bits(v, 7, 8)); }
inline float to_float(double v) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(round_bits(v, 23, 8)));
}

// Stores v into element `off` of a tensor of `dtype`, rounded once.
inline void store(void* data, std::int32_t dtype, std::int64_t off, double v) {
  switch (dtype) {
    case NC_FLOAT64: static_cast<double*>(data)[off] = v; break;
    case NC_FLOAT32: static_cast<float*>(data)[off] = to_float(v); break;
    case NC_FLOAT16: static_cast<std::uint16_t*>(data)[off] = to_half(v); break;
    default: static_cast<std::uint16_t*>(data)[off] = to_bf16(v); break;
  }
}

// ---- Geometry -------------------------------------------------------------------------------

// A case as rows x cols: the rows run over the dims that are not normalized, the columns over
// the normalized ones, both in row-major order. That is the order of `mean`/`rstd` (x's shape
// with the normalized dims set to 1) and of `weight`/`bias` (the normalized dims' extents).
struct Geometry {
  std::int64_t rows = 1, cols = 1;
  std::vector<int> row_dims, col_dims;  // dims of x
};

inline Geometry geometry_of(const nc_case& c) {
  Geometry g;
  std::vector<bool> norm(static_cast<std::size_t>(c.rank), false);
  for (std::int32_t i = 0; i < c.n_norm_dims; ++i) norm[static_cast<std::size_t>(c.norm_dims[i])] = true;
  for (int d = 0; d < c.rank; ++d) {
    if (norm[static_cast<std::size_t>(d)]) {
      g.col_dims.push_back(d);
      g.cols *= c.shape[d];
    } else {
      g.row_dims.push_back(d);
      g.rows *= c.shape[d];
    }
  }
  return g;
}

// The element offsets, in t's strides, of the row-major enumeration of t's dims `dims`.
inline std::vector<std::int64_t> offsets(const nc_tensor& t, const std::vector<int>& dims) {
  std::int64_t count = 1;
  for (int d : dims) count *= t.shape[d];
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  std::vector<std::int64_t> idx(dims.size(), 0);
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    out[static_cast<std::size_t>(i)] = off;
    // Odometer increment over dims, last fastest.
    for (std::size_t k = dims.size(); k-- > 0;) {
      const int d = dims[k];
      off += t.strides[d];
      if (++idx[k] < t.shape[d]) break;
      off -= idx[k] * t.strides[d];
      idx[k] = 0;
    }
  }
  return out;
}

// Offsets of every element of a tensor shaped like x (rows x cols), or of a parameter (its
// shape is the normalized extents: cols only), or of a statistic (rows only).
struct Layout {
  std::vector<std::int64_t> row, col;
};

inline Layout x_layout(const nc_tensor& t, const Geometry& g) {
  return {offsets(t, g.row_dims), offsets(t, g.col_dims)};
}

inline Layout param_layout(const nc_tensor& t) {
  std::vector<int> all(static_cast<std::size_t>(t.rank));
  for (int d = 0; d < t.rank; ++d) all[static_cast<std::size_t>(d)] = d;
  return {{0}, offsets(t, all)};
}

inline Layout stat_layout(const nc_tensor& t, const Geometry& g) { return {offsets(t, g.row_dims), {0}}; }

inline Layout layout_of(const nc_tensor& t, const Geometry& g, std::string_view name) {
  if (name == "weight" || name == "bias" || name == "residual_bias" || name == "dweight" || name == "dbias" ||
      name == "dresidual_bias")
    return param_layout(t);
  if (name == "mean" || name == "rstd") return stat_layout(t, g);
  return x_layout(t, g);
}

// Packs t into a dense row-major array of T (float, double), converting each value exactly
// (or, for a float64 input into float, rounding it once: the conversion a kernel would do).
// True when the columns are the elements 0, 1, 2 ... of each row (the usual dense layout), so
// that a row can be copied in one piece.
inline bool contiguous(const Layout& l) {
  for (std::size_t k = 0; k < l.col.size(); ++k)
    if (l.col[k] != static_cast<std::int64_t>(k)) return false;
  return true;
}

template <class T>
void gather(const nc_tensor& t, const Layout& l, T* dst) {
  const bool same = (t.dtype == NC_FLOAT32 && sizeof(T) == 4) || (t.dtype == NC_FLOAT64 && sizeof(T) == 8);
  if (same && contiguous(l)) {  // no conversion: plain row copies
    for (std::int64_t r : l.row) {
      std::memcpy(dst, static_cast<const T*>(t.data) + r, l.col.size() * sizeof(T));
      dst += l.col.size();
    }
    return;
  }
  std::size_t k = 0;
  for (std::int64_t r : l.row)
    for (std::int64_t c : l.col) dst[k++] = static_cast<T>(load(t.data, t.dtype, r + c));
}

// Unpacks a dense row-major array of T into t, rounding each value once to t's dtype.
template <class T>
void scatter(const T* src, const Layout& l, nc_tensor& t) {
  const bool same = (t.dtype == NC_FLOAT32 && sizeof(T) == 4) || (t.dtype == NC_FLOAT64 && sizeof(T) == 8);
  if (same && contiguous(l)) {
    for (std::int64_t r : l.row) {
      std::memcpy(static_cast<T*>(t.data) + r, src, l.col.size() * sizeof(T));
      src += l.col.size();
    }
    return;
  }
  std::size_t k = 0;
  for (std::int64_t r : l.row)
    for (std::int64_t c : l.col) store(t.data, t.dtype, r + c, static_cast<double>(src[k++]));
}

// Raw copies, bytes unchanged: for kernels that read and write the tensor's own dtype.
inline void gather_raw(const nc_tensor& t, const Layout& l, void* dst) {
  const std::size_t es = size_of(t.dtype);
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(t.data);
  const bool rows_whole = contiguous(l);
  for (std::int64_t r : l.row) {
    if (rows_whole) {
      std::memcpy(out, in + static_cast<std::size_t>(r) * es, l.col.size() * es);
      out += l.col.size() * es;
      continue;
    }
    for (std::int64_t c : l.col) {
      std::memcpy(out, in + static_cast<std::size_t>(r + c) * es, es);
      out += es;
    }
  }
}

inline void scatter_raw(const void* src, const Layout& l, nc_tensor& t) {
  const std::size_t es = size_of(t.dtype);
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(t.data);
  const bool rows_whole = contiguous(l);
  for (std::int64_t r : l.row) {
    if (rows_whole) {
      std::memcpy(out + static_cast<std::size_t>(r) * es, in, l.col.size() * es);
      in += l.col.size() * es;
      continue;
    }
    for (std::int64_t c : l.col) {
      std::memcpy(out + static_cast<std::size_t>(r + c) * es, in, es);
      in += es;
    }
  }
}

// ---- Precision contracts --------------------------------------------------------------------

// The rounding points of a contract spec ("exact", "llama", "a+b"; reference/README.md,
// "Precision contracts"): the dtype each point rounds to, or -1 where it does not round.
struct RoundingPoints {
  std::int32_t h = -1, xhat = -1, scale = -1, mul = -1;
  bool ok = true;  // false: a part this plugin does not know
};

inline RoundingPoints rounding_points(const nc_case& c) {
  RoundingPoints p;
  std::string_view spec = c.contract ? c.contract : "exact";
  while (true) {
    const auto plus = spec.find('+');
    const std::string_view part = spec.substr(0, plus);
    if (part == "exact") {
    } else if (part == "llama") {
      p.xhat = c.dtype_x;
    } else if (part == "gemma" || part == "te") {
      p.scale = c.dtype_compute;
    } else if (part == "te_wdtype") {
      p.scale = c.dtype_param;
    } else if (part == "onnx") {
      p.xhat = c.dtype_x;
      p.mul = c.dtype_x;
    } else if (part == "fused_add_lowp") {
      p.h = c.dtype_residual;
    } else {
      p.ok = false;
    }
    if (plus == std::string_view::npos) break;
    spec.remove_prefix(plus + 1);
  }
  return p;
}

}  // namespace normcheck::plugin_host
