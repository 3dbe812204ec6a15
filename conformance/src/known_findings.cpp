#include "normcheck/conformance/known_findings.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace normcheck::conf {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: not a known-findings file: {}", path, what));
}

const nlohmann::json& field(const nlohmann::json& o, const char* key, const std::string& path, const std::string& at) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_string()) bad(path, fmt::format("{}.{} must be a string", at, key));
  return *it;
}

// The entry of `case_id` that applies to `run` (at most one: read_known_findings rejects a case
// listed twice).
const KnownFinding* recorded(const std::vector<KnownFinding>& findings, const CandidateRun& run,
                             const std::string& case_id) {
  const auto it = std::find_if(findings.begin(), findings.end(),
                               [&](const KnownFinding& f) { return f.case_id == case_id && f.applies_to(run); });
  return it == findings.end() ? nullptr : &*it;
}

}  // namespace

void read_known_findings(const std::string& path, KnownFindings& into) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot read the known-findings file", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    bad(path, fmt::format("not JSON ({})", e.what()));
  }
  if (!j.is_object() || j.value("format", "") != "normcheck-known-findings")
    bad(path, "\"format\" must be \"normcheck-known-findings\"");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != 1)
    bad(path, "\"version\" must be 1");
  if (!j.contains("candidates") || !j["candidates"].is_object()) bad(path, "\"candidates\" must be an object");
  for (const auto& [spec, list] : j["candidates"].items()) {
    if (!list.is_array()) bad(path, fmt::format("candidates[\"{}\"] must be an array", spec));
    auto& out = into[spec];
    std::set<std::string> seen;
    for (const auto& f : out) seen.insert(f.case_id);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string at = fmt::format("candidates[\"{}\"][{}]", spec, i);
      if (!list[i].is_object()) bad(path, at + " must be an object");
      KnownFinding k;
      k.case_id = field(list[i], "case", path, at).get<std::string>();
      const auto v = parse_verdict(field(list[i], "verdict", path, at).get<std::string>());
      if (!v || !is_failure(*v))
        bad(path, fmt::format("{}.verdict must be FAILED, CRASHED, TIMEOUT or MISSING", at));
      k.verdict = *v;
      k.finding = field(list[i], "finding", path, at).get<std::string>();
      if (list[i].contains("what")) k.what = field(list[i], "what", path, at).get<std::string>();
      if (list[i].contains("when")) {
        if (field(list[i], "when", path, at).get<std::string>() != "--ignore-flush-declaration")
          bad(path, fmt::format("{}.when must be \"--ignore-flush-declaration\" (the one condition)", at));
        k.without_flush_declaration = true;
      }
      if (!seen.insert(k.case_id).second) bad(path, fmt::format("{}: case {} is listed twice", at, k.case_id));
      out.push_back(std::move(k));
    }
  }
}

const KnownFinding* known_finding_of(const std::vector<KnownFinding>& findings, const CandidateRun& run,
                                     const CaseResult& r) {
  const KnownFinding* f = recorded(findings, run, r.case_id);
  return f && f->verdict == r.verdict ? f : nullptr;
}

void apply_known_findings(CandidateRun& run, const std::vector<KnownFinding>& findings) {
  for (auto& c : run.cases) {
    const KnownFinding* f = recorded(findings, run, c.case_id);
    if (!f) continue;
    if (f->verdict == c.verdict) {
      c.known_finding = f->finding;
      c.known_what = f->what;
      ++run.known_findings;
    } else {
      run.stale_findings.push_back(c.case_id);
    }
  }
}

}  // namespace normcheck::conf
