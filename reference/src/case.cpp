#include "normcheck/reference/case.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "normcheck/reference/contract.hpp"
#include "quant_eval.hpp"

namespace normcheck::ref {

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

CaseError::CaseError(std::string field, const std::string& message)
    : std::runtime_error(field + ": " + message), field_(std::move(field)) {}

namespace {

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void check_shape(const std::string& field, const std::vector<std::int64_t>& shape) {
  if (shape.empty()) throw CaseError(field, "rank 0 (a scalar) cannot be normalized; give a shape");
  if (static_cast<std::int64_t>(shape.size()) > kMaxRank)
    throw CaseError(field, "rank " + std::to_string(shape.size()) + " exceeds the limit of " +
                               std::to_string(kMaxRank));
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 1) throw CaseError(field, "dimension " + std::to_string(d) + " in shape " + shape_text(shape) + " is not positive");
    if (d > kMaxElements || n > kMaxElements / d)
      throw CaseError(field, "shape " + shape_text(shape) + " has more than 2^31 elements");
    n *= d;
  }
}

}  // namespace

Geometry geometry_of(const Case& c) {
  auto it = c.inputs.find("x");
  if (it == c.inputs.end()) throw CaseError("inputs/x", "missing");
  const Tensor& x = it->second;
  check_shape("inputs/x", x.shape);
  const auto rank = static_cast<std::int64_t>(x.shape.size());

  Geometry g;
  g.shape = x.shape;
  if (c.axes) {
    if (c.axes->empty()) throw CaseError("axes", "empty list: give at least one normalized dim");
    for (auto a : *c.axes) {
      if (a < -rank || a >= rank)
        throw CaseError("axes", "dim " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
      g.norm_dims.push_back(a < 0 ? a + rank : a);
    }
    std::sort(g.norm_dims.begin(), g.norm_dims.end());
    if (std::adjacent_find(g.norm_dims.begin(), g.norm_dims.end()) != g.norm_dims.end())
      throw CaseError("axes", "a dim is listed twice");
  } else {
    if (c.axis < -rank || c.axis >= rank)
      throw CaseError("axis", std::to_string(c.axis) + " out of range for rank " + std::to_string(rank) +
                                  " (valid: " + std::to_string(-rank) + ".." + std::to_string(rank - 1) + ")");
    for (auto d = c.axis < 0 ? c.axis + rank : c.axis; d < rank; ++d) g.norm_dims.push_back(d);
  }

  std::vector<bool> is_norm(rank, false);
  for (auto d : g.norm_dims) is_norm[d] = true;
  std::vector<std::int64_t> stride(rank, 1);
  for (auto d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.shape[d + 1];

  std::vector<std::int64_t> row_dims;
  g.stat_shape = x.shape;
  for (std::int64_t d = 0; d < rank; ++d) {
    if (is_norm[d]) {
      g.param_shape.push_back(x.shape[d]);
      g.stat_shape[d] = 1;
    } else {
      row_dims.push_back(d);
    }
  }
  // Enumerate offsets of a dim set in row-major order of that set.
  auto offsets = [&](const std::vector<std::int64_t>& dims) {
    std::vector<std::int64_t> out{0};
    for (auto d : dims) {
      std::vector<std::int64_t> next;
      next.reserve(out.size() * x.shape[d]);
      for (auto base : out)
        for (std::int64_t i = 0; i < x.shape[d]; ++i) next.push_back(base + i * stride[d]);
      out = std::move(next);
    }
    return out;
  };
  g.row_base = offsets(row_dims);
  g.col_delta = offsets(g.norm_dims);
  g.rows = static_cast<std::int64_t>(g.row_base.size());
  g.cols = static_cast<std::int64_t>(g.col_delta.size());
  return g;
}

namespace {

void check_tensor(const Case& c, const std::string& name, DType want, const std::vector<std::int64_t>& shape,
                  bool values = true) {
  const std::string field = "inputs/" + name;
  auto it = c.inputs.find(name);
  if (it == c.inputs.end()) throw CaseError(field, "missing (required by this case)");
  const Tensor& t = it->second;
  if (t.dtype != want)
    throw CaseError(field, "dtype " + std::string(name_of(t.dtype)) + " but the case says " +
                               std::string(name_of(want)));
  if (t.shape != shape)
    throw CaseError(field, "shape " + shape_text(t.shape) + " but " + shape_text(shape) + " is required");
  if (static_cast<std::int64_t>(t.data.size()) != t.numel())
    throw CaseError(field, std::to_string(t.data.size()) + " values for shape " + shape_text(t.shape));
  if (t.dtype == DType::float64 || !values) return;
  if (t.dtype == DType::float32) {  // the common case, in one vectorizable pass
    bool all = true;
    for (double v : t.data) all &= (static_cast<double>(static_cast<float>(v)) == v) | (v != v);
    if (all) return;
  }
  for (size_t i = 0; i < t.data.size(); ++i)
    if (!representable(t.data[i], t.dtype))
      throw CaseError(field, "element " + std::to_string(i) + " = " + hex_text(t.data[i]) + " is not a " +
                                 std::string(name_of(t.dtype)) + " value");
}

}  // namespace

namespace {

// Every input must be one the case uses: a stray tensor is almost always a mistake in the
// case (a wrong affine or residual attribute), so it is named rather than ignored.
void reject_unused_inputs(const Case& c, const std::vector<std::string>& known, const std::string& what) {
  for (const auto& [name, t] : c.inputs)
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw CaseError("inputs/" + name, "not used by " + what);
}

void validate_block(const Case& c, const Geometry& g) {
  const std::string block(name_of(c.block));
  const auto rank = static_cast<std::int64_t>(g.shape.size());
  if (c.axes || !(c.axis == -1 || c.axis == rank - 1))
    throw CaseError("axis", "a " + block + " block normalizes the last (hidden) dim: axis must be -1");
  if (c.residual != Residual::none)
    throw CaseError("residual", "must be none in a " + block + " block (the block has its own residual)");
  if (c.contract != "exact")
    throw CaseError("contract", "'" + c.contract + "' with a block: only 'exact' is evaluated for blocks");
  if (c.block != Block::deepnorm && c.alpha != 1.0)
    throw CaseError("alpha", "is DeepNorm's residual scale; it must be 1 for a " + block + " block");
  if (c.layers < 1 || c.layers > kMaxLayers)
    throw CaseError("layers", std::to_string(c.layers) + " is outside 1.." + std::to_string(kMaxLayers));
  const std::int64_t L = c.layers, D = g.shape.back();
  const std::int64_t K = c.block == Block::sandwich ? 2 : 1;
  auto w1 = c.inputs.find("ffn_w1");
  if (w1 == c.inputs.end()) throw CaseError("inputs/ffn_w1", "missing (required by a block)");
  if (w1->second.shape.size() != 3 || w1->second.shape[0] != L || w1->second.shape[2] != D)
    throw CaseError("inputs/ffn_w1", "shape must be [layers, ffn_hidden, hidden] = [" + std::to_string(L) +
                                         ", D_ff, " + std::to_string(D) + "]");
  const std::int64_t F = w1->second.shape[1];
  if (F < 1 || F > (std::int64_t{1} << 20)) throw CaseError("inputs/ffn_w1", "ffn hidden size out of range");
  if (D * F > (std::int64_t{1} << 26) / L) throw CaseError("inputs/ffn_w1", "FFN too large for the reference");
  check_tensor(c, "x", c.dtype_x, g.shape);
  check_tensor(c, "ffn_w1", c.dtype_param, {L, F, D});
  check_tensor(c, "ffn_b1", c.dtype_param, {L, F});
  check_tensor(c, "ffn_w2", c.dtype_param, {L, D, F});
  check_tensor(c, "ffn_b2", c.dtype_param, {L, D});
  std::vector<std::string> known{"x", "ffn_w1", "ffn_b1", "ffn_w2", "ffn_b2"};
  if (c.affine != Affine::none) {
    check_tensor(c, "weight", c.dtype_param, {L, K, D});
    known.push_back("weight");
  }
  if (c.affine == Affine::weight_bias) {
    check_tensor(c, "bias", c.dtype_param, {L, K, D});
    known.push_back("bias");
  }
  if (c.direction == Direction::backward) {
    check_tensor(c, "dy", c.dtype_out, g.shape);
    known.push_back("dy");
  }
  reject_unused_inputs(c, known, "a " + block + " block case");
  for (const auto& [name, t] : c.inputs)
    for (double v : t.data)
      if (!std::isfinite(v))
        throw CaseError("inputs/" + name, "non-finite values are not evaluated in blocks");
}

}  // namespace

void validate(const Case& c) { detail::validate(c, true); }

void detail::validate(const Case& c, bool x_values) {
  const Geometry g = geometry_of(c);
  if (!std::isfinite(c.epsilon) || c.epsilon < 0)
    throw CaseError("epsilon", hex_text(c.epsilon) + " must be finite and >= 0");
  if (!std::isfinite(c.alpha)) throw CaseError("alpha", "must be finite");
  if (!std::isfinite(c.weight_offset)) throw CaseError("weight_offset", "must be finite");
  if (c.weight_offset != 0.0 && c.affine == Affine::none)
    throw CaseError("weight_offset", "set but affine is none (there is no weight to offset)");
  if (!parse_contract(c.contract)) throw CaseError("contract", "unknown contract '" + c.contract + "'");
  if (c.block != Block::none) {
    if (c.quant) throw CaseError("quant", "quantized outputs are not evaluated for residual blocks");
    validate_block(c, g);
    return;
  }

  check_tensor(c, "x", c.dtype_x, g.shape, x_values);
  std::vector<std::string> known{"x"};
  if (c.affine != Affine::none) {
    check_tensor(c, "weight", c.dtype_param, g.param_shape);
    known.push_back("weight");
  }
  if (c.affine == Affine::weight_bias) {
    check_tensor(c, "bias", c.dtype_param, g.param_shape);
    known.push_back("bias");
  }
  if (c.residual != Residual::none) {
    check_tensor(c, "residual", c.dtype_residual, g.shape);
    known.push_back("residual");
  }
  if (c.residual == Residual::add_bias) {
    check_tensor(c, "residual_bias", c.dtype_param, g.param_shape);
    known.push_back("residual_bias");
  }
  if (c.direction == Direction::backward) {
    check_tensor(c, "dy", c.dtype_out, g.shape);
    known.push_back("dy");
  }
  if (c.quant) {  // fused quantization (quant_eval.cpp)
    if (c.quant->scale == ScaleKind::static_tensor) {
      check_tensor(c, "scale", DType::float32, {1});
      known.push_back("scale");
    }
    detail::validate_quant(c, g);
  }
  reject_unused_inputs(c, known,
                       "this case (op " + std::string(name_of(c.op)) + ", affine " + std::string(name_of(c.affine)) +
                           ", residual " + std::string(name_of(c.residual)) + ", " +
                           std::string(name_of(c.direction)) + ")");
}

}  // namespace normcheck::ref
