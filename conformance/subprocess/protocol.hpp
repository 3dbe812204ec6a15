// The `normcheck-subprocess` protocol (conformance/PROTOCOL.md), the parts both roles share:
// tensor encoding, header fields, the case and the capabilities as JSON. Internal to the
// subprocess transport; the host is subprocess_candidate.cpp, the child serve.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/conformance/capabilities_json.hpp"
#include "normcheck/reference/case.hpp"
#include "quant_wire.hpp"

namespace normcheck::conf::proto {

inline constexpr std::string_view kName = "normcheck-subprocess";
inline constexpr int kVersion = 1;
// A header is at most this long, line feed included: it holds metadata only, and the bound
// keeps a child that writes garbage without a line feed from growing the host's buffer.
inline constexpr std::size_t kMaxHeaderBytes = std::size_t{1} << 20;

// A message that breaks PROTOCOL.md. The stream cannot be trusted after it.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor entry of a header, checked: known dtype, dims >= 0, rank <= 8, at most 2^31
// elements, nbytes == elements * ref::storage_bytes(dtype).
// A code tensor (a quantized case's `q` or block `scale`) has dtype `uint8` or `int8`:
// `codes` is set and `dtype` is meaningless; each element is one byte (quant_wire.hpp).
struct TensorEntry {
  std::string name;
  ref::DType dtype = ref::DType::float32;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::size_t nbytes = 0;
  std::optional<wire::Storage> codes;
};
// "float32", or "uint8" / "int8" for codes.
std::string dtype_text(const TensorEntry& e);
// `where` names the list in messages ("outputs[1]"). Throws ProtocolError.
TensorEntry parse_entry(const nlohmann::json& j, const std::string& where);
// The tensor list `field` of a header ("inputs", "outputs"); missing is an error.
std::vector<TensorEntry> parse_entries(const nlohmann::json& header, const char* field);
nlohmann::json entry_json(const std::string& name, const ref::Tensor& t);

// Encodes n values of dtype t as little-endian bytes into out (n * ref::storage_bytes(t) bytes). Values
// must belong to the dtype; with `check`, one that does not throws std::domain_error naming its
// index (a served candidate's output), otherwise it is rounded to nearest even first.
void encode(const double* v, std::size_t n, ref::DType t, unsigned char* out, bool check = false);
// Decodes an entry's payload exactly into binary64 values (code entries: each byte's value,
// int8 signed; NVFP4 bytes are not unpacked here, wire::from_bytes does that).
ref::Tensor decode(const TensorEntry& e, const unsigned char* bytes);

// The `case` object of a run request: every case attribute, norm_dims, and *_hex forms.
nlohmann::json case_json(const ref::Case& c);
// Its inverse (attributes only; the inputs come from the payload). Throws ProtocolError.
ref::Case case_from_json(const nlohmann::json& j);

// The hello's capabilities are written from the one table (capabilities_json.hpp) and read
// back over it here. Missing fields keep Capabilities' defaults; unknown names in lists are skipped. Throws
// ProtocolError for a wrong JSON type.
Capabilities capabilities_from_json(const nlohmann::json& j);
using conf::capabilities_json;

// The request's `outputs`: a code output as it crosses the wire (dtype uint8/int8, NVFP4's last
// dim halved) with `codes` naming its format and, for NVFP4, `packing`; read back into the
// in-memory spec (float64 codes, the unpacked shape).
nlohmann::json output_specs_json(const std::map<std::string, OutputSpec>& specs);
std::map<std::string, OutputSpec> output_specs_from_json(const nlohmann::json& header);
// A result's entry and payload for an output as the request asked for it (codes packed).
// Throws std::domain_error for a value that is not one of its dtype (or not a code).
nlohmann::json result_entry_json(const std::string& name, const OutputSpec& spec, const ref::Tensor& t);
std::vector<unsigned char> result_payload(const OutputSpec& spec, const ref::Tensor& t);

// One header line: compact JSON and '\n'. Invalid UTF-8 in strings (an error message from a
// C library) is replaced rather than thrown on: the message still gets through.
std::string header_line(const nlohmann::json& j);
// Parses a header line (without its '\n'); it must be a JSON object with a string `type`.
nlohmann::json parse_header(std::string_view line);

// "[2, 4]"
std::string shape_text(const std::vector<std::int64_t>& shape);

}  // namespace normcheck::conf::proto
