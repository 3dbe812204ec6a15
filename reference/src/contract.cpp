#include "normcheck/reference/contract.hpp"

#include <algorithm>

namespace normcheck::ref {

std::string_view name_of(Point p) {
  switch (p) {
    case Point::h: return "h";
    case Point::xhat: return "xhat";
    case Point::scale: return "scale";
    case Point::mul: return "mul";
  }
  return "?";
}

std::string_view name_of(DTypeRole r) {
  switch (r) {
    case DTypeRole::x: return "dtype_x";
    case DTypeRole::param: return "dtype_param";
    case DTypeRole::compute: return "dtype_compute";
    case DTypeRole::out: return "dtype_out";
    case DTypeRole::residual: return "dtype_residual";
  }
  return "?";
}

// The table of contracts. Each row names the public code whose rounding points it models;
// README.md ("Precision contracts") explains each in words.
const std::vector<Contract>& builtin_contracts() {
  static const std::vector<Contract> table{
      {"exact", {}, "one rounding, at each output"},
      {"llama",
       {{Point::xhat, DTypeRole::x}},
       "HF LlamaRMSNorm: statistics and x*rsqrt(var+eps) in fp32, x-hat cast to the input dtype, "
       "then weight * x-hat in the weight's dtype promotion"},
      {"gemma",
       {{Point::scale, DTypeRole::compute}},
       "HF GemmaRMSNorm: everything in fp32, scale (1 + weight) in fp32, one cast at the end"},
      {"te",
       {{Point::scale, DTypeRole::compute}},
       "TransformerEngine zero_centered_gamma: gamma + 1 in the compute type, multiply in fp32, cast"},
      {"te_wdtype",
       {{Point::scale, DTypeRole::param}},
       "TransformerEngine zero_centered_gamma_in_weight_dtype: gamma + 1 rounded to the weight dtype"},
      {"onnx",
       {{Point::xhat, DTypeRole::x}, {Point::mul, DTypeRole::x}},
       "ONNX LayerNormalization stash_type=1: statistics in fp32, Normalized cast to X's type, "
       "Scale and B applied in X's type"},
      {"fused_add_lowp",
       {{Point::h, DTypeRole::residual}},
       "vLLM fused_add_rms_norm: h = x + residual rounded to the residual dtype and stored, "
       "statistics from the rounded h"},
  };
  return table;
}

std::optional<Contract> parse_contract(std::string_view spec) {
  Contract out;
  out.name = std::string(spec);
  size_t start = 0;
  bool any = false;
  while (start <= spec.size()) {
    const size_t plus = spec.find('+', start);
    const std::string_view part = spec.substr(start, plus == std::string_view::npos ? spec.npos : plus - start);
    const auto& table = builtin_contracts();
    auto it = std::find_if(table.begin(), table.end(), [&](const Contract& c) { return c.name == part; });
    if (it == table.end()) return std::nullopt;
    for (const auto& p : it->points) {
      auto same = [&](const RoundingPoint& q) { return q.point == p.point; };
      if (std::find_if(out.points.begin(), out.points.end(), same) != out.points.end()) {
        // Two contracts round the same point: allowed only to the same dtype.
        auto q = std::find_if(out.points.begin(), out.points.end(), same);
        if (q->to != p.to) return std::nullopt;
        continue;
      }
      out.points.push_back(p);
    }
    if (!out.models.empty()) out.models += "; ";
    out.models += it->models;
    any = true;
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  if (!any) return std::nullopt;
  std::sort(out.points.begin(), out.points.end(),
            [](const RoundingPoint& a, const RoundingPoint& b) { return a.point < b.point; });
  return out;
}

ResolvedPoints resolve_points(const Case& c) {
  const std::optional<Contract> contract = parse_contract(c.contract);
  if (!contract) throw CaseError("contract", "unknown contract '" + c.contract + "'");
  ResolvedPoints p;
  for (const auto& rp : contract->points) {
    DType t = c.dtype_out;
    switch (rp.to) {
      case DTypeRole::x: t = c.dtype_x; break;
      case DTypeRole::param: t = c.dtype_param; break;
      case DTypeRole::compute: t = c.dtype_compute; break;
      case DTypeRole::out: t = c.dtype_out; break;
      case DTypeRole::residual: t = c.dtype_residual; break;
    }
    switch (rp.point) {
      case Point::h: p.h = t; break;
      case Point::xhat: p.xhat = t; break;
      case Point::scale: p.scale = t; break;
      case Point::mul: p.mul = t; break;
    }
  }
  return p;
}

}  // namespace normcheck::ref
