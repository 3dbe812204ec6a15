// Which outputs a case has: part of the case's semantics, shared by everything that produces or
// judges outputs (the reference's evaluate, the tolerance model, the checker, the diagnosis,
// every candidate transport).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "normcheck/reference/case.hpp"

namespace normcheck::ref {

// Outputs by name ("y", "mean", "rstd", "residual_out", "dx", ...), each a dense row-major
// tensor whose values belong to its dtype. An output a candidate does not produce is left out
// (the checker's MISSING).
using Outputs = std::map<std::string, Tensor>;

// The dtype and shape of one output.
// `codes` is non-empty for a quantized output (its code format, as Output::codes): q has the
// shape of x (one code per element, NVFP4 included), block scales [..., D / block].
struct OutputSpec {
  DType dtype;
  std::vector<std::int64_t> shape;
  std::string codes = {};
};

// The outputs a case produces, name -> (dtype, shape):
//   forward:  y; mean (layernorm); rstd; residual_out (fused residual)
//   backward: dx; dresidual (fused residual); dweight, dbias (affine); dresidual_bias (add_bias)
//   blocks:   y forward; dx, dweight, dbias and the FFN's dffn_w1/b1/w2/b2 backward
//   quant:    q; scale (dynamic float32 [rows], MX E8M0 / NVFP4 E4M3 codes [..., D/block]);
//             global_scale (NVFP4, float32 [1]); amax (if written: [1], per row or per block);
//             y (if written, dtype_out); residual_out (fused residual)
// Throws CaseError for an invalid geometry (geometry_of), std::out_of_range for a block case
// without one of its parameters (validate() rejects both).
std::map<std::string, OutputSpec> output_specs(const Case& c);

}  // namespace normcheck::ref
