// Declarations shared by the CPU kernels' sources. Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels.hpp"

namespace normcheck::conf::cpu::detail {

// The input `name` of the case, checked to hold `numel` values; throws ref::CaseError.
const ref::Tensor* input(const ref::Case& c, const char* name, std::int64_t numel);
// A zero-filled output tensor.
ref::Tensor make_tensor(ref::DType t, const std::vector<std::int64_t>& shape);

// Residual blocks (block_kernel.cpp).
Outputs run_block(const ref::Case& c, Reduction r, Fault f);
// Fused norm + quantization (quant_kernel.cpp): c.quant is set.
Outputs run_quant(const ref::Case& c, Reduction r, Fault f);

}  // namespace normcheck::conf::cpu::detail
