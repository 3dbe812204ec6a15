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

// The enum tables (enum_table.hpp): each lists its values in declaration order (the enums are
// contiguous from 0, so a value inserted without its row shifts the rest), with distinct names
// that name_of gives and enum_parse reads back; a name outside the table is refused by the case
// JSON codec with the table's names listed.
template <class E>
void expect_whole_table() {
  const auto& rows = EnumTable<E>::rows;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(static_cast<std::size_t>(rows[i].value), i) << rows[i].name;
    EXPECT_EQ(name_of(rows[i].value), rows[i].name);
    EXPECT_EQ(enum_parse<E>(rows[i].name), rows[i].value);
    for (std::size_t k = 0; k < i; ++k) EXPECT_NE(rows[k].name, rows[i].name);
  }
  EXPECT_EQ(values_of<E>().size(), rows.size());
  EXPECT_FALSE(enum_parse<E>("").has_value());
}

TEST(EnumTables, EveryTableIsWholeAndRoundTrips) {
  expect_whole_table<Op>();
  expect_whole_table<Affine>();
  expect_whole_table<Residual>();
  expect_whole_table<Block>();
  expect_whole_table<Direction>();
  expect_whole_table<Activation>();
  expect_whole_table<DType>();
  expect_whole_table<QFormat>();
  expect_whole_table<ScaleKind>();
  expect_whole_table<ResidualSum>();
  expect_whole_table<QuantValue>();
  expect_whole_table<ScaleApply>();
  expect_whole_table<MxRule>();
  expect_whole_table<NanPolicy>();
  EXPECT_EQ(enum_names_text<Block>(), "none, post, pre, sandwich, deepnorm");
  json j = {{"op", "groupnorm"}, {"inputs", {{"x", {{"shape", {1, 2}}, {"values", {1, 2}}}}}}};
  try {
    case_from_json(j);
    ADD_FAILURE() << "an op outside the table was accepted";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "op");
    EXPECT_NE(std::string(e.what()).find("'groupnorm' is not one of: layernorm, rmsnorm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace normcheck::ref
