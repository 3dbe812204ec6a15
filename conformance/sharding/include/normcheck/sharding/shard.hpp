// Sharded cases: a shard plan (how a case's tensors are split over tensor- and sequence-parallel
// ranks), the one allowance term a correct sharded implementation adds to the tolerance model,
// and the check of gathered outputs and of each rank's copy of the replicated ones, with a
// diagnosis of the known sharding faults. conformance/sharding/README.md derives the term.
//
// This sits beside the judge (tolerance, checker, diagnosis) and uses only its public interface
// (derive_allowances, check_case): the judge absorbs it as one more allowance term and one more
// panel of dialects.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/judge/checker.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/reference/case.hpp"

namespace normcheck::shard {

// "tp=4", "tp=10+30+20+36", "sp=2,reduce=bfloat16", "tp=2,sp=2", "sp=4,sp_dim=1" (README.md,
// "Shard plans"; the same grammar as torch_dist/shard_plan.py).
struct Plan {
  std::string text;
  int tp = 1, sp = 1;
  std::vector<std::int64_t> tp_sizes, sp_sizes;  // empty: split as evenly as numpy.array_split
  int sp_dim = 0;
  ref::DType reduce = ref::DType::float32;  // dtype of the parameter-gradient all-reduce
  // dtype of the tp all-reduce of the row statistics' partial sums (TOLERANCE.md, section 11)
  ref::DType stats_reduce = ref::DType::float32;
  // the plan's all-reduces flush subnormals of their dtype to zero (README.md, "Flushing
  // all-reduces"; TOLERANCE.md, section 11)
  bool flush_subnormals = false;
  int world() const { return tp * sp; }
  // The statistics' all-reduce as the tolerance model takes it.
  conf::StatsAllReduce stats() const { return {tp, stats_reduce, flush_subnormals}; }
};
// Throws std::invalid_argument naming the item that does not parse.
Plan parse_plan(const std::string& text);

// Where each rank's part of a case lies: the tp shards of the normalized columns and the sp
// shards of the rows (as geometry_of(c) orders them).
struct Layout {
  std::vector<std::int64_t> col_shard;  // per column: its tp rank
  std::vector<std::int64_t> row_shard;  // per row: its sp rank
  std::vector<std::int64_t> n_local;    // per tp rank: columns held
};
// Throws std::invalid_argument when the plan does not fit the case (more ranks than elements,
// sizes that do not add up, sp over a normalized dim, normalized dims that are not trailing).
Layout layout_of(const ref::Case& c, const Plan& p);

// The sharding term (README.md, "The allowance term"): adds to the allowance of dweight and
// dbias what a correct implementation may lose by reducing the sp ranks' partial sums in the
// plan's reduce dtype; nothing when that is float32 compute (any summation tree is covered).
void widen_for_plan(std::map<std::string, conf::OutputAllowance>& allow, const ref::Case& c, const Plan& p);
// The allowances a sharded case is judged with: the tolerance model's with the plan's statistics
// all-reduce (TOLERANCE.md, section 11), widened by widen_for_plan.
std::map<std::string, conf::OutputAllowance> sharded_allowances(const ref::Case& c, const Plan& p);

// One case as the sharded runtime returned it (an outputs file with copies/, SCHEMA.md).
struct ShardedOutputs {
  std::string status;   // "" (outputs present), CRASHED, TIMEOUT, UNSUPPORTED
  std::string message;  // for a status
  conf::Outputs gathered;
  // Output name -> one assembled copy per rank along the axis that replicates it (mean, rstd
  // over tp; dweight, dbias over sp). Copy 0 is the one in `gathered`.
  std::map<std::string, std::vector<ref::Tensor>> copies;
  // Outputs declared to hold values wider than their dtype on purpose (the attribute
  // wider_values = 1 on the root, the case or outputs/<output>; SCHEMA.md, "Outputs files"):
  // they and their copies are judged as stored. Any other value, gathered or in a copy, that
  // its dtype cannot hold FAILS the output (conf::reject_unrepresentable).
  std::set<std::string> wider_values;
  double seconds = 0;
};

// Checks the gathered outputs and every copy with conf::check_case under the widened
// allowance, and rejects values their dtype cannot hold (conf::reject_unrepresentable, except
// for `wider_values`); copies of a replicated output must agree bit for bit; a failing case is
// diagnosed against the sharding dialects (rank-local statistics, sum of squares over the world
// size, gradients rank-local / averaged / multiplied by R), unless an output is malformed (a
// wrong shape, a value its dtype cannot hold: conf::diagnosable). The diagnosis lines go to
// `message`.
conf::CaseResult check_sharded(const fix::FixtureCase& fc, const Plan& p, const ShardedOutputs& got);

// The plan's arithmetic without processes (README.md, "Emulation"): float32 partial sums per
// rank, all-reduced in rank order (the gradients in the plan's reduce dtype, each partial
// rounded to it and every add rounded again), the same formulas as the bundled torch
// implementation; `fault` plants one of the mutants' faults: rank_local, div_world,
// not_reduced, averaged, reduced_twice. Copies come out as the ranks would hold them.
ShardedOutputs emulate(const ref::Case& c, const Plan& p, const std::string& fault = "");

// The faults `emulate` plants (the bundled torch mutants' faults, README.md "Diagnosis"), with
// what check_sharded's diagnosis says of each (a part of its message) and where each is a fault.
struct EmulatedFault {
  std::string name;       // emulate()'s `fault`
  std::string diagnosis;  // in check_sharded's message when the fault is named
  bool tp = false;        // a fault of the tp statistics' all-reduce (else of the sp gradients')
  bool rms_only = false;  // MiniMax's TP RMSNorm
};
const std::vector<EmulatedFault>& emulated_faults();
// Why `f` changes nothing the plan computes on the case ("" where it is a fault): the tp faults
// need tp ranks (MiniMax's division by the world size is also exact on equal shards), the sp
// gradient faults sp ranks and a backward case with parameters.
std::string fault_inapplicable(const EmulatedFault& f, const ref::Case& c, const Plan& p);

// Reads case `id` of a sharded outputs file (fixtures/SCHEMA.md, "Sharded outputs"), with its
// plan; throws fix::FixtureError naming file, case and field.
ShardedOutputs read_sharded(const std::string& path, const std::string& id, std::string* plan_text);
std::vector<std::string> sharded_case_ids(const std::string& path);
// Whether an outputs file is a sharded one (a case, or the root, carries `shard_plan`).
bool is_sharded_outputs(const std::string& path);

// `normcheck check --outputs F` where F is a sharded outputs file: every case the file holds (of
// those `opt.case_globs` select) judged by check_sharded under its own plan, as one run whose
// results file is written as for any outputs file. The plan leads each case's message. Throws
// fix::FixtureError for a file, case or plan that does not parse (exit 2), and
// std::invalid_argument for an option the sharded check does not take (--reduction,
// --flush-subnormal-outputs).
conf::CandidateRun check_sharded_file(const conf::RunOptions& opt);

}  // namespace normcheck::shard
