// `normcheck prop`: property-based conformance of one candidate (property_tests/README.md).
// Parses arguments, runs the properties of property_tests/, prints each failure's shrunk
// counterexample and its reproduce command, and writes counterexample fixtures and results.
#include <fmt/core.h>
#include <fnmatch.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/properties/properties.hpp"
#include "normcheck/version.hpp"

namespace normcheck::cli {
namespace {

struct PropArgs {
  std::string candidate, save_failures, json, reproduce;
  std::vector<std::string> globs;
  int tests = 100, max_size = 100;
  std::int64_t max_hidden = 8192;
  std::uint64_t seed = 1;
  bool force = false, isolate = false, list = false, no_shrink = false, quant_only = false;
  bool allow_empty = false;  // every property UNSUPPORTED may exit 0
  std::string reduction;     // --reduction CLASS
  double timeout = 0, startup_timeout = 0;
  double log_every = 60;  // --log-every: seconds between progress lines when stderr is not a terminal
};

int run_prop(const PropArgs& a, const std::vector<std::string>& argv_all) {
  // The emulation of shard plans has properties of its own, and only those apply to it.
  const bool emulation = prop::is_shard_emulation(a.candidate);
  const auto& all = emulation ? prop::shard_properties() : prop::properties();
  if (a.list) {  // one property a line: evidence.py reads the names
    for (const auto& p : all) fmt::print("  {:<28} {}\n", p.name, p.description);
    return kExitOk;
  }
  if (a.candidate.empty()) {
    fmt::print(stderr, "normcheck prop: --candidate SPEC is required\n");
    return kExitBadInput;
  }
  if (a.tests < 1 || a.max_size < 1 || a.max_hidden < 1) {
    fmt::print(stderr, "normcheck prop: --tests, --max-size and --max-hidden must be >= 1\n");
    return kExitBadInput;
  }
  if (!(a.log_every >= 0) || !std::isfinite(a.log_every)) {
    fmt::print(stderr, "normcheck prop: --log-every {} must be a finite number of seconds >= 0\n", a.log_every);
    return kExitBadInput;
  }
  if (emulation && a.isolate) {
    fmt::print(stderr, "normcheck prop: {} runs in this process (--isolate is for plugins and builtins)\n",
               prop::kShardEmulation);
    return kExitBadInput;
  }
  std::vector<const prop::Property*> chosen;
  for (const auto& p : all) {
    bool take = a.globs.empty();
    for (const auto& g : a.globs) take |= ::fnmatch(g.c_str(), p.name.c_str(), 0) == 0;
    if (take) chosen.push_back(&p);
  }
  if (chosen.empty()) {
    fmt::print(stderr, "normcheck prop: no property {}matches --properties (normcheck prop --list{} names them)\n",
               emulation ? fmt::format("of {} ", prop::kShardEmulation) : std::string(),
               emulation ? fmt::format(" --candidate {}", prop::kShardEmulation) : std::string());
    return kExitBadInput;
  }
  if (!a.reproduce.empty() && chosen.size() != 1) {
    fmt::print(stderr, "normcheck prop: --reproduce replays one property: name it with --properties\n");
    return kExitBadInput;
  }
  if (!a.json.empty() && !a.force && std::filesystem::exists(a.json)) {
    fmt::print(stderr, "normcheck: {} exists; pass --force to replace it\n", a.json);
    return kExitBadInput;
  }
  if (!a.save_failures.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.save_failures, ec);
    if (ec || !std::filesystem::is_directory(a.save_failures)) {
      fmt::print(stderr, "normcheck prop: --save-failures {}: cannot create the directory\n", a.save_failures);
      return kExitBadInput;
    }
  }
  std::optional<conf::Reduction> reduction;
  if (!a.reduction.empty()) {
    try {
      reduction = conf::parse_reduction(a.reduction);
    } catch (const std::invalid_argument& e) {
      fmt::print(stderr, "normcheck: --reduction: {}\n", e.what());
      return kExitBadInput;
    }
  }
  std::unique_ptr<conf::Candidate> cand;
  try {
    conf::SpecOptions so;
    so.isolate = a.isolate;
    so.timeout_s = a.timeout;
    so.startup_timeout_s = a.startup_timeout;
    so.self_exe = self_exe();
    cand = emulation ? prop::make_shard_emulation(a.candidate) : conf::make_candidate(a.candidate, so);
  } catch (const std::exception& e) {
    fmt::print(stderr, "normcheck: {}\n", e.what());
    return kExitBadInput;
  }
  std::string command = "normcheck";
  for (const auto& w : argv_all) command += " " + quote(w);
  const std::string isolation =
      (a.isolate ? " --isolate" : "") + (a.timeout > 0 ? fmt::format(" --timeout {}", a.timeout) : std::string()) +
      (a.startup_timeout > 0 ? fmt::format(" --startup-timeout {}", a.startup_timeout) : std::string()) +
      (a.reduction.empty() ? std::string() : " --reduction " + quote(a.reduction));
  auto base_command = [&](const std::string& name) {
    return fmt::format("normcheck prop --candidate {}{} --properties {} --seed {} --tests {} --max-size {}{}",
                       quote(a.candidate), isolation, name, a.seed, a.tests, a.max_size,
                       a.max_hidden != 8192 ? fmt::format(" --max-hidden {}", a.max_hidden) : std::string()) +
           (a.quant_only ? " --quant-only" : "");
  };

  const bool tty = ::isatty(STDERR_FILENO);
  using Json = nlohmann::ordered_json;
  Json props = Json::array();
  std::map<prop::PropVerdict, int> summary;
  bool bad_input = false;
  const auto t_start = std::chrono::steady_clock::now();
  for (const auto* p : chosen) {
    prop::Options opt;
    opt.tests = a.tests;
    opt.seed = a.seed;
    opt.max_size = a.max_size;
    opt.max_hidden = a.max_hidden;
    opt.reproduce = a.reproduce;
    opt.shrink = !a.no_shrink;
    opt.quant_only = a.quant_only;
    opt.reduction = reduction;
    if (tty)
      opt.progress = [&](int tests, int shrinks) {
        fmt::print(stderr, "\r\033[K{} {}: {} tests{}", a.candidate, p->name, tests,
                   shrinks ? fmt::format(", {} shrinks", shrinks) : std::string());
      };
    else  // a log: a line per 1000 passed tests, and one every --log-every seconds (a slow
          // candidate, a CI system that stops a job silent for ten minutes), when there is news
      opt.progress = [&, t_property = std::chrono::steady_clock::now(), t_logged = std::chrono::steady_clock::now(),
                      logged_tests = 0, logged_shrinks = 0](int tests, int shrinks) mutable {
        const auto now = std::chrono::steady_clock::now();
        const bool thousand = shrinks == 0 && tests % 1000 == 0 && tests != logged_tests;
        const bool timed = a.log_every > 0 &&
                           std::chrono::duration<double>(now - t_logged).count() >= a.log_every &&
                           (tests != logged_tests || shrinks != logged_shrinks);
        if (!thousand && !timed) return;
        logged_tests = tests;
        logged_shrinks = shrinks;
        t_logged = now;
        fmt::print(stderr, "{} {}: {} tests passed{}, {:.0f} s\n", a.candidate, p->name, tests,
                   shrinks ? fmt::format(", shrinking ({} steps)", shrinks) : std::string(),
                   std::chrono::duration<double>(now - t_property).count());
      };
    prop::PropertyResult r;
    try {
      r = prop::run_property(*p, *cand, opt);
    } catch (const std::invalid_argument& e) {
      if (tty) fmt::print(stderr, "\r\033[K");
      fmt::print(stderr, "normcheck prop: {}\n", e.what());
      return kExitBadInput;
    }
    if (tty) fmt::print(stderr, "\r\033[K");
    ++summary[r.verdict];
    const std::string reproduce_cmd =
        r.reproduce.empty() ? std::string() : base_command(p->name) + " --reproduce " + quote(r.reproduce);
    fmt::print("{:<11} {:<20} {} tests, {:.1f} s{}{}{}\n", prop::name_of(r.verdict), r.name, r.tests, r.seconds,
               r.shrinks ? fmt::format(", shrunk in {} steps", r.shrinks) : std::string(),
               r.quant_tests ? fmt::format(" ({} with quantized outputs)", r.quant_tests) : std::string(),
               r.flushed_tests ? fmt::format(" ({} zero{} accepted as flushed subnormals, in {} test{})",
                                             r.flushed_elements, r.flushed_elements == 1 ? "" : "s", r.flushed_tests,
                                             r.flushed_tests == 1 ? "" : "s")
                               : std::string());
    // Where the time went when one test stands out (a heavy drawn case: the certified backward
    // of a large one, a deep Ziv loop): on its own line, the results file has it always.
    if (r.slowest_seconds >= 1.0)
      fmt::print("    slowest test {:.1f} s: {}\n", r.slowest_seconds, r.slowest_case);
    Json jp;
    jp["name"] = r.name;
    jp["description"] = r.description;
    jp["verdict"] = prop::name_of(r.verdict);
    jp["tests"] = r.tests;
    jp["seed"] = r.seed;
    jp["reproduce"] = reproduce_cmd;
    jp["message"] = r.message;
    jp["counterexample"] = nullptr;
    jp["diagnosis"] = Json::array();
    if (r.verdict == prop::PropVerdict::unsupported) fmt::print("    {}\n", r.message);
    if (r.failure) {
      const auto& f = *r.failure;
      fmt::print("    {}\n", f.message);
      fmt::print("{}", prop::counterexample_text(f));
      fmt::print("    reproduce: {}\n", reproduce_cmd);
      const auto g = ref::geometry_of(f.replay);
      Json cx;
      cx["fixture"] = nullptr;
      const std::string case_id = fmt::format("prop_{}_{}", r.name, slug(a.candidate)).substr(0, 128);
      cx["case_id"] = case_id;
      cx["shape"] = g.shape;
      cx["summary"] = prop::case_summary(f.replay, f.family);
      // A sharded counterexample is its case under its plan (and the planted fault): the case
      // file alone does not reproduce it (reports/RESULTS.md).
      if (!f.plan.empty()) {
        cx["plan"] = f.plan;
        cx["fault"] = f.fault.empty() ? Json(nullptr) : Json(f.fault);
      }
      cx["replay"] = nullptr;
      // The counterexample with its certified expected outputs, evaluated once for the file and
      // the diagnosis (the reference's work), and only when one of them needs it.
      std::optional<fix::FixtureCase> fc;
      auto counterexample = [&]() -> const fix::FixtureCase& {
        if (!fc) fc = prop::counterexample_case(r, case_id);
        return *fc;
      };
      if (!a.save_failures.empty()) {
        const std::string path = (std::filesystem::path(a.save_failures) / (case_id + ".h5")).string();
        try {
          fix::Provenance prov;
          prov.generator_version = kVersion;
          prov.reference_bits = ref::Options{}.max_bits;
          prov.seed = a.seed;
          prov.tier = "property";
          prov.command = reproduce_cmd + " --save-failures " + quote(a.save_failures);
          fix::FixtureWriter w(path, prov, a.force);
          w.write(counterexample());
          w.commit();
          cx["fixture"] = path;
          // The command that replays the file: `normcheck run` for a candidate; for a sharded
          // counterexample (the unsharded case with its golden outputs) the emulation of its
          // plan, with its fault, checked by normcheck-shard-check.
          const std::string replay =
              !f.plan.empty()
                  ? fmt::format("normcheck-shard-check --fixtures {} --emulate {}{}", quote(path),
                                quote(f.plan), f.fault.empty() ? std::string() : " --fault " + quote(f.fault))
                  : fmt::format("normcheck run --candidate {}{} --fixtures {}", quote(a.candidate), isolation,
                                quote(path));
          cx["replay"] = replay;
          fmt::print("    counterexample: {} (replay: {})\n", path, replay);
        } catch (const std::exception& e) {
          fmt::print(stderr, "normcheck prop: {}\n", e.what());
          bad_input = true;
        }
      }
      // A counterexample the reference rejects (not only a broken relation): which known fault
      // explains the candidate's outputs on it (the panel of conformance/DIAGNOSIS.md; the
      // quantization dialects, class H, on a quantized case, as in `run`).
      if (!f.crashed && f.agreement && f.agreement->verdict == conf::Verdict::failed) {
        try {
          const conf::Outputs got = cand->run(counterexample().c);
          const auto diagnosis = f.replay.quant ? conf::diagnose_quant(counterexample(), got, *f.agreement)
                                                : conf::diagnose(counterexample(), got);
          if (!diagnosis.empty()) {
            fmt::print("    {}\n", conf::describe_diagnosis(diagnosis));
            jp["diagnosis"] = Json::parse(conf::diagnosis_json_text(diagnosis));
          }
        } catch (const std::exception& e) {
          fmt::print("    (no diagnosis: the candidate failed on the replay: {})\n", e.what());
        }
      }
      jp["counterexample"] = std::move(cx);
    }
    jp["shrinks"] = r.shrinks;
    jp["seconds"] = r.seconds;
    if (r.slowest_seconds > 0)
      jp["slowest_test"] = Json{{"seconds", r.slowest_seconds}, {"case", r.slowest_case}};
    if (r.quant_tests) jp["quant_tests"] = r.quant_tests;
    if (r.flushed_tests) {
      jp["flushed_tests"] = r.flushed_tests;
      jp["flushed"] = r.flushed_elements;
    }
    props.push_back(std::move(jp));
    std::fflush(stdout);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!a.json.empty()) {
    Json j;
    j["format"] = conf::kResultsFormat;
    j["format_version"] = conf::kResultsFormatVersion;
    j["mode"] = "prop";
    j["generator"] = "normcheck";
    j["generator_version"] = kVersion;
    j["command"] = command;
    const auto& in = cand->info();
    Json cj{{"spec", in.name}, {"kind", conf::name_of(in.kind)}, {"description", in.description},
            {"device", in.caps.device}};
    // The class the properties were judged under (RESULTS.md: candidate.reduction, as in run).
    if (const conf::Reduction red = reduction.value_or(in.caps.reduction); !red.is_any())
      cj["reduction"] = conf::name_of(red);
    if (in.kind == conf::CandidateKind::mutant) {
      cj["fault_class"] = in.fault_class;
      cj["fault"] = in.fault;
    }
    j["candidate"] = std::move(cj);
    j["options"] = Json{{"tests", a.tests}, {"seed", a.seed}, {"max_size", a.max_size}, {"max_hidden", a.max_hidden}};
    j["properties"] = std::move(props);
    j["cases"] = Json::array();
    Json s;
    for (auto v : {prop::PropVerdict::passed, prop::PropVerdict::failed, prop::PropVerdict::unsupported,
                   prop::PropVerdict::crashed})
      s[std::string(prop::name_of(v))] = summary.count(v) ? summary[v] : 0;
    j["summary"] = std::move(s);
    j["seconds"] = seconds;
    try {
      conf::write_text_file(a.json, j.dump(1) + "\n", a.force);
    } catch (const std::exception& e) {
      fmt::print(stderr, "normcheck: {}\n", e.what());
      return kExitBadInput;
    }
  }
  if (bad_input) return kExitBadInput;
  if (summary[prop::PropVerdict::failed] + summary[prop::PropVerdict::crashed] > 0) return kExitFailed;
  // Every chosen property UNSUPPORTED (the candidate declined every drawn case): nothing was
  // checked, which must not pass a CI job by accident.
  if (summary[prop::PropVerdict::passed] == 0 && !a.allow_empty) {
    fmt::print(stderr, "normcheck prop: nothing was checked: {} declined every case drawn for {}; pass --allow-empty if an "
                       "empty run is what you meant\n",
               a.candidate, chosen.size() == 1 ? "the property" : fmt::format("all {} properties", chosen.size()));
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

Runner add_prop_command(CLI::App& app, std::vector<std::string>& argv_all) {
  auto a = std::make_shared<PropArgs>();
  auto* cmd = app.add_subcommand("prop", "Property-based conformance of a candidate: generated cases, metamorphic "
                                         "relations, shrunk counterexamples as fixtures");
  cmd->add_option("--candidate", a->candidate,
                  "builtin:NAME, plugin:PATH.so or 'cmd:COMMAND ARGS...'; shard:emulation for the sharded properties");
  cmd->add_option("--properties", a->globs, "Only properties whose name matches this glob (repeatable)");
  cmd->add_option("--reduction", a->reduction,
                  "Judge under this reduction class instead of the candidate's declaration: any, two_pass, welford, "
                  "pairwise:B, blocked:B or accumulate_f64 (conformance/TOLERANCE.md, section 9)");
  cmd->add_option("--tests", a->tests, "Successful tests per property (default 100)");
  cmd->add_option("--seed", a->seed, "RapidCheck seed (default 1: the same run every time)");
  cmd->add_option("--max-size", a->max_size, "RapidCheck's size limit; sizes grow towards it (default 100)");
  cmd->add_option("--max-hidden", a->max_hidden, "Largest normalized row drawn (default 8192)");
  cmd->add_option("--save-failures", a->save_failures,
                  "Write each counterexample as a one-case fixture file (schema v1) into this directory");
  cmd->add_option("--json", a->json, "Write the results file (normcheck-results v1, mode prop) here");
  cmd->add_option("--reproduce", a->reproduce, "Replay one failure from its reproduce string (with --properties)");
  cmd->add_flag("--no-shrink", a->no_shrink, "Report the first failing case as drawn, without shrinking");
  cmd->add_flag("--quant-only", a->quant_only,
                "Draw only quantized cases (agreement and determinism, for a candidate that declares them)");
  cmd->add_flag("--force", a->force, "Replace existing results and counterexample files");
  cmd->add_flag("--isolate", a->isolate, "Run a plugin or builtin in a child process");
  cmd->add_option("--timeout", a->timeout, "Seconds allowed per call of a subprocess candidate (0: none)");
  cmd->add_option("--startup-timeout", a->startup_timeout,
                  "Seconds a subprocess candidate may take to start, up to its hello (0: the larger of --timeout "
                  "and 120)");
  cmd->add_option("--log-every", a->log_every,
                  "When stderr is not a terminal: a progress line every 1000 passed tests and at least every this "
                  "many seconds (default 60; 0: only every 1000)");
  cmd->add_flag("--list", a->list, "List the properties (with --candidate shard:emulation: the sharded ones)");
  cmd->add_flag("--allow-empty", a->allow_empty, "Exit 0 even when every property was UNSUPPORTED (nothing checked)");
  return [a, cmd, &argv_all]() { return cmd->parsed() ? run_prop(*a, argv_all) : kExitBadInput; };
}

}  // namespace normcheck::cli
