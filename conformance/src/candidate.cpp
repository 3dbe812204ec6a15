// What the Candidate interface means to the runner: kind names, capabilities against a case
// (unsupported_reason), check options and judged outputs. The spec dispatch (make_candidate) and
// the registry of built-in candidates are in ../candidates/.
#include "normcheck/conformance/candidate.hpp"

#include <fmt/core.h>

#include <algorithm>

#include "normcheck/judge/checker.hpp"
#include "normcheck/reference/contract.hpp"

namespace normcheck::conf {

std::string_view name_of(CandidateKind k) {
  switch (k) {
    case CandidateKind::correct: return "correct";
    case CandidateKind::mutant: return "mutant";
    case CandidateKind::external: return "external";
  }
  return "?";
}

namespace {

template <class T>
bool has(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool contract_supported(const Capabilities& caps, const std::string& spec) {
  if (has(caps.contracts, std::string("*")) || has(caps.contracts, spec)) return true;
  // "a+b": supported when every part is.
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t plus = spec.find('+', start);
    const std::string part = spec.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
    if (!has(caps.contracts, part)) return false;
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return true;
}

}  // namespace

std::optional<std::string> unsupported_reason(const Capabilities& caps, const ref::Case& c) {
  if (!has(caps.ops, c.op)) return fmt::format("op {} not supported", ref::name_of(c.op));
  if (c.quant) {
    if (caps.quant_formats.empty() || caps.quant_scales.empty())
      return std::string(
          "quantized outputs (q, scale) not supported: the candidate declares no quant formats and scale kinds "
          "(candidate.h quant_formats/quant_scales, the protocol's capabilities.quant_formats/quant_scales)");
    if (!has(caps.quant_formats, c.quant->format))
      return fmt::format("quant format {} not supported", ref::name_of(c.quant->format));
    if (!has(caps.quant_scales, c.quant->scale))
      return fmt::format("quant scale {} not supported", ref::name_of(c.quant->scale));
  }
  if (!has(caps.directions, c.direction))
    return fmt::format("direction {} not supported", ref::name_of(c.direction));
  const std::pair<const char*, ref::DType> roles[] = {{"dtype_x", c.dtype_x},
                                                      {"dtype_param", c.dtype_param},
                                                      {"dtype_out", c.dtype_out},
                                                      {"dtype_residual", c.dtype_residual}};
  for (const auto& [role, t] : roles) {
    if (std::string_view(role) == "dtype_residual" && c.residual == ref::Residual::none) continue;
    if (!has(caps.dtypes, t)) return fmt::format("{} {} not supported", role, ref::name_of(t));
  }
  if (!has(caps.compute_dtypes, c.dtype_compute))
    return fmt::format("dtype_compute {} not supported", ref::name_of(c.dtype_compute));
  if (!contract_supported(caps, c.contract)) return fmt::format("contract {} not supported", c.contract);
  if (c.residual != ref::Residual::none && !caps.residual) return std::string("fused residual not supported");
  if (c.block != ref::Block::none && !caps.blocks)
    return fmt::format("{} blocks not supported", ref::name_of(c.block));
  if (c.weight_offset != 0 && !caps.weight_offset) return std::string("weight_offset not supported");
  if (!caps.general_axes) {
    const auto g = ref::geometry_of(c);
    const auto rank = static_cast<std::int64_t>(g.shape.size());
    if (g.norm_dims.size() != 1 || g.norm_dims[0] != rank - 1)
      return std::string("normalization over dims other than the last not supported");
  }
  return std::nullopt;
}

CheckOptions check_options_of(const Capabilities& caps) {
  CheckOptions o;
  o.flush_subnormal_outputs = caps.flush_subnormal_outputs;
  return o;
}

std::optional<fix::FixtureCase> judged_outputs(const fix::FixtureCase& fc, const Capabilities& caps) {
  if (!caps.no_statistics || (!fc.expected.count("mean") && !fc.expected.count("rstd"))) return std::nullopt;
  fix::FixtureCase judged;
  judged.id = fc.id;
  judged.category = fc.category;
  judged.description = fc.description;
  judged.c = fc.c;
  for (const auto& [name, out] : fc.expected)
    if (name != "mean" && name != "rstd") judged.expected.emplace(name, out);
  return judged;
}

}  // namespace normcheck::conf
