// Residual blocks (post, pre, sandwich, deepnorm) of L layers with a position-wise FFN,
// forward and backward, evaluated with MPFR interval arithmetic and Ziv's loop (internal).
#pragma once

#include "normcheck/reference/evaluate.hpp"

namespace normcheck::ref::detail {

Result evaluate_block(const Case& c, const Options& opt);

}  // namespace normcheck::ref::detail
