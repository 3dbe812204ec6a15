// builtin:opencl: LayerNorm and RMSNorm, forward and backward, as OpenCL kernels (one work-group
// per row, local-memory tree reductions, two-pass statistics) on the first OpenCL device found
// (PoCL on the CPU here). README.md says what it takes and declines, and why.
//
// Division of labour: the host packs each strided input into a dense [rows, cols] buffer of the
// compute type (float or double; float16/bfloat16/float32 values convert exactly), the kernels
// compute in that type only, and the host rounds each output once, to nearest-even, into its
// dtype (plugin_host.hpp). Rounding points inside the computation (precision contracts) are
// applied by the kernels.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/plugin_host.hpp"
#include "normcheck/candidate.h"
#include "opencl_kernels.hpp"

namespace normcheck::opencl_candidate {
namespace {

namespace ph = normcheck::plugin_host;

// The kernel's F_* flags.
enum Flags : int {
  kRms = 1,
  kWeight = 2,
  kBias = 4,
  kResidual = 8,
  kResidualBias = 16,
  kAlpha = 32,
  kOffset = 64,
};

// An OpenCL failure, carried to the C boundary as the message of err.
struct ClError {
  std::string what;
};

void check(cl_int rc, const char* call) {
  if (rc != CL_SUCCESS) throw ClError{std::string(call) + " failed with OpenCL error " + std::to_string(rc)};
}

// One program (float or double) and its kernels.
struct Program {
  cl_program program = nullptr;
  cl_kernel forward = nullptr, backward_rows = nullptr, backward_cols = nullptr;
  size_t max_group = 1;  // the largest work-group the row kernels may use on this device
};

// A device buffer that grows and is kept between cases (one per role).
struct Buffer {
  cl_mem mem = nullptr;
  size_t bytes = 0;
};

struct State {
  cl_device_id device = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  Program programs[2];  // [0] float, [1] double (empty without cl_khr_fp64)
  bool fp64 = false;
  size_t local_mem = 0;
  std::string device_name;
  std::map<std::string, Buffer> buffers;

  ~State() {
    for (auto& [name, b] : buffers)
      if (b.mem) clReleaseMemObject(b.mem);
    for (auto& p : programs) {
      if (p.forward) clReleaseKernel(p.forward);
      if (p.backward_rows) clReleaseKernel(p.backward_rows);
      if (p.backward_cols) clReleaseKernel(p.backward_cols);
      if (p.program) clReleaseProgram(p.program);
    }
    if (queue) clReleaseCommandQueue(queue);
    if (context) clReleaseContext(context);
  }

  // The buffer of a role, at least `bytes` long (contents undefined).
  cl_mem buffer(const std::string& role, size_t bytes) {
    Buffer& b = buffers[role];
    if (b.bytes < bytes || !b.mem) {
      if (b.mem) clReleaseMemObject(b.mem);
      b.mem = nullptr;
      cl_int rc = CL_SUCCESS;
      b.mem = clCreateBuffer(context, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 64), nullptr, &rc);
      check(rc, "clCreateBuffer");
      b.bytes = std::max<size_t>(bytes, 64);
    }
    return b.mem;
  }
};

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

Program build(State& s, bool fp64) {
  Program p;
  const char* src = kKernelSource;
  cl_int rc = CL_SUCCESS;
  p.program = clCreateProgramWithSource(s.context, 1, &src, nullptr, &rc);
  check(rc, "clCreateProgramWithSource");
  // No fast-math options: denormals are kept and every operation is IEEE (rsqrt within 2 ulp).
  const char* options = fp64 ? "-DREAL=double -DNC_FP64" : "-DREAL=float";
  rc = clBuildProgram(p.program, 1, &s.device, options, nullptr, nullptr);
  if (rc != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(p.program, s.device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
    std::string log(n, '\0');
    clGetProgramBuildInfo(p.program, s.device, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
    clReleaseProgram(p.program);
    throw ClError{std::string("clBuildProgram (") + options + ") failed with OpenCL error " +
                  std::to_string(rc) + ": " + log.substr(0, 400)};
  }
  p.forward = clCreateKernel(p.program, "norm_forward", &rc);
  check(rc, "clCreateKernel(norm_forward)");
  p.backward_rows = clCreateKernel(p.program, "norm_backward_rows", &rc);
  check(rc, "clCreateKernel(norm_backward_rows)");
  p.backward_cols = clCreateKernel(p.program, "norm_backward_cols", &rc);
  check(rc, "clCreateKernel(norm_backward_cols)");
  size_t device_max = 1, fwd_max = 1, bwd_max = 1;
  check(clGetDeviceInfo(s.device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof device_max, &device_max, nullptr),
        "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)");
  check(clGetKernelWorkGroupInfo(p.forward, s.device, CL_KERNEL_WORK_GROUP_SIZE, sizeof fwd_max, &fwd_max,
                                 nullptr),
        "clGetKernelWorkGroupInfo");
  check(clGetKernelWorkGroupInfo(p.backward_rows, s.device, CL_KERNEL_WORK_GROUP_SIZE, sizeof bwd_max,
                                 &bwd_max, nullptr),
        "clGetKernelWorkGroupInfo");
  p.max_group = std::min({device_max, fwd_max, bwd_max});
  return p;
}

void* init(char* err, size_t err_len) {
  State* s = nullptr;
  try {
    cl_uint n_platforms = 0;
    const cl_int rc = clGetPlatformIDs(0, nullptr, &n_platforms);
    if (rc != CL_SUCCESS || n_platforms == 0) {
      std::snprintf(err, err_len, "no OpenCL platform: install pocl-opencl-icd (clGetPlatformIDs: error %d)",
                    rc);
      return nullptr;
    }
    std::vector<cl_platform_id> platforms(n_platforms);
    check(clGetPlatformIDs(n_platforms, platforms.data(), nullptr), "clGetPlatformIDs");
    // The first device of the first platform that has one.
    cl_device_id device = nullptr;
    for (cl_platform_id p : platforms) {
      cl_uint n = 0;
      if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &device, &n) == CL_SUCCESS && n > 0) break;
      device = nullptr;
    }
    if (!device) {
      std::snprintf(err, err_len, "no OpenCL device on %u platform(s): install pocl-opencl-icd", n_platforms);
      return nullptr;
    }
    s = new State;
    s->device = device;
    s->device_name = device_string(device, CL_DEVICE_NAME);
    cl_int crc = CL_SUCCESS;
    s->context = clCreateContext(nullptr, 1, &device, nullptr, nullptr, &crc);
    check(crc, "clCreateContext");
    s->queue = clCreateCommandQueue(s->context, device, 0, &crc);
    check(crc, "clCreateCommandQueue");
    cl_ulong local = 0;
    check(clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, nullptr),
          "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)");
    s->local_mem = static_cast<size_t>(local);
    s->programs[0] = build(*s, false);
    s->fp64 = device_string(device, CL_DEVICE_EXTENSIONS).find("cl_khr_fp64") != std::string::npos;
    if (s->fp64) s->programs[1] = build(*s, true);
    return s;
  } catch (const ClError& e) {
    std::snprintf(err, err_len, "%s", e.what.c_str());
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
  }
  delete s;
  return nullptr;
}

void fini(void* state) { delete static_cast<State*>(state); }

int supports(void* state, const nc_case* c, char* reason, size_t reason_len) {
  const auto* s = static_cast<const State*>(state);
  const ph::Geometry g = ph::geometry_of(*c);
  const ph::RoundingPoints rp = ph::rounding_points(*c);
  if (!rp.ok) return ph::decline(reason, reason_len, "contract %s not known to this plugin", c->contract);
  if (c->dtype_compute == NC_FLOAT64 && !s->fp64)
    return ph::decline(reason, reason_len, "float64 compute: %s has no cl_khr_fp64", s->device_name.c_str());
  if (c->dtype_compute == NC_FLOAT64 &&
      (rp.h == NC_BFLOAT16 || rp.xhat == NC_BFLOAT16 || rp.scale == NC_BFLOAT16 || rp.mul == NC_BFLOAT16))
    return ph::decline(reason, reason_len, "a bfloat16 rounding point under float64 compute");
  if (c->weight_offset != 0 && c->affine == NC_AFFINE_NONE)
    return ph::decline(reason, reason_len, "weight_offset without a weight");
  if (g.cols < 1 || g.cols > std::numeric_limits<int>::max())
    return ph::decline(reason, reason_len, "row length %lld out of range", static_cast<long long>(g.cols));
  return 0;
}

// The local size of the row kernels: 4, 16, 64 or 256 by row length (more only adds barrier
// steps on a CPU), within the device's limit and its local memory. Few distinct sizes because
// PoCL compiles each kernel once per local size (a cold run of the ci tier took 21 s with every
// power of two up to 256); work-items past the row's end add zeros to the sums.
size_t local_size(const State& s, const Program& p, std::int64_t cols, size_t elem) {
  size_t l = cols <= 4 ? 4 : cols <= 16 ? 16 : cols <= 64 ? 64 : 256;
  while (l > 1 && (l > p.max_group || l * elem > s.local_mem)) l >>= 1;
  return l;
}

template <class T>
void set_arg(cl_kernel k, cl_uint i, const T& v) {
  check(clSetKernelArg(k, i, sizeof(T), &v), "clSetKernelArg");
}

void set_buffer(cl_kernel k, cl_uint i, cl_mem m) {
  // A NULL buffer is a NULL pointer in the kernel (OpenCL 1.2, clSetKernelArg).
  check(clSetKernelArg(k, i, sizeof(cl_mem), m ? &m : nullptr), "clSetKernelArg");
}

template <class T>
int run_typed(State& s, const nc_case& c, const nc_named_tensor* inputs, std::int32_t n_in,
              nc_named_tensor* outputs, std::int32_t n_out) {
  const Program& prog = s.programs[std::is_same_v<T, double> ? 1 : 0];
  const ph::Geometry g = ph::geometry_of(c);
  const ph::RoundingPoints rp = ph::rounding_points(c);
  const auto rows = static_cast<size_t>(g.rows), cols = static_cast<size_t>(g.cols), count = rows * cols;
  const bool backward = c.direction == NC_BACKWARD;

  // Uploads input `name` (dense, converted to T) into its buffer; nullptr when absent.
  auto upload = [&](const char* name) -> cl_mem {
    const nc_named_tensor* t = ph::find(inputs, n_in, name);
    if (!t) return nullptr;
    const ph::Layout l = ph::layout_of(t->tensor, g, name);
    std::vector<T> host(l.row.size() * l.col.size());
    ph::gather(t->tensor, l, host.data());
    cl_mem m = s.buffer(name, host.size() * sizeof(T));
    if (!host.empty())
      check(clEnqueueWriteBuffer(s.queue, m, CL_TRUE, 0, host.size() * sizeof(T), host.data(), 0, nullptr,
                                 nullptr),
            "clEnqueueWriteBuffer");
    return m;
  };
  // The device buffer of output `name`, or nullptr when the case does not ask for it.
  auto out_buffer = [&](const char* name, size_t n) -> cl_mem {
    return ph::find(outputs, n_out, name) ? s.buffer(std::string("out:") + name, n * sizeof(T)) : nullptr;
  };
  // Reads output `name` back and rounds it into the host tensor.
  auto download = [&](const char* name, cl_mem m) {
    nc_named_tensor* t = ph::find(outputs, n_out, name);
    if (!t || !m) return;
    const ph::Layout l = ph::layout_of(t->tensor, g, name);
    std::vector<T> host(l.row.size() * l.col.size());
    if (!host.empty())
      check(clEnqueueReadBuffer(s.queue, m, CL_TRUE, 0, host.size() * sizeof(T), host.data(), 0, nullptr,
                                nullptr),
            "clEnqueueReadBuffer");
    ph::scatter(host.data(), l, t->tensor);
    t->written = 1;
  };

  cl_mem x = upload("x"), w = upload("weight"), b = upload("bias"), res = upload("residual"),
         rb = upload("residual_bias"), dy = backward ? upload("dy") : nullptr;
  if (!x) throw ClError{"the case has no input x"};
  if (backward && !dy) throw ClError{"a backward case without input dy"};

  int flags = 0;
  if (c.op == NC_RMSNORM) flags |= kRms;
  if (w) flags |= kWeight;
  if (b) flags |= kBias;
  if (res) flags |= kResidual;
  if (rb) flags |= kResidualBias;
  if (c.alpha != 1.0) flags |= kAlpha;
  if (c.weight_offset != 0.0) flags |= kOffset;
  // Scalars in the compute type, as a kernel takes them; 1/n rounded once (the mean is
  // sum * inv_n: two roundings, as a division followed by nothing would be one; the error model
  // charges the mean with n+1 roundings, which covers both).
  const T inv_n = static_cast<T>(1.0 / static_cast<double>(cols)), eps = static_cast<T>(c.epsilon),
          alpha = static_cast<T>(c.alpha), offset = static_cast<T>(c.weight_offset);
  const int n = static_cast<int>(cols);
  const size_t lsize = local_size(s, prog, g.cols, sizeof(T));
  const size_t global = rows * lsize;

  if (!backward) {
    cl_mem y = out_buffer("y", count), h = out_buffer("residual_out", count), mean = out_buffer("mean", rows),
           rstd = out_buffer("rstd", rows);
    cl_kernel k = prog.forward;
    cl_uint i = 0;
    for (cl_mem m : {x, res, rb, w, b, y, h, mean, rstd}) set_buffer(k, i++, m);
    set_arg(k, i++, n);
    for (T v : {inv_n, eps, alpha, offset}) set_arg(k, i++, v);
    for (int v : {flags, rp.h, rp.xhat, rp.scale, rp.mul}) set_arg(k, i++, v);
    check(clSetKernelArg(k, i++, lsize * sizeof(T), nullptr), "clSetKernelArg(local)");
    if (rows > 0)
      check(clEnqueueNDRangeKernel(s.queue, k, 1, nullptr, &global, &lsize, 0, nullptr, nullptr),
            "clEnqueueNDRangeKernel(norm_forward)");
    download("y", y);
    download("residual_out", h);
    download("mean", mean);
    download("rstd", rstd);
    return 0;
  }

  cl_mem dx = out_buffer("dx", count), dres = out_buffer("dresidual", count),
         dw = out_buffer("dweight", cols), db = out_buffer("dbias", cols),
         drb = out_buffer("dresidual_bias", cols);
  cl_mem xhat = dw ? s.buffer("xhat", count * sizeof(T)) : nullptr;
  cl_mem dh = drb ? s.buffer("dh", count * sizeof(T)) : nullptr;
  cl_kernel k = prog.backward_rows;
  cl_uint i = 0;
  for (cl_mem m : {x, res, rb, w, dy, dx, dres, xhat, dh}) set_buffer(k, i++, m);
  set_arg(k, i++, n);
  for (T v : {inv_n, eps, alpha, offset}) set_arg(k, i++, v);
  for (int v : {flags, rp.h}) set_arg(k, i++, v);
  check(clSetKernelArg(k, i++, lsize * sizeof(T), nullptr), "clSetKernelArg(local)");
  if (rows > 0)
    check(clEnqueueNDRangeKernel(s.queue, k, 1, nullptr, &global, &lsize, 0, nullptr, nullptr),
          "clEnqueueNDRangeKernel(norm_backward_rows)");
  if (dw || db || drb) {
    cl_kernel kc = prog.backward_cols;
    i = 0;
    for (cl_mem m : {dy, xhat, dh, dw, db, drb}) set_buffer(kc, i++, m);
    set_arg(kc, i++, static_cast<cl_long>(rows));
    set_arg(kc, i++, n);
    check(clEnqueueNDRangeKernel(s.queue, kc, 1, nullptr, &cols, nullptr, 0, nullptr, nullptr),
          "clEnqueueNDRangeKernel(norm_backward_cols)");
  }
  download("dx", dx);
  download("dresidual", dres);
  download("dweight", dw);
  download("dbias", db);
  download("dresidual_bias", drb);
  return 0;
}

int run(void* state, const nc_case* c, const nc_named_tensor* inputs, std::int32_t n_inputs,
        nc_named_tensor* outputs, std::int32_t n_outputs, char* err, size_t err_len) {
  auto* s = static_cast<State*>(state);
  try {
    if (c->dtype_compute == NC_FLOAT64)
      return run_typed<double>(*s, *c, inputs, n_inputs, outputs, n_outputs);
    return run_typed<float>(*s, *c, inputs, n_inputs, outputs, n_outputs);
  } catch (const ClError& e) {
    std::snprintf(err, err_len, "%s", e.what.c_str());
  } catch (const std::bad_alloc&) {
    std::snprintf(err, err_len, "out of host memory");
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
  }
  return 1;
}

constexpr nc_candidate kCandidate = {
    NORMCHECK_CANDIDATE_ABI_VERSION,
    sizeof(nc_candidate),
    "opencl",
    "OpenCL kernels (one work-group per row, local-memory tree reductions, two-pass), first OpenCL "
    "device (PoCL on the CPU here); float32 or float64 compute, host conversions",
    (1u << NC_LAYERNORM) | (1u << NC_RMSNORM),
    (1u << NC_FLOAT64) | (1u << NC_FLOAT32) | (1u << NC_FLOAT16) | (1u << NC_BFLOAT16),
    (1u << NC_FLOAT32) | (1u << NC_FLOAT64),
    (1u << NC_FORWARD) | (1u << NC_BACKWARD),
    "exact,llama,gemma,te,te_wdtype,onnx,fused_add_lowp",
    // two_pass (conformance/TOLERANCE.md, section 9), read from opencl_kernels.hpp: row_stats sums
    // h, then (h - mean)^2, each over strided work-items and a local-memory tree; the column sums
    // run over rows in order. Measured: 0 FAILED over the ci tier under it.
    NC_CAP_RESIDUAL | NC_CAP_GENERAL_AXES | NC_CAP_WEIGHT_OFFSET | NC_CAP_REDUCTION(NC_REDUCTION_TWO_PASS, 0),
    "opencl",
    init,
    fini,
    supports,
    run,
    0,  // quant_formats: no fused quantization
    0,  // quant_scales
};

}  // namespace
}  // namespace normcheck::opencl_candidate

const nc_candidate* normcheck_candidate(void) { return &normcheck::opencl_candidate::kCandidate; }
