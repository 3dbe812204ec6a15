// `normcheck check` on a sharded outputs file (fixtures/SCHEMA.md, "Sharded outputs"): the CLI
// sees `shard_plan` in the file and hands it here; every case is judged by check_sharded under
// its own plan, and the run is written, printed and summarized as any `check` run is.
#include <fmt/format.h>
#include <fnmatch.h>
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "normcheck/fixtures/error.hpp"
#include "normcheck/sharding/shard.hpp"

namespace normcheck::shard {

bool is_sharded_outputs(const std::string& path) {
  std::vector<std::string> ids;
  try {
    ids = sharded_case_ids(path);
  } catch (const std::exception&) {
    return false;  // not an outputs file at all: the plain check says what is wrong with it
  }
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  bool sharded = false;
  if (f >= 0) {
    sharded = H5Aexists(f, "shard_plan") > 0;
    for (std::size_t i = 0; i < ids.size() && !sharded; ++i)
      sharded = H5Aexists_by_name(f, ("cases/" + ids[i]).c_str(), "shard_plan", H5P_DEFAULT) > 0;
    H5Fclose(f);
  }
  H5Eset_auto2(H5E_DEFAULT, func, data);
  return sharded;
}

conf::CandidateRun check_sharded_file(const conf::RunOptions& opt) {
  // The sharding term is derived for the tolerance model's `any` class and for outputs as the
  // runtime returns them; neither declaration has a derivation for sharded cases yet.
  if (opt.reduction && !opt.reduction->is_any())
    throw std::invalid_argument(
        "--reduction: a sharded outputs file is judged under the class any (conformance/sharding/README.md)");
  if (opt.outputs_flush_subnormals)
    throw std::invalid_argument(
        "--flush-subnormal-outputs: not derived for sharded outputs files; a plan's all-reduces that flush "
        "declare flush_subnormals=1 in shard_plan (conformance/sharding/README.md)");
  fix::FixtureReader fixtures(opt.fixtures);
  conf::CandidateRun run;
  run.info.name = "outputs:" + opt.outputs;
  run.info.description = "sharded outputs file " + opt.outputs;
  const auto& fids = fixtures.case_ids();
  const auto t_start = std::chrono::steady_clock::now();
  // The cases the file holds: a sharded run writes one file per plan over the cases the plan
  // selects (ci_plans.json), and a case that produced nothing is in it with its status.
  for (const auto& id : sharded_case_ids(opt.outputs)) {
    if (!std::binary_search(fids.begin(), fids.end(), id))
      throw fix::FixtureError(opt.outputs, fmt::format("case {} is not in the fixture file {}", id, opt.fixtures));
    if (!opt.case_globs.empty() &&
        std::none_of(opt.case_globs.begin(), opt.case_globs.end(),
                     [&](const std::string& g) { return ::fnmatch(g.c_str(), id.c_str(), 0) == 0; }))
      continue;
    std::string plan_text;
    const ShardedOutputs got = read_sharded(opt.outputs, id, &plan_text);
    Plan plan;
    try {
      plan = parse_plan(plan_text);
    } catch (const std::invalid_argument& e) {
      throw fix::FixtureError(opt.outputs, fmt::format("case {}: shard_plan: {}", id, e.what()));
    }
    fix::FixtureCase fc;
    try {
      fc = fixtures.read_case_later(id).finish_checked();
    } catch (const std::exception& e) {  // a damaged fixture stops the run (exit 2), as for check
      run.error = fmt::format("stopped at case {}: {}", id, e.what());
      break;
    }
    conf::CaseResult r;
    try {
      r = check_sharded(fc, plan, got);
    } catch (const std::invalid_argument& e) {  // a plan that does not fit the case
      throw fix::FixtureError(opt.outputs, fmt::format("case {}: shard_plan {}: {}", id, plan_text, e.what()));
    }
    r.case_id = id;
    r.message = fmt::format("shard plan {}{}", plan_text, r.message.empty() ? "" : "; " + r.message);
    ++run.summary[r.verdict];
    run.cases.push_back(r);
    if (opt.on_case) opt.on_case(run, run.cases.back());
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return run;
}

}  // namespace normcheck::shard
