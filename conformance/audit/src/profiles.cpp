// Loading and validating the architecture profiles (conformance/audit/profiles/*.json, format
// in conformance/audit/README.md). Validation is up front so that the audit can trust the
// fields it reads.
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "normcheck/audit/audit.hpp"

namespace normcheck::audit {
namespace {

void require(bool ok, const std::string& file, const std::string& what) {
  if (!ok) throw AuditInputError(fmt::format("profile {}: {}", file, what));
}

void validate(const nlohmann::json& p, const std::string& file) {
  require(p.is_object(), file, "not a JSON object");
  require(p.contains("name") && p["name"].is_string(), file, "no \"name\" string");
  require(p.contains("op") && (p["op"] == "rmsnorm" || p["op"] == "layernorm"), file, "\"op\" is not rmsnorm or layernorm");
  require(p.contains("offset") && p["offset"].is_object() && p["offset"].contains("hf") && p["offset"].contains("gguf") &&
              p["offset"]["hf"].is_number_integer() && p["offset"]["gguf"].is_number_integer(),
          file, "\"offset\" is not {\"hf\": int, \"gguf\": int}");
  require(p.contains("dims") && p["dims"].is_object(), file, "no \"dims\" object");
  for (const auto& [name, d] : p["dims"].items()) {
    require(d.is_object(), file, "dims." + name + " is not an object");
    for (const char* k : {"config", "gguf", "config_product", "config_quotient", "gguf_product", "gguf_quotient"})
      require(!d.contains(k) || (d[k].is_array() && std::all_of(d[k].begin(), d[k].end(), [](const auto& s) { return s.is_string(); })),
              file, fmt::format("dims.{}.{} is not an array of strings", name, k));
  }
  require(p.contains("eps") && p["eps"].is_object() && p["eps"].contains("usual") && p["eps"]["usual"].is_array(), file,
          "\"eps\" has no \"usual\" array");
  require(p.contains("tensors") && p["tensors"].is_array() && !p["tensors"].empty(), file, "no \"tensors\" array");
  for (const auto& t : p["tensors"]) {
    require(t.is_object() && t.contains("role") && t["role"].is_string(), file, "a tensor entry has no \"role\"");
    const std::string role = t["role"];
    require(t.contains("kind") && (t["kind"] == "weight" || t["kind"] == "bias"), file, role + ": \"kind\" is not weight or bias");
    require(t.contains("hf") && t["hf"].is_string() && t.contains("gguf") && t["gguf"].is_string(), file,
            role + ": \"hf\" and \"gguf\" name patterns are required");
    require(t.contains("shape") && t["shape"].is_array(), file, role + ": no \"shape\" array");
    for (const auto& s : t["shape"]) require(s.is_string() && p["dims"].contains(s.get<std::string>()), file, role + ": shape names an unknown dim");
    if (t.contains("per_layer")) require(t["per_layer"].is_string() && p["dims"].contains(t["per_layer"].get<std::string>()), file,
                                         role + ": per_layer names an unknown dim");
    const bool layered = t.contains("per_layer");
    for (const char* k : {"hf", "gguf"})
      require((t[k].get<std::string>().find("{L}") != std::string::npos) == layered, file,
              fmt::format("{}: the {} pattern must contain {{L}} exactly when per_layer is set", role, k));
  }
}

}  // namespace

std::string default_profiles_dir() {
  if (const char* env = std::getenv("NORMCHECK_AUDIT_PROFILES"); env && *env) return env;
  return NORMCHECK_AUDIT_PROFILES_DIR;
}

std::vector<Profile> load_profiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw AuditInputError(fmt::format("profiles directory {} does not exist", dir));
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<Profile> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw AuditInputError(fmt::format("profile {}: not valid JSON: {}", f, e.what()));
    }
    validate(j, f);
    out.push_back({j["name"].get<std::string>(), std::move(j)});
  }
  if (out.empty()) throw AuditInputError(fmt::format("no profiles (*.json) in {}", dir));
  return out;
}

}  // namespace normcheck::audit
