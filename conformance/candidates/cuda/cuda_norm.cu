// The host side of builtin:cuda's device code: opens GPU 0, moves a case to it and back, and
// launches the kernels of cuda_norm_device.cuh (one block per row; see there).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <map>
#include <string>

#include "cuda_norm.hpp"
#include "cuda_norm_device.cuh"
#include "cuda_quant_device.cuh"
#include "normcheck/candidate.h"

namespace normcheck::cuda_candidate {
namespace {

using device::Args;
using device::norm_backward_cols;
using device::norm_backward_rows;
using device::norm_forward;

size_t size_of(int dtype) {
  return dtype == NC_FLOAT64 ? 8 : dtype == NC_FLOAT32 ? 4 : (dtype == NC_UINT8 || dtype == NC_INT8) ? 1 : 2;
}

std::string error_text(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

}  // namespace

struct Device {
  int id = 0;
  cudaStream_t stream = nullptr;
  std::string name;
  std::map<std::string, Buffer> buffers;

  ~Device() {
    for (auto& entry : buffers)
      if (entry.second.ptr) cudaFree(entry.second.ptr);
    if (stream) cudaStreamDestroy(stream);
  }

  // The device buffer of a role, at least `bytes` long, kept between cases.
  cudaError_t buffer(const std::string& role, size_t bytes, void** out) {
    Buffer& b = buffers[role];
    if (!b.ptr || b.bytes < bytes) {
      if (b.ptr) cudaFree(b.ptr);
      b.ptr = nullptr;
      b.bytes = 0;
      const size_t n = bytes < 256 ? 256 : bytes;
      if (const cudaError_t e = cudaMalloc(&b.ptr, n); e != cudaSuccess) return e;
      b.bytes = n;
    }
    *out = b.ptr;
    return cudaSuccess;
  }
};

Device* open_device(std::string& why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    why = "no CUDA device (cudaGetDeviceCount: " + std::string(cudaGetErrorName(e)) + ": " +
          cudaGetErrorString(e) + ")";
    return nullptr;
  }
  if (count == 0) {
    why = "no CUDA device (cudaGetDeviceCount: 0 devices)";
    return nullptr;
  }
  auto* d = new Device;
  cudaDeviceProp prop{};
  if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    why = error_text("cudaSetDevice/cudaGetDeviceProperties(0)", e);
    delete d;
    return nullptr;
  }
  d->name = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  // A build without code for this GPU fails here, with a reason, rather than at every launch.
  cudaFuncAttributes attr{};
  if ((e = cudaFuncGetAttributes(&attr, norm_forward<float>)) != cudaSuccess) {
    why = error_text(
        ("no kernel image for " + d->name + " in this build (set NORMCHECK_CUDA_ARCHITECTURES)").c_str(), e);
    delete d;
    return nullptr;
  }
  if ((e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    why = error_text("cudaStreamCreate", e);
    delete d;
    return nullptr;
  }
  return d;
}

void close_device(Device* d) { delete d; }

std::string device_name(const Device* d) { return d->name; }

std::string declines(const Device*, std::int64_t, std::int64_t) { return {}; }

namespace {

template <class T>
std::string launch(Device& d, const Problem& p, Args& a) {
  const auto rows = static_cast<size_t>(p.rows);
  const int threads = device::row_threads(p.cols);
  if (rows > 0) {
    if (!p.backward)
      norm_forward<T><<<static_cast<unsigned>(rows), threads, 0, d.stream>>>(a);
    else
      norm_backward_rows<T><<<static_cast<unsigned>(rows), threads, 0, d.stream>>>(a);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return error_text("row kernel launch", e);
  }
  if (p.backward && (a.dw || a.db || a.drb)) {
    const unsigned blocks = static_cast<unsigned>((p.cols + 255) / 256);
    norm_backward_cols<T><<<blocks, 256, 0, d.stream>>>(a);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
      return error_text("column kernel launch", e);
  }
  return {};
}

}  // namespace

std::string run_problem(Device* d, const Problem& p) {
  if (p.rows > 0x7fffffffLL) return "more rows than a grid holds (2^31 - 1)";
  const size_t rows = static_cast<size_t>(p.rows), cols = static_cast<size_t>(p.cols), count = rows * cols;
  const size_t compute_size = size_of(p.compute);
  std::string failure;
  // Device copy of an input (nullptr when absent).
  auto upload = [&](const char* role, const HostBuffer& h, size_t n, const void** ptr, int* dt) {
    *ptr = nullptr;
    *dt = h.dtype;
    if (!h.data || !failure.empty()) return;
    void* dev = nullptr;
    cudaError_t e = d->buffer(role, n * size_of(h.dtype), &dev);
    if (e == cudaSuccess && n > 0)
      e = cudaMemcpyAsync(dev, h.data, n * size_of(h.dtype), cudaMemcpyHostToDevice, d->stream);
    if (e != cudaSuccess) failure = error_text(role, e);
    *ptr = dev;
  };
  // Device buffer of an output of `n` elements of dtype (nullptr when the case does not ask).
  auto output = [&](const char* role, const HostBuffer& h, size_t n, void** ptr, int* dt) {
    *ptr = nullptr;
    *dt = h.dtype;
    if (!h.data || !failure.empty()) return;
    if (const cudaError_t e = d->buffer(role, n * size_of(h.dtype), ptr); e != cudaSuccess)
      failure = error_text(role, e);
  };
  auto scratch = [&](const char* role, bool wanted, void** ptr) {
    *ptr = nullptr;
    if (!wanted || !failure.empty()) return;
    if (const cudaError_t e = d->buffer(role, count * compute_size, ptr); e != cudaSuccess)
      failure = error_text(role, e);
  };

  Args a{};
  int unused_dt = 0;
  upload("x", p.x, count, &a.x, &a.x_dt);
  upload("residual", p.residual, count, &a.res, &a.res_dt);
  upload("residual_bias", p.residual_bias, cols, &a.rbias, &a.rbias_dt);
  upload("weight", p.weight, cols, &a.w, &a.w_dt);
  upload("bias", p.bias, cols, &a.b, &a.b_dt);
  upload("dy", p.dy, count, &a.dy, &a.dy_dt);
  output("y", p.y, count, &a.y, &a.y_dt);
  output("residual_out", p.residual_out, count, &a.h_out, &a.h_dt);
  output("mean", p.mean, rows, &a.mean, &unused_dt);
  output("rstd", p.rstd, rows, &a.rstd, &unused_dt);
  output("dx", p.dx, count, &a.dx, &a.dx_dt);
  output("dresidual", p.dresidual, count, &a.dres, &a.dres_dt);
  output("dweight", p.dweight, cols, &a.dw, &a.dw_dt);
  output("dbias", p.dbias, cols, &a.db, &a.db_dt);
  output("dresidual_bias", p.dresidual_bias, cols, &a.drb, &a.drb_dt);
  scratch("xhat", p.backward && p.dweight.data, &a.xhat);
  scratch("dh", p.backward && p.dresidual_bias.data, &a.dh);
  if (!failure.empty()) return failure;
  if (!p.x.data) return "the case has no input x";
  if (p.backward && !p.dy.data) return "a backward case without input dy";

  device::set_scalars(a, p);

  device::QuantArgs qa{};
  if (p.quant.on) {  // fused RMSNorm + quantization (cuda_quant_device.cuh), float32 compute
    output("q", p.quant.q, count, &qa.q, &unused_dt);
    output("quant_scale", p.quant.scale, rows, &qa.scale, &unused_dt);
    output("row_amax", p.quant.row_amax, rows, &qa.row_amax, &unused_dt);
    if (!failure.empty()) return failure;
    device::set_contract(qa, p.quant);
    if (rows > 0) {
      device::rms_norm_quant<<<static_cast<unsigned>(rows), device::row_threads(p.cols), 0, d->stream>>>(a, qa);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return error_text("quant kernel launch", e);
    }
  } else {
    failure = p.compute == NC_FLOAT64 ? launch<double>(*d, p, a) : launch<float>(*d, p, a);
    if (!failure.empty()) return failure;
  }

  auto download = [&](const char* role, const HostBuffer& h, const void* dev, size_t n) {
    if (!h.data || !dev || n == 0 || !failure.empty()) return;
    if (const cudaError_t e =
            cudaMemcpyAsync(h.data, dev, n * size_of(h.dtype), cudaMemcpyDeviceToHost, d->stream);
        e != cudaSuccess)
      failure = error_text(role, e);
  };
  download("y", p.y, a.y, count);
  download("residual_out", p.residual_out, a.h_out, count);
  download("mean", p.mean, a.mean, rows);
  download("rstd", p.rstd, a.rstd, rows);
  download("dx", p.dx, a.dx, count);
  download("dresidual", p.dresidual, a.dres, count);
  download("dweight", p.dweight, a.dw, cols);
  download("dbias", p.dbias, a.db, cols);
  download("dresidual_bias", p.dresidual_bias, a.drb, cols);
  download("q", p.quant.q, qa.q, count);
  download("quant_scale", p.quant.scale, qa.scale, rows);
  download("row_amax", p.quant.row_amax, qa.row_amax, rows);
  // Kernel faults surface here (or at the copies above).
  if (const cudaError_t e = cudaStreamSynchronize(d->stream); e != cudaSuccess && failure.empty())
    failure = error_text("cudaStreamSynchronize", e);
  return failure;
}

}  // namespace normcheck::cuda_candidate
