// builtin:cuda: LayerNorm and RMSNorm, forward and backward, as CUDA kernels on GPU 0
// (cuda_norm.cu). README.md says what it takes and declines, and why.
//
// The host side packs each strided input into a dense [rows, cols] buffer of its own dtype
// (bytes unchanged) and unpacks the outputs, which the kernels have already rounded to their
// dtypes. Without a GPU (or a driver), init fails with "no CUDA device (cudaGetDeviceCount:
// ...)" and normcheck reports every case UNSUPPORTED with that reason.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "../common/plugin_host.hpp"
#include "cuda_norm.hpp"
#include "normcheck/candidate.h"

namespace normcheck::cuda_candidate {
namespace {

namespace ph = normcheck::plugin_host;

void* init(char* err, size_t err_len) {
  try {
    std::string why;
    Device* d = open_device(why);
    if (!d) std::snprintf(err, err_len, "%s", why.c_str());
    return d;
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
  }
  return nullptr;
}

void fini(void* state) { close_device(static_cast<Device*>(state)); }

// The case's quantization contract, or nullptr (a host before nc_quant, or a plain case).
const nc_quant* quant_of(const nc_case& c) {
  return c.struct_size >= offsetof(nc_case, quant) + sizeof(c.quant) ? c.quant : nullptr;
}

int supports(void* state, const nc_case* c, char* reason, size_t reason_len) {
  if (const nc_quant* q = quant_of(*c)) {  // the host only sends the formats and scales declared
    if (c->op != NC_RMSNORM) return ph::decline(reason, reason_len, "fused quantization after RMSNorm only");
    if (c->dtype_compute != NC_FLOAT32)
      return ph::decline(reason, reason_len, "fused quantization computes in float32 only");
    if (q->scale != NC_QS_STATIC_TENSOR && q->scale != NC_QS_DYNAMIC_TOKEN)
      return ph::decline(reason, reason_len, "block scales (MX, NVFP4) are not implemented");
  }
  const ph::Geometry g = ph::geometry_of(*c);
  if (!ph::rounding_points(*c).ok)
    return ph::decline(reason, reason_len, "contract %s not known to this plugin", c->contract);
  if (c->weight_offset != 0 && c->affine == NC_AFFINE_NONE)
    return ph::decline(reason, reason_len, "weight_offset without a weight");
  if (g.cols < 1 || g.cols > std::numeric_limits<int>::max())
    return ph::decline(reason, reason_len, "row length %lld out of range", static_cast<long long>(g.cols));
  if (g.rows > std::numeric_limits<int>::max())
    return ph::decline(reason, reason_len, "%lld rows: more than one grid", static_cast<long long>(g.rows));
  if (const std::string why = declines(static_cast<const Device*>(state), g.rows, g.cols); !why.empty())
    return ph::decline(reason, reason_len, "%s", why.c_str());
  return 0;
}

// A dense host copy of a named tensor, in its own dtype.
struct Packed {
  std::vector<unsigned char> bytes;
  HostBuffer view;
};

void run_case(Device* d, const nc_case& c, const nc_named_tensor* inputs, std::int32_t n_in,
              nc_named_tensor* outputs, std::int32_t n_out, std::string& failure) {
  const ph::Geometry g = ph::geometry_of(c);
  const ph::RoundingPoints rp = ph::rounding_points(c);
  Problem p;
  p.rms = c.op == NC_RMSNORM;
  p.backward = c.direction == NC_BACKWARD;
  p.rows = g.rows;
  p.cols = g.cols;
  p.compute = c.dtype_compute;
  p.eps = c.epsilon;
  p.alpha = c.alpha;
  p.offset = c.weight_offset;
  p.rp_h = rp.h;
  p.rp_xhat = rp.xhat;
  p.rp_scale = rp.scale;
  p.rp_mul = rp.mul;

  // Inputs, packed; outputs, dense buffers unpacked after the run.
  std::vector<Packed> packed;
  packed.reserve(16);
  auto input = [&](const char* name, HostBuffer& slot) {
    const nc_named_tensor* t = ph::find(inputs, n_in, name);
    if (!t) return;
    const ph::Layout l = ph::layout_of(t->tensor, g, name);
    Packed& pk = packed.emplace_back();
    pk.bytes.resize(l.row.size() * l.col.size() * ph::size_of(t->tensor.dtype));
    ph::gather_raw(t->tensor, l, pk.bytes.data());
    slot = {pk.bytes.data(), t->tensor.dtype};
  };
  struct Out {
    nc_named_tensor* t;
    ph::Layout layout;
    std::vector<unsigned char> bytes;
  };
  std::vector<Out> outs;
  outs.reserve(16);
  auto output = [&](const char* name, HostBuffer& slot) {
    nc_named_tensor* t = ph::find(outputs, n_out, name);
    if (!t) return;
    Out& o = outs.emplace_back(Out{t, ph::layout_of(t->tensor, g, name), {}});
    o.bytes.resize(o.layout.row.size() * o.layout.col.size() * ph::size_of(t->tensor.dtype));
    slot = {o.bytes.data(), t->tensor.dtype};
  };
  input("x", p.x);
  input("residual", p.residual);
  input("residual_bias", p.residual_bias);
  input("weight", p.weight);
  input("bias", p.bias);
  input("dy", p.dy);
  output("y", p.y);
  output("residual_out", p.residual_out);
  output("mean", p.mean);
  output("rstd", p.rstd);
  output("dx", p.dx);
  output("dresidual", p.dresidual);
  output("dweight", p.dweight);
  output("dbias", p.dbias);
  output("dresidual_bias", p.dresidual_bias);
  // Fused quantization: the static scale in, codes, the per-row scale and amax out.
  const nc_quant* q = quant_of(c);
  std::vector<float> row_scale, row_amax;
  nc_named_tensor* scale_out = nullptr;
  nc_named_tensor* amax_out = nullptr;
  if (q) {
    Problem::Quant& pq = p.quant;
    pq.on = true;
    pq.format = q->format;
    pq.dynamic = q->scale == NC_QS_DYNAMIC_TOKEN;
    pq.apply = q->apply;
    pq.value_dt = q->value == NC_QV_FLOAT32 ? NC_FLOAT32 : c.dtype_out;
    pq.nan_code = q->nan == NC_QN_NAN_CODE;
    pq.scale_ub = static_cast<float>(q->scale_ub);
    pq.min_scale = static_cast<float>(q->min_scale);
    // R1: the residual sum rounded to its dtype before the statistics, whatever the norm contract.
    if (c.residual != NC_RESIDUAL_NONE && q->residual_sum == NC_QR_ROUNDED) p.rp_h = c.dtype_residual;
    if (!pq.dynamic) {
      const nc_named_tensor* st = ph::find(inputs, n_in, "scale");
      if (!st || st->tensor.dtype != NC_FLOAT32) {
        failure = "a static-scale case without a float32 input 'scale'";
        return;
      }
      pq.static_scale = *static_cast<const float*>(st->tensor.data);
    }
    output("q", pq.q);
    row_amax.resize(static_cast<std::size_t>(g.rows));
    pq.row_amax = {row_amax.data(), NC_FLOAT32};
    if (pq.dynamic) {
      row_scale.resize(static_cast<std::size_t>(g.rows));
      pq.scale = {row_scale.data(), NC_FLOAT32};
      scale_out = ph::find(outputs, n_out, "scale");
    }
    amax_out = ph::find(outputs, n_out, "amax");
  }
  // mean and rstd are in dtype_compute (fixtures/SCHEMA.md), the type the kernels store them in.
  if ((p.mean.data && p.mean.dtype != c.dtype_compute) || (p.rstd.data && p.rstd.dtype != c.dtype_compute)) {
    failure = "mean/rstd are not in dtype_compute";
    return;
  }

  failure = run_problem(d, p);
  if (!failure.empty()) return;
  for (Out& o : outs) {
    ph::scatter_raw(o.bytes.data(), o.layout, o.t->tensor);
    o.t->written = 1;
  }
  // Per-row float32 outputs ([..., 1]) and the static case's amax over the tensor ([1]).
  auto per_row = [&](nc_named_tensor* t, const std::vector<float>& v) {
    ph::scatter_raw(v.data(), ph::stat_layout(t->tensor, g), t->tensor);
    t->written = 1;
  };
  if (scale_out) per_row(scale_out, row_scale);
  if (amax_out && p.quant.dynamic) per_row(amax_out, row_amax);
  if (amax_out && !p.quant.dynamic) {
    float m = 0.0f;
    for (const float v : row_amax) m = std::fmax(m, v);
    *static_cast<float*>(amax_out->tensor.data) = m;
    amax_out->written = 1;
  }
}

int run(void* state, const nc_case* c, const nc_named_tensor* inputs, std::int32_t n_inputs,
        nc_named_tensor* outputs, std::int32_t n_outputs, char* err, size_t err_len) {
  try {
    std::string failure;
    run_case(static_cast<Device*>(state), *c, inputs, n_inputs, outputs, n_outputs, failure);
    if (failure.empty()) return 0;
    std::snprintf(err, err_len, "%s", failure.c_str());
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
    "cuda",
    "CUDA kernels on GPU 0 (one block per row, warp-shuffle + shared-memory reductions, two-pass); "
    "float32 or float64 compute; fused RMSNorm + static / per-token FP8 and int8 quantization",
    (1u << NC_LAYERNORM) | (1u << NC_RMSNORM),
    (1u << NC_FLOAT64) | (1u << NC_FLOAT32) | (1u << NC_FLOAT16) | (1u << NC_BFLOAT16),
    (1u << NC_FLOAT32) | (1u << NC_FLOAT64),
    (1u << NC_FORWARD) | (1u << NC_BACKWARD),
    "exact,llama,gemma,te,te_wdtype,onnx,fused_add_lowp",
    NC_CAP_RESIDUAL | NC_CAP_GENERAL_AXES | NC_CAP_WEIGHT_OFFSET,
    "cuda",
    init,
    fini,
    supports,
    run,
    // Fused RMSNorm + quantization (cuda_quant_device.cuh): vLLM's static and dynamic per-token
    // FP8/int8 kernels and FlashInfer's rmsnorm_quant; no MX or NVFP4 block scales.
    (1u << NC_Q_FLOAT8_E4M3FN) | (1u << NC_Q_FLOAT8_E5M2) | (1u << NC_Q_INT8),
    (1u << NC_QS_STATIC_TENSOR) | (1u << NC_QS_DYNAMIC_TOKEN),
};

}  // namespace
}  // namespace normcheck::cuda_candidate

const nc_candidate* normcheck_candidate(void) { return &normcheck::cuda_candidate::kCandidate; }
