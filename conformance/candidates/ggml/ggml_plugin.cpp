// builtin:ggml-cpu, builtin:ggml-vulkan and builtin:ggml-cuda: ggml's own norm ops (ggml_rms_norm,
// ggml_norm, ggml_rms_norm_back) in the graphs llama.cpp builds around them, on ggml's CPU backend
// (one pinned CPU variant), its Vulkan backend or its CUDA backend, from node-llama-cpp's prebuilt
// libraries
// (scripts/install-ggml.sh). README.md says what maps onto ggml and what is declined, and why.
//
// ggml computes; the plugin only builds the graph and moves bytes. Each input is copied, bytes
// unchanged, into a ggml tensor spanning the host's memory of it, and the case's layout (the
// normalized dims, the host's strides) becomes a ggml view of that tensor (ggml_view_4d, then
// ggml_permute when the normalized dim is not the innermost one in memory), which is what real
// graphs hand the op. The weight and bias are the separate ggml_mul / ggml_add nodes ggml graphs
// use (and its backends fuse by pattern), the fused residual an ggml_add feeding the norm. Every
// node is put to ggml_backend_supports_op first; a "no" is UNSUPPORTED with that answer.
//
// Built three times from this file: ggml-cpu, ggml-vulkan (NC_GGML_VULKAN 1) and ggml-cuda
// (NC_GGML_CUDA 1; its libggml-cuda.so comes from the CUDA package, NC_GGML_CUDA_DIR, and needs
// an NVIDIA driver and device: without them every case is declined saying which). Without ggml's
// headers (NC_GGML_HAVE_HEADERS 0) it is built as a candidate that declines every case, saying how
// to install ggml.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../common/plugin_host.hpp"
#include "normcheck/candidate.h"

#if NC_GGML_VULKAN
#define NC_GGML_NAME "ggml-vulkan"
#define NC_GGML_DEVICE "vulkan"
#elif NC_GGML_CUDA
#define NC_GGML_NAME "ggml-cuda"
#define NC_GGML_DEVICE "cuda"
#else
#define NC_GGML_NAME "ggml-cpu"
#define NC_GGML_DEVICE "cpu"
#endif

#if NC_GGML_HAVE_HEADERS
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#endif

namespace normcheck::ggml_candidate {
namespace {

namespace ph = normcheck::plugin_host;

#if !NC_GGML_HAVE_HEADERS

void* init(char* err, size_t err_len) {
  std::snprintf(err, err_len,
                "ggml is not installed: run scripts/install-ggml.sh, then configure the build again "
                "(CMake found no ggml headers in conformance/candidates/ggml/include-ggml/)");
  return nullptr;
}
void fini(void*) {}
int supports(void*, const nc_case*, char* reason, size_t reason_len) {
  return ph::decline(reason, reason_len, "ggml is not installed (scripts/install-ggml.sh)");
}
int run(void*, const nc_case*, const nc_named_tensor*, std::int32_t, nc_named_tensor*, std::int32_t, char* err,
        size_t err_len) {
  std::snprintf(err, err_len, "ggml is not installed");
  return 1;
}

#else

// The CPU variant the bundled candidate loads (libggml-cpu-<variant>.so): haswell (AVX2, FMA,
// F16C) runs on nearly every x86-64 CI machine; README.md says what the others change.
constexpr const char* kDefaultCpuVariant = "haswell";

struct Failure {
  std::string what;
};

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct State {
  ggml_backend_reg_t reg = nullptr;
  ggml_backend_dev_t dev = nullptr;
  ggml_backend_t backend = nullptr;
  std::string what;  // backend, device and variant, for messages
  int threads = 1;
  bool llvmpipe = false;  // Mesa's software Vulkan device (lavapipe): its loop limit (#lavapipe-loop-limit)
};

void fini(void* state) {
  auto* s = static_cast<State*>(state);
  if (!s) return;
  if (s->backend) ggml_backend_free(s->backend);
  delete s;
}

void* init(char* err, size_t err_len) {
  auto* s = new State;
  const std::string dir = env_or("NORMCHECK_GGML_DIR", NC_GGML_LIB_DIR);
  // A GGML_ABORT ends the process (the candidate runs isolated: NC_CAP_ISOLATE). Without a
  // callback ggml first prints a backtrace by attaching gdb, seconds per crash: print the
  // message only.
  ggml_set_abort_callback([](const char* message) { std::fprintf(stderr, "ggml abort: %s\n", message); });
#if NC_GGML_VULKAN
  // ggml skips CPU-type Vulkan devices (lavapipe's llvmpipe) unless they are named here.
  setenv("GGML_VK_VISIBLE_DEVICES", "0", 0);
  const std::string lib = dir + "/libggml-vulkan.so";
#elif NC_GGML_CUDA
  const std::string lib = env_or("NORMCHECK_GGML_CUDA_DIR", NC_GGML_CUDA_DIR) + "/libggml-cuda.so";
  if (access(lib.c_str(), R_OK) != 0) {
    std::snprintf(err, err_len, "%s is not installed (scripts/install-ggml.sh)", lib.c_str());
    fini(s);
    return nullptr;
  }
  // libggml-cuda.so needs the NVIDIA driver's libcuda.so.1 (and CUDA 13's runtime libraries);
  // ggml_backend_load would only log the dlopen error: say which library is missing.
  // The probe's handle stays open over ggml_backend_load below, which then maps nothing again.
  void* probe = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!probe) {
    const char* e = dlerror();
    std::snprintf(err, err_len,
                  "ggml's CUDA backend cannot load here: %s (it needs an NVIDIA GPU with its driver, libcuda.so.1, "
                  "and CUDA 13's runtime)",
                  e ? e : lib.c_str());
    fini(s);
    return nullptr;
  }
#else
  const std::string variant = env_or("NORMCHECK_GGML_CPU_VARIANT", kDefaultCpuVariant);
  const std::string lib = dir + "/libggml-cpu-" + variant + ".so";
  // A variant built for instructions this CPU lacks would die of SIGILL: ask it first (its
  // ggml_backend_score is 0 when the CPU lacks a feature it was built with).
  if (void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    using score_fn = int (*)();
    auto score = reinterpret_cast<score_fn>(dlsym(h, "ggml_backend_score"));
    const int sc = score ? score() : 0;
    dlclose(h);
    if (sc == 0) {
      std::snprintf(err, err_len, "ggml CPU variant %s does not run on this CPU (ggml_backend_score 0)", variant.c_str());
      fini(s);
      return nullptr;
    }
  } else {
    std::snprintf(err, err_len, "ggml CPU variant %s: %s (scripts/install-ggml.sh)", variant.c_str(), dlerror());
    fini(s);
    return nullptr;
  }
#endif
  s->reg = ggml_backend_load(lib.c_str());
#if NC_GGML_CUDA
  dlclose(probe);
#endif
  if (!s->reg) {
    // ggml-vulkan's registration returns none when no Vulkan instance or device comes up.
    if (NC_GGML_VULKAN && access(lib.c_str(), R_OK) == 0)
      std::snprintf(err, err_len,
                    "ggml's Vulkan backend has no device (ggml_backend_load(%s) returned none; Debian's "
                    "mesa-vulkan-drivers gives the software one, lavapipe)",
                    lib.c_str());
    else
      std::snprintf(err, err_len, "ggml_backend_load(%s) failed (scripts/install-ggml.sh)", lib.c_str());
    fini(s);
    return nullptr;
  }
  if (ggml_backend_reg_dev_count(s->reg) == 0) {
    std::snprintf(err, err_len,
                  NC_GGML_CUDA ? "ggml backend %s has no device (no CUDA device is visible: no NVIDIA GPU, or "
                                 "CUDA_VISIBLE_DEVICES hides it)"
                               : "ggml backend %s has no device (Vulkan: no Vulkan device; Debian's "
                                 "mesa-vulkan-drivers gives the software one, lavapipe)",
                  ggml_backend_reg_name(s->reg));
    fini(s);
    return nullptr;
  }
  s->dev = ggml_backend_reg_dev_get(s->reg, 0);
  s->backend = ggml_backend_dev_init(s->dev, nullptr);
  if (!s->backend) {
    std::snprintf(err, err_len, "ggml_backend_dev_init(%s) failed", ggml_backend_dev_name(s->dev));
    fini(s);
    return nullptr;
  }
  const std::string description = ggml_backend_dev_description(s->dev);
  s->what = std::string(ggml_backend_dev_name(s->dev)) + " (" + description + ")";
  s->llvmpipe = description.find("llvmpipe") != std::string::npos;
#if !NC_GGML_VULKAN && !NC_GGML_CUDA
  s->what += ", variant " + variant;
#endif
  s->threads = std::atoi(env_or("NORMCHECK_GGML_THREADS", "1").c_str());
  if (s->threads < 1) s->threads = 1;
  return s;
}

// The CPU backend's thread count (ggml's default is 4); the Vulkan backend has none.
void set_threads(const State& s, ggml_backend_t backend) {
  using set_threads_fn = void (*)(ggml_backend_t, int);
  if (auto fn = reinterpret_cast<set_threads_fn>(ggml_backend_reg_get_proc_address(s.reg, "ggml_backend_set_n_threads")))
    fn(backend, s.threads);
}

ggml_type type_of(std::int32_t dtype) {
  switch (dtype) {
    case NC_FLOAT32: return GGML_TYPE_F32;
    case NC_FLOAT16: return GGML_TYPE_F16;
    default: return GGML_TYPE_BF16;
  }
}

// One dim of a view: extent and stride in elements.
struct Dim {
  std::int64_t ext = 1, stride = 0;
};

// The grouping of a case's dims into ggml's up to four: the normalized dims merged into ne0, the
// other dims into ne1..ne3 (innermost first), each group a run of dims, in the case's row-major
// order, that every x-shaped input lays out as one strided dim. Dims of extent 1 are dropped.
struct Grouping {
  // groups[0]: the normalized dims; then the row groups, innermost group first. Each group lists
  // its dims in the case's order (outer to inner), so its stride is that of its last dim.
  std::vector<std::vector<int>> groups;
};

bool mergeable(const std::vector<const nc_tensor*>& ts, int outer, int inner) {
  for (const nc_tensor* t : ts)
    if (t->strides[outer] != t->strides[inner] * t->shape[inner]) return false;
  return true;
}

// Empty groups vector when the layout cannot be one ggml view; `why` says why.
Grouping group_dims(const nc_case& c, const std::vector<const nc_tensor*>& ts, std::string& why) {
  std::vector<bool> norm(static_cast<std::size_t>(c.rank), false);
  for (std::int32_t i = 0; i < c.n_norm_dims; ++i) norm[static_cast<std::size_t>(c.norm_dims[i])] = true;
  Grouping g;
  std::vector<int> cols;
  for (int d = 0; d < c.rank; ++d)
    if (norm[static_cast<std::size_t>(d)] && c.shape[d] > 1) cols.push_back(d);
  for (std::size_t k = 1; k < cols.size(); ++k)
    if (!mergeable(ts, cols[k - 1], cols[k])) {
      why = "the normalized dims are not one strided dim in memory (ggml normalizes one dim, ne0)";
      return {};
    }
  g.groups.push_back(cols);
  // Row dims, innermost first: a new group where the next outer dim does not merge.
  std::vector<int> current;
  for (int d = c.rank - 1; d >= 0; --d) {
    if (norm[static_cast<std::size_t>(d)] || c.shape[d] == 1) continue;
    if (!current.empty() && !mergeable(ts, d, current.front())) {
      g.groups.push_back(current);
      current.clear();
    }
    current.insert(current.begin(), d);  // each group in the case's order, outer to inner
  }
  if (!current.empty()) g.groups.push_back(current);
  if (g.groups.size() > 4) {
    why = "the rows do not fit ggml's three outer dims (" + std::to_string(g.groups.size() - 1) + " strided row groups)";
    return {};
  }
  return g;
}

std::array<Dim, 4> dims_of(const Grouping& g, const nc_tensor& t) {
  std::array<Dim, 4> out{};
  for (std::size_t k = 0; k < g.groups.size(); ++k) {
    Dim d;
    if (!g.groups[k].empty()) d.stride = t.strides[g.groups[k].back()];  // innermost dim of the run
    for (int dim : g.groups[k]) d.ext *= t.shape[dim];
    out[k] = d;
  }
  return out;
}

// What one case's graph is made of.
struct Graph {
  ggml_context* ctx_in = nullptr;
  ggml_context* ctx = nullptr;
  ggml_backend_buffer_t buf = nullptr;
  ggml_gallocr_t galloc = nullptr;
  ggml_cgraph* gf = nullptr;
  // A backend instance of its own: ggml-vulkan keeps per-instance state about the graphs it ran
  // (it corrupted the heap when one instance ran graphs of freed contexts; README.md).
  ggml_backend_t backend = nullptr;
  struct Input {
    const nc_tensor* host;
    ggml_tensor* base;
    std::size_t bytes;
  };
  std::vector<Input> inputs;
  std::vector<std::pair<std::string, ggml_tensor*>> outputs;  // output name -> ggml tensor
  std::int64_t cols = 1;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (galloc) ggml_gallocr_free(galloc);
    if (buf) ggml_backend_buffer_free(buf);
    if (ctx) ggml_free(ctx);
    if (ctx_in) ggml_free(ctx_in);
    if (backend) ggml_backend_free(backend);
  }
};

// Which points of the graph round to a 16-bit dtype (plugin_host::RoundingPoints): ggml keeps
// every intermediate in the type of its first operand, so with 16-bit x the residual sum h, the
// normalized x-hat and the weight product are 16-bit values. With float32 x each is a float32
// rounding of a float32 computation, which every contract's float32 points are.
std::string contract_mismatch(const nc_case& c) {
  const ph::RoundingPoints p = ph::rounding_points(c);
  if (!p.ok) return std::string("contract ") + c.contract + " has a part this plugin does not know";
  const bool low = c.dtype_x != NC_FLOAT32;
  auto is = [&](std::int32_t point) { return point == -1 || (!low && point == NC_FLOAT32) ? -1 : point; };
  const std::int32_t want_h = low && c.residual != NC_RESIDUAL_NONE ? c.dtype_x : -1;
  const std::int32_t want_xhat = low && c.affine != NC_AFFINE_NONE ? c.dtype_x : -1;
  const std::int32_t want_mul = low && c.affine == NC_AFFINE_WEIGHT_BIAS ? c.dtype_x : -1;
  auto differs = [&](std::int32_t got, std::int32_t want, std::int32_t also_ok) {
    return is(got) != want && !(want == -1 && is(got) == also_ok);
  };
  // x-hat rounded with no weight, or the product rounded with no bias, is the output's rounding.
  const std::int32_t out = c.dtype_out;
  if (differs(p.h, want_h, -2) || differs(p.xhat, want_xhat, c.affine == NC_AFFINE_NONE ? out : -2) ||
      differs(p.mul, want_mul, c.affine != NC_AFFINE_WEIGHT_BIAS ? out : -2) || is(p.scale) != -1)
    return std::string("contract ") + c.contract +
           " rounds elsewhere than ggml's graph, which keeps the residual sum, x-hat and the weight product "
           "in x's type (" +
           ph::dtype_name(c.dtype_x) + ")";
  return {};
}

// The plain refusals, before any graph is built.
std::string static_decline(const nc_case& c) {
  if (c.dtype_x == NC_FLOAT64) return "float64: ggml has no float64 tensors";
  if (c.dtype_out != c.dtype_x) return "y in another dtype than x: a ggml op's result has its input's type";
  if (c.residual != NC_RESIDUAL_NONE && c.dtype_residual != c.dtype_x)
    return "a residual of another dtype than x: ggml_add's result has x's type";
  if (c.affine != NC_AFFINE_NONE && c.dtype_param == NC_FLOAT64) return "float64 parameters: no such ggml type";
  if (c.dtype_compute != NC_FLOAT32) return "compute dtype other than float32 (ggml's norm ops compute in float32)";
  if (c.weight_offset != 0) return "weight_offset: ggml graphs have no offset (converters add it to the weight)";
  if (c.block != NC_BLOCK_NONE) return "residual blocks are not mapped";
  if (c.direction == NC_BACKWARD && c.op == NC_LAYERNORM)
    return "LayerNorm backward: ggml_norm has no backward (ggml_build_backward_expand aborts on GGML_OP_NORM)";
  if (c.direction == NC_BACKWARD && c.alpha != 1)
    return "backward with alpha != 1 is not mapped";
  if (c.direction == NC_BACKWARD && c.affine == NC_AFFINE_WEIGHT_BIAS) return "rmsnorm with a bias: not mapped backward";
  // dweight and dresidual_bias are ggml_repeat_back results, which have x's type.
  if (c.direction == NC_BACKWARD && (c.affine != NC_AFFINE_NONE || c.residual == NC_RESIDUAL_ADD_BIAS) &&
      c.dtype_param != c.dtype_x)
    return "backward with parameters of another dtype than x: ggml_repeat_back's parameter gradients have x's type";
  return contract_mismatch(c);
}

std::size_t span_bytes(const nc_tensor& t) {
  std::int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.strides[d];
  return static_cast<std::size_t>(last + 1) * ph::size_of(t.dtype);
}

// A view of `base` with the dims (ext, stride) in ggml's order ne0..ne3: built in memory order
// (ggml_view_4d, whose ne0 is dense) and permuted into place where that order differs. Dims of
// extent 1 keep their own place (a row of one element is the dense [1, rows], not a permute).
ggml_tensor* view_of(ggml_context* ctx, ggml_tensor* base, const std::array<Dim, 4>& dims, std::string& why) {
  std::vector<int> wide;  // dims of extent > 1, by stride
  for (int k = 0; k < 4; ++k)
    if (dims[k].ext > 1) wide.push_back(k);
  std::stable_sort(wide.begin(), wide.end(), [&](int a, int b) { return dims[a].stride < dims[b].stride; });
  std::array<int, 4> order{};  // memory slot k holds ggml dim order[k]
  for (int k = 0, w = 0; k < 4; ++k) order[k] = dims[k].ext == 1 ? k : wide[w++];
  const std::size_t es = ggml_type_size(base->type);
  if (!wide.empty() && dims[wide[0]].stride != 1) {
    why = "the innermost stride is " + std::to_string(dims[wide[0]].stride) +
          " elements: ggml views are dense in their first dim";
    return nullptr;
  }
  std::array<std::int64_t, 4> ne{};
  std::array<std::size_t, 4> nb{};
  for (int k = 0; k < 4; ++k) {
    const Dim& d = dims[order[k]];
    ne[k] = d.ext;
    nb[k] = d.ext > 1 ? static_cast<std::size_t>(d.stride) * es : k == 0 ? es : nb[k - 1] * static_cast<std::size_t>(ne[k - 1]);
  }
  ggml_tensor* v = ggml_view_4d(ctx, base, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], 0);
  std::array<int, 4> pos{};
  bool identity = true;
  for (int k = 0; k < 4; ++k) {
    pos[k] = order[k];  // memory dim k goes to ggml dim order[k]
    identity = identity && order[k] == k;
  }
  return identity ? v : ggml_permute(ctx, v, pos[0], pos[1], pos[2], pos[3]);
}

// NORMCHECK_GGML_DECLINE_FINDINGS=1: decline the graphs that hit a recorded finding
// (docs/FINDINGS.md), so that `normcheck prop` draws what is left instead of stopping every
// property at the same known fault (conformance/candidates/ggml/README.md, "Property runs").
// Off by default: the tiers and the main job run every graph ggml accepts and hold the result to
// known_findings.json. Returns the finding that `node` hits, or "".
bool declining_findings() {
  const char* v = std::getenv("NORMCHECK_GGML_DECLINE_FINDINGS");
  return v && *v && std::strcmp(v, "0") != 0;
}

[[maybe_unused]] bool dense_ne0(const ggml_tensor* t) { return t->ne[0] == 1 || t->nb[0] == ggml_type_size(t->type); }

// llvmpipe ends every loop of a shader invocation once 65535 loop ends have passed in all
// (Mesa's LP_MAX_TGSI_LOOP_ITERATIONS, one counter shared by every loop), so repeat_back.comp,
// one invocation per destination element running four nested loops over the source, stops
// summing part of the way. Measured on lavapipe (docs/FINDINGS.md#lavapipe-loop-limit): source
// row (i1, i2, i3) is summed iff 3 i1 + c2 i2 + c3 i3 < 65535, with c2 = 3 ne01 + 3 and
// c3 = ne02 c2 + 4, for a destination of one row ([ne00], the graphs here make no other).
[[maybe_unused]] bool repeat_back_truncated_on_llvmpipe(const ggml_tensor* node) {
  const ggml_tensor* a = node->src[0];
  if (ggml_nrows(node) != 1 || node->ne[0] != a->ne[0]) return ggml_nrows(a) > 1000;  // not modelled: be wary
  const std::int64_t c2 = 3 * a->ne[1] + 3, c3 = a->ne[2] * c2 + 4;
  return 3 * (a->ne[1] - 1) + c2 * (a->ne[2] - 1) + c3 * (a->ne[3] - 1) >= 65535;
}

std::string recorded_finding(const ggml_tensor* node, [[maybe_unused]] bool llvmpipe) {
  const ggml_tensor* a = node->src[0];
  const ggml_tensor* b = node->src[1];
#if NC_GGML_CUDA
  (void)a, (void)b;
  return {};  // no ggml-cuda finding is recorded
#elif NC_GGML_VULKAN
  if (node->op == GGML_OP_NORM) return "NORM is a one-pass float32 variance (#ggml-vulkan-norm-one-pass)";
  if (node->op == GGML_OP_RMS_NORM && a->type != GGML_TYPE_F32)
    return "RMS_NORM of " + std::string(ggml_type_name(a->type)) + " aborts (#ggml-supports-op)";
  if (node->op == GGML_OP_RMS_NORM && !dense_ne0(a)) return "RMS_NORM of a permuted view is wrong (#ggml-supports-op)";
  if (node->op == GGML_OP_RMS_NORM && ggml_nrows(a) > 65535)
    return "RMS_NORM of more than 65535 rows aborts on lavapipe (#ggml-vulkan-rms-norm-rows)";
  if (node->op == GGML_OP_SCALE)  // alpha != 1
    return "SCALE turns -0 into +0 (x * s + 0), so residual_out's sign of zero differs (#ggml-vulkan-scale-negative-zero)";
  if (node->op == GGML_OP_RMS_NORM_BACK && (!ggml_is_contiguous(a) || !ggml_is_contiguous(b)))
    return "RMS_NORM_BACK of a view is wrong (#ggml-supports-op)";
  if (node->op == GGML_OP_REPEAT_BACK && llvmpipe && repeat_back_truncated_on_llvmpipe(node))
    return "REPEAT_BACK over " + std::to_string(ggml_nrows(a)) +
           " rows stops at lavapipe's loop limit and sums only part of them (#lavapipe-loop-limit)";
  return {};
#else
  const bool norm = node->op == GGML_OP_NORM || node->op == GGML_OP_RMS_NORM || node->op == GGML_OP_RMS_NORM_BACK;
  const std::string op = ggml_op_desc(node);
  if (norm && a->type != GGML_TYPE_F32) return op + " of " + ggml_type_name(a->type) + " aborts (#ggml-supports-op)";
  if ((node->op == GGML_OP_RMS_NORM || node->op == GGML_OP_RMS_NORM_BACK) && !dense_ne0(a))
    return op + " of a permuted view asserts (#ggml-supports-op)";
  if ((node->op == GGML_OP_ADD || node->op == GGML_OP_MUL) && b) {
    if (a->type != b->type && b->type != GGML_TYPE_F32)
      return op + " of " + ggml_type_name(a->type) + " and " + ggml_type_name(b->type) + " aborts (#ggml-supports-op)";
    // binary-ops.cpp:59 asserts src0's ne0 dense; a strided src1 of src0's shape has a path.
    if (!dense_ne0(a)) return op + " of a view with a strided ne0 asserts (#ggml-supports-op)";
  }
  return {};
#endif
}

// Builds the case's graph (no data yet). Throws Failure with the reason it cannot.
void build(const State& s, const nc_case& c, const nc_named_tensor* ins, std::int32_t n_in, Graph& g) {
  const nc_named_tensor* x = ph::find(ins, n_in, "x");
  const nc_named_tensor* res = ph::find(ins, n_in, "residual");
  const nc_named_tensor* rbias = ph::find(ins, n_in, "residual_bias");
  const nc_named_tensor* w = ph::find(ins, n_in, "weight");
  const nc_named_tensor* b = ph::find(ins, n_in, "bias");
  const nc_named_tensor* dy = ph::find(ins, n_in, "dy");
  if (!x) throw Failure{"the case has no input x"};
  std::vector<const nc_tensor*> shaped{&x->tensor};
  if (res) shaped.push_back(&res->tensor);
  if (dy) shaped.push_back(&dy->tensor);
  std::string why;
  const Grouping grouping = group_dims(c, shaped, why);
  if (grouping.groups.empty()) throw Failure{why};

  const std::size_t n_tensors = 64;
  ggml_init_params pin{ggml_tensor_overhead() * 8, nullptr, true};
  g.ctx_in = ggml_init(pin);
  ggml_init_params pg{ggml_tensor_overhead() * n_tensors + ggml_graph_overhead(), nullptr, true};
  g.ctx = ggml_init(pg);
  if (!g.ctx_in || !g.ctx) throw Failure{"ggml_init failed"};

  auto input = [&](const nc_named_tensor* t) {
    const std::size_t bytes = span_bytes(t->tensor);
    const ggml_type type = type_of(t->tensor.dtype);
    ggml_tensor* base = ggml_new_tensor_1d(g.ctx_in, type, static_cast<std::int64_t>(bytes / ggml_type_size(type)));
    ggml_set_name(base, t->name);
    ggml_set_input(base);
    g.inputs.push_back({&t->tensor, base, bytes});
    return base;
  };
  auto shaped_view = [&](const nc_named_tensor* t) {
    ggml_tensor* v = view_of(g.ctx, input(t), dims_of(grouping, t->tensor), why);
    if (!v) throw Failure{std::string(t->name) + ": " + why};
    return v;
  };
  // Parameters are dense [cols] vectors in real graphs: a strided host parameter is read through
  // a 1-D view (its elements in row-major order must be evenly spaced).
  auto param = [&](const nc_named_tensor* t) -> ggml_tensor* {
    const ph::Layout l = ph::param_layout(t->tensor);
    const std::int64_t step = l.col.size() > 1 ? l.col[1] - l.col[0] : 1;
    for (std::size_t k = 0; k < l.col.size(); ++k)
      if (l.col[k] != static_cast<std::int64_t>(k) * step) throw Failure{std::string(t->name) + ": not one strided dim"};
    if (step != 1) throw Failure{std::string(t->name) + ": stride " + std::to_string(step) + ", not dense"};
    return input(t);
  };

  const float eps = static_cast<float>(c.epsilon);  // ggml's op parameter is a float
  ggml_tensor* h = shaped_view(x);
  g.cols = dims_of(grouping, x->tensor)[0].ext;
  if (c.residual != NC_RESIDUAL_NONE) {
    if (!res) throw Failure{"a residual case without input residual"};
    // ggml_scale asserts ggml_is_padded_1d (ggml.c:3454: ne0 dense, dims 2 and 3 packed after
    // dim 1); a view that is not is copied (ggml_cont, bytes unchanged) first, as a graph must.
    if (c.alpha != 1) {
      const bool padded_1d = h->nb[0] == ggml_type_size(h->type) && h->nb[2] == h->nb[1] * static_cast<std::size_t>(h->ne[1]) &&
                             h->nb[3] == h->nb[2] * static_cast<std::size_t>(h->ne[2]);
      h = ggml_scale(g.ctx, padded_1d ? h : ggml_cont(g.ctx, h), static_cast<float>(c.alpha));
    }
    h = ggml_add(g.ctx, h, shaped_view(res));
    if (c.residual == NC_RESIDUAL_ADD_BIAS) {
      if (!rbias) throw Failure{"an add_bias case without input residual_bias"};
      h = ggml_add(g.ctx, h, param(rbias));
    }
  }
  ggml_tensor* wt = w ? param(w) : nullptr;
  ggml_tensor* bt = b ? param(b) : nullptr;
  if (c.direction == NC_FORWARD) {
    ggml_tensor* y = c.op == NC_RMSNORM ? ggml_rms_norm(g.ctx, h, eps) : ggml_norm(g.ctx, h, eps);
    if (wt) y = ggml_mul(g.ctx, y, wt);
    if (bt) y = ggml_add(g.ctx, y, bt);
    g.outputs.emplace_back("y", y);
    if (c.residual != NC_RESIDUAL_NONE) g.outputs.emplace_back("residual_out", h);
  } else {
    if (!dy) throw Failure{"a backward case without input dy"};
    // What ggml_build_backward_expand builds for rms_norm -> mul (ggml.c): the weight's gradient
    // ggml_repeat_back(dy * x-hat, weight), x-hat's gradient dy * weight, then ggml_rms_norm_back.
    ggml_tensor* dyv = shaped_view(dy);
    ggml_tensor* gx = wt ? ggml_mul(g.ctx, dyv, wt) : dyv;
    ggml_tensor* dh = ggml_rms_norm_back(g.ctx, gx, h, eps);
    g.outputs.emplace_back(c.residual != NC_RESIDUAL_NONE ? "dresidual" : "dx", dh);
    if (c.residual != NC_RESIDUAL_NONE) g.outputs.emplace_back("dx", dh);
    if (wt) g.outputs.emplace_back("dweight", ggml_repeat_back(g.ctx, ggml_mul(g.ctx, dyv, ggml_rms_norm(g.ctx, h, eps)), wt));
    if (c.residual == NC_RESIDUAL_ADD_BIAS) g.outputs.emplace_back("dresidual_bias", ggml_repeat_back(g.ctx, dh, param(rbias)));
  }
  g.gf = ggml_new_graph(g.ctx);
  for (auto& [name, t] : g.outputs) {
    ggml_set_output(t);
    ggml_build_forward_expand(g.gf, t);
  }
  // ggml_backend_supports_op decides, node by node.
  for (int i = 0; i < ggml_graph_n_nodes(g.gf); ++i) {
    ggml_tensor* node = ggml_graph_node(g.gf, i);
    if (!ggml_backend_supports_op(s.backend, node)) {
      std::string srcs;
      for (int k = 0; k < GGML_MAX_SRC && node->src[k]; ++k)
        srcs += std::string(k ? ", " : "") + ggml_type_name(node->src[k]->type) +
                (ggml_is_contiguous(node->src[k]) ? "" : " (non-contiguous view)");
      throw Failure{"ggml_backend_supports_op(" + std::string(ggml_backend_dev_name(s.dev)) + ", " + ggml_op_desc(node) +
                    " of " + srcs + ") is false"};
    }
    if (declining_findings())
      if (const std::string f = recorded_finding(node, s.llvmpipe); !f.empty())
        throw Failure{"a recorded finding, declined (NORMCHECK_GGML_DECLINE_FINDINGS): " + f};
  }
}

int supports(void* state, const nc_case* c, char* reason, size_t reason_len) {
  if (const std::string why = static_decline(*c); !why.empty()) return ph::decline(reason, reason_len, "%s", why.c_str());
  // The graph needs the inputs' strides, which supports() does not see: decide here on a dense
  // layout and again in run() on the real one.
  try {
    std::vector<std::vector<std::int64_t>> strides;
    std::vector<nc_named_tensor> ins;
    std::vector<std::int64_t> dense(static_cast<std::size_t>(c->rank));
    std::int64_t st = 1;
    for (int d = c->rank - 1; d >= 0; --d) {
      dense[static_cast<std::size_t>(d)] = st;
      st *= c->shape[d];
    }
    std::vector<std::int64_t> cols_shape;
    for (std::int32_t i = 0; i < c->n_norm_dims; ++i) cols_shape.push_back(c->shape[c->norm_dims[i]]);
    std::vector<std::int64_t> cols_dense(cols_shape.size());
    st = 1;
    for (std::size_t d = cols_shape.size(); d-- > 0;) {
      cols_dense[d] = st;
      st *= cols_shape[d];
    }
    auto add = [&](const char* name, std::int32_t dtype, bool param) {
      nc_named_tensor t{};
      t.name = name;
      t.tensor.dtype = dtype;
      t.tensor.rank = param ? static_cast<std::int32_t>(cols_shape.size()) : c->rank;
      t.tensor.shape = param ? cols_shape.data() : c->shape;
      t.tensor.strides = param ? cols_dense.data() : dense.data();
      ins.push_back(t);
    };
    add("x", c->dtype_x, false);
    if (c->residual != NC_RESIDUAL_NONE) add("residual", c->dtype_residual, false);
    if (c->residual == NC_RESIDUAL_ADD_BIAS) add("residual_bias", c->dtype_param, true);  // a parameter (CASES.md)
    if (c->affine != NC_AFFINE_NONE) add("weight", c->dtype_param, true);
    if (c->affine == NC_AFFINE_WEIGHT_BIAS) add("bias", c->dtype_param, true);
    if (c->direction == NC_BACKWARD) add("dy", c->dtype_out, false);
    Graph g;
    build(*static_cast<const State*>(state), *c, ins.data(), static_cast<std::int32_t>(ins.size()), g);
  } catch (const Failure& f) {
    return ph::decline(reason, reason_len, "%s", f.what.c_str());
  }
  return 0;
}

void run_case(State& s, const nc_case& c, const nc_named_tensor* ins, std::int32_t n_in, nc_named_tensor* outs,
              std::int32_t n_out) {
  Graph g;
  build(s, c, ins, n_in, g);
  g.backend = ggml_backend_dev_init(s.dev, nullptr);
  if (!g.backend) throw Failure{"ggml_backend_dev_init failed"};
  set_threads(s, g.backend);
  g.buf = ggml_backend_alloc_ctx_tensors(g.ctx_in, g.backend);
  if (!g.buf) throw Failure{"ggml_backend_alloc_ctx_tensors failed"};
  for (const auto& in : g.inputs) ggml_backend_tensor_set(in.base, in.host->data, 0, in.bytes);
  g.galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(g.backend));
  if (!ggml_gallocr_alloc_graph(g.galloc, g.gf)) throw Failure{"ggml_gallocr_alloc_graph failed"};
  const ggml_status st = ggml_backend_graph_compute(g.backend, g.gf);
  if (st != GGML_STATUS_SUCCESS) throw Failure{"ggml_backend_graph_compute returned " + std::to_string(st)};
  const ph::Geometry geo = ph::geometry_of(c);
  for (auto& [name, t] : g.outputs) {
    nc_named_tensor* o = ph::find(outs, n_out, name);
    if (!o) continue;
    std::vector<unsigned char> bytes(ggml_nbytes(t));
    ggml_backend_tensor_get(t, bytes.data(), 0, bytes.size());
    if (ggml_type_size(t->type) != ph::size_of(o->tensor.dtype) || type_of(o->tensor.dtype) != t->type)
      throw Failure{name + ": ggml returned " + ggml_type_name(t->type) + " for a " + ph::dtype_name(o->tensor.dtype) +
                    " output"};
    // ggml's result is dense with ne0 = the normalized elements and the row groups outside it,
    // each in the case's row-major order: the row-major [rows, cols] order of plugin_host.
    ph::scatter_raw(bytes.data(), ph::layout_of(o->tensor, geo, name), o->tensor);
    o->written = 1;
  }
}

int run(void* state, const nc_case* c, const nc_named_tensor* inputs, std::int32_t n_inputs, nc_named_tensor* outputs,
        std::int32_t n_outputs, char* err, size_t err_len) {
  try {
    run_case(*static_cast<State*>(state), *c, inputs, n_inputs, outputs, n_outputs);
    return 0;
  } catch (const Failure& f) {
    std::snprintf(err, err_len, "%s", f.what.c_str());
  } catch (const std::exception& e) {
    std::snprintf(err, err_len, "%s", e.what());
  }
  return 1;
}

#endif  // NC_GGML_HAVE_HEADERS

constexpr nc_candidate kCandidate = {
    NORMCHECK_CANDIDATE_ABI_VERSION,
    sizeof(nc_candidate),
    NC_GGML_NAME,
#define NC_GGML_OPS "ggml_rms_norm, ggml_norm, ggml_rms_norm_back with ggml_mul/ggml_add for weight, bias and residual"
#if NC_GGML_VULKAN
    "ggml " NC_GGML_VERSION " (node-llama-cpp " NC_GGML_NLC_VERSION ") Vulkan backend, first Vulkan device "
    "(GGML_VK_VISIBLE_DEVICES=0: lavapipe on a machine without a GPU); " NC_GGML_OPS,
#elif NC_GGML_CUDA
    "ggml " NC_GGML_VERSION " (node-llama-cpp " NC_GGML_NLC_VERSION ") CUDA backend, first CUDA device; " NC_GGML_OPS,
#else
    "ggml " NC_GGML_VERSION " (node-llama-cpp " NC_GGML_NLC_VERSION ") CPU backend, variant "
    "libggml-cpu-haswell.so ($NORMCHECK_GGML_CPU_VARIANT), $NORMCHECK_GGML_THREADS threads (1); " NC_GGML_OPS,
#endif
    (1u << NC_LAYERNORM) | (1u << NC_RMSNORM),
    (1u << NC_FLOAT32) | (1u << NC_FLOAT16) | (1u << NC_BFLOAT16),
    1u << NC_FLOAT32,
    (1u << NC_FORWARD) | (1u << NC_BACKWARD),
    "*",
    NC_CAP_RESIDUAL | NC_CAP_GENERAL_AXES | NC_CAP_NO_STATISTICS | NC_CAP_ISOLATE
#if !NC_GGML_CUDA
        // Measured by normcheck prop (README.md, "Property runs"), each side within tolerance:
        // the CPU backend's ggml_norm sums a dense row with its vector code and a strided view
        // element by element (layout_invariance: 1 ulp apart); the Vulkan backend's fused
        // add + rms_norm gives a row another last bit in a batch of 3 than alone
        // (batch_invariance: 1 ulp). Not measured on CUDA: held to bit identity there.
        | NC_CAP_BATCH_DEPENDENT_ORDER
#endif
    ,
    NC_GGML_DEVICE,
    init,
    fini,
    supports,
    run,
    0,  // quant_formats: no fused quantization
    0,  // quant_scales
};

}  // namespace
}  // namespace normcheck::ggml_candidate

const nc_candidate* normcheck_candidate(void) { return &normcheck::ggml_candidate::kCandidate; }
