// RapidCheck generators of normalization cases: shapes, axes, ops, affine/offset, residual and
// blocks, dtypes and contracts a candidate declares, epsilon, and value families.
//
// A generated case is a case-list entry (fixtures/CASES.md) drawn field by field with RapidCheck
// and materialized by the fixtures library (fix::parse_case_entry + fix::materialize), so the
// value families are exactly those of the golden fixtures. Every field shrinks towards the
// simplest choice: the first element of each list below, small sizes, small integer values.
//
// The functions that return values (draw_*) pick with `*gen` and must be called inside a
// RapidCheck property; the picks shrink together with the property's counterexample.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/fixtures/case_list.hpp"
#include "normcheck/reference/case.hpp"

namespace normcheck::prop {

// What a generated case may contain, besides the candidate's capabilities.
struct CaseLimits {
  std::int64_t max_hidden = 8192;         // elements per normalized row
  std::int64_t max_elements = 1 << 16;    // elements of x, except the many-row thresholds below
  bool many_rows = true;                  // row counts 65535..65537 (with rows of 1..3 elements)
  bool nonfinite = true;                  // NaN / Inf families
  bool residual = true;                   // fused residual add
  bool blocks = true;                     // residual blocks
  bool blocks_required = false;           // only block cases (of block_kinds; empty: any)
  std::vector<ref::Block> block_kinds;
  bool backward = true;                   // backward direction
  bool general_axes = true;               // axis -2, explicit axes
  bool contracts = true;                  // contracts other than exact
  bool mixed_dtypes = true;               // dtype_param / out / residual other than dtype_x
  bool unit_affine = false;               // weight exactly 1 - offset, no bias (identities)
  // Fused norm + quantization (a `quant` contract: reference/README.md "Quantized outputs"), where
  // the candidate declares it (Capabilities::quant): a preset, or format, scale kind and every
  // contract field drawn; forward, last dim, no block. Off by default: only the properties whose
  // relation holds for codes and scales turn it on (agreement, determinism).
  bool quant = false;
  bool quant_required = false;            // only quantized cases (`prop --quant-only`)
  bool residual_required = false;         // only fused residual cases
  std::vector<ref::Affine> affines;       // empty: none, weight, weight_bias
  std::vector<ref::Op> ops;               // empty: what the candidate declares
  std::vector<ref::Direction> directions; // empty: what the limits and candidate allow
};

// A drawn case: the entry it came from (for messages and fixtures) and the materialized case.
struct DrawnCase {
  nlohmann::json entry;  // the case-list entry (CASES.md), id "prop"
  std::uint64_t seed = 0;
  fix::CaseSpec spec;
  ref::Case c;
  std::string family;  // the value family of x
};

// Draws a case the candidate declares it supports (a combination it would decline, or that the
// case list rejects, is discarded with RC_DISCARD). Call inside a property.
DrawnCase draw_case(const conf::Capabilities& caps, const CaseLimits& limits);

// Materializes an entry (used by draw_case, and by properties that derive one case from another's
// entry). Throws fix::FixtureError when the entry is not a valid case.
DrawnCase materialize_entry(const nlohmann::json& entry, std::uint64_t seed);

// An index in [0, n), shrinking towards 0 (RapidCheck's elementOf/element do not shrink), small
// at small sizes. Lists are ordered simplest first. Discards the test when n is 0.
std::size_t draw_index(std::size_t n);
template <class T>
T draw_from(const std::vector<T>& v) {
  return v[draw_index(v.size())];
}

// A hidden size: 1..3 weighted up, small sizes, odd sizes, powers of two and their neighbours,
// any size up to `max` (shrinks towards 1).
std::int64_t draw_hidden(std::int64_t max);
// A row count: small counts, and the thresholds where kernels switch code paths (255/256/257,
// 1023/1024/1025, 4096, and 65535/65536/65537 when `many` is set), within max_elements / hidden.
std::int64_t draw_rows(std::int64_t hidden, std::int64_t max_elements, bool many);

// One line describing a case: op, shape, axes, dtypes, contract, epsilon, family.
std::string case_summary(const ref::Case& c, const std::string& family = "");

// The cases draw_case has drawn on this thread since the last clear, as case_summary lines
// joined by "; " (the runner clears it before each test and keeps it for the slowest test).
std::string& drawn_cases();
// How many of those cases carry a quant contract (cleared with drawn_cases by the runner, which
// counts the tests that passed with one: PropertyResult::quant_tests).
int& drawn_quant_cases();

}  // namespace normcheck::prop
