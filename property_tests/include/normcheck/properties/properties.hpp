// Properties that any candidate (builtin:, plugin:, cmd:) must satisfy, checked with RapidCheck on
// generated cases (generators.hpp), and the runner that shrinks a failure to a counterexample and
// turns it into a one-case fixture file with certified expected values.
//
// Relations are of two kinds (property_tests/README.md):
// - bitwise: identical raw bits (+0 and -0 differ; any NaN equals any NaN): determinism, row
//   independence, batch-size and layout invariance. A kernel is its own oracle there.
// - within tolerance: agreement with the certified reference under the tolerance model, and
//   metamorphic relations whose two sides have the same exact value; the slack is the sum of the
//   two sides' allowances from conf::derive_allowances, never a guessed constant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/properties/generators.hpp"

namespace normcheck::prop {

enum class PropVerdict { passed, failed, unsupported, crashed };
std::string_view name_of(PropVerdict v);  // "PASSED", "FAILED", "UNSUPPORTED", "CRASHED"

// What a failing test leaves behind: the case to replay (the one whose outputs break the
// relation, or disagree with the reference where one does) and what went wrong.
struct Failure {
  std::string message;       // the relation that broke, with the numbers
  ref::Case replay;          // the counterexample as a case (inputs included)
  std::string family;        // value family of x
  bool crashed = false;      // the candidate threw (CandidateError / CandidateTimeout)
  // The replayed case checked against the reference: FAILED for a case `normcheck run` rejects;
  // PASSED where only a bitwise or metamorphic relation breaks (each side within tolerance).
  std::optional<conf::CaseResult> agreement;
  // Sharded properties (shard:emulation): the shard plan the case ran under
  // (conformance/sharding/README.md, "Shard plans") and the planted fault ("" for the correct
  // emulation). The case alone does not reproduce a sharded failure.
  std::string plan, fault;
};

// State one test of a property sees.
struct Context {
  conf::Candidate& cand;
  CaseLimits limits;
  std::optional<Failure>* last_failure;  // set by a failing test just before it throws
  // Zeros accepted because the candidate declares flush-to-zero outputs (agreement): tests and
  // elements where a zero would otherwise have failed. Null: not counted.
  std::int64_t* flushed_tests = nullptr;
  std::int64_t* flushed_elements = nullptr;
  // The reduction class the candidate is judged under (its declaration, or `prop --reduction`):
  // every allowance is that class's (conformance/TOLERANCE.md, section 9).
  conf::Reduction reduction{};
};

struct Property {
  std::string name;
  std::string description;
  // One test: draws its case(s) inside RapidCheck, runs the candidate, fails with RC_FAIL.
  std::function<void(Context&)> test;
};
const std::vector<Property>& properties();

// Sharded norms on the C++ emulation of shard plans (conformance/sharding/): properties of the
// sharded check itself, with shard plans drawn beside the cases. No candidate runs; the spec
// `shard:emulation` stands for the emulation (make_shard_emulation), and `normcheck prop
// --candidate shard:emulation` runs these properties and only these.
inline constexpr std::string_view kShardEmulation = "shard:emulation";
const std::vector<Property>& shard_properties();
// `shard:emulation`, or `shard:emulation:FAULT`: the emulation with a fault of
// shard::emulated_faults() planted in what sharded_agreement runs (the suite's own mutation test
// of that property). True for the specs it takes; make_shard_emulation throws
// std::invalid_argument for an unknown fault, naming the known ones.
bool is_shard_emulation(std::string_view spec);
std::unique_ptr<conf::Candidate> make_shard_emulation(std::string_view spec = kShardEmulation);

struct Options {
  int tests = 100;                // successful tests per property
  std::uint64_t seed = 1;
  int max_size = 100;             // RapidCheck's size (sizes of early tests grow towards it)
  std::int64_t max_hidden = 8192; // largest normalized row drawn
  std::string reproduce;          // a `reproduce` string from an earlier failure: replay it only
  bool shrink = true;
  // `--quant-only`: every drawn case carries a quant contract (the properties that draw them:
  // agreement, determinism; the others discard every draw and give up as UNSUPPORTED).
  bool quant_only = false;
  // `--reduction CLASS`: judge the candidate under this class instead of its declaration.
  std::optional<conf::Reduction> reduction;
  // Called after each test case (for a progress display): tests so far, shrinks so far.
  std::function<void(int, int)> progress;
};

struct PropertyResult {
  std::string name;
  std::string description;
  PropVerdict verdict = PropVerdict::passed;
  int tests = 0;        // tests that passed (before the failure, if any)
  int shrinks = 0;      // accepted shrinking steps
  std::uint64_t seed = 0;
  std::string reproduce;  // RapidCheck's reproduce string of the failure ("" when none)
  std::string message;    // failure, give-up or crash reason
  std::optional<Failure> failure;  // the shrunk counterexample
  double seconds = 0;
  // Tests (and elements) that passed only because the candidate declares flush-to-zero outputs
  // (conf::CheckOptions): counted by `agreement`, which compares with the reference.
  std::int64_t flushed_tests = 0, flushed_elements = 0;
  // Tests that passed on a case with a quant contract (fused quantization: the generators draw
  // them for agreement and determinism where the candidate declares them).
  std::int64_t quant_tests = 0;
  // The slowest test that passed: its seconds (candidate, reference and judge together) and the
  // case(s) it drew (drawn_cases()); 0 and "" when none passed.
  double slowest_seconds = 0;
  std::string slowest_case;
};

PropertyResult run_property(const Property& p, conf::Candidate& cand, const Options& opt);

// The counterexample as a fixture case: its inputs, the certified expected outputs of
// ref::evaluate, category "property", a description naming the property and the failure.
fix::FixtureCase counterexample_case(const PropertyResult& r, const std::string& case_id);

// Text of a counterexample for people: the case attributes, every input value in decimal and hex
// float (long tensors abbreviated to `max_values` values), and the agreement verdict.
std::string counterexample_text(const Failure& f, std::size_t max_values = 64);

}  // namespace normcheck::prop
