/* tiny_rmsnorm: RMSNorm over the last dim of a row-major float32 matrix. */
#ifndef TINY_RMSNORM_H
#define TINY_RMSNORM_H
#include <stddef.h>

/* y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight + bias (weight and bias may be
 * NULL); rstd[r] gets the reciprocal RMS when rstd is not NULL. Rows are ld elements apart. */
void tiny_rmsnorm_f32(const float* x, const float* weight, const float* bias, float* y, float* rstd, size_t rows,
                      size_t cols, ptrdiff_t ld_x, ptrdiff_t ld_y, float eps);

#endif
