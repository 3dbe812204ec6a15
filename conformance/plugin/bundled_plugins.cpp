#include "bundled_plugins.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "plugin_loader.hpp"

namespace normcheck::conf {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "libnormcheck_";
constexpr std::string_view kSuffix = ".so";

// BuiltinEntry::make is a plain function pointer, so it cannot carry the plugin's path. Each
// discovered plugin gets a slot in this table, and make_slot<I> makes the candidate of slot I.
// 256 slots: the bundle has a handful of plugins (oneDNN, OpenCL, CUDA ...); a path seen again
// (bundled_plugin_entries called twice) reuses its slot, so repeated scans do not use them up.
constexpr std::size_t kMaxSlots = 256;

struct Slot {
  std::string name;  // <name> of libnormcheck_<name>.so
  std::string path;
};

std::mutex slots_mutex;
std::deque<Slot> slots;  // append-only: a slot index stays valid for the life of the process

CandidateInfo failed_info(const std::string& name, const std::string& why) {
  CandidateInfo info;
  info.name = "builtin:" + name;
  info.kind = CandidateKind::correct;
  info.description = "bundled plugin, not loaded: " + why;
  info.caps.ops.clear();  // lists as supporting nothing, which is what it does
  info.caps.device = "unknown";
  return info;
}

std::unique_ptr<Candidate> make_from(const Slot& s) {
  try {
    return plugin::make_candidate_from(s.path, "builtin:" + s.name, CandidateKind::correct);
  } catch (const std::invalid_argument& e) {
    return plugin::make_declining(failed_info(s.name, e.what()), e.what());
  }
}

template <std::size_t I>
std::unique_ptr<Candidate> make_slot() {
  Slot s;
  {
    std::lock_guard<std::mutex> guard(slots_mutex);
    s = slots.at(I);
  }
  return make_from(s);
}

template <std::size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  return std::array<std::unique_ptr<Candidate> (*)(), sizeof...(I)>{&make_slot<I>...};
}
constexpr auto kMakers = make_table(std::make_index_sequence<kMaxSlots>{});

std::unique_ptr<Candidate> make_no_slot() {
  const std::string why = fmt::format("more than {} bundled plugins", kMaxSlots);
  return plugin::make_declining(failed_info("?", why), why);
}

// The slot of (name, path), or kMaxSlots when the table is full.
std::size_t slot_of(const std::string& name, const std::string& path) {
  std::lock_guard<std::mutex> guard(slots_mutex);
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name == name && slots[i].path == path) return i;
  if (slots.size() == kMaxSlots) return kMaxSlots;
  slots.push_back({name, path});
  return slots.size() - 1;
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
    const std::size_t slot = slot_of(name, path);
    if (slot == kMaxSlots) {
      entries.push_back(
          {failed_info(name, fmt::format("more than {} bundled plugins", kMaxSlots)), &make_no_slot});
      continue;
    }
    CandidateInfo info;
    try {
      // Only the descriptor: init (which may start a GPU context) waits for make().
      const plugin::Loaded loaded = plugin::load(path);
      info = plugin::info_of(*loaded.descriptor, "builtin:" + name, CandidateKind::correct);
    } catch (const std::invalid_argument& e) {
      info = failed_info(name, e.what());
    }
    entries.push_back({std::move(info), kMakers[slot]});
  }
  return entries;
}

}  // namespace normcheck::conf
