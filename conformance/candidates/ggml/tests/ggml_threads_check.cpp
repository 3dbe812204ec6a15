// ggml_threads_check PLUGIN.so [variant...]: runs builtin:ggml-cpu's plugin on a few cases with
// 1, 2 and 4 threads (NORMCHECK_GGML_THREADS, read by init) and requires bit-identical outputs;
// then, for each CPU variant named, reports how many output elements differ from the pinned
// variant's and by how many float32 ulps at most (README.md, "CPU variants"). Exit 0 when the
// thread counts agree, 1 when they do not, 77 (ctest's skip) when the plugin declines (ggml not
// installed).
#include <dlfcn.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "normcheck/candidate.h"

namespace {

struct Case {
  const char* what;
  std::int32_t op, direction, affine;
  std::int64_t rows, cols;
};

// Outputs of one case as raw float32 bits, output by output.
std::vector<std::vector<float>> run_case(const nc_candidate* d, void* state, const Case& k) {
  const std::int64_t shape[2] = {k.rows, k.cols}, strides[2] = {k.cols, 1};
  const std::int64_t norm_dim = 1, pshape[1] = {k.cols}, pstride[1] = {1};
  nc_case c{};
  c.struct_size = sizeof(nc_case);
  c.case_id = k.what;
  c.op = k.op;
  c.direction = k.direction;
  c.rank = 2;
  c.shape = shape;
  c.n_norm_dims = 1;
  c.norm_dims = &norm_dim;
  c.epsilon = 1e-5;
  c.affine = k.affine;
  c.alpha = 1;
  c.contract = "exact";
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = NC_FLOAT32;
  std::mt19937 gen(42);
  std::normal_distribution<float> normal(0.5f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(k.rows * k.cols)), dy(x.size()), w(static_cast<std::size_t>(k.cols));
  for (auto& v : x) v = normal(gen);
  for (auto& v : dy) v = normal(gen);
  for (auto& v : w) v = normal(gen);
  std::vector<nc_named_tensor> in;
  in.push_back({"x", {x.data(), NC_FLOAT32, 2, shape, strides}, 0});
  if (k.affine != NC_AFFINE_NONE) in.push_back({"weight", {w.data(), NC_FLOAT32, 1, pshape, pstride}, 0});
  if (k.direction == NC_BACKWARD) in.push_back({"dy", {dy.data(), NC_FLOAT32, 2, shape, strides}, 0});
  std::vector<std::vector<float>> out;
  out.emplace_back(x.size(), NAN);
  std::vector<nc_named_tensor> outs;
  outs.push_back({k.direction == NC_BACKWARD ? "dx" : "y", {out[0].data(), NC_FLOAT32, 2, shape, strides}, 0});
  if (k.direction == NC_BACKWARD && k.affine != NC_AFFINE_NONE) {
    out.emplace_back(w.size(), NAN);
    outs.push_back({"dweight", {out[1].data(), NC_FLOAT32, 1, pshape, pstride}, 0});
  }
  char err[512] = {0};
  if (d->supports && d->supports(state, &c, err, sizeof err) != 0) {
    std::fprintf(stderr, "%s: declined: %s\n", k.what, err);
    std::exit(1);
  }
  if (d->run(state, &c, in.data(), static_cast<std::int32_t>(in.size()), outs.data(),
             static_cast<std::int32_t>(outs.size()), err, sizeof err) != 0) {
    std::fprintf(stderr, "%s: run failed: %s\n", k.what, err);
    std::exit(1);
  }
  return out;
}

std::int64_t ulps(float a, float b) {
  auto key = [](float f) {
    const std::int32_t i = std::bit_cast<std::int32_t>(f);
    return i < 0 ? static_cast<std::int64_t>(INT32_MIN) - i : static_cast<std::int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ggml_threads_check PLUGIN.so [variant...]\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  auto entry = reinterpret_cast<nc_candidate_fn>(dlsym(lib, NORMCHECK_CANDIDATE_SYMBOL));
  const nc_candidate* d = entry();
  const Case cases[] = {{"rmsnorm fwd weight [257, 4096]", NC_RMSNORM, NC_FORWARD, NC_AFFINE_WEIGHT, 257, 4096},
                        {"layernorm fwd weight+bias [257, 4096]", NC_LAYERNORM, NC_FORWARD, NC_AFFINE_WEIGHT_BIAS, 257, 4096},
                        {"layernorm fwd [64, 4097]", NC_LAYERNORM, NC_FORWARD, NC_AFFINE_NONE, 64, 4097},
                        {"rmsnorm bwd weight [257, 1024]", NC_RMSNORM, NC_BACKWARD, NC_AFFINE_WEIGHT, 257, 1024}};
  auto make = [&](const char* threads, const char* variant) -> void* {
    setenv("NORMCHECK_GGML_THREADS", threads, 1);
    if (variant) setenv("NORMCHECK_GGML_CPU_VARIANT", variant, 1); else unsetenv("NORMCHECK_GGML_CPU_VARIANT");
    char err[512] = {0};
    void* s = d->init(err, sizeof err);
    if (!s) {
      std::printf("NORMCHECK-SKIP: %s\n", err);
      std::exit(77);
    }
    return s;
  };
  int rc = 0;
  for (const Case& k : cases) {
    std::vector<std::vector<float>> base;
    for (const char* t : {"1", "2", "4"}) {
      void* s = make(t, nullptr);
      auto got = run_case(d, s, k);
      d->fini(s);
      if (base.empty()) {
        base = got;
        continue;
      }
      for (std::size_t o = 0; o < got.size(); ++o)
        for (std::size_t i = 0; i < got[o].size(); ++i)
          if (std::bit_cast<std::uint32_t>(got[o][i]) != std::bit_cast<std::uint32_t>(base[o][i])) {
            std::printf("%s: %s threads differ from 1 thread at output %zu element %zu\n", k.what, t, o, i);
            rc = 1;
            break;
          }
    }
    std::printf("%s: 1, 2 and 4 threads %s\n", k.what, rc ? "DIFFER" : "bit-identical");
    for (int a = 2; a < argc; ++a) {
      void* s = make("1", argv[a]);
      auto got = run_case(d, s, k);
      d->fini(s);
      std::int64_t differ = 0, worst = 0, total = 0;
      for (std::size_t o = 0; o < got.size(); ++o)
        for (std::size_t i = 0; i < got[o].size(); ++i, ++total) {
          const std::int64_t u = ulps(got[o][i], base[o][i]);
          differ += u != 0;
          worst = std::max(worst, u);
        }
      std::printf("  variant %-14s: %lld of %lld elements differ from the pinned variant, at most %lld ulp\n", argv[a],
                  static_cast<long long>(differ), static_cast<long long>(total), static_cast<long long>(worst));
    }
  }
  return rc;
}
