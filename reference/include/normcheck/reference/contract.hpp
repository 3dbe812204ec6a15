// Precision contracts: the named points where an implementation is required to round.
//
// The reference is exact everywhere except at these points, where it rounds correctly (RNE) to
// the named dtype. Every contract ends with the rounding of each output to its output dtype.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/dtype.hpp"

namespace normcheck::ref {

// Points of the forward computation, in order:
//   h      = alpha*x + residual (+ residual_bias)      (fused residual only)
//   xhat   = (h - mean) * rstd     (LayerNorm)  or  h * rstd  (RMSNorm)
//   scale  = weight_offset + weight
//   mul    = xhat * scale
//   y      = mul + bias
enum class Point : std::uint8_t { h, xhat, scale, mul };

// Which dtype a rounding point rounds to, relative to the case.
enum class DTypeRole : std::uint8_t { x, param, compute, out, residual };

struct RoundingPoint {
  Point point;
  DTypeRole to;
};

struct Contract {
  std::string name;
  std::vector<RoundingPoint> points;
  std::string models;  // the public code it models, for documentation and `normcheck reference`
};

// The built-in contracts: exact, llama, gemma, te, te_wdtype, onnx, fused_add_lowp.
const std::vector<Contract>& builtin_contracts();

// Parses "name" or "a+b" (the union of the rounding points of a and b, e.g.
// "llama+fused_add_lowp" for vLLM's fused_add_rms_norm). nullopt if a name is unknown.
std::optional<Contract> parse_contract(std::string_view spec);

// The dtype each rounding point of a case's contract rounds to; nullopt where it does not round.
struct ResolvedPoints {
  std::optional<DType> h, xhat, scale, mul;
};
// Throws CaseError("contract", ...) for an unknown contract.
ResolvedPoints resolve_points(const Case& c);

std::string_view name_of(Point p);
std::string_view name_of(DTypeRole r);

}  // namespace normcheck::ref
