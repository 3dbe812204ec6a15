#include "quant_wire.hpp"

#include <fmt/core.h>

#include <cmath>
#include <stdexcept>

#include "normcheck/reference/quant.hpp"

namespace normcheck::conf::wire {

namespace {

bool is_nvfp4(std::string_view codes) { return codes == ref::name_of(ref::QFormat::nvfp4_e2m1); }

}  // namespace

std::string_view name_of(Storage s) { return s == Storage::int8 ? "int8" : "uint8"; }

CodeLayout layout_of(const ref::OutputSpec& spec) {
  CodeLayout l;
  l.storage = spec.codes == ref::name_of(ref::QFormat::int8) ? Storage::int8 : Storage::uint8;
  l.shape = spec.shape;
  l.packed = is_nvfp4(spec.codes);
  if (l.packed) {
    if (l.shape.empty() || l.shape.back() % 2 != 0)
      throw std::invalid_argument(fmt::format("NVFP4 codes need an even last dim (two codes a byte)"));
    l.shape.back() /= 2;
  }
  l.bytes = 1;
  for (const auto e : l.shape) l.bytes *= e;
  return l;
}

std::vector<std::int64_t> unpacked_shape(std::string_view codes, const std::vector<std::int64_t>& wire_shape) {
  std::vector<std::int64_t> s = wire_shape;
  if (is_nvfp4(codes) && !s.empty()) s.back() *= 2;
  return s;
}

ref::Tensor from_bytes(const ref::OutputSpec& spec, const std::uint8_t* bytes) {
  const CodeLayout l = layout_of(spec);
  ref::Tensor t{ref::DType::float64, spec.shape, {}};
  if (l.packed) {  // the fixtures' packing (ref::unpack_nvfp4: element 2k in the low nibble)
    const auto codes = ref::unpack_nvfp4(std::vector<std::uint8_t>(bytes, bytes + l.bytes));
    t.data.assign(codes.begin(), codes.end());
    return t;
  }
  t.data.resize(static_cast<std::size_t>(l.bytes));
  for (std::size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = l.storage == Storage::int8 ? static_cast<double>(static_cast<std::int8_t>(bytes[i])) : bytes[i];
  return t;
}

std::vector<std::uint8_t> to_bytes(const ref::OutputSpec& spec, const ref::Tensor& t) {
  const CodeLayout l = layout_of(spec);
  const double lo = l.packed ? 0 : l.storage == Storage::int8 ? -128 : 0;
  const double hi = l.packed ? 15 : l.storage == Storage::int8 ? 127 : 255;
  const std::size_t n = static_cast<std::size_t>(l.bytes * (l.packed ? 2 : 1));
  if (t.data.size() != n)
    throw std::domain_error(fmt::format("{} codes for a shape of {} elements", t.data.size(), n));
  for (std::size_t i = 0; i < n; ++i) {
    const double v = t.data[i];
    if (!(v >= lo && v <= hi && v == std::floor(v)))
      throw std::domain_error(fmt::format("element {} ({}) is not a {} code ({} to {})", i, v, spec.codes, lo, hi));
  }
  if (l.packed) return ref::pack_nvfp4(std::vector<int>(t.data.begin(), t.data.end()));
  std::vector<std::uint8_t> out(static_cast<std::size_t>(l.bytes));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::uint8_t>(static_cast<int>(t.data[i]) & 0xFF);  // int8: two's complement
  return out;
}

}  // namespace normcheck::conf::wire
