// The values of a dtype around a binary64 value, for the judge of quantized outputs
// (checker_quant.cpp) and its diagnosis (diagnosis/quant.cpp). Internal to the judge.
#pragma once

#include <cmath>

#include "normcheck/reference/dtype.hpp"

namespace normcheck::conf::quant_detail {

// The smallest value of T >= v and the largest <= v (infinities where v is beyond the overflow
// threshold: a kernel's rounding of y to T may overflow there, TOLERANCE.md 10.1).
inline double ceil_to(double v, ref::DType t) {
  double r = ref::round_to(v, t);
  if (std::isinf(r)) return r;
  if (r < v) r += 2 * ref::rounding_gap(r, t).above;
  return r;
}
inline double floor_to(double v, ref::DType t) {
  double r = ref::round_to(v, t);
  if (std::isinf(r)) return r;
  if (r > v) r -= 2 * ref::rounding_gap(r, t).below;
  return r;
}

}  // namespace normcheck::conf::quant_detail
