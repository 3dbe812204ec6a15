/* A test plugin for the batch- and memory-layout properties and for declared flush-to-zero
 * outputs (tests/CMakeLists.txt), built several ways from this file:
 *
 *   ASSUME_DENSE          indexes x, weight and bias as dense row-major, ignoring their strides
 *                         (a fault: candidate.h lets the host pass padded, offset or permuted
 *                         inputs): memory_layout_invariance must fail;
 *   BATCH_ORDER           sums each row backwards when the batch has more than one row, forwards
 *                         for a single row (both correct, not bit-identical): batch_invariance must
 *                         fail while the plugin does not declare it ...
 *   DECLARE_BATCH_ORDER   ... and pass once it declares NC_CAP_BATCH_DEPENDENT_ORDER (compared
 *                         within tolerance).
 *   FLUSH_BELOW=v         returns 0 (with the sign) for every output value below v in magnitude:
 *                         with v = FLT_MIN, flush-to-zero of subnormal outputs, which fails
 *                         agreement while the plugin does not declare it ...
 *   DECLARE_FLUSH         ... and passes once it declares NC_CAP_FLUSH_SUBNORMAL_OUTPUTS; with a
 *                         larger v (normal values flushed too) it must fail even so.
 *
 * Otherwise conformance/examples/plugin/example_layernorm.c: float32 LayerNorm, last axis, forward.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "normcheck/candidate.h"
#include "test_plugin_util.h"

/* Offset of element (row r, column 0): rows run over all dims but the last, row-major. */
static int64_t row_offset(const nc_tensor* t, int64_t r) {
#ifdef ASSUME_DENSE
  return r * t->shape[t->rank - 1]; /* THE FAULT: strides ignored */
#else
  return strided_row_offset(t, r);
#endif
}

static int64_t col_stride(const nc_tensor* t) {
#ifdef ASSUME_DENSE
  (void)t;
  return 1;
#else
  return t->strides[t->rank - 1];
#endif
}

/* The output value v as the plugin returns it. */
static float out(float v) {
#ifdef FLUSH_BELOW
  if (fabsf(v) < (float)(FLUSH_BELOW)) return copysignf(0.0f, v);
#endif
  return v;
}

static int run(void* state, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs,
               nc_named_tensor* outputs, int32_t n_outputs, char* err, size_t err_len) {
  const nc_tensor* x = find(inputs, n_inputs, "x");
  const nc_tensor* w = find(inputs, n_inputs, "weight");
  const nc_tensor* b = find(inputs, n_inputs, "bias");
  nc_tensor* y = find(outputs, n_outputs, "y");
  nc_tensor* mean = find(outputs, n_outputs, "mean");
  nc_tensor* rstd = find(outputs, n_outputs, "rstd");
  const int64_t cols = x ? x->shape[x->rank - 1] : 0;
  const float eps = (float)c->epsilon;
  int64_t rows = 1, r, k;
  int32_t d;
  int backwards;
  (void)state;
  if (!x || !y || !mean || !rstd) {
    snprintf(err, err_len, "expected input x and outputs y, mean, rstd");
    return 1;
  }
  for (d = 0; d + 1 < x->rank; ++d) rows *= x->shape[d];
#ifdef BATCH_ORDER
  backwards = rows > 1;
#else
  backwards = 0;
#endif
  for (r = 0; r < rows; ++r) {
    const float* xr = (const float*)x->data + row_offset(x, r);
    float* yr = (float*)y->data + row_offset(y, r);
    const int64_t xs = col_stride(x), ys = y->strides[y->rank - 1];
    float sum = 0.0f, sq = 0.0f, m, rs;
    for (k = 0; k < cols; ++k) sum += xr[(backwards ? cols - 1 - k : k) * xs];
    m = sum / (float)cols;
    for (k = 0; k < cols; ++k) {
      const float dv = xr[(backwards ? cols - 1 - k : k) * xs] - m;
      sq += dv * dv;
    }
    rs = 1.0f / sqrtf(sq / (float)cols + eps);
    for (k = 0; k < cols; ++k) {
      float v = (xr[k * xs] - m) * rs;
      if (w) v *= ((const float*)w->data)[k * col_stride(w)];
      if (b) v += ((const float*)b->data)[k * col_stride(b)];
      yr[k * ys] = out(v);
    }
    ((float*)mean->data)[row_offset(mean, r)] = out(m);
    ((float*)rstd->data)[row_offset(rstd, r)] = out(rs);
  }
  for (d = 0; d < n_outputs; ++d) outputs[d].written = 1;
  return 0;
}

static const nc_candidate kCandidate = {
    .abi_version = NORMCHECK_CANDIDATE_ABI_VERSION,
    .struct_size = sizeof(nc_candidate),
    .name = "layout_test",
    .description = "test plugin for batch and memory layout invariance (property_tests/tests)",
    .ops = 1u << NC_LAYERNORM,
    .dtypes = 1u << NC_FLOAT32,
    .compute_dtypes = 1u << NC_FLOAT32,
    .directions = 1u << NC_FORWARD,
    .contracts = "exact",
#if defined(DECLARE_BATCH_ORDER)
    .flags = NC_CAP_BATCH_DEPENDENT_ORDER,
#elif defined(DECLARE_FLUSH)
    .flags = NC_CAP_FLUSH_SUBNORMAL_OUTPUTS,
#else
    .flags = 0u,
#endif
    .device = "cpu",
    .run = run};

const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
