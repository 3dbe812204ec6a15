// The spec dispatch: make_candidate() turns `builtin:NAME` (the registry, registry.cpp),
// `plugin:PATH.so` and `cmd:COMMAND ARGS...` (the transports, ../src/transports.hpp) into a
// Candidate, and runs any of them in a `normcheck worker` child under --isolate.
#include <fmt/core.h>

#include <filesystem>
#include <stdexcept>

#include "normcheck/conformance/candidate.hpp"
#include "transports.hpp"

namespace normcheck::conf {

std::vector<std::string> split_command(std::string_view line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quote) {
      if (ch == quote) quote = 0;
      else if (ch == '\\' && quote == '"' && i + 1 < line.size()) cur += line[++i];
      else cur += ch;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (ch == '\\' && i + 1 < line.size()) {
      cur += line[++i];
      in_word = true;
    } else if (ch == ' ' || ch == '\t' || ch == '\n') {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur += ch;
      in_word = true;
    }
  }
  if (quote) throw std::invalid_argument(fmt::format("unterminated {} quote in command: {}", quote, line));
  if (in_word) words.push_back(std::move(cur));
  return words;
}

std::unique_ptr<Candidate> make_candidate(std::string_view spec, const SpecOptions& opt) {
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos)
    throw std::invalid_argument(fmt::format(
        "candidate spec '{}': expected builtin:NAME, plugin:PATH.so or cmd:COMMAND ARGS...", spec));
  const std::string_view kind = spec.substr(0, colon);
  const std::string rest(spec.substr(colon + 1));
  auto isolated = [&]() {
    if (opt.self_exe.empty()) throw std::invalid_argument("--isolate needs the path of the normcheck executable");
    return make_subprocess_candidate({opt.self_exe, "worker", std::string(spec)}, std::string(spec), opt.timeout_s,
                                     opt.startup_timeout_s);
  };
  if (kind == "builtin") {
    for (const auto& e : builtin_candidates())
      if (e.info.name == spec) return opt.isolate ? isolated() : e.make();
    throw std::invalid_argument(
        fmt::format("no built-in candidate '{}' (normcheck candidates lists them)", rest));
  }
  if (kind == "plugin") {
    if (rest.empty()) throw std::invalid_argument("plugin: needs the path of a shared library");
    if (!std::filesystem::exists(rest)) throw std::invalid_argument(fmt::format("plugin {}: no such file", rest));
    return opt.isolate ? isolated() : make_plugin_candidate(rest);
  }
  if (kind == "cmd") {
    auto argv = split_command(rest);
    if (argv.empty()) throw std::invalid_argument("cmd: needs a command");
    return make_subprocess_candidate(argv, std::string(spec), opt.timeout_s, opt.startup_timeout_s);
  }
  throw std::invalid_argument(fmt::format(
      "candidate spec '{}': unknown kind '{}' (builtin, plugin or cmd)", spec, kind));
}

}  // namespace normcheck::conf
