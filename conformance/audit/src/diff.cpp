// Diff mode: the norm tensors of a converted checkpoint against its source, paired by profile
// role and layer (so HF and GGUF names pair), and the transform that explains each difference.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "binding.hpp"

namespace normcheck::audit {
namespace {

using namespace detail;

// Round-to-nearest-even of a binary64 to a narrower binary format with `mant` fraction bits,
// minimum normal exponent `emin` and largest finite value `max`: x / 2^(e - mant) is exact, so
// nearbyint does the one rounding.
double round_narrow(double x, int mant, int emin, double max) {
  if (!std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), emin);
  const double q = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(x / q) * q;
  return std::abs(r) > max ? std::copysign(INFINITY, x) : r;
}

double round_to(const std::string& dtype, double x) {
  if (dtype == "F32") return static_cast<double>(static_cast<float>(x));
  if (dtype == "F16") return round_narrow(x, 10, -14, 65504.0);
  if (dtype == "BF16") return round_narrow(x, 7, -126, 0x1.fep127);
  return x;
}

// One unit in the last place of `dtype` at x.
double ulp_of(const std::string& dtype, double x) {
  const int mant = dtype == "F32" ? 23 : dtype == "F16" ? 10 : dtype == "BF16" ? 7 : 52;
  const int emin = dtype == "F32" ? -126 : dtype == "F16" ? -14 : dtype == "BF16" ? -126 : -1022;
  const int e = x == 0 ? emin : std::max(std::ilogb(x), emin);
  return std::ldexp(1.0, e - mant);
}

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// How b (converted, stored in dtype_b) relates to a + shift: 2 exactly (bit for bit after one
// rounding to dtype_b), 1 within one ulp of dtype_b (a converter that computed in another
// precision), 0 not at all.
int explains(const std::vector<double>& a, const std::vector<double>& b, const std::string& dtype_b, double shift) {
  int level = 2;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double want = round_to(dtype_b, a[i] + shift);
    if (same(want, b[i])) continue;
    // One ulp at the largest magnitude the computation went through: w + 1 computed in float32
    // and shifted back has float32's spacing at 1, not at w.
    const double scale = std::max({std::abs(want), std::abs(a[i]), std::abs(a[i] + shift)});
    if (!std::isfinite(b[i]) || !std::isfinite(want) || std::abs(b[i] - want) > ulp_of(dtype_b, scale)) return 0;
    level = 1;
  }
  return level;
}

std::vector<double> transpose2(const std::vector<double>& a, std::uint64_t rows, std::uint64_t cols) {
  std::vector<double> t(a.size());
  for (std::uint64_t i = 0; i < rows; ++i)
    for (std::uint64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// Every value exactly a fresh parameter's: a bias 0; a weight 1 where scale = w, 0 where
// scale = 1 + w. An empty tensor is at no initialization.
bool at_initialization(const std::vector<double>& v, const std::string& kind, int offset) {
  const double init = kind == "bias" || offset == 1 ? 0.0 : 1.0;
  return !v.empty() && std::all_of(v.begin(), v.end(), [&](double x) { return x == init; });
}

std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string key_text(const std::string& role, int layer) {
  return layer >= 0 ? fmt::format("{} of layer {}", role, layer) : role;
}

}  // namespace

AuditResult diff_checkpoints(const Checkpoint& converted, const AuditOptions& converted_opt, const Checkpoint& source,
                             const AuditOptions& source_opt, const std::vector<Profile>& profiles) {
  AuditResult r;
  auto& F = r.findings;
  if (converted.tensors().empty() || source.tensors().empty()) {
    r.profile = "none";
    if (source.tensors().empty()) F.push_back(no_tensors_finding(source, "source: "));
    if (converted.tensors().empty()) F.push_back(no_tensors_finding(converted, "converted: "));
    return r;
  }
  std::vector<Finding> sf, cf;
  bool s_by_names = false, c_by_names = false;
  Bound s = select_profile(source, profiles, source_opt, sf, &s_by_names);
  Bound c = select_profile(converted, profiles, converted_opt, cf, &c_by_names);
  // One side declares its architecture (config, GGUF metadata), the other was only recognized
  // by its names: the declared profile wins if it names the other side's tensors as well
  // (HF Gemma and Llama checkpoints have the same names, and only Gemma's GGUF says gemma).
  auto adopt = [](Bound& by_names, const Bound& declared, const Checkpoint& ckpt, const AuditOptions& opt,
                  std::vector<Finding>& findings) {
    if (by_names.profile == declared.profile) return;
    Bound b = bind(*declared.profile, ckpt, opt.config);
    if (b.score() + 1e-9 < by_names.score()) return;
    findings.push_back({"info", "profile", {}, fmt::format("profile {} (the other checkpoint's declared architecture; its "
                                                           "names fit this one as well as {})", b.profile->name, by_names.profile->name)});
    by_names = std::move(b);
  };
  if (s_by_names && !c_by_names) adopt(s, c, source, source_opt, sf);
  if (c_by_names && !s_by_names) adopt(c, s, converted, converted_opt, cf);
  r.profile = c.profile->name;
  for (auto& f : sf) F.push_back({f.severity, f.check, f.tensors, "source: " + f.message});
  for (auto& f : cf) F.push_back({f.severity, f.check, f.tensors, "converted: " + f.message});
  if (s.profile != c.profile)
    F.push_back({"warning", "profile", {},
                 fmt::format("the source is {} and the converted checkpoint {}: tensors are paired by role name", s.profile->name,
                             c.profile->name)});
  // What a correct conversion does to stored weights: scale = off + w must not change, so
  // w_converted = w_source + (off_source - off_converted).
  const int expected_shift = s.offset - c.offset;

  // (role, kind, layer) -> tensor, on each side.
  using Key = std::tuple<std::string, std::string, int>;
  auto index = [](const Bound& b) {
    std::map<Key, const TensorInfo*> m;
    for (const auto& [key, matches] : b.found) m[{b.entries[key.first].role, b.entries[key.first].kind, key.second}] = matches.front().t;
    return m;
  };
  const auto si = index(s), ci = index(c);
  std::vector<std::string> identical, renamed_only;
  for (const auto& [key, st] : si) {
    const auto& [role, kind, layer] = key;
    const auto it = ci.find(key);
    if (it == ci.end()) {
      F.push_back({"error", "missing_tensor", {st->name},
                   fmt::format("{} {} ({} in the source) is missing from the converted checkpoint", key_text(role, layer), kind, st->name)});
      continue;
    }
    const TensorInfo* ct = it->second;
    const std::string pair = st->name == ct->name ? ct->name : fmt::format("{} -> {}", st->name, ct->name);
    std::vector<std::string> names{st->name};
    if (ct->name != st->name) names.push_back(ct->name);
    if (!st->readable || !ct->readable) {
      F.push_back({"warning", "transform", names, fmt::format("{}: dtype {} -> {} not read; not compared", pair, st->dtype, ct->dtype)});
      continue;
    }
    if (st->elements != ct->elements) {
      F.push_back({"error", "transform", names,
                   fmt::format("{}: not explained: {} elements became {}", pair, st->elements, ct->elements)});
      continue;
    }
    if (st->elements > (std::uint64_t{1} << 24)) {  // as the audit: not a norm parameter, not read
      F.push_back({"warning", "transform", names, fmt::format("{}: {} elements: not a norm parameter; not compared", pair, st->elements)});
      continue;
    }
    std::vector<double> a = source.read(*st);
    const std::vector<double> bv = converted.read(*ct);
    std::string layout;
    if (st->shape != ct->shape) {
      layout = "reshaped";
      if (st->shape.size() == 2 && ct->shape.size() == 2 && st->shape[0] == ct->shape[1] && st->shape[1] == ct->shape[0] &&
          st->shape[0] > 1 && st->shape[1] > 1) {
        const auto t = transpose2(a, st->shape[0], st->shape[1]);
        if (explains(t, bv, ct->dtype, 0) || explains(t, bv, ct->dtype, 1) || explains(t, bv, ct->dtype, -1)) {
          a = t;
          layout = "transposed";
        }
      }
    }
    // A parameter at its initialization where the source's was trained: the converter or the
    // loader re-initialized it (transformers #29554), whatever else differs.
    if (at_initialization(bv, kind, c.offset) && !at_initialization(a, kind, s.offset)) {
      F.push_back({"error", "untrained", names,
                   fmt::format("{}: every value is exactly its initialization ({}) while the source's {} is trained: "
                               "re-initialized by the converter or a loader that did not find it (transformers #29554)",
                               pair, kind == "bias" || c.offset == 1 ? "0" : "1", kind)});
      continue;
    }
    // Only weights carry the offset; biases must come across unshifted. A shift of 2 is an
    // offset of 1 applied twice (a converter that adds it to weights that already carry it).
    const int want = kind == "weight" ? expected_shift : 0;
    int found_shift = 0, level = 0;
    for (int k : {want, 0, 1, -1, 2, -2})
      if ((level = explains(a, bv, ct->dtype, k)) > 0) {
        found_shift = k;
        break;
      }
    std::string what;
    if (level == 0) {
      double worst = 0;
      std::size_t at = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::abs(bv[i] - a[i]) > worst || (std::isnan(bv[i] - a[i]) && worst == 0)) worst = std::abs(bv[i] - a[i]), at = i;
      F.push_back({"error", "transform", names,
                   fmt::format("{}: not explained by identity, dtype rounding, offset +1/-1/+2/-2{}: largest difference {:g} at index {} "
                               "({:.9g} -> {:.9g})",
                               pair, layout.empty() ? "" : " or " + layout, worst, at, a[at], bv[at])});
      continue;
    }
    const bool bitwise = level == 2 && st->dtype == ct->dtype;
    if (found_shift == 0 && bitwise)
      what = layout.empty() ? "identical" : "identical values";
    else if (found_shift == 0)
      what = fmt::format("dtype rounding only ({} -> {}{})", st->dtype, ct->dtype, level == 1 ? ", within 1 ulp" : "");
    else
      what = fmt::format("offset {:+d} ({} -> {}{})", found_shift, st->dtype, ct->dtype, level == 1 ? ", within 1 ulp" : "");
    if (!layout.empty()) what += fmt::format(", {} {} -> {}", layout, shape_text(st->shape), shape_text(ct->shape));
    if (st->name != ct->name) what += ", renamed";
    if (found_shift != want) {
      std::string why = want == 0
                            ? fmt::format("{} ({} {}) and {} ({} {}) store the same convention: the scale changes by {:+d}",
                                          s.profile->name, s.gguf ? "GGUF" : "HF", s.offset, c.profile->name, c.gguf ? "GGUF" : "HF",
                                          c.offset, found_shift)
                            : fmt::format("a conversion from scale = {}w to scale = {}w must shift the stored weights by {:+d}",
                                          s.offset ? "1 + " : "", c.offset ? "1 + " : "", want);
      if (std::abs(found_shift) == 2) why += fmt::format("; the offset of {:+d} appears applied twice", found_shift / 2);
      F.push_back({"error", "offset_convention", names, fmt::format("{}: {}, {}", pair, what, why)});
    } else if (!layout.empty()) {
      // Explained, but a norm parameter of another shape is not what the loader of this
      // architecture expects.
      F.push_back({"warning", "transform", names, fmt::format("{}: {}", pair, what)});
    } else if (what == "identical") {
      identical.push_back(ct->name);
    } else if (what == "identical, renamed") {
      renamed_only.push_back(ct->name);
    } else {
      F.push_back({"info", "transform", names, fmt::format("{}: {}", pair, what)});
    }
  }
  for (const auto& [key, ct] : ci)
    if (!si.count(key)) {
      const auto& [role, kind, layer] = key;
      F.push_back({"warning", "unexpected_tensor", {ct->name},
                   fmt::format("{} {} ({}) exists only in the converted checkpoint", key_text(role, layer), kind, ct->name)});
    }
  if (!identical.empty())
    F.push_back({"info", "transform", identical, fmt::format("{} norm tensor(s) identical (same name, dtype, bits)", identical.size())});
  if (!renamed_only.empty())
    F.push_back({"info", "transform", renamed_only, fmt::format("{} norm tensor(s) identical but renamed", renamed_only.size())});
  // eps carried?
  std::string sfrom, cfrom;
  const auto se = configured_eps(s, source_opt.config, sfrom), ce = configured_eps(c, converted_opt.config, cfrom);
  if (se && ce && std::abs(*se - *ce) > 1e-6 * std::abs(*se))
    F.push_back({"error", "eps", {}, fmt::format("eps not carried: source {:g} ({}), converted {:g} ({})", *se, sfrom, *ce, cfrom)});
  else if (se && ce)
    F.push_back({"info", "eps", {}, fmt::format("eps {:g} carried ({} -> {})", *ce, sfrom, cfrom)});
  else if (se && c.gguf)
    F.push_back({"error", "eps", {}, fmt::format("eps not carried: source {:g} ({}), none in the converted GGUF metadata", *se, sfrom)});
  std::stable_sort(F.begin(), F.end(), [](const Finding& x, const Finding& y) {
    auto rank = [](const std::string& v) { return v == "error" ? 0 : v == "warning" ? 1 : 2; };
    return rank(x.severity) < rank(y.severity);
  });
  return r;
}

}  // namespace normcheck::audit
