// Residual blocks: placements checked by exact identities and against plain norms computed
// independently; backward against central finite differences of the forward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <random>

#include "normcheck/reference/evaluate.hpp"
#include "test_util.hpp"

namespace normcheck::ref {
namespace {

using testing::normal_values;
using testing::tensor;

struct BlockShape {
  std::int64_t rows = 2, d = 4, f = 3, layers = 1;
};

Case block_case(Block block, Op op, const BlockShape& s, std::mt19937_64& rng, DType t = DType::float64) {
  Case c;
  c.op = op;
  c.block = block;
  c.layers = s.layers;
  c.affine = Affine::weight_bias;
  c.epsilon = 1e-5;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = t;
  c.dtype_compute = DType::float64;
  const std::int64_t k = block == Block::sandwich ? 2 : 1;
  c.inputs["x"] = tensor(t, {s.rows, s.d}, normal_values(rng, s.rows * s.d, 0.5, 1, t));
  c.inputs["ffn_w1"] = tensor(t, {s.layers, s.f, s.d}, normal_values(rng, s.layers * s.f * s.d, 0, 0.5, t));
  c.inputs["ffn_b1"] = tensor(t, {s.layers, s.f}, normal_values(rng, s.layers * s.f, 0, 0.3, t));
  c.inputs["ffn_w2"] = tensor(t, {s.layers, s.d, s.f}, normal_values(rng, s.layers * s.d * s.f, 0, 0.5, t));
  c.inputs["ffn_b2"] = tensor(t, {s.layers, s.d}, normal_values(rng, s.layers * s.d, 0, 0.3, t));
  c.inputs["weight"] = tensor(t, {s.layers, k, s.d}, normal_values(rng, s.layers * k * s.d, 1, 0.2, t));
  c.inputs["bias"] = tensor(t, {s.layers, k, s.d}, normal_values(rng, s.layers * k * s.d, 0, 0.2, t));
  return c;
}

void zero_ffn_output(Case& c) {
  for (auto* name : {"ffn_w2", "ffn_b2"})
    for (auto& v : c.inputs[name].data) v = 0;
}

TEST(Blocks, PreNormWithZeroFfnIsTheIdentity) {
  std::mt19937_64 rng(31);
  Case c = block_case(Block::pre, Op::layernorm, {3, 5, 4, 2}, rng, DType::float32);
  zero_ffn_output(c);
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("y").value.data, c.inputs["x"].data);
}

TEST(Blocks, PostNormWithZeroFfnIsThePlainNorm) {
  std::mt19937_64 rng(32);
  for (Op op : {Op::layernorm, Op::rmsnorm}) {
    Case c = block_case(Block::post, op, {3, 6, 2, 1}, rng, DType::bfloat16);
    zero_ffn_output(c);
    Case plain;
    plain.op = op;
    plain.affine = Affine::weight_bias;
    plain.epsilon = c.epsilon;
    plain.dtype_x = plain.dtype_param = plain.dtype_out = plain.dtype_residual = DType::bfloat16;
    plain.inputs["x"] = c.inputs["x"];
    plain.inputs["weight"] = tensor(DType::bfloat16, {6}, c.inputs["weight"].data);
    plain.inputs["bias"] = tensor(DType::bfloat16, {6}, c.inputs["bias"].data);
    EXPECT_EQ(evaluate(c).outputs.at("y").value.data, evaluate(plain).outputs.at("y").value.data);
  }
}

TEST(Blocks, OffsetPlusFloat64WeightIsExact) {
  // scale = 1 + w with w a binary64 far below 1: not a binary64, so it must be enclosed, not
  // summed in binary64 (the mpmath cross-check caught exactly this).
  std::mt19937_64 rng(36);
  Case c = block_case(Block::post, Op::rmsnorm, {2, 5, 2, 1}, rng);
  zero_ffn_output(c);
  c.weight_offset = 1;
  for (auto& w : c.inputs["weight"].data) w = std::ldexp(w, -40);
  Case plain;
  plain.op = Op::rmsnorm;
  plain.affine = Affine::weight_bias;
  plain.weight_offset = 1;
  plain.epsilon = c.epsilon;
  plain.dtype_x = plain.dtype_param = plain.dtype_out = plain.dtype_residual = DType::float64;
  plain.inputs["x"] = c.inputs["x"];
  plain.inputs["weight"] = tensor(DType::float64, {5}, c.inputs["weight"].data);
  plain.inputs["bias"] = tensor(DType::float64, {5}, c.inputs["bias"].data);
  const Result rb = evaluate(c), rp = evaluate(plain);
  EXPECT_EQ(rb.outputs.at("y").f64, rp.outputs.at("y").f64);
  EXPECT_EQ(rb.outputs.at("y").value.data, rp.outputs.at("y").value.data);
}

TEST(Blocks, DeepNormWithUnitAlphaIsPostNorm) {
  std::mt19937_64 rng(33);
  Case post = block_case(Block::post, Op::layernorm, {2, 4, 5, 2}, rng);
  Case deep = post;
  deep.block = Block::deepnorm;
  EXPECT_EQ(evaluate(post).outputs.at("y").value.data, evaluate(deep).outputs.at("y").value.data);
  deep.alpha = 2.0;  // and alpha matters: it scales the residual branch, not F(x)
  EXPECT_NE(evaluate(post).outputs.at("y").value.data, evaluate(deep).outputs.at("y").value.data);
}

TEST(Blocks, PostNormWithReluFfnEqualsPlainNormOfTheExactSum) {
  // With ReLU and small dyadic values, F(x) and x + F(x) are exact in binary64: the block must
  // agree with the plain norm of that sum, computed here without the block code.
  Case c;
  c.op = Op::rmsnorm;
  c.block = Block::post;
  c.activation = Activation::relu;
  c.affine = Affine::none;
  c.epsilon = 0.5;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = DType::float32;
  const std::vector<double> x{1, -2, 0.5}, w1{1, 0.5, -1, -2, 0.25, 1}, b1{0.5, -0.25}, w2{1, -1, 0.5, 2, 0, 0.75},
      b2{0.125, 0, -1};
  c.inputs["x"] = tensor(DType::float32, {1, 3}, x);
  c.inputs["ffn_w1"] = tensor(DType::float32, {1, 2, 3}, w1);
  c.inputs["ffn_b1"] = tensor(DType::float32, {1, 2}, b1);
  c.inputs["ffn_w2"] = tensor(DType::float32, {1, 3, 2}, w2);
  c.inputs["ffn_b2"] = tensor(DType::float32, {1, 3}, b2);
  std::vector<double> h(3);
  double a[2];
  for (int j = 0; j < 2; ++j) {
    a[j] = b1[j];
    for (int i = 0; i < 3; ++i) a[j] += w1[j * 3 + i] * x[i];
    a[j] = std::max(a[j], 0.0);
  }
  for (int i = 0; i < 3; ++i) h[i] = x[i] + b2[i] + w2[i * 2] * a[0] + w2[i * 2 + 1] * a[1];
  Case plain = testing::simple_case(Op::rmsnorm, 1, 3, h);
  plain.epsilon = 0.5;
  EXPECT_EQ(evaluate(c).outputs.at("y").value.data, evaluate(plain).outputs.at("y").value.data);
}

// Central finite differences of sum(dy * y) in binary64, against the certified gradient.
double loss(const Case& c, const std::vector<double>& dy) {
  Case f = c;
  f.direction = Direction::forward;
  f.inputs.erase("dy");
  const Result r = evaluate(f);
  const auto& y = r.outputs.at("y").f64;
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += dy[i] * y[i];
  return s;
}

TEST(Blocks, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(34);
  for (Block b : {Block::post, Block::pre, Block::sandwich, Block::deepnorm}) {
    for (Activation act : {Activation::gelu, Activation::relu}) {
      Case c = block_case(b, b == Block::pre ? Op::rmsnorm : Op::layernorm, {2, 3, 4, 2}, rng);
      c.activation = act;
      c.alpha = b == Block::deepnorm ? 1.75 : 1.0;
      c.direction = Direction::backward;
      const std::vector<double> dy = normal_values(rng, 6, 0, 1, DType::float64);
      c.inputs["dy"] = tensor(DType::float64, {2, 3}, dy);
      const Result r = evaluate(c);
      EXPECT_EQ(r.stats.uncertified, 0);
      for (const auto& [input, grad] : std::vector<std::pair<std::string, std::string>>{
               {"x", "dx"}, {"weight", "dweight"}, {"bias", "dbias"}, {"ffn_w1", "dffn_w1"},
               {"ffn_b1", "dffn_b1"}, {"ffn_w2", "dffn_w2"}, {"ffn_b2", "dffn_b2"}}) {
        const auto& g = r.outputs.at(grad).f64;
        for (std::size_t i = 0; i < g.size(); i += 2) {  // every other element keeps it quick
          Case plus = c, minus = c;
          const double step = 1e-6;
          plus.inputs[input].data[i] += step;
          minus.inputs[input].data[i] -= step;
          const double fd = (loss(plus, dy) - loss(minus, dy)) / (2 * step);
          EXPECT_NEAR(g[i], fd, 1e-6 * (1 + std::fabs(fd)))
              << name_of(b) << " " << name_of(act) << " " << grad << "[" << i << "]";
        }
      }
    }
  }
}

TEST(Blocks, BallPathAgreesWithIntervalsEverywhere) {
  // The ball pass (double-double centres with proved radii) against MPFR intervals alone:
  // every placement, both ops and activations, forward and backward, each dtype, several
  // layers (intermediate roundings), alpha and weight offset; relu's exact zero gradients and
  // a dy whose column sums fall on ties of the output format (float32 values summing to 25
  // bits) are among the outputs. Bit for bit, certified flags included.
  std::mt19937_64 rng(37);
  Options intervals;
  intervals.fast_path = false;
  int ball_cases = 0;
  for (DType t : {DType::float64, DType::float32, DType::bfloat16, DType::float16}) {
    for (Block b : {Block::post, Block::pre, Block::sandwich, Block::deepnorm}) {
      for (Op op : {Op::layernorm, Op::rmsnorm}) {
        for (Activation act : {Activation::gelu, Activation::relu}) {
          for (Direction dir : {Direction::forward, Direction::backward}) {
            Case c = block_case(b, op, {3, 6, 5, 2}, rng, t);
            c.activation = act;
            c.alpha = b == Block::deepnorm ? 1.75 : 1.0;
            c.weight_offset = op == Op::rmsnorm ? 1.0 : 0.0;
            c.direction = dir;
            if (dir == Direction::backward) {
              std::vector<double> dy = normal_values(rng, 18, 0, 1, t);
              if (t == DType::float32)  // column 0: 1 + 2^-24 + 0 is a float32 tie
                dy[0] = 1.0, dy[6] = 0x1p-24, dy[12] = 0.0;
              c.inputs["dy"] = tensor(t, {3, 6}, dy);
            }
            const Result fast = evaluate(c), slow = evaluate(c, intervals);
            const std::string what = std::string(name_of(t)) + " " + std::string(name_of(b)) + " " +
                                     std::string(name_of(op)) + " " + std::string(name_of(act)) + " " +
                                     std::string(name_of(dir));
            testing::expect_same_bits(fast, slow, what);
            ball_cases += fast.stats.fast > 0;
          }
        }
      }
    }
  }
  // The ball pass must actually decide most cases (else this compares intervals with
  // intervals): it took 119 of the 128 when this was written.
  EXPECT_GE(ball_cases, 4 * 4 * 2 * 2 * 2 * 3 / 4);
}

TEST(Blocks, InvalidBlockCasesAreRejected) {
  std::mt19937_64 rng(35);
  Case c = block_case(Block::post, Op::layernorm, {}, rng);
  auto field_of = [](const Case& bad) {
    try {
      (void)evaluate(bad);
    } catch (const CaseError& e) {
      return e.field();
    }
    return std::string("<accepted>");
  };
  EXPECT_EQ(field_of(c), "<accepted>");
  Case a = c;
  a.alpha = 2;
  EXPECT_EQ(field_of(a), "alpha");
  Case b = c;
  b.inputs["ffn_w1"].shape = {1, 4, 3};
  EXPECT_EQ(field_of(b), "inputs/ffn_w1");
  Case d = c;
  d.contract = "llama";
  EXPECT_EQ(field_of(d), "contract");
  Case e = c;
  e.axis = 0;
  EXPECT_EQ(field_of(e), "axis");
  Case f = c;
  f.inputs["weight"].shape = {1, 2, 4};
  EXPECT_EQ(field_of(f), "inputs/weight");
  Case g = c;
  g.layers = 0;
  EXPECT_EQ(field_of(g), "layers");
}

}  // namespace
}  // namespace normcheck::ref
