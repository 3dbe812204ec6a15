/* normcheck candidate plugin ABI, version 1.
 *
 * A candidate is a shared library that exports one C symbol,
 *
 *     const nc_candidate* normcheck_candidate(void);
 *
 * returning a descriptor that lives as long as the library is loaded. The host checks
 * `abi_version` (== NORMCHECK_CANDIDATE_ABI_VERSION) and `struct_size` before touching anything
 * else. Versioning: `abi_version` changes only for an incompatible change; a compatible one
 * appends fields to nc_candidate or nc_case and grows their `struct_size`, so each side reads a
 * field only when the other side's struct_size covers it. Everything here is C99; no C++ crosses
 * the interface. See conformance/plugin/README.md ("Writing a plugin") and conformance/examples/.
 *
 * Tensors are host memory. Inputs are read-only. Outputs are allocated by the host, dense and
 * row-major, and filled with a sentinel (NaN; code outputs 0xFF bytes, nc_quant) before `run`, so an element the candidate never
 * writes cannot pass by accident; the candidate sets `written` = 1 on each output it produces
 * (one left at 0 is reported MISSING); the property tests (`normcheck prop`) call a second time
 * with another fill pattern, so an element never written shows even where NaN is expected. A
 * GPU plugin copies data to and from its device itself.
 * Host buffers start on a 64-byte boundary; every pointer the host passes (case, tensors, names,
 * shapes) is valid only during the call.
 *
 * Values of float16 and bfloat16 tensors are stored as their 16-bit patterns (uint16_t).
 *
 * Threading: the host calls init, supports, run and fini of one loaded library from one thread
 * at a time (never concurrently); a plugin may use threads of its own inside a call. The host
 * saves the floating-point environment (rounding mode, FTZ/DAZ) before each call and restores it
 * after, so a kernel that wants flush-to-zero sets it on every call.
 *
 * Errors: `err` / `reason` buffers hold err_len bytes (at least 256), zero-filled; write a
 * NUL-terminated message (snprintf). A C++ plugin must not let an exception leave a call.
 */
#ifndef NORMCHECK_CANDIDATE_H
#define NORMCHECK_CANDIDATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NORMCHECK_CANDIDATE_ABI_VERSION 1u
#define NORMCHECK_CANDIDATE_SYMBOL "normcheck_candidate"

/* Exports the entry point even when the plugin is built with -fvisibility=hidden. */
#if defined(_WIN32)
#define NORMCHECK_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define NORMCHECK_EXPORT __attribute__((visibility("default")))
#else
#define NORMCHECK_EXPORT
#endif

/* Element types. The numbers are part of the ABI. NC_UINT8 and NC_INT8 (added within ABI version
 * 1) are the storage of quantized codes only (nc_quant below): never an input, never a case's
 * dtype_*, and never in nc_candidate.dtypes. */
typedef enum nc_dtype {
  NC_FLOAT64 = 0, NC_FLOAT32 = 1, NC_FLOAT16 = 2, NC_BFLOAT16 = 3, NC_UINT8 = 4, NC_INT8 = 5
} nc_dtype;
typedef enum nc_op { NC_LAYERNORM = 0, NC_RMSNORM = 1 } nc_op;
typedef enum nc_direction { NC_FORWARD = 0, NC_BACKWARD = 1 } nc_direction;
typedef enum nc_affine { NC_AFFINE_NONE = 0, NC_AFFINE_WEIGHT = 1, NC_AFFINE_WEIGHT_BIAS = 2 } nc_affine;
typedef enum nc_residual { NC_RESIDUAL_NONE = 0, NC_RESIDUAL_ADD = 1, NC_RESIDUAL_ADD_BIAS = 2 } nc_residual;
typedef enum nc_block {
  NC_BLOCK_NONE = 0, NC_BLOCK_POST = 1, NC_BLOCK_PRE = 2, NC_BLOCK_SANDWICH = 3, NC_BLOCK_DEEPNORM = 4
} nc_block;
typedef enum nc_activation { NC_GELU = 0, NC_RELU = 1 } nc_activation;

/* Capability bits (nc_candidate.flags). */
#define NC_CAP_RESIDUAL 0x1u      /* fused residual add (add / add_bias) */
#define NC_CAP_BLOCKS 0x2u        /* post / pre / sandwich / deepnorm blocks */
#define NC_CAP_GENERAL_AXES 0x4u  /* normalized dims other than the last one alone */
#define NC_CAP_WEIGHT_OFFSET 0x8u /* weight_offset != 0 (scale = offset + weight) */
/* The kernel's reduction order may depend on the number of rows and on the inputs' strides and
 * alignment (a split reduction chosen by batch size, a vector path for aligned rows): a row's
 * outputs may then differ between batches and layouts within the tolerance model, not only bit for
 * bit. Without it the property tests hold the kernel to bit-identical rows (batch and layout
 * invariance). Added within ABI version 1: a plugin that does not set it is held to bit identity. */
#define NC_CAP_BATCH_DEPENDENT_ORDER 0x10u
/* The kernel may flush subnormal output values to zero (flush-to-zero arithmetic, or a conversion
 * to the output dtype that flushes, such as AVX512-BF16's VCVTNEPS2BF16): an output element of
 * +-0 is then accepted wherever the correctly rounded value may be a subnormal of the output
 * dtype (within its allowance), and counted apart as flushed in the results. Without it such a
 * zero FAILS like any other wrong value. Subnormal inputs are still read as the values they are
 * (denormals-are-zero on inputs is not covered). Added within ABI version 1. */
#define NC_CAP_FLUSH_SUBNORMAL_OUTPUTS 0x20u
/* The kernel returns no statistics (mean, rstd): an op that keeps them inside, as ggml_norm and
 * ggml_rms_norm do. Those outputs are then neither asked for nor judged (not MISSING); every
 * other output is. Added within ABI version 1. */
#define NC_CAP_NO_STATISTICS 0x40u
/* The library may abort the process on inputs it accepts (a GGML_ABORT, an assert): a bundled
 * plugin that sets it is always run out of process, in a `normcheck worker` child, so that such
 * a case becomes CRASHED and the run goes on. Added within ABI version 1. */
#define NC_CAP_ISOLATE 0x80u
/* The plugin is an intended mutant: a deliberately faulty kernel of the library's own mutation
 * tests. It is listed and reported as a mutant ("rejected (as it must be)" / "NOT REJECTED"),
 * and `normcheck run --expect-reject` (the CMake helper's EXPECT_REJECT) exits 0 only when it is
 * rejected. `description` should name its fault. Added within ABI version 1. */
#define NC_CAP_INTENDED_MUTANT 0x100u

/* The reduction class (bits 16-18 of nc_candidate.flags) and its block size (bits 20-31): how
 * the kernel forms its sums, the row statistics (mean, variance or mean square) and the backward's
 * sums over a row and over rows. A kernel held to a narrower class gets that class's smaller bound
 * (conformance/TOLERANCE.md, section 9), and one whose outputs violate it FAILS with a reason saying
 * the declaration is what failed. Set them with NC_CAP_REDUCTION(NC_REDUCTION_PAIRWISE, 16). The
 * numbers are part of the ABI. Added within ABI version 1: a plugin that leaves these bits 0 is
 * NC_REDUCTION_ANY, as before. */
#define NC_CAP_REDUCTION(cls, block) ((((cls) & 0x7u) << 16) | (((block) & 0xfffu) << 20))
#define NC_CAP_REDUCTION_CLASS(flags) (((flags) >> 16) & 0x7u)
#define NC_CAP_REDUCTION_BLOCK(flags) (((flags) >> 20) & 0xfffu) /* PAIRWISE / BLOCKED: 1..4095 */
#define NC_REDUCTION_ANY 0u            /* every correct algorithm (two-pass, Welford, any order) */
#define NC_REDUCTION_TWO_PASS 1u       /* sum / n, then the sum of squared deviations; any order */
#define NC_REDUCTION_WELFORD 2u        /* Welford's running statistics, sequential or chunked with Chan merges */
#define NC_REDUCTION_PAIRWISE 3u       /* two-pass; groups of <= block terms, then a balanced tree */
#define NC_REDUCTION_BLOCKED 4u        /* two-pass; groups of <= block terms, group sums in any order */
#define NC_REDUCTION_ACCUMULATE_F64 5u /* every sum accumulated in binary64 (two-pass or Welford) */

/* Fused norm + quantization (added within ABI version 1): the case's quantization contract, with
 * the semantics of reference/README.md ("Quantized outputs"); fixtures/SCHEMA.md has the outputs.
 * The numbers are part of the ABI. */
typedef enum nc_qformat {
  NC_Q_FLOAT8_E4M3FN = 0, NC_Q_FLOAT8_E5M2 = 1, NC_Q_INT8 = 2, NC_Q_MXFP8_E4M3 = 3, NC_Q_MXFP8_E5M2 = 4,
  NC_Q_NVFP4_E2M1 = 5
} nc_qformat;
typedef enum nc_qscale {
  NC_QS_STATIC_TENSOR = 0, /* input "scale": float32, shape [1] */
  NC_QS_DYNAMIC_TOKEN = 1, /* output "scale": float32 per row, max(rn32(min(amax, ub) / qmax), min_scale) */
  NC_QS_MX_BLOCK = 2,      /* output "scale": one E8M0 code (uint8) per 32 elements of the last dim */
  NC_QS_NVFP4_BLOCK = 3    /* output "scale": one E4M3 code (uint8) per 16; "global_scale": float32 [1] */
} nc_qscale;
typedef enum nc_qresidual_sum { NC_QR_ROUNDED = 0, NC_QR_UNROUNDED = 1 } nc_qresidual_sum;
typedef enum nc_qvalue { NC_QV_ACTIVATION = 0, NC_QV_FLOAT32 = 1 } nc_qvalue;
typedef enum nc_qapply { NC_QA_RECIPROCAL = 0, NC_QA_DIVIDE = 1, NC_QA_MULTIPLY = 2 } nc_qapply;
typedef enum nc_qmx_rule { NC_QMX_FLOOR = 0, NC_QMX_ROUND_UP = 1 } nc_qmx_rule;
typedef enum nc_qnan { NC_QN_NAN_CODE = 0, NC_QN_UNSPECIFIED = 1 } nc_qnan;

/* The quantization contract of a case (nc_case.quant; NULL for a case without one). Codes cross
 * the ABI as the fixtures store them (fixtures/SCHEMA.md, "Quantized outputs"):
 *   "q"      NC_UINT8 (NC_INT8 for NC_Q_INT8), the shape of x, one code per byte; NVFP4 packed
 *            two codes per byte along the last dim (which is halved): element 2k in the low
 *            nibble (bits 0-3) of byte k, element 2k+1 in the high nibble, the order of PTX
 *            cvt.rn.satfinite.e2m1x2.f32 and of TransformerEngine's and FlashInfer's buffers;
 *   "scale"  float32 per row (dynamic) or NC_UINT8 codes per block (E8M0 for MX, E4M3FN for
 *            NVFP4), shape x's with the last dim 1 / 32 / 16;
 *   "global_scale" float32 [1] (NVFP4); "amax" float32 when `amax` is 1 ([1] static and NVFP4,
 *            per row dynamic, per block MX); "y" in dtype_out when `y` is 1; "residual_out".
 * Code buffers are filled with 0xFF bytes before `run` (another byte on the property tests'
 * second call) and followed by a guard region: a plugin that writes past the end of one (NVFP4
 * codes written unpacked) or changes an output's nc_tensor fields gets the case CRASHED with a
 * message that says so. A case with `quant` has mean and rstd as no outputs and a forward
 * direction over the last dim; its dtype_out is the activation dtype of the norm. */
typedef struct nc_quant {
  uint32_t struct_size;  /* sizeof(nc_quant) in the host's header: later fields are appended */
  int32_t format;        /* nc_qformat */
  int32_t scale;         /* nc_qscale */
  int32_t residual_sum;  /* nc_qresidual_sum: with a fused residual, h rounded to dtype_residual first? */
  int32_t value;         /* nc_qvalue: y rounded to dtype_out (activation) or to float32 is quantized */
  int32_t apply;         /* nc_qapply: how a float32 scale s is applied, v*rn32(1/s), v/s or v*s */
  int32_t mx_rule;       /* nc_qmx_rule (MX block scales) */
  int32_t nan;           /* nc_qnan: the code of a NaN element (format's NaN code, or not judged) */
  double scale_ub;       /* dynamic scales: upper bound on amax (+inf: none) */
  double min_scale;      /* dynamic scales: the smallest scale (a float32 value) */
  int32_t amax;          /* 1: the kernel also writes "amax" */
  int32_t y;             /* 1: the kernel also writes "y" (dtype_out) */
  const char* preset;    /* the preset the contract came from ("vllm_static_fp8"; "" if none) */
} nc_quant;

/* A strided host tensor. strides are in elements, non-negative, and need not be dense (the host
 * may pass padded, offset or permuted inputs: `normcheck prop`'s memory_layout_invariance passes
 * rows padded with NaN, tensors starting 64-256 bytes into their buffer, and column-major
 * strides): index with them. shape and strides have `rank` entries. */
typedef struct nc_tensor {
  void* data;
  int32_t dtype; /* nc_dtype */
  int32_t rank;
  const int64_t* shape;
  const int64_t* strides;
} nc_tensor;

/* A named input or output: "x", "weight", "bias", "residual", "residual_bias", "dy",
 * "ffn_w1" ...; outputs "y", "mean", "rstd", "residual_out", "dx", "dweight", "dbias",
 * "dresidual", "dresidual_bias", "dffn_w1" ... (fixtures/SCHEMA.md lists them with their
 * shapes and dtypes). */
typedef struct nc_named_tensor {
  const char* name;
  nc_tensor tensor;
  int32_t written; /* outputs: the candidate sets 1 when it produced this output; inputs: 0 */
} nc_named_tensor;

/* One case, with the semantics of reference/README.md. */
typedef struct nc_case {
  uint32_t struct_size; /* sizeof(nc_case) in the host's header: later fields are appended */
  const char* case_id;  /* never NULL; "" when the host has no id for the case */
  int32_t op;        /* nc_op */
  int32_t direction; /* nc_direction */
  int32_t rank;
  const int64_t* shape;     /* shape of x */
  int32_t n_norm_dims;
  const int64_t* norm_dims; /* normalized dims, sorted, non-negative (axis/axes resolved) */
  double epsilon;           /* added to the variance inside the square root */
  int32_t affine;           /* nc_affine */
  double weight_offset;     /* scale = weight_offset + weight */
  int32_t residual;         /* nc_residual: h = alpha*x + residual (+ residual_bias) */
  double alpha;
  int32_t block;            /* nc_block */
  int64_t layers;
  int32_t activation;       /* nc_activation */
  const char* contract;     /* "exact", "llama", ..., or "a+b" */
  int32_t dtype_x, dtype_param, dtype_out, dtype_compute, dtype_residual; /* nc_dtype */
  /* Added within ABI version 1: read only when struct_size covers it. NULL unless the case
   * quantizes its output; the host passes such a case only to a plugin that declares its format
   * and scale kind (nc_candidate.quant_formats / quant_scales). */
  const nc_quant* quant;
} nc_case;

typedef struct nc_candidate {
  uint32_t abi_version; /* NORMCHECK_CANDIDATE_ABI_VERSION */
  uint32_t struct_size; /* sizeof(nc_candidate) */
  const char* name;
  const char* description;
  /* Capabilities: bit (1u << value) for each supported nc_op / nc_dtype / nc_direction. */
  uint32_t ops;
  uint32_t dtypes;         /* for x, parameters, outputs and residual */
  uint32_t compute_dtypes; /* accumulation dtypes (the case's dtype_compute) */
  uint32_t directions;
  const char* contracts; /* comma-separated contract names, or "*" for any; NULL: "exact" */
  uint32_t flags;        /* NC_CAP_* */
  const char* device;    /* "cpu", "cuda", "opencl" ...; NULL: "cpu" */

  /* Optional (may be NULL). init returns the state passed to the other calls; on failure it
   * returns NULL and writes a reason to err (then every case is UNSUPPORTED with it). A plugin
   * without state leaves init NULL (the state is then NULL). The host may make several
   * candidates from one library, each with its own init; fini ends each state that init made
   * (or the NULL state when init is NULL), before the library is unloaded. */
  void* (*init)(char* err, size_t err_len);
  void (*fini)(void* state);
  /* Optional: 0 to take the case, non-zero to decline it with a reason (UNSUPPORTED). */
  int (*supports)(void* state, const nc_case* c, char* reason, size_t reason_len);
  /* Required: computes the outputs. 0 on success; non-zero is an error, reported with err
   * (the case is CRASHED). */
  int (*run)(void* state, const nc_case* c, const nc_named_tensor* inputs, int32_t n_inputs,
             nc_named_tensor* outputs, int32_t n_outputs, char* err, size_t err_len);

  /* Added within ABI version 1 (the host reads them only when struct_size covers them; a plugin
   * built against an earlier header declares no quantization). Fused norm + quantization: bit
   * (1u << nc_qformat) for each code format and (1u << nc_qscale) for each scale kind the plugin
   * implements; both non-zero to receive quantized cases (nc_case.quant). The other contract
   * fields (residual_sum, value, apply, mx_rule, nan) are the plugin's to decline in `supports`. */
  uint32_t quant_formats;
  uint32_t quant_scales;
} nc_candidate;

typedef const nc_candidate* (*nc_candidate_fn)(void);

/* The entry point, declared here so that a plugin's definition gets C linkage and default
 * visibility even in a C++ file or a -fvisibility=hidden build. */
NORMCHECK_EXPORT const nc_candidate* normcheck_candidate(void);

#ifdef __cplusplus
}
#endif

#endif /* NORMCHECK_CANDIDATE_H */
