// builtin:onednn: oneDNN's layer normalization primitive (dnnl::layer_normalization_forward and
// _backward) on the CPU engine, as Debian's libdnnl 2.6 ships it. README.md says what it takes
// and declines, and why.
//
// oneDNN computes; the plugin only moves data: it packs x (and dy) into a dense [rows, C] buffer
// of their own dtype (bytes unchanged), converts weight/bias to the float32 scale/shift that
// oneDNN 2.6 requires (exact for float32/bfloat16 values), and copies dst, diff_src and the
// statistics back. Two outputs are formed here: rstd = 1/sqrt(variance + eps) in float32 (oneDNN
// returns the variance), and diff_scale/diff_shift rounded once from float32 into the parameter
// dtype.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <exception>
#include <string>
#include <vector>

#include "../common/plugin_host.hpp"
#include "normcheck/candidate.h"
#include "oneapi/dnnl/dnnl_version.h"

#define NC_STR2(x) #x
#define NC_STR(x) NC_STR2(x)
#define ONEDNN_VERSION_TEXT \
  NC_STR(DNNL_VERSION_MAJOR) "." NC_STR(DNNL_VERSION_MINOR) "." NC_STR(DNNL_VERSION_PATCH)

namespace normcheck::onednn_candidate {
namespace {

namespace ph = normcheck::plugin_host;
using dnnl::memory;
using dnnl::normalization_flags;
using dnnl::prop_kind;

struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

// A failure to report through err (the primitive's own message where oneDNN gave one).
struct Failure {
  std::string what;
};

void* init(char* err, size_t err_len) {
  try {
    return new State;
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "oneDNN CPU engine: %s", e.what());
  }
  return nullptr;
}

void fini(void* state) { delete static_cast<State*>(state); }

memory::data_type data_type(std::int32_t dtype) {
  return dtype == NC_BFLOAT16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// What one case needs from oneDNN: the descriptors and the forward/backward primitive
// descriptors. Construction throws dnnl::error where oneDNN has no implementation.
struct Plan {
  std::int64_t rows = 0, cols = 0;
  memory::desc data, stat;
  normalization_flags flags = normalization_flags::none;
  float eps = 0;
  dnnl::layer_normalization_forward::primitive_desc fwd;
  dnnl::layer_normalization_backward::primitive_desc bwd;

  Plan(const State& s, const nc_case& c) {
    const ph::Geometry g = ph::geometry_of(c);
    rows = g.rows;
    cols = g.cols;
    // oneDNN 2.6 takes one data descriptor for src and dst (and diff_src/diff_dst), so x, y,
    // dy and dx share a dtype; supports() declines cases where they differ.
    data = memory::desc({rows, cols}, data_type(c.dtype_x), memory::format_tag::ab);
    stat = memory::desc({rows}, memory::data_type::f32, memory::format_tag::a);
    if (c.affine != NC_AFFINE_NONE) flags = flags | normalization_flags::use_scale;
    if (c.affine == NC_AFFINE_WEIGHT_BIAS) flags = flags | normalization_flags::use_shift;
    eps = static_cast<float>(c.epsilon);  // oneDNN's epsilon is a float
    // forward_training: the statistics are outputs (forward_inference computes them but does
    // not return them).
    fwd = dnnl::layer_normalization_forward::primitive_desc(
        dnnl::layer_normalization_forward::desc(prop_kind::forward_training, data, stat, eps, flags),
        s.engine);
    if (c.direction == NC_BACKWARD)
      bwd = dnnl::layer_normalization_backward::primitive_desc(
          dnnl::layer_normalization_backward::desc(prop_kind::backward, data, data, stat, eps, flags),
          s.engine, fwd);
  }
};

int supports(void* state, const nc_case* c, char* reason, size_t reason_len) {
  if (c->dtype_x != c->dtype_out)
    return ph::decline(reason, reason_len,
                       "oneDNN %d.%d layer normalization takes one data type for src and dst (x is %s, y %s)",
                       DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, ph::dtype_name(c->dtype_x),
                       ph::dtype_name(c->dtype_out));
  const ph::Geometry g = ph::geometry_of(*c);
  if (g.rows < 1 || g.cols < 1) return ph::decline(reason, reason_len, "an empty tensor");
  try {
    Plan plan(*static_cast<const State*>(state), *c);
  } catch (const dnnl::error& e) {
    return ph::decline(reason, reason_len, "oneDNN %d.%d has no CPU implementation for this case: %s",
                       DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, e.what());
  } catch (const std::exception& e) {
    return ph::decline(reason, reason_len, "%s", e.what());
  }
  return 0;
}

// A dense float32 copy of a parameter (oneDNN 2.6's scale and shift are float32).
std::vector<float> param_f32(const nc_named_tensor* t) {
  const ph::Layout l = ph::param_layout(t->tensor);
  std::vector<float> out(l.col.size());
  ph::gather(t->tensor, l, out.data());
  return out;
}

void run_case(State& s, const nc_case& c, const nc_named_tensor* inputs, std::int32_t n_in,
              nc_named_tensor* outputs, std::int32_t n_out) {
  const Plan plan(s, c);
  const ph::Geometry g = ph::geometry_of(c);
  const auto count = static_cast<size_t>(plan.rows * plan.cols);
  const size_t es = ph::size_of(c.dtype_x);

  const nc_named_tensor* x = ph::find(inputs, n_in, "x");
  const nc_named_tensor* w = ph::find(inputs, n_in, "weight");
  const nc_named_tensor* b = ph::find(inputs, n_in, "bias");
  if (!x) throw Failure{"the case has no input x"};
  std::vector<unsigned char> src(count * es);
  ph::gather_raw(x->tensor, ph::x_layout(x->tensor, g), src.data());
  std::vector<float> scale = w ? param_f32(w) : std::vector<float>(static_cast<size_t>(plan.cols), 1.0f);
  std::vector<float> shift = b ? param_f32(b) : std::vector<float>(static_cast<size_t>(plan.cols), 0.0f);
  std::vector<float> mean(static_cast<size_t>(plan.rows)), var(static_cast<size_t>(plan.rows));
  std::vector<unsigned char> dst(count * es);

  const memory::desc param_desc({plan.cols}, memory::data_type::f32, memory::format_tag::a);
  memory src_m(plan.data, s.engine, src.data()), dst_m(plan.data, s.engine, dst.data());
  memory mean_m(plan.stat, s.engine, mean.data()), var_m(plan.stat, s.engine, var.data());
  memory scale_m(param_desc, s.engine, scale.data()), shift_m(param_desc, s.engine, shift.data());

  dnnl::layer_normalization_forward(plan.fwd).execute(s.stream, {{DNNL_ARG_SRC, src_m},
                                                                 {DNNL_ARG_DST, dst_m},
                                                                 {DNNL_ARG_MEAN, mean_m},
                                                                 {DNNL_ARG_VARIANCE, var_m},
                                                                 {DNNL_ARG_SCALE, scale_m},
                                                                 {DNNL_ARG_SHIFT, shift_m}});
  s.stream.wait();

  // rstd from oneDNN's variance, in float32 as oneDNN itself forms 1/sqrt(var + eps).
  auto write_stats = [&] {
    if (nc_named_tensor* t = ph::find(outputs, n_out, "mean")) {
      ph::scatter(mean.data(), ph::stat_layout(t->tensor, g), t->tensor);
      t->written = 1;
    }
    if (nc_named_tensor* t = ph::find(outputs, n_out, "rstd")) {
      std::vector<float> rstd(var.size());
      for (size_t i = 0; i < var.size(); ++i) rstd[i] = 1.0f / std::sqrt(var[i] + plan.eps);
      ph::scatter(rstd.data(), ph::stat_layout(t->tensor, g), t->tensor);
      t->written = 1;
    }
  };

  if (c.direction == NC_FORWARD) {
    if (nc_named_tensor* t = ph::find(outputs, n_out, "y")) {
      ph::scatter_raw(dst.data(), ph::x_layout(t->tensor, g), t->tensor);
      t->written = 1;
    }
    write_stats();
    return;
  }

  const nc_named_tensor* dy = ph::find(inputs, n_in, "dy");
  if (!dy) throw Failure{"a backward case without input dy"};
  std::vector<unsigned char> diff_dst(count * es), diff_src(count * es);
  ph::gather_raw(dy->tensor, ph::x_layout(dy->tensor, g), diff_dst.data());
  std::vector<float> diff_scale(static_cast<size_t>(plan.cols)), diff_shift(static_cast<size_t>(plan.cols));
  memory diff_dst_m(plan.data, s.engine, diff_dst.data()), diff_src_m(plan.data, s.engine, diff_src.data());
  memory diff_scale_m(param_desc, s.engine, diff_scale.data()),
      diff_shift_m(param_desc, s.engine, diff_shift.data());
  dnnl::layer_normalization_backward(plan.bwd).execute(s.stream, {{DNNL_ARG_SRC, src_m},
                                                                  {DNNL_ARG_MEAN, mean_m},
                                                                  {DNNL_ARG_VARIANCE, var_m},
                                                                  {DNNL_ARG_DIFF_DST, diff_dst_m},
                                                                  {DNNL_ARG_SCALE, scale_m},
                                                                  {DNNL_ARG_SHIFT, shift_m},
                                                                  {DNNL_ARG_DIFF_SRC, diff_src_m},
                                                                  {DNNL_ARG_DIFF_SCALE, diff_scale_m},
                                                                  {DNNL_ARG_DIFF_SHIFT, diff_shift_m}});
  s.stream.wait();
  if (nc_named_tensor* t = ph::find(outputs, n_out, "dx")) {
    ph::scatter_raw(diff_src.data(), ph::x_layout(t->tensor, g), t->tensor);
    t->written = 1;
  }
  if (nc_named_tensor* t = ph::find(outputs, n_out, "dweight")) {
    ph::scatter(diff_scale.data(), ph::param_layout(t->tensor), t->tensor);
    t->written = 1;
  }
  if (nc_named_tensor* t = ph::find(outputs, n_out, "dbias")) {
    ph::scatter(diff_shift.data(), ph::param_layout(t->tensor), t->tensor);
    t->written = 1;
  }
}

int run(void* state, const nc_case* c, const nc_named_tensor* inputs, std::int32_t n_inputs,
        nc_named_tensor* outputs, std::int32_t n_outputs, char* err, size_t err_len) {
  try {
    run_case(*static_cast<State*>(state), *c, inputs, n_inputs, outputs, n_outputs);
    return 0;
  } catch (const Failure& f) {
    std::snprintf(err, err_len, "%s", f.what.c_str());
  } catch (const dnnl::error& e) {
    std::snprintf(err, err_len, "oneDNN: %s (status %d)", e.what(), static_cast<int>(e.status));
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
  }
  return 1;
}

constexpr nc_candidate kCandidate = {
    NORMCHECK_CANDIDATE_ABI_VERSION,
    sizeof(nc_candidate),
    "onednn",
    "oneDNN " ONEDNN_VERSION_TEXT
    " layer_normalization_forward/_backward, CPU engine; LayerNorm over the last dim, float32 and "
    "bfloat16 data, float32 statistics",
    1u << NC_LAYERNORM,  // oneDNN 2.x has no RMSNorm
    (1u << NC_FLOAT32) | (1u << NC_BFLOAT16),
    1u << NC_FLOAT32,
    (1u << NC_FORWARD) | (1u << NC_BACKWARD),
    "exact",
    // No fused residual, blocks, other axes or weight offset in the primitive. Its bfloat16 output
    // conversion flushes subnormal results to zero on this machine (AVX512-BF16; found by
    // `normcheck prop`, property_tests/README.md), so it declares flush-to-zero outputs.
    NC_CAP_FLUSH_SUBNORMAL_OUTPUTS,
    "cpu",
    init,
    fini,
    supports,
    run,
    0,  // quant_formats: no fused quantization
    0,  // quant_scales
};

}  // namespace
}  // namespace normcheck::onednn_candidate

const nc_candidate* normcheck_candidate(void) { return &normcheck::onednn_candidate::kCandidate; }
