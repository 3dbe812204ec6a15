// The CPU kernels on fused norm + quantization cases (quant_kernel.cpp), judged by the judge's
// checker for quantized outputs against the certified reference: every correct kernel passes
// every preset; every quantization mutant (class H) fails on an input that shows its fault and
// is the correct kernel, bit for bit, where the fault does not apply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "../../../judge/tests/test_cases.hpp"

namespace normcheck::conf::cpu {
namespace {

using ref::DType;

// RMSNorm with weight of N(0,1) rows (N(1, 0.5) weight) of dtype `dt`, quantized by `preset`.
ref::Case quant_case(const char* preset, std::int64_t rows, std::int64_t cols, DType dt, std::uint64_t seed,
                     double scale = 0.0078125) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> z;
  ref::Case c;
  c.op = ref::Op::rmsnorm;
  c.affine = ref::Affine::weight;
  c.epsilon = 1e-6;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = dt;
  c.dtype_compute = DType::float32;
  std::vector<double> x(static_cast<std::size_t>(rows * cols)), w(static_cast<std::size_t>(cols));
  for (auto& v : x) v = ref::round_to(z(rng), dt);
  for (auto& v : w) v = ref::round_to(1 + 0.5 * z(rng), dt);
  c.inputs["x"] = ref::Tensor{dt, {rows, cols}, x};
  c.inputs["weight"] = ref::Tensor{dt, {cols}, w};
  c.quant = ref::quant_preset(preset);
  if (std::string(preset).rfind("vllm", 0) == 0) c.contract = "llama";
  if (c.quant->scale == ref::ScaleKind::static_tensor) c.inputs["scale"] = ref::Tensor{DType::float32, {1}, {scale}};
  return c;
}

CaseResult judge(const ref::Case& c, Reduction r, Fault f) {
  return check_quant_case(test::fixture_of(c), run_kernel(c, r, f));
}

std::string reasons(const CaseResult& res) {
  std::string s;
  for (const auto& o : res.outputs)
    if (!o.reason.empty()) s += o.name + ": " + o.reason + "\n";
  return s;
}

TEST(QuantKernels, EveryPresetEveryReductionPasses) {
  std::uint64_t seed = 1;
  for (const auto& [name, q] : ref::quant_presets())
    for (const DType dt : {DType::bfloat16, DType::float16, DType::float32}) {
      ref::Case c = quant_case(name.c_str(), 8, 128, dt, seed++);
      c.inputs["x"].data[5] = 0;  // an exact zero: +0, code 0
      for (std::size_t j = 0; j < 128; ++j) c.inputs["x"].data[3 * 128 + j] = 0;  // an all-zero row
      for (const Reduction r : {Reduction::two_pass, Reduction::welford, Reduction::pairwise}) {
        const CaseResult res = judge(c, r, Fault{});
        EXPECT_EQ(res.verdict, Verdict::passed) << name << " " << ref::name_of(dt) << " " << name_of(r) << "\n"
                                                << reasons(res);
      }
    }
}

TEST(QuantKernels, NanRowsGiveTheNanCode) {
  ref::Case c = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 2);
  c.inputs["x"].data[70] = NAN;
  EXPECT_EQ(judge(c, Reduction::two_pass, Fault{}).verdict, Verdict::passed);
  EXPECT_EQ(judge(c, Reduction::two_pass, fault("nan_encoded_as_max")).verdict, Verdict::failed);
}

void expect_reveals(const ref::Case& c, Fault f, const char* output) {
  const CaseResult res = judge(c, Reduction::two_pass, f);
  EXPECT_EQ(res.verdict, Verdict::failed) << name_of(f) << "\n" << reasons(res);
  for (const auto& o : res.outputs)
    if (o.name == output) {
      EXPECT_GT(o.failed, 0) << name_of(f) << ": " << output << " not failed";
    }
  EXPECT_EQ(judge(c, Reduction::two_pass, Fault{}).verdict, Verdict::passed) << name_of(f);
}

// Outside quantized cases, and where the fault's condition never arises, the mutant is the
// correct kernel bit for bit.
void expect_agrees(const ref::Case& c, Fault f) {
  const Outputs a = run_kernel(c, Reduction::two_pass, f), b = run_kernel(c, Reduction::two_pass);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const auto& u = b.at(name).data;
    for (std::size_t i = 0; i < t.data.size(); ++i)
      EXPECT_TRUE(t.data[i] == u[i] || (std::isnan(t.data[i]) && std::isnan(u[i]))) << name_of(f) << " " << name;
  }
}

TEST(QuantMutants, EachIsRejectedWhereItsFaultShowsAndAgreesElsewhere) {
  ref::Case plain = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 3);
  plain.quant.reset();
  plain.inputs.erase("scale");
  for (const Fault f : {fault("activation_rounding_elided"), fault("e5m2_clamped_448"), fault("nan_encoded_as_max"),
                        fault("mx_rule_swapped"), fault("min_scale_missing"), fault("e4m3fnuz_max"),
                        fault("bf16_round_trip_before_fp8"), fault("amax_unrounded"), fault("reciprocal_for_divide"),
                        fault("mx_block_wrong_dim"), fault("stochastic_rounding_forward")})
    expect_agrees(plain, f);
  // The rounding to bfloat16 skipped: ~1 code in 60 sits between y and rn_bf16(y).
  expect_reveals(quant_case("vllm_static_fp8", 16, 256, DType::bfloat16, 4), fault("activation_rounding_elided"), "q");
  ref::Case e5 = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 5, 0x1p-10);  // u up to ~4000
  e5.quant->format = ref::QFormat::float8_e5m2;
  expect_reveals(e5, fault("e5m2_clamped_448"), "q");
  expect_agrees(quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 5), fault("e5m2_clamped_448"));
  ref::Case nan = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 6);
  nan.inputs["x"].data[3] = NAN;
  expect_reveals(nan, fault("nan_encoded_as_max"), "q");
  expect_agrees(quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 6), fault("nan_encoded_as_max"));
  expect_reveals(quant_case("ocp_mxfp8", 16, 256, DType::bfloat16, 7), fault("mx_rule_swapped"), "scale");
  expect_reveals(quant_case("te_mxfp8", 16, 256, DType::bfloat16, 7), fault("mx_rule_swapped"), "scale");
  ref::Case zero = quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 8);
  for (std::size_t j = 0; j < 64; ++j) zero.inputs["x"].data[64 + j] = 0;
  expect_reveals(zero, fault("min_scale_missing"), "scale");
  expect_agrees(quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 8), fault("min_scale_missing"));
  expect_reveals(quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 9), fault("e4m3fnuz_max"), "scale");
  expect_agrees(quant_case("vllm_dynamic_int8", 4, 64, DType::bfloat16, 9), fault("e4m3fnuz_max"));
}

TEST(QuantMutants, TheSecondFiveAreRejectedWhereTheirFaultsShowAndAgreeElsewhere) {
  // A float32 value quantized through bfloat16: ~1 value in 100 lies between an E4M3 midpoint and
  // the bfloat16 value that rounds onto it.
  expect_reveals(quant_case("flashinfer_fp8", 16, 256, DType::bfloat16, 10), fault("bf16_round_trip_before_fp8"), "q");
  ref::Case e5 = quant_case("flashinfer_fp8", 16, 256, DType::bfloat16, 10);
  e5.quant->format = ref::QFormat::float8_e5m2;  // the E5M2 cast never went through bfloat16
  expect_agrees(e5, fault("bf16_round_trip_before_fp8"));
  // amax of the float32 values: per-token scales and NVFP4's global and block scales move.
  expect_reveals(quant_case("vllm_dynamic_fp8", 16, 256, DType::bfloat16, 11), fault("amax_unrounded"), "scale");
  expect_reveals(quant_case("te_nvfp4", 16, 256, DType::bfloat16, 11), fault("amax_unrounded"), "global_scale");
  expect_agrees(quant_case("flashinfer_fp8", 4, 64, DType::bfloat16, 11), fault("amax_unrounded"));  // value in float32
  expect_reveals(quant_case("vllm_dynamic_fp8", 16, 256, DType::bfloat16, 12), fault("reciprocal_for_divide"), "q");
  expect_agrees(quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 12), fault("reciprocal_for_divide"));
  expect_reveals(quant_case("te_mxfp8", 16, 256, DType::bfloat16, 13), fault("mx_block_wrong_dim"), "scale");
  expect_reveals(quant_case("ocp_mxfp8", 16, 256, DType::bfloat16, 13), fault("mx_block_wrong_dim"), "scale");
  expect_agrees(quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 13), fault("mx_block_wrong_dim"));
  expect_reveals(quant_case("vllm_static_fp8", 16, 256, DType::bfloat16, 14), fault("stochastic_rounding_forward"), "q");
  expect_reveals(quant_case("vllm_dynamic_int8", 16, 256, DType::bfloat16, 14), fault("stochastic_rounding_forward"),
                 "q");
}

// The diagnosis of class H (judge/diagnosis/quant.cpp) names each mutant's fault on the inputs
// that show it: as its best explaining dialect, or one that predicts the same outputs there.
void expect_named(const ref::Case& c, Fault f) {
  const fix::FixtureCase fc = test::fixture_of(c);
  const Outputs got = run_kernel(c, Reduction::two_pass, f);
  const CaseResult res = check_quant_case(fc, got);
  ASSERT_EQ(res.verdict, Verdict::failed) << name_of(f);
  const auto d = diagnose_quant(fc, got, res);
  ASSERT_FALSE(d.empty()) << name_of(f);
  EXPECT_TRUE(d[0].explains) << name_of(f) << ": " << d[0].dialect << " " << d[0].evidence;
  std::vector<std::string> names{d[0].dialect};
  names.insert(names.end(), d[0].same_as.begin(), d[0].same_as.end());
  EXPECT_NE(std::find(names.begin(), names.end(), std::string(name_of(f))), names.end())
      << name_of(f) << " named as " << d[0].dialect << ": " << d[0].evidence;
}

TEST(QuantDiagnosis, EachMutantIsNamedWhereItShows) {
  expect_named(quant_case("vllm_static_fp8", 16, 256, DType::bfloat16, 4), fault("activation_rounding_elided"));
  ref::Case e5 = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 5, 0x1p-10);
  e5.quant->format = ref::QFormat::float8_e5m2;
  expect_named(e5, fault("e5m2_clamped_448"));
  ref::Case nan = quant_case("vllm_static_fp8", 4, 64, DType::bfloat16, 6);
  nan.inputs["x"].data[3] = NAN;
  expect_named(nan, fault("nan_encoded_as_max"));
  expect_named(quant_case("ocp_mxfp8", 16, 256, DType::bfloat16, 7), fault("mx_rule_swapped"));
  ref::Case zero = quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 8);
  for (std::size_t j = 0; j < 64; ++j) zero.inputs["x"].data[64 + j] = 0;
  expect_named(zero, fault("min_scale_missing"));
  expect_named(quant_case("vllm_dynamic_fp8", 4, 64, DType::bfloat16, 9), fault("e4m3fnuz_max"));
  expect_named(quant_case("flashinfer_fp8", 16, 256, DType::bfloat16, 10), fault("bf16_round_trip_before_fp8"));
  expect_named(quant_case("vllm_dynamic_fp8", 16, 256, DType::bfloat16, 11), fault("amax_unrounded"));
  expect_named(quant_case("te_nvfp4", 16, 256, DType::bfloat16, 11), fault("amax_unrounded"));
  expect_named(quant_case("vllm_dynamic_fp8", 16, 256, DType::bfloat16, 12), fault("reciprocal_for_divide"));
  expect_named(quant_case("te_mxfp8", 16, 256, DType::bfloat16, 13), fault("mx_block_wrong_dim"));
  expect_named(quant_case("vllm_static_fp8", 16, 256, DType::bfloat16, 14), fault("stochastic_rounding_forward"));
  expect_named(quant_case("vllm_dynamic_int8", 16, 256, DType::bfloat16, 14), fault("stochastic_rounding_forward"));
}

// A fault of the norm shows in the codes too; no quantization fault may take the blame (the
// stochastic-rounding dialect, whose pair of codes also holds a slightly wrong value's code, least
// of all).
TEST(QuantDiagnosis, NormFaultsAreNotNamedAsQuantizationFaults) {
  int failed = 0;
  for (const char* preset : {"vllm_static_fp8", "vllm_dynamic_fp8", "vllm_dynamic_int8", "ocp_mxfp8", "te_nvfp4"})
    for (const Fault f : {fault("rstd_bf16"), fault("rms_centred"), fault("weight_before_downcast")}) {
      const ref::Case c = quant_case(preset, 16, 256, DType::bfloat16, 15);
      const fix::FixtureCase fc = test::fixture_of(c);
      const Outputs got = run_kernel(c, Reduction::two_pass, f);
      const CaseResult res = check_quant_case(fc, got);
      if (res.verdict != Verdict::failed) continue;
      ++failed;
      for (const auto& d : diagnose_quant(fc, got, res))
        EXPECT_FALSE(d.explains) << preset << " " << name_of(f) << ": " << d.dialect << " " << d.evidence;
    }
  EXPECT_GE(failed, 8);  // the faults show on most of these cases
}

}  // namespace
}  // namespace normcheck::conf::cpu
