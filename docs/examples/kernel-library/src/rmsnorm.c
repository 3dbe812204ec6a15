#include "tiny_rmsnorm.h"

#include <math.h>

void tiny_rmsnorm_f32(const float* x, const float* weight, const float* bias, float* y, float* rstd, size_t rows,
                      size_t cols, ptrdiff_t ld_x, ptrdiff_t ld_y, float eps) {
  size_t r, j;
  for (r = 0; r < rows; ++r) {
    const float* xr = x + (ptrdiff_t)r * ld_x;
    float* yr = y + (ptrdiff_t)r * ld_y;
    float sq = 0.0f, rs;
    for (j = 0; j < cols; ++j) sq += xr[j] * xr[j];
#ifdef TINY_EPS_OUTSIDE_SQRT
    rs = 1.0f / (sqrtf(sq / (float)cols) + eps);
#else
    rs = 1.0f / sqrtf(sq / (float)cols + eps);
#endif
    for (j = 0; j < cols; ++j) {
      float v = xr[j] * rs;
      if (weight) v *= weight[j];
      if (bias) v += bias[j];
      yr[j] = v;
    }
    if (rstd) rstd[r] = rs;
  }
}
