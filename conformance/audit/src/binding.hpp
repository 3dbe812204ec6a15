// Internal: a profile bound to one checkpoint (which tensor is which entry and layer, the dims),
// shared by the single-checkpoint audit and the diff.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "normcheck/audit/audit.hpp"

namespace normcheck::audit::detail {

// A tensor name pattern: literal text with {L} for a layer index (1 to 6 digits). HF patterns
// match a whole name or a suffix of it that starts after a '.' (wrappers add prefixes:
// "transformer.", "bert.", "language_model.", Keras layer groups); GGUF patterns match whole
// names only. Hand-written rather than std::regex: work proportional to the name times the
// (short) pattern whatever the file holds (libstdc++'s regex recurses once per character),
// and free of GCC 12's -Wmaybe-uninitialized false positives inside <regex> under the
// sanitizers.
class NamePattern {
 public:
  NamePattern() = default;
  NamePattern(const std::string& pattern, bool gguf);
  // True when `name` matches; `layer` gets the index ({L}), or -1 when the pattern has none.
  bool match(const std::string& name, int& layer) const;

 private:
  bool match_at(const std::string& name, std::size_t pos, int& layer) const;
  std::vector<std::string> parts_;  // the literal text between {L}s
  bool gguf_ = false;
};

// The largest index N + 1 over names holding `prefix` followed by N (1 to 6 digits) and '.',
// with `prefix` at the start of the name or (HF) after a '.'; 0 when none does.
std::uint64_t layer_count_under(const std::vector<TensorInfo>& tensors, const std::string& prefix, bool gguf);

struct Entry {
  std::string role, kind, pattern, per_layer;  // per_layer: the dim counting layers, empty for one tensor
  NamePattern re;
  std::vector<std::string> legacy_patterns;
  std::vector<NamePattern> legacy;
  std::vector<std::string> shape;  // dim names
};

struct Match {
  const TensorInfo* t;
  int layer;  // -1: not per layer
  bool legacy;
};

struct Bound {
  const Profile* profile = nullptr;
  // The generic profile (no profile names the checkpoint's tensors): one entry per norm-like
  // tensor, no dims, no shapes, no offset convention, no eps; `owned` keeps its Profile alive.
  bool generic = false;
  std::shared_ptr<const Profile> owned;
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
// The generic profile bound to `ckpt`: every norm-like tensor, each its own entry (exact name).
Bound bind_generic(const Checkpoint& ckpt);
Bound select_profile(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt,
                     std::vector<Finding>& findings, bool* by_names = nullptr);
std::optional<double> configured_eps(const Bound& b, const std::optional<nlohmann::json>& config, std::string& from);
ValueStats stats_of(const std::vector<double>& v);
// A norm-looking tensor name: its module contains "norm" or is ln, ln_*, lnN, or the name ends
// in gamma/beta (Keras: layer_normalization_3/gamma:0).
bool is_norm_like(const std::string& name);
// The finding for a checkpoint that holds no tensors at all (a vocabulary- or metadata-only
// file, as llama.cpp ships for its tokenizer tests): nothing to audit, said as exactly that.
Finding no_tensors_finding(const Checkpoint& ckpt, const std::string& side = "");
int classify_centre(double median);
  // 0, 1, 2, or -1 when the median is near none of them

}  // namespace normcheck::audit::detail
