// One-off timing of a candidate.h plugin's run() on dense float32 problems, through the plugin
// ABI alone (no normcheck harness, no checking): `plugin_speed PLUGIN.so [rows] [cols]`.
// Times LayerNorm forward, RMSNorm forward and LayerNorm backward with weight and bias, float32
// compute, the `exact` contract; reports the median of 5 runs after one warm-up run (which
// absorbs one-time costs: kernel compilation, buffer allocation). Not a test.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "normcheck/candidate.h"

namespace {

struct Tensor {
  std::vector<float> data;
  std::vector<std::int64_t> shape, strides;
  nc_named_tensor named(const char* name) {
    nc_named_tensor t{};
    t.name = name;
    t.tensor = {data.data(), NC_FLOAT32, static_cast<std::int32_t>(shape.size()), shape.data(),
                strides.data()};
    return t;
  }
};

Tensor make(std::vector<std::int64_t> shape, std::mt19937_64& gen, double mean, double sd) {
  Tensor t;
  t.shape = std::move(shape);
  t.strides.assign(t.shape.size(), 1);
  for (std::size_t d = t.shape.size() - 1; d-- > 0;) t.strides[d] = t.strides[d + 1] * t.shape[d + 1];
  std::int64_t n = 1;
  for (auto e : t.shape) n *= e;
  std::normal_distribution<double> z(mean, sd);
  t.data.resize(static_cast<std::size_t>(n));
  for (auto& v : t.data) v = static_cast<float>(z(gen));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: plugin_speed PLUGIN.so [rows] [cols]\n");
    return 2;
  }
  const std::int64_t rows = argc > 2 ? std::atoll(argv[2]) : 4096,
                     cols = argc > 3 ? std::atoll(argv[3]) : 4096;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  auto entry = reinterpret_cast<nc_candidate_fn>(dlsym(lib, NORMCHECK_CANDIDATE_SYMBOL));
  const nc_candidate* d = entry ? entry() : nullptr;
  if (!d || d->abi_version != NORMCHECK_CANDIDATE_ABI_VERSION) {
    std::fprintf(stderr, "%s: not a candidate.h v1 plugin\n", argv[1]);
    return 1;
  }
  char err[512] = {};
  void* state = d->init ? d->init(err, sizeof err) : nullptr;
  if (d->init && !state) {
    std::fprintf(stderr, "%s: init failed: %s\n", d->name, err);
    return 1;
  }
  std::mt19937_64 gen(1);
  Tensor x = make({rows, cols}, gen, 0, 1), w = make({cols}, gen, 1, 0.1), b = make({cols}, gen, 0, 0.1),
         dy = make({rows, cols}, gen, 0, 1);
  const std::int64_t shape[2] = {rows, cols}, norm_dims[1] = {1};
  std::printf("%s, %lld x %lld float32, weight and bias, median of 5 runs:\n", d->name,
              static_cast<long long>(rows), static_cast<long long>(cols));
  struct Problem {
    std::int32_t op, dir;
    const char* label;
  };
  const Problem problems[] = {{NC_LAYERNORM, NC_FORWARD, "LayerNorm forward"},
                              {NC_RMSNORM, NC_FORWARD, "RMSNorm forward"},
                              {NC_LAYERNORM, NC_BACKWARD, "LayerNorm backward"}};
  for (const auto& [op, dir, label] : problems) {
    nc_case c{};
    c.struct_size = sizeof(nc_case);
    c.case_id = "speed";
    c.op = op;
    c.direction = dir;
    c.rank = 2;
    c.shape = shape;
    c.n_norm_dims = 1;
    c.norm_dims = norm_dims;
    c.epsilon = 1e-5;
    c.affine = NC_AFFINE_WEIGHT_BIAS;
    c.alpha = 1;
    c.layers = 1;
    c.contract = "exact";
    c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = NC_FLOAT32;
    if (!(d->ops & (1u << op)) || !(d->directions & (1u << dir)) ||
        (d->supports && d->supports(state, &c, err, sizeof err) != 0)) {
      std::printf("  %-20s declined\n", label);
      continue;
    }
    std::vector<nc_named_tensor> in{x.named("x"), w.named("weight"), b.named("bias")};
    if (dir == NC_BACKWARD) in.push_back(dy.named("dy"));
    Tensor y = make({rows, cols}, gen, 0, 1), mean = make({rows, 1}, gen, 0, 1),
           rstd = make({rows, 1}, gen, 0, 1), dw = make({cols}, gen, 0, 1), db = make({cols}, gen, 0, 1);
    std::vector<nc_named_tensor> out;
    if (dir == NC_FORWARD) {
      out = {y.named("y"), rstd.named("rstd")};
      if (op == NC_LAYERNORM) out.push_back(mean.named("mean"));
    } else {
      out = {y.named("dx"), dw.named("dweight"), db.named("dbias")};
    }
    std::vector<double> seconds;
    for (int rep = 0; rep < 6; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = d->run(state, &c, in.data(), static_cast<std::int32_t>(in.size()), out.data(),
                            static_cast<std::int32_t>(out.size()), err, sizeof err);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rc != 0) {
        std::fprintf(stderr, "%s: run failed: %s\n", label, err);
        return 1;
      }
      if (rep > 0) seconds.push_back(s);
    }
    std::sort(seconds.begin(), seconds.end());
    const double med = seconds[seconds.size() / 2];
    std::printf("  %-20s %8.1f ms  %7.1f M elements/s\n", label, med * 1e3,
                static_cast<double>(rows * cols) / med / 1e6);
  }
  if (d->fini) d->fini(state);
  return 0;
}
