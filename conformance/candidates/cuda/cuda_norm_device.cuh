// The device code of builtin:cuda: LayerNorm / RMSNorm forward and backward kernels.
//
// One thread block per row; the row's elements are strided over the block's threads, and each
// sum is a warp-shuffle reduction followed by a reduction of the per-warp partials through
// shared memory (block_sum). Statistics are two-pass: the mean, then the mean square of h - mean.
// Arithmetic is in the compute type T (float or double) only; inputs are read in their own
// dtype (float16/bfloat16/float32 widen exactly), outputs rounded once to theirs with the
// round-to-nearest-even conversions (__float2half_rn, __float2bfloat16_rn, __double2half,
// __double2bfloat16), and a contract's rounding points are applied where it puts them.
// The kernels mirror the OpenCL ones (../opencl/opencl_kernels.hpp) step for step.
//
// Included by cuda_norm.cu (nvcc) and by tests/cuda_emulated.cpp, which runs these same kernels
// on the CPU under tests/cuda_emulator.hpp (fibers for threads, so that the kernels' logic is
// tested on machines without a GPU). Needs NC_* (candidate.h), __half and __nv_bfloat16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_norm.hpp"
#include "normcheck/candidate.h"

namespace normcheck::cuda_candidate::device {

enum Flags : int {
  kRms = 1,
  kWeight = 2,
  kBias = 4,
  kResidual = 8,
  kResidualBias = 16,
  kAlpha = 32,
  kOffset = 64,
};

// A launch's pointers (device memory, or host memory under the emulator; nullptr where absent), dtypes and
// scalars, by value.
struct Args {
  const void *x, *res, *rbias, *w, *b, *dy;
  void *y, *h_out, *mean, *rstd, *dx, *dres, *xhat, *dh, *dw, *db, *drb;
  int x_dt, res_dt, rbias_dt, w_dt, b_dt, dy_dt, y_dt, h_dt, dx_dt, dres_dt, dw_dt, db_dt, drb_dt;
  long long rows;
  int n;
  double inv_n, eps, alpha, offset;  // converted to T once per thread (round to nearest)
  int flags, rp_h, rp_xhat, rp_scale, rp_mul;
};

// Element i of a tensor of dtype dt, in T (exact unless a float64 value meets float compute).
template <class T>
__device__ __forceinline__ T ld(const void* p, int dt, size_t i) {
  switch (dt) {
    case NC_FLOAT64: return static_cast<T>(static_cast<const double*>(p)[i]);
    case NC_FLOAT32: return static_cast<T>(static_cast<const float*>(p)[i]);
    case NC_FLOAT16: return static_cast<T>(__half2float(static_cast<const __half*>(p)[i]));
    default: return static_cast<T>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

// One rounding to nearest-even from float or double (never through float from double).
__device__ __forceinline__ __half to_half(float v) { return __float2half_rn(v); }
__device__ __forceinline__ __half to_half(double v) { return __double2half(v); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(double v) { return __double2bfloat16(v); }

template <class T>
__device__ __forceinline__ void st(void* p, int dt, size_t i, T v) {
  switch (dt) {
    case NC_FLOAT64: static_cast<double*>(p)[i] = static_cast<double>(v); break;
    case NC_FLOAT32: static_cast<float*>(p)[i] = static_cast<float>(v); break;  // double -> float: RN
    case NC_FLOAT16: static_cast<__half*>(p)[i] = to_half(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = to_bf16(v); break;
  }
}

// A contract's rounding point: v rounded to dtype dt and back; dt -1 (or float64): unchanged.
template <class T>
__device__ __forceinline__ T round_to(T v, int dt) {
  switch (dt) {
    case NC_FLOAT32: return static_cast<T>(static_cast<float>(v));
    case NC_FLOAT16: return static_cast<T>(__half2float(to_half(v)));
    case NC_BFLOAT16: return static_cast<T>(__bfloat162float(to_bf16(v)));
    default: return v;
  }
}

// rsqrtf: at most 2 ulp (CUDA C Programming Guide, mathematical functions), which the
// tolerance model's sqrt_div constant covers; rsqrt(double): at most 1 ulp.
__device__ __forceinline__ float rsqrt_t(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_t(double v) { return rsqrt(v); }

// Sum over the block (blockDim.x a multiple of 32, at most 1024): butterfly shuffles within each
// warp (every lane ends with the same bits: a + b == b + a), then warp 0 sums the per-warp
// partials from shared memory. The order depends on blockDim.x only: deterministic per row
// length. sh holds 33 values; the last __syncthreads lets the next call reuse it.
template <class T>
__device__ T block_sum(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < warps ? sh[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sh[32] = s;
  }
  __syncthreads();
  const T total = sh[32];
  __syncthreads();
  return total;
}

// h = alpha*x + residual (+ residual_bias), rounded where the contract says (fused_add_lowp).
template <class T>
__device__ __forceinline__ T h_at(const Args& a, size_t i, int j) {
  T v = ld<T>(a.x, a.x_dt, i);
  if (a.flags & kResidual) {
    if (a.flags & kAlpha) v = static_cast<T>(a.alpha) * v;
    v = v + ld<T>(a.res, a.res_dt, i);
    if (a.flags & kResidualBias) v = v + ld<T>(a.rbias, a.rbias_dt, j);
    v = round_to(v, a.rp_h);
  }
  return v;
}

// The scale offset + weight of column j.
template <class T>
__device__ __forceinline__ T scale_at(const Args& a, int j) {
  T s = ld<T>(a.w, a.w_dt, j);
  if (a.flags & kOffset) s = static_cast<T>(a.offset) + s;
  return s;
}

// mean and rstd of the row at `base`, two-pass; every thread of the block gets them.
template <class T>
__device__ void row_stats(const Args& a, size_t base, T* sh, T& mean, T& rstd) {
  const T inv_n = static_cast<T>(a.inv_n);
  T m = 0;
  if (!(a.flags & kRms)) {  // uniform over the block: the __syncthreads inside are safe
    T acc = 0;
    for (int j = threadIdx.x; j < a.n; j += blockDim.x) acc += h_at<T>(a, base + j, j);
    m = block_sum(acc, sh) * inv_n;
  }
  T acc = 0;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    const T d = h_at<T>(a, base + j, j) - m;
    acc += d * d;
  }
  mean = m;
  rstd = rsqrt_t(block_sum(acc, sh) * inv_n + static_cast<T>(a.eps));
}

template <class T>
__global__ void norm_forward(Args a) {
  __shared__ T sh[33];
  const size_t row = blockIdx.x, base = row * static_cast<size_t>(a.n);
  T mean, rstd;
  row_stats(a, base, sh, mean, rstd);
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    const T h = h_at<T>(a, base + j, j);
    if (a.h_out) st(a.h_out, a.h_dt, base + j, h);
    T v = round_to((h - mean) * rstd, a.rp_xhat);
    if (a.flags & kWeight) v = round_to(v * round_to(scale_at<T>(a, j), a.rp_scale), a.rp_mul);
    if (a.flags & kBias) v = v + ld<T>(a.b, a.b_dt, j);
    st(a.y, a.y_dt, base + j, v);
  }
  if (threadIdx.x == 0) {
    if (a.mean) static_cast<T*>(a.mean)[row] = mean;
    if (a.rstd) static_cast<T*>(a.rstd)[row] = rstd;
  }
}

// Backward per row: g = dy*scale, xhat = (h - mean)*rstd,
// dh = rstd*((g - mean(g)) - xhat*mean(g*xhat)) (RMSNorm: no mean(g)); dx = alpha*dh,
// dresidual = dh; xhat and dh kept (in T) for the column sums. Only the h rounding point
// applies: backward is the gradient of the unrounded forward.
template <class T>
__global__ void norm_backward_rows(Args a) {
  __shared__ T sh[33];
  const size_t row = blockIdx.x, base = row * static_cast<size_t>(a.n);
  const T inv_n = static_cast<T>(a.inv_n);
  T mean, rstd;
  row_stats(a, base, sh, mean, rstd);
  T acc_g = 0, acc_gx = 0;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    const T xh = (h_at<T>(a, base + j, j) - mean) * rstd;
    T g = ld<T>(a.dy, a.dy_dt, base + j);
    if (a.flags & kWeight) g = g * scale_at<T>(a, j);
    acc_g += g;
    acc_gx += g * xh;
  }
  T mg = 0;
  if (!(a.flags & kRms)) mg = block_sum(acc_g, sh) * inv_n;
  const T mgx = block_sum(acc_gx, sh) * inv_n;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    const T xh = (h_at<T>(a, base + j, j) - mean) * rstd;
    T g = ld<T>(a.dy, a.dy_dt, base + j);
    if (a.flags & kWeight) g = g * scale_at<T>(a, j);
    const T dh = rstd * ((g - mg) - xh * mgx);
    if (a.dx) st(a.dx, a.dx_dt, base + j, (a.flags & kAlpha) ? static_cast<T>(a.alpha) * dh : dh);
    if (a.dres) st(a.dres, a.dres_dt, base + j, dh);
    if (a.xhat) static_cast<T*>(a.xhat)[base + j] = xh;
    if (a.dh) static_cast<T*>(a.dh)[base + j] = dh;
  }
}

// Backward per column j (one thread each, rows in order): dweight = sum dy*xhat, dbias = sum dy,
// dresidual_bias = sum dh.
template <class T>
__global__ void norm_backward_cols(Args a) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= a.n) return;
  T sw = 0, sb = 0, sr = 0;
  for (long long r = 0; r < a.rows; ++r) {
    const size_t i = static_cast<size_t>(r) * static_cast<size_t>(a.n) + static_cast<size_t>(j);
    const T dy = ld<T>(a.dy, a.dy_dt, i);
    if (a.dw) sw += dy * static_cast<const T*>(a.xhat)[i];
    if (a.db) sb += dy;
    if (a.drb) sr += static_cast<const T*>(a.dh)[i];
  }
  if (a.dw) st(a.dw, a.dw_dt, j, sw);
  if (a.db) st(a.db, a.db_dt, j, sb);
  if (a.drb) st(a.drb, a.drb_dt, j, sr);
}

// The flags and scalars of a launch, from the problem (pointers already set).
inline void set_scalars(Args& a, const Problem& p) {
  a.rows = p.rows;
  a.n = static_cast<int>(p.cols);
  a.inv_n = 1.0 / static_cast<double>(p.cols);
  a.eps = p.eps;
  a.alpha = p.alpha;
  a.offset = p.offset;
  a.flags = (p.rms ? kRms : 0) | (a.w ? kWeight : 0) | (a.b ? kBias : 0) | (a.res ? kResidual : 0) |
            (a.rbias ? kResidualBias : 0) | (p.alpha != 1.0 ? kAlpha : 0) | (p.offset != 0.0 ? kOffset : 0);
  a.rp_h = p.rp_h;
  a.rp_xhat = p.rp_xhat;
  a.rp_scale = p.rp_scale;
  a.rp_mul = p.rp_mul;
}

// The block size of the row kernels: a power of two from 32 (one warp) to 512, by row length.
inline int row_threads(std::int64_t cols) {
  int threads = 32;
  while (threads < 512 && threads < cols) threads <<= 1;
  return threads;
}

}  // namespace normcheck::cuda_candidate::device
