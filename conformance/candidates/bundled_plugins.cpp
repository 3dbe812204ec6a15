#include "bundled_plugins.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>

#include "plugin/plugin_loader.hpp"
#include "transports.hpp"

namespace normcheck::conf {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "libnormcheck_";
constexpr std::string_view kSuffix = ".so";

CandidateInfo failed_info(const std::string& name, const std::string& why) {
  CandidateInfo info;
  info.name = "builtin:" + name;
  info.kind = CandidateKind::correct;
  info.description = "bundled plugin, not loaded: " + why;
  info.caps.ops.clear();  // lists as supporting nothing, which is what it does
  info.caps.device = "unknown";
  return info;
}

// A plugin that declares NC_CAP_ISOLATE, served by a `normcheck worker plugin:PATH` child: the
// descriptor's info (name builtin:NAME, kind correct), the child's outputs, and a library abort
// becomes CRASHED for that case (the subprocess transport starts a fresh child for the next).
class IsolatedPlugin final : public Candidate {
 public:
  IsolatedPlugin(CandidateInfo info, std::unique_ptr<Candidate> child)
      : info_(std::move(info)), child_(std::move(child)) {}
  const CandidateInfo& info() const override { return info_; }
  std::optional<std::string> declines(const ref::Case& c) const override { return child_->declines(c); }
  Outputs run(const ref::Case& c) override { return child_->run(c); }

 private:
  CandidateInfo info_;
  std::unique_ptr<Candidate> child_;
};

// The normcheck executable that serves `normcheck worker`: this process when it is normcheck,
// else the one beside the plugin directory (<prefix>/bin/normcheck); empty when neither exists.
std::string worker_exe() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.filename() == "normcheck") return exe.string();
  const fs::path beside = (bundled_plugin_dir() / ".." / ".." / ".." / "bin" / "normcheck").lexically_normal();
  return fs::exists(beside, ec) ? beside.string() : std::string();
}

// The kind a bundled plugin is listed with. A library that aborts on inputs it accepts
// (NC_CAP_ISOLATE: ggml) has recorded findings (docs/FINDINGS.md), so it is `external`: run by
// `--builtins all` and by name, not by `--builtins correct`, whose candidates the main job holds
// to conform; the main job runs it by name with its known findings (`run --known-findings`).
CandidateKind kind_of(const nc_candidate& d) {
  return d.flags & NC_CAP_ISOLATE ? CandidateKind::external : CandidateKind::correct;
}

std::unique_ptr<Candidate> make_from(const std::string& name, const std::string& path) {
  try {
    const plugin::Loaded loaded = plugin::load(path);
    if (loaded.descriptor->flags & NC_CAP_ISOLATE) {
      CandidateInfo info = plugin::info_of(*loaded.descriptor, "builtin:" + name, kind_of(*loaded.descriptor));
      const std::string exe = worker_exe();
      if (exe.empty())
        return plugin::make_declining(failed_info(name, "it must run isolated and no normcheck executable serves it"),
                                      "no normcheck executable to run it isolated");
      try {
        return std::make_unique<IsolatedPlugin>(
            std::move(info), make_subprocess_candidate({exe, "worker", "plugin:" + path}, "builtin:" + name, 0));
      } catch (const std::invalid_argument& e) {
        return plugin::make_declining(failed_info(name, e.what()), e.what());
      }
    }
    return plugin::make_candidate_from(path, "builtin:" + name, CandidateKind::correct);
  } catch (const std::invalid_argument& e) {
    return plugin::make_declining(failed_info(name, e.what()), e.what());
  }
}

}  // namespace

fs::path bundled_plugin_dir() {
  if (const char* env = std::getenv("NORMCHECK_PLUGIN_DIR"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return (exe.parent_path() / ".." / "lib" / "normcheck" / "plugins").lexically_normal();
}

std::vector<BuiltinEntry> bundled_plugin_entries() {
  const fs::path dir = bundled_plugin_dir();
  std::vector<std::pair<std::string, std::string>> found;  // (name, path)
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return {};
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.size() <= kPrefix.size() + kSuffix.size() || !file.starts_with(kPrefix) ||
        !file.ends_with(kSuffix))
      continue;
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;  // follows symlinks
    found.emplace_back(file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size()),
                       it->path().string());
  }
  std::sort(found.begin(), found.end());

  std::vector<BuiltinEntry> entries;
  for (const auto& [name, path] : found) {
    CandidateInfo info;
    try {
      // Only the descriptor: init (which may start a GPU context) waits for make().
      const plugin::Loaded loaded = plugin::load(path);
      info = plugin::info_of(*loaded.descriptor, "builtin:" + name, kind_of(*loaded.descriptor));
    } catch (const std::invalid_argument& e) {
      info = failed_info(name, e.what());
    }
    entries.push_back({std::move(info), [name, path] { return make_from(name, path); }});
  }
  return entries;
}

}  // namespace normcheck::conf
