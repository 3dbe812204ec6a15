/* The glue that lets normcheck call tiny_rmsnorm_f32: describe what the kernel takes and map a
 * case's tensors onto its arguments. The ABI is normcheck/candidate.h (target
 * normcheck::candidate). Outputs are dense and row-major; inputs may be strided, so each row of
 * x (and the weight) is gathered into a contiguous buffer when its stride is not 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "normcheck/candidate.h"
#include "tiny_rmsnorm.h"

static const nc_tensor* find(const nc_named_tensor* list, int32_t n, const char* name) {
  int32_t i;
  for (i = 0; i < n; ++i)
    if (strcmp(list[i].name, name) == 0) return &list[i].tensor;
  return NULL;
}

/* Offset in elements of element (row r, column 0): rows run over all dims but the last. */
static int64_t row_offset(const nc_tensor* t, int64_t r) {
  int64_t off = 0;
  int32_t d;
  for (d = t->rank - 2; d >= 0; --d) {
    off += (r % t->shape[d]) * t->strides[d];
    r /= t->shape[d];
  }
  return off;
}

/* A contiguous copy of n floats spaced `stride` apart, or p itself when stride is 1. */
static const float* contiguous(const float* p, int64_t n, int64_t stride, float* scratch) {
  int64_t j;
  if (stride == 1) return p;
  for (j = 0; j < n; ++j) scratch[j] = p[j * stride];
  return scratch;
}

static int run(void* state, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs,
               nc_named_tensor* outputs, int32_t n_outputs, char* err, size_t err_len) {
  const nc_tensor* x = find(inputs, n_inputs, "x");
  const nc_tensor* w = find(inputs, n_inputs, "weight"); /* NULL when affine is none */
  const nc_tensor* b = find(inputs, n_inputs, "bias");   /* NULL unless weight_bias */
  nc_tensor* y = (nc_tensor*)find(outputs, n_outputs, "y");
  nc_tensor* rstd = (nc_tensor*)find(outputs, n_outputs, "rstd");
  const int64_t cols = x ? x->shape[x->rank - 1] : 0;
  int64_t rows = 1, r;
  int32_t d;
  float *scratch, *weight = NULL, *bias = NULL;
  (void)state;
  if (!x || !y) {
    snprintf(err, err_len, "expected input x and output y");
    return 1;
  }
  for (d = 0; d + 1 < x->rank; ++d) rows *= x->shape[d];
  scratch = malloc((size_t)(3 * cols) * sizeof(float));
  if (!scratch) {
    snprintf(err, err_len, "out of memory");
    return 1;
  }
  if (w) weight = (float*)contiguous((const float*)w->data, cols, w->strides[0], scratch + cols);
  if (b) bias = (float*)contiguous((const float*)b->data, cols, b->strides[0], scratch + 2 * cols);
  for (r = 0; r < rows; ++r) {
    const float* xr = contiguous((const float*)x->data + row_offset(x, r), cols,
                                 x->strides[x->rank - 1], scratch);
    float rs;
    tiny_rmsnorm_f32(xr, weight, bias, (float*)y->data + row_offset(y, r), &rs, 1, (size_t)cols,
                     (ptrdiff_t)cols, (ptrdiff_t)cols, (float)c->epsilon);
    if (rstd) ((float*)rstd->data)[row_offset(rstd, r)] = rs;
  }
  free(scratch);
  for (d = 0; d < n_outputs; ++d) outputs[d].written = 1;
  return 0;
}

/* What the kernel takes; normcheck reports every other case UNSUPPORTED without calling it. */
static const nc_candidate kCandidate = {
    .abi_version = NORMCHECK_CANDIDATE_ABI_VERSION,
    .struct_size = sizeof(nc_candidate),
    .name = "tiny_rmsnorm",
    .description = "tiny_kernels' RMSNorm forward, float32, last dim",
    .ops = 1u << NC_RMSNORM,
    .dtypes = 1u << NC_FLOAT32,
    .compute_dtypes = 1u << NC_FLOAT32,
    .directions = 1u << NC_FORWARD,
    .contracts = "exact",
    .flags = 0u, /* no fused residual, blocks, other axes or weight offset */
    .device = "cpu",
    .run = run};

const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
