// The device code of builtin:cuda's fused RMSNorm + quantization (reference/README.md "Quantized
// outputs"): the kernels vLLM and FlashInfer ship, written as one kernel whose contract fields are
// launch arguments.
//   vLLM rms_norm_static_fp8_quant / fused_add_rms_norm_static_fp8_quant
//     (csrc/layernorm_quant_kernels.cu): the `llama` norm (x*rstd rounded to T, times w rounded
//     to T), the fused residual sum rounded to T before the statistics (R1), p = y in T (Q1),
//     u = p * (1/scale) (reciprocal), E4M3 with saturation;
//   vLLM rms_norm_dynamic_per_token_quant (csrc/quantization/fused_kernels/): a per-row amax of p,
//     scale = max(min(amax, ub) / qmax, min_scale), FP8 by division, int8 by reciprocal with
//     cvt.rni.sat.s8; the residual sum unrounded (R2);
//   FlashInfer rmsnorm_quant / fused_add_rmsnorm_quant (include/flashinfer/norm.cuh): p the
//     float32 value (Q2), R2, reciprocal.
// One thread block per row, as the norm kernels (cuda_norm_device.cuh: block_sum, h_at, the
// contract's rounding points), float32 arithmetic. The code conversion is round to nearest even
// with saturation to the largest finite value (cvt.rn.satfinite.e4m3x2.f32 / e5m2x2), done here
// with exact float operations (a power-of-two scaling and rintf) so that the CPU emulator of the
// tests (tests/cuda_emulator.hpp) runs the same code; a NaN gives the format's NaN code 0x7F.
#pragma once

#include "cuda_norm_device.cuh"

namespace normcheck::cuda_candidate::device {

struct QuantArgs {
  void *q, *scale, *row_amax;
  int format, dynamic, apply, value_dt, nan_code;
  float static_scale, scale_ub, min_scale;
};

// The contract's scalars from a plan's quantization (cuda_norm.hpp NormPlan::Quant): the same
// for the device launch and for the CPU emulation of the tests.
template <class Quant>
inline void set_contract(QuantArgs& qa, const Quant& p) {
  qa.format = p.format;
  qa.dynamic = p.dynamic ? 1 : 0;
  qa.apply = p.apply;
  qa.value_dt = p.value_dt;
  qa.nan_code = p.nan_code ? 1 : 0;
  qa.static_scale = p.static_scale;
  qa.scale_ub = p.scale_ub;
  qa.min_scale = p.min_scale;
}

// max over the block, as block_sum (fmaxf drops NaN: vLLM's and FlashInfer's amax).
__device__ inline float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < warps ? sh[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) sh[32] = s;
  }
  __syncthreads();
  const float total = sh[32];
  __syncthreads();
  return total;
}

// E4M3FN (man 3, bias 7, max 448) or E5M2 (man 2, bias 15, max 57344), RN, saturating.
__device__ inline unsigned char to_fp8(float u, int man, int bias, float max) {
  if (u != u) return 0x7F;
  const unsigned char sign = copysignf(1.0f, u) < 0.0f ? 0x80 : 0;
  const float a = fminf(fabsf(u), max);
  const int lg = a == 0.0f ? 1 - bias : ilogbf(a);
  const int binade = lg < 1 - bias ? 1 - bias : lg;  // subnormals: the smallest normal's quantum
  const float quantum = ldexpf(1.0f, binade - man);
  const float r = fminf(rintf(a / quantum) * quantum, max);  // a / quantum and back: exact
  if (r == 0.0f) return sign;
  const int e = ilogbf(r);
  if (e < 1 - bias) return static_cast<unsigned char>(sign | static_cast<int>(r / ldexpf(1.0f, 1 - bias - man)));
  return static_cast<unsigned char>(sign | ((e + bias) << man) | (static_cast<int>(r / ldexpf(1.0f, e - man)) - (1 << man)));
}

// cvt.rni.sat.s8.f32: round half to even, saturate to [-128, 127], NaN to 0.
__device__ inline signed char to_int8(float u) {
  if (u != u) return 0;
  return static_cast<signed char>(fminf(fmaxf(rintf(u), -128.0f), 127.0f));
}

// The float32 value of the normalized output y (compute float), with the contract's rounding
// points, as norm_forward computes it.
__device__ inline float rms_y(const Args& a, size_t base, int j, float rstd) {
  const float h = h_at<float>(a, base + j, j);
  float v = round_to(h * rstd, a.rp_xhat);
  if (a.flags & kWeight) v = round_to(v * round_to(scale_at<float>(a, j), a.rp_scale), a.rp_mul);
  return v;
}

__global__ void rms_norm_quant(Args a, QuantArgs q) {
  __shared__ float sh[33];
  const size_t row = blockIdx.x, base = row * static_cast<size_t>(a.n);
  float mean, rstd;
  row_stats<float>(a, base, sh, mean, rstd);  // RMSNorm: mean unused (0)
  // p: y rounded to the dtype the contract quantizes; residual_out and y written on the way.
  float amax = 0.0f;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    if (a.h_out) st(a.h_out, a.h_dt, base + j, h_at<float>(a, base + j, j));
    const float y = rms_y(a, base, j, rstd);
    if (a.y) st(a.y, a.y_dt, base + j, y);
    amax = fmaxf(amax, fabsf(round_to(y, q.value_dt)));
  }
  amax = block_max(amax, sh);
  const bool is_int8 = q.format == NC_Q_INT8, e5m2 = q.format == NC_Q_FLOAT8_E5M2;
  float s = q.static_scale;
  if (q.dynamic) {
    const float qmax = is_int8 ? 127.0f : e5m2 ? 57344.0f : 448.0f;
    s = fmaxf(fminf(amax, q.scale_ub) / qmax, q.min_scale);
  }
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    const float p = round_to(rms_y(a, base, j, rstd), q.value_dt);
    const float u = q.apply == NC_QA_RECIPROCAL ? p * inv : q.apply == NC_QA_DIVIDE ? p / s : p * s;
    if (is_int8)
      static_cast<signed char*>(q.q)[base + j] = to_int8(u);
    else
      static_cast<unsigned char*>(q.q)[base + j] = e5m2 ? to_fp8(u, 2, 15, 57344.0f) : to_fp8(u, 3, 7, 448.0f);
  }
  if (threadIdx.x == 0) {
    if (q.dynamic && q.scale) static_cast<float*>(q.scale)[row] = s;
    if (q.row_amax) static_cast<float*>(q.row_amax)[row] = amax;
  }
}

}  // namespace normcheck::cuda_candidate::device
