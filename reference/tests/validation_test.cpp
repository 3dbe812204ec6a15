// Invalid cases are rejected with an error naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "normcheck/reference/case_json.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "test_util.hpp"

namespace normcheck::ref {
namespace {

using nlohmann::json;
using testing::simple_case;

std::string error_field(const json& j) {
  try {
    (void)case_from_json(j);
  } catch (const CaseError& e) {
    return e.field();
  }
  return "<accepted>";
}

json good() {
  return json::parse(R"({"op": "layernorm", "epsilon": 1e-5, "affine": "weight_bias",
    "inputs": {"x": {"shape": [2, 3], "data": [1, 2, 3, 4, 5, "0x1.8p+2"]},
               "weight": {"shape": [3], "data": [1, 1, 1]}, "bias": {"shape": [3], "data": [0, 0, 0]}}})");
}

TEST(Validation, AcceptsAGoodCase) { EXPECT_EQ(error_field(good()), "<accepted>"); }

TEST(Validation, NamesTheBadField) {
  auto with = [](auto edit) {
    json j = good();
    edit(j);
    return error_field(j);
  };
  EXPECT_EQ(with([](json& j) { j["op"] = "batchnorm"; }), "op");
  EXPECT_EQ(with([](json& j) { j.erase("op"); }), "op");
  EXPECT_EQ(with([](json& j) { j["epsilon"] = -1; }), "epsilon");
  EXPECT_EQ(with([](json& j) { j["epsilon"] = "nan"; }), "epsilon");
  EXPECT_EQ(with([](json& j) { j["epsilon"] = "inf"; }), "epsilon");
  EXPECT_EQ(with([](json& j) { j["axis"] = 2; }), "axis");
  EXPECT_EQ(with([](json& j) { j["axis"] = -3; }), "axis");
  EXPECT_EQ(with([](json& j) { j["axes"] = json::array({0, 0}); }), "axes");
  EXPECT_EQ(with([](json& j) { j["dtype_x"] = "float8"; }), "dtype_x");
  EXPECT_EQ(with([](json& j) { j["contract"] = "llama+nonsense"; }), "contract");
  EXPECT_EQ(with([](json& j) { j["block"] = "post"; }), "inputs/ffn_w1");  // a block needs its FFN
  EXPECT_EQ(with([](json& j) { j["block"] = "middle"; }), "block");
  EXPECT_EQ(with([](json& j) { j["activation"] = "swish"; }), "activation");
  EXPECT_EQ(with([](json& j) { j["inputs"]["weight"]["shape"] = {4}; }), "inputs/weight/data");
  EXPECT_EQ(with([](json& j) { j["inputs"]["weight"] = {{"shape", {2}}, {"data", {1, 1}}}; }), "inputs/weight");
  EXPECT_EQ(with([](json& j) { j["inputs"].erase("bias"); }), "inputs/bias");
  EXPECT_EQ(with([](json& j) { j["inputs"]["dy"] = j["inputs"]["x"]; }), "inputs/dy");
  EXPECT_EQ(with([](json& j) { j["inputs"]["x"]["data"][0] = "one"; }), "inputs/x/data[0]");
  EXPECT_EQ(with([](json& j) { j["inputs"]["x"]["shape"] = {0, 3}; }), "inputs/x/shape");
  EXPECT_EQ(with([](json& j) { j["inputs"]["x"]["shape"] = {1 << 20, 1 << 20}; }), "inputs/x/shape");
  EXPECT_EQ(with([](json& j) { j["frobnicate"] = 1; }), "frobnicate");
  EXPECT_EQ(with([](json& j) { j["weight_offset"] = 1; j["affine"] = "none";
                               j["inputs"].erase("weight"); j["inputs"].erase("bias"); }), "weight_offset");
}

TEST(Validation, ValuesMustBelongToTheirDtype) {
  Case c = simple_case(Op::layernorm, 1, 2, {1, 0.1});  // 0.1 (binary64) is not a float32
  try {
    (void)evaluate(c);
    FAIL() << "accepted";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "inputs/x");
  }
}

TEST(Validation, EveryRowOfFloat32XIsChecked) {
  // evaluate() checks float32 x row by row from its row scan; a bad value anywhere must still
  // be caught with the same error: in a later row, next to a NaN, among subnormals, too large.
  for (double bad : {0.1, 0x1p-140 + 0x1p-170, 1e300}) {
    for (bool with_nan : {false, true}) {
      std::vector<double> x(3 * 4, 1.5);
      x[2 * 4 + 1] = bad;
      if (with_nan) x[2 * 4 + 3] = NAN;
      Case c = simple_case(Op::layernorm, 3, 4, x);
      try {
        (void)evaluate(c);
        FAIL() << "accepted " << bad;
      } catch (const CaseError& e) {
        EXPECT_EQ(e.field(), "inputs/x");
        EXPECT_NE(std::string(e.what()).find("element 9 "), std::string::npos) << e.what();
      }
    }
  }
  // Values that are float32 values pass: subnormals, the largest finite, zeros, NaN.
  Case ok = simple_case(Op::rmsnorm, 2, 4, {0x1p-149, -0x1p-126, 0x1.fffffep127, 0.0, -0.0, 1, NAN, 2});
  EXPECT_NO_THROW((void)evaluate(ok));
}

TEST(Validation, DecimalInputsAreRoundedToTheDtype) {
  json j = good();
  j["dtype_x"] = "float16";
  j["inputs"]["x"]["data"][0] = "0.1";
  const Case c = case_from_json(j);
  EXPECT_EQ(c.inputs.at("x").data[0], 0x1.998p-4);  // float16 nearest to 0.1
}

}  // namespace
}  // namespace normcheck::ref
