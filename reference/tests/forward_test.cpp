// Forward reference: closed forms, exact invariances, hard inputs, contracts, fast vs MPFR.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "normcheck/reference/evaluate.hpp"
#include "test_util.hpp"

namespace normcheck::ref {
namespace {

using testing::normal_values;
using testing::same_value;
using testing::set_affine;
using testing::simple_case;

void expect_same_output(const Output& a, const Output& b, const std::string& what) {
  ASSERT_EQ(a.value.data.size(), b.value.data.size()) << what;
  for (std::size_t i = 0; i < a.value.data.size(); ++i) {
    EXPECT_TRUE(same_value(a.value.data[i], b.value.data[i]))
        << what << "[" << i << "]: " << std::hexfloat << a.value.data[i] << " vs " << b.value.data[i];
    EXPECT_TRUE(same_value(a.f64[i], b.f64[i])) << what << " f64[" << i << "]";
  }
}

TEST(Forward, ClosedFormWithRationalRstd) {
  // benchdnn's idea: pairs symmetric about the mean make mean and variance exact. x = 3 ± 1/2
  // gives mean 3, variance 1/4, and with eps = 0 rstd = 2 exactly, y = ±1.
  Case c = simple_case(Op::layernorm, 1, 4, {2.5, 3.5, 3.5, 2.5});
  c.epsilon = 0;
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("mean").value.data[0], 3.0);
  EXPECT_EQ(r.outputs.at("rstd").value.data[0], 2.0);
  EXPECT_EQ(r.outputs.at("y").value.data, (std::vector<double>{-1, 1, 1, -1}));
  for (auto f : r.outputs.at("y").certified) EXPECT_EQ(f, 1);
}

TEST(Forward, ClosedFormIrrationalRstd) {
  // x = {0, 1}: mean 1/2, var 1/4, eps = 1/4 -> rstd = sqrt(2); y = ±sqrt(2)/2.
  Case c = simple_case(Op::layernorm, 1, 2, {0, 1}, DType::float64);
  c.epsilon = 0.25;
  c.dtype_compute = DType::float64;
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("rstd").value.data[0], std::sqrt(2.0));  // sqrt is correctly rounded
  EXPECT_EQ(r.outputs.at("y").value.data[1], std::sqrt(0.5));
  EXPECT_EQ(r.outputs.at("y").value.data[0], -std::sqrt(0.5));
}

TEST(Forward, EpsilonDominatedRowsClosedForm) {
  // x = 1 -+ 2^-10: variance 2^-20, far below eps = 1 - 2^-20; var + eps = 1, so rstd = 1 and
  // y = -+2^-10 exactly. (Rounding eps into the variance's place would give y = -+1.)
  Case c = simple_case(Op::layernorm, 1, 2, {1 - 0x1p-10, 1 + 0x1p-10}, DType::float64);
  c.epsilon = 1 - 0x1p-20;
  c.dtype_compute = DType::float64;
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("rstd").value.data[0], 1.0);
  EXPECT_EQ(r.outputs.at("y").value.data, (std::vector<double>{-0x1p-10, 0x1p-10}));
  // RMSNorm of x = 3*2^-12 with eps = 1 - 9*2^-24: mean square + eps = 1, y = x exactly.
  Case m = simple_case(Op::rmsnorm, 1, 1, {3 * 0x1p-12}, DType::float64);
  m.epsilon = 1 - 9 * 0x1p-24;
  EXPECT_EQ(evaluate(m).outputs.at("y").value.data[0], 3 * 0x1p-12);
}

TEST(Forward, ConstantRowsGiveTheBiasExactly) {
  Case c = simple_case(Op::layernorm, 2, 3, {7, 7, 7, -0.25, -0.25, -0.25});
  set_affine(c, {2, 3, 4}, {0.5, -1.5, 0});
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("y").value.data, (std::vector<double>{0.5, -1.5, 0, 0.5, -1.5, 0}));
  EXPECT_EQ(r.outputs.at("rstd").value.data[0], round_to(1 / std::sqrt(1e-5), DType::float32));
  EXPECT_EQ(r.stats.uncertified, 0);
}

TEST(Forward, HiddenSizeOne) {
  Case c = simple_case(Op::layernorm, 3, 1, {1, -2, 0x1p100});
  set_affine(c, {5}, {0.125});
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("y").value.data, (std::vector<double>{0.125, 0.125, 0.125}));
  // RMSNorm of size 1 is x / sqrt(x^2 + eps): sign(x) to within eps.
  Case m = simple_case(Op::rmsnorm, 1, 1, {3});
  m.epsilon = 0;
  EXPECT_EQ(evaluate(m).outputs.at("y").value.data[0], 1.0);
}

TEST(Forward, EpsilonZeroOnAConstantRowIsNaN) {
  // The IEEE result of the formula: (x - mean) * rstd = 0 * inf.
  Case c = simple_case(Op::layernorm, 2, 2, {4, 4, 1, 2});
  c.epsilon = 0;
  const Result r = evaluate(c);
  EXPECT_TRUE(std::isnan(r.outputs.at("y").value.data[0]));
  EXPECT_TRUE(std::isinf(r.outputs.at("rstd").value.data[0]));
  EXPECT_EQ(r.outputs.at("y").value.data[2], -1.0);
}

TEST(Forward, ShiftInvarianceIsExactEvenAtMeanOverSigma1e7) {
  // The exact result of LayerNorm does not change when every element is shifted by a constant,
  // so the reference must return identical bits. Rows of mean 2^24 (~1.7e7) and sigma ~1 in
  // float64 (mean/sigma ~ 1.7e7): a one-pass E[x^2]-E[x]^2 in binary64 loses ~48 bits here.
  std::mt19937_64 rng(11);
  const std::int64_t n = 257;
  std::vector<double> base = normal_values(rng, n, 0, 1, DType::float32);
  for (auto& v : base) v = std::ldexp(std::round(std::ldexp(v, 26)), -26);  // so that v + 2^24 is exact
  std::vector<double> shifted(base);
  for (auto& v : shifted) v += 0x1p24;  // exact in float64
  Case a = simple_case(Op::layernorm, 1, n, base, DType::float64);
  Case b = simple_case(Op::layernorm, 1, n, shifted, DType::float64);
  a.dtype_out = b.dtype_out = DType::float32;
  a.dtype_compute = b.dtype_compute = DType::float64;
  const Result ra = evaluate(a), rb = evaluate(b);
  expect_same_output(ra.outputs.at("y"), rb.outputs.at("y"), "y");
  expect_same_output(ra.outputs.at("rstd"), rb.outputs.at("rstd"), "rstd");
  EXPECT_EQ(rb.stats.uncertified, 0);
}

TEST(Forward, PowerOfTwoScaleInvarianceWithZeroEpsilon) {
  // With eps = 0, LayerNorm(2^k x) = LayerNorm(x) exactly, down to binary64 subnormals.
  std::mt19937_64 rng(12);
  const std::int64_t n = 31;
  // |v| in [1, 8): float32 bits of v stay above 2^-1074 after scaling by 2^-1045 (subnormal).
  std::vector<double> base = normal_values(rng, n, 0, 1, DType::float32);
  for (auto& v : base) v = std::copysign(1 + std::fmod(std::fabs(v) * 3, 7), v);
  for (auto& v : base) v = round_to(v, DType::float32);
  for (int k : {-1045, -600, -100, 100, 600, 900}) {
    std::vector<double> scaled(base);
    for (auto& v : scaled) v = std::ldexp(v, k);
    Case a = simple_case(Op::layernorm, 1, n, base, DType::float64);
    Case b = simple_case(Op::layernorm, 1, n, scaled, DType::float64);
    a.epsilon = b.epsilon = 0;
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      a.op = b.op = op;
      expect_same_output(evaluate(a).outputs.at("y"), evaluate(b).outputs.at("y"), "k=" + std::to_string(k));
    }
  }
}

TEST(Forward, Float16NearOverflowStaysExact) {
  // x^2 overflows float16 (65504) for |x| > 256, not in the exact reference: y equals the row
  // scaled down by 2^8, exactly (eps = 0).
  std::vector<double> big{60000, -58976, 30000, 512, -1024, 65504};
  std::vector<double> small(big);
  for (auto& v : small) v = std::ldexp(v, -8);
  Case a = simple_case(Op::rmsnorm, 1, 6, big, DType::float16);
  Case b = simple_case(Op::rmsnorm, 1, 6, small, DType::float16);
  a.epsilon = b.epsilon = 0;
  const Result ra = evaluate(a);
  expect_same_output(ra.outputs.at("y"), evaluate(b).outputs.at("y"), "y");
  for (double v : ra.outputs.at("y").value.data) EXPECT_TRUE(std::isfinite(v));
}

TEST(Forward, NonFiniteInputStaysInItsRow) {
  std::mt19937_64 rng(13);
  std::vector<double> x = normal_values(rng, 3 * 8, 1, 2, DType::float32);
  Case clean = simple_case(Op::layernorm, 3, 8, x);
  set_affine(clean, normal_values(rng, 8, 1, 0.1, DType::float32), normal_values(rng, 8, 0, 0.1, DType::float32));
  for (double bad : {NAN, INFINITY, -INFINITY}) {
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      Case dirty = clean;
      clean.op = dirty.op = op;
      dirty.inputs["x"].data[8 + 3] = bad;
      const Result rc = evaluate(clean), rd = evaluate(dirty);
      const auto& yc = rc.outputs.at("y").value.data;
      const auto& yd = rd.outputs.at("y").value.data;
      for (int i = 0; i < 24; ++i) {
        if (i >= 8 && i < 16) {
          if (op == Op::layernorm || std::isnan(bad) || i == 11) EXPECT_TRUE(std::isnan(yd[i])) << i;
          else EXPECT_TRUE(std::isfinite(yd[i])) << "RMSNorm: rstd = 0, finite x give bias";
        } else {
          EXPECT_EQ(yc[i], yd[i]) << "row " << i / 8 << " changed";
        }
      }
    }
  }
}

// A row holding +inf whose other h = x + residual + residual_bias are not binary64 values (a
// float64 residual_bias): those h are finite, so the LayerNorm mean is +inf (IEEE) and RMSNorm's
// y is the bias there. Found by the property tests (the mean came out NaN, RMSNorm's y NaN).
TEST(Forward, InfiniteRowWithWideResidualSums) {
  for (Op op : {Op::layernorm, Op::rmsnorm}) {
    Case c = simple_case(op, 1, 2, {INFINITY, 1.0});
    c.residual = Residual::add_bias;
    c.dtype_param = DType::float64;
    c.inputs["residual"] = testing::tensor(DType::float32, {1, 2}, {0.5, 0.25});
    c.inputs["residual_bias"] = testing::tensor(DType::float64, {2}, {0.1, 0.2});  // 1.25 + 0.2: not a binary64 sum
    set_affine(c, {1.0, 1.0}, {0.5, 0.75});
    const Result r = evaluate(c);
    if (op == Op::layernorm) {
      EXPECT_EQ(r.outputs.at("mean").value.data[0], INFINITY);
    } else {
      EXPECT_EQ(r.outputs.at("rstd").value.data[0], 0.0);
      EXPECT_TRUE(std::isnan(r.outputs.at("y").value.data[0]));
      EXPECT_EQ(r.outputs.at("y").value.data[1], 0.75);
    }
  }
}

TEST(Forward, FastPathAgreesWithMpfrEverywhere) {
  std::mt19937_64 rng(14);
  Options slow;
  slow.fast_path = false;
  for (DType t : {DType::float64, DType::float32, DType::float16, DType::bfloat16}) {
    for (Op op : {Op::layernorm, Op::rmsnorm}) {
      for (double mean : {0.0, 100.0, 3000.0}) {
        std::vector<double> x = normal_values(rng, 4 * 33, mean, 1, t);
        Case c = simple_case(op, 4, 33, x, t);
        set_affine(c, normal_values(rng, 33, 1, 0.5, t), normal_values(rng, 33, 0, 0.5, t));
        // exact with weight_offset 1: for float64 weights 1 + w is often not a binary64 (the
        // kernel's scale then has a low part).
        for (const char* contract : {"exact", "llama", "onnx", "gemma", "exact+1"}) {
          const std::string variant(contract);
          c.contract = variant == "exact+1" ? "exact" : contract;
          c.weight_offset = (variant == "gemma" || variant == "exact+1") ? 1.0 : 0.0;
          const Result a = evaluate(c), b = evaluate(c, slow);
          EXPECT_GT(a.stats.fast, 0);
          EXPECT_EQ(b.stats.fast, 0);
          for (const auto& [name, out] : a.outputs)
            expect_same_output(out, b.outputs.at(name), std::string(name_of(t)) + " " + contract + " " + name);
        }
      }
    }
  }
}

TEST(Forward, LlamaContractRoundsXhatThenMultiplies) {
  // Independent composition: the exact contract's x-hat in bfloat16, then one binary64 product
  // (exact: 8 x 8 bits) rounded to bfloat16, must equal the llama contract's y.
  std::mt19937_64 rng(15);
  const std::int64_t n = 64;
  Case plain = simple_case(Op::rmsnorm, 2, n, normal_values(rng, 2 * n, 0, 3, DType::bfloat16), DType::bfloat16);
  const Result xhat = evaluate(plain);
  Case llama = plain;
  llama.contract = "llama";
  const std::vector<double> w = normal_values(rng, n, 1, 0.3, DType::bfloat16);
  set_affine(llama, w);
  const Result y = evaluate(llama);
  for (std::int64_t i = 0; i < 2 * n; ++i)
    EXPECT_EQ(y.outputs.at("y").value.data[i],
              round_to(xhat.outputs.at("y").value.data[i] * w[i % n], DType::bfloat16)) << i;
}

TEST(Forward, OnnxContractRoundsTheProductBeforeTheBias) {
  std::mt19937_64 rng(16);
  const std::int64_t n = 40;
  Case plain = simple_case(Op::layernorm, 1, n, normal_values(rng, n, 5, 3, DType::float16), DType::float16);
  const Result xhat = evaluate(plain);
  Case onnx = plain;
  onnx.contract = "onnx";
  const auto w = normal_values(rng, n, 1, 0.3, DType::float16);
  const auto b = normal_values(rng, n, 0, 0.3, DType::float16);
  set_affine(onnx, w, b);
  const Result y = evaluate(onnx);
  for (std::int64_t i = 0; i < n; ++i) {
    const double mul = round_to(xhat.outputs.at("y").value.data[i] * w[i], DType::float16);
    EXPECT_EQ(y.outputs.at("y").value.data[i], round_to(mul + b[i], DType::float16)) << i;
  }
}

TEST(Forward, FusedAddLowpEqualsNormOfTheRoundedSum) {
  std::mt19937_64 rng(17);
  const std::int64_t n = 48;
  const auto x = normal_values(rng, n, 0, 1, DType::bfloat16);
  const auto res = normal_values(rng, n, 0, 4, DType::bfloat16);
  Case fused = simple_case(Op::rmsnorm, 1, n, x, DType::bfloat16);
  fused.residual = Residual::add;
  fused.inputs["residual"] = testing::tensor(DType::bfloat16, {1, n}, res);
  fused.contract = "fused_add_lowp";
  std::vector<double> h(n);
  for (std::int64_t i = 0; i < n; ++i) h[i] = round_to(x[i] + res[i], DType::bfloat16);
  Case unfused = simple_case(Op::rmsnorm, 1, n, h, DType::bfloat16);
  const Result rf = evaluate(fused), ru = evaluate(unfused);
  expect_same_output(rf.outputs.at("y"), ru.outputs.at("y"), "y");
  EXPECT_EQ(rf.outputs.at("residual_out").value.data, h);
  // Without the contract the statistics use the exact sum: some outputs differ.
  fused.contract = "exact";
  const Result re = evaluate(fused);
  EXPECT_NE(re.outputs.at("y").value.data, ru.outputs.at("y").value.data);
  EXPECT_EQ(re.outputs.at("residual_out").value.data, h) << "residual_out is h rounded to its dtype";
}

TEST(Forward, ResidualWithAlphaAndBiasIsExact) {
  // h = alpha*x + r + rb with operands far apart in magnitude: not representable in binary64,
  // so the row takes the rational path; residual_out is h correctly rounded.
  Case c = simple_case(Op::layernorm, 1, 3, {1, 2, 3}, DType::float64);
  c.alpha = 1 + 0x1p-52;
  c.residual = Residual::add_bias;
  c.inputs["residual"] = testing::tensor(DType::float64, {1, 3}, {0x1p-60, 0, -0x1p-70});
  c.inputs["residual_bias"] = testing::tensor(DType::float64, {3}, {0x1p60, 0, 0});
  c.dtype_residual = DType::float64;
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("residual_out").value.data[0], 0x1p60);
  // 3 + 1.5 ulp - 2^-70: just below the midpoint, so 3 + 1 ulp (binary64 arithmetic would
  // round 3 * alpha to the even 3 + 2 ulp first).
  EXPECT_EQ(r.outputs.at("residual_out").value.data[2], 3 + 0x1p-51);
  EXPECT_EQ(r.stats.uncertified, 0);
}

TEST(Forward, GemmaOffsetFarFromZero) {
  // Weight 15.8125 with offset 1 scales by 16.8125; with offset 0 by 15.8125.
  Case c = simple_case(Op::rmsnorm, 1, 2, {1, -1}, DType::bfloat16);
  c.epsilon = 0;
  set_affine(c, {15.8125, 15.8125});
  c.weight_offset = 1;
  c.contract = "gemma";
  EXPECT_EQ(evaluate(c).outputs.at("y").value.data[0], round_to(16.8125, DType::bfloat16));
  c.weight_offset = 0;
  EXPECT_EQ(evaluate(c).outputs.at("y").value.data[0], 15.8125);
}

TEST(Forward, ChannelsFirstAxesAndOnnxNegativeAxis) {
  // x [2, 3, 2] normalized over dim 1 (channels-first): each (n, w) column of 3 is a row.
  std::vector<double> x{1, 10, 2, 20, 3, 30, -1, 5, 0, 5, 1, 5};
  Case c = simple_case(Op::layernorm, 1, 1, {});
  c.inputs["x"] = testing::tensor(DType::float32, {2, 3, 2}, x);
  c.axes = std::vector<std::int64_t>{1};
  c.epsilon = 0;
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("mean").value.shape, (std::vector<std::int64_t>{2, 1, 2}));
  EXPECT_EQ(r.outputs.at("mean").value.data, (std::vector<double>{2, 20, 0, 5}));
  // The (1, 1) column is constant 5: with eps = 0 it is NaN.
  EXPECT_TRUE(std::isnan(r.outputs.at("y").value.data[7]));
  // axis = -2 on [2, 3, 2] normalizes the last two dims: 6 elements per row.
  Case d = c;
  d.axes.reset();
  d.axis = -2;
  const Result rd = evaluate(d);
  EXPECT_EQ(rd.outputs.at("mean").value.shape, (std::vector<std::int64_t>{2, 1, 1}));
  EXPECT_EQ(rd.outputs.at("mean").value.data[0], 11.0);
}

// evaluate_into() reuses the caller's buffers without clearing them: every path must write
// every element. Buffers poisoned with a NaN payload and certified = 0x5a, larger and smaller
// than the outputs, then each case evaluated into the leftovers of the one before, must give
// what a fresh evaluate() gives, bit for bit, on every path (kernel, general double-double,
// MPFR, non-finite rows, eps = 0 constant rows, strided rows, residuals, contracts, backward).
TEST(Forward, ReusedBuffersGiveTheSameResults) {
  std::mt19937_64 rng(21);
  std::vector<Case> cases;
  for (Op op : {Op::layernorm, Op::rmsnorm}) {
    Case c = simple_case(op, 6, 40, normal_values(rng, 240, 3, 2, DType::float32));
    set_affine(c, normal_values(rng, 40, 1, 0.5, DType::float32), normal_values(rng, 40, 0, 0.5, DType::float32));
    c.inputs["x"].data[5] = std::nan("");
    c.inputs["x"].data[41] = INFINITY;
    for (int i = 80; i < 120; ++i) c.inputs["x"].data[i] = 0.75;  // constant row
    cases.push_back(c);
    c.epsilon = 0;  // the constant row gives rstd = inf
    cases.push_back(c);
    for (const char* contract : {"llama", "onnx"}) {
      Case k = c;
      k.contract = contract;
      cases.push_back(k);
    }
    Case h = simple_case(op, 3, 17, normal_values(rng, 51, 0, 1, DType::float16), DType::float16);
    h.residual = Residual::add_bias;
    h.alpha = 0.3;
    h.inputs["residual"] = testing::tensor(DType::float16, {3, 17}, normal_values(rng, 51, 0, 1, DType::float16));
    h.inputs["residual_bias"] = testing::tensor(DType::float16, {17}, normal_values(rng, 17, 0, 1, DType::float16));
    cases.push_back(h);
    Case s = simple_case(op, 1, 1, {});
    s.inputs["x"] = testing::tensor(DType::float32, {2, 5, 3}, normal_values(rng, 30, 1, 1, DType::float32));
    s.axes = std::vector<std::int64_t>{1};
    cases.push_back(s);
    Case b = simple_case(op, 4, 24, normal_values(rng, 96, 1, 1, DType::bfloat16), DType::bfloat16);
    set_affine(b, normal_values(rng, 24, 1, 0.5, DType::bfloat16), normal_values(rng, 24, 0, 0.5, DType::bfloat16));
    b.direction = Direction::backward;
    b.inputs["dy"] = testing::tensor(DType::bfloat16, {4, 24}, normal_values(rng, 96, 0, 1, DType::bfloat16));
    cases.push_back(b);
  }
  auto expect_same = [](const Result& fresh, const Result& reused, const std::string& what) {
    ASSERT_EQ(fresh.outputs.size(), reused.outputs.size()) << what;
    for (const auto& [name, a] : fresh.outputs) {
      const Output& b = reused.outputs.at(name);
      EXPECT_EQ(a.value.dtype, b.value.dtype) << what << " " << name;
      EXPECT_EQ(a.value.shape, b.value.shape) << what << " " << name;
      expect_same_output(a, b, what + " " + name);
      EXPECT_EQ(a.certified, b.certified) << what << " " << name;
    }
    EXPECT_EQ(fresh.stats.elements, reused.stats.elements) << what;
    EXPECT_EQ(fresh.stats.fast, reused.stats.fast) << what;
    EXPECT_EQ(fresh.stats.slow, reused.stats.slow) << what;
    EXPECT_EQ(fresh.stats.uncertified, reused.stats.uncertified) << what;
  };
  Result carried;  // each case evaluated into the leftovers of the one before
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Result fresh = evaluate(cases[k]);
    for (std::size_t size : {std::size_t{3}, std::size_t{1000}}) {
      Result poisoned;
      for (const char* name : {"a", "b", "c", "d", "e"}) {
        Output& o = poisoned.outputs[name];
        o.value.data.assign(size, std::bit_cast<double>(std::uint64_t{0x7ff4dead0000beefu}));
        o.f64.assign(size, -1e300);
        o.certified.assign(size, 0x5a);
      }
      evaluate_into(cases[k], {}, poisoned);
      expect_same(fresh, poisoned, "case " + std::to_string(k) + " poisoned " + std::to_string(size));
    }
    evaluate_into(cases[k], {}, carried);
    expect_same(fresh, carried, "case " + std::to_string(k) + " carried");
  }
}

}  // namespace
}  // namespace normcheck::ref
