// Helpers shared by the property definitions (properties.cpp, metamorphic.cpp). Internal.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/properties/properties.hpp"

namespace normcheck::prop {

// The tolerance-based metamorphic relations and backward identities (metamorphic.cpp).
std::vector<Property> metamorphic_properties();
// Blocks against their unfused compositions (composition.cpp).
std::vector<Property> composition_properties();

namespace detail {

// The case with its certified expected outputs (ref::evaluate).
fix::FixtureCase reference_case(const ref::Case& c, const std::string& id);
// The candidate's outputs checked against the reference (conf::check_case, with what the
// candidate declares: flush-to-zero outputs).
conf::CaseResult agreement_of(const Context& ctx, const ref::Case& c, const conf::Outputs& got);
// The allowances of the case's outputs (conf::derive_allowances), each zero of `got` widened by
// the dtype's smallest normal where the candidate declares flush-to-zero outputs
// (conf::widen_for_flushed_zeros): what the relations compare within.
std::map<std::string, conf::OutputAllowance> allowances_of(const Context& ctx, const ref::Case& c,
                                                           const conf::Outputs& got);
// Records the counterexample in ctx.last_failure and fails the test (RC_FAIL).
// `plan` and `fault`: a sharded property's shard plan and planted fault (Failure::plan, fault).
[[noreturn]] void fail(Context& ctx, const ref::Case& c, const std::string& family,
                       const std::string& message, std::optional<conf::CaseResult> agreement, bool crashed,
                       const std::string& plan = "", const std::string& fault = "");
// Runs the candidate; a decline discards the test, an exception fails it (CRASHED).
conf::Outputs run_candidate(Context& ctx, const ref::Case& c, const std::string& family);

bool same_bits(double a, double b);
std::string value_text(double v, ref::DType t);
bool rowwise(const std::string& name);
bool is_stat(const std::string& name);
std::int64_t flat_index(const ref::Geometry& g, const std::string& name, std::int64_t row, std::int64_t col);
const ref::Tensor& output_of(Context& ctx, const ref::Case& c, const std::string& family, const conf::Outputs& got,
                             const std::string& name, std::int64_t numel);
// |l - r| <= al + ar (values of two sides with the same exact value, each within its allowance of
// it). A NaN allowance (MISTRUSTED) is not compared; nan_ok accepts a NaN on either side.
std::optional<std::string> within(double l, double al, double r, double ar, bool nan_ok);

}  // namespace detail
}  // namespace normcheck::prop
