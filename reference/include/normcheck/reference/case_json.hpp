// Reading a case from JSON and writing a result as JSON (formats in reference/CASE_JSON.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/evaluate.hpp"

namespace normcheck::ref {

// Parses and validates; throws CaseError naming the field.
Case case_from_json(const nlohmann::json& j);
// The "quant" object of a case (CASE_JSON.md): a preset and/or the contract's fields.
QuantContract quant_from_json(const nlohmann::json& j);
nlohmann::json result_to_json(const Case& c, const Result& r, std::string_view version);

// A number given as text (decimal, hex float, "nan", "inf", "-inf"), rounded correctly to `t`
// (directly, without going through binary64 first). nullopt if the text is not a number.
std::optional<double> parse_number(std::string_view text, DType t);

}  // namespace normcheck::ref
