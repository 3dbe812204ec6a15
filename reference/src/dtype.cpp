#include "normcheck/reference/dtype.hpp"

#include <bit>
#include <cfenv>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace normcheck::ref {

std::optional<DType> parse_dtype(std::string_view n) {
  if (auto t = enum_parse<DType>(n)) return t;
  if (n == "f64" || n == "double") return DType::float64;
  if (n == "f32" || n == "float") return DType::float32;
  if (n == "f16" || n == "half") return DType::float16;
  if (n == "bf16") return DType::bfloat16;
  return std::nullopt;
}

double unit_roundoff(DType t) { return std::ldexp(1.0, -format_of(t).precision); }

double max_finite(DType t) {
  switch (t) {
    case DType::float64: return std::numeric_limits<double>::max();
    case DType::float32: return 0x1.fffffep127;
    case DType::float16: return 65504.0;
    case DType::bfloat16: return 0x1.fep127;
  }
  return 0;
}

double round_to(double v, DType t) {
  if (t == DType::float64 || !std::isfinite(v) || v == 0.0) return v;
  const Format f = format_of(t);
  const auto u = std::bit_cast<std::uint64_t>(v);
  const int biased = static_cast<int>((u >> 52) & 0x7ff);
  if (biased - 1023 >= f.min_exp) {
    // Normal in the target: round the binary64 significand to `precision` bits, nearest-even,
    // on the bits (a carry into the exponent is the correct result).
    const int shift = 53 - f.precision;
    const std::uint64_t lsb = (u >> shift) & 1;
    const std::uint64_t r = (u + ((std::uint64_t{1} << (shift - 1)) - 1) + lsb) & ~((std::uint64_t{1} << shift) - 1);
    const double rv = std::bit_cast<double>(r);
    if (std::fabs(rv) > max_finite(t)) return std::copysign(std::numeric_limits<double>::infinity(), v);
    return rv;
  }
  // Subnormal in the target: the ulp is fixed at 2^(min_exp - precision + 1). v * 2^-q is
  // exact, and nearbyint in the default mode rounds to the nearest integer, ties to even.
  const int q = f.min_exp - (f.precision - 1);
  return std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
}

double round_toward_zero(double v, DType t) {
  if (!std::isfinite(v) || v == 0) return v;
  // The nearest value, or its neighbour toward zero where the nearest is farther from zero than
  // v (rounding_gap's `below` is half the spacing toward zero).
  const double a = std::fabs(v);
  double r = round_to(a, t);
  if (std::isinf(r))
    r = max_finite(t);
  else if (r > a)
    r -= 2 * rounding_gap(r, t).below;
  return std::copysign(r, v);
}

bool representable(double v, DType t) {
  if (t == DType::float32) return static_cast<double>(static_cast<float>(v)) == v || v != v;
  if (t == DType::float64 || !std::isfinite(v) || v == 0.0) return true;
  const Format f = format_of(t);
  const auto u = std::bit_cast<std::uint64_t>(v);
  if (static_cast<int>((u >> 52) & 0x7ff) - 1023 >= f.min_exp) {
    // Normal in the target: the significand bits below its precision must be zero.
    const std::uint64_t low = (std::uint64_t{1} << (53 - f.precision)) - 1;
    return (u & low) == 0 && std::fabs(v) <= max_finite(t);
  }
  return round_to(v, t) == v;
}

RoundingGap rounding_gap_general(double t, DType fmt) {
  const Format f = format_of(fmt);
  const double min_sub = std::ldexp(1.0, f.min_exp - f.precision + 1);
  if (t == 0.0) return {min_sub / 2, min_sub / 2};
  int e = 0;
  const double m = std::frexp(std::fabs(t), &e);
  const int q = std::max(e - 1, f.min_exp) - (f.precision - 1);
  const double half_ulp = std::ldexp(1.0, q - 1);
  // At a power of two above the subnormal range the next value toward zero is half an ulp
  // away, so the boundary on that side is a quarter ulp away.
  const bool binade_start = (m == 0.5) && (e - 1 > f.min_exp);
  const double toward_zero = binade_start ? half_ulp / 2 : half_ulp;
  if (t > 0) return {toward_zero, half_ulp};
  return {half_ulp, toward_zero};
}

std::string hex_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string decimal_text(double v, DType t) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  // At least as many digits as the integer part has, so that 1000 prints as 1000, not 1e+03.
  int first = 1;
  for (double a = std::fabs(v); a >= 10 && first < 17; a /= 10) ++first;
  for (int digits = first; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    const double back = std::strtod(buf, nullptr);
    if (back == v || (t != DType::float64 && round_to(back, t) == v)) return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::size_t storage_bytes(DType t) {
  switch (t) {
    case DType::float64: return 8;
    case DType::float32: return 4;
    case DType::float16:
    case DType::bfloat16: return 2;
  }
  return 8;
}

namespace {

// binary16 bits of a value of binary16: every step is exact.
std::uint16_t half_bits(double v) {
  const auto sign = static_cast<std::uint16_t>(std::signbit(v) ? 0x8000 : 0);
  const double a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a == 0) return sign;
  int ex = 0;
  std::frexp(a, &ex);  // a in [2^(ex-1), 2^ex)
  if (ex - 1 < -14) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
  const auto mant = static_cast<std::uint16_t>(std::ldexp(a, 11 - ex) - 1024);  // 10 bits below the leading 1
  return static_cast<std::uint16_t>(sign | ((ex - 1 + 15) << 10) | mant);
}

double half_value(std::uint16_t b) {
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  const int e = (b >> 10) & 0x1f;
  const int m = b & 0x3ff;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

}  // namespace

std::uint64_t storage_bits(double v, DType t) {
  switch (t) {
    case DType::float64: return std::isnan(v) ? 0x7ff8000000000000u : std::bit_cast<std::uint64_t>(v);
    case DType::float32: return std::isnan(v) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(static_cast<float>(v));
    case DType::float16: return std::isnan(v) ? 0x7e00u : half_bits(v);
    // A bfloat16 value is a binary32 whose low 16 bits are zero.
    case DType::bfloat16:
      return std::isnan(v) ? 0x7fc0u : std::bit_cast<std::uint32_t>(static_cast<float>(v)) >> 16;
  }
  return 0;
}

double from_storage_bits(std::uint64_t bits, DType t) {
  switch (t) {
    case DType::float64: return std::bit_cast<double>(bits);
    case DType::float32: return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    case DType::float16: return half_value(static_cast<std::uint16_t>(bits));
    case DType::bfloat16: return std::bit_cast<float>(static_cast<std::uint32_t>(bits & 0xffffu) << 16);
  }
  return 0;
}

void store_native(double v, DType t, void* out) {
  const std::uint64_t bits = storage_bits(v, t);
  switch (storage_bytes(t)) {
    case 8: std::memcpy(out, &bits, 8); return;
    case 4: {
      const auto b = static_cast<std::uint32_t>(bits);
      std::memcpy(out, &b, 4);
      return;
    }
    default: {
      const auto b = static_cast<std::uint16_t>(bits);
      std::memcpy(out, &b, 2);
      return;
    }
  }
}

void load_native_array(const unsigned char* in, std::size_t n, DType t, double* out) {
  if (t == DType::float64) {
    std::memcpy(out, in, 8 * n);
    return;
  }
  if (t == DType::float32) {
    for (std::size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, in + 4 * i, 4);
      out[i] = f;
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = load_native(in + storage_bytes(t) * i, t);
}

double load_native(const void* in, DType t) {
  switch (storage_bytes(t)) {
    case 8: {
      std::uint64_t b;
      std::memcpy(&b, in, 8);
      return from_storage_bits(b, t);
    }
    case 4: {
      std::uint32_t b;
      std::memcpy(&b, in, 4);
      return from_storage_bits(b, t);
    }
    default: {
      std::uint16_t b;
      std::memcpy(&b, in, 2);
      return from_storage_bits(b, t);
    }
  }
}

}  // namespace normcheck::ref
