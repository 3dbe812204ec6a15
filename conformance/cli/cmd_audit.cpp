// `normcheck audit`: the norm parameters of a checkpoint against its architecture's profile,
// or of a converted checkpoint against its source (--source). Parsing and printing only; the
// checks live in conformance/audit/.
#include <fmt/core.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "normcheck/audit/audit.hpp"
#include "normcheck/audit/functional.hpp"
#include "normcheck/fixtures/error.hpp"
#include "normcheck/reference/case.hpp"
#include "normcheck/conformance/runner.hpp"
#include "normcheck/version.hpp"

namespace normcheck::cli {
namespace {

struct AuditArgs {
  std::string checkpoint, config, profile, json, source, source_config, profiles_dir, fixtures;
  std::string fail_on = "error";
  bool force = false, quiet = false;
};

std::optional<nlohmann::json> read_config(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) throw audit::AuditInputError(fmt::format("{}: cannot open", path));
  try {
    auto j = nlohmann::json::parse(in);
    if (!j.is_object()) throw audit::AuditInputError(fmt::format("{}: not a JSON object", path));
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw audit::AuditInputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

int run_audit(const AuditArgs& a, const std::vector<std::string>& argv_all) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!a.json.empty() && !a.force && std::filesystem::exists(a.json)) {
    fmt::print(stderr, "normcheck audit: {} exists; pass --force to replace it\n", a.json);
    return kExitBadInput;
  }
  audit::AuditResult r;
  std::unique_ptr<audit::Checkpoint> ckpt, source;
  try {
    const auto profiles = audit::load_profiles(a.profiles_dir.empty() ? audit::default_profiles_dir() : a.profiles_dir);
    const audit::AuditOptions opt{a.profile, read_config(a.config)};
    ckpt = audit::open_checkpoint(a.checkpoint);
    if (!a.fixtures.empty()) {
      if (!a.source.empty()) throw audit::AuditInputError("--fixtures and --source are separate modes: give one");
      r = audit::functional_audit(*ckpt, profiles, opt, a.fixtures);
    } else if (a.source.empty()) {
      r = audit::audit_checkpoint(*ckpt, profiles, opt);
    } else {
      source = audit::open_checkpoint(a.source);
      r = audit::diff_checkpoints(*ckpt, opt, *source, audit::AuditOptions{a.profile, read_config(a.source_config)}, profiles);
    }
  } catch (const audit::CheckpointError& e) {
    fmt::print(stderr, "normcheck audit: {}\n", e.what());
    return kExitBadInput;
  } catch (const audit::AuditInputError& e) {
    fmt::print(stderr, "normcheck audit: {}\n", e.what());
    return kExitBadInput;
  } catch (const fix::FixtureError& e) {
    fmt::print(stderr, "normcheck audit: {}\n", e.what());
    return kExitBadInput;
  } catch (const ref::CaseError& e) {
    fmt::print(stderr, "normcheck audit: {}: case: {}: {}\n", a.fixtures, e.field(), e.what());
    return kExitBadInput;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  for (const auto& f : r.findings) {
    if (a.quiet && f.severity == "info") continue;
    fmt::print("{:<7} {:<18} {}\n", f.severity, f.check, f.message);
  }
  const auto summary = r.summary();
  fmt::print("{}: {} {}, profile {}: {} error(s), {} warning(s), {} info ({:.2f} s)\n", a.checkpoint, ckpt->format(),
             !a.fixtures.empty() ? "functional audit with " + a.fixtures : a.source.empty() ? "audit" : "diff against " + a.source, r.profile, summary["error"].get<int>(),
             summary["warning"].get<int>(), summary["info"].get<int>(), seconds);

  if (!a.json.empty()) {
    std::string command = "normcheck";
    for (const auto& s : argv_all) command += " " + quote(s);
    nlohmann::ordered_json j;
    j["format"] = "normcheck-results";
    j["format_version"] = 1;
    j["generator"] = "normcheck";
    j["generator_version"] = kVersion;
    j["command"] = command;
    j["mode"] = "audit";
    j["checkpoint"] = {{"path", a.checkpoint}, {"format", ckpt->format()}, {"profile", r.profile}};
    if (source) j["source"] = {{"path", a.source}, {"format", source->format()}};
    if (!a.fixtures.empty()) j["fixtures"] = {{"path", a.fixtures}};
    j["findings"] = nlohmann::ordered_json::array();
    for (const auto& f : r.findings)
      j["findings"].push_back({{"severity", f.severity}, {"check", f.check}, {"tensors", f.tensors}, {"message", f.message}});
    j["summary"] = summary;
    j["seconds"] = seconds;
    try {
      conf::write_text_file(a.json, j.dump(1) + "\n", a.force);
    } catch (const std::exception& e) {
      fmt::print(stderr, "normcheck audit: {}\n", e.what());
      return kExitBadInput;
    }
  }
  const int failing = r.errors() + (a.fail_on == "warning" ? summary["warning"].get<int>() : 0);
  return failing > 0 ? kExitFailed : kExitOk;
}

}  // namespace

Runner add_audit_command(CLI::App& app, std::vector<std::string>& argv_all) {
  auto a = std::make_shared<AuditArgs>();
  auto* cmd = app.add_subcommand("audit", "Audit the norm parameters of a checkpoint (safetensors, GGUF, HDF5), or diff a "
                                          "converted checkpoint against its source");
  cmd->add_option("checkpoint", a->checkpoint, "The checkpoint (the converted one with --source)")->required();
  cmd->add_option("--config", a->config, "HF config.json of the checkpoint (model_type, dims, eps)");
  cmd->add_option("--profile", a->profile, "Architecture profile (default: detected from config, GGUF metadata or names)");
  cmd->add_option("--source", a->source, "Diff mode: the original checkpoint the converted one came from");
  cmd->add_option("--source-config", a->source_config, "HF config.json of the source checkpoint");
  cmd->add_option("--fixtures", a->fixtures, "Functional mode: re-run these fixture cases (ids: the norms' HF module "
                                             "names) with the checkpoint's parameters through the reference");
  cmd->add_option("--profiles", a->profiles_dir, "Directory of profile files (default: the bundled ones)");
  cmd->add_option("--json", a->json, "Write the findings as a results file (normcheck-results v1, mode audit)");
  cmd->add_option("--fail-on", a->fail_on, "Exit 1 on findings of this severity or worse: error (default) or warning")
      ->check(CLI::IsMember({"error", "warning"}));
  cmd->add_flag("--force", a->force, "Replace an existing results file");
  cmd->add_flag("--quiet", a->quiet, "Print errors and warnings only");
  return [a, &argv_all] { return run_audit(*a, argv_all); };
}

}  // namespace normcheck::cli
