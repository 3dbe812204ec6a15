// The interface between the CUDA plugin's host code (cuda_plugin.cpp, built by the C++ compiler
// with the project's warnings) and its device code (cuda_norm.cu, built by nvcc). Plain C++: no
// CUDA type crosses it, so the plugin's own sources need no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace normcheck::cuda_candidate {

// A dense row-major host buffer of raw elements of `dtype` (nc_dtype); data == nullptr when the
// case has no such tensor. Inputs are read, outputs written (already rounded to their dtype).
struct HostBuffer {
  void* data = nullptr;
  std::int32_t dtype = 0;
};

// One case as the kernels see it: rows x cols, the normalized elements of a row contiguous.
struct Problem {
  bool rms = false, backward = false;
  std::int64_t rows = 0, cols = 0;
  std::int32_t compute = 1;  // NC_FLOAT32 or NC_FLOAT64: the arithmetic of every step
  double eps = 0, alpha = 1, offset = 0;
  // Rounding points of the precision contract: the dtype each rounds to, or -1.
  std::int32_t rp_h = -1, rp_xhat = -1, rp_scale = -1, rp_mul = -1;
  // Inputs: x, residual [rows, cols]; residual_bias, weight, bias [cols]; dy [rows, cols].
  HostBuffer x, residual, residual_bias, weight, bias, dy;
  // Outputs: y, residual_out, dx, dresidual [rows, cols]; mean, rstd [rows] (in the compute
  // dtype); dweight, dbias, dresidual_bias [cols].
  HostBuffer y, residual_out, mean, rstd, dx, dresidual, dweight, dbias, dresidual_bias;

  // Fused RMSNorm + FP8/int8 quantization (candidate.h nc_quant; cuda_quant_device.cuh), forward
  // only: when `quant` is set, the row kernel is rms_norm_quant and y is written only if asked.
  struct Quant {
    bool on = false;
    std::int32_t format = 0;  // NC_Q_FLOAT8_E4M3FN, NC_Q_FLOAT8_E5M2, NC_Q_INT8
    bool dynamic = false;     // per-row scale (else the static scale below)
    std::int32_t apply = 0;   // NC_QA_*
    std::int32_t value_dt = 1;  // NC_FLOAT32 or dtype_out: the dtype p is rounded to before the scale
    bool nan_code = true;
    float static_scale = 1, scale_ub = 0, min_scale = 0;  // scale_ub: +inf for no bound
    HostBuffer q;            // uint8 / int8 codes [rows, cols]
    HostBuffer scale;        // dynamic: float32 [rows]
    HostBuffer row_amax;     // float32 [rows]: amax of each row's p (the host takes the max for [1])
  } quant;
};

struct Device;  // the CUDA state: device, stream, cached buffers (cuda_norm.cu)

// Opens device 0. On failure returns nullptr and sets `why` (with no GPU or no driver: "no CUDA
// device (cudaGetDeviceCount: ...)").
Device* open_device(std::string& why);
void close_device(Device* d);
// The device's name and compute capability, for messages.
std::string device_name(const Device* d);
// Why this device declines a case of rows x cols, or "" (the GPU takes any; the CPU emulator of
// the tests declines what would take it too long).
std::string declines(const Device* d, std::int64_t rows, std::int64_t cols);
// Runs one case; returns "" on success, else the CUDA error.
std::string run_problem(Device* d, const Problem& p);

}  // namespace normcheck::cuda_candidate
