// Findings on one checkpoint against an architecture profile (conformance/audit/README.md says
// what each check means and why its severity is what it is).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "binding.hpp"

namespace normcheck::audit {

nlohmann::ordered_json AuditResult::summary() const {
  nlohmann::ordered_json s{{"error", 0}, {"warning", 0}, {"info", 0}};
  for (const auto& f : findings) s[f.severity] = s[f.severity].get<int>() + 1;
  return s;
}

int AuditResult::errors() const {
  return static_cast<int>(std::count_if(findings.begin(), findings.end(), [](const Finding& f) { return f.severity == "error"; }));
}

namespace detail {
namespace {

std::optional<double> number_at(const nlohmann::json& j, const std::string& key) {
  if (!j.is_object()) return std::nullopt;
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  if (j.contains("text_config") && j["text_config"].is_object() && j["text_config"].contains(key) &&
      j["text_config"][key].is_number())
    return j["text_config"][key].get<double>();
  return std::nullopt;
}

std::string gguf_key(const Checkpoint& c, std::string key) {
  const auto& m = c.metadata();
  const std::string arch = m.contains("general.architecture") && m["general.architecture"].is_string()
                               ? m["general.architecture"].get<std::string>()
                               : "";
  if (auto p = key.find("{arch}"); p != std::string::npos) key.replace(p, 6, arch);
  return key;
}

}  // namespace

bool is_norm_like(const std::string& name) {
  const auto last = name.rfind('.');
  const std::string param = last == std::string::npos ? name : name.substr(last + 1);
  if (param == "gamma" || param == "beta") return true;
  if (last == std::string::npos || last == 0 || (param != "weight" && param != "bias" && param != "scale")) return false;
  const auto before = name.rfind('.', last - 1);
  const std::size_t start = before == std::string::npos ? 0 : before + 1;
  std::string module = name.substr(start, last - start);
  for (auto& ch : module) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (module.find("norm") != std::string::npos) return true;
  if (module == "ln" || module.rfind("ln_", 0) == 0) return true;
  return module.size() > 2 && module.rfind("ln", 0) == 0 &&
         std::all_of(module.begin() + 2, module.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

NamePattern::NamePattern(const std::string& pattern, bool gguf) : gguf_(gguf) {
  std::size_t from = 0;
  for (std::size_t p; (p = pattern.find("{L}", from)) != std::string::npos; from = p + 3) parts_.push_back(pattern.substr(from, p - from));
  parts_.push_back(pattern.substr(from));
}

bool NamePattern::match_at(const std::string& name, std::size_t pos, int& layer) const {
  layer = -1;
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    if (i > 0) {  // {L}: 1 to 6 digits
      std::size_t digits = 0;
      int value = 0;
      while (pos + digits < name.size() && digits < 7 && name[pos + digits] >= '0' && name[pos + digits] <= '9')
        value = value * 10 + (name[pos + digits++] - '0');
      if (digits == 0 || digits > 6) return false;
      layer = value;
      pos += digits;
    }
    if (name.compare(pos, parts_[i].size(), parts_[i]) != 0) return false;
    pos += parts_[i].size();
  }
  return pos == name.size();
}

bool NamePattern::match(const std::string& name, int& layer) const {
  if (parts_.empty()) return false;
  if (match_at(name, 0, layer)) return true;
  if (gguf_) return false;
  // Suffixes after a '.': only where the pattern's first literal can start, so the work stays
  // proportional to the name's length times the (short) pattern's.
  for (std::size_t p = name.find('.'); p != std::string::npos; p = name.find('.', p + 1))
    if (name.size() - (p + 1) >= parts_.back().size() && match_at(name, p + 1, layer)) return true;
  return false;
}

std::uint64_t layer_count_under(const std::vector<TensorInfo>& tensors, const std::string& prefix, bool gguf) {
  std::uint64_t n = 0;
  for (const auto& t : tensors) {
    const std::string& name = t.name;
    for (std::size_t p = name.find(prefix); p != std::string::npos; p = name.find(prefix, p + 1)) {
      if (p != 0 && (gguf || name[p - 1] != '.')) continue;
      std::size_t q = p + prefix.size(), digits = 0;
      std::uint64_t value = 0;
      while (q < name.size() && digits < 7 && name[q] >= '0' && name[q] <= '9') value = value * 10 + static_cast<std::uint64_t>(name[q++] - '0'), ++digits;
      if (digits >= 1 && digits <= 6 && q < name.size() && name[q] == '.') n = std::max(n, value + 1);
      if (gguf) break;
    }
  }
  return n;
}

std::string Bound::describe(const Entry& e, int layer) const {
  std::string s = e.pattern;
  if (layer >= 0)
    if (auto p = s.find("{L}"); p != std::string::npos) s.replace(p, 3, std::to_string(layer));
  return s;
}

Bound bind(const Profile& profile, const Checkpoint& ckpt, const std::optional<nlohmann::json>& config) {
  Bound b;
  b.profile = &profile;
  b.ckpt = &ckpt;
  b.gguf = ckpt.format() == "gguf";
  const auto& spec = profile.spec;
  b.offset = spec["offset"][b.gguf ? "gguf" : "hf"].get<int>();
  for (const auto& t : spec["tensors"]) {
    Entry e;
    e.role = t["role"];
    e.kind = t["kind"];
    e.pattern = t[b.gguf ? "gguf" : "hf"];
    e.re = NamePattern(e.pattern, b.gguf);
    e.per_layer = t.value("per_layer", "");
    for (const auto& s : t["shape"]) e.shape.push_back(s);
    if (!b.gguf && t.contains("legacy_hf") && t["legacy_hf"].is_array())
      for (const auto& l : t["legacy_hf"])
        if (l.is_string()) {
          e.legacy_patterns.push_back(l);
          e.legacy.push_back(NamePattern(l, false));
        }
    b.entries.push_back(std::move(e));
  }
  // Which tensors each entry names.
  for (const auto& t : ckpt.tensors()) {
    for (std::size_t i = 0; i < b.entries.size(); ++i) {
      const Entry& e = b.entries[i];
      int layer = -1;
      bool legacy = false;
      bool hit = e.re.match(t.name, layer);
      for (std::size_t k = 0; !hit && k < e.legacy.size(); ++k) hit = legacy = e.legacy[k].match(t.name, layer);
      if (!hit) continue;
      b.found[{i, layer}].push_back({&t, layer, legacy});
      b.claimed.insert(&t);
      break;
    }
  }
  // Dims: config, then GGUF metadata, then products/quotients of those, in passes so that one
  // dim may use another.
  const auto& dims = spec["dims"];
  auto operand = [&](const std::string& k) -> std::optional<double> {
    if (b.dims.count(k)) return static_cast<double>(b.dims[k]);
    if (config) return number_at(*config, k);
    return std::nullopt;
  };
  auto gguf_operand = [&](const std::string& k) -> std::optional<double> {
    if (b.dims.count(k)) return static_cast<double>(b.dims[k]);
    const auto key = gguf_key(ckpt, k);
    if (ckpt.metadata().contains(key) && ckpt.metadata()[key].is_number()) return ckpt.metadata()[key].get<double>();
    return std::nullopt;
  };
  auto set = [&](const std::string& name, std::optional<double> v, const std::string& source) {
    if (!v || b.dims.count(name) || !(*v >= 1) || *v > 1e12 || *v != std::floor(*v)) return;
    b.dims[name] = static_cast<std::uint64_t>(*v);
    b.dim_source[name] = source;
  };
  for (int pass = 0; pass < 3; ++pass)
    for (auto it = dims.begin(); it != dims.end(); ++it) {
      // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
      const std::string name = it.key();
      const nlohmann::json& d = it.value();
      if (b.dims.count(name)) continue;
      if (config)
        for (const auto& k : d.value("config", nlohmann::json::array())) set(name, number_at(*config, k), "config " + k.get<std::string>());
      if (b.gguf)
        for (const auto& k : d.value("gguf", nlohmann::json::array()))
          set(name, gguf_operand(k.get<std::string>()), "GGUF " + gguf_key(ckpt, k.get<std::string>()));
      auto combine = [&](const char* field, bool product, bool use_gguf) {
        if (!d.contains(field) || d[field].size() != 2) return;
        const auto a = use_gguf ? gguf_operand(d[field][0]) : operand(d[field][0]);
        const auto c = use_gguf ? gguf_operand(d[field][1]) : operand(d[field][1]);
        if (!a || !c || *c == 0) return;
        set(name, product ? *a * *c : *a / *c,
            fmt::format("{} {} {} {}", use_gguf ? "GGUF" : "config", d[field][0].get<std::string>(), product ? "*" : "/",
                        d[field][1].get<std::string>()));
      };
      if (config) {
        combine("config_product", true, false);
        combine("config_quotient", false, false);
      }
      if (b.gguf) {
        combine("gguf_product", true, true);
        combine("gguf_quotient", false, true);
      }
    }
  // Layer counts not given: the highest layer index that any tensor (norm or not) carries under
  // the pattern's layer prefix, so that a layer whose norms were all dropped still counts.
  for (const auto& e : b.entries) {
    if (e.per_layer.empty() || b.dims.count(e.per_layer)) continue;
    const std::string prefix = e.pattern.substr(0, e.pattern.find("{L}"));
    std::uint64_t n = layer_count_under(ckpt.tensors(), prefix, b.gguf);
    for (const auto& e2 : b.entries)  // the same dim under another prefix (T5's encoder is one)
      if (e2.per_layer == e.per_layer && &e2 != &e)
        n = std::max(n, layer_count_under(ckpt.tensors(), e2.pattern.substr(0, e2.pattern.find("{L}")), b.gguf));
    if (n > 0) {
      b.dims[e.per_layer] = n;
      b.dim_source[e.per_layer] = "inferred from tensor names";
    }
  }
  // Shape dims still unknown: the most common size among the tensors that use them.
  for (const auto& [name, d] : dims.items()) {
    if (b.dims.count(name)) continue;
    std::map<std::uint64_t, int> votes;
    for (const auto& [key, matches] : b.found) {
      const Entry& e = b.entries[key.first];
      for (const auto& m : matches)
        if (m.t->shape.size() == e.shape.size())
          for (std::size_t k = 0; k < e.shape.size(); ++k)
            if (e.shape[k] == name) ++votes[m.t->shape[k]];
    }
    if (votes.empty()) continue;
    const auto best = std::max_element(votes.begin(), votes.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
    b.dims[name] = best->first;
    b.dim_source[name] = "inferred from tensor shapes";
  }
  return b;
}

Bound bind_generic(const Checkpoint& ckpt) {
  auto profile = std::make_shared<Profile>();
  profile->name = "generic";
  profile->spec = {{"name", "generic"}, {"eps", {{"usual", nlohmann::json::array()}}}};
  Bound b;
  b.generic = true;
  b.owned = profile;
  b.profile = profile.get();
  b.ckpt = &ckpt;
  b.gguf = ckpt.format() == "gguf";
  for (const auto& t : ckpt.tensors()) {
    if (!is_norm_like(t.name)) continue;
    const auto dot = t.name.rfind('.');
    const std::string param = dot == std::string::npos ? t.name : t.name.substr(dot + 1);
    Entry e;
    e.role = dot == std::string::npos ? t.name : t.name.substr(0, dot);
    e.kind = param == "bias" || param == "beta" ? "bias" : "weight";
    e.pattern = t.name;
    e.re = NamePattern(t.name, /*gguf: whole names only*/ true);
    b.found[{b.entries.size(), -1}].push_back({&t, -1, false});
    b.claimed.insert(&t);
    b.entries.push_back(std::move(e));
  }
  return b;
}

Finding no_tensors_finding(const Checkpoint& ckpt, const std::string& side) {
  return {"error", "no_tensors", {},
          fmt::format("{}{} holds no tensors at all ({}, {} metadata key(s)): a vocabulary- or metadata-only file has no norm "
                      "parameters to audit",
                      side, ckpt.path(), ckpt.format(), ckpt.metadata().is_object() ? ckpt.metadata().size() : 0)};
}

double Bound::score() const {
  // Entries present at layer 0 (or once), minus entries absent: the profile that names the most
  // of the checkpoint's norm tensors and expects the fewest it lacks.
  double s = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const int layer = entries[i].per_layer.empty() ? -1 : 0;
    s += found.count({i, layer}) ? 1.0 : -0.5;
  }
  return s;
}

Bound select_profile(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt,
                     std::vector<Finding>& findings, bool* by_names) {
  if (by_names) *by_names = false;
  const bool gguf = ckpt.format() == "gguf";
  if (!opt.profile.empty()) {
    for (const auto& p : profiles)
      if (p.name == opt.profile) {
        findings.push_back({"info", "profile", {}, fmt::format("profile {} (from --profile)", p.name)});
        return bind(p, ckpt, opt.config);
      }
    std::string names;
    for (const auto& p : profiles) names += (names.empty() ? "" : ", ") + p.name;
    throw AuditInputError(fmt::format("unknown profile '{}' (known: {})", opt.profile, names));
  }
  // Declared architecture: config.json's model_type, GGUF's general.architecture.
  std::string declared, declared_from;
  if (opt.config && opt.config->is_object()) {
    const auto& c = *opt.config;
    if (c.contains("model_type") && c["model_type"].is_string()) declared = c["model_type"], declared_from = "config model_type";
    if (c.contains("text_config") && c["text_config"].is_object() && c["text_config"].contains("model_type") &&
        c["text_config"]["model_type"].is_string() && declared.empty())
      declared = c["text_config"]["model_type"], declared_from = "config text_config.model_type";
  }
  if (gguf && ckpt.metadata().contains("general.architecture") && ckpt.metadata()["general.architecture"].is_string() &&
      declared.empty())
    declared = ckpt.metadata()["general.architecture"], declared_from = "GGUF general.architecture";
  if (!declared.empty()) {
    for (const auto& p : profiles) {
      const auto& list = p.spec.value(gguf && declared_from.rfind("GGUF", 0) == 0 ? "gguf_architectures" : "model_types",
                                      nlohmann::json::array());
      if (std::find(list.begin(), list.end(), declared) != list.end()) {
        findings.push_back({"info", "profile", {}, fmt::format("profile {} ({} '{}')", p.name, declared_from, declared)});
        return bind(p, ckpt, opt.config);
      }
    }
    findings.push_back({"warning", "profile", {},
                        fmt::format("{} '{}' is no known profile's; choosing one by tensor names", declared_from, declared)});
  }
  if (by_names) *by_names = true;
  std::optional<Bound> best;
  std::vector<std::string> tied;
  for (const auto& p : profiles) {
    Bound b = bind(p, ckpt, opt.config);
    if (b.claimed.empty()) continue;
    const double s = b.score() + 0.01 * p.spec.value("name_priority", 0);
    const double best_s = best ? best->score() + 0.01 * best->profile->spec.value("name_priority", 0) : 0;
    if (!best || s > best_s + 1e-9) {
      if (best && s - best_s < 0.5) tied.push_back(best->profile->name);  // won on priority only
      else tied.clear();
      best = std::move(b);
    } else if (std::abs(s - best->score() - 0.01 * best->profile->spec.value("name_priority", 0)) < 0.5) {
      tied.push_back(p.name);
    }
  }
  if (!best) {
    Bound g = bind_generic(ckpt);
    if (g.entries.empty())
      throw AuditInputError(fmt::format("{}: no profile names any of its {} tensors and none looks like a norm parameter; "
                                        "pass --profile (and see conformance/audit/README.md to add one)",
                                        ckpt.path(), ckpt.tensors().size()));
    findings.push_back({"info", "profile", {},
                        fmt::format("profile generic: no profile names this checkpoint's tensors, so its {} norm-like tensor(s) "
                                    "are checked by their values only (finite, untrained, centre); the architecture's checks "
                                    "(missing tensors, shapes, offset convention, eps) need --profile or a profile file",
                                    g.entries.size())});
    return g;
  }
  std::string msg = fmt::format("profile {} (chosen by tensor names", best->profile->name);
  if (!tied.empty()) {
    std::string t;
    for (const auto& n : tied) t += (t.empty() ? "" : ", ") + n;
    msg += fmt::format("; {} name their norm tensors the same way: pass --config or --profile for their conventions", t);
  }
  findings.push_back({"info", "profile", {}, msg + ")"});
  return std::move(*best);
}

std::optional<double> configured_eps(const Bound& b, const std::optional<nlohmann::json>& config, std::string& from) {
  const auto& eps = b.profile->spec["eps"];
  if (config)
    for (const auto& k : eps.value("config", nlohmann::json::array()))
      if (auto v = number_at(*config, k)) {
        from = "config " + k.get<std::string>();
        return v;
      }
  if (b.gguf)
    for (const auto& k : eps.value("gguf", nlohmann::json::array())) {
      const auto key = gguf_key(*b.ckpt, k);
      if (b.ckpt->metadata().contains(key) && b.ckpt->metadata()[key].is_number()) {
        from = "GGUF " + key;
        return b.ckpt->metadata()[key].get<double>();
      }
    }
  return std::nullopt;
}

ValueStats stats_of(const std::vector<double>& v) {
  ValueStats s;
  std::vector<double> finite;
  finite.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) {
      if (s.non_finite++ == 0) s.first_non_finite = i;
      continue;
    }
    finite.push_back(v[i]);
    s.all_one = s.all_one && v[i] == 1.0;
    s.all_zero = s.all_zero && v[i] == 0.0;
  }
  if (finite.empty()) {
    s.all_one = s.all_zero = false;
    return s;
  }
  std::nth_element(finite.begin(), finite.begin() + static_cast<std::ptrdiff_t>(finite.size() / 2), finite.end());
  s.median = finite[finite.size() / 2];
  return s;
}

// The stored-value centre a convention implies: scale = offset + w, trained scales sit near 1.
int classify_centre(double median) {
  for (int k = 0; k <= 2; ++k)
    if (std::abs(median - k) < 0.25) return k;
  return -1;
}

}  // namespace detail

namespace {

using namespace detail;

std::string join_layers(const std::vector<int>& layers) {
  std::string s;
  for (std::size_t i = 0; i < layers.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(layers[i]);
  if (layers.size() > 16) s += fmt::format(" and {} more", layers.size() - 16);
  return s;
}

std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// 16 M elements (128 MiB as binary64): a norm parameter is one hidden vector (at most some
// 10^5 elements); beyond this a "norm" tensor is not read (HDF5 datasets may be compressed, so
// their size is not bounded by the file's).
constexpr std::uint64_t kMaxNormElements = std::uint64_t{1} << 24;
// Layer counts beyond this (from a config) are not enumerated one by one.
constexpr std::uint64_t kMaxLayers = 4096;

}  // namespace

AuditResult audit_checkpoint(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt) {
  AuditResult r;
  if (ckpt.tensors().empty()) {
    r.profile = "none";
    r.findings.push_back(no_tensors_finding(ckpt));
    return r;
  }
  Bound b = select_profile(ckpt, profiles, opt, r.findings);
  r.profile = b.profile->name;
  auto& F = r.findings;
  const std::string scheme = b.gguf ? "GGUF" : "HF";
  const int expected_centre = 1 - b.offset;  // stored weights centre near 1 - offset

  // Missing tensors, per entry, and layers beyond the configured count.
  for (std::size_t i = 0; i < b.entries.size(); ++i) {
    const Entry& e = b.entries[i];
    if (e.per_layer.empty()) {
      if (!b.found.count({i, -1}))
        F.push_back({"error", "missing_tensor", {b.describe(e, -1)},
                     fmt::format("{} ({} {}) is missing", b.describe(e, -1), e.role, e.kind)});
      continue;
    }
    const auto n = b.dims.count(e.per_layer) ? b.dims.at(e.per_layer) : 0;
    if (n > kMaxLayers) {
      F.push_back({"warning", "missing_tensor", {},
                   fmt::format("{} = {} ({}): more layers than any model has; layers of {} not checked", e.per_layer, n,
                               b.dim_source.at(e.per_layer), e.pattern)});
      continue;
    }
    std::vector<int> missing;
    std::vector<std::string> names;
    for (std::uint64_t l = 0; l < n; ++l)
      if (!b.found.count({i, static_cast<int>(l)})) {
        missing.push_back(static_cast<int>(l));
        names.push_back(b.describe(e, static_cast<int>(l)));
      }
    if (!missing.empty())
      F.push_back({"error", "missing_tensor", names,
                   fmt::format("{} of {} layers ({}: {}) lack {} ({} {}): layers {}", missing.size(), n, e.per_layer,
                               b.dim_source.count(e.per_layer) ? b.dim_source.at(e.per_layer) : "?", e.pattern, e.role, e.kind,
                               join_layers(missing))});
    std::vector<std::string> beyond;
    for (const auto& [key, matches] : b.found)
      if (key.first == i && key.second >= 0 && static_cast<std::uint64_t>(key.second) >= n)
        for (const auto& m : matches) beyond.push_back(m.t->name);
    if (!beyond.empty() && b.dim_source.count(e.per_layer) && b.dim_source.at(e.per_layer).rfind("inferred", 0) != 0)
      F.push_back({"warning", "unexpected_tensor", beyond,
                   fmt::format("{} tensor(s) of {} at layers beyond {} = {} ({})", beyond.size(), e.role, e.per_layer, n,
                               b.dim_source.at(e.per_layer))});
  }

  // Per tensor: duplicates, legacy names, dtype, shape, values.
  std::vector<std::string> legacy, untrained, zero_scale, unreadable, dtypes_seen;
  std::set<std::string> dtype_set;
  struct Centre {
    std::string name, role;
    double median;
  };
  std::vector<Centre> centres;
  for (const auto& [key, matches] : b.found) {
    const Entry& e = b.entries[key.first];
    if (matches.size() > 1) {
      std::vector<std::string> names;
      for (const auto& m : matches) names.push_back(m.t->name);
      F.push_back({"warning", "duplicate_tensor", names,
                   fmt::format("{} tensors are {}{}: which one a loader keeps depends on the loader", matches.size(), e.role,
                               key.second >= 0 ? fmt::format(" of layer {}", key.second) : "")});
    }
    for (const auto& m : matches) {
      const TensorInfo& t = *m.t;
      if (m.legacy) legacy.push_back(t.name);
      dtype_set.insert(t.dtype);
      // Shape against the profile's dims.
      std::vector<std::uint64_t> want;
      bool known = true;
      for (const auto& s : e.shape) {
        if (!b.dims.count(s)) known = false;
        else want.push_back(b.dims.at(s));
      }
      if (known && !b.generic && t.shape != want) {
        std::string why;
        for (const auto& s : e.shape) why += (why.empty() ? "" : ", ") + fmt::format("{} = {} from {}", s, b.dims.at(s), b.dim_source.at(s));
        F.push_back({"error", "shape_mismatch", {t.name},
                     fmt::format("{} has shape {}, {} expects {} ({})", t.name, shape_text(t.shape), r.profile, shape_text(want), why)});
      }
      if (!t.readable) {
        unreadable.push_back(t.name + " (" + t.dtype + ")");
        continue;
      }
      if (t.elements > kMaxNormElements) {
        F.push_back({"error", "shape_mismatch", {t.name}, fmt::format("{} has {} elements: not a norm parameter; not read", t.name, t.elements)});
        continue;
      }
      const ValueStats s = stats_of(ckpt.read(t));
      if (s.non_finite)
        F.push_back({"error", "non_finite", {t.name},
                     fmt::format("{}: {} of {} values are NaN or infinite (first at index {})", t.name, s.non_finite, t.elements,
                                 s.first_non_finite)});
      if (e.kind == "weight" && t.elements > 0 && s.non_finite == 0) {
        if (s.all_zero && b.offset == 0)
          zero_scale.push_back(t.name);
        else if ((s.all_one && b.offset == 0) || (s.all_zero && b.offset == 1))
          untrained.push_back(t.name);
        centres.push_back({t.name, e.role, s.median});
      }
      if (e.kind == "bias" && t.elements > 0 && s.all_zero)
        F.push_back({"info", "untrained", {t.name}, fmt::format("{}: every value is exactly 0 (a bias at its initialization)", t.name)});
    }
  }
  if (!zero_scale.empty() && b.generic)
    F.push_back({"warning", "untrained", zero_scale,
                 fmt::format("{} norm weight(s) are exactly all 0: a zero-centred weight at its initialization, or a scale of 0 "
                             "(the norm outputs zero); the generic profile cannot tell which",
                             zero_scale.size())});
  else if (!zero_scale.empty())
    F.push_back({"error", "untrained", zero_scale,
                 fmt::format("{} norm weight(s) are exactly all 0 where the scale is the weight itself ({} {}): the norm outputs zero",
                             zero_scale.size(), r.profile, scheme)});
  if (!untrained.empty())
    F.push_back({"warning", "untrained", untrained,
                 fmt::format("{} norm weight(s) hold exactly their initialization (all {}, a scale of exactly 1): untrained, or "
                             "re-initialized by a loader that did not find the real parameter",
                             untrained.size(), b.offset == 0 ? "1" : "0")});
  if (!legacy.empty())
    F.push_back({"warning", "legacy_name", legacy,
                 fmt::format("{} norm tensor(s) carry legacy names (gamma/beta): transformers renames them to weight/bias on "
                             "load; a loader that does not leaves the norm at its initialization (transformers #29554)",
                             legacy.size())});
  if (!unreadable.empty()) {
    std::string list;
    for (const auto& u : unreadable) list += (list.empty() ? "" : ", ") + u;
    F.push_back({"warning", "dtype", unreadable,
                 fmt::format("{} norm tensor(s) are stored in a dtype this audit does not read, their values are not checked: {}",
                             unreadable.size(), list)});
  }
  if (dtype_set.size() > 1) {
    std::string list;
    for (const auto& d : dtype_set) list += (list.empty() ? "" : ", ") + d;
    F.push_back({"info", "dtype", {}, fmt::format("norm tensors are stored in several dtypes: {}", list)});
  }

  // The offset convention, from the median of the per-tensor medians (a trained norm's scales
  // sit near 1: stored weights near 1 - offset).
  if (!centres.empty()) {
    std::vector<double> meds;
    for (const auto& c : centres) meds.push_back(c.median);
    std::vector<double> sorted = meds;
    std::sort(sorted.begin(), sorted.end());
    const double overall = sorted[sorted.size() / 2];
    const int cls = classify_centre(overall);
    // Confident only when most tensors agree on their own.
    const auto agree = std::count_if(meds.begin(), meds.end(), [&](double m) { return classify_centre(m) == cls; });
    const bool confident = cls >= 0 && agree * 10 >= static_cast<long>(meds.size()) * 6;
    const std::string conv = fmt::format("{} ({}) stores norm weights w with scale = {}w, so trained weights centre near {}",
                                         r.profile, scheme, b.offset ? "1 + " : "", expected_centre);
    if (b.generic) {
      // No convention to hold the centre against: scale = w centres near 1, scale = 1 + w near
      // 0; near 2 is neither (an offset of 1 applied twice, under either).
      if (confident && cls == 2) {
        std::vector<std::string> names;
        for (const auto& c : centres) names.push_back(c.name);
        F.push_back({"warning", "offset_convention", names,
                     fmt::format("norm weights centre near 2 (median of {} tensor medians {:.4g}): a scale near 2 (scale = w) or "
                                 "3 (scale = 1 + w) is neither convention's; the +1 offset appears applied twice",
                                 meds.size(), overall)});
      } else {
        F.push_back({"info", "offset_convention", {},
                     fmt::format("norm weights centre at {:.4g} (median of {} tensor medians){}", overall, meds.size(),
                                 confident ? fmt::format(": near {}, the {} convention", cls, cls == 1 ? "scale = w" : "scale = 1 + w (zero-centred)")
                                           : "")});
      }
    } else if (!confident) {
      F.push_back({"info", "offset_convention", {},
                   fmt::format("norm weights centre at {:.4g} (median of {} tensor medians): no clear convention; {}", overall,
                               meds.size(), conv)});
    } else if (cls != expected_centre) {
      std::string meaning;
      if (expected_centre == 0 && cls == 1)
        meaning = "the +1 offset appears baked into the weights: a loader that adds 1 again scales by about 2 (llama.cpp #5631)";
      else if (expected_centre == 1 && cls == 0)
        meaning = "zero-centred weights read as plain scales: the norm scales by about 0 (a converter that forgot to add 1, "
                  "or a zero-centred model under the wrong profile)";
      else if (cls == 2)
        meaning = "the offset appears applied twice";
      else
        meaning = "the weights follow another convention";
      std::vector<std::string> names;
      for (const auto& c : centres) names.push_back(c.name);
      F.push_back({"error", "offset_convention", names,
                   fmt::format("norm weights centre near {} (median of {} tensor medians {:.4g}); {}: {}", cls, meds.size(), overall,
                               conv, meaning)});
    } else {
      F.push_back({"info", "offset_convention", {},
                   fmt::format("norm weights centre near {} (median of {} tensor medians {:.4g}), as {} expects", cls, meds.size(),
                               overall, r.profile)});
      // A role whose tensors centre elsewhere: an offset applied to some norms only (Gemma 3's
      // q/k norms are the usual ones to be forgotten).
      std::map<std::string, std::vector<double>> by_role;
      for (const auto& c : centres) by_role[c.role].push_back(c.median);
      for (auto& [role, v] : by_role) {
        std::sort(v.begin(), v.end());
        const double m = v[v.size() / 2];
        const int rc = classify_centre(m);
        const auto ragree = std::count_if(v.begin(), v.end(), [&](double x) { return classify_centre(x) == rc; });
        if (rc >= 0 && rc != cls && ragree * 10 >= static_cast<long>(v.size()) * 8) {
          std::vector<std::string> names;
          for (const auto& c : centres)
            if (c.role == role) names.push_back(c.name);
          F.push_back({"warning", "offset_mixed", names,
                       fmt::format("{} weights centre near {} (median {:.4g}) while the other norm weights centre near {}: an "
                                   "offset applied to some norms only",
                                   role, rc, m, cls)});
        }
      }
    }
  }

  // eps: carried, and the value the architecture uses.
  {
    std::string from;
    const auto eps = configured_eps(b, opt.config, from);
    const auto& usual = b.profile->spec["eps"]["usual"];
    std::string usual_text;
    for (const auto& u : usual) usual_text += (usual_text.empty() ? "" : " or ") + fmt::format("{:g}", u.get<double>());
    if (b.generic) {
      F.push_back({"info", "eps", {}, "eps not checked: the generic profile does not know where this architecture keeps it"});
    } else if (eps) {
      const bool ok = std::any_of(usual.begin(), usual.end(), [&](const auto& u) {
        return std::abs(*eps - u.template get<double>()) <= 1e-6 * u.template get<double>();
      });
      if (ok)
        F.push_back({"info", "eps", {}, fmt::format("eps {:g} ({}), as {} uses", *eps, from, r.profile)});
      else
        F.push_back({"warning", "eps", {},
                     fmt::format("eps {:g} ({}) where {} uses {}: a converter that did not carry eps, or a model that differs",
                                 *eps, from, r.profile, usual_text)});
    } else if (b.gguf || opt.config) {
      std::string keys;
      for (const auto& k : b.profile->spec["eps"].value(b.gguf ? "gguf" : "config", nlohmann::json::array()))
        keys += (keys.empty() ? "" : ", ") + gguf_key(ckpt, k);
      F.push_back({"warning", "eps", {},
                   fmt::format("no eps in the {} ({}): loaders fall back to their own default, which may not be {}",
                               b.gguf ? "GGUF metadata" : "config", keys, usual_text)});
    } else {
      F.push_back({"info", "eps", {}, "eps not checked: no --config given"});
    }
  }

  // Norm-looking tensors the profile does not name.
  std::vector<std::string> extra;
  for (const auto& t : ckpt.tensors())
    if (!b.claimed.count(&t) && is_norm_like(t.name)) extra.push_back(t.name);
  if (!extra.empty()) {
    std::string list;
    for (std::size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
    if (extra.size() > 8) list += fmt::format(" and {} more", extra.size() - 8);
    F.push_back({"warning", "unexpected_tensor", extra,
                 fmt::format("{} norm-like tensor(s) that {} does not name (a loader may ignore them): {}", extra.size(), r.profile,
                             list)});
  }

  std::stable_sort(F.begin(), F.end(), [](const Finding& x, const Finding& y) {
    auto rank = [](const std::string& s) { return s == "error" ? 0 : s == "warning" ? 1 : 2; };
    return rank(x.severity) < rank(y.severity);
  });
  return r;
}

}  // namespace normcheck::audit
