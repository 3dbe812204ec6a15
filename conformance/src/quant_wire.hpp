// How a quantized output crosses a transport (candidate.h nc_quant, PROTOCOL.md "Quantized
// cases"): as fixtures/SCHEMA.md stores it. In memory (ref::Outputs) a code output holds one code
// per element as an exact integer (OutputSpec::codes names its format); on the wire it is one
// byte per code, uint8 (int8 for the int8 format), NVFP4 packed two codes per byte along the last
// dim, element 2k in the low nibble. Internal to conformance/ (the plugin and subprocess
// transports, serve.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/reference/outputs.hpp"

namespace normcheck::conf::wire {

// The byte storage of a code output.
enum class Storage { uint8, int8 };
std::string_view name_of(Storage s);  // "uint8", "int8"

struct CodeLayout {
  Storage storage = Storage::uint8;
  std::vector<std::int64_t> shape;  // on the wire: NVFP4's last dim halved
  bool packed = false;              // NVFP4: two codes a byte, low nibble first
  std::int64_t bytes = 0;           // product of shape
};
// The layout of a code output (spec.codes non-empty). Throws std::invalid_argument for an NVFP4
// output whose last dim is odd (validate() rejects such cases).
CodeLayout layout_of(const ref::OutputSpec& spec);
// The spec's shape from a wire shape (NVFP4: the last dim doubled), for the child side of the
// protocol, which learns its outputs from the request.
std::vector<std::int64_t> unpacked_shape(std::string_view codes, const std::vector<std::int64_t>& wire_shape);

// The in-memory tensor (float64 codes, the spec's shape) of `bytes` (layout_of(spec).bytes of
// them): int8 bytes are read as signed, NVFP4 bytes unpacked.
ref::Tensor from_bytes(const ref::OutputSpec& spec, const std::uint8_t* bytes);
// The wire bytes of an in-memory code tensor. Throws std::domain_error naming the first element
// that is not an integer code of the storage (0..255, -128..127, NVFP4 0..15).
std::vector<std::uint8_t> to_bytes(const ref::OutputSpec& spec, const ref::Tensor& t);

}  // namespace normcheck::conf::wire
