// Certified LayerNorm/RMSNorm forward, 1024 rows x 4096, float32 in and out, against an
// uncertified binary64 two-pass loop on the same data, and against MPFR for every element.
//   build/reference/bench/reference_bench --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/heap.hpp"

namespace {

using namespace normcheck::ref;

constexpr std::int64_t kRows = 1024, kCols = 4096;

Case make_case(Op op, std::int64_t rows) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> dist(0.5, 2.0);
  Case c;
  c.op = op;
  c.affine = Affine::weight_bias;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = DType::float32;
  std::vector<double> x(rows * kCols), w(kCols), b(kCols);
  for (auto& v : x) v = round_to(dist(rng), DType::float32);
  for (auto& v : w) v = round_to(1 + 0.1 * dist(rng), DType::float32);
  for (auto& v : b) v = round_to(0.1 * dist(rng), DType::float32);
  c.inputs["x"] = Tensor{DType::float32, {rows, kCols}, x};
  c.inputs["weight"] = Tensor{DType::float32, {kCols}, w};
  c.inputs["bias"] = Tensor{DType::float32, {kCols}, b};
  return c;
}

// The uncertified baseline: binary64 two-pass statistics (mean 0 for RMSNorm), then
// y = (x - mean) * rstd * w + b handed to store(index, y) for every element.
template <typename Store>
void double_two_pass_rows(const Case& c, Store store) {
  const auto& x = c.inputs.at("x").data;
  const auto& w = c.inputs.at("weight").data;
  const auto& b = c.inputs.at("bias").data;
  const bool ln = c.op == Op::layernorm;
  for (std::int64_t r = 0; r < kRows; ++r) {
    const double* row = x.data() + r * kCols;
    double mean = 0;
    if (ln) {
      for (std::int64_t i = 0; i < kCols; ++i) mean += row[i];
      mean /= kCols;
    }
    double var = 0;
    for (std::int64_t i = 0; i < kCols; ++i) var += (row[i] - mean) * (row[i] - mean);
    const double rstd = 1 / std::sqrt(var / kCols + c.epsilon);
    for (std::int64_t i = 0; i < kCols; ++i) store(r * kCols + i, (row[i] - mean) * rstd * w[i] + b[i]);
  }
}

// The baseline with its output rounded to float32.
void double_two_pass(const Case& c, std::vector<float>& y) {
  double_two_pass_rows(c, [&](std::int64_t i, double v) { y[i] = static_cast<float>(v); });
}

void BM_DoubleTwoPass(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), kRows);
  std::vector<float> y(kRows * kCols);
  for (auto _ : state) {
    double_two_pass(c, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

// The same binary64 loop writing what a certified Result holds per element, into buffers
// reused from call to call: the value in the output format (as a double, Tensor's storage),
// the binary64 value and the certified flag, 17 bytes where the loop above writes 4. No
// certification: the floor of memory traffic the certified kernel pays for its output layout.
void double_two_pass_result_layout(const Case& c, std::vector<double>& value, std::vector<double>& f64,
                                   std::vector<std::uint8_t>& certified) {
  double_two_pass_rows(c, [&](std::int64_t i, double v) {
    f64[i] = v;
    value[i] = static_cast<float>(v);
    certified[i] = 1;
  });
}

void BM_DoubleTwoPassResultLayout(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), kRows);
  std::vector<double> value(kRows * kCols), f64(kRows * kCols);
  std::vector<std::uint8_t> certified(kRows * kCols);
  for (auto _ : state) {
    double_two_pass_result_layout(c, value, f64, certified);
    benchmark::DoNotOptimize(value.data());
    benchmark::DoNotOptimize(f64.data());
    benchmark::DoNotOptimize(certified.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

void BM_Certified(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), kRows);
  Stats stats;
  for (auto _ : state) {
    Result r = evaluate(c);
    stats = r.stats;
    benchmark::DoNotOptimize(r.outputs.at("y").value.data.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  state.counters["slow_elements"] = static_cast<double>(stats.slow);
  state.counters["uncertified"] = static_cast<double>(stats.uncertified);
}

// evaluate_into() one Result, reused: no page faults and no zero-filling of the 17 bytes an
// element of outputs (value, binary64 value, certified mask).
void BM_CertifiedReused(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), kRows);
  Result r;
  for (auto _ : state) {
    evaluate_into(c, {}, r);
    benchmark::DoNotOptimize(r.outputs.at("y").value.data.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  state.counters["slow_elements"] = static_cast<double>(r.stats.slow);
}

// What fixture generation does (fixtures/src/generate.cpp): each case goes into one of
// several slots in turn (2 with one thread; with more, up to 8 x threads, as many as the
// weight of the cases in flight allows: 4 of these 1024x4096 cases with 2 threads) and reuses
// that slot's buffers, which are cold in cache by then (4 x 70 MB here).
void BM_CertifiedAsGeneration(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), kRows);
  Result slots[4];
  std::size_t i = 0;
  for (auto _ : state) {
    Result& r = slots[i++ % 4];
    evaluate_into(c, {}, r);
    benchmark::DoNotOptimize(r.outputs.at("y").value.data.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

// MPFR for every element. 1024 x 4096 would take minutes, so this runs on 16 rows and the
// per-element rate (items/s) is what compares.
void BM_MpfrEverywhere(benchmark::State& state) {
  const Case c = make_case(static_cast<Op>(state.range(0)), 16);
  Options opt;
  opt.fast_path = false;
  for (auto _ : state) {
    Result r = evaluate(c, opt);
    benchmark::DoNotOptimize(r.outputs.at("y").value.data.data());
  }
  state.SetItemsProcessed(state.iterations() * 16 * kCols);
}

// range(0): 0 = layernorm, 1 = rmsnorm
BENCHMARK(BM_DoubleTwoPass)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DoubleTwoPassResultLayout)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Certified)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CertifiedReused)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CertifiedAsGeneration)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MpfrEverywhere)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  // With --keep-heap, freed output buffers stay in the heap between iterations (as in a
  // long-running generator) instead of going back to the kernel: this removes the page-fault
  // cost of 68 MB of fresh outputs per evaluation from the measurement. Both are reported.
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--keep-heap") {
      normcheck::ref::keep_freed_memory();  // the normcheck executable's policy (heap.hpp)
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
