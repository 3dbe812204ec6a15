// Candidates: the implementations under test, behind one C++ interface whatever the transport
// (built-in, in-process plugin, subprocess). The runner asks a candidate whether it takes a case,
// calls it, and hands the outputs to the checker.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/conformance/capabilities.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/case.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::conf {

// nullopt when `caps` covers the case; otherwise why not ("dtype bfloat16 not supported").
std::optional<std::string> unsupported_reason(const Capabilities& caps, const ref::Case& c);

enum class CandidateKind { correct, mutant, external };
std::string_view name_of(CandidateKind k);

struct CandidateInfo {
  std::string name;  // the spec that makes it again: "builtin:cpu_two_pass", "plugin:./libk.so"
  CandidateKind kind = CandidateKind::external;
  std::string description;
  std::string fault_id;     // bundled mutants: the fault's id in the catalogue (docs/FAULTS.md)
  std::string fault_class;  // mutants: the fault class, "A" .. "G" (docs/FAULTS.md)
  std::string fault;        // mutants: the fault in one line, with the public issue it reproduces
  Capabilities caps;
  // `run --ignore-flush-declaration` judged it without its declared flush-to-zero outputs (caps
  // then says false); the results file records it (candidate.flush_declaration_ignored).
  bool flush_declaration_ignored = false;
};

// A candidate that failed to produce outputs for a case (threw, returned an error code, wrote
// garbage on the protocol): the case is CRASHED with this message; the run goes on.
class CandidateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The candidate declined the case when asked to run it (a subprocess's "decline" reply):
// UNSUPPORTED with this reason.
class CandidateDeclined : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The candidate did not answer within the time limit (subprocess transports only).
class CandidateTimeout : public CandidateError {
 public:
  using CandidateError::CandidateError;
};

// A subprocess candidate (a cmd: spec, or a plugin or builtin under --isolate) whose child died
// or hung before its hello: a candidate that exists but cannot run, not a bad spec. `normcheck
// run` reports every case CRASHED (TIMEOUT when it hung) with this message, the child's stderr
// tail included, and writes the results file (make_unstarted_candidate); elsewhere it is an
// invalid_argument like any candidate that cannot be made.
class CandidateStartError : public std::invalid_argument {
 public:
  CandidateStartError(const std::string& what, bool hung) : std::invalid_argument(what), hung_(hung) {}
  bool hung() const { return hung_; }

 private:
  bool hung_;
};

// Outputs by name ("y", "mean", "rstd", "residual_out", "dx", ...), each a dense row-major
// tensor whose values belong to its dtype; which outputs a case has is output_specs. Both are
// the case's semantics (reference/outputs.hpp). An output the candidate does not produce is left
// out (MISSING).
using ref::Outputs;
using ref::OutputSpec;
using ref::output_specs;

// How a transport that allocates the inputs lays them out in host memory (the plugin transport:
// candidate.h lets the host pass any non-negative strides). Dense row-major is the default; the
// property tests pass the same values in other layouts (memory_layout_invariance).
struct InputLayout {
  std::int64_t pad = 0;          // elements after each run of the innermost dim, filled with NaN
  std::int64_t offset_bytes = 0; // the tensor starts this far into its buffer (a multiple of 64)
  bool column_major = false;     // the first dim varies fastest (strides of the reversed dims)
  bool dense() const { return pad == 0 && offset_bytes == 0 && !column_major; }
};

class Candidate {
 public:
  virtual ~Candidate() = default;
  virtual const CandidateInfo& info() const = 0;
  // Why the candidate declines this case, or nullopt when it takes it. The default checks the
  // declared capabilities.
  virtual std::optional<std::string> declines(const ref::Case& c) const {
    return unsupported_reason(info().caps, c);
  }
  // Computes the outputs of one case (inputs in c.inputs). Throws CandidateError (CRASHED) or
  // CandidateTimeout (TIMEOUT).
  virtual Outputs run(const ref::Case& c) = 0;
  // The value every output element holds before the candidate runs, where the transport
  // allocates the outputs (the plugin transport; NaN by default, candidate.h). The property
  // tests run a second time with another pattern (DESIGN.md, "Property tests"), so that an
  // element the candidate never writes shows even where the expected value is NaN. NaN restores
  // the default. Returns false where the transport cannot set it (built-ins and subprocesses
  // allocate their outputs themselves).
  virtual bool set_output_sentinel(double value) {
    (void)value;
    return false;
  }
  // Lays out the inputs of the next calls as `layout` says (InputLayout{} restores dense).
  // Returns false where the transport does not allocate the inputs (built-ins, subprocesses).
  virtual bool set_input_layout(const InputLayout& layout) {
    (void)layout;
    return false;
  }
};

// Built-in candidates: every correct kernel and every mutant bundled with normcheck.
struct BuiltinEntry {
  CandidateInfo info;  // info.name is "builtin:NAME"
  std::function<std::unique_ptr<Candidate>()> make;
};
const std::vector<BuiltinEntry>& builtin_candidates();

// Makes a candidate from a spec string: "builtin:NAME", "plugin:PATH.so", "cmd:COMMAND ARGS...".
// `isolate` runs a plugin (or a builtin) out of process in a `normcheck worker` child that
// speaks the subprocess protocol; `timeout_s` bounds each case of a subprocess (0: none).
// Throws std::invalid_argument for a bad spec (unknown builtin, missing file, wrong ABI).
struct SpecOptions {
  bool isolate = false;
  double timeout_s = 0;
  double startup_timeout_s = 0;  // subprocesses: up to the hello (0: the larger of timeout_s, 120 s)
  std::string self_exe;  // path of the normcheck executable (for `worker` children)
};
std::unique_ptr<Candidate> make_candidate(std::string_view spec, const SpecOptions& opt = {});
// The stand-in for a candidate that could not start (CandidateStartError): named `spec`, it
// takes every case and fails each with the start error (CRASHED, or TIMEOUT when it hung).
std::unique_ptr<Candidate> make_unstarted_candidate(const std::string& spec, const CandidateStartError& e);

// The checker's options (normcheck/judge/checker.hpp) from what a candidate declares: the judge
// does not know candidates, so the mapping lives here.
struct CheckOptions;
CheckOptions check_options_of(const Capabilities& caps);

// The case with only the outputs `caps` says the candidate computes (without mean and rstd for
// Capabilities::no_statistics), or nullopt when that is every output of `fc`.
std::optional<fix::FixtureCase> judged_outputs(const fix::FixtureCase& fc, const Capabilities& caps);

}  // namespace normcheck::conf
