// The OpenCL C source of the opencl candidate, built once per compute dtype in init() with
// -DREAL=float or -DREAL=double (-DNC_FP64). Inputs arrive converted to REAL by the host
// (exactly: float16/bfloat16/float32 values are float32 values) and outputs leave in REAL, to be
// rounded once by the host to their dtypes. Rounding points of a precision contract, which fall
// inside the computation, are applied here (round_to).
#pragma once

namespace normcheck::opencl_candidate {

inline constexpr const char* kKernelSource = R"CLC(
#ifdef NC_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
// Every a*b+c is two roundings, as written: the error model counts them, and a contraction that
// only some compilers make would make the results differ between devices for no reason.
#pragma OPENCL FP_CONTRACT OFF

typedef REAL real;

// Flags of a launch (the host's Flags mirror them).
#define F_RMS 1
#define F_WEIGHT 2
#define F_BIAS 4
#define F_RESIDUAL 8
#define F_RESIDUAL_BIAS 16
#define F_ALPHA 32
#define F_OFFSET 64

// nc_dtype codes; -1: no rounding point.
#define DT_F64 0
#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3

// float -> bfloat16 -> float, to nearest, ties to even (carry into the exponent gives inf).
float bf16_rne(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return as_float(u | 0x00400000u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return as_float(u & 0xffff0000u);
}

// A contract's rounding point: v rounded to nearest-even in dtype dt, back in REAL. From double
// the host never asks for bfloat16 (the float step would round twice); vstore_half_rte rounds
// float and double alike once.
real round_to(real v, int dt) {
  if (dt == DT_F16) {
    ushort t;
    vstore_half_rte(v, 0, (__private half*)&t);
    return (real)vload_half(0, (__private const half*)&t);
  }
  if (dt == DT_BF16) return (real)bf16_rne((float)v);
#ifdef NC_FP64
  if (dt == DT_F32) return (real)convert_float_rte(v);
#endif
  return v;  // float64, float32 from float, or no rounding point
}

// Tree reduction over the work-group, in local memory; the local size is a power of two. The
// order depends on the local size only, so results are deterministic for a given row length.
real group_sum(real v, __local real* buf) {
  const uint lid = get_local_id(0);
  buf[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (lid < s) buf[lid] += buf[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const real total = buf[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // the next reduction overwrites buf
  return total;
}

// h = alpha*x + residual (+ residual_bias), rounded where the contract says (fused_add_lowp).
real h_at(__global const real* x, __global const real* res, __global const real* rbias, size_t i, int j,
          real alpha, int flags, int rp_h) {
  real v = x[i];
  if (flags & F_RESIDUAL) {
    if (flags & F_ALPHA) v = alpha * v;
    v = v + res[i];
    if (flags & F_RESIDUAL_BIAS) v = v + rbias[j];
    v = round_to(v, rp_h);
  }
  return v;
}

// The scale offset + weight of column j (1 when there is no weight).
real scale_at(__global const real* w, int j, real offset, int flags) {
  real s = w[j];
  if (flags & F_OFFSET) s = offset + s;
  return s;
}

// mean and rstd of one row, two-pass: the mean first, then the mean square of h - mean (for
// RMSNorm, of h). Every work-item of the group returns them.
void row_stats(__global const real* x, __global const real* res, __global const real* rbias, size_t base, int n,
               real inv_n, real eps, real alpha, int flags, int rp_h, __local real* buf, real* mean, real* rstd) {
  const int lid = (int)get_local_id(0), lsize = (int)get_local_size(0);
  real m = 0;
  if (!(flags & F_RMS)) {
    real acc = 0;
    for (int j = lid; j < n; j += lsize) acc += h_at(x, res, rbias, base + (size_t)j, j, alpha, flags, rp_h);
    m = group_sum(acc, buf) * inv_n;
  }
  real acc = 0;
  for (int j = lid; j < n; j += lsize) {
    const real d = h_at(x, res, rbias, base + (size_t)j, j, alpha, flags, rp_h) - m;
    acc += d * d;
  }
  *mean = m;
  *rstd = rsqrt(group_sum(acc, buf) * inv_n + eps);  // rsqrt: at most 2 ulp (OpenCL 1.2, 7.4)
}

// Forward: one work-group per row. Writes y, and mean / rstd / h where asked (non-NULL).
__kernel void norm_forward(__global const real* x, __global const real* res, __global const real* rbias,
                           __global const real* w, __global const real* b, __global real* y,
                           __global real* h_out, __global real* mean_out, __global real* rstd_out, int n,
                           real inv_n, real eps, real alpha, real offset, int flags, int rp_h, int rp_xhat,
                           int rp_scale, int rp_mul, __local real* buf) {
  const size_t row = get_group_id(0), base = row * (size_t)n;
  const int lid = (int)get_local_id(0), lsize = (int)get_local_size(0);
  real mean, rstd;
  row_stats(x, res, rbias, base, n, inv_n, eps, alpha, flags, rp_h, buf, &mean, &rstd);
  for (int j = lid; j < n; j += lsize) {
    const real h = h_at(x, res, rbias, base + (size_t)j, j, alpha, flags, rp_h);
    if (h_out) h_out[base + j] = h;
    real v = round_to((h - mean) * rstd, rp_xhat);
    if (flags & F_WEIGHT) v = round_to(v * round_to(scale_at(w, j, offset, flags), rp_scale), rp_mul);
    if (flags & F_BIAS) v = v + b[j];
    y[base + j] = v;
  }
  if (lid == 0) {
    if (mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
}

// Backward, per row: with g = dy*scale, xhat = (h - mean)*rstd,
//   dh = rstd * (g - mean(g) - xhat*mean(g*xhat))      (RMSNorm: no mean(g) term),
// dx = alpha*dh, dresidual = dh. xhat and dh are kept for the column sums (norm_backward_cols).
// Only the h rounding point applies: backward is the gradient of the unrounded forward.
__kernel void norm_backward_rows(__global const real* x, __global const real* res, __global const real* rbias,
                                 __global const real* w, __global const real* dy, __global real* dx,
                                 __global real* dres, __global real* xhat_out, __global real* dh_out, int n,
                                 real inv_n, real eps, real alpha, real offset, int flags, int rp_h,
                                 __local real* buf) {
  const size_t row = get_group_id(0), base = row * (size_t)n;
  const int lid = (int)get_local_id(0), lsize = (int)get_local_size(0);
  real mean, rstd;
  row_stats(x, res, rbias, base, n, inv_n, eps, alpha, flags, rp_h, buf, &mean, &rstd);
  real acc_g = 0, acc_gx = 0;
  for (int j = lid; j < n; j += lsize) {
    const real xh = (h_at(x, res, rbias, base + (size_t)j, j, alpha, flags, rp_h) - mean) * rstd;
    real g = dy[base + j];
    if (flags & F_WEIGHT) g = g * scale_at(w, j, offset, flags);
    acc_g += g;
    acc_gx += g * xh;
  }
  real mg = 0;
  if (!(flags & F_RMS)) mg = group_sum(acc_g, buf) * inv_n;
  const real mgx = group_sum(acc_gx, buf) * inv_n;
  for (int j = lid; j < n; j += lsize) {
    const real xh = (h_at(x, res, rbias, base + (size_t)j, j, alpha, flags, rp_h) - mean) * rstd;
    real g = dy[base + j];
    if (flags & F_WEIGHT) g = g * scale_at(w, j, offset, flags);
    const real dh = rstd * ((g - mg) - xh * mgx);
    if (dx) dx[base + j] = (flags & F_ALPHA) ? alpha * dh : dh;
    if (dres) dres[base + j] = dh;
    if (xhat_out) xhat_out[base + j] = xh;
    if (dh_out) dh_out[base + j] = dh;
  }
}

// Backward, per column j: dweight = sum_rows dy*xhat, dbias = sum_rows dy,
// dresidual_bias = sum_rows dh; one work-item per column, rows in order.
__kernel void norm_backward_cols(__global const real* dy, __global const real* xhat, __global const real* dh,
                                 __global real* dw, __global real* db, __global real* drb, long rows, int n) {
  const int j = (int)get_global_id(0);
  if (j >= n) return;
  real sw = 0, sb = 0, sr = 0;
  for (long r = 0; r < rows; ++r) {
    const size_t i = (size_t)r * (size_t)n + (size_t)j;
    if (dw) sw += dy[i] * xhat[i];
    if (db) sb += dy[i];
    if (drb) sr += dh[i];
  }
  if (dw) dw[j] = sw;
  if (db) db[j] = sb;
  if (drb) drb[j] = sr;
}
)CLC";

}  // namespace normcheck::opencl_candidate
