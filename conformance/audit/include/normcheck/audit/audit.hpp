// The checkpoint audit: architecture profiles (data files in conformance/audit/profiles/),
// findings on one checkpoint, and the diff of a converted checkpoint against its source.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "normcheck/audit/checkpoint.hpp"

namespace normcheck::audit {

// A profile file that is not what conformance/audit/README.md describes; an unknown --profile;
// a checkpoint whose tensors no profile names and none of which looks like a norm parameter.
// The CLI exits 2 on it.
class AuditInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Profile {
  std::string name;
  nlohmann::json spec;  // the file's contents, validated on load
};

// Every *.json in `dir`, sorted by name; throws AuditInputError naming the file and the field.
std::vector<Profile> load_profiles(const std::string& dir);
// The profiles directory: $NORMCHECK_AUDIT_PROFILES, else the source tree's.
std::string default_profiles_dir();

struct Finding {
  std::string severity;  // "error", "warning", "info"
  std::string check;     // "missing_tensor", "offset_convention", ...
  std::vector<std::string> tensors;
  std::string message;
};

struct AuditOptions {
  std::string profile;                  // empty: detect
  std::optional<nlohmann::json> config;  // HF config.json
};

struct AuditResult {
  std::string profile;  // chosen profile
  std::vector<Finding> findings;
  nlohmann::ordered_json summary() const;  // {"error": n, "warning": n, "info": n}
  int errors() const;
};

AuditResult audit_checkpoint(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt);

// Pairs the norm tensors of `converted` with those of `source` by profile role and layer and
// names the transform that explains each difference; unexplained ones are errors.
AuditResult diff_checkpoints(const Checkpoint& converted, const AuditOptions& converted_opt, const Checkpoint& source,
                             const AuditOptions& source_opt, const std::vector<Profile>& profiles);

}  // namespace normcheck::audit
