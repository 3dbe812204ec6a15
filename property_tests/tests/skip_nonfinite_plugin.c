/* skip_nonfinite_rows: a test plugin for the property tests' second sentinel pattern.
 *
 * conformance/examples/plugin/example_layernorm.c with one fault: a row whose sum is not finite
 * is skipped and its outputs are never written. The expected outputs of such rows are NaN, so
 * the host's NaN sentinel hides the fault from `normcheck run` and from the agreement property;
 * the determinism property's second run pre-fills the outputs with another pattern and sees the
 * unwritten elements (tests/CMakeLists.txt: property.second_sentinel).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "normcheck/candidate.h"
#include "test_plugin_util.h"

static int run(void* state, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs,
               nc_named_tensor* outputs, int32_t n_outputs, char* err, size_t err_len) {
  const nc_tensor* x = find(inputs, n_inputs, "x");
  const nc_tensor* w = find(inputs, n_inputs, "weight"); /* NULL when affine is none */
  const nc_tensor* b = find(inputs, n_inputs, "bias");   /* NULL unless weight_bias */
  nc_tensor* y = find(outputs, n_outputs, "y");
  nc_tensor* mean = find(outputs, n_outputs, "mean");
  nc_tensor* rstd = find(outputs, n_outputs, "rstd");
  const int64_t cols = x ? x->shape[x->rank - 1] : 0;
  const float eps = (float)c->epsilon;
  int64_t rows = 1, r, j;
  int32_t d;
  (void)state;
  if (!x || !y || !mean || !rstd) {
    snprintf(err, err_len, "expected input x and outputs y, mean, rstd");
    return 1;
  }
  for (d = 0; d + 1 < x->rank; ++d) rows *= x->shape[d];
  for (r = 0; r < rows; ++r) {
    const float* xr = (const float*)x->data + strided_row_offset(x, r);
    float* yr = (float*)y->data + strided_row_offset(y, r);
    const int64_t xs = x->strides[x->rank - 1], ys = y->strides[y->rank - 1];
    float sum = 0.0f, sq = 0.0f, m, rs;
    for (j = 0; j < cols; ++j) sum += xr[j * xs];
    /* THE FAULT: a row whose sum is not finite is skipped, its outputs never written. The
     * host's NaN sentinel makes them look right (the expected values are NaN there); only a
     * second sentinel pattern shows them. */
    if (!isfinite(sum)) continue;
    m = sum / (float)cols;
    for (j = 0; j < cols; ++j) sq += (xr[j * xs] - m) * (xr[j * xs] - m);
    rs = 1.0f / sqrtf(sq / (float)cols + eps);
    for (j = 0; j < cols; ++j) {
      float v = (xr[j * xs] - m) * rs;
      if (w) v *= ((const float*)w->data)[j * w->strides[0]];
      if (b) v += ((const float*)b->data)[j * b->strides[0]];
      yr[j * ys] = v;
    }
    ((float*)mean->data)[strided_row_offset(mean, r)] = m;
    ((float*)rstd->data)[strided_row_offset(rstd, r)] = rs;
  }
  for (d = 0; d < n_outputs; ++d) outputs[d].written = 1; /* y, mean, rstd are all there is */
  return 0;
}

/* What this plugin takes; normcheck reports every other case UNSUPPORTED without calling it.
 * init, fini and supports are left NULL: no state, and the capabilities say it all. */
static const nc_candidate kCandidate = {
    .abi_version = NORMCHECK_CANDIDATE_ABI_VERSION,
    .struct_size = sizeof(nc_candidate),
    .name = "skip_nonfinite_rows",
    .description = "test plugin: example_layernorm that never writes rows holding NaN or Inf",
    .ops = 1u << NC_LAYERNORM,
    .dtypes = 1u << NC_FLOAT32,
    .compute_dtypes = 1u << NC_FLOAT32,
    .directions = 1u << NC_FORWARD,
    .contracts = "exact",
    .flags = 0u, /* no fused residual, blocks, other axes or weight offset */
    .device = "cpu",
    .run = run};

const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
