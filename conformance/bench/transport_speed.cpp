// What a property test spends per case, by transport (issue #21, "Property runs"):
// `transport_speed [--normcheck PATH] [--plugin PATH.so] [--cmd 'COMMAND ARGS'] [--quick]`.
//
// For LayerNorm forward cases of several sizes (float32, weight and bias, the exact contract) it
// times, per call, the median wall time of:
//   - the bundled two-pass kernel called in process (`builtin:cpu_two_pass`): its own compute;
//   - the same kernel behind the subprocess protocol (`--isolate`: a `normcheck worker` child);
//   - a plugin through the plugin ABI in process and isolated (default: the oneDNN plugin);
//   - a `cmd:` candidate (default: the numpy example candidate, Python, the protocol);
//   - the rest of an `agreement` test: the certified reference (`ref::evaluate`) and the judge
//     (`derive_allowances` + `check_case`).
// The transport's overhead per case is the difference between a transport's time and the same
// kernel in process. Not a test: the numbers go to conformance/README.md ("Property runs").
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/heap.hpp"

using namespace normcheck;

namespace {

constexpr const char* kUsage =
    "usage: transport_speed [--normcheck PATH] [--plugin PATH.so] [--cmd 'COMMAND ARGS'] [--quick]\n"
    "  --normcheck PATH  the normcheck executable whose `worker` serves --isolate (default: this build's)\n"
    "  --plugin PATH.so  the plugin timed in process and isolated (default: this build's oneDNN plugin)\n"
    "  --cmd 'CMD ARGS'  the subprocess candidate (default: the numpy example candidate)\n"
    "  --quick           fewer calls per size (a smoke run of this program)\n";

ref::Case layernorm_case(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> z(0, 1);
  auto draw = [&](std::size_t n, double mean, double sd) {
    std::vector<double> v(n);
    for (auto& x : v) x = static_cast<double>(static_cast<float>(mean + sd * z(rng)));
    return v;
  };
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::weight_bias;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = ref::DType::float32;
  c.dtype_compute = ref::DType::float32;
  c.epsilon = 1e-5;
  const auto n = static_cast<std::size_t>(rows * cols), nc = static_cast<std::size_t>(cols);
  c.inputs["x"] = ref::Tensor{ref::DType::float32, {rows, cols}, draw(n, 0, 1)};
  c.inputs["weight"] = ref::Tensor{ref::DType::float32, {cols}, draw(nc, 1, 0.5)};
  c.inputs["bias"] = ref::Tensor{ref::DType::float32, {cols}, draw(nc, 0, 0.5)};
  return c;
}

// Median wall time of `calls` calls of f (after one call not counted), in microseconds.
double median_us(int calls, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string cell(double us) {
  if (us < 0) return "-";
  if (us < 1000) return fmt::format("{:.1f} µs", us);
  if (us < 1e6) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.2f} s", us / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  ref::keep_freed_memory();  // as the normcheck executable does
  std::string normcheck_exe = NORMCHECK_EXE, plugin = NORMCHECK_BENCH_PLUGIN, cmd = NORMCHECK_BENCH_CMD;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", kUsage);
      return 0;
    } else if (a == "--normcheck" && i + 1 < argc) {
      normcheck_exe = argv[++i];
    } else if (a == "--plugin" && i + 1 < argc) {
      plugin = argv[++i];
    } else if (a == "--cmd" && i + 1 < argc) {
      cmd = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      fmt::print(stderr, "transport_speed: unknown argument {}\n{}", a, kUsage);
      return 2;
    }
  }
  struct Row {
    std::string label, spec;
    bool isolate;
    std::unique_ptr<conf::Candidate> cand;
    std::string why_not;  // it could not be made
  };
  std::vector<Row> rows;
  rows.push_back({"builtin:cpu_two_pass in process", "builtin:cpu_two_pass", false, nullptr, {}});
  rows.push_back({"the same, --isolate (worker child)", "builtin:cpu_two_pass", true, nullptr, {}});
  rows.push_back({"plugin in process", "plugin:" + plugin, false, nullptr, {}});
  rows.push_back({"the same plugin, --isolate", "plugin:" + plugin, true, nullptr, {}});
  rows.push_back({"cmd: subprocess", "cmd:" + cmd, false, nullptr, {}});
  for (auto& r : rows) {
    conf::SpecOptions so;
    so.isolate = r.isolate;
    so.self_exe = normcheck_exe;
    so.timeout_s = 300;
    try {
      r.cand = conf::make_candidate(r.spec, so);
    } catch (const std::exception& e) {
      r.why_not = e.what();
    }
  }
  fmt::print("plugin: {}\ncmd: {}\n\n", plugin, cmd);
  struct Size {
    std::int64_t rows, cols;
    int calls;
  };
  const std::vector<Size> sizes = {{1, 8, 400}, {8, 768, 200}, {64, 768, 50}, {256, 4096, 10}, {1024, 4096, 5}};
  fmt::print("| case (LayerNorm forward, float32) |");
  for (const auto& r : rows) fmt::print(" {} |", r.label);
  fmt::print(" certified reference | judge (allowances + check) |\n|---|");
  for (std::size_t i = 0; i < rows.size() + 2; ++i) fmt::print("---|");
  fmt::print("\n");
  for (const auto& s : sizes) {
    const int calls = quick ? 2 : s.calls;
    const ref::Case c = layernorm_case(s.rows, s.cols, 1);
    fmt::print("| {} x {} |", s.rows, s.cols);
    conf::Outputs got;
    for (auto& r : rows) {
      if (!r.cand) {
        fmt::print(" - |");
        continue;
      }
      try {
        if (r.cand->declines(c)) {
          fmt::print(" declined |");
          continue;
        }
        const double us = median_us(calls, [&] { got = r.cand->run(c); });
        fmt::print(" {} |", cell(us));
      } catch (const std::exception& e) {
        fmt::print(" failed |");
        r.why_not = e.what();
      }
      std::fflush(stdout);
    }
    fix::FixtureCase fc;
    fc.id = "bench";
    fc.c = c;
    const double ref_us = median_us(std::max(1, calls / 4), [&] { fc.expected = ref::evaluate(c).outputs; });
    got = rows.front().cand->run(c);
    const double judge_us = median_us(std::max(1, calls / 4), [&] {
      const auto allow = conf::derive_allowances(c);
      (void)conf::check_case(fc, got, allow);
    });
    fmt::print(" {} | {} |\n", cell(ref_us), cell(judge_us));
    std::fflush(stdout);
  }
  for (const auto& r : rows)
    if (!r.why_not.empty()) fmt::print("\n{} ({}): {}\n", r.label, r.spec, r.why_not);
  return 0;
}
