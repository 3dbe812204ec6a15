/* Deliberately broken plugins for plugin_test.cpp: one source, one MODULE per BAD_* variant
 * (CMakeLists.txt). Apart from its fault, each takes fp32 LayerNorm forward and writes zeros. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#if defined(BAD_HANGS)
#include <unistd.h>
#endif

#include "normcheck/candidate.h"

#if defined(BAD_SETS_FTZ) || defined(BAD_FTZ_ON_LOAD)
#include <xmmintrin.h>
/* MXCSR flush-to-zero (bit 15) and denormals-are-zero (bit 6), as -ffast-math sets them. */
static void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | 0x8040u); }
#endif

#ifdef BAD_FTZ_ON_LOAD
/* What crtfastmath.o does in a -ffast-math build: set FTZ/DAZ when the library is loaded. */
__attribute__((constructor)) static void on_load(void) { set_ftz_daz(); }
#endif

/* Writes zeros over the first `skip_last` ? n - 1 : n elements of a dense fp32 output. */
static void fill_zeros(nc_named_tensor* t, int skip_last) {
  int64_t n = 1;
  int32_t d;
  for (d = 0; d < t->tensor.rank; ++d) n *= t->tensor.shape[d];
  memset(t->tensor.data, 0, (size_t)(skip_last ? n - 1 : n) * sizeof(float));
  t->written = 1;
}

static int run(void* state, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs,
               nc_named_tensor* outputs, int32_t n_outputs, char* err, size_t err_len) {
  int32_t i;
  (void)state, (void)c, (void)inputs, (void)n_inputs;  /* c->case_id: see BAD_RUN_ERROR */
#ifdef BAD_RUN_ERROR
  snprintf(err, err_len, "deliberate failure: kernel launch failed (%d outputs) in case '%s'", (int)n_outputs,
           c->case_id);
  return 7;
#else
  (void)err, (void)err_len;
#endif
#ifdef BAD_SETS_FTZ
  set_ftz_daz();
#endif
#if defined(BAD_SEGFAULTS) || defined(BAD_HANGS)
  {
    static int calls = 0;
    if (++calls == 2) { /* the second case: a wild write, or a kernel that never returns */
#ifdef BAD_SEGFAULTS
      raise(SIGSEGV);
#else
      for (;;) pause();
#endif
    }
  }
#endif
  for (i = 0; i < n_outputs; ++i) {
    const int is_y = strcmp(outputs[i].name, "y") == 0;
#ifdef BAD_UNWRITTEN
    if (strcmp(outputs[i].name, "rstd") == 0) continue; /* forgets rstd */
#endif
#ifdef BAD_PARTIAL
    fill_zeros(&outputs[i], is_y); /* says it wrote y, but leaves its last element */
#else
    fill_zeros(&outputs[i], 0);
#endif
    (void)is_y;
  }
  return 0;
}

#ifdef BAD_INIT_FAILS
static void* init(char* err, size_t err_len) {
  snprintf(err, err_len, "no device found (deliberate)");
  return NULL;
}
#endif

#ifdef BAD_DECLINES
static int supports(void* state, const nc_case* c, char* reason, size_t reason_len) {
  (void)state;
  if (c->shape[c->rank - 1] % 8 == 0) return 0;
  snprintf(reason, reason_len, "hidden size %lld is not a multiple of 8", (long long)c->shape[c->rank - 1]);
  return 1;
}
#endif

static const nc_candidate kCandidate = {
#ifdef BAD_ABI2
    .abi_version = 2,
#else
    .abi_version = NORMCHECK_CANDIDATE_ABI_VERSION,
#endif
#ifdef BAD_SMALL_STRUCT
    .struct_size = 16,
#else
    .struct_size = sizeof(nc_candidate),
#endif
    .name = "bad_plugin",
#ifdef BAD_INTENDED_MUTANT
    /* A library's own mutant: its zeros must be rejected, and it says it is meant to be. */
    .description = "writes zeros for y (the library's own mutation test)",
    .flags = NC_CAP_INTENDED_MUTANT,
#endif
    .ops = 1u << NC_LAYERNORM,
    .dtypes = 1u << NC_FLOAT32,
    .compute_dtypes = 1u << NC_FLOAT32,
    .directions = 1u << NC_FORWARD,
    .contracts = "exact",
#ifdef BAD_INIT_FAILS
    .init = init,
#endif
#ifdef BAD_DECLINES
    .supports = supports,
#endif
#ifndef BAD_NULL_RUN
    .run = run,
#endif
};

#if defined(BAD_NO_SYMBOL)
/* Exports a misspelt entry point. */
NORMCHECK_EXPORT const nc_candidate* normcheck_candidates(void);
const nc_candidate* normcheck_candidates(void) { return &kCandidate; }
#elif defined(BAD_NULL_DESCRIPTOR)
const nc_candidate* normcheck_candidate(void) { return NULL; }
#else
const nc_candidate* normcheck_candidate(void) { return &kCandidate; }
#endif
