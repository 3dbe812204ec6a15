// The functional audit (functional.hpp): each fixture case's weight (and bias) replaced by the
// checkpoint's, converted to the case's convention (scale = offset + w on both sides), the
// case evaluated by the certified reference and checked against the recorded expected outputs
// under the tolerance model, as a candidate would be.
#include "normcheck/audit/functional.hpp"

#include <fmt/core.h>

#include "binding.hpp"
#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::audit {
namespace {

using namespace detail;

// The checkpoint tensor of kind `kind` ("weight"/"bias") for the norm module `id`: by name
// (also the legacy gamma/beta), else through the profile's HF pattern for (role, layer).
const TensorInfo* tensor_for(const Bound& b, const std::string& id, const std::string& kind) {
  for (const char* suffix : {kind == "weight" ? ".weight" : ".bias", kind == "weight" ? ".gamma" : ".beta"})
    if (const TensorInfo* t = b.ckpt->find(id + suffix)) return t;
  const std::string hf_name = id + "." + kind;
  for (const auto& spec : b.profile->spec["tensors"]) {
    if (spec["kind"] != kind) continue;
    int layer = -1;
    if (!NamePattern(spec["hf"].get<std::string>(), false).match(hf_name, layer)) continue;
    for (std::size_t i = 0; i < b.entries.size(); ++i)
      if (b.entries[i].role == spec["role"] && b.entries[i].kind == kind) {
        const auto it = b.found.find({i, layer});
        if (it != b.found.end()) return it->second.front().t;
      }
  }
  return nullptr;
}

}  // namespace

AuditResult functional_audit(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt,
                             const std::string& fixtures_path) {
  AuditResult r;
  auto& F = r.findings;
  const Bound b = select_profile(ckpt, profiles, opt, F);
  r.profile = b.profile->name;
  const fix::FixtureReader reader(fixtures_path);
  std::vector<std::string> passed, skipped;
  for (const auto& id : reader.case_ids()) {
    const fix::FixtureCase fc = reader.read_case_later(id).finish_checked();  // a damaged fixture: exit 2
    if (fc.c.affine == ref::Affine::none || fc.c.block != ref::Block::none || fc.c.direction != ref::Direction::forward) {
      skipped.push_back(id);
      continue;
    }
    const TensorInfo* w = tensor_for(b, id, "weight");
    const TensorInfo* bias = fc.c.affine == ref::Affine::weight_bias ? tensor_for(b, id, "bias") : nullptr;
    if (!w || (fc.c.affine == ref::Affine::weight_bias && !bias)) {
      F.push_back({"warning", "functional", {id},
                   fmt::format("fixture case {} names no {} of the checkpoint ({}.weight{}): not run", id,
                               w ? "bias" : "weight", id, fc.c.affine == ref::Affine::weight_bias ? ", .bias" : "")});
      continue;
    }
    ref::Case c = fc.c;
    std::vector<std::string> names{w->name};
    bool rounded = false;
    auto substitute = [&](const char* input, const TensorInfo& t, double shift) -> bool {
      ref::Tensor& dst = c.inputs.at(input);
      if (static_cast<std::uint64_t>(dst.numel()) != t.elements || !t.readable) {
        F.push_back({"error", "functional", {id, t.name},
                     fmt::format("fixture case {}: {} has {} elements ({}), the case's {} {}", id, t.name, t.elements, t.dtype, input,
                                 dst.numel())});
        return false;
      }
      const std::vector<double> v = ckpt.read(t);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double want = v[i] + shift;
        dst.data[i] = ref::round_to(want, dst.dtype);
        rounded = rounded || (dst.data[i] != want && !std::isnan(want));
      }
      return true;
    };
    // scale = offset_ckpt + w_ckpt must equal weight_offset + w_case.
    if (!substitute("weight", *w, b.offset - c.weight_offset)) continue;
    if (bias) {
      names.push_back(bias->name);
      if (!substitute("bias", *bias, 0)) continue;
    }
    const ref::Result res = ref::evaluate(c);
    conf::Outputs got;
    for (const auto& [name, out] : res.outputs) got[name] = out.value;
    const conf::CaseResult cr = conf::check_case(fc, got, conf::derive_allowances(fc.c));
    std::string detail;
    for (const auto& o : cr.outputs)
      if (o.verdict != conf::Verdict::passed)
        detail += fmt::format("{}{}: {} {} (max {:.3g} ulp, {:.3g}x its allowance)", detail.empty() ? "" : "; ", o.name,
                              conf::name_of(o.verdict), o.reason, o.max_ulp, o.max_ratio);
    std::string note = rounded ? fmt::format(" (the checkpoint's values rounded to the case's {})", ref::name_of(c.dtype_param)) : "";
    // A checkpoint stored narrower than the recorded parameters differs by its rounding alone;
    // say so, since that is a property of the dtype, not a wrong load (the diff mode tells them apart).
    const auto narrower = [&](const std::string& d) {
      const int bits = d == "F64" ? 53 : d == "F32" ? 24 : d == "F16" ? 11 : d == "BF16" ? 8 : 0;
      return bits > 0 && bits < ref::format_of(c.dtype_param).precision;
    };
    if (narrower(w->dtype))
      note += fmt::format(" (the checkpoint stores {}, the fixtures were recorded with {} parameters: the rounding alone "
                          "changes the outputs; `--source` tells rounding from a wrong load)",
                          w->dtype, ref::name_of(c.dtype_param));
    if (conf::is_failure(cr.verdict))
      F.push_back({"error", "functional", names,
                   fmt::format("fixture case {} with the checkpoint's parameters{}: {}: {}", id, note, conf::name_of(cr.verdict), detail)});
    else if (cr.verdict == conf::Verdict::mistrusted)
      F.push_back({"info", "functional", names, fmt::format("fixture case {}: MISTRUSTED: {}", id, detail)});
    else
      passed.push_back(id);
  }
  if (!passed.empty())
    F.push_back({"info", "functional", passed,
                 fmt::format("{} fixture case(s) pass with the checkpoint's parameters", passed.size())});
  if (!skipped.empty())
    F.push_back({"info", "functional", skipped,
                 fmt::format("{} fixture case(s) without affine parameters, blocks or backward: not run", skipped.size())});
  if (passed.empty() && std::none_of(F.begin(), F.end(), [](const Finding& f) { return f.check == "functional" && f.severity == "error"; }))
    F.push_back({"warning", "functional", {}, "no fixture case was run against the checkpoint's parameters"});
  std::stable_sort(F.begin(), F.end(), [](const Finding& x, const Finding& y) {
    auto rank = [](const std::string& s) { return s == "error" ? 0 : s == "warning" ? 1 : 2; };
    return rank(x.severity) < rank(y.severity);
  });
  return r;
}

}  // namespace normcheck::audit
