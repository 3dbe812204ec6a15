#include "protocol.hpp"

#include <fmt/core.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "normcheck/conformance/capabilities_json.hpp"
#include "normcheck/reference/case_json.hpp"
#include "normcheck/reference/dtype.hpp"
#include "normcheck/reference/quant.hpp"

namespace normcheck::conf::proto {

using nlohmann::json;

namespace {

// Little-endian by construction, whatever the host's byte order: the protocol fixes it.
void store_le(std::uint64_t bits, std::size_t bytes, unsigned char* out) {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(bits >> (8 * i));
}
std::uint64_t load_le(const unsigned char* in, std::size_t bytes) {
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < bytes; ++i) bits |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return bits;
}


template <class Enum>
Enum parse_enum(const json& j, const char* field) {
  if (!j.is_string()) throw ProtocolError(fmt::format("case.{} must be a string", field));
  const auto s = j.get<std::string>();
  if (auto v = ref::enum_parse<Enum>(s)) return *v;
  throw ProtocolError(fmt::format("case.{}: unknown value '{}'", field, s));
}

ref::DType dtype_field(const json& j, const std::string& field) {
  if (!j.is_string()) throw ProtocolError(fmt::format("{} must be a string", field));
  const auto t = ref::parse_dtype(j.get<std::string>());
  if (!t) throw ProtocolError(fmt::format("{}: unknown dtype '{}'", field, j.get<std::string>()));
  return *t;
}

const json& required(const json& j, const char* field, const char* where) {
  auto it = j.find(field);
  if (it == j.end()) throw ProtocolError(fmt::format("{} has no '{}'", where, field));
  return *it;
}

std::int64_t int_field(const json& j, const char* field) {
  if (!j.is_number_integer()) throw ProtocolError(fmt::format("case.{} must be an integer", field));
  return j.get<std::int64_t>();
}

// A binary64 attribute: the exact hex string when present, else the JSON number.
double real_field(const json& c, const char* field) {
  const std::string hex = std::string(field) + "_hex";
  if (auto it = c.find(hex); it != c.end()) {
    if (!it->is_string()) throw ProtocolError(fmt::format("case.{} must be a string", hex));
    if (auto v = ref::parse_number(it->get<std::string>(), ref::DType::float64)) return *v;
    throw ProtocolError(fmt::format("case.{}: '{}' is not a number", hex, it->get<std::string>()));
  }
  const json& v = required(c, field, "case");
  if (!v.is_number()) throw ProtocolError(fmt::format("case.{} must be a number", field));
  return v.get<double>();
}

std::vector<std::int64_t> shape_field(const json& j, const std::string& where) {
  if (!j.is_array()) throw ProtocolError(fmt::format("{}.shape must be an array", where));
  if (j.size() > static_cast<std::size_t>(ref::kMaxRank))
    throw ProtocolError(fmt::format("{}.shape has rank {} (at most {})", where, j.size(), ref::kMaxRank));
  std::vector<std::int64_t> shape;
  for (const auto& d : j) {
    if (!d.is_number_integer()) throw ProtocolError(fmt::format("{}.shape holds a non-integer", where));
    if (d.is_number_unsigned() && d.get<std::uint64_t>() > static_cast<std::uint64_t>(ref::kMaxElements))
      throw ProtocolError(fmt::format("{}.shape: dim {} is too large", where, d.get<std::uint64_t>()));
    const auto v = d.get<std::int64_t>();
    if (v < 0) throw ProtocolError(fmt::format("{}.shape has a negative dim ({})", where, v));
    shape.push_back(v);
  }
  return shape;
}

// An element of a capability list by its name: an enum's table name (a dtype also by the
// aliases parse_dtype takes), a contract as it is.
template <class T>
std::optional<T> capability_item(const std::string& s) {
  if constexpr (std::is_same_v<T, std::string>) return s;
  else if constexpr (std::is_same_v<T, ref::DType>) return ref::parse_dtype(s);
  else return ref::enum_parse<T>(s);
}

}  // namespace


std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string dtype_text(const TensorEntry& e) {
  return e.codes ? std::string(wire::name_of(*e.codes)) : std::string(ref::name_of(e.dtype));
}

namespace {

// The storage of a code tensor by its dtype name, if it is one.
std::optional<wire::Storage> code_storage(const json& j) {
  if (!j.is_string()) return std::nullopt;
  const auto s = j.get<std::string>();
  if (s == "uint8") return wire::Storage::uint8;
  if (s == "int8") return wire::Storage::int8;
  return std::nullopt;
}

}  // namespace

TensorEntry parse_entry(const json& j, const std::string& where) {
  if (!j.is_object()) throw ProtocolError(fmt::format("{} must be an object", where));
  TensorEntry e;
  const json& name = required(j, "name", where.c_str());
  if (!name.is_string() || name.get<std::string>().empty())
    throw ProtocolError(fmt::format("{}.name must be a non-empty string", where));
  e.name = name.get<std::string>();
  const std::string at = fmt::format("{} ('{}')", where, e.name);
  const json& dt = required(j, "dtype", at.c_str());
  e.codes = code_storage(dt);
  if (!e.codes) e.dtype = dtype_field(dt, at + ".dtype");
  e.shape = shape_field(required(j, "shape", at.c_str()), at);
  e.numel = 1;
  for (auto d : e.shape) {
    // Checked before multiplying, so that no product overflows.
    if (d != 0 && e.numel > ref::kMaxElements / d)
      throw ProtocolError(fmt::format("{}: shape {} has more than 2^31 elements", at, shape_text(e.shape)));
    e.numel *= d;
  }
  const json& nb = required(j, "nbytes", at.c_str());
  if (!nb.is_number_integer() || nb.get<std::int64_t>() < 0)
    throw ProtocolError(fmt::format("{}.nbytes must be a non-negative integer", at));
  e.nbytes = static_cast<std::size_t>(e.numel) * (e.codes ? 1 : ref::storage_bytes(e.dtype));
  if (nb.get<std::uint64_t>() != e.nbytes)
    throw ProtocolError(fmt::format("{}: nbytes {} does not match shape {} of {} ({} bytes)", at,
                                    nb.get<std::uint64_t>(), shape_text(e.shape), dtype_text(e), e.nbytes));
  return e;
}

std::vector<TensorEntry> parse_entries(const json& header, const char* field) {
  const json& list = required(header, field, "the header");
  if (!list.is_array()) throw ProtocolError(fmt::format("'{}' must be an array", field));
  std::vector<TensorEntry> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto e = parse_entry(list[i], fmt::format("{}[{}]", field, i));
    for (const auto& prev : out)
      if (prev.name == e.name) throw ProtocolError(fmt::format("'{}' lists '{}' twice", field, e.name));
    out.push_back(std::move(e));
  }
  return out;
}

json entry_json(const std::string& name, const ref::Tensor& t) {
  return {{"name", name},
          {"dtype", ref::name_of(t.dtype)},
          {"shape", t.shape},
          {"nbytes", static_cast<std::uint64_t>(t.data.size() * ref::storage_bytes(t.dtype))}};
}

void encode(const double* v, std::size_t n, ref::DType t, unsigned char* out, bool check) {
  auto value = [&](std::size_t i) {
    if (check && !std::isnan(v[i]) && !ref::representable(v[i], t))
      throw std::domain_error(
          fmt::format("element {} ({}) is not a {} value", i, ref::hex_text(v[i]), ref::name_of(t)));
    return t == ref::DType::float64 ? v[i] : ref::round_to(v[i], t);
  };
  const std::size_t size = ref::storage_bytes(t);
  auto general = [&](std::size_t i) { store_le(ref::storage_bits(value(i), t), size, out + size * i); };
  // The wire is little-endian: on such a host, the machine's order (exact float32/float64 values
  // in one loop; anything else, NaN or a value to round, through the general path).
  if constexpr (std::endian::native == std::endian::little) {
    ref::store_native_array(v, n, t, out, general);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) general(i);
}

ref::Tensor decode(const TensorEntry& e, const unsigned char* bytes) {
  ref::Tensor t;
  t.dtype = e.codes ? ref::DType::float64 : e.dtype;
  t.shape = e.shape;
  const auto n = static_cast<std::size_t>(e.numel);
  t.data.resize(n);
  if (e.codes) {
    for (std::size_t i = 0; i < n; ++i)
      t.data[i] = *e.codes == wire::Storage::int8 ? static_cast<double>(static_cast<std::int8_t>(bytes[i])) : bytes[i];
    return t;
  }
  const std::size_t size = ref::storage_bytes(e.dtype);
  if constexpr (std::endian::native == std::endian::little) {
    ref::load_native_array(bytes, n, e.dtype, t.data.data());
    return t;
  }
  for (std::size_t i = 0; i < n; ++i) t.data[i] = ref::from_storage_bits(load_le(bytes + size * i, size), e.dtype);
  return t;
}

json case_json(const ref::Case& c) {
  json j;
  if (!c.id.empty()) j["case_id"] = c.id;
  j["op"] = ref::name_of(c.op);
  j["axis"] = c.axis;
  if (c.axes) j["axes"] = *c.axes;
  j["norm_dims"] = ref::geometry_of(c).norm_dims;
  const auto real = [&](const char* field, double v) {
    // NaN and infinities have no JSON number: the _hex form carries them.
    j[field] = std::isfinite(v) ? json(v) : json(nullptr);
    j[std::string(field) + "_hex"] = ref::hex_text(v);
  };
  real("epsilon", c.epsilon);
  j["affine"] = ref::name_of(c.affine);
  real("weight_offset", c.weight_offset);
  j["residual"] = ref::name_of(c.residual);
  real("alpha", c.alpha);
  j["block"] = ref::name_of(c.block);
  j["layers"] = c.layers;
  j["activation"] = ref::name_of(c.activation);
  j["direction"] = ref::name_of(c.direction);
  j["contract"] = c.contract;
  j["dtype_x"] = ref::name_of(c.dtype_x);
  j["dtype_param"] = ref::name_of(c.dtype_param);
  j["dtype_out"] = ref::name_of(c.dtype_out);
  j["dtype_compute"] = ref::name_of(c.dtype_compute);
  j["dtype_residual"] = ref::name_of(c.dtype_residual);
  if (c.quant) {  // PROTOCOL.md "Quantized cases": CASE_JSON.md's quant object, every field given
    const ref::QuantContract& q = *c.quant;
    json qj;
    qj["format"] = ref::name_of(q.format);
    qj["scale"] = ref::name_of(q.scale);
    qj["residual_sum"] = ref::name_of(q.residual_sum);
    qj["value"] = ref::name_of(q.value);
    qj["apply"] = ref::name_of(q.apply);
    qj["mx_rule"] = ref::name_of(q.mx_rule);
    qj["nan"] = ref::name_of(q.nan);
    for (const auto& [field, v] : {std::pair{"scale_ub", q.scale_ub}, std::pair{"min_scale", q.min_scale}}) {
      qj[field] = std::isfinite(v) ? json(v) : json(nullptr);
      qj[std::string(field) + "_hex"] = ref::hex_text(v);
    }
    json outs = json::array();
    if (q.amax) outs.push_back("amax");
    if (q.y) outs.push_back("y");
    qj["outputs"] = std::move(outs);
    qj["preset"] = q.preset;
    j["quant"] = std::move(qj);
  }
  return j;
}

ref::Case case_from_json(const json& j) {
  if (!j.is_object()) throw ProtocolError("'case' must be an object");
  ref::Case c;
  if (auto it = j.find("case_id"); it != j.end() && it->is_string()) c.id = it->get<std::string>();
  c.op = parse_enum<ref::Op>(required(j, "op", "case"), "op");
  c.axis = int_field(required(j, "axis", "case"), "axis");
  if (auto it = j.find("axes"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) throw ProtocolError("case.axes must be an array");
    std::vector<std::int64_t> axes;
    for (const auto& a : *it) axes.push_back(int_field(a, "axes"));
    c.axes = std::move(axes);
  }
  c.epsilon = real_field(j, "epsilon");
  c.affine = parse_enum<ref::Affine>(required(j, "affine", "case"), "affine");
  c.weight_offset = real_field(j, "weight_offset");
  c.residual = parse_enum<ref::Residual>(required(j, "residual", "case"), "residual");
  c.alpha = real_field(j, "alpha");
  c.block = parse_enum<ref::Block>(required(j, "block", "case"), "block");
  c.layers = int_field(required(j, "layers", "case"), "layers");
  c.activation = parse_enum<ref::Activation>(required(j, "activation", "case"), "activation");
  c.direction = parse_enum<ref::Direction>(required(j, "direction", "case"), "direction");
  const json& contract = required(j, "contract", "case");
  if (!contract.is_string()) throw ProtocolError("case.contract must be a string");
  c.contract = contract.get<std::string>();
  c.dtype_x = dtype_field(required(j, "dtype_x", "case"), "case.dtype_x");
  c.dtype_param = dtype_field(required(j, "dtype_param", "case"), "case.dtype_param");
  c.dtype_out = dtype_field(required(j, "dtype_out", "case"), "case.dtype_out");
  c.dtype_compute = dtype_field(required(j, "dtype_compute", "case"), "case.dtype_compute");
  c.dtype_residual = dtype_field(required(j, "dtype_residual", "case"), "case.dtype_residual");
  if (auto it = j.find("quant"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw ProtocolError("case.quant must be an object");
    // CASE_JSON.md's reader, given the exact forms of the two numbers and no preset (every
    // field is present; the preset is provenance only).
    json q = json::object();
    for (const char* f : {"format", "scale", "residual_sum", "value", "apply", "mx_rule", "nan", "outputs"})
      if (it->contains(f)) q[f] = (*it)[f];
    for (const char* f : {"scale_ub", "min_scale"}) {
      const json quant_case = *it;
      if (it->contains(f) || it->contains(std::string(f) + "_hex")) q[f] = ref::hex_text(real_field(quant_case, f));
    }
    try {
      c.quant = ref::quant_from_json(q);
    } catch (const std::exception& e) {
      throw ProtocolError(fmt::format("case.{}", e.what()));
    }
    if (auto p = it->find("preset"); p != it->end() && p->is_string()) c.quant->preset = p->get<std::string>();
  }
  return c;
}

Capabilities capabilities_from_json(const json& j) {
  Capabilities caps;
  if (j.is_null()) return caps;
  if (!j.is_object()) throw ProtocolError("'capabilities' must be an object");
  for_each_capability(caps, [&]<class T>(const CapabilityField& f, T& out) {
    auto it = j.find(std::string(f.name));
    if (it == j.end()) return;  // absent: the default
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw ProtocolError(fmt::format("capabilities.{} must be true or false", f.name));
      out = it->template get<bool>();
    } else if constexpr (std::is_same_v<T, Reduction>) {
      if (!it->is_string())
        throw ProtocolError(fmt::format("capabilities.{} must be a string such as \"pairwise:128\"", f.name));
      try {
        out = parse_reduction(it->template get<std::string>());
      } catch (const std::invalid_argument& e) {
        throw ProtocolError(fmt::format("capabilities.{}: {}", f.name, e.what()));
      }
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) throw ProtocolError(fmt::format("capabilities.{} must be a string", f.name));
      out = it->template get<std::string>();
    } else {
      using Item = typename T::value_type;
      if (!it->is_array()) throw ProtocolError(fmt::format("capabilities.{} must be an array of strings", f.name));
      T items;
      for (const auto& v : *it) {
        if (!v.is_string()) throw ProtocolError(fmt::format("capabilities.{} must be an array of strings", f.name));
        if (auto x = capability_item<Item>(v.template get<std::string>())) items.push_back(*x);  // unknown: skipped
      }
      out = std::move(items);
    }
  });
  return caps;
}

json output_specs_json(const std::map<std::string, OutputSpec>& specs) {
  json a = json::array();
  for (const auto& [name, s] : specs) {
    if (s.codes.empty()) {
      a.push_back({{"name", name}, {"dtype", ref::name_of(s.dtype)}, {"shape", s.shape}});
      continue;
    }
    const wire::CodeLayout l = wire::layout_of(s);
    json e = {{"name", name}, {"dtype", wire::name_of(l.storage)}, {"shape", l.shape}, {"codes", s.codes}};
    if (l.packed) e["packing"] = "low_nibble_first";
    a.push_back(std::move(e));
  }
  return a;
}

json result_entry_json(const std::string& name, const OutputSpec& spec, const ref::Tensor& t) {
  if (spec.codes.empty()) return entry_json(name, t);
  const wire::CodeLayout l = wire::layout_of(spec);
  return {{"name", name}, {"dtype", wire::name_of(l.storage)}, {"shape", l.shape}, {"nbytes", l.bytes}};
}

std::vector<unsigned char> result_payload(const OutputSpec& spec, const ref::Tensor& t) {
  if (!spec.codes.empty()) {
    auto bytes = wire::to_bytes(spec, t);
    return {bytes.begin(), bytes.end()};
  }
  std::vector<unsigned char> out(t.data.size() * ref::storage_bytes(t.dtype));
  encode(t.data.data(), t.data.size(), t.dtype, out.data(), /*check=*/true);
  return out;
}

std::map<std::string, OutputSpec> output_specs_from_json(const json& header) {
  const json& list = required(header, "outputs", "the request");
  if (!list.is_array()) throw ProtocolError("'outputs' must be an array");
  std::map<std::string, OutputSpec> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("outputs[{}]", i);
    const json& e = list[i];
    if (!e.is_object()) throw ProtocolError(where + " must be an object");
    const json& name = required(e, "name", where.c_str());
    if (!name.is_string()) throw ProtocolError(where + ".name must be a string");
    const json& dt = required(e, "dtype", where.c_str());
    if (code_storage(dt)) {  // codes: the in-memory spec (float64 codes, unpacked shape)
      const json& codes = required(e, "codes", where.c_str());
      if (!codes.is_string() || !(ref::parse_qformat(codes.get<std::string>()) || codes == "e8m0"))
        throw ProtocolError(where + ".codes must name a code format");
      const auto fmt_name = codes.get<std::string>();
      out[name.get<std::string>()] = {ref::DType::float64,
                                      wire::unpacked_shape(fmt_name, shape_field(required(e, "shape", where.c_str()), where)),
                                      fmt_name};
      continue;
    }
    out[name.get<std::string>()] = {dtype_field(dt, where + ".dtype"), shape_field(required(e, "shape", where.c_str()), where)};
  }
  return out;
}

std::string header_line(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + '\n';
}

json parse_header(std::string_view line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    constexpr std::size_t kShown = 120;
    std::string shown(line.substr(0, kShown));
    for (auto& ch : shown)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    throw ProtocolError(fmt::format("header is not JSON: '{}'{}", shown, line.size() > kShown ? "..." : ""));
  }
  if (!j.is_object()) throw ProtocolError("header is not a JSON object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) throw ProtocolError("header has no string 'type'");
  return j;
}

}  // namespace normcheck::conf::proto
