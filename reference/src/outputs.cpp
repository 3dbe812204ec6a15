#include "normcheck/reference/outputs.hpp"

#include "quant_eval.hpp"

namespace normcheck::ref {

std::map<std::string, OutputSpec> output_specs(const Case& c) {
  std::map<std::string, OutputSpec> out;
  const auto g = geometry_of(c);
  const bool ln = c.op == Op::layernorm;
  const bool w = c.affine != Affine::none;
  const bool b = c.affine == Affine::weight_bias;
  if (c.block != Block::none) {
    const auto shape_of = [&](const char* name) { return c.inputs.at(name).shape; };
    if (c.direction == Direction::forward) {
      out["y"] = {c.dtype_out, g.shape};
      return out;
    }
    out["dx"] = {c.dtype_x, g.shape};
    if (w) out["dweight"] = {c.dtype_param, shape_of("weight")};
    if (b) out["dbias"] = {c.dtype_param, shape_of("bias")};
    for (const char* n : {"ffn_w1", "ffn_b1", "ffn_w2", "ffn_b2"})
      out[std::string("d") + n] = {c.dtype_param, shape_of(n)};
    return out;
  }
  const bool res = c.residual != Residual::none;
  if (c.quant) return detail::quant_output_specs(c, g);
  if (c.direction == Direction::forward) {
    out["y"] = {c.dtype_out, g.shape};
    if (ln) out["mean"] = {c.dtype_compute, g.stat_shape};
    out["rstd"] = {c.dtype_compute, g.stat_shape};
    if (res) out["residual_out"] = {c.dtype_residual, g.shape};
    return out;
  }
  out["dx"] = {c.dtype_x, g.shape};
  if (res) out["dresidual"] = {c.dtype_residual, g.shape};
  if (w) out["dweight"] = {c.dtype_param, g.param_shape};
  if (b) out["dbias"] = {c.dtype_param, g.param_shape};
  if (c.residual == Residual::add_bias) out["dresidual_bias"] = {c.dtype_param, g.param_shape};
  return out;
}

}  // namespace normcheck::ref
