// The placement study: its passes are the block kernel's (a chain of one-layer calls is the
// whole-stack call, bit for bit), its float64 gradients agree with the certified reference, its
// overflow counts see a planted overflow, bad options name their argument, and the shapes the
// papers predict are measured (README.md "Checked against the papers" gives the numbers).
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/study/placement.hpp"

namespace normcheck::study {
namespace {

using ref::DType;

constexpr Placement kAll[] = {Placement::post, Placement::pre, Placement::sandwich, Placement::deepnorm};

PlacementOptions small() {
  PlacementOptions o;
  o.d_model = 8;
  o.d_ff = 16;
  o.tokens = 3;
  return o;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) || std::signbit(a[i]) != std::signbit(b[i])) return false;
  return true;
}

std::vector<double> concat(const std::vector<LayerParams>& g, std::vector<double> LayerParams::*m) {
  std::vector<double> v;
  for (const auto& p : g) v.insert(v.end(), (p.*m).begin(), (p.*m).end());
  return v;
}

// The chain of one-layer kernel calls run_pass makes equals one kernel call over the stack.
TEST(Study, ChainOfLayersIsTheWholeStack) {
  const PlacementOptions o = small();
  const Data data = make_data(o);
  for (auto p : kAll)
    for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm})
      for (auto dt : {DType::float64, DType::float16}) {
        const Stack s = make_stack(o, p, n, 3);
        const Pass pass = run_pass(s, data, dt, 1.0);
        const auto fwd = conf::cpu::run_kernel(block_case(s, 0, 3, pass.acts[0], o.tokens, dt, nullptr),
                                               conf::cpu::Reduction::two_pass);
        const std::string what = fmt::format("{} {} {}", name_of(p), ref::name_of(n), ref::name_of(dt));
        EXPECT_TRUE(same_bits(fwd.at("y").data, pass.acts[3])) << what;
        const auto bwd = conf::cpu::run_kernel(block_case(s, 0, 3, pass.acts[0], o.tokens, dt, &pass.dacts[3]),
                                               conf::cpu::Reduction::two_pass);
        EXPECT_TRUE(same_bits(bwd.at("dx").data, pass.dacts[0])) << what;
        EXPECT_TRUE(same_bits(bwd.at("dffn_w1").data, concat(pass.grads, &LayerParams::w1))) << what;
        EXPECT_TRUE(same_bits(bwd.at("dffn_w2").data, concat(pass.grads, &LayerParams::w2))) << what;
        EXPECT_TRUE(same_bits(bwd.at("dweight").data, concat(pass.grads, &LayerParams::weight))) << what;
      }
}

// A sample of the float64 gradients (every placement and norm, a two-layer stack after one
// optimizer-free pass) against the certified reference: the kernel's float64 sums differ from
// the exact values by rounding only, far below 1e-12 of the largest element.
TEST(Study, Float64GradientsAgreeWithTheReference) {
  PlacementOptions o = small();
  o.activation = ref::Activation::gelu;  // the erf path too
  const Data data = make_data(o);
  for (auto p : kAll)
    for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm}) {
      const Stack s = make_stack(o, p, n, 2);
      const Pass pass = run_pass(s, data, DType::float64);
      const ref::Result exact = ref::evaluate(block_case(s, 0, 2, pass.acts[0], o.tokens, DType::float64, &pass.dacts[2]));
      const std::string what = fmt::format("{} {}", name_of(p), ref::name_of(n));
      auto agree = [&](const char* name, const std::vector<double>& got) {
        const auto& want = exact.outputs.at(name).f64;
        ASSERT_EQ(want.size(), got.size()) << what << " " << name;
        double scale = 0, worst = 0;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
        EXPECT_GT(scale, 0) << what << " " << name;
        EXPECT_LE(worst, 1e-12 * scale) << what << " " << name << ": worst " << worst << " of " << scale;
      };
      agree("dffn_w1", concat(pass.grads, &LayerParams::w1));
      agree("dffn_w2", concat(pass.grads, &LayerParams::w2));
      agree("dx", pass.dacts[0]);
    }
}

// A loss scale of 2^24 overflows float16 gradients (max 65504) and not bfloat16's (max 3.4e38);
// with loss scale 1 nothing overflows.
TEST(Study, LowPrecisionCountsSeeOverflow) {
  PlacementOptions o = small();
  o.tokens = 4;
  const Data data = make_data(o);
  const Stack s = make_stack(o, Placement::pre, ref::Op::layernorm, 3);
  auto total = [](const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); };
  const Pass big = run_pass(s, data, DType::float16, 0x1p24);
  EXPECT_GT(total(big.bwd_inf), 0);
  EXPECT_EQ(total(big.fwd_inf), 0);
  const Pass bf = run_pass(s, data, DType::bfloat16, 0x1p24);
  EXPECT_EQ(total(bf.bwd_inf) + total(bf.bwd_nan), 0);
  const Pass one = run_pass(s, data, DType::float16, 1.0);
  EXPECT_EQ(total(one.bwd_inf) + total(one.bwd_nan) + total(one.fwd_inf) + total(one.fwd_nan), 0);
  // The counts match a direct count of the last layer's dx.
  std::int64_t inf = 0;
  for (double v : big.dacts[2]) inf += std::isinf(v);
  EXPECT_LE(inf, big.bwd_inf[2]);
}

TEST(Study, BadOptionsNameTheirArgument) {
  auto arg_of = [](PlacementOptions o) -> std::string {
    try {
      validate(o);
    } catch (const StudyInputError& e) {
      return e.argument();
    }
    return "";
  };
  EXPECT_EQ(arg_of(PlacementOptions{}), "");
  PlacementOptions o;
  o.depths = {6, 65};
  EXPECT_EQ(arg_of(o), "--layers");
  o = {};
  o.depths = {0};
  EXPECT_EQ(arg_of(o), "--layers");
  o = {};
  o.d_model = 1;
  EXPECT_EQ(arg_of(o), "--d-model");
  o = {};
  o.d_ff = 0;
  EXPECT_EQ(arg_of(o), "--d-ff");
  o = {};
  o.placements.clear();
  EXPECT_EQ(arg_of(o), "--placement");
  o = {};
  o.lr = -1;
  EXPECT_EQ(arg_of(o), "--lr");
  o = {};  // 8192 x 65536 FFNs of 48 layers: terabytes
  o.d_model = 8192;
  o.d_ff = 65536;
  EXPECT_EQ(arg_of(o), "--d-ff");
  o = {};
  o.memory_limit_bytes = 1 << 20;  // the default study needs more than 1 MiB
  EXPECT_EQ(arg_of(o), "--d-ff");
  EXPECT_FALSE(parse_placement("postln"));
  EXPECT_EQ(parse_placement("deepnorm"), Placement::deepnorm);
}

TEST(Study, DeterministicWhateverTheThreads) {
  PlacementOptions o = small();
  o.depths = {2, 3};
  o.steps = 2;
  o.threads = 1;
  const auto a = to_json(run_placement_study(o), {}, "", "");
  o.threads = 2;
  auto b = to_json(run_placement_study(o), {}, "", "");
  EXPECT_EQ(a["runs"].dump(), b["runs"].dump());
}

// ---- the shapes of the papers, on the default widths and depths (float64, no low precision) --

class Papers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PlacementOptions o;
    o.placements = {Placement::post, Placement::pre, Placement::deepnorm};
    o.lowp.clear();
    o.steps = 1;
    result_ = new StudyResult(run_placement_study(o));
  }
  static void TearDownTestSuite() { delete result_; }
  static const StackRun& run(Placement p, ref::Op n, std::int64_t L) {
    for (const auto& r : result_->runs)
      if (r.placement == p && r.norm == n && r.layers == L) return r;
    throw std::logic_error("no such run");
  }
  static double slope(const std::vector<double>& y) {  // of log y against log L over the depths
    std::vector<double> x;
    for (auto L : result_->options.depths) x.push_back(std::log(static_cast<double>(L)));
    double mx = 0, my = 0;
    for (std::size_t i = 0; i < x.size(); ++i) mx += x[i] / static_cast<double>(x.size()), my += std::log(y[i]) / static_cast<double>(x.size());
    double sxy = 0, sxx = 0;
    for (std::size_t i = 0; i < x.size(); ++i) sxy += (x[i] - mx) * (std::log(y[i]) - my), sxx += (x[i] - mx) * (x[i] - mx);
    return sxy / sxx;
  }
  static StudyResult* result_;
};
StudyResult* Papers::result_ = nullptr;

// Theorem 1: Pre-LN's last-layer gradient over Post-LN's ~ L^(-1/2). Measured over L = 6..48:
// -0.38 (LayerNorm), -0.37 (RMSNorm): ||x_L|| grows like sqrt(1 + cL) with c ~ 0.3 here, whose
// exponent over 6..48 is -0.42, tending to -1/2 only for cL >> 1.
TEST_F(Papers, PreOverPostLastLayerGradientFallsLikeInverseSqrtDepth) {
  for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm}) {
    std::vector<double> ratio;
    for (auto L : result_->options.depths)
      ratio.push_back(run(Placement::pre, n, L).steps[0].grad_w2.back() / run(Placement::post, n, L).steps[0].grad_w2.back());
    const double k = slope(ratio);
    std::printf("pre/post last-layer ||dL/dW2|| ~ L^%.3f (%s)\n", k, std::string(ref::name_of(n)).c_str());
    EXPECT_GT(k, -0.7);
    EXPECT_LT(k, -0.3);
  }
}

// Theorem 1, Post-LN: the last layer's gradient is O(d sqrt(ln d)) whatever L.
TEST_F(Papers, PostLastLayerGradientDoesNotDependOnDepth) {
  for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm}) {
    std::vector<double> g;
    for (auto L : result_->options.depths) g.push_back(run(Placement::post, n, L).steps[0].grad_w2.back());
    EXPECT_LT(*std::max_element(g.begin(), g.end()) / *std::min_element(g.begin(), g.end()), 1.6);
    EXPECT_GT(std::fabs(slope(g)), 0.0);
    EXPECT_LT(std::fabs(slope(g)), 0.2);
  }
}

// Figure 3's shapes, as this FFN-only stack has them (README.md says why they differ from the
// paper's Transformer): Post-LN's gradient does not grow with the layer index (the LN's
// contraction sqrt(d)/||x + F(x)|| is paid back by the residual branch's Jacobian, which for a
// ReLU FFN has the forward gain); Pre-LN's falls with the layer index: each block adds its
// Jacobian's share to the gradient of the stream below it, as in NormFormer's measurements
// (Shleifer et al. 2021), rather than staying flat.
TEST_F(Papers, Figure3ShapesOfAnFfnOnlyStack) {
  for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm})
    for (auto L : result_->options.depths) {
      const auto& post = run(Placement::post, n, L).steps[0].grad_w2;
      EXPECT_LT(post.back() / post.front(), 1.5) << L;
      const auto& pre = run(Placement::pre, n, L).steps[0];
      if (L >= 24) {  // falls with l (first over last layer: 2.0 at L = 24, 4.7 at 48)
        EXPECT_GT(pre.grad_w2.front() / pre.grad_w2.back(), 1.5) << L;
      }
    }
}

// DeepNet: ||ΔF|| after the first Adam step. Post-LN's grows like L^1.3 here, DeepNorm's like
// L^0.6: much more slowly, though not bounded with N = L (README.md).
TEST_F(Papers, DeepNormUpdateGrowsMuchMoreSlowlyThanPostLN) {
  for (auto n : {ref::Op::layernorm, ref::Op::rmsnorm}) {
    std::vector<double> post, deep;
    for (auto L : result_->options.depths) {
      post.push_back(run(Placement::post, n, L).steps[1].model_update);
      deep.push_back(run(Placement::deepnorm, n, L).steps[1].model_update);
    }
    const double kp = slope(post), kd = slope(deep);
    std::printf("||dF|| ~ L^%.2f (post), L^%.2f (deepnorm), %s\n", kp, kd, std::string(ref::name_of(n)).c_str());
    EXPECT_GT(kp, 0.5);
    EXPECT_LT(kd, kp - 0.4);
    for (std::size_t i = 0; i < post.size(); ++i) EXPECT_LT(deep[i], post[i]);
  }
  const auto checks = paper_checks(*result_);
  ASSERT_EQ(checks.size(), 5u);
  for (const auto& c : checks) EXPECT_NE(c.status, "not evaluated") << c.id;
}

}  // namespace
}  // namespace normcheck::study
