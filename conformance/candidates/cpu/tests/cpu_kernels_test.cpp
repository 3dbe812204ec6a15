// The bundled CPU kernels against the certified reference (ref::evaluate), and every mutant on an
// input that reveals it. No expected value comes from the kernels themselves: the oracle is the
// reference, or the correct kernel where a mutant must agree with it bit for bit.
//
// Error measure: |got - want| in units of max(ulp_out(m), ulp_compute(m)) at the magnitude
// m = max(|want|, S), S the natural scale of the output (1 for y, dx, residual_out, mean on
// N(0,1) data, whose elements are O(1); the row count for column sums over rows; |want| for
// rstd). Bound for the correct kernels, for N <= 32 columns and R rows: an output in a narrower
// dtype than the compute dtype is within 2 ulps of it (the computed value is within ~N u_compute
// of the exact one, far below the output's half ulp, so it rounds to the same or the adjacent
// value; one more ulp for a contract's intermediate rounding that may land on the other side);
// otherwise within N + 8 compute ulps (sequential sums of N terms carry at most ~N u relative
// error, rstd half that, and the element-wise steps 4 more roundings), plus R for column sums.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "cpu_candidates.hpp"
#include "kernels.hpp"
#include "normcheck/judge/faults.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::conf::cpu {
namespace {

using ref::Affine;
using ref::DType;
using ref::Op;
using ref::Residual;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Dtypes {
  DType x = DType::float32, param = DType::float32, out = DType::float32, compute = DType::float32,
        residual = DType::float32;
};

// Draws every input the case needs, the way fixtures/CASES.md's defaults do: x, residual, dy
// N(0,1); weight N(1 - offset, 0.1); biases N(0, 0.1); FFN weights N(0, 1/sqrt(fan_in)).
void fill(ref::Case& c, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z;
  auto tensor = [&](DType t, std::vector<std::int64_t> shape, double mean, double std) {
    ref::Tensor v;
    v.dtype = t;
    v.shape = std::move(shape);
    v.data.resize(static_cast<std::size_t>(v.numel()));
    for (auto& e : v.data) e = ref::round_to(mean + std * z(gen), t);
    return v;
  };
  const auto shape = c.inputs.at("x").shape;
  c.inputs.clear();
  c.inputs["x"] = tensor(c.dtype_x, shape, 0, 1);
  if (c.block != ref::Block::none) {
    const std::int64_t L = c.layers, D = shape.back(), F = 2 * D, K = c.block == ref::Block::sandwich ? 2 : 1;
    c.inputs["ffn_w1"] = tensor(c.dtype_param, {L, F, D}, 0, 1 / std::sqrt(double(D)));
    c.inputs["ffn_b1"] = tensor(c.dtype_param, {L, F}, 0, 0.1);
    c.inputs["ffn_w2"] = tensor(c.dtype_param, {L, D, F}, 0, 1 / std::sqrt(double(F)));
    c.inputs["ffn_b2"] = tensor(c.dtype_param, {L, D}, 0, 0.1);
    if (c.affine != Affine::none)
      c.inputs["weight"] = tensor(c.dtype_param, {L, K, D}, 1 - c.weight_offset, 0.1);
    if (c.affine == Affine::weight_bias) c.inputs["bias"] = tensor(c.dtype_param, {L, K, D}, 0, 0.1);
  } else {
    const auto pshape = ref::geometry_of(c).param_shape;
    if (c.affine != Affine::none)
      c.inputs["weight"] = tensor(c.dtype_param, pshape, 1 - c.weight_offset, 0.1);
    if (c.affine == Affine::weight_bias) c.inputs["bias"] = tensor(c.dtype_param, pshape, 0, 0.1);
    if (c.residual != Residual::none) c.inputs["residual"] = tensor(c.dtype_residual, shape, 0, 1);
    if (c.residual == Residual::add_bias) c.inputs["residual_bias"] = tensor(c.dtype_param, pshape, 0, 0.1);
  }
  if (c.direction == ref::Direction::backward) c.inputs["dy"] = tensor(c.dtype_out, shape, 0, 1);
}

ref::Case make_case(Op op, std::vector<std::int64_t> shape, Affine affine = Affine::weight_bias,
                    Dtypes d = {}, ref::Direction dir = ref::Direction::forward, std::uint64_t seed = 1) {
  ref::Case c;
  c.op = op;
  c.affine = affine;
  c.direction = dir;
  c.dtype_x = d.x;
  c.dtype_param = d.param;
  c.dtype_out = d.out;
  c.dtype_compute = d.compute;
  c.dtype_residual = d.residual;
  c.inputs["x"].shape = std::move(shape);
  fill(c, seed);
  return c;
}

// Sets every element of input `name` from f(flat index), rounded to the input's dtype.
template <class F>
void set_input(ref::Case& c, const std::string& name, F f) {
  auto& t = c.inputs.at(name);
  for (std::size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = ref::round_to(f(static_cast<std::int64_t>(i)), t.dtype);
}

double ulp(DType t, double m) {
  const auto f = ref::format_of(t);
  const int e = m > 0 && std::isfinite(m) ? std::max(std::ilogb(m), f.min_exp) : f.min_exp;
  return std::ldexp(1.0, e - f.precision + 1);
}

std::int64_t rows_of(const ref::Case& c) {
  if (c.block != ref::Block::none) return c.inputs.at("x").numel() / c.inputs.at("x").shape.back();
  return ref::geometry_of(c).rows;
}

// Largest error of output `name` (every output when empty), in units of the measure above;
// +inf where one side is NaN or infinite and the other is not the same.
double error_of(const ref::Case& c, const Outputs& got, const ref::Result& want,
                const std::string& only = "") {
  double worst = 0;
  for (const auto& [name, o] : want.outputs) {
    if (!only.empty() && name != only) continue;
    auto it = got.find(name);
    if (it == got.end()) return kInf;
    const auto& g = it->second;
    EXPECT_EQ(g.dtype, o.value.dtype) << name;
    EXPECT_EQ(g.shape, o.value.shape) << name;
    if (g.data.size() != o.value.data.size()) return kInf;
    const bool column =
        name == "dweight" || name == "dbias" || name == "dresidual_bias" || name.rfind("dffn", 0) == 0;
    for (std::size_t i = 0; i < g.data.size(); ++i) {
      const double a = g.data[i], w = o.value.data[i];
      if (!std::isnan(a)) {
        EXPECT_EQ(ref::round_to(a, g.dtype), a) << name << "[" << i << "] is not a value of its dtype";
      }
      if (std::isnan(w) || std::isnan(a) || std::isinf(w) || std::isinf(a)) {
        if (!(std::isnan(w) && std::isnan(a)) && a != w) return kInf;
        continue;
      }
      const double s =
          name == "rstd" ? std::fabs(w) : std::max(std::fabs(w), column ? double(rows_of(c)) : 1.0);
      const double unit = std::max(ulp(o.value.dtype, s), ulp(c.dtype_compute, s));
      worst = std::max(worst, std::fabs(a - w) / unit);
    }
  }
  return worst;
}

double error(const ref::Case& c, Reduction r, Fault f = Fault{}, const std::string& only = "") {
  return error_of(c, run_kernel(c, r, f), ref::evaluate(c), only);
}

// The bound above for the correct kernels, for output `name` of dtype t.
double bound(const ref::Case& c, const std::string& name, DType t) {
  const bool column = name == "dweight" || name == "dbias" || name == "dresidual_bias";
  if (ref::format_of(t).precision < ref::format_of(c.dtype_compute).precision && !column) return 2;
  const std::int64_t n = c.inputs.at("x").numel() / rows_of(c);
  return double(n + 8 + (column ? rows_of(c) : 0));
}

void expect_close_to_reference(const ref::Case& c, const std::string& what) {
  const ref::Result want = ref::evaluate(c);
  for (Reduction r : {Reduction::two_pass, Reduction::welford, Reduction::pairwise}) {
    const Outputs got = run_kernel(c, r);
    EXPECT_EQ(got.size(), want.outputs.size()) << what;
    for (const auto& [name, o] : want.outputs) {
      const double e = error_of(c, got, want, name);
      EXPECT_LE(e, bound(c, name, o.value.dtype)) << what << " " << name_of(r) << " output " << name;
    }
  }
}

bool identical(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape != t.shape || it->second.data.size() != t.data.size()) return false;
    for (std::size_t i = 0; i < t.data.size(); ++i)
      if (std::bit_cast<std::uint64_t>(t.data[i]) != std::bit_cast<std::uint64_t>(it->second.data[i]))
        return false;
  }
  return true;
}

std::string describe(const ref::Case& c) {
  std::string s =
      std::string(ref::name_of(c.op)) + " " + std::string(ref::name_of(c.direction)) + " affine " +
      std::string(ref::name_of(c.affine)) + " x " + std::string(ref::name_of(c.dtype_x)) + " param " +
      std::string(ref::name_of(c.dtype_param)) + " out " + std::string(ref::name_of(c.dtype_out)) +
      " compute " + std::string(ref::name_of(c.dtype_compute)) + " residual " +
      std::string(ref::name_of(c.residual)) + " contract " + c.contract;
  return s + " offset " + std::to_string(c.weight_offset) + " alpha " + std::to_string(c.alpha);
}

// ---- correct kernels ---------------------------------------------------------------------

const Dtypes kF32{};
const Dtypes kF64{DType::float64, DType::float64, DType::float64, DType::float64, DType::float64};
const Dtypes kBf16{DType::bfloat16, DType::bfloat16, DType::bfloat16, DType::float32, DType::bfloat16};
const Dtypes kF16{DType::float16, DType::float16, DType::float16, DType::float32, DType::float16};
const Dtypes kBf16W32{DType::bfloat16, DType::float32, DType::bfloat16, DType::float32, DType::float32};

TEST(CorrectKernels, EveryOpAffineDtypeResidualAndDirection) {
  int n = 0;
  for (Op op : {Op::layernorm, Op::rmsnorm})
    for (Affine affine : {Affine::none, Affine::weight, Affine::weight_bias})
      for (const Dtypes& d : {kF32, kF64, kBf16, kF16, kBf16W32})
        for (Residual res : {Residual::none, Residual::add, Residual::add_bias})
          for (auto dir : {ref::Direction::forward, ref::Direction::backward})
            for (double offset : {0.0, 1.0}) {
              if (offset != 0 && affine == Affine::none) continue;
              // 4 x 16 and 3 x 7 rows: an even and an odd width, below and above the pairwise base.
              ref::Case c =
                  make_case(op, n % 2 ? std::vector<std::int64_t>{3, 7} : std::vector<std::int64_t>{4, 16},
                            affine, d, dir, static_cast<std::uint64_t>(n) + 10);
              c.residual = res;
              c.weight_offset = offset;
              c.alpha = res != Residual::none && n % 3 == 0 ? 0.5 : 1.0;
              fill(c, static_cast<std::uint64_t>(n) + 10);
              expect_close_to_reference(c, describe(c));
              ++n;
            }
}

TEST(CorrectKernels, EveryContract) {
  int n = 0;
  for (const char* contract :
       {"exact", "llama", "gemma", "te", "te_wdtype", "onnx", "fused_add_lowp", "llama+fused_add_lowp"})
    for (Op op : {Op::layernorm, Op::rmsnorm})
      for (const Dtypes& d : {kBf16, kF16, kF32})
        for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
          ref::Case c = make_case(op, {4, 16}, Affine::weight_bias, d, dir);
          c.contract = contract;
          c.weight_offset =
              std::string(contract).find("te") == 0 || std::string(contract) == "gemma" ? 1.0 : 0.0;
          if (std::string(contract).find("fused_add") != std::string::npos) c.residual = Residual::add;
          fill(c, static_cast<std::uint64_t>(++n));
          expect_close_to_reference(c, describe(c));
        }
}

TEST(CorrectKernels, NormalizedDimsOtherThanTheLast) {
  for (auto dir : {ref::Direction::forward, ref::Direction::backward})
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      for (std::int64_t axis : {-2, 1, 0}) {
        ref::Case c = make_case(op, {2, 3, 4, 5}, Affine::weight_bias, kF32, dir);
        c.axis = axis;
        fill(c, 3);
        expect_close_to_reference(c, describe(c) + " axis " + std::to_string(axis));
      }
      for (std::vector<std::int64_t> axes : {std::vector<std::int64_t>{1}, {0, 2}, {-1, 1}}) {
        ref::Case c = make_case(op, {2, 3, 4, 5}, Affine::weight_bias, kBf16, dir);
        c.axes = axes;
        c.residual = Residual::add_bias;
        fill(c, 4);
        expect_close_to_reference(c, describe(c) + " axes");
      }
    }
}

TEST(CorrectKernels, EmulatedLowPrecisionCompute) {
  for (DType compute : {DType::float16, DType::bfloat16})
    for (Op op : {Op::layernorm, Op::rmsnorm})
      for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
        Dtypes d{compute, compute, compute, compute, compute};
        ref::Case c = make_case(op, {4, 8}, Affine::weight_bias, d, dir, 7);
        c.residual = Residual::add;
        fill(c, 7);
        expect_close_to_reference(c, describe(c));
      }
  // The arithmetic really is in the compute dtype: the statistics are values of it, and they
  // differ from the float32-compute ones on a generic row.
  ref::Case c = make_case(Op::layernorm, {2, 16}, Affine::none, kBf16);
  const Outputs f32 = run_kernel(c, Reduction::two_pass);
  c.dtype_compute = DType::bfloat16;
  const Outputs bf16 = run_kernel(c, Reduction::two_pass);
  for (const char* s : {"mean", "rstd"})
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(ref::round_to(bf16.at(s).data[i], DType::bfloat16), bf16.at(s).data[i]);
      EXPECT_NE(bf16.at(s).data[i], f32.at(s).data[i]) << s;
    }
}

TEST(CorrectKernels, ManyRowsColumnSums) {
  // 203 rows: the pairwise column sums merge 25 full blocks of 8 and a partial one.
  for (Op op : {Op::layernorm, Op::rmsnorm}) {
    ref::Case c = make_case(op, {203, 5}, Affine::weight_bias, kF32, ref::Direction::backward);
    c.residual = Residual::add_bias;
    fill(c, 5);
    expect_close_to_reference(c, describe(c));
  }
}

// Blocks: two layers of D = 8, FFN F = 16, compute float32. Each layer chains dot products of
// length D and F, an erf and one or two norms (backward: the same again in reverse); the bound
// allows D + F compute ulps at scale 1 per layer, 2 layers (observed: at most 17).
TEST(CorrectKernels, ResidualBlocks) {
  for (auto block : {ref::Block::post, ref::Block::pre, ref::Block::sandwich, ref::Block::deepnorm})
    for (auto act : {ref::Activation::gelu, ref::Activation::relu})
      for (Op op : {Op::layernorm, Op::rmsnorm})
        for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
          ref::Case c =
              make_case(op, {3, 8}, op == Op::layernorm ? Affine::weight_bias : Affine::weight, kF32, dir);
          c.block = block;
          c.layers = 2;
          c.activation = act;
          c.alpha = block == ref::Block::deepnorm ? 1.4142135623730951 : 1.0;
          fill(c, 11);
          const ref::Result want = ref::evaluate(c);
          for (Reduction r : {Reduction::two_pass, Reduction::welford, Reduction::pairwise}) {
            const Outputs got = run_kernel(c, r);
            EXPECT_EQ(got.size(), want.outputs.size());
            EXPECT_LE(error_of(c, got, want), 2 * (8 + 16)) << describe(c) << " " << ref::name_of(block);
          }
        }
  // bfloat16 activations between layers and a Gemma offset.
  ref::Case c = make_case(Op::rmsnorm, {2, 8}, Affine::weight, kBf16);
  c.block = ref::Block::sandwich;
  c.layers = 3;
  c.weight_offset = 1;
  fill(c, 12);
  for (Reduction r : {Reduction::two_pass, Reduction::welford, Reduction::pairwise})
    EXPECT_LE(error(c, r), 2);
}

TEST(CorrectKernels, NonFiniteValuesStayInTheirRow) {
  for (Op op : {Op::layernorm, Op::rmsnorm})
    for (auto dir : {ref::Direction::forward, ref::Direction::backward})
      for (double bad : {std::nan(""), kInf}) {
        ref::Case clean = make_case(op, {4, 16}, Affine::weight_bias, kF32, dir);
        ref::Case c = clean;
        c.inputs.at("x").data[2 * 16 + 5] = bad;
        const ref::Result want = ref::evaluate(c);
        for (Reduction r : {Reduction::two_pass, Reduction::pairwise, Reduction::welford}) {
          const Outputs got = run_kernel(c, r), base = run_kernel(clean, r);
          const std::string out = dir == ref::Direction::forward ? "y" : "dx";
          for (std::int64_t i = 0; i < 64; ++i) {
            const double v = got.at(out).data[i];
            if (i / 16 == 2) {  // the row: NaN, or (RMSNorm with inf) zeros plus bias
              const double w = want.outputs.at(out).value.data[i];
              // Welford's update turns an infinity into inf - inf = NaN (README.md), where the
              // formula gives RMSNorm zeros: a property of Welford kernels, not held against it.
              if (r != Reduction::welford || std::isnan(w)) {
                EXPECT_TRUE(std::isnan(w) ? std::isnan(v) : v == w) << out << i << " " << name_of(r);
              } else {
                EXPECT_TRUE(std::isnan(v));
              }
            } else {
              EXPECT_EQ(std::bit_cast<std::uint64_t>(v), std::bit_cast<std::uint64_t>(base.at(out).data[i]));
            }
          }
          // Likewise its running mean of a row holding inf is NaN where sum(h)/N is inf.
          if (dir == ref::Direction::forward && op == Op::layernorm && r != Reduction::welford) {
            EXPECT_EQ(std::isnan(got.at("mean").data[2]), std::isnan(want.outputs.at("mean").value.data[2]));
          }
        }
      }
}

// ---- mutants -----------------------------------------------------------------------------

// The fault shows: the mutant's error is far beyond the correct kernel's on the same case (at
// least 1000 units and 100 times the correct error, or a NaN/inf where the reference is finite).
void expect_reveals(const ref::Case& c, Fault f, const std::string& only = "",
                    Reduction r = Reduction::two_pass) {
  const double ok = error(c, r, Fault{}, only), bad = error(c, r, f, only);
  EXPECT_TRUE(std::isinf(bad) || (bad >= 1000 && bad >= 100 * ok))
      << name_of(f) << ": mutant error " << bad << " vs correct " << ok << " on " << describe(c);
}

// Where the fault does not apply, the mutant is the correct kernel, bit for bit.
void expect_agrees(const ref::Case& c, Fault f, Reduction r = Reduction::two_pass) {
  EXPECT_TRUE(identical(run_kernel(c, r, f), run_kernel(c, r))) << name_of(f) << " on " << describe(c);
}

ref::Case with_x(ref::Case c, double mean, double std, std::uint64_t seed = 3) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z;
  set_input(c, "x", [&](std::int64_t) { return mean + std * z(gen); });
  return c;
}

// A. Rows of variance 1e-4 eps (eps 1e-5): eps dominates rstd; moved or dropped, rstd changes
// by orders of magnitude.
TEST(Mutants, EpsOutsideSqrtAndInDenominator) {
  for (Fault f : {fault("eps_outside_sqrt"), fault("eps_in_denominator")})
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      ref::Case c = with_x(make_case(op, {4, 64}), 0, std::sqrt(1e-4 * 1e-5));
      EXPECT_LE(error(c, Reduction::two_pass), bound(c, "y", c.dtype_out));
      expect_reveals(c, f, "y");
      c.epsilon = 0;  // no eps to misplace
      expect_agrees(c, f);
    }
}

TEST(Mutants, EpsHardcoded) {
  ref::Case c = with_x(make_case(Op::rmsnorm, {4, 64}, Affine::weight), 0, 0.003);  // var ~ 9e-6 ~ eps
  expect_reveals(c, fault("eps_hardcoded"), "y");
  c.epsilon = 1e-6;
  expect_agrees(c, fault("eps_hardcoded"));
}

TEST(Mutants, EpsDropped) {
  ref::Case c = make_case(Op::layernorm, {4, 32});
  set_input(c, "x", [](std::int64_t i) { return double(i / 32 + 3); });  // constant rows: y = bias
  expect_reveals(c, fault("eps_dropped"), "y");
  c.epsilon = 0;  // nothing to drop
  expect_agrees(with_x(c, 0, 1), fault("eps_dropped"));
}

TEST(Mutants, EpsFp16) {
  ref::Case c = make_case(Op::layernorm, {4, 32}, Affine::weight_bias, kF16);
  c.epsilon = 1e-12;
  set_input(c, "x", [](std::int64_t) { return 0.0; });  // zero rows: 0 * 1/sqrt(0) = NaN
  expect_reveals(c, fault("eps_fp16"), "y");
  c.epsilon = 0x1p-10;  // a float16 value: nothing to lose
  expect_agrees(with_x(c, 0, 1), fault("eps_fp16"));
}

// B.
TEST(Mutants, OnePassVariance) {
  // mean 1000, sigma 1 (mean/sigma = 1e3): the two-pass fp32 kernel loses ~sqrt(N) u 1e3 to the
  // mean's rounding; E[h^2] - E[h]^2 loses ~N u 1e6, a thousand times more.
  ref::Case c = with_x(make_case(Op::layernorm, {4, 64}), 1000, 1);
  expect_reveals(c, fault("one_pass_variance"), "y");
  for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {  // N(0,1): no cancellation
    ref::Case n = make_case(Op::layernorm, {4, 16}, Affine::weight_bias, kF32, dir);
    EXPECT_LE(error(n, Reduction::two_pass, fault("one_pass_variance")), bound(n, "y", n.dtype_out));
  }
}

TEST(Mutants, UnbiasedVariance) {
  ref::Case c = make_case(Op::layernorm, {4, 4});  // N - 1 = 3: rstd off by sqrt(4/3)
  expect_reveals(c, fault("unbiased_variance"), "y");
  expect_agrees(make_case(Op::rmsnorm, {4, 4}, Affine::weight), fault("unbiased_variance"));
}

TEST(Mutants, PaddingLanes) {
  ref::Case c = with_x(make_case(Op::layernorm, {4, 17}), 1, 1);  // 15 padded lanes add 15 mu^2
  expect_reveals(c, fault("padding_lanes"), "y");
  expect_agrees(with_x(make_case(Op::layernorm, {4, 16}), 1, 1), fault("padding_lanes"));  // a power of two
  expect_agrees(make_case(Op::rmsnorm, {4, 17}, Affine::weight), fault("padding_lanes"));  // zeros add 0
}

TEST(Mutants, Fp16Accumulation) {
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight);
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> u(256, 2000);
  set_input(c, "x", [&](std::int64_t i) { return (i % 2 ? -1 : 1) * u(gen); });  // x^2 > 65504
  expect_reveals(c, fault("fp16_accumulation"), "y");
  ref::Case h = make_case(Op::rmsnorm, {4, 32}, Affine::weight,
                          {DType::float16, DType::float16, DType::float16, DType::float16, DType::float16});
  expect_agrees(h, fault("fp16_accumulation"));  // float16 compute accumulates in float16 anyway
}

TEST(Mutants, WelfordMerge) {
  // x_i = i within each row of 17: the halves' means are 3.5 and 12, merged to 7.75, not 8.
  ref::Case c = make_case(Op::layernorm, {4, 17});
  set_input(c, "x", [](std::int64_t i) { return double(i % 17); });
  expect_reveals(c, fault("welford_merge"), "mean", Reduction::welford);
  ref::Case even = make_case(Op::layernorm, {4, 16});  // equal halves: the merge is right
  EXPECT_LE(error(even, Reduction::welford, fault("welford_merge")), bound(even, "y", even.dtype_out));
}

// C. A [2, 3, 4] tensor normalized over some of its dims.
TEST(Mutants, WrongAxis) {
  ref::Case c = make_case(Op::layernorm, {2, 3, 4});  // the last dim: the mutant takes [3, 4]
  expect_reveals(c, fault("wrong_axis"), "y");
  ref::Case all_but_batch = make_case(Op::layernorm, {2, 3, 4});
  all_but_batch.axis = 1;
  fill(all_but_batch, 2);
  expect_agrees(all_but_batch, fault("wrong_axis"));
  expect_agrees(make_case(Op::layernorm, {6, 4}), fault("wrong_axis"));  // rank 2
}

TEST(Mutants, LastDimOnly) {
  ref::Case c = make_case(Op::rmsnorm, {2, 3, 4}, Affine::weight);
  c.axis = -2;
  fill(c, 2);
  expect_reveals(c, fault("last_dim_only"), "y");
  expect_agrees(make_case(Op::rmsnorm, {2, 3, 4}, Affine::weight), fault("last_dim_only"));
}

TEST(Mutants, RmsCentred) {
  ref::Case c = with_x(make_case(Op::rmsnorm, {4, 32}, Affine::weight), 5, 1);  // mean 5: centring matters
  expect_reveals(c, fault("rms_centred"), "y");
  expect_agrees(make_case(Op::layernorm, {4, 32}), fault("rms_centred"));
}

TEST(Mutants, WeightNotBroadcast) {
  for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
    ref::Case c = make_case(Op::layernorm, {2, 3, 4}, Affine::weight_bias, kF32, dir);
    c.axes = std::vector<std::int64_t>{1};  // gamma of shape [3] over dim 1 of [2, 3, 4]
    fill(c, 2);
    set_input(c, "weight", [](std::int64_t i) { return 1.0 + double(i); });
    expect_reveals(c, fault("weight_not_broadcast"), dir == ref::Direction::forward ? "y" : "dx");
    ref::Case trailing = make_case(Op::layernorm, {2, 3, 4}, Affine::weight_bias, kF32, dir);
    trailing.axis = 1;  // trailing dims: memory order is the broadcast order
    fill(trailing, 2);
    expect_agrees(trailing, fault("weight_not_broadcast"));
  }
}

// D. Output float32 where x is bfloat16: an intermediate bfloat16 rounding (2^-9 relative) is
// thousands of float32 ulps, so a missing or extra one shows.
const Dtypes kBf16O32{DType::bfloat16, DType::float32, DType::float32, DType::float32, DType::bfloat16};

TEST(Mutants, WeightBeforeDowncast) {
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight, kBf16O32);
  c.contract = "llama";
  expect_reveals(c, fault("weight_before_downcast"), "y");
  c.contract = "exact";
  expect_agrees(c, fault("weight_before_downcast"));
}

TEST(Mutants, OffsetInParamDtype) {
  Dtypes d = kBf16O32;
  d.param = DType::bfloat16;
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight, d);
  c.weight_offset = 1;
  c.contract = "gemma";  // scale (1 + w) in fp32
  fill(c, 4);
  expect_reveals(c, fault("offset_in_param_dtype"), "y");
  c.contract = "te_wdtype";  // scale rounded to the weight dtype: what the mutant does
  expect_agrees(c, fault("offset_in_param_dtype"));
}

TEST(Mutants, RstdBf16) {
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight);
  expect_reveals(c, fault("rstd_bf16"), "y");
  ref::Case b =
      make_case(Op::rmsnorm, {4, 32}, Affine::weight,
                {DType::bfloat16, DType::bfloat16, DType::bfloat16, DType::bfloat16, DType::bfloat16});
  expect_agrees(b, fault("rstd_bf16"));  // bfloat16 compute: rstd is a bfloat16 already
}

// FlagGems #221: float16 x, float32 statistics saved as float16. The returned rstd and mean
// carry the rounding; y does not; the backward reads the rounded statistics (dweight in float32
// shows it). Where x is as wide as the statistics there is nothing to round.
TEST(Mutants, StatsSavedInXDtype) {
  const Dtypes d{DType::float16, DType::float32, DType::float32, DType::float32, DType::float16};
  const ref::Case c = make_case(Op::layernorm, {4, 64}, Affine::weight_bias, d);
  expect_reveals(c, fault("stats_saved_in_x_dtype"), "rstd");
  expect_reveals(with_x(c, 5, 1), fault("stats_saved_in_x_dtype"), "mean");  // a mean of 5: 2^-9 apart in float16
  EXPECT_TRUE(identical({{"y", run_kernel(c, Reduction::two_pass, fault("stats_saved_in_x_dtype")).at("y")}},
                        {{"y", run_kernel(c, Reduction::two_pass).at("y")}}));
  const ref::Case b = make_case(Op::layernorm, {4, 64}, Affine::weight_bias, d, ref::Direction::backward);
  expect_reveals(b, fault("stats_saved_in_x_dtype"), "dweight");
  expect_agrees(make_case(Op::layernorm, {4, 64}), fault("stats_saved_in_x_dtype"));
}

TEST(Mutants, HKeptUnrounded) {
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight, kBf16O32);
  c.residual = Residual::add;
  c.contract = "fused_add_lowp";
  fill(c, 6);
  expect_reveals(c, fault("h_kept_unrounded"), "y");
  EXPECT_TRUE(
      identical({{"r", run_kernel(c, Reduction::two_pass).at("residual_out")}},
                {{"r", run_kernel(c, Reduction::two_pass, fault("h_kept_unrounded")).at("residual_out")}}));
  c.contract = "exact";
  expect_agrees(c, fault("h_kept_unrounded"));
}

// E.
TEST(Mutants, FusedAddRoundsH) {
  Dtypes d = kBf16O32;
  d.residual = DType::float32;  // a float32 residual stream, bfloat16 activations
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight, d);
  c.residual = Residual::add;
  fill(c, 7);
  expect_reveals(c, fault("fused_add_rounds_h"), "y");
  ref::Case f32 = make_case(Op::rmsnorm, {4, 32}, Affine::weight);
  f32.residual = Residual::add;
  fill(f32, 7);
  expect_agrees(f32, fault("fused_add_rounds_h"));  // rounding a float32 h to float32: nothing
}

TEST(Mutants, ResidualOutMissingBias) {
  ref::Case c = make_case(Op::layernorm, {4, 32});
  c.residual = Residual::add_bias;
  fill(c, 8);
  expect_reveals(c, fault("residual_out_missing_bias"), "residual_out");
  EXPECT_EQ(error(c, Reduction::two_pass, fault("residual_out_missing_bias"), "y"),
            error(c, Reduction::two_pass, Fault{}, "y"));
  c.residual = Residual::add;
  fill(c, 8);
  expect_agrees(c, fault("residual_out_missing_bias"));
}

TEST(Mutants, ResidualOutOverwritten) {
  ref::Case c = make_case(Op::rmsnorm, {4, 32}, Affine::weight);
  c.residual = Residual::add;
  fill(c, 9);
  expect_reveals(c, fault("residual_out_overwritten"), "residual_out");
  ref::Case b = make_case(Op::rmsnorm, {4, 32}, Affine::weight, kBf16);
  b.residual = Residual::add;
  fill(b, 9);
  expect_agrees(b, fault("residual_out_overwritten"));  // bf16: x.float() is a copy
}

ref::Case block_case(ref::Block block, ref::Direction dir = ref::Direction::forward, double alpha = 1.0) {
  ref::Case c = make_case(Op::layernorm, {3, 8}, Affine::weight_bias, kF32, dir);
  c.block = block;
  c.layers = 2;
  c.alpha = alpha;
  fill(c, 13);
  set_input(c, "weight", [](std::int64_t i) { return 0.5 + 0.1 * double(i % 7); });  // far from 1
  return c;
}

TEST(Mutants, PreLnResidualAfterNorm) {
  for (auto dir : {ref::Direction::forward, ref::Direction::backward})
    expect_reveals(block_case(ref::Block::pre, dir), fault("pre_ln_residual_after_norm"),
                   dir == ref::Direction::forward ? "y" : "dx");
  expect_agrees(block_case(ref::Block::sandwich), fault("pre_ln_residual_after_norm"));
}

TEST(Mutants, DeepnormAlphaOnF) {
  for (auto dir : {ref::Direction::forward, ref::Direction::backward})
    expect_reveals(block_case(ref::Block::deepnorm, dir, 1.4142135623730951), fault("deepnorm_alpha_on_f"),
                   dir == ref::Direction::forward ? "y" : "dx");
  expect_agrees(block_case(ref::Block::deepnorm, ref::Direction::backward, 1.0), fault("deepnorm_alpha_on_f"));
}

TEST(Mutants, PostLnDoubleNorm) {
  for (auto dir : {ref::Direction::forward, ref::Direction::backward})
    expect_reveals(block_case(ref::Block::post, dir), fault("post_ln_double_norm"),
                   dir == ref::Direction::forward ? "y" : "dx");
  expect_agrees(block_case(ref::Block::pre, ref::Direction::backward), fault("post_ln_double_norm"));
}

// G.
TEST(Mutants, DweightBf16Reduction) {
  ref::Case c = make_case(Op::layernorm, {64, 16}, Affine::weight_bias, kF32, ref::Direction::backward);
  expect_reveals(c, fault("dweight_bf16_reduction"), "dweight");
  EXPECT_EQ(error(c, Reduction::two_pass, fault("dweight_bf16_reduction"), "dx"),
            error(c, Reduction::two_pass, Fault{}, "dx"));
  // One row, bfloat16 parameters: the one term rounds to bfloat16 either way.
  ref::Case one = make_case(Op::layernorm, {1, 16}, Affine::weight_bias, kBf16, ref::Direction::backward);
  expect_agrees(one, fault("dweight_bf16_reduction"));
}

TEST(Mutants, DweightWarpWidth) {
  ref::Case c = make_case(Op::rmsnorm, {4, 80}, Affine::weight, kF32, ref::Direction::backward);
  expect_reveals(c, fault("dweight_warp_width"), "dweight");
  expect_agrees(make_case(Op::layernorm, {4, 32}, Affine::weight_bias, kF32, ref::Direction::backward),
                fault("dweight_warp_width"));
}

TEST(Mutants, DgammaWrongIndex) {
  ref::Case c = make_case(Op::layernorm, {40, 48}, Affine::weight_bias, kF32, ref::Direction::backward);
  set_input(c, "weight", [](std::int64_t i) { return 0.5 + 0.05 * double(i); });
  expect_reveals(c, fault("dgamma_wrong_index"), "dweight");
  EXPECT_EQ(error(c, Reduction::two_pass, fault("dgamma_wrong_index"), "dx"),
            error(c, Reduction::two_pass, Fault{}, "dx"));
  // Constant gamma and beta: every index gives the same ones, x-hat comes back to rounding.
  set_input(c, "weight", [](std::int64_t) { return 1.5; });
  set_input(c, "bias", [](std::int64_t) { return 0.25; });
  EXPECT_LE(error(c, Reduction::two_pass, fault("dgamma_wrong_index"), "dweight"),
            bound(c, "dweight", c.dtype_param));
}

TEST(Mutants, RowsBeyondGridLimit) {
  ref::Case c = make_case(Op::rmsnorm, {65537, 2}, Affine::weight);
  expect_reveals(c, fault("rows_beyond_grid_limit"), "y");
  for (auto dir : {ref::Direction::forward, ref::Direction::backward})
    expect_agrees(make_case(Op::layernorm, {1000, 2}, Affine::weight_bias, kF32, dir),
                  fault("rows_beyond_grid_limit"));
}

// rocm-libraries #10198 in the column sums: rows from 1024 on never reach dweight/dbias.
TEST(Mutants, DweightFirstRowsOnly) {
  const ref::Case c = make_case(Op::layernorm, {1040, 8}, Affine::weight_bias, kF32, ref::Direction::backward);
  expect_reveals(c, fault("dweight_first_rows_only"), "dweight");
  expect_reveals(c, fault("dweight_first_rows_only"), "dbias");
  EXPECT_EQ(error(c, Reduction::two_pass, fault("dweight_first_rows_only"), "dx"),
            error(c, Reduction::two_pass, Fault{}, "dx"));
  expect_agrees(make_case(Op::layernorm, {1024, 8}, Affine::weight_bias, kF32, ref::Direction::backward),
                fault("dweight_first_rows_only"));
}

// dmlc/mshadow #368, pocl #2211: y converted to float16 by truncation. Each element is the
// correct kernel's value before the conversion (the same kernel with a float32 y) rounded toward
// zero: at most one ulp below it in magnitude, and on some elements a whole ulp from the correctly
// rounded y; mean and rstd are the correct kernel's, and a float32 y is untouched.
TEST(Mutants, Fp16OutputTruncated) {
  const ref::Case c = make_case(Op::layernorm, {4, 64}, Affine::weight_bias, kF16);
  ref::Case wide = c;
  wide.dtype_out = DType::float32;
  const Outputs bad = run_kernel(c, Reduction::two_pass, fault("fp16_output_truncated"));
  const Outputs ok = run_kernel(c, Reduction::two_pass);
  const Outputs before = run_kernel(wide, Reduction::two_pass);
  const auto &yb = bad.at("y").data, &yo = ok.at("y").data, &yv = before.at("y").data;
  ASSERT_EQ(yb.size(), yv.size());
  int a_ulp_apart = 0;
  for (std::size_t i = 0; i < yb.size(); ++i) {
    EXPECT_EQ(ref::round_to(yb[i], DType::float16), yb[i]) << i;
    EXPECT_LE(std::fabs(yb[i]), std::fabs(yv[i])) << i;
    EXPECT_LT(std::fabs(yv[i]) - std::fabs(yb[i]), ulp(DType::float16, std::fabs(yv[i]))) << i;
    EXPECT_TRUE(yb[i] == 0 || std::signbit(yb[i]) == std::signbit(yv[i])) << i;
    if (yb[i] != yo[i]) {
      ++a_ulp_apart;
      EXPECT_EQ(std::fabs(yo[i]) - std::fabs(yb[i]), ulp(DType::float16, std::fabs(yb[i]))) << i;
    }
  }
  EXPECT_GT(a_ulp_apart, 32) << "about half the elements round up in magnitude";
  for (const char* name : {"mean", "rstd"})
    EXPECT_TRUE(identical({{name, bad.at(name)}}, {{name, ok.at(name)}})) << name;
  expect_agrees(make_case(Op::layernorm, {4, 64}), fault("fp16_output_truncated"));
  expect_agrees(make_case(Op::rmsnorm, {4, 64}, Affine::weight, kBf16), fault("fp16_output_truncated"));
}

TEST(CorrectKernels, OutputsAreExactlyTheOutputSpecs) {
  std::vector<ref::Case> cases;
  for (auto dir : {ref::Direction::forward, ref::Direction::backward}) {
    ref::Case c = make_case(Op::layernorm, {2, 3, 4}, Affine::weight_bias, kBf16W32, dir);
    c.axes = std::vector<std::int64_t>{0, 2};
    c.residual = Residual::add_bias;
    fill(c, 1);
    cases.push_back(c);
    cases.push_back(make_case(Op::rmsnorm, {5, 3}, Affine::none, kF16, dir));
    ref::Case b = make_case(Op::rmsnorm, {2, 2, 8}, Affine::weight, kF32, dir);
    b.block = ref::Block::sandwich;
    fill(b, 2);
    cases.push_back(b);
  }
  for (const auto& c : cases) {
    const auto specs = output_specs(c);
    const Outputs got = run_kernel(c, Reduction::pairwise);
    ASSERT_EQ(got.size(), specs.size()) << describe(c);
    for (const auto& [name, spec] : specs) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got.at(name).dtype, spec.dtype) << name;
      EXPECT_EQ(got.at(name).shape, spec.shape) << name;
      EXPECT_EQ(static_cast<std::int64_t>(got.at(name).data.size()), got.at(name).numel()) << name;
    }
  }
}

// ---- the registry --------------------------------------------------------------------------

TEST(Registry, EveryEntryIsWellFormedAndEveryClassIsCovered) {
  std::map<std::string, int> classes;
  int correct = 0, mutants = 0;
  for (const auto& e : cpu_builtins()) {
    EXPECT_EQ(e.info.name.rfind("builtin:", 0), 0u);
    auto cand = e.make();
    EXPECT_EQ(cand->info().name, e.info.name);
    EXPECT_FALSE(e.info.description.empty());
    EXPECT_FALSE(cand->declines(make_case(Op::layernorm, {2, 4}, Affine::weight_bias, kF64)).has_value());
    if (e.info.kind == CandidateKind::correct) {
      ++correct;
      continue;
    }
    ++mutants;
    EXPECT_EQ(e.info.kind, CandidateKind::mutant);
    EXPECT_NE(e.info.fault.find('#'), std::string::npos) << e.info.name << ": no public issue";
    ++classes[e.info.fault_class];
  }
  EXPECT_EQ(correct, 3);
  EXPECT_GE(mutants, 22);
  for (const char* k : {"A", "B", "C", "D", "E", "G"}) EXPECT_GE(classes[k], 3) << k;
  // Each appears in the project's registry, by spec.
  for (const auto& e : cpu_builtins()) EXPECT_NO_THROW(make_candidate(e.info.name)) << e.info.name;
}

// The fault catalogue and the bundled mutants name each other one to one: every mutant has a
// catalogue row reproduced by a mutant, under its own name, and every such row has its mutant.
TEST(Registry, EveryMutantIsACatalogueFaultAndEveryMutantFaultHasItsMutant) {
  std::map<std::string, int> mutants_of;
  for (const auto& e : builtin_candidates()) {
    if (e.info.kind != CandidateKind::mutant) {
      EXPECT_TRUE(e.info.fault_id.empty()) << e.info.name;
      continue;
    }
    const FaultEntry* f = find_fault(e.info.fault_id);
    ASSERT_NE(f, nullptr) << e.info.name << " names no fault of the catalogue ('" << e.info.fault_id << "')";
    EXPECT_EQ(f->by, Reproduced::mutant) << e.info.name << ": its fault is marked dialect only";
    EXPECT_EQ(e.info.name, "builtin:mut_" + std::string(f->id));
    EXPECT_EQ(e.info.fault_class, std::string(1, f->cls)) << e.info.name;
    EXPECT_EQ(e.info.fault, fault_line(*f)) << e.info.name;
    ++mutants_of[e.info.fault_id];
  }
  for (const auto& f : fault_catalogue()) {
    if (f.by != Reproduced::mutant) continue;
    EXPECT_EQ(mutants_of[std::string(f.id)], 1) << f.id << ": reproduced by a mutant, but no builtin:mut_" << f.id;
  }
}

TEST(Registry, ACaseItCannotReadIsACandidateError) {
  ref::Case c = make_case(Op::layernorm, {2, 4});
  c.inputs.erase("bias");
  EXPECT_THROW(cpu_builtins()[0].make()->run(c), CandidateError);
}

}  // namespace
}  // namespace normcheck::conf::cpu
