#include "bundled_plugins.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>

#include "plugin_loader.hpp"

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

std::unique_ptr<Candidate> make_from(const std::string& name, const std::string& path) {
  try {
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
      info = plugin::info_of(*loaded.descriptor, "builtin:" + name, CandidateKind::correct);
    } catch (const std::invalid_argument& e) {
      info = failed_info(name, e.what());
    }
    entries.push_back({std::move(info), [name, path] { return make_from(name, path); }});
  }
  return entries;
}

}  // namespace normcheck::conf
