// The diagnosis panel on planted faults. The faulty outputs come from the certified reference
// evaluating the case with the fault applied as a change of the case (another eps, op, contract,
// offset, inputs), or from small double-precision implementations of the fault written here,
// independent of the panel's engine: the faulty dialect must rank first and explain them; the
// correct outputs must not be explained better by any dialect than by the spec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "test_cases.hpp"

namespace normcheck::conf {
namespace {

using ref::DType;
using test::certified;
using test::fixture_of;
using test::normal;

ref::Case make_case(ref::Op op, ref::Affine affine, std::int64_t rows, std::int64_t cols, double mean,
                    double sd, DType dt = DType::float32, unsigned seed = 1) {
  std::mt19937_64 rng(seed);
  ref::Case c;
  c.op = op;
  c.affine = affine;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = dt;
  c.dtype_compute = DType::float32;
  c.inputs["x"] =
      ref::Tensor{dt, {rows, cols}, normal(rng, static_cast<std::size_t>(rows * cols), mean, sd, dt)};
  if (affine != ref::Affine::none)
    c.inputs["weight"] = ref::Tensor{dt, {cols}, normal(rng, static_cast<std::size_t>(cols), 1, 0.5, dt)};
  if (affine == ref::Affine::weight_bias)
    c.inputs["bias"] = ref::Tensor{dt, {cols}, normal(rng, static_cast<std::size_t>(cols), 0, 0.5, dt)};
  return c;
}

// The correctly rounded outputs of `faulty`, for the outputs the spec case has with the same shape.
Outputs outputs_of(const ref::Case& faulty, const fix::FixtureCase& spec) {
  Outputs o;
  for (const auto& [name, out] : ref::evaluate(faulty).outputs) {
    const auto it = spec.expected.find(name);
    if (it != spec.expected.end() && it->second.value.shape == out.value.shape) o[name] = out.value;
  }
  return o;
}

bool names(const Diagnosis& d, const std::string& dialect) {
  if (d.dialect == dialect) return true;
  for (const auto& s : d.same_as)
    if (s == dialect) return true;
  return false;
}

void expect_first(const fix::FixtureCase& fc, const Outputs& got, const std::string& dialect) {
  const auto allow = derive_allowances(fc.c);
  ASSERT_EQ(check_case(fc, got, allow).verdict, Verdict::failed) << dialect << ": the fault must show";
  const auto d = diagnose(fc, got, allow);
  ASSERT_FALSE(d.empty()) << dialect;
  std::string ranking;
  for (const auto& x : d) ranking += "\n  " + x.dialect + " " + std::to_string(x.score) + " " + x.evidence;
  EXPECT_TRUE(names(d[0], dialect)) << dialect << " is not first:" << ranking;
  EXPECT_TRUE(d[0].explains) << dialect << ":" << ranking;
}

// Outputs of an independent double implementation of a LayerNorm/RMSNorm forward with a fault:
// rstd_of(var, ss, n) gives the faulty rstd; y rounded to the output dtype once.
Outputs faulty_forward(const ref::Case& c,
                       const std::function<double(double var, double ss, double n)>& rstd_of,
                       bool bias_first = false, std::optional<DType> rstd_round = std::nullopt) {
  const auto& x = c.inputs.at("x");
  const std::int64_t cols = x.shape.back(), rows = x.shape.front();
  const auto* w = c.affine != ref::Affine::none ? &c.inputs.at("weight") : nullptr;
  const auto* b = c.affine == ref::Affine::weight_bias ? &c.inputs.at("bias") : nullptr;
  const bool ln = c.op == ref::Op::layernorm;
  Outputs o;
  o["y"] = ref::Tensor{c.dtype_out, x.shape, std::vector<double>(x.data.size())};
  o["rstd"] = ref::Tensor{c.dtype_compute, {rows, 1}, std::vector<double>(static_cast<std::size_t>(rows))};
  if (ln)
    o["mean"] = ref::Tensor{c.dtype_compute, {rows, 1}, std::vector<double>(static_cast<std::size_t>(rows))};
  for (std::int64_t r = 0; r < rows; ++r) {
    long double sum = 0, ss = 0;
    for (std::int64_t j = 0; j < cols; ++j) sum += x.data[r * cols + j];
    const long double mean = ln ? sum / cols : 0;
    for (std::int64_t j = 0; j < cols; ++j)
      ss += (x.data[r * cols + j] - mean) * (x.data[r * cols + j] - mean);
    double rstd = rstd_of(static_cast<double>(ss / cols), static_cast<double>(ss), static_cast<double>(cols));
    if (rstd_round) rstd = ref::round_to(rstd, *rstd_round);
    o["rstd"].data[r] = ref::round_to(rstd, c.dtype_compute);
    if (ln) o["mean"].data[r] = ref::round_to(static_cast<double>(mean), c.dtype_compute);
    for (std::int64_t j = 0; j < cols; ++j) {
      long double v = (x.data[r * cols + j] - mean) * rstd;
      const long double wv = w ? w->data[j] : 1.0, bv = b ? b->data[j] : 0.0;
      v = bias_first ? (v + bv) * wv : v * wv + bv;
      o["y"].data[r * cols + j] = ref::round_to(static_cast<double>(v), c.dtype_out);
    }
  }
  return o;
}

// Rows whose variance (about 1e-5) is comparable to eps: every eps fault shows.
ref::Case eps_case(ref::Op op = ref::Op::layernorm) {
  auto c = make_case(op, ref::Affine::weight_bias, 4, 64, 0, 3e-3);
  c.epsilon = 1e-5;
  return c;
}

TEST(Diagnosis, EpsilonFaultsFromTheReference) {
  const auto c = eps_case();
  const auto fc = fixture_of(c);
  auto f = c;
  f.epsilon = 0;
  expect_first(fc, outputs_of(f, fc), "eps_missing");
  f.epsilon = 1e-6;
  expect_first(fc, outputs_of(f, fc), "eps_other_value");
  const auto d = diagnose(fc, outputs_of(f, fc));
  ASSERT_TRUE(d[0].parameters.count("epsilon"));
  EXPECT_NEAR(d[0].parameters.at("epsilon"), 1e-6, 1e-8) << "the fitted eps is reported";
}

// Constant rows (variance exactly 0) with eps left out: the certified reference with eps = 0
// gives rstd = 1/sqrt(0) = +inf and y = 0 * inf = NaN on them (IEEE). The dialect's own formula
// in the engine gives the same non-finite values, and a predicted NaN or infinity that the
// candidate reproduces (same class) scores as an exact match; one row is not constant, so the
// spec also fails on finite values there.
TEST(Diagnosis, EpsMissingOnConstantRowsGivesInfAndNaN) {
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0, 3e-3);
  c.epsilon = 1e-5;
  auto& x = c.inputs.at("x").data;
  const double level[3] = {0.375, -1.25, 3.0};  // rows 0-2 constant, row 3 keeps its spread
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t j = 0; j < 64; ++j) x[r * 64 + j] = level[r];
  const auto fc = fixture_of(c);
  auto f = c;
  f.epsilon = 0;
  const auto got = outputs_of(f, fc);
  ASSERT_TRUE(std::isinf(got.at("rstd").data[0]) && got.at("rstd").data[0] > 0) << "reference: rstd = +inf";
  ASSERT_TRUE(std::isnan(got.at("y").data[0])) << "reference: y = 0 * inf = NaN";
  expect_first(fc, got, "eps_missing");
}

TEST(Diagnosis, EpsilonAndVarianceFaultsFromIndependentCode) {
  const auto c = eps_case();
  const auto fc = fixture_of(c);
  const double eps = c.epsilon;
  expect_first(fc, faulty_forward(c, [&](double var, double, double) { return 1 / (std::sqrt(var) + eps); }),
               "eps_outside_sqrt");
  expect_first(fc,
               faulty_forward(c, [&](double, double ss, double n) { return 1 / std::sqrt(ss / (n + eps)); }),
               "eps_in_count");
  const auto cn = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 16, 0, 1);
  const auto fcn = fixture_of(cn);
  expect_first(fcn,
               faulty_forward(
                   cn, [&](double, double ss, double n) { return 1 / std::sqrt(ss / (n - 1) + cn.epsilon); }),
               "unbiased_variance");
}

TEST(Diagnosis, AffineFaults) {
  const auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0, 1);
  const auto fc = fixture_of(c);
  auto f = c;
  std::swap(f.inputs["weight"], f.inputs["bias"]);
  expect_first(fc, outputs_of(f, fc), "weight_bias_swapped");
  f = c;
  for (auto& v : f.inputs["bias"].data) v = 0;
  expect_first(fc, outputs_of(f, fc), "bias_missing");
  f = c;
  for (auto& v : f.inputs["weight"].data) v = 1;
  expect_first(fc, outputs_of(f, fc), "weight_missing");
  for (auto& v : f.inputs["bias"].data) v = 0;  // both re-initialized (transformers #29554)
  expect_first(fc, outputs_of(f, fc), "weight_and_bias_missing");
  expect_first(fc,
               faulty_forward(
                   c, [&](double var, double, double) { return 1 / std::sqrt(var + c.epsilon); }, true),
               "bias_before_weight");
}

TEST(Diagnosis, OffsetFaults) {
  auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 32, 0, 1);
  for (auto& v : c.inputs["weight"].data) v = ref::round_to(v - 1, DType::float32);  // stored zero-centred
  c.weight_offset = 1;
  const auto fc = fixture_of(c);
  auto f = c;
  f.weight_offset = 0;
  expect_first(fc, outputs_of(f, fc), "offset_missing");
  f.weight_offset = 2;
  expect_first(fc, outputs_of(f, fc), "offset_doubled");
}

TEST(Diagnosis, CentringFaults) {
  const auto rms = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 64, 5, 1);
  auto f = rms;
  f.op = ref::Op::layernorm;
  expect_first(fixture_of(rms), outputs_of(f, fixture_of(rms)), "rms_centred");
  const auto ln = make_case(ref::Op::layernorm, ref::Affine::weight, 4, 64, 3, 1);
  f = ln;
  f.op = ref::Op::rmsnorm;
  expect_first(fixture_of(ln), outputs_of(f, fixture_of(ln)), "layernorm_uncentred");
}

TEST(Diagnosis, ContractFaults) {
  auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 64, 0, 1, DType::bfloat16);
  c.contract = "llama";
  c.epsilon = 1e-6;
  const auto fc = fixture_of(c);
  auto f = c;
  f.contract = "exact";
  expect_first(fc, outputs_of(f, fc), "contract_point_skipped");
  // rstd rounded to bfloat16 before the multiply (float32 case).
  const auto c32 = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 64, 0, 1);
  expect_first(fixture_of(c32),
               faulty_forward(
                   c32, [&](double var, double, double) { return 1 / std::sqrt(var + c32.epsilon); }, false,
                   DType::bfloat16),
               "rstd_rounded_bf16");
}

TEST(Diagnosis, ResidualFaults) {
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 32, 0, 1);
  std::mt19937_64 rng(7);
  c.residual = ref::Residual::add;
  c.alpha = 0.5;
  c.inputs["residual"] = ref::Tensor{DType::float32, {4, 32}, normal(rng, 128, 2, 1, DType::float32)};
  const auto fc = fixture_of(c);
  auto f = c;
  f.residual = ref::Residual::none;
  f.inputs.erase("residual");
  expect_first(fc, outputs_of(f, fc), "residual_not_added");
  f = c;  // h = x + alpha * residual: the reference with x and residual exchanged
  std::swap(f.inputs["x"], f.inputs["residual"]);
  expect_first(fc, outputs_of(f, fc), "alpha_on_residual");
}

// y and rstd computed without the residual while residual_out is right: the right residual_out
// rules residual_not_added out on the case, and the diagnosis of the failing outputs names it.
TEST(Diagnosis, AFaultInOneOutputIsDiagnosedOnThatOutput) {
  auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 32, 0, 1);
  std::mt19937_64 rng(3);
  c.residual = ref::Residual::add;
  c.inputs["residual"] = ref::Tensor{DType::float32, {4, 32}, normal(rng, 128, 2, 1, DType::float32)};
  const auto fc = fixture_of(c);
  ASSERT_TRUE(fc.expected.count("residual_out"));
  auto f = c;
  f.residual = ref::Residual::none;
  f.inputs.erase("residual");
  Outputs got = outputs_of(f, fc);
  got["residual_out"] = fc.expected.at("residual_out").value;
  const auto d = diagnose(fc, got);
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].dialect, "residual_not_added") << describe_diagnosis(d);
  EXPECT_EQ(d[0].output, "rstd, y");
  EXPECT_TRUE(d[0].explains);
  EXPECT_NE(describe_diagnosis(d).find("rstd, y explained by residual_not_added"), std::string::npos)
      << describe_diagnosis(d);
}

// FlagGems #221: the mean and rstd of a float16 LayerNorm saved as float16. Made from the
// reference: its float32 statistics rounded to float16, y untouched.
TEST(Diagnosis, StatisticsSavedInTheInputDtype) {
  const auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0.5, 1, DType::float16);
  const auto fc = fixture_of(c);
  Outputs got = outputs_of(c, fc);
  for (const char* s : {"mean", "rstd"})
    for (double& v : got.at(s).data) v = ref::round_to(v, DType::float16);
  expect_first(fc, got, "stats_saved_in_x_dtype");
}

TEST(Diagnosis, LowPrecisionHFromTheReference) {
  // bfloat16 x, float32 residual: h rounded to bfloat16 before the statistics equals the
  // reference on x' = bf16(x + residual) and a zero residual.
  auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 64, 0, 1, DType::bfloat16);
  std::mt19937_64 rng(9);
  c.residual = ref::Residual::add;
  c.dtype_residual = DType::float32;
  c.dtype_out = DType::float32;
  c.inputs["residual"] = ref::Tensor{DType::float32, {4, 64}, normal(rng, 256, 0, 1, DType::float32)};
  const auto fc = fixture_of(c);
  auto f = c;
  for (std::size_t i = 0; i < f.inputs["x"].data.size(); ++i) {
    f.inputs["x"].data[i] =
        ref::round_to(c.inputs.at("x").data[i] + c.inputs.at("residual").data[i], DType::bfloat16);
    f.inputs["residual"].data[i] = 0;
  }
  expect_first(fc, outputs_of(f, fc), "h_rounded_to_input_dtype");
}

// Backward: column sums rounded through bfloat16 (an independent reduction: the certified sum
// rounded once) are explained by the interval dialect, float32 column sums off the bfloat16 grid
// are not; columns left at 0 are found and counted.
TEST(Diagnosis, BackwardReductionFaults) {
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 8, 64, 0, 1);
  std::mt19937_64 rng(11);
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = ref::Tensor{DType::float32, {8, 64}, normal(rng, 512, 0, 1, DType::float32)};
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  for (const char* name : {"dweight", "dbias"})
    for (std::size_t j = 0; j < got[name].data.size(); ++j)
      got[name].data[j] = ref::round_to(fc.expected.at(name).f64[j], DType::bfloat16);
  expect_first(fc, got, "column_sums_bf16");

  got = certified(fc);
  for (std::size_t j = 32; j < 64; ++j) got["dweight"].data[j] = got["dbias"].data[j] = 0;
  expect_first(fc, got, "column_sums_columns_dropped");
  const auto d = diagnose(fc, got);
  EXPECT_EQ(d[0].parameters.at("columns_dropped"), 64) << "32 columns of dweight and of dbias";

  // Correct outputs: the bfloat16 interval does not explain float32 sums.
  got = certified(fc);
  for (const auto& x : diagnose(fc, got, {.keep = 100})) {
    if (x.dialect == "column_sums_bf16") {
      EXPECT_GT(x.score, 100) << "explains correct float32 sums: " << x.evidence;
    }
  }
}

// A LayerNorm backward case over [rows, 16], dy drawn N(0, 1) from `seed`.
ref::Case ln_backward_case(std::int64_t rows, std::uint64_t seed) {
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, rows, 16, 0, 1);
  std::mt19937_64 rng(seed);
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = ref::Tensor{DType::float32, {rows, 16},
                               normal(rng, static_cast<std::size_t>(rows) * 16, 0, 1, DType::float32)};
  return c;
}

// The certified outputs of `fc` with dweight and dbias (where it has them) summed over its first `summed` rows only
// (the reference's column sums of the case with dy zero beyond them).
Outputs with_first_rows_summed(const fix::FixtureCase& fc, std::int64_t summed) {
  auto f = fc.c;
  const std::size_t cols = static_cast<std::size_t>(f.inputs["dy"].shape[1]);
  for (std::size_t i = static_cast<std::size_t>(summed) * cols; i < f.inputs["dy"].data.size(); ++i)
    f.inputs["dy"].data[i] = 0;
  const auto part = fixture_of(f);
  Outputs got = certified(fc);
  for (const char* name : {"dweight", "dbias"})
    if (part.expected.count(name)) got[name] = part.expected.at(name).value;
  return got;
}

// dweight/dbias summed over the first rows only (a kernel whose grid covers a fixed number of
// rows), held in bfloat16: the column sums of the reference on the case with dy zero beyond them.
// The bfloat16 interval must not claim it: over 256 rows and more its bound (gamma(R), R u >= 1)
// says nothing, and on a sampled case it is the bound of every row's additions, not of the
// sample's (which gave it a slack of 0.13 of the sum of |terms| here, about twice the error).
TEST(Diagnosis, ColumnSumsOverASubsetOfRowsAreNotABfloat16Reduction) {
  for (std::int64_t rows : {300, 1200}) {
    const auto fc = fixture_of(ln_backward_case(rows, 5));
    Outputs got = with_first_rows_summed(fc, rows / 4);
    for (const char* name : {"dweight", "dbias"})
      for (auto& v : got[name].data) v = ref::round_to(v, DType::bfloat16);
    for (const auto& x : diagnose(fc, got, {.keep = 100}))
      if (x.dialect == "column_sums_bf16") {
        EXPECT_FALSE(x.explains) << rows << " rows: " << x.evidence;
      }
  }
}

// dweight/dbias summed over the first 1024 rows of 1040 (a launch grid limit), the terms from the
// reference on the case with dy zero beyond them: column_sums_first_rows explains it, first,
// with the limit; the certified outputs are not explained by it; at 1000 rows only the 256 limit applies.
std::string ranking_of(const std::vector<Diagnosis>& d);  // below

TEST(Diagnosis, ColumnSumsOverTheFirstRowsOnly) {
  for (std::int64_t rows : {1040, 1000}) {
    const auto fc = fixture_of(ln_backward_case(rows, 9));
    Outputs right = certified(fc);
    const auto named = [&](const std::vector<Diagnosis>& d) {
      return std::find_if(d.begin(), d.end(), [](const Diagnosis& x) { return x.dialect == "column_sums_first_rows"; });
    };
    const auto ok = diagnose(fc, right, {.keep = 100});
    if (const auto it = named(ok); it != ok.end()) {
      EXPECT_FALSE(it->explains) << it->evidence;
    }
    if (rows <= 1024) {
      if (const auto it = named(ok); it != ok.end()) {
        EXPECT_EQ(it->parameters.at("rows_summed"), 256);
      }
      continue;
    }
    const auto d = diagnose(fc, with_first_rows_summed(fc, 1024));
    ASSERT_FALSE(d.empty());
    EXPECT_EQ(d[0].dialect, "column_sums_first_rows") << ranking_of(d);
    EXPECT_TRUE(d[0].explains) << d[0].evidence;
    EXPECT_EQ(d[0].parameters.at("rows_summed"), 1024);
  }
}

// A count of rows that is no grid limit (the partial sums of lavapipe's loop limit, docs/FINDINGS.md
// #lavapipe-loop-limit): column_sums_first_rows fits it from the outputs and names it, for
// LayerNorm (dweight and dbias) and RMSNorm (dweight only); the terms again from the reference on
// the case with dy zero beyond them.
TEST(Diagnosis, ColumnSumsOverAFittedNumberOfRows) {
  const auto fitted = [](const std::vector<Diagnosis>& d) {
    ASSERT_FALSE(d.empty());
    EXPECT_EQ(d[0].dialect, "column_sums_first_rows") << ranking_of(d);
    EXPECT_TRUE(d[0].explains) << d[0].evidence;
    EXPECT_EQ(d[0].parameters.at("rows_summed"), 2000);
  };
  const auto ln = fixture_of(ln_backward_case(3000, 21));
  fitted(diagnose(ln, with_first_rows_summed(ln, 2000)));

  auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 3000, 6, 0, 1);
  std::mt19937_64 rng(22);
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = ref::Tensor{DType::float32, {3000, 6}, normal(rng, 3000 * 6, 0, 1, DType::float32)};
  const auto rms = fixture_of(c);
  fitted(diagnose(rms, with_first_rows_summed(rms, 2000)));
  // The certified outputs: no count is fitted to them, nothing is named.
  Outputs right = certified(rms);
  for (const auto& x : diagnose(rms, right, {.keep = 100}))
    if (x.dialect == "column_sums_first_rows") {
      EXPECT_FALSE(x.explains) << x.evidence;
      EXPECT_EQ(x.parameters.at("rows_summed"), 256) << "only the grid limits are tried on right outputs";
    }
}

// dweight with x-hat rebuilt from y using the weight/bias of the row's lane in a 32-wide tile
// (DeepSpeed #692), computed here in long double from the inputs (not by the panel's engine),
// each sum rounded once: the dialect names it, and the correct outputs are not explained by it.
TEST(Diagnosis, DweightWrongLaneParameters) {
  const std::int64_t rows = 8, cols = 64;
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, rows, cols, 0, 1);
  std::mt19937_64 rng(12);
  c.direction = ref::Direction::backward;
  c.inputs["dy"] = ref::Tensor{DType::float32, {rows, cols}, normal(rng, rows * cols, 0, 1, DType::float32)};
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  const auto& x = c.inputs.at("x").data;
  const auto& w = c.inputs.at("weight").data;
  const auto& b = c.inputs.at("bias").data;
  const auto& dy = c.inputs.at("dy").data;
  std::vector<long double> dw(cols, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    long double sum = 0, ss = 0;
    for (std::int64_t j = 0; j < cols; ++j) sum += x[r * cols + j];
    const long double mean = sum / cols;
    for (std::int64_t j = 0; j < cols; ++j) ss += (x[r * cols + j] - mean) * (x[r * cols + j] - mean);
    const long double rstd = 1 / std::sqrt(ss / cols + c.epsilon);
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t pos = (j / 32) * 32 + r % 32;  // the row's lane, not the column's
      const long double xh = (x[r * cols + j] - mean) * rstd;
      dw[j] += dy[r * cols + j] * ((xh * w[j] + b[j] - b[pos]) / w[pos]);
    }
  }
  for (std::int64_t j = 0; j < cols; ++j)
    got["dweight"].data[j] = ref::round_to(static_cast<double>(dw[j]), DType::float32);
  expect_first(fc, got, "dweight_wrong_lane_params");
  EXPECT_EQ(diagnose(fc, got)[0].parameters.at("tile"), 32);

  got = certified(fc);
  for (const auto& d : diagnose(fc, got, {.keep = 100}))
    if (d.dialect == "dweight_wrong_lane_params") {
      EXPECT_GT(d.score, 100) << "explains correct sums: " << d.evidence;
    }
}

// One-pass variance E[h^2] - E[h]^2 in float64 (a float64 kernel), written here with sequential
// double sums, on rows of mean 1e4 and sigma 1e-3 where it cancels.
TEST(Diagnosis, OnePassVarianceInFloat64) {
  const std::int64_t rows = 4, cols = 64;
  auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, rows, cols, 1e4, 1e-3, DType::float64);
  c.dtype_compute = DType::float64;
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  const auto& x = c.inputs.at("x").data;
  const auto& w = c.inputs.at("weight").data;
  const auto& b = c.inputs.at("bias").data;
  for (std::int64_t r = 0; r < rows; ++r) {
    double s1 = 0, s2 = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      s1 += x[r * cols + j];
      s2 += x[r * cols + j] * x[r * cols + j];
    }
    const double m = s1 / cols, var = s2 / cols - m * m;
    const double rstd = 1 / std::sqrt(var + c.epsilon);
    got["rstd"].data[r] = rstd;
    got["mean"].data[r] = m;
    for (std::int64_t j = 0; j < cols; ++j)
      got["y"].data[r * cols + j] = static_cast<double>(
          static_cast<long double>(x[r * cols + j] - m) * rstd * w[j] + b[j]);
  }
  expect_first(fc, got, "one_pass_variance_fp64");
}

// Residual blocks backward (every parameter gradient and dx): faults planted through the
// certified reference evaluating the block with the fault applied as a change of the case.
ref::Case block_bwd_case(ref::Op op, ref::Block block) {
  std::mt19937_64 rng(21);
  const std::int64_t rows = 4, d = 16, f = 8, layers = 2, k = block == ref::Block::sandwich ? 2 : 1;
  ref::Case c;
  c.op = op;
  c.block = block;
  c.layers = layers;
  c.affine = ref::Affine::weight_bias;
  c.epsilon = 1e-5;
  c.direction = ref::Direction::backward;
  const DType t = DType::float32;
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_residual = c.dtype_compute = t;
  auto tensor = [&](std::vector<std::int64_t> shape, double mean, double sd) {
    std::size_t n = 1;
    for (auto e : shape) n *= static_cast<std::size_t>(e);
    return ref::Tensor{t, shape, normal(rng, n, mean, sd, t)};
  };
  c.inputs["x"] = tensor({rows, d}, 0.5, 1);
  c.inputs["ffn_w1"] = tensor({layers, f, d}, 0, 0.5);
  c.inputs["ffn_b1"] = tensor({layers, f}, 0, 0.5);
  c.inputs["ffn_w2"] = tensor({layers, d, f}, 0, 0.5);
  c.inputs["ffn_b2"] = tensor({layers, d}, 0, 0.5);
  c.inputs["weight"] = tensor({layers, k, d}, 1, 0.5);
  c.inputs["bias"] = tensor({layers, k, d}, 0, 0.5);
  c.inputs["dy"] = tensor({rows, d}, 0, 1);
  return c;
}

TEST(Diagnosis, BlocksBackwardFromTheReference) {
  for (const auto block : {ref::Block::pre, ref::Block::post, ref::Block::sandwich}) {
    SCOPED_TRACE(static_cast<int>(block));
    auto rms = block_bwd_case(ref::Op::rmsnorm, block);
    auto centred = rms;
    centred.op = ref::Op::layernorm;
    const auto fc = fixture_of(rms);
    expect_first(fc, outputs_of(centred, fc), "rms_centred");

    // Variances near eps: an eps of 1e-3 instead of 1e-5 is one of the values tried backward.
    auto ln = block_bwd_case(ref::Op::layernorm, block);
    for (auto& v : ln.inputs["x"].data) v = ref::round_to(v * 1e-2, DType::float32);
    auto other = ln;
    other.epsilon = 1e-3;
    const auto fl = fixture_of(ln);
    expect_first(fl, outputs_of(other, fl), "eps_other_value");
  }
}

// Backward of a kernel that normalizes other dims than the case's (`stat_axes`), or reads the
// parameters at x's flat index mod their size (`flat_params`): it differentiates its own
// function. Made from the certified reference on a changed case, all in float64 and rounded once
// here: dx is the reference's backward of a norm over `stat_axes` without affine, fed dy times
// the scale each element reads; the column sums are sums of dy times the reference's x-hat (its
// forward without affine over `stat_axes`) into the parameter each element reads.
Outputs axis_fault_backward(const ref::Case& c, const std::vector<std::int64_t>& stat_axes, bool flat_params) {
  const auto g = ref::geometry_of(c);
  const auto& x = c.inputs.at("x");
  const auto& dy = c.inputs.at("dy").data;
  const auto* w = c.affine != ref::Affine::none ? &c.inputs.at("weight").data : nullptr;
  std::vector<std::int64_t> pidx(x.data.size());
  for (std::int64_t r = 0; r < g.rows; ++r)
    for (std::int64_t j = 0; j < g.cols; ++j) {
      const auto i = static_cast<std::size_t>(g.row_base[r] + g.col_delta[j]);
      pidx[i] = flat_params ? static_cast<std::int64_t>(i % static_cast<std::size_t>(g.cols)) : j;
    }
  ref::Case a = c;
  a.affine = ref::Affine::none;
  a.weight_offset = 0;
  a.inputs.erase("weight");
  a.inputs.erase("bias");
  a.axes = stat_axes;
  a.dtype_x = a.dtype_param = a.dtype_out = a.dtype_residual = a.dtype_compute = DType::float64;
  for (auto& [name, t] : a.inputs) t.dtype = DType::float64;
  auto& dya = a.inputs.at("dy").data;
  for (std::size_t i = 0; i < dya.size(); ++i)
    dya[i] = dy[i] * (w ? c.weight_offset + (*w)[static_cast<std::size_t>(pidx[i])] : 1.0);  // exact
  const auto dx = ref::evaluate(a).outputs.at("dx").f64;
  a.direction = ref::Direction::forward;
  a.inputs.erase("dy");
  const auto xhat = ref::evaluate(a).outputs.at("y").f64;
  Outputs o;
  o["dx"] = ref::Tensor{c.dtype_x, x.shape, std::vector<double>(dx.size())};
  for (std::size_t i = 0; i < dx.size(); ++i) o["dx"].data[i] = ref::round_to(dx[i], c.dtype_x);
  auto column_sums = [&](const char* name, bool times_xhat) {
    std::vector<long double> acc(static_cast<std::size_t>(g.cols), 0);
    for (std::size_t i = 0; i < dy.size(); ++i)
      acc[static_cast<std::size_t>(pidx[i])] += static_cast<long double>(dy[i]) * (times_xhat ? xhat[i] : 1.0);
    ref::Tensor t{c.dtype_param, g.param_shape, std::vector<double>(acc.size())};
    for (std::size_t p = 0; p < acc.size(); ++p) t.data[p] = ref::round_to(static_cast<double>(acc[p]), c.dtype_param);
    o[name] = std::move(t);
  };
  if (w) column_sums("dweight", true);
  if (c.affine == ref::Affine::weight_bias) column_sums("dbias", false);
  return o;
}

// Backward cases normalizing dims {1, 2} of a [2, 6, 4, 8] tensor (the ci tier's axis cases).
TEST(Diagnosis, AxisFaultsBackwardFromTheReference) {
  for (const auto affine : {ref::Affine::none, ref::Affine::weight_bias}) {
    SCOPED_TRACE(static_cast<int>(affine));
    const std::vector<std::int64_t> shape{2, 6, 4, 8};
    std::mt19937_64 rng(21);
    ref::Case c;
    c.op = ref::Op::layernorm;
    c.affine = affine;
    c.direction = ref::Direction::backward;
    c.axes = std::vector<std::int64_t>{1, 2};
    c.inputs["x"] = ref::Tensor{DType::float32, shape, normal(rng, 384, 0.5, 1, DType::float32)};
    c.inputs["dy"] = ref::Tensor{DType::float32, shape, normal(rng, 384, 0, 1, DType::float32)};
    if (affine != ref::Affine::none) {
      c.inputs["weight"] = ref::Tensor{DType::float32, {6, 4}, normal(rng, 24, 1, 0.5, DType::float32)};
      c.inputs["bias"] = ref::Tensor{DType::float32, {6, 4}, normal(rng, 24, 0, 0.5, DType::float32)};
    }
    const auto fc = fixture_of(c);
    expect_first(fc, axis_fault_backward(c, {3}, false), "stats_last_dim_only");
    expect_first(fc, axis_fault_backward(c, {1, 2, 3}, false), "stats_all_but_batch");
    if (affine != ref::Affine::none) expect_first(fc, axis_fault_backward(c, {1, 2}, true), "weight_not_broadcast");
  }
}

// Rows from a limit on left at 0 (a launch grid capped): the limit is found.
TEST(Diagnosis, RowsNotComputed) {
  const auto c = make_case(ref::Op::rmsnorm, ref::Affine::weight, 40, 8, 0, 1);
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  for (std::size_t i = 30 * 8; i < got["y"].data.size(); ++i) got["y"].data[i] = 0;
  for (std::size_t r = 30; r < 40; ++r) got["rstd"].data[r] = 0;
  expect_first(fc, got, "rows_not_computed");
  EXPECT_EQ(diagnose(fc, got)[0].parameters.at("first_row_not_computed"), 30);
}

// The correctly rounded (spec) outputs: no dialect may explain them better than the spec.
// A fault whose effect is a fraction of an allowance everywhere (eps 1e-5 dropped on rows of
// variance 1.4: y moves by about eps / (2 var) relative), on a kernel whose own rounding adds 0.9
// allowance in the same direction on one element: the spec fails there, the faulty semantics
// (the certified reference without eps) explain every output. The outputs cannot tell the
// dialect from the spec element by element, yet they reject the one and accept the other: it is
// the diagnosis (like N - 1 in a bfloat16 backward of 768 columns, DIAGNOSIS.md).
TEST(Diagnosis, FaultBelowTheResolutionThatExplainsWhereTheSpecFails) {
  const auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0, 1.2);
  const auto fc = fixture_of(c);
  auto f = c;
  f.epsilon = 0;
  const auto faulty = ref::evaluate(f).outputs;
  const auto allow = derive_allowances(c);
  Outputs got = outputs_of(f, fc);
  const auto& a = allow.at("y").abs;
  const auto& spec_y = fc.expected.at("y").f64;
  const auto& fault_y = faulty.at("y").f64;
  std::size_t worst = 0;
  double effect = 0;  // the fault's largest effect on y, in allowances
  for (std::size_t i = 0; i < spec_y.size(); ++i)
    if (std::fabs(fault_y[i] - spec_y[i]) / a[i] > effect) {
      effect = std::fabs(fault_y[i] - spec_y[i]) / a[i];
      worst = i;
    }
  ASSERT_GT(effect, 0.15);
  ASSERT_LT(effect, 0.5) << "the fault must be below what the outputs resolve element by element";
  const double dir = fault_y[worst] > spec_y[worst] ? 1 : -1;
  double& v = got["y"].data[worst];
  v = ref::round_to(fault_y[worst] + dir * 0.9 * a[worst], c.dtype_out);
  ASSERT_LE(std::fabs(v - fault_y[worst]), a[worst]);
  ASSERT_GT(std::fabs(v - spec_y[worst]), a[worst]);
  expect_first(fc, got, "eps_missing");
  // The same perturbation against the fault's direction: no dialect of the stats explains it.
  v = ref::round_to(fault_y[worst] - dir * 1.2 * a[worst], c.dtype_out);
  const auto d = diagnose(fc, got, allow);
  ASSERT_FALSE(d.empty());
  EXPECT_FALSE(names(d[0], "eps_missing") && d[0].explains) << d[0].evidence;
}

TEST(Diagnosis, CorrectOutputsAreExplainedBestByTheSpec) {
  std::vector<ref::Case> cases{eps_case(), eps_case(ref::Op::rmsnorm),
                               make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 17, 1, 1),
                               make_case(ref::Op::layernorm, ref::Affine::weight, 4, 64, 1000, 1)};
  auto bf = make_case(ref::Op::rmsnorm, ref::Affine::weight, 4, 64, 0, 1, DType::bfloat16);
  bf.contract = "llama";
  cases.push_back(bf);
  for (const auto& c : cases) {
    const auto fc = fixture_of(c);
    Outputs got = certified(fc);
    const auto allow = derive_allowances(c);
    const double spec = spec_score(fc, got, allow);
    EXPECT_LE(spec, 1.0);
    // Dialects within 0.1 allowance of the spec everywhere are not reported at all.
    for (const auto& d : diagnose(fc, got, allow, {.keep = 100}))
      EXPECT_GE(d.score, spec - 0.1) << d.dialect
                                     << " explains correct outputs better than the spec: " << d.evidence;
  }
}

TEST(Diagnosis, SaysWhenNothingExplains) {
  const auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0, 1);
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  for (auto& v : got["y"].data) v = 7;
  const auto d = diagnose(fc, got);
  ASSERT_FALSE(d.empty());
  EXPECT_FALSE(d[0].explains);
  // No dialect comes clearly closer than the spec: none is named.
  const std::string none = describe_diagnosis(d);
  EXPECT_NE(none.find("no known fault explains these outputs"), std::string::npos) << none;
  EXPECT_EQ(none.find(d[0].dialect), std::string::npos) << none;

  // The bias left out, and one element off by 3 allowances more: bias_missing does not explain
  // it, but is far closer than the spec, so it is named as the closest.
  auto f = c;
  for (auto& v : f.inputs["bias"].data) v = 0;
  got = outputs_of(f, fc);
  const auto allow = derive_allowances(c);
  got["y"].data[5] += 3 * allow.at("y").abs[5];
  const auto d2 = diagnose(fc, got);
  ASSERT_FALSE(d2.empty());
  EXPECT_FALSE(d2[0].explains);
  const std::string closest = describe_diagnosis(d2);
  EXPECT_NE(closest.find("no dialect explains the outputs; closest: bias_missing"), std::string::npos) << closest;
}

// The ranking of `got`, for failure messages.
std::string ranking_of(const std::vector<Diagnosis>& d) {
  std::string r;
  for (const auto& x : d) r += "\n  " + x.dialect + " " + std::to_string(x.score) + " " + x.evidence;
  return r;
}

// The value of v rounded toward zero in t (a float16 output truncated instead of rounded).
double truncated(double v, DType t) {
  const double r = ref::round_to(std::fabs(v), t);
  const double tz = r > std::fabs(v) ? r - 2 * ref::rounding_gap(r, t).below : r;
  return std::copysign(tz, v);
}

// A float16 y truncated toward zero instead of rounded (the certified exact values truncated;
// mean and rstd, float32, correct), as ln_f16_none_fwd and ln_f16_weight_fwd of the ci tier
// have it (8 rows of 768), judged as `any` and as `two_pass` (whose decided final rounding shows
// it far more often): output_truncated_fp16 explains it, first, and no other dialect may claim
// to. eps_other_value did, on y alone (the per-output diagnosis): a larger fitted eps shrinks y
// towards zero as truncation does, while the right rstd output says eps is the case's; nor may
// rstd_rounded_fp16 (issue #23 saw it ranked first, not explaining).
TEST(Diagnosis, Float16TruncationIsNamedByItsDialectAlone) {
  int failed = 0;
  for (auto affine : {ref::Affine::none, ref::Affine::weight}) {
    for (unsigned seed : {1u, 2u, 3u}) {
      auto c = make_case(ref::Op::layernorm, affine, 8, 768, 0, 1, DType::float16, seed);
      const auto fc = fixture_of(c);
      Outputs got = certified(fc);
      const auto& y = fc.expected.at("y");
      for (std::size_t i = 0; i < y.f64.size(); ++i) got["y"].data[i] = truncated(y.f64[i], DType::float16);
      for (const char* red : {"any", "two_pass"}) {
        const auto allow = derive_allowances(c, parse_reduction(red));
        if (check_case(fc, got, allow).verdict != Verdict::failed) continue;  // within allowance
        ++failed;
        const auto d = diagnose(fc, got, allow, {.keep = 100});
        ASSERT_FALSE(d.empty());
        EXPECT_EQ(d[0].dialect, "output_truncated_fp16") << "seed " << seed << " " << red << ranking_of(d);
        EXPECT_TRUE(d[0].explains) << d[0].evidence;
        EXPECT_TRUE(d[0].output.empty()) << "explained on the whole case: " << d[0].output;
        for (std::size_t i = 1; i < d.size(); ++i)
          EXPECT_FALSE(d[i].explains) << "seed " << seed << " " << red << ": " << d[i].dialect << " on "
                                      << d[i].output << ranking_of(d);
      }
    }
  }
  EXPECT_GT(failed, 6) << "the truncation must show on some case as `any`, and on every one as two_pass";
}

// A float32 two-pass LayerNorm forward (weight, or none) written here in float, its y converted
// to float16 by truncation or to nearest; mean and rstd returned as float.
Outputs float_kernel(const ref::Case& c, bool truncate) {
  const auto& x = c.inputs.at("x");
  const std::int64_t n = x.shape.back(), rows = x.shape.front();
  const auto* w = c.affine != ref::Affine::none ? &c.inputs.at("weight") : nullptr;
  Outputs o;
  o["y"] = ref::Tensor{c.dtype_out, x.shape, std::vector<double>(x.data.size())};
  o["mean"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(static_cast<std::size_t>(rows))};
  o["rstd"] = ref::Tensor{DType::float32, {rows, 1}, std::vector<double>(static_cast<std::size_t>(rows))};
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto xv = [&](std::int64_t j) {
      return static_cast<float>(x.data[static_cast<std::size_t>(r * n + j)]);
    };
    float s = 0, ss = 0;
    for (std::int64_t j = 0; j < n; ++j) s += xv(j);
    const float mean = s / static_cast<float>(n);
    for (std::int64_t j = 0; j < n; ++j) ss += (xv(j) - mean) * (xv(j) - mean);
    const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(c.epsilon));
    o["mean"].data[r] = mean;
    o["rstd"].data[r] = rstd;
    for (std::int64_t j = 0; j < n; ++j) {
      float v = (xv(j) - mean) * rstd;
      if (w) v *= static_cast<float>(w->data[j]);
      const double yv = static_cast<double>(v);
      o["y"].data[r * n + j] = truncate ? truncated(yv, DType::float16) : ref::round_to(yv, DType::float16);
    }
  }
  return o;
}

// A truncating float32 kernel where its value sits within its own error of a float16 value: rows
// of +a, -a (x-hat exactly +-1 but for eps 1e-12) beside normal rows. Exactly 1 - 1e-13 truncates
// to the float16 value below 1, while the kernel's float value may be 1.0 itself and truncate to
// 1: one ulp apart from truncating the exact value. The dialect predicts both (an interval), so
// it names the kernel, as `any` and as `two_pass` (which FAILs it: the exact value is not
// within its error of a rounding boundary, so the allowance is its distance to 1).
TEST(Diagnosis, Float16TruncationWithinTheKernelsErrorOfAFloat16Value) {
  for (auto affine : {ref::Affine::none, ref::Affine::weight}) {
    auto c = make_case(ref::Op::layernorm, affine, 8, 256, 0, 1, DType::float16, 5);
    c.epsilon = 1e-12;
    const double level[4] = {0.2998046875, 1.7001953125, 3.3, 0.0999};
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t j = 0; j < 256; ++j)
        c.inputs["x"].data[r * 256 + j] = ref::round_to((j % 2 ? -1 : 1) * level[r], DType::float16);
    const auto fc = fixture_of(c);
    const Outputs got = float_kernel(c, true);
    // The case has elements where the kernel's truncation is not the exact value's.
    int apart = 0;
    const auto& y = fc.expected.at("y");
    for (std::size_t i = 0; i < y.f64.size(); ++i)
      apart += got.at("y").data[i] != truncated(y.f64[i], DType::float16);
    EXPECT_GT(apart, 0) << "no element of the kernel's truncation lies apart from the exact value's";
    for (const char* red : {"any", "two_pass"}) {
      const auto allow = derive_allowances(c, parse_reduction(red));
      if (check_case(fc, got, allow).verdict != Verdict::failed) {
        EXPECT_STREQ(red, "any") << "two_pass must reject the truncation";
        continue;
      }
      const auto d = diagnose(fc, got, allow, {.keep = 100});
      ASSERT_FALSE(d.empty());
      EXPECT_EQ(d[0].dialect, "output_truncated_fp16") << red << ranking_of(d);
      EXPECT_TRUE(d[0].explains) << red << ": " << d[0].evidence;
      for (std::size_t i = 1; i < d.size(); ++i) EXPECT_FALSE(d[i].explains) << red << ": " << d[i].dialect;
    }
    // The same kernel rounding to nearest conforms under both; truncation does not explain it.
    const Outputs right = float_kernel(c, false);
    for (const char* red : {"any", "two_pass"}) {
      const auto allow = derive_allowances(c, parse_reduction(red));
      EXPECT_NE(check_case(fc, right, allow).verdict, Verdict::failed) << red;
      for (const auto& x : diagnose(fc, right, allow, {.keep = 100}))
        if (x.dialect == "output_truncated_fp16") {
          EXPECT_FALSE(x.explains) << red << ": " << x.evidence;
        }
    }
  }
}

// output_truncated_fp16 explains only truncation: not the certified (correctly rounded) y, nor a
// float32 kernel's correctly rounded y, nor rstd rounded to float16 before the multiply (a y
// rounded to nearest from a slightly wrong value), nor a y rounded to float16 from the wrong eps.
TEST(Diagnosis, Float16TruncationDialectExplainsNothingElse) {
  int failing_faults = 0;
  for (auto affine : {ref::Affine::none, ref::Affine::weight}) {
    for (unsigned seed : {1u, 2u}) {
      auto c = make_case(ref::Op::layernorm, affine, 8, 768, 0, 1, DType::float16, seed);
      const auto fc = fixture_of(c);
      Outputs right = certified(fc);
      auto eps = c;
      eps.epsilon = 1e-2;
      const std::vector<std::pair<std::string, Outputs>> outs = {
          {"certified", right},
          {"float32 kernel", float_kernel(c, false)},
          {"rstd rounded to float16",
           faulty_forward(
               c, [&](double var, double, double) { return 1 / std::sqrt(var + c.epsilon); }, false,
               DType::float16)},
          {"eps 1e-2", outputs_of(eps, fc)}};
      for (const auto& [what, got] : outs) {
        for (const char* red : {"any", "two_pass"}) {
          const auto allow = derive_allowances(c, parse_reduction(red));
          const bool failed = check_case(fc, got, allow).verdict == Verdict::failed;
          if (what != "certified" && what != "float32 kernel") failing_faults += failed;
          for (const auto& x : diagnose(fc, got, allow, {.keep = 100}))
            if (x.dialect == "output_truncated_fp16") {
              EXPECT_FALSE(x.explains) << what << " seed " << seed << " " << red << ": " << x.evidence;
            }
        }
      }
    }
  }
  EXPECT_GT(failing_faults, 0) << "the other faults must show";
}

// The weight applied before the statistics: y = Norm(w x) + b (the reference on x' = w x, the
// product rounded to float32, with weight 1), mean and rstd those of w x. No other eps explains
// it: eps_other_value must not claim to. (Issue #23 saw that claim on a case not recorded; this
// construction, weights of spread 0.5 and 0.05, did not show it before the per-output change
// either: it guards the claim, it did not reproduce it.)
TEST(Diagnosis, WeightBeforeTheStatisticsIsNotAnotherEps) {
  for (double spread : {0.5, 0.05}) {
    auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 8, 256, 0, 1);
    std::mt19937_64 rng(9);
    c.inputs["weight"].data = normal(rng, 256, 1, spread, DType::float32);
    const auto fc = fixture_of(c);
    auto f = c;
    for (std::size_t i = 0; i < f.inputs["x"].data.size(); ++i)
      f.inputs["x"].data[i] = ref::round_to(c.inputs["x"].data[i] * c.inputs["weight"].data[i % 256], DType::float32);
    for (auto& v : f.inputs["weight"].data) v = 1;
    const Outputs got = outputs_of(f, fc);
    ASSERT_EQ(check_case(fc, got, derive_allowances(c)).verdict, Verdict::failed);
    const auto d = diagnose(fc, got, {.keep = 100});
    for (const auto& x : d)
      if (x.dialect == "eps_other_value") {
        EXPECT_FALSE(x.explains) << "spread " << spread << ": " << x.evidence << ranking_of(d);
      }
  }
}

// A one-pass variance E[h^2] - E[h]^2 in float32 whose sums are a tree, as GPU kernels reduce
// (64 strided lanes, each summed in order, then folded in halves: lane[i] += lane[i + s]),
// written here in float, on constant rows (variance 0 exactly; the one-pass sums leave ~1e-6):
// one_pass_variance_fp32 names it and explains it (it modelled only sequential sums; before, no
// dialect explained it: "no known fault explains these outputs").
TEST(Diagnosis, OnePassVarianceWithTreeSums) {
  auto c = make_case(ref::Op::layernorm, ref::Affine::none, 8, 768, 0, 1);
  for (std::size_t i = 0; i < c.inputs["x"].data.size(); ++i)
    c.inputs["x"].data[i] = c.inputs["x"].data[i / 768 * 768];  // row r: its first value, 768 times
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  const auto& x = c.inputs.at("x").data;
  const float eps = static_cast<float>(c.epsilon);
  for (std::size_t r = 0; r < 8; ++r) {
    float s1[64] = {}, s2[64] = {};
    for (std::size_t j = 0; j < 768; ++j) {
      const float v = static_cast<float>(x[r * 768 + j]);
      s1[j % 64] += v;
      s2[j % 64] += v * v;
    }
    for (std::size_t s = 32; s > 0; s /= 2)
      for (std::size_t i = 0; i < s; ++i) s1[i] += s1[i + s], s2[i] += s2[i + s];
    const float mean = s1[0] / 768.0f, var = s2[0] / 768.0f - mean * mean;
    const float rstd = 1.0f / std::sqrt(var + eps);
    got["mean"].data[r] = mean;
    got["rstd"].data[r] = rstd;
    for (std::size_t j = 0; j < 768; ++j)
      got["y"].data[r * 768 + j] = (static_cast<float>(x[r * 768 + j]) - mean) * rstd;
  }
  expect_first(fc, got, "one_pass_variance_fp32");
}

// A one-pass variance in float32 with sequential sums that clamps a variance cancelled below 0
// (max(var, 0), as most one-pass kernels do before adding eps), on rows of mean 1000 and sigma
// 0.1: the sums' rounding (ulp of E[h^2] 0.06, of the running sum up to 64) swamps the variance
// of 0.01, so some rows go below 0 and get rstd 1/sqrt(eps). one_pass_variance_fp32 explains it with the variance floor;
// before, modelled unclamped (a NaN rstd on those rows), no dialect did ("no known fault").
TEST(Diagnosis, OnePassVarianceClampedAtZero) {
  const std::int64_t rows = 8, cols = 1024;
  auto c = make_case(ref::Op::layernorm, ref::Affine::none, rows, cols, 1000, 0.1);
  const auto fc = fixture_of(c);
  Outputs got = certified(fc);
  const auto& x = c.inputs.at("x").data;
  const float eps = static_cast<float>(c.epsilon);
  int clamped = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    float s1 = 0, s2 = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = static_cast<float>(x[r * cols + j]);
      s1 += v;
      s2 += v * v;
    }
    const float mean = s1 / static_cast<float>(cols);
    float var = s2 / static_cast<float>(cols) - mean * mean;
    if (var < 0) ++clamped;
    var = std::max(var, 0.0f);
    const float rstd = 1.0f / std::sqrt(var + eps);
    got["mean"].data[r] = mean;
    got["rstd"].data[r] = rstd;
    for (std::int64_t j = 0; j < cols; ++j)
      got["y"].data[r * cols + j] = (static_cast<float>(x[r * cols + j]) - mean) * rstd;
  }
  ASSERT_GT(clamped, 0) << "no row's variance went below 0: the case does not show the clamp";
  ASSERT_LT(clamped, rows) << "every row clamped: the case does not show the sums' order";
  // At |mean|/sigma 1e4 `any` (every correct algorithm's bound) cannot judge float32 rows: the
  // case is MISTRUSTED. A kernel declared two_pass is judged, and FAILED, and diagnosed.
  const auto allow = derive_allowances(fc.c, parse_reduction("two_pass"));
  ASSERT_EQ(check_case(fc, got, allow).verdict, Verdict::failed);
  const auto d = diagnose(fc, got, allow);
  ASSERT_FALSE(d.empty());
  std::string ranking;
  for (const auto& e : d) ranking += "\n  " + e.dialect + " " + std::to_string(e.score) + " " + e.evidence;
  EXPECT_TRUE(names(d[0], "one_pass_variance_fp32")) << ranking;
  EXPECT_TRUE(d[0].explains) << ranking;
  EXPECT_EQ(d[0].parameters.count("variance floor"), 1u) << ranking;
}

// A wrong shape is a shape error: the checker says so, and the case is not diagnosed.
TEST(Diagnosis, AWrongShapeIsNotDiagnosed) {
  const auto c = make_case(ref::Op::layernorm, ref::Affine::weight_bias, 4, 64, 0, 1);
  const auto fc = fixture_of(c);
  auto f = c;
  for (auto& v : f.inputs["bias"].data) v = 0;
  Outputs got = outputs_of(f, fc);  // bias_missing: FAILED on values, diagnosable
  const auto values = check_case(fc, got, derive_allowances(c));
  EXPECT_EQ(values.verdict, Verdict::failed);
  EXPECT_TRUE(diagnosable(values));
  got["y"].shape = {64, 4};  // the same values, transposed shape
  const auto shape = check_case(fc, got, derive_allowances(c));
  EXPECT_EQ(shape.verdict, Verdict::failed);
  EXPECT_FALSE(diagnosable(shape));
  EXPECT_TRUE(diagnose(fc, got).empty());
}

TEST(Diagnosis, PanelCoversTheFaultClasses) {
  std::set<std::string> classes;
  for (const auto& d : dialect_panel()) classes.insert(d.fault_class);
  for (const char* k : {"A", "B", "C", "D", "E", "G"}) EXPECT_TRUE(classes.count(k)) << k;
}

}  // namespace
}  // namespace normcheck::conf
