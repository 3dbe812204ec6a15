// Quantization: formats, scale rules, and whole quant cases with hand-derived codes.
//
// Golden values come from the format specifications (OCP 8-bit FP spec, OCP MX spec v1.0, the
// E2M1 value table) and from hand derivations written next to them, never from the code under
// test; quant_crosscheck.py checks every code against an independent brute-force encoder.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <random>

#include "exact.hpp"
#include "normcheck/reference/case_json.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/outputs.hpp"
#include "normcheck/reference/quant.hpp"
#include "test_util.hpp"

namespace normcheck::ref {
namespace {

using testing::tensor;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(QuantFormat, SpecValuesOfE4M3FNAndE5M2) {
  // OCP 8-bit FP: E4M3 max S.1111.110 = 448, S.1111.111 NaN, min normal 2^-6, min subnormal 2^-9.
  EXPECT_EQ(decode(Elem::e4m3fn, 0x7E), 448);
  EXPECT_TRUE(std::isnan(decode(Elem::e4m3fn, 0x7F)));
  EXPECT_TRUE(std::isnan(decode(Elem::e4m3fn, 0xFF)));
  EXPECT_EQ(decode(Elem::e4m3fn, 0x08), 0x1p-6);
  EXPECT_EQ(decode(Elem::e4m3fn, 0x01), 0x1p-9);
  EXPECT_EQ(decode(Elem::e4m3fn, 0xFE), -448);
  EXPECT_TRUE(std::signbit(decode(Elem::e4m3fn, 0x80)));
  // E5M2: max S.11110.11 = 57344, S.11111.00 Inf, S.11111.{01,10,11} NaN, min subnormal 2^-16.
  EXPECT_EQ(decode(Elem::e5m2, 0x7B), 57344);
  EXPECT_EQ(decode(Elem::e5m2, 0x7C), kInf);
  EXPECT_EQ(decode(Elem::e5m2, 0xFC), -kInf);
  for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(is_nan_code(Elem::e5m2, c)) << c;
  EXPECT_EQ(decode(Elem::e5m2, 0x01), 0x1p-16);
  EXPECT_EQ(decode(Elem::e5m2, 0x04), 0x1p-14);
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += is_nan_code(Elem::e4m3fn, c);
  EXPECT_EQ(nans, 2);  // E4M3FN: one NaN per sign
}

TEST(QuantFormat, AllSixteenE2M1Codes) {
  // OCP MX spec, FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (sign bit 0x8).
  const double table[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const double v = decode(Elem::e2m1, c);
    EXPECT_EQ(v, c < 8 ? table[c] : -table[c - 8]) << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << c;
    EXPECT_EQ(encode(Elem::e2m1, v), c) << c;
  }
  EXPECT_TRUE(std::isnan(decode(Elem::e2m1, 16)));
  // Midpoints, ties to the even code: 0.25 -> 0, 0.75 -> 1 (0x2), 1.25 -> 1 (0x2), 1.75 -> 2
  // (0x4), 2.5 -> 2 (0x4), 3.5 -> 4 (0x6), 5 -> 4 (0x6); beyond 6 saturates.
  EXPECT_EQ(encode(Elem::e2m1, 0.25), 0x0);
  EXPECT_EQ(encode(Elem::e2m1, 0.75), 0x2);
  EXPECT_EQ(encode(Elem::e2m1, 1.25), 0x2);
  EXPECT_EQ(encode(Elem::e2m1, 1.75), 0x4);
  EXPECT_EQ(encode(Elem::e2m1, 2.5), 0x4);
  EXPECT_EQ(encode(Elem::e2m1, 3.5), 0x6);
  EXPECT_EQ(encode(Elem::e2m1, 5), 0x6);
  EXPECT_EQ(encode(Elem::e2m1, 5.0000001), 0x7);
  EXPECT_EQ(encode(Elem::e2m1, 1e30), 0x7);
  EXPECT_EQ(encode(Elem::e2m1, -7), 0xF);
  EXPECT_EQ(encode(Elem::e2m1, -0.1), 0x8);  // -0
}

TEST(QuantFormat, TiesAndSaturation) {
  // 304 lies halfway between 288 (0x79, mantissa 001) and 320 (0x7A, mantissa 010): even -> 320
  // (the tie of vLLM #51393).
  EXPECT_EQ(encode(Elem::e4m3fn, 304), 0x7A);
  EXPECT_EQ(encode(Elem::e4m3fn, std::nextafter(304.0, 0.0)), 0x79);
  EXPECT_EQ(encode(Elem::e4m3fn, 272), 0x78);  // between 256 (0x78) and 288 (0x79): even -> 256
  // E4M3FN saturates: 464 (the midpoint to a nonexistent 480), 1e6 and Inf all give 448.
  EXPECT_EQ(encode(Elem::e4m3fn, 464), 0x7E);
  EXPECT_EQ(encode(Elem::e4m3fn, 1e6), 0x7E);
  EXPECT_EQ(encode(Elem::e4m3fn, kInf), 0x7E);
  EXPECT_EQ(encode(Elem::e4m3fn, -kInf), 0xFE);
  EXPECT_EQ(encode(Elem::e4m3fn, kNaN), 0x7F);
  // Subnormals: 2^-10 is halfway between 0 and 2^-9: even -> 0; 3*2^-10 -> 2^-8 (0x02).
  EXPECT_EQ(encode(Elem::e4m3fn, 0x1p-10), 0x00);
  EXPECT_EQ(encode(Elem::e4m3fn, 0x1.8p-9), 0x02);
  EXPECT_EQ(encode(Elem::e4m3fn, -0x1p-11), 0x80);
  // E5M2 with SATFINITE: 61440 (the midpoint to Inf) and Inf give 57344, never 0x7C.
  EXPECT_EQ(encode(Elem::e5m2, 61440), 0x7B);
  EXPECT_EQ(encode(Elem::e5m2, kInf), 0x7B);
  EXPECT_EQ(encode(Elem::e5m2, 448), 0x5F);  // 448 = 1.75 * 2^8: exponent 23 = 10111, mantissa 11
  EXPECT_EQ(encode(Elem::e5m2, kNaN), 0x7F);
  // int8: round half to even, saturating at +-127.
  EXPECT_EQ(encode(Elem::int8, 2.5), 2);
  EXPECT_EQ(encode(Elem::int8, 3.5), 4);
  EXPECT_EQ(encode(Elem::int8, -2.5), -2);
  EXPECT_EQ(encode(Elem::int8, -0.4), 0);
  EXPECT_EQ(encode(Elem::int8, 126.5), 126);
  EXPECT_EQ(encode(Elem::int8, 127.5), 127);
  EXPECT_EQ(encode(Elem::int8, 300), 127);
  EXPECT_EQ(encode(Elem::int8, -300), -127);
}

TEST(QuantFormat, CodeRangeOverAnInterval) {
  // [300, 303] stays below 304: one code; touching the tie makes it uncertain.
  auto r = code_range(Elem::e4m3fn, 300, 303);
  EXPECT_TRUE(r.certain);
  EXPECT_EQ(r.lo_code, 0x79);
  r = code_range(Elem::e4m3fn, 300, 304);
  EXPECT_FALSE(r.certain);
  EXPECT_EQ(r.hi_code, 0x7A);
  r = code_range(Elem::e4m3fn, 304, 304);  // exactly on the boundary: any error moves it
  EXPECT_FALSE(r.certain);
  r = code_range(Elem::e4m3fn, -0x1p-12, 0x1p-12);  // across zero: -0 and +0
  EXPECT_FALSE(r.certain);
  r = code_range(Elem::int8, -0.25, 0.25);  // int8 has one zero
  EXPECT_TRUE(r.certain);
  r = code_range(Elem::e4m3fn, 448, 1e9);  // saturation: no boundary above 448
  EXPECT_TRUE(r.certain);
}

TEST(QuantFormat, Nvfp4PackingIsLowNibbleFirst) {
  const std::vector<int> codes{0x1, 0xF, 0x7, 0x8};
  const auto bytes = pack_nvfp4(codes);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes[0], 0xF1);
  EXPECT_EQ(bytes[1], 0x87);
  EXPECT_EQ(unpack_nvfp4(bytes), codes);
  EXPECT_THROW(pack_nvfp4({1, 2, 3}), std::invalid_argument);
}

TEST(QuantScale, E8M0FloorAndRoundUpRules) {
  // E8M0 value 2^(code-127); 0xFF NaN.
  EXPECT_EQ(decode(Elem::e8m0, 127), 1);
  EXPECT_EQ(decode(Elem::e8m0, 0), 0x1p-127);
  EXPECT_EQ(decode(Elem::e8m0, 254), 0x1p127);
  EXPECT_TRUE(std::isnan(decode(Elem::e8m0, 255)));
  // Floor (OCP): 2^(floor(log2 amax) - 8) for E4M3. 448 -> 2^0; 449 and 480 -> 2^0 too (they
  // then saturate to 448); 512 -> 2^1.
  EXPECT_EQ(mx_scale_code(448, Elem::e4m3fn, MxRule::floor), 127);
  EXPECT_EQ(mx_scale_code(480, Elem::e4m3fn, MxRule::floor), 127);
  EXPECT_EQ(mx_scale_code(512, Elem::e4m3fn, MxRule::floor), 128);
  EXPECT_EQ(mx_scale_code(6, Elem::e2m1, MxRule::floor), 127);      // emax E2M1 = 2
  EXPECT_EQ(mx_scale_code(57344, Elem::e5m2, MxRule::floor), 127);  // emax E5M2 = 15
  // amax 0 -> FP32_MIN_NORMAL: floor = -126, -126 - 8 clamps to -127 (code 0).
  EXPECT_EQ(mx_scale_code(0, Elem::e4m3fn, MxRule::floor), 0);
  EXPECT_EQ(mx_scale_code(kNaN, Elem::e4m3fn, MxRule::floor), 0xFF);
  EXPECT_EQ(mx_scale_code(0x1p127, Elem::e4m3fn, MxRule::floor), 127 + 119);
  // Round-up (TE): rn32(amax * rn32(1/448)) rounded up to a power of two. rn32(1/448) =
  // 0x1.24924ap-9 (> 1/448), so 448 * it = 1 + 4.5e-8 rounds to 1.0f: code 127. 449 and 480
  // need 2^1: code 128 (480 / 2 = 240, no saturation).
  EXPECT_EQ(mx_scale_code(448, Elem::e4m3fn, MxRule::round_up), 127);
  EXPECT_EQ(mx_scale_code(449, Elem::e4m3fn, MxRule::round_up), 128);
  EXPECT_EQ(mx_scale_code(480, Elem::e4m3fn, MxRule::round_up), 128);
  EXPECT_EQ(mx_scale_code(0, Elem::e4m3fn, MxRule::round_up), 0);
  // FLT_MAX / 448 = 2^128 / 2^8.807 = 2^119.19: up to 2^120.
  EXPECT_EQ(mx_scale_code(0x1.fffffep127, Elem::e4m3fn, MxRule::round_up), 127 + 120);
}

TEST(QuantScale, DynamicScaleAndDefaults) {
  // vLLM: min_scale = 1.0f / (448 * 512.f) = rn32(1/229376); int8 FLT_EPSILON.
  EXPECT_EQ(default_min_scale(QFormat::float8_e4m3fn), static_cast<double>(1.0f / (448.0f * 512.0f)));
  EXPECT_EQ(default_min_scale(QFormat::int8), FLT_EPSILON);
  QuantContract q = *quant_preset("vllm_dynamic_fp8");
  EXPECT_EQ(dynamic_scale(0, q), q.min_scale);  // amax 0: min_scale, never a zero scale
  EXPECT_EQ(dynamic_scale(448, q), 1.0);
  EXPECT_EQ(dynamic_scale(896, q), 2.0);
  q.scale_ub = 448;
  EXPECT_EQ(dynamic_scale(896, q), 1.0);  // min(amax, ub)
  q = *quant_preset("vllm_dynamic_int8");
  EXPECT_EQ(dynamic_scale(254, q), 2.0);
}

TEST(QuantScale, Nvfp4GlobalAndBlockScales) {
  // amax_g = 6: S_enc = 2688 / 6 = 448. Block amax 6: rn32(448 * rn32(1/6)) = 74.666672f, times 6
  // = 448.00003 (rn32) -> E4M3 448 (0x7E). Multiplier: rn32(448 * rn32(1/448)) = 1, 1/1 = 1.
  EXPECT_EQ(nvfp4_global_scale(6), 448);
  EXPECT_EQ(nvfp4_global_scale(0), 1);
  EXPECT_EQ(nvfp4_block_scale_code(6, 448), 0x7E);
  EXPECT_EQ(nvfp4_element_multiplier(0x7E, 448), 1.0);
  EXPECT_EQ(nvfp4_block_scale_code(0, 448), 0x00);
  EXPECT_EQ(nvfp4_element_multiplier(0x00, 448), 0.0);
}

// ---- whole cases -------------------------------------------------------------------------
// RMSNorm, eps 0, x = +-1 alternating: mean square 1, rstd 1 exactly, so y = x * w exactly and
// the weights choose the values that are quantized.
Case quant_case(std::vector<double> w, const QuantContract& q, DType t = DType::bfloat16, std::int64_t rows = 1) {
  const auto n = static_cast<std::int64_t>(w.size());
  std::vector<double> x;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < n; ++i) x.push_back(i % 2 ? -1.0 : 1.0);
  Case c = testing::simple_case(Op::rmsnorm, rows, n, x, t);
  c.epsilon = 0;
  testing::set_affine(c, std::move(w));
  c.quant = q;
  if (q.scale == ScaleKind::static_tensor) c.inputs["scale"] = tensor(DType::float32, {1}, {1.0});
  return c;
}

TEST(QuantCase, StaticFp8CodesAndTieMask) {
  // y = [304, -304, 2, -500]: 304 is a tie (RNE -> 320, 0x7A); -304 -> 0xFA; 2 -> 0x40 (exponent
  // 1+7 = 8 = 1000, mantissa 0); -(-500) ... y_3 = -1 * -500 = 500 saturates to 448 (0x7E).
  Case c = quant_case({304, 304, 2, -500}, *quant_preset("vllm_static_fp8"));
  validate(c);
  const Result r = evaluate(c);
  const Output& q = r.outputs.at("q");
  EXPECT_EQ(q.codes, "float8_e4m3fn");
  ASSERT_EQ(q.value.data.size(), 4u);
  EXPECT_EQ(q.value.data[0], 0x7A);
  EXPECT_EQ(q.value.data[1], 0xFA);
  EXPECT_EQ(q.value.data[2], 0x40);
  EXPECT_EQ(q.value.data[3], 0x7E);
  // Every code certified: y is exact in bfloat16 and the contract's value is exactly y * 1.
  for (auto k : q.certified) EXPECT_EQ(k, 1);
  // The exact value 304 lies on a boundary; 2 and 500 do not.
  EXPECT_EQ(q.ties[0], 1);
  EXPECT_EQ(q.ties[1], 1);
  EXPECT_EQ(q.ties[2], 0);
  EXPECT_EQ(q.ties[3], 0);
  EXPECT_EQ(q.f64[0], 304);
  EXPECT_EQ(q.f64[3], 500);
  EXPECT_EQ(r.outputs.count("scale"), 0u);  // a static scale is an input
  EXPECT_EQ(r.outputs.count("y"), 0u);
}

TEST(QuantCase, ExactZerosAreTiesInSignMagnitudeFormatsOnly) {
  // y = [0, -0, 1, -1]: +0 and -0 have different E4M3 codes and the sign of an exact zero is not
  // certified, so both zeros are ties; int8 has one zero, so none.
  const Result r = evaluate(quant_case({0, 0, 1, 1}, QuantContract{}));
  EXPECT_EQ(r.outputs.at("q").ties, (std::vector<std::uint8_t>{1, 1, 0, 0}));
  QuantContract i8;
  i8.format = QFormat::int8;
  const Result ri = evaluate(quant_case({0, 0, 1, 1}, i8));
  EXPECT_EQ(ri.outputs.at("q").ties, (std::vector<std::uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(ri.outputs.at("q").value.data[0], 0);
}

TEST(QuantCase, StaticScaleReciprocalDivideMultiply) {
  // y = 3 with scale 3: reciprocal rn32(1/3) = 0x1.555556p-2 (> 1/3), 3 * it = 1.0000000298,
  // which rn32 rounds to 1 (half an ulp of 1 is 5.96e-8): code 0x38. Division gives exactly 1:
  // 0x38. Multiply (TE) gives 9: 0x51 (9 = 1.125 * 8: exponent 10 = 1010, mantissa 001).
  for (auto [apply, code] : {std::pair{ScaleApply::reciprocal, 0x38}, std::pair{ScaleApply::divide, 0x38},
                             std::pair{ScaleApply::multiply, 0x51}}) {
    QuantContract qc;
    qc.apply = apply;
    Case c = quant_case({3, -3}, qc);
    c.inputs["scale"] = tensor(DType::float32, {1}, {3.0});
    const Result r = evaluate(c);
    EXPECT_EQ(r.outputs.at("q").value.data[0], code) << name_of(apply);
  }
}

TEST(QuantCase, DynamicPerTokenFp8ZeroAndNaNRows) {
  // eps = 2^-30: row 0's rstd is 1 - 2^-31 and bf16 rounds y back to [224, -448, 1, 0].
  // Row 0: amax 448, scale 448/448 = 1: codes 224 -> 0x76 (1.75 * 2^7), -448 -> 0xFE.
  // Row 1: all zero: amax 0, scale = min_scale (never 0), codes 0.
  // Row 2: a NaN makes the whole row's y NaN: every code is the NaN code 0x7F whatever the
  // scale, but the scale itself is not judged (fmaxf drops NaN, torch.amax keeps it).
  QuantContract qc = *quant_preset("vllm_dynamic_fp8");
  qc.amax = true;
  Case c = testing::simple_case(Op::rmsnorm, 3, 4, {1, -1, 1, -1, 0, 0, 0, 0, 1, kNaN, 1, 1}, DType::bfloat16);
  c.epsilon = 0;
  testing::set_affine(c, {224, 448, 1, 0});
  c.quant = qc;
  c.epsilon = 0x1p-30;
  validate(c);
  const Result r = evaluate(c);
  const Output& s = r.outputs.at("scale");
  ASSERT_EQ(s.value.data.size(), 3u);
  EXPECT_EQ(s.value.data[0], 1);
  EXPECT_EQ(s.certified[0], 1);
  EXPECT_EQ(s.value.data[1], qc.min_scale);
  EXPECT_EQ(s.certified[1], 1);
  EXPECT_EQ(s.certified[2], 0);
  const Output& q = r.outputs.at("q");
  for (int i = 4; i < 8; ++i) {
    EXPECT_EQ(q.value.data[i], 0) << i;
    EXPECT_EQ(q.certified[i], 1) << i;
  }
  EXPECT_EQ(q.value.data[0], 0x76);
  EXPECT_EQ(q.value.data[1], 0xFE);
  for (int i = 8; i < 12; ++i) {
    EXPECT_EQ(q.value.data[i], 0x7F) << i;
    EXPECT_EQ(q.certified[i], 1) << i;
  }
  EXPECT_EQ(r.outputs.at("amax").certified[2], 0);
  EXPECT_EQ(r.outputs.at("amax").value.data[1], 0);
}

TEST(QuantCase, DynamicInt8AndTheMinus128Region) {
  // y = [254, -254, 127, -1]: amax 254, scale 2; reciprocal 0.5: codes 127, -127, 64 (63.5 ties
  // to even 64), -0.5 -> 0 (tie to even).
  Case c = quant_case({254, 254, 127, 1}, *quant_preset("vllm_dynamic_int8"));
  const Result r = evaluate(c);
  const Output& q = r.outputs.at("q");
  EXPECT_EQ(q.codes, "int8");
  EXPECT_EQ(q.value.data[0], 127);
  EXPECT_EQ(q.value.data[1], -127);
  EXPECT_EQ(q.value.data[2], 64);
  EXPECT_EQ(q.value.data[3], 0);
  for (auto k : q.certified) EXPECT_EQ(k, 1);
  EXPECT_EQ(r.outputs.at("scale").value.data[0], 2);
  // A static scale that puts a value below -127.5: -128 (cvt.rni.sat.s8) or -127 (symmetric),
  // so that code is not judged.
  QuantContract st;
  st.format = QFormat::int8;
  Case d = quant_case({200, 200}, st);
  const Result rd = evaluate(d);
  EXPECT_EQ(rd.outputs.at("q").value.data[1], -127);
  EXPECT_EQ(rd.outputs.at("q").certified[1], 0);
  EXPECT_EQ(rd.outputs.at("q").certified[0], 1);
}

TEST(QuantCase, MxFp8BlockStraddlingSaturation) {
  // One 32-block with amax 480 (= 1.875 * 256): the floor rule gives 2^0 and 480 saturates to
  // 448 (0x7E); the round-up rule gives 2^1 and 480/2 = 240 (0x77 = 1.875*128: exponent 14,
  // mantissa 111). Element 1 = -1 * 2 = -2: floor -> 0xC0, round-up -> -1 = 0xB8.
  std::vector<double> w(32, 0.0);
  w[0] = 480;
  w[1] = 2;
  for (auto [rule, e8, c0, c1] : {std::tuple{MxRule::floor, 127, 0x7E, 0xC0}, std::tuple{MxRule::round_up, 128, 0x77, 0xB8}}) {
    QuantContract qc = *quant_preset("ocp_mxfp8");
    qc.mx_rule = rule;
    const Result r = evaluate(quant_case(w, qc));
    const Output& s = r.outputs.at("scale");
    EXPECT_EQ(s.codes, "e8m0");
    ASSERT_EQ(s.value.data.size(), 1u);
    EXPECT_EQ(s.value.data[0], e8) << name_of(rule);
    EXPECT_EQ(r.outputs.at("q").value.data[0], c0) << name_of(rule);
    EXPECT_EQ(r.outputs.at("q").value.data[1], c1) << name_of(rule);
    EXPECT_EQ(r.outputs.at("q").value.data[2], 0) << name_of(rule);
  }
}

TEST(QuantCase, ScaleTiesWhereTheExactAmaxSitsOnAStep) {
  // Floor rule: amax 256 = 2^8 is a step (just below it the exponent is one less): tie. 480 is
  // not. Round-up rule: amax 448 gives rn32(448 * rn32(1/448)) = 1 exactly, a power of two, so
  // the float32 neighbours of 448 give 2^0 and 2^1: tie; 480 is not.
  for (auto [rule, amax, tie] : {std::tuple{MxRule::floor, 256.0, 1}, std::tuple{MxRule::floor, 480.0, 0},
                                 std::tuple{MxRule::round_up, 448.0, 1}, std::tuple{MxRule::round_up, 480.0, 0}}) {
    std::vector<double> w(32, 1.0);
    w[0] = amax;
    QuantContract qc = *quant_preset("ocp_mxfp8");
    qc.mx_rule = rule;
    const Result r = evaluate(quant_case(w, qc));
    ASSERT_EQ(r.outputs.at("scale").ties.size(), 1u);
    EXPECT_EQ(r.outputs.at("scale").ties[0], tie) << name_of(rule) << " " << amax;
    EXPECT_EQ(r.outputs.at("scale").certified[0], 1);  // the contract's scale is still exact
  }
  // NVFP4: S_enc = 2688/6 = 448 for amax_g 6; a second block of amax 1.5 has the E4M3 block
  // scale rn32(1.5 * 74.666672) = 112.00001 -> 112 (0x6E), strictly inside a step: no tie.
  std::vector<double> w(32, 1.0);
  w[0] = 6;
  w[16] = 1.5;
  const Result r = evaluate(quant_case(w, *quant_preset("te_nvfp4"), DType::float32));
  EXPECT_EQ(r.outputs.at("scale").ties[1], 0);
  // Dynamic scales have no ties mask: rn32(amax / qmax) steps at nearly every float32 amax.
  const Result d = evaluate(quant_case({448, 1, 1, 1}, *quant_preset("vllm_dynamic_fp8")));
  EXPECT_TRUE(d.outputs.at("scale").ties.empty());
}

TEST(QuantCase, MxAllZeroBlockAndNaNBlock) {
  // Two rows of 32: row 0 all zero (eps > 0): floor rule scale code 0, codes 0. Row 1 with a NaN
  // (the norm makes the whole row NaN): the OCP scale is NaN (0xFF), the codes the NaN code.
  std::vector<double> x(64, 0.0);
  for (int i = 32; i < 64; ++i) x[i] = 1;
  x[40] = kNaN;
  Case c = testing::simple_case(Op::rmsnorm, 2, 32, x, DType::bfloat16);
  c.epsilon = 1e-6;
  c.affine = Affine::none;
  c.quant = *quant_preset("ocp_mxfp8");
  const Result r = evaluate(c);
  const Output& s = r.outputs.at("scale");
  EXPECT_EQ(s.value.data[0], 0);
  EXPECT_EQ(s.certified[0], 1);
  EXPECT_EQ(s.value.data[1], 0xFF);
  EXPECT_EQ(s.certified[1], 1);
  const Output& q = r.outputs.at("q");
  EXPECT_EQ(q.certified[0], 1);
  EXPECT_EQ(q.value.data[0], 0);
  EXPECT_EQ(q.value.data[40], 0x7F);
  EXPECT_EQ(q.value.data[33], 0x7F);
  EXPECT_EQ(q.certified[33], 1);
}

TEST(QuantCase, Nvfp4Codes) {
  // y = [6, -3, 1, -0.375, 0 ...] in one 16-block: S_enc = 448, block scale 448, multiplier 1
  // (QuantScale.Nvfp4GlobalAndBlockScales): 6 -> 0x7, -3 -> 0xD, 1 -> 0x2, -0.375 -> -0.5 = 0x9
  // (above the midpoint 0.25).
  std::vector<double> w(16, 0.0);
  w[0] = 6;
  w[1] = 3;
  w[2] = 1;
  w[3] = 0.375;
  const Result r = evaluate(quant_case(w, *quant_preset("te_nvfp4"), DType::float32));
  const Output& q = r.outputs.at("q");
  EXPECT_EQ(q.codes, "nvfp4_e2m1");
  EXPECT_EQ(q.value.data[0], 0x7);
  EXPECT_EQ(q.value.data[1], 0xD);
  EXPECT_EQ(q.value.data[2], 0x2);
  EXPECT_EQ(q.value.data[3], 0x9);
  EXPECT_EQ(r.outputs.at("scale").value.data[0], 0x7E);
  EXPECT_EQ(r.outputs.at("global_scale").value.data[0], 448);
  for (auto k : q.certified) EXPECT_EQ(k, 1);
}

TEST(QuantCase, Nvfp4UnderflowedBlockScaleIsNotJudged) {
  // Block 0 amax 2^20, block 1 amax 1: S_enc = 2688/2^20; block 1's scale rn32(1 * S_enc/6) =
  // 4.3e-4 < 2^-10 (half E4M3's smallest subnormal): S_b = 0, and kernels then differ.
  std::vector<double> w(32, 0.0);
  w[0] = 0x1p20;
  w[16] = 1;
  const Result r = evaluate(quant_case(w, *quant_preset("te_nvfp4"), DType::float32));
  EXPECT_EQ(r.outputs.at("scale").value.data[1], 0);
  EXPECT_EQ(r.outputs.at("q").certified[16], 0);
  EXPECT_EQ(r.outputs.at("q").certified[0], 1);
  // An all-zero block (its scale is 0 too) has code 0 in every kernel: certified.
  std::vector<double> z(32, 0.0);
  z[0] = 6;
  const Result rz = evaluate(quant_case(z, *quant_preset("te_nvfp4"), DType::float32));
  EXPECT_EQ(rz.outputs.at("scale").value.data[1], 0);
  for (int i = 16; i < 32; ++i) {
    EXPECT_EQ(static_cast<int>(rz.outputs.at("q").value.data[i]) & 0x7, 0) << i;
    EXPECT_EQ(rz.outputs.at("q").certified[i], 1) << i;
  }
}

TEST(QuantCase, FloatValueContractQuantizesTheFloat32Value) {
  // bf16 activations, y = 1 + 2^-10 exactly (weight in bf16 cannot hold it, so use x): with
  // value=activation y is rounded to bf16 first (1.0 -> 0x38); with value=float32 it is
  // 1 + 2^-10, still 0x38 in E4M3, but 1.0625 + 2^-10 separates them: bf16 rounds it to 1.0625
  // (a tie between 1 and 1.125 in E4M3 -> 1.0, 0x38) while float32 keeps it above the tie
  // (-> 1.125, 0x39).
  Case c = testing::simple_case(Op::rmsnorm, 1, 2, {1, -1}, DType::float32);
  c.epsilon = 0;
  c.dtype_out = DType::bfloat16;
  c.affine = Affine::weight;
  c.dtype_param = DType::float32;
  c.inputs["weight"] = tensor(DType::float32, {2}, {1.0625 + 0x1p-10, 1});
  QuantContract qc;
  c.quant = qc;
  c.inputs["scale"] = tensor(DType::float32, {1}, {1.0});
  EXPECT_EQ(evaluate(c).outputs.at("q").value.data[0], 0x38);
  c.quant->value = QuantValue::float32;
  EXPECT_EQ(evaluate(c).outputs.at("q").value.data[0], 0x39);
  c.quant->y = true;  // y is still written in bfloat16
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.at("y").value.dtype, DType::bfloat16);
  EXPECT_EQ(r.outputs.at("y").value.data[0], 1.0625);
}

TEST(QuantCase, ResidualSumRoundedOrNot) {
  // x = 1, residual = 2^-9 in bf16: rounded h = 1 (bf16 has 8 bits), unrounded h = 1 + 2^-9. With
  // eps 0 and a second element -h... the rounding shows in residual_out either way; the contract
  // only decides which h the statistics see. Here: the norm case the quantizer evaluates.
  Case c = testing::simple_case(Op::rmsnorm, 1, 2, {1, -1}, DType::bfloat16);
  c.residual = Residual::add;
  c.inputs["residual"] = tensor(DType::bfloat16, {1, 2}, {0x1p-9, 0});
  c.quant = *quant_preset("vllm_fused_add_static_fp8");
  c.inputs["scale"] = tensor(DType::float32, {1}, {1.0});
  validate(c);
  const Result r = evaluate(c);
  EXPECT_EQ(r.outputs.count("residual_out"), 1u);
  c.quant->residual_sum = ResidualSum::unrounded;
  c.contract = "fused_add_lowp";
  EXPECT_THROW(validate(c), CaseError);  // the norm contract rounds h: contradiction
}

TEST(QuantCase, InvalidContractsAreNamed) {
  QuantContract qc;
  qc.format = QFormat::mxfp8_e4m3;  // with a static scale
  Case c = quant_case({1, 1}, qc);
  try {
    validate(c);
    FAIL() << "accepted mxfp8 with a static scale";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "quant/scale");
  }
  Case d = quant_case(std::vector<double>(20, 1.0), *quant_preset("ocp_mxfp8"));
  try {
    validate(d);
    FAIL() << "accepted 20 columns in 32-blocks";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "quant/format");
  }
  Case s = quant_case({1, 1}, QuantContract{});
  s.inputs["scale"].data[0] = 0;
  EXPECT_THROW(validate(s), CaseError);
  s.inputs.erase("scale");
  EXPECT_THROW(validate(s), CaseError);
}

TEST(QuantJson, PresetsFieldsAndErrors) {
  const auto j = nlohmann::json::parse(R"({
    "op": "rmsnorm", "epsilon": 0, "dtype_x": "bfloat16", "affine": "weight",
    "quant": {"preset": "vllm_dynamic_fp8", "outputs": ["amax", "y"], "scale_ub": 1200},
    "inputs": {"x": {"shape": [1, 2], "data": [1, -1]}, "weight": {"shape": [2], "data": [3, 4]}}})");
  const Case c = case_from_json(j);
  ASSERT_TRUE(c.quant);
  EXPECT_EQ(c.quant->scale, ScaleKind::dynamic_token);
  EXPECT_EQ(c.quant->apply, ScaleApply::divide);
  EXPECT_TRUE(c.quant->amax && c.quant->y);
  EXPECT_EQ(c.quant->scale_ub, 1200);
  const auto specs = output_specs(c);
  EXPECT_EQ(specs.at("q").codes, "float8_e4m3fn");
  EXPECT_EQ(specs.at("scale").dtype, DType::float32);
  EXPECT_EQ(specs.count("amax"), 1u);
  EXPECT_EQ(specs.count("rstd"), 0u);
  const auto out = result_to_json(c, evaluate(c), "test");
  EXPECT_EQ(out["outputs"]["q"]["dtype"], "float8_e4m3fn");
  EXPECT_TRUE(out["outputs"]["q"]["values"][0].is_number_integer());
  auto bad = j;
  bad["quant"]["format"] = "fp8";
  try {
    case_from_json(bad);
    FAIL();
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "quant/format");
  }
  bad = j;
  bad["quant"]["bogus"] = 1;
  EXPECT_THROW(case_from_json(bad), CaseError);
}

// apply_scale's division takes binary64 where the operands are float32 values and the quotient is
// a normal float32 number (quant.cpp div32): the same value as the exact rational everywhere,
// checked on random float32 pairs over the whole exponent range, on quotients next to float32
// midpoints, and at the ends of the normal range (where the rational takes over).
TEST(QuantScale, Float32DivisionEqualsTheExactQuotient) {
  const auto exact_div = [](double a, double b) {
    return detail::round_rational(detail::exact(a) / detail::exact(b), DType::float32);
  };
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7F7FFFFF);
  int compared = 0;
  for (int i = 0; i < 200000; ++i) {
    const double a = std::bit_cast<float>(bits(rng)) * (i % 2 ? -1.0 : 1.0);
    const double b = std::bit_cast<float>(bits(rng) | 1u);  // nonzero
    const double got = apply_scale(a, b, ScaleApply::divide);
    const double want = exact_div(a, b);
    ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << a << " / " << b;
    ++compared;
  }
  // Quotients that are float32 midpoints or next to them: (m + 1/2 ulp) * b / b with small b.
  for (int i = 0; i < 20000; ++i) {
    const float m = std::bit_cast<float>(0x3F800000u + (bits(rng) & 0x7FFFFF));
    const double b = 3 + (i % 13);  // exact small divisors
    for (const double up : {-1.0, 0.0, 1.0}) {
      const double mid = static_cast<double>(m) + std::ldexp(1.0, -24) * (1 + up * std::ldexp(1.0, -20));
      const double a = static_cast<double>(static_cast<float>(mid * b));
      ASSERT_EQ(apply_scale(a, b, ScaleApply::divide), exact_div(a, b)) << a << " / " << b;
      ++compared;
    }
  }
  for (const double a : {static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX), std::ldexp(1.0, -149), 1.0})
    for (const double b : {3.0, 0.75, static_cast<double>(FLT_MAX), std::ldexp(1.0, -149), 7.0})
      EXPECT_EQ(apply_scale(a, b, ScaleApply::divide), exact_div(a, b)) << a << " / " << b;
  EXPECT_GT(compared, 250000);
}

}  // namespace
}  // namespace normcheck::ref
