// One-off timing of every built-in CPU candidate on a 4096 x 4096 float32 LayerNorm forward
// (weight and bias, fp32 compute): `cpu_kernels_speed [rows] [cols]`. Not a test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cpu_candidates.hpp"

int main(int argc, char** argv) {
  using namespace normcheck;
  const std::int64_t rows = argc > 1 ? std::atoll(argv[1]) : 4096,
                     cols = argc > 2 ? std::atoll(argv[2]) : 4096;
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::weight_bias;
  std::mt19937_64 gen(1);
  std::normal_distribution<double> z;
  auto tensor = [&](std::vector<std::int64_t> shape, double mean, double std) {
    ref::Tensor t;
    t.shape = shape;
    t.data.resize(static_cast<std::size_t>(t.numel()));
    for (auto& v : t.data) v = static_cast<float>(mean + std * z(gen));
    return t;
  };
  c.inputs["x"] = tensor({rows, cols}, 0, 1);
  c.inputs["weight"] = tensor({cols}, 1, 0.1);
  c.inputs["bias"] = tensor({cols}, 0, 0.1);
  for (const auto& e : conf::cpu::cpu_builtins()) {
    auto cand = e.make();
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = cand->run(c);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-40s %8.3f s  %7.1f M elements/s\n", e.info.name.c_str(), s,
                static_cast<double>(rows * cols) / s / 1e6);
  }
}
