// Fused norm + quantization (internal): validation, output specs and evaluation of a case whose
// `quant` is set. README.md ("Quantized outputs") states the semantics.
#pragma once

#include <map>
#include <string>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::ref::detail {

// Throws CaseError("quant/...") for a quant contract the case cannot have.
void validate_quant(const Case& c, const Geometry& g);
std::map<std::string, OutputSpec> quant_output_specs(const Case& c, const Geometry& g);
// The norm part of a quant case: the same case without `quant` and its `scale` input, with the
// residual sum rounded where the contract says so and y in the dtype the contract quantizes.
Case norm_case_of(const Case& c);
void evaluate_quant(const Case& c, const Options& opt, Result& out);

}  // namespace normcheck::ref::detail
