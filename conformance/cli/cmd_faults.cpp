// normcheck faults: the fault catalogue (normcheck/judge/faults.hpp) as text, Markdown
// (docs/FAULTS.md) or JSON.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "normcheck/judge/faults.hpp"

namespace normcheck::cli {

namespace {

int print_faults(const std::string& format) {
  const auto catalogue = conf::fault_catalogue();
  if (format == "markdown") {
    fmt::print("{}", conf::faults_markdown());
    return kExitOk;
  }
  if (format == "json") {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const auto& f : catalogue) {
      const bool mutant = f.by == conf::Reproduced::mutant;
      j.push_back({{"id", f.id},
                   {"class", std::string(1, f.cls)},
                   {"class_name", conf::fault_class_name(f.cls)},
                   {"computes", f.what},
                   {"fault", f.text},
                   {"shipped_in", f.refs},
                   {"shown_by", f.shows},
                   {"mutant", mutant ? nlohmann::ordered_json(fmt::format("builtin:mut_{}", f.id)) : nullptr},
                   {"dialect_only", !mutant},
                   {"dialects", conf::dialects_naming(f.id)}});
    }
    fmt::print("{}\n", j.dump(1));
    return kExitOk;
  }
  char cls = 0;
  for (const auto& f : catalogue) {
    if (f.cls != cls) {
      fmt::print("{}{}. {}\n", cls ? "\n" : "", f.cls, conf::fault_class_name(f.cls));
      cls = f.cls;
    }
    std::string named;
    for (const auto& d : conf::dialects_naming(f.id)) named += (named.empty() ? "" : ", ") + d;
    fmt::print("  {:<28} {}\n", f.id, conf::fault_line(f));
    fmt::print("  {:<28} {}; named by {}\n", "",
               f.by == conf::Reproduced::mutant ? fmt::format("builtin:mut_{}", f.id) : "dialect only", named);
  }
  return kExitOk;
}

}  // namespace

Runner add_faults_command(CLI::App& app) {
  auto format = std::make_shared<std::string>("text");
  auto* cmd = app.add_subcommand(
      "faults", "List the fault catalogue: every fault the mutants reproduce and the diagnosis names");
  cmd->add_option("--format", *format, "text (default), markdown (docs/FAULTS.md) or json")
      ->check(CLI::IsMember({"text", "markdown", "json"}));
  return [format] { return print_faults(*format); };
}

}  // namespace normcheck::cli
