/* Tensor lookup and row addressing shared by the property tests' C test plugins
 * (skip_nonfinite_plugin.c, layout_test_plugin.c). The bundled example plugins
 * (conformance/examples/plugin, docs/examples) keep their own copies on purpose: each is
 * meant to be read and copied on its own. */
#ifndef NORMCHECK_PROPERTY_TESTS_TEST_PLUGIN_UTIL_H
#define NORMCHECK_PROPERTY_TESTS_TEST_PLUGIN_UTIL_H

#include <string.h>

#include "normcheck/candidate.h"

/* The named tensor `name` of a list, or NULL when the case has none. */
static inline nc_tensor* find(const nc_named_tensor* list, int32_t n, const char* name) {
  int32_t i;
  for (i = 0; i < n; ++i)
    if (strcmp(list[i].name, name) == 0) return (nc_tensor*)&list[i].tensor;
  return NULL;
}

/* Offset in elements of element (row r, column 0) of t: rows run over all dims but the last,
 * in row-major order, and each dim contributes its own stride. */
static inline int64_t strided_row_offset(const nc_tensor* t, int64_t r) {
  int64_t off = 0;
  int32_t d;
  for (d = t->rank - 2; d >= 0; --d) {
    off += (r % t->shape[d]) * t->strides[d];
    r /= t->shape[d];
  }
  return off;
}

#endif
