// Floating-point formats of the suite and exact rounding into them.
//
// Every value of every supported format (binary64, binary32, binary16, bfloat16) is exactly a
// binary64 value, so tensors hold their elements as `double` together with a DType tag; a
// value is "in" a dtype when rounding it to that dtype leaves it unchanged.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "normcheck/reference/enum_table.hpp"

namespace normcheck::ref {

enum class DType : std::uint8_t { float64, float32, float16, bfloat16 };

// IEEE-style binary format: `precision` significand bits (hidden bit included); the smallest
// positive normal is 2^min_exp and the largest finite is (2 - 2^(1-precision)) * 2^max_exp.
struct Format {
  int precision;
  int min_exp;
  int max_exp;
};

constexpr Format format_of(DType t) {
  switch (t) {
    case DType::float64: return {53, -1022, 1023};
    case DType::float32: return {24, -126, 127};
    case DType::float16: return {11, -14, 15};
    case DType::bfloat16: return {8, -126, 127};
  }
  return {53, -1022, 1023};
}

// The value table (enum_table.hpp): the canonical names, which files and messages use.
template <>
struct EnumTable<DType> {
  static constexpr std::array rows{Named<DType>{DType::float64, "float64"}, Named<DType>{DType::float32, "float32"},
                                   Named<DType>{DType::float16, "float16"}, Named<DType>{DType::bfloat16, "bfloat16"}};
};

inline std::string_view name_of(DType t) { return enum_name(t); }
// A canonical name, or one of the aliases f64/double, f32/float, f16/half, bf16 that the CLI
// and case JSON accept (fixture attributes take the canonical names only).
std::optional<DType> parse_dtype(std::string_view name);
// Unit roundoff u = 2^-precision of the format (half an ulp of 1).
double unit_roundoff(DType t);
// Largest finite value of the format.
double max_finite(DType t);

// Round a binary64 value to `t` with round-to-nearest-even, gradual underflow and overflow to
// infinity, exactly (no double rounding: the input is exact). NaN and infinities pass through.
double round_to(double v, DType t);
// The same with rounding toward zero (a truncating conversion that cuts the extra significand
// bits), exactly; beyond the largest finite value, that value. NaN, infinities and zeros pass
// through. For the faults that truncate (the fp16_output_truncated mutant and its dialect).
double round_toward_zero(double v, DType t);
bool representable(double v, DType t);

// Distances from a value `t` of the format to the rounding boundaries around it: values within
// (t - below, t + above) round to t (boundaries themselves go to the even neighbour).
// Both are powers of two. For t = max finite, `above` is half an ulp (beyond it: infinity).
struct RoundingGap {
  double below;
  double above;
};
RoundingGap rounding_gap_general(double t, DType fmt);  // the definition, for any t
// The same gap from t's bits where t and the gap are normal binary64 values (the decisions of
// the fast paths ask it for every element); anything else goes to rounding_gap_general.
inline RoundingGap rounding_gap(double t, DType fmt) {
  const auto bits = std::bit_cast<std::uint64_t>(t);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  const Format f = format_of(fmt);
  const int e = biased - 1023;                           // 2^e <= |t| < 2^(e+1)
  const int h = (e > f.min_exp ? e : f.min_exp) - f.precision;  // half an ulp is 2^h
  if (biased == 0 || biased == 0x7ff || h < -1022) return rounding_gap_general(t, fmt);
  const double half_ulp = std::bit_cast<double>(static_cast<std::uint64_t>(h + 1023) << 52);
  // At a power of two above the subnormal range the next value toward zero is half an ulp away.
  const bool binade_start = (bits & 0xfffffffffffffULL) == 0 && e > f.min_exp;
  const double toward_zero = binade_start ? half_ulp / 2 : half_ulp;
  if (t > 0) return {toward_zero, half_ulp};
  return {half_ulp, toward_zero};
}

// Storage of a value of the format (HDF5 datasets, plugin buffers, protocol payloads): its size
// in bytes, and its bit pattern in the low storage_bytes(t) bytes (float16 and bfloat16 as their
// 16-bit patterns). `v` must be a value of `t`; NaN is stored as the format's canonical quiet
// NaN (sign clear). from_storage_bits is exact.
std::size_t storage_bytes(DType t);
std::uint64_t storage_bits(double v, DType t);
double from_storage_bits(std::uint64_t bits, DType t);
// The same in memory, in the machine's byte order (as a double, float or uint16_t lies there).
void store_native(double v, DType t, void* out);
double load_native(const void* in, DType t);
// Arrays of n values, dense, in the machine's byte order: store_native / load_native of each,
// float32 and float64 without a call per element (the transports move millions of them). An
// element that is not exactly a value of float32/float64 (NaN included) is left to `other(i)`,
// which stores it (and may check it); 16-bit dtypes go to `other` for every element.
template <class Other>
void store_native_array(const double* v, std::size_t n, DType t, unsigned char* out, Other&& other) {
  for (std::size_t i = 0; i < n; ++i) {
    if (t == DType::float64 && v[i] == v[i]) {
      std::memcpy(out + 8 * i, &v[i], 8);
      continue;
    }
    if (t == DType::float32) {
      const float f = static_cast<float>(v[i]);  // exact where it compares equal: no mode applies
      if (static_cast<double>(f) == v[i]) {
        std::memcpy(out + 4 * i, &f, 4);
        continue;
      }
    }
    other(i);
  }
}
// load_native of n dense elements into out[0..n).
void load_native_array(const unsigned char* in, std::size_t n, DType t, double* out);

// Hex-float text of a binary64 value ("0x1.8p+0"; "nan", "inf", "-inf"), and the shortest
// decimal text that reads back to the same value of dtype `t`.
std::string hex_text(double v);
std::string decimal_text(double v, DType t);

}  // namespace normcheck::ref
