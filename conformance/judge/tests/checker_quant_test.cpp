// The checker for quantized outputs (checker_quant.hpp, TOLERANCE.md section 10) on planted
// outputs: the certified codes pass; a code flipped away from every boundary fails with the
// element, both codes, the exact value, the allowance and the boundary; a neighbour at a tie
// (an exact midpoint the allowance of p straddles) is accepted and counted; a wrong scale fails;
// a scale within its allowance makes the codes be judged against it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using test::certified;
using test::fixture_of;
using test::normal;
using test::output;

// An RMSNorm with weight over [rows, cols] x of dtype `dt`, quantized by `preset`.
ref::Case quant_case(const char* preset, std::int64_t rows, std::int64_t cols, DType dt, std::uint64_t seed,
                     double eps = 1e-6) {
  std::mt19937_64 rng(seed);
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::weight;
  c.epsilon = eps;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = dt;
  c.dtype_compute = DType::float32;
  c.inputs["x"] = ref::Tensor{dt, {rows, cols}, normal(rng, static_cast<std::size_t>(rows * cols), 0, 1, dt)};
  c.inputs["weight"] = ref::Tensor{dt, {cols}, normal(rng, static_cast<std::size_t>(cols), 1, 0.5, dt)};
  c.quant = ref::quant_preset(preset);
  if (c.quant->scale == ref::ScaleKind::static_tensor) c.inputs["scale"] = ref::Tensor{DType::float32, {1}, {0.0078125}};
  return c;
}

TEST(CheckerQuant, CertifiedOutputsPassForEveryPreset) {
  std::uint64_t seed = 1;
  for (const auto& [name, q] : ref::quant_presets()) {
    const auto c = quant_case(name.c_str(), 4, 64, DType::bfloat16, seed++);
    const auto fc = fixture_of(c);
    const auto r = check_quant_case(fc, certified(fc));
    EXPECT_EQ(r.verdict, Verdict::passed) << name << ": " << (r.outputs.empty() ? "" : r.outputs[0].reason);
    const auto& o = output(r, "q");
    EXPECT_EQ(o.flips_accepted, 0) << name;
    EXPECT_EQ(o.elements, 4 * 64) << name;
  }
}

// The element of q whose exact value is farthest (relative to its code's spacing) from every
// boundary: no allowance reaches one there.
std::size_t far_from_boundaries(const fix::FixtureCase& fc) {
  const auto& q = fc.expected.at("q");
  const auto& bs = ref::boundaries(ref::Elem::e4m3fn);
  std::size_t best = 0;
  double best_d = -1;
  for (std::size_t i = 0; i < q.f64.size(); ++i) {
    const double v = q.f64[i];
    if (!q.certified[i] || !std::isfinite(v) || std::fabs(v) < 1 || std::fabs(v) > 400) continue;
    const auto it = std::lower_bound(bs.begin(), bs.end(), v);
    const double d = std::min(*it - v, v - *(it - 1)) / (*it - *(it - 1));
    if (d > best_d) best_d = d, best = i;
  }
  return best;
}

TEST(CheckerQuant, AFlippedCodeAwayFromABoundaryFailsWithTheNumbers) {
  const auto c = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 11);
  const auto fc = fixture_of(c);
  const std::size_t k = far_from_boundaries(fc);
  Outputs got = certified(fc);
  const int code = static_cast<int>(got["q"].data[k]);
  got["q"].data[k] = code + 1;  // the next code up (same sign), one step away
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::failed);
  const auto& o = output(r, "q");
  EXPECT_EQ(o.failed, 1);
  EXPECT_EQ(o.flips_accepted, 0);
  EXPECT_EQ(o.worst_index, static_cast<std::int64_t>(k));
  EXPECT_GT(o.max_ratio, 1);
  char want[64];
  std::snprintf(want, sizeof want, "got 0x%02X, expected 0x%02X; exact ", code + 1, code);
  EXPECT_NE(o.reason.find(want), std::string::npos) << o.reason;
  EXPECT_NE(o.reason.find("allowance 0x"), std::string::npos) << o.reason;
  EXPECT_NE(o.reason.find(o.worst_exact < 0 ? "boundary -0x" : "boundary 0x"), std::string::npos) << o.reason;
  EXPECT_NE(o.reason.find("flips accepted: 0"), std::string::npos) << o.reason;
}

// y = x * w exactly on a code midpoint (RMSNorm of +-1 with eps 0: rstd is 1), quantized from
// the float32 value (FlashInfer): the kernel's rsqrt may err by an ulp or two, so p straddles
// the midpoint and both neighbours are a correct kernel's; a code two steps away is not.
TEST(CheckerQuant, ANeighbourAtATieIsAcceptedAndCounted) {
  ref::Case c = quant_case("flashinfer_fp8", 2, 16, DType::float32, 3, 0.0);
  c.inputs["x"].data.assign(32, 1.0);
  for (std::size_t i = 16; i < 32; ++i) c.inputs["x"].data[i] = -1.0;
  std::vector<double> w(16, 1.0);
  w[0] = 304;  // between 288 (0x5A... even) and 320
  w[1] = 17;   // between 16 and 18
  c.inputs["weight"].data = w;
  c.inputs["scale"].data = {1.0};
  const auto fc = fixture_of(c);
  const auto& q = fc.expected.at("q");
  ASSERT_TRUE(q.ties[0]);
  ASSERT_TRUE(q.ties[1]);
  Outputs got = certified(fc);
  const int c0 = static_cast<int>(q.value.data[0]);
  const int other = ref::encode(ref::Elem::e4m3fn, 288) == c0 ? ref::encode(ref::Elem::e4m3fn, 320)
                                                               : ref::encode(ref::Elem::e4m3fn, 288);
  got["q"].data[0] = other;
  auto r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::passed) << output(r, "q").reason;
  EXPECT_EQ(output(r, "q").flips_accepted, 1);
  ASSERT_EQ(output(r, "q").flips.size(), 1u);
  EXPECT_NE(output(r, "q").flips[0].find("boundary 0x1.3p+8"), std::string::npos) << output(r, "q").flips[0];
  EXPECT_NE(output(r, "q").reason.find("flips accepted: 1"), std::string::npos);
  got["q"].data[0] = other > c0 ? other + 1 : other - 1;  // two steps from the certified code
  r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_EQ(output(r, "q").failed, 1);
}

// The same midpoint under vLLM's contract (p rounded to bfloat16 first): the allowance of p is
// half a bfloat16 ulp plus the kernel's error, which reaches no other bfloat16 value, so p is
// exactly 304 and RNE decides: the other neighbour is a fault (vllm #51393's tie).
TEST(CheckerQuant, ATieOfAnExactActivationValueIsDecidedByRne) {
  ref::Case c = quant_case("vllm_static_fp8", 2, 16, DType::bfloat16, 3, 0.0);
  c.contract = "llama";
  c.inputs["x"].data.assign(32, 1.0);
  std::vector<double> w(16, 1.0);
  w[0] = 304;
  c.inputs["weight"].data = w;
  c.inputs["scale"].data = {1.0};
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  const int c0 = static_cast<int>(got["q"].data[0]);
  got["q"].data[0] = ref::encode(ref::Elem::e4m3fn, 288) == c0 ? ref::encode(ref::Elem::e4m3fn, 320)
                                                               : ref::encode(ref::Elem::e4m3fn, 288);
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::failed) << output(r, "q").reason;
}

TEST(CheckerQuant, AWrongScaleFails) {
  {  // dynamic per-token: one row's scale doubled
    const auto fc = fixture_of(quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 5));
    Outputs got = certified(fc);
    got["scale"].data[2] *= 2;
    const auto r = check_quant_case(fc, got);
    EXPECT_EQ(r.verdict, Verdict::failed);
    EXPECT_EQ(output(r, "scale").failed, 1);
    EXPECT_NE(output(r, "scale").reason.find("[2]: got"), std::string::npos) << output(r, "scale").reason;
  }
  {  // MX: one block's E8M0 exponent one up
    const auto fc = fixture_of(quant_case("ocp_mxfp8", 4, 64, DType::bfloat16, 6));
    Outputs got = certified(fc);
    got["scale"].data[3] += 1;
    const auto r = check_quant_case(fc, got);
    EXPECT_EQ(r.verdict, Verdict::failed);
    EXPECT_EQ(output(r, "scale").failed, 1);
  }
  {  // NVFP4: the global scale off by a factor of two
    const auto fc = fixture_of(quant_case("te_nvfp4", 4, 64, DType::bfloat16, 7));
    Outputs got = certified(fc);
    got["global_scale"].data[0] *= 2;
    EXPECT_EQ(check_quant_case(fc, got).verdict, Verdict::failed);
  }
}

// A dynamic scale from a float32 value (amax known to a few float32 ulps): the next float32
// scale is within its allowance; codes recomputed under it pass (judged against the
// candidate's own scale), while the certified codes kept under it are judged against it too.
TEST(CheckerQuant, AScaleWithinItsAllowanceJudgesTheCodesAgainstIt) {
  ref::Case c = quant_case("vllm_dynamic_fp8", 4, 256, DType::float32, 8);
  c.quant->value = ref::QuantValue::float32;
  const auto fc = fixture_of(c);
  const auto norm = ref::evaluate(ref::quant_norm_case(c));
  const auto& p = norm.outputs.at("y").value.data;
  Outputs got = certified(fc);
  const double s = got["scale"].data[1];
  const double s2 = std::nextafter(static_cast<float>(s), INFINITY);
  got["scale"].data[1] = s2;
  for (std::size_t i = 256; i < 512; ++i)
    got["q"].data[i] = ref::encode(ref::Elem::e4m3fn, ref::apply_scale(p[i], s2, ref::ScaleApply::divide));
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::passed) << output(r, "scale").reason << " / " << output(r, "q").reason;
  EXPECT_EQ(output(r, "q").own_scale, 1);
  EXPECT_EQ(output(r, "scale").own_scale, 1);
}

// Whatever a candidate writes, the checker answers with a verdict, never an exception: a zero,
// negative, NaN or infinite scale where the fixture leaves the scale to the kernel (a row
// holding a NaN) and where it does not.
TEST(CheckerQuant, AnyScaleValueGetsAVerdict) {
  ref::Case c = quant_case("vllm_dynamic_int8", 2, 64, DType::bfloat16, 10);
  c.inputs["x"].data[3] = NAN;
  const auto fc = fixture_of(c);
  for (const double s : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Outputs got = certified(fc);
    got["scale"].data[0] = got["scale"].data[1] = s;
    CaseResult r;
    EXPECT_NO_THROW(r = check_quant_case(fc, got)) << s;
    EXPECT_EQ(output(r, "scale").verdict, Verdict::failed) << s;  // row 1 is certified
  }
}

// Found by `normcheck prop` (agreement, cpu_welford, seed 1): RMSNorm of rows of ~1000 with a
// float16 compute dtype. x^2 overflows float16, so the tolerance model MISTRUSTS y (a correct
// kernel's accumulator may overflow, and Welford's then gives NaN); the code of such an element
// is MISTRUSTED too, whatever the kernel gives, a NaN code included, as check_case leaves that
// element of y uncompared. Where y is exactly NaN, a NaN code is still required.
TEST(CheckerQuant, ACodeWhoseValueIsMistrustedIsNotJudgedEvenIfNaN) {
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::none;
  c.epsilon = 0x1.4f8b588e368f1p-17;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = DType::float32;
  c.dtype_compute = DType::float16;
  c.inputs["x"] = ref::Tensor{DType::float32, {1, 2, 2}, {0x1.f1afbp+9, 0x1.f48b9ep+9, 0x1.e95d6p+9, 0x1.f1be9cp+9}};
  c.quant = ref::QuantContract{};  // E4M3FN, static per-tensor scale, y rounded to dtype_out
  c.inputs["scale"] = ref::Tensor{DType::float32, {1}, {1.0}};
  ASSERT_TRUE(std::isnan(derive_allowances(ref::quant_norm_case(c)).at("y").abs[0])) << "the premise: y MISTRUSTED";
  const auto fc = fixture_of(c);
  ASSERT_EQ(fc.expected.at("q").value.data[0], 0x38);  // y ~ 1: code 1.0
  Outputs got = certified(fc);
  for (auto& v : got["q"].data) v = 0x7F;  // NaN codes (Welford's inf - inf)
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(output(r, "q").verdict, Verdict::mistrusted) << output(r, "q").reason;
  EXPECT_EQ(output(r, "q").failed, 0);
  EXPECT_EQ(output(r, "q").mistrusted, 4);
  EXPECT_NE(r.verdict, Verdict::failed);

  // A NaN in x: that row's y is exactly NaN, and a finite code there fails (fminf(NaN, 448)).
  c.dtype_compute = DType::float32;
  c.inputs["x"].data = {1.0, std::numeric_limits<double>::quiet_NaN(), 2.0, 3.0};
  const auto fn = fixture_of(c);
  Outputs nan_got = certified(fn);
  ASSERT_EQ(nan_got["q"].data[0], 0x7F);
  nan_got["q"].data[0] = 0x7E;  // +448
  EXPECT_EQ(check_quant_case(fn, nan_got).verdict, Verdict::failed);
}

// A NaN of the exact arithmetic, not of the input: LayerNorm of constant rows with eps 0 is 0/0,
// but with bfloat16 compute the tolerance model MISTRUSTS y (a kernel's sums of 512 ones in
// bfloat16 stop at 256, so its variance is not 0 and its y a number), so its codes are not judged
// either (property_tests/findings/quant_constant_rows_eps0_bf16_compute.h5).
TEST(CheckerQuant, AnExactNaNOfAMistrustedValueIsNotJudged) {
  ref::Case c;
  c.op = ref::Op::layernorm;
  c.affine = ref::Affine::none;
  c.epsilon = 0;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = DType::float32;
  c.dtype_compute = DType::bfloat16;
  c.inputs["x"] = ref::Tensor{DType::float32, {2, 512}, std::vector<double>(1024, 1.0)};
  c.quant = ref::quant_preset("te_mxfp8");
  ASSERT_TRUE(std::isnan(derive_allowances(ref::quant_norm_case(c)).at("y").abs[0])) << "the premise: y MISTRUSTED";
  const auto fc = fixture_of(c);
  ASSERT_EQ(fc.expected.at("q").value.data[0], 0x7F);  // y = 0/0: the NaN code
  Outputs got = certified(fc);
  for (auto& v : got["q"].data) v = 0x74;  // a number, as a bfloat16-compute kernel gives
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(output(r, "q").verdict, Verdict::mistrusted) << output(r, "q").reason;
  EXPECT_EQ(output(r, "q").failed, 0);
}

// int8: the reference saturates at -127, a kernel converting with cvt.rni.sat.s8 (vLLM's
// float_to_int8_rn) at -128. Where a value p within y's allowance gives u <= -127.5, -128 is a
// correct kernel's code (property_tests/findings/quant_int8_static_saturates_at_minus_128.h5);
// where none does, -128 still fails.
TEST(CheckerQuant, Int8MinusOneTwentyEightWhereTheAllowanceReachesIt) {
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::weight;
  c.epsilon = 0;  // RMSNorm of +-1: rstd 1, y = x * w exactly
  c.dtype_x = c.dtype_out = c.dtype_residual = DType::bfloat16;
  c.dtype_param = DType::float32;
  c.dtype_compute = DType::float32;
  // y = -(127.5 - 2^-16), one float32 ulp above -127.5, within a float32 kernel's allowance of it;
  // y = -127: far from it.
  c.inputs["x"] = ref::Tensor{DType::bfloat16, {1, 4}, {-1, -1, 1, 1}};
  c.inputs["weight"] = ref::Tensor{DType::float32, {4}, {127.5 - 0x1p-16, 127, 3, 5}};
  ref::QuantContract q;
  q.format = ref::QFormat::int8;
  q.scale = ref::ScaleKind::static_tensor;
  q.value = ref::QuantValue::float32;  // p in float32: its allowance is a few float32 ulps
  c.quant = q;
  c.inputs["scale"] = ref::Tensor{DType::float32, {1}, {1.0}};
  const auto fc = fixture_of(c);
  ASSERT_EQ(fc.expected.at("q").value.data[0], -127);
  ASSERT_EQ(fc.expected.at("q").value.data[1], -127);
  ASSERT_TRUE(fc.expected.at("q").certified[0]);
  Outputs got = certified(fc);
  got["q"].data[0] = -128;
  const auto r = check_quant_case(fc, got);
  EXPECT_EQ(r.verdict, Verdict::passed) << output(r, "q").reason;
  EXPECT_EQ(output(r, "q").flips_accepted, 1);
  got = certified(fc);
  got["q"].data[1] = -128;  // y = -127 exactly: no value within the allowance reaches -127.5
  EXPECT_EQ(output(check_quant_case(fc, got), "q").verdict, Verdict::failed);
}

TEST(CheckerQuant, MissingAndMalformedOutputs) {
  const auto fc = fixture_of(quant_case("vllm_dynamic_int8", 2, 64, DType::bfloat16, 9));
  Outputs got = certified(fc);
  got.erase("scale");
  auto r = check_quant_case(fc, got);
  EXPECT_EQ(output(r, "scale").verdict, Verdict::missing);
  got = certified(fc);
  got["q"].shape = {2, 32, 2};
  r = check_quant_case(fc, got);
  EXPECT_EQ(output(r, "q").verdict, Verdict::failed);
  EXPECT_TRUE(output(r, "q").malformed);
}

}  // namespace
}  // namespace normcheck::conf
