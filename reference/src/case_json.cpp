#include "normcheck/reference/case_json.hpp"

#include <cmath>
#include <limits>

#include "exact.hpp"

namespace normcheck::ref {
namespace {

using nlohmann::json;

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

template <typename Enum>
Enum parse_enum(const json& j, const char* field) {
  if (!j.is_string()) throw CaseError(field, "must be a string");
  const auto s = j.get<std::string>();
  if (auto v = enum_parse<Enum>(s)) return *v;
  throw CaseError(field, "'" + s + "' is not one of: " + enum_names_text<Enum>());
}

DType parse_dtype_field(const json& j, const char* field) {
  if (!j.is_string()) throw CaseError(field, "must be a string");
  auto t = parse_dtype(j.get<std::string>());
  if (!t) throw CaseError(field, "'" + j.get<std::string>() + "' is not one of: " + enum_names_text<DType>());
  return *t;
}

double parse_element(const json& v, DType t, const std::string& field) {
  if (v.is_number()) return round_to(v.get<double>(), t);
  if (v.is_string()) {
    if (auto d = parse_number(v.get<std::string>(), t)) return *d;
    throw CaseError(field, "'" + v.get<std::string>() + "' is not a number");
  }
  throw CaseError(field, "must be a number or a string holding one");
}

double parse_scalar(const json& j, const char* field) {
  return parse_element(j, DType::float64, field);
}

std::int64_t parse_int(const json& j, const char* field) {
  if (!j.is_number_integer()) throw CaseError(field, "must be an integer");
  return j.get<std::int64_t>();
}

Tensor parse_tensor(const json& j, DType t, const std::string& name) {
  const std::string field = "inputs/" + name;
  if (!j.is_object()) throw CaseError(field, "must be an object {\"shape\": [...], \"data\": [...]}");
  Tensor out;
  out.dtype = t;
  if (!j.contains("shape") || !j["shape"].is_array()) throw CaseError(field + "/shape", "missing or not an array");
  for (const auto& d : j["shape"]) out.shape.push_back(parse_int(d, (field + "/shape").c_str()));
  if (!j.contains("data") || !j["data"].is_array()) throw CaseError(field + "/data", "missing or not an array");
  const auto& data = j["data"];
  if (out.shape.size() > static_cast<size_t>(kMaxRank)) throw CaseError(field + "/shape", "rank exceeds 8");
  std::int64_t n = 1;
  for (auto d : out.shape) {
    if (d < 1 || d > kMaxElements || n > kMaxElements / d) throw CaseError(field + "/shape", "dimension out of range");
    n *= d;
  }
  if (static_cast<std::int64_t>(data.size()) != n)
    throw CaseError(field + "/data", std::to_string(data.size()) + " values for " + std::to_string(n) + " elements");
  out.data.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i)
    out.data.push_back(parse_element(data[i], t, field + "/data[" + std::to_string(i) + "]"));
  return out;
}

json values_json(const std::vector<double>& v) {
  json a = json::array();
  for (double x : v) a.push_back(hex_text(x));
  return a;
}

}  // namespace

QuantContract quant_from_json(const json& j) {
  if (!j.is_object()) throw CaseError("quant", "must be an object");
  static const std::array<std::string_view, 11> known{"preset", "format",    "scale",     "residual_sum",
                                                      "value",  "apply",     "mx_rule",   "nan",
                                                      "scale_ub", "min_scale", "outputs"};
  for (const auto& [k, v] : j.items())
    if (std::find(known.begin(), known.end(), k) == known.end()) throw CaseError("quant/" + k, "unknown field");
  QuantContract q;
  if (j.contains("preset")) {
    if (!j["preset"].is_string()) throw CaseError("quant/preset", "must be a string");
    auto p = quant_preset(j["preset"].get<std::string>());
    if (!p) {
      std::string names;
      for (const auto& [n, v] : quant_presets()) names += (names.empty() ? "" : ", ") + n;
      throw CaseError("quant/preset", "'" + j["preset"].get<std::string>() + "' is not one of: " + names);
    }
    q = *p;
  }
  const auto field = [&]<class E>(const char* name, E& dst) {
    if (!j.contains(name)) return;
    const std::string f = std::string("quant/") + name;
    if (!j[name].is_string()) throw CaseError(f, "must be a string");
    auto v = enum_parse<E>(j[name].get<std::string>());
    if (!v) throw CaseError(f, "'" + j[name].get<std::string>() + "' is not one of: " + enum_names_text<E>());
    dst = *v;
  };
  field("format", q.format);
  field("scale", q.scale);
  field("residual_sum", q.residual_sum);
  field("value", q.value);
  field("apply", q.apply);
  field("mx_rule", q.mx_rule);
  field("nan", q.nan);
  if (j.contains("scale_ub")) q.scale_ub = parse_element(j["scale_ub"], DType::float64, "quant/scale_ub");
  if (j.contains("min_scale")) q.min_scale = parse_element(j["min_scale"], DType::float64, "quant/min_scale");
  else if (!j.contains("preset") && q.scale == ScaleKind::dynamic_token) q.min_scale = default_min_scale(q.format);
  if (j.contains("outputs")) {
    if (!j["outputs"].is_array()) throw CaseError("quant/outputs", "must be an array of \"amax\", \"y\"");
    q.amax = q.y = false;
    for (const auto& o : j["outputs"]) {
      const std::string s = o.is_string() ? o.get<std::string>() : "";
      if (s == "amax") q.amax = true;
      else if (s == "y") q.y = true;
      else throw CaseError("quant/outputs", "entries must be \"amax\" or \"y\"");
    }
  }
  return q;
}

std::optional<double> parse_number(std::string_view text, DType t) {
  const std::string s = lower(text);
  if (s == "nan" || s == "+nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf" || s == "+inf" || s == "infinity") return std::numeric_limits<double>::infinity();
  if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
  if (s.empty()) return std::nullopt;
  // Directed parses bracket the decimal's value; more bits until both round the same way
  // (a hex float or a decimal that is exactly a dyadic number is bracketed exactly).
  for (int bits = 128; bits <= 1 << 16; bits *= 2) {
    detail::Enclosure e(bits);
    char* end = nullptr;
    mpfr_strtofr(e.lo.get(), s.c_str(), &end, 0, MPFR_RNDD);
    if (end == s.c_str() || *end != '\0') return std::nullopt;
    mpfr_strtofr(e.hi.get(), s.c_str(), &end, 0, MPFR_RNDU);
    double v;
    if (detail::decide(e, t, v)) return s[0] == '-' && v == 0 ? -0.0 : v;
  }
  return std::nullopt;
}

Case case_from_json(const json& j) {
  if (!j.is_object()) throw CaseError("case", "must be a JSON object");
  static const std::array<std::string_view, 22> known{
      "op", "axis", "axes", "epsilon", "affine", "weight_offset", "residual", "alpha", "block", "direction",
      "layers", "activation",
      "contract", "dtype_x", "dtype_param", "dtype_out", "dtype_compute", "dtype_residual", "inputs",
      "category", "description", "quant"};
  for (const auto& [k, v] : j.items())
    if (std::find(known.begin(), known.end(), k) == known.end()) throw CaseError(k, "unknown field");
  Case c;
  if (!j.contains("op")) throw CaseError("op", "missing");
  c.op = parse_enum<Op>(j["op"], "op");
  if (j.contains("axis")) c.axis = parse_int(j["axis"], "axis");
  if (j.contains("axes")) {
    if (!j["axes"].is_array()) throw CaseError("axes", "must be an array of integers");
    c.axes.emplace();
    for (const auto& a : j["axes"]) c.axes->push_back(parse_int(a, "axes"));
  }
  if (j.contains("epsilon")) c.epsilon = parse_scalar(j["epsilon"], "epsilon");
  c.affine = j.contains("affine")
                 ? parse_enum<Affine>(j["affine"], "affine")
                 : Affine::none;
  if (j.contains("weight_offset")) c.weight_offset = parse_scalar(j["weight_offset"], "weight_offset");
  if (j.contains("residual"))
    c.residual = parse_enum<Residual>(j["residual"], "residual");
  if (j.contains("alpha")) c.alpha = parse_scalar(j["alpha"], "alpha");
  if (j.contains("block"))
    c.block = parse_enum<Block>(j["block"], "block");
  if (j.contains("layers")) c.layers = parse_int(j["layers"], "layers");
  if (j.contains("activation"))
    c.activation = parse_enum<Activation>(j["activation"], "activation");
  if (j.contains("direction"))
    c.direction = parse_enum<Direction>(j["direction"], "direction");
  if (j.contains("contract")) {
    if (!j["contract"].is_string()) throw CaseError("contract", "must be a string");
    c.contract = j["contract"].get<std::string>();
  }
  if (j.contains("dtype_x")) c.dtype_x = parse_dtype_field(j["dtype_x"], "dtype_x");
  c.dtype_param = j.contains("dtype_param") ? parse_dtype_field(j["dtype_param"], "dtype_param") : c.dtype_x;
  c.dtype_out = j.contains("dtype_out") ? parse_dtype_field(j["dtype_out"], "dtype_out") : c.dtype_x;
  c.dtype_compute = j.contains("dtype_compute") ? parse_dtype_field(j["dtype_compute"], "dtype_compute") : DType::float32;
  c.dtype_residual = j.contains("dtype_residual") ? parse_dtype_field(j["dtype_residual"], "dtype_residual") : c.dtype_x;

  if (j.contains("quant")) c.quant = quant_from_json(j["quant"]);
  if (!j.contains("inputs") || !j["inputs"].is_object()) throw CaseError("inputs", "missing or not an object");
  for (const auto& [name, v] : j["inputs"].items()) {
    DType t = c.dtype_x;
    if (name == "weight" || name == "bias" || name == "residual_bias" || name.rfind("ffn_", 0) == 0) t = c.dtype_param;
    else if (name == "residual") t = c.dtype_residual;
    else if (name == "dy") t = c.dtype_out;
    else if (name == "scale" && j.contains("quant")) t = DType::float32;  // the static quantization scale
    c.inputs.emplace(name, parse_tensor(v, t, name));
  }
  validate(c);
  return c;
}

json result_to_json(const Case& c, const Result& r, std::string_view version) {
  json out;
  out["normcheck_version"] = std::string(version);
  out["contract"] = c.contract;
  json outputs = json::object();
  for (const auto& [name, o] : r.outputs) {
    if (!o.codes.empty()) {  // codes as integers; f64 as hex floats
      json codes = json::array();
      for (double v : o.value.data) codes.push_back(static_cast<std::int64_t>(v));
      outputs[name] = {{"dtype", o.codes},  {"shape", o.value.shape}, {"values", std::move(codes)},
                       {"f64", values_json(o.f64)}, {"certified", o.certified}};
      if (!o.ties.empty()) outputs[name]["ties"] = o.ties;
      continue;
    }
    outputs[name] = {{"dtype", std::string(name_of(o.value.dtype))},
                     {"shape", o.value.shape},
                     {"values", values_json(o.value.data)},
                     {"f64", values_json(o.f64)},
                     {"certified", o.certified}};
  }
  out["outputs"] = std::move(outputs);
  out["stats"] = {{"elements", r.stats.elements},
                  {"fast", r.stats.fast},
                  {"slow", r.stats.slow},
                  {"uncertified", r.stats.uncertified},
                  {"max_bits_used", r.stats.max_bits_used}};
  return out;
}

}  // namespace normcheck::ref
