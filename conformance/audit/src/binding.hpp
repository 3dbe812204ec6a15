// Internal: a profile bound to one checkpoint (which tensor is which entry and layer, the dims),
// shared by the single-checkpoint audit and the diff.
#pragma once

#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "normcheck/audit/audit.hpp"

namespace normcheck::audit::detail {

struct Entry {
  std::string role, kind, pattern, per_layer;  // per_layer: the dim counting layers, empty for one tensor
  std::regex re;
  std::vector<std::string> legacy_patterns;
  std::vector<std::regex> legacy;
  std::vector<std::string> shape;  // dim names
};

struct Match {
  const TensorInfo* t;
  int layer;  // -1: not per layer
  bool legacy;
};

struct Bound {
  const Profile* profile = nullptr;
  const Checkpoint* ckpt = nullptr;
  bool gguf = false;
  int offset = 0;  // scale = offset + stored weight, in this checkpoint's naming scheme
  std::vector<Entry> entries;
  std::map<std::pair<std::size_t, int>, std::vector<Match>> found;  // (entry, layer) -> tensors
  std::set<const TensorInfo*> claimed;
  std::map<std::string, std::uint64_t> dims;
  std::map<std::string, std::string> dim_source;
  std::string describe(const Entry& e, int layer) const;
  double score() const;
};

struct ValueStats {
  std::uint64_t non_finite = 0, first_non_finite = 0;
  bool all_one = true, all_zero = true;
  double median = 0;
};

Bound bind(const Profile& profile, const Checkpoint& ckpt, const std::optional<nlohmann::json>& config);
Bound select_profile(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt,
                     std::vector<Finding>& findings, bool* by_names = nullptr);
std::optional<double> configured_eps(const Bound& b, const std::optional<nlohmann::json>& config, std::string& from);
ValueStats stats_of(const std::vector<double>& v);
int classify_centre(double median);
// A name pattern as a regex ({L}: the layer index); HF patterns match as a dot-suffix.
std::regex compile_pattern(const std::string& pattern, bool gguf);  // 0, 1, 2, or -1 when the median is near none of them

}  // namespace normcheck::audit::detail
