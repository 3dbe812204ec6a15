// Reading results files (normcheck-results v1) into the report model, and merging them.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "normcheck/reports/report.hpp"

namespace normcheck::reports {

using Json = nlohmann::json;

bool is_failure(const std::string& v) { return v == "FAILED" || v == "MISSING" || v == "CRASHED" || v == "TIMEOUT"; }

namespace {

// A reader of one JSON object that names the file and the field in every error.
class Field {
 public:
  Field(const Json& j, std::string source, std::string path) : j_(j), src_(std::move(source)), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ReportError(fmt::format("{}: {}{}{}: {}", src_, path_, path_.empty() || key.empty() ? "" : ".", key, what));
  }
  bool has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const Json& at(const std::string& k) const {
    if (!has(k)) fail(k, "missing");
    return j_.at(k);
  }
  std::string str(const std::string& k, bool required = false) const {
    if (!has(k)) {
      if (required) fail(k, "missing");
      return {};
    }
    if (!j_.at(k).is_string()) fail(k, "expected a string");
    return j_.at(k).get<std::string>();
  }
  // A number, or "inf" / "-inf" / "nan" (RESULTS.md).
  double num(const std::string& k, bool required = false, double dflt = 0) const {
    if (!has(k)) {
      if (required) fail(k, "missing");
      return dflt;
    }
    return number_of(j_.at(k), k);
  }
  double number_of(const Json& v, const std::string& k) const {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const auto s = v.get<std::string>();
      if (s == "inf") return INFINITY;
      if (s == "-inf") return -INFINITY;
      if (s == "nan") return NAN;
    }
    fail(k, "expected a number (or \"inf\", \"-inf\", \"nan\")");
  }
  std::int64_t integer(const std::string& k, bool required = false) const {
    if (!has(k)) {
      if (required) fail(k, "missing");
      return 0;
    }
    if (!j_.at(k).is_number_integer()) fail(k, "expected an integer");
    return j_.at(k).get<std::int64_t>();
  }
  bool boolean(const std::string& k) const {
    if (!has(k)) return false;
    if (!j_.at(k).is_boolean()) fail(k, "expected true or false");
    return j_.at(k).get<bool>();
  }
  Field object(const std::string& k) const {
    if (!at(k).is_object()) fail(k, "expected an object");
    return Field(j_.at(k), src_, sub(k));
  }
  // Elements of an array field (empty when absent and not required).
  std::vector<Field> array(const std::string& k, bool required = false) const {
    std::vector<Field> out;
    if (!has(k)) {
      if (required) fail(k, "missing");
      return out;
    }
    if (!j_.at(k).is_array()) fail(k, "expected an array");
    std::size_t i = 0;
    for (const auto& e : j_.at(k)) {
      const std::string p = fmt::format("{}[{}]", sub(k), i++);
      out.emplace_back(e, src_, p);
    }
    return out;
  }
  std::vector<double> numbers(const std::string& k) const {
    std::vector<double> out;
    for (const auto& e : array(k)) out.push_back(e.number_of(e.j_, ""));
    return out;
  }
  std::vector<std::int64_t> integers(const std::string& k) const {
    std::vector<std::int64_t> out;
    for (const auto& e : array(k)) {
      if (!e.j_.is_number_integer()) e.fail("", "expected an integer");
      out.push_back(e.j_.get<std::int64_t>());
    }
    return out;
  }
  std::vector<std::string> strings(const std::string& k) const {
    std::vector<std::string> out;
    for (const auto& e : array(k)) {
      if (!e.j_.is_string()) e.fail("", "expected a string");
      out.push_back(e.j_.get<std::string>());
    }
    return out;
  }
  const Json& json() const { return j_; }
  void require_object() const {
    if (!j_.is_object()) fail("", "expected an object");
  }

 private:
  std::string sub(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  const Json& j_;
  std::string src_, path_;
};

void check_one_of(const Field& f, const std::string& key, const std::string& v, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    f.fail(key, fmt::format("'{}' is not one of {}", v, list));
  }
}

Value value_of(const Field& f) {
  f.require_object();
  return Value{f.str("decimal"), f.str("hex")};
}

Histogram histogram_of(const Field& f) {
  f.require_object();
  Histogram h;
  h.zero = f.integer("zero");
  h.inf = f.integer("inf");
  h.bins = f.integers("bins");
  return h;
}

std::vector<Diagnosis> diagnosis_of(const Field& parent) {
  std::vector<Diagnosis> out;
  for (const auto& d : parent.array("diagnosis")) {
    d.require_object();
    Diagnosis g;
    g.dialect = d.str("dialect", true);
    g.fault_class = d.str("fault_class");
    g.title = d.str("title");
    g.evidence = d.str("evidence");
    g.score = d.num("score", false, NAN);
    g.explains = d.boolean("explains");
    if (d.has("parameters")) {
      if (!d.at("parameters").is_object()) d.fail("parameters", "expected an object");
      g.parameters = d.at("parameters").dump();
    }
    out.push_back(std::move(g));
  }
  return out;
}

Output output_of(const Field& f) {
  f.require_object();
  Output o;
  o.name = f.str("name", true);
  o.verdict = f.str("verdict", true);
  check_one_of(f, "verdict", o.verdict, kCaseVerdicts);
  o.reason = f.str("reason");
  o.dtype = f.str("dtype");
  o.elements = f.integer("elements");
  o.failed = f.integer("failed");
  o.mistrusted = f.integer("mistrusted");
  o.uncertified = f.integer("uncertified");
  o.flushed = f.integer("flushed");
  o.max_ulp = f.num("max_ulp");
  o.max_abs = f.num("max_abs");
  o.max_rel = f.num("max_rel");
  o.max_ratio = f.num("max_ratio");
  if (f.has("sensitivity")) o.sensitivity = f.num("sensitivity");
  if (f.has("probes")) {
    const Field p = f.object("probes");
    for (const auto& [k, v] : f.at("probes").items()) o.probes[k] = p.num(k);
  }
  if (f.has("worst")) {
    const Field w = f.object("worst");
    Worst x;
    x.index = w.integer("index");
    x.coords = w.integers("coords");
    x.got = value_of(w.object("got"));
    x.expected = value_of(w.object("expected"));
    x.exact = value_of(w.object("exact"));
    x.allowance = w.num("allowance");
    o.worst = std::move(x);
  }
  if (f.has("histogram")) {
    const Field h = f.object("histogram");
    o.log2_min = static_cast<int>(h.integer("log2_min", true));
    if (h.has("ulp")) o.hist_ulp = histogram_of(h.object("ulp"));
    if (h.has("ratio")) o.hist_ratio = histogram_of(h.object("ratio"));
  }
  if (f.has("rows")) {
    const Field r = f.object("rows");
    Rows rows;
    rows.count = r.integer("count");
    rows.row = r.integers("row");
    rows.mean_over_sigma = r.numbers("mean_over_sigma");
    rows.max_ulp = r.numbers("max_ulp");
    rows.max_ratio = r.numbers("max_ratio");
    const std::size_t n = rows.row.size();
    if (rows.mean_over_sigma.size() != n || rows.max_ulp.size() != n || rows.max_ratio.size() != n)
      r.fail("", "row, mean_over_sigma, max_ulp and max_ratio must have the same length");
    o.rows = std::move(rows);
  }
  return o;
}

Case case_of(const Field& f) {
  f.require_object();
  Case c;
  c.case_id = f.str("case_id", true);
  c.verdict = f.str("verdict", true);
  check_one_of(f, "verdict", c.verdict, kCaseVerdicts);
  c.message = f.str("message");
  c.repro = f.str("repro");
  c.op = f.str("op");
  c.direction = f.str("direction");
  c.block = f.str("block");
  c.dtype = f.str("dtype");
  c.category = f.str("category");
  c.normalized_size = f.integer("normalized_size");
  c.seconds = f.num("seconds");
  for (const auto& o : f.array("outputs")) c.outputs.push_back(output_of(o));
  c.diagnosis = diagnosis_of(f);
  if (f.has("known_finding")) {
    const Field k = f.object("known_finding");
    c.known_finding = k.str("finding", true);
    c.known_what = k.str("what");
  }
  return c;
}

}  // namespace

const Output* Case::worst_output() const {
  const Output* w = nullptr;
  for (const auto& o : outputs) {
    const bool bad = o.verdict != "PASSED";
    if (!w || (bad && w->verdict == "PASSED") ||
        ((bad == (w->verdict != "PASSED")) && !(o.max_ratio <= w->max_ratio)))
      w = &o;
  }
  return w;
}

std::string Case::op_label() const {
  if (op.empty()) return "—";
  std::string s = op;
  if (direction == "backward") s += " backward";
  if (!block.empty()) s += " " + block + " block";
  return s;
}

std::string Run::name() const { return mode == "audit" ? checkpoint_path : spec; }

std::map<std::string, std::int64_t> Run::counts() const {
  std::map<std::string, std::int64_t> n;
  if (mode == "audit") {
    for (const char* s : {"error", "warning", "info"}) n[s] = 0;
    for (const auto& f : findings) ++n[f.severity];
  } else if (mode == "prop") {
    for (const char* s : {"PASSED", "FAILED", "UNSUPPORTED", "CRASHED"}) n[s] = 0;
    for (const auto& p : properties) ++n[p.verdict];
  } else {
    for (const auto& v : kVerdictColumns) n[v] = 0;
    for (const auto& c : cases) ++n[c.verdict];
  }
  return n;
}

std::int64_t Run::known_findings() const {
  std::int64_t k = 0;
  for (const auto& c : cases) k += is_failure(c.verdict) && !c.known_finding.empty();
  return k;
}

std::int64_t Run::failures() const {
  std::int64_t k = static_cast<std::int64_t>(stale_findings.size());
  for (const auto& c : cases) k += is_failure(c.verdict) && (c.known_finding.empty() || is_mutant());
  for (const auto& p : properties) k += p.verdict == "FAILED" || p.verdict == "CRASHED";
  for (const auto& f : findings) k += f.severity == "error";
  return k;
}

bool Run::ok() const { return is_mutant() ? failures() > 0 : failures() == 0 && errors.empty(); }

std::string Run::outcome() const {
  const std::int64_t bad = failures();
  if (mode == "audit") return bad ? fmt::format("{} error finding{}", bad, bad == 1 ? "" : "s") : "no errors";
  if (is_mutant()) return bad ? "rejected (as it must be)" : "NOT REJECTED";
  const std::int64_t known = known_findings();
  const std::string known_text =
      known > 0 ? fmt::format(" ({} known finding{})", known, known == 1 ? "" : "s") : std::string();
  if (bad) {
    if (stale_findings.empty()) return "FAILED" + known_text;
    std::string ids;
    for (const auto& id : stale_findings) ids += (ids.empty() ? "" : ", ") + id;
    return "FAILED" + known_text + " (recorded finding no longer shows: " + ids + ")";
  }
  if (!errors.empty()) return "stopped early";
  std::int64_t checked = 0;
  for (const auto& c : cases) checked += c.verdict != "UNSUPPORTED";
  for (const auto& p : properties) checked += p.verdict != "UNSUPPORTED";
  if (checked == 0) return "nothing checked (all unsupported)";
  std::int64_t flushed = 0;
  for (const auto& c : cases)
    for (const auto& o : c.outputs) flushed += o.flushed;
  const std::string ok = (mode == "prop" ? "properties hold" : "conforms") + known_text;
  if (flushed > 0) return fmt::format("{} ({} zero{} accepted as flushed subnormals)", ok, flushed, flushed == 1 ? "" : "s");
  return ok;
}

bool Report::ok() const {
  return std::all_of(runs.begin(), runs.end(), [](const Run& r) { return r.ok(); });
}

Run parse_results(const std::string& text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw ReportError(fmt::format("{}: not a results file: invalid or truncated JSON (byte {}: {})", source, e.byte,
                                  e.what()));
  }
  if (!j.is_object()) throw ReportError(fmt::format("{}: not a results file: the top level is not a JSON object", source));
  const Field f(j, source, "");
  if (!f.has("format") || !j.at("format").is_string() || j.at("format").get<std::string>() != kResultsFormat)
    throw ReportError(fmt::format("{}: not a results file: format is {} where \"{}\" is expected", source,
                                  f.has("format") ? j.at("format").dump() : "missing", kResultsFormat));
  if (!f.has("format_version") || !j.at("format_version").is_number_integer() ||
      j.at("format_version").get<std::int64_t>() != kResultsFormatVersion)
    throw ReportError(fmt::format("{}: format_version {} is not supported: this normcheck reads normcheck-results {}",
                                  source, f.has("format_version") ? j.at("format_version").dump() : "missing",
                                  kResultsFormatVersion));
  Run r;
  r.sources = {source};
  r.mode = f.has("mode") ? f.str("mode") : "run";
  check_one_of(f, "mode", r.mode, {"run", "check", "prop", "audit"});
  r.generator_version = f.str("generator_version");
  r.command = f.str("command");
  r.seconds = f.num("seconds");
  if (f.has("error")) r.errors.push_back(f.str("error"));
  if (f.has("stale_findings")) r.stale_findings = f.strings("stale_findings");
  if (f.has("fixtures")) {
    const Field fx = f.object("fixtures");
    r.fixtures_path = fx.str("path");
    r.fixtures_tier = fx.str("tier");
    if (fx.has("seed")) {
      if (!fx.at("seed").is_number_unsigned()) fx.fail("seed", "expected a non-negative integer");
      r.fixtures_seed = fx.at("seed").get<std::uint64_t>();
    }
  }
  if (r.mode == "audit") {
    const Field cp = f.object("checkpoint");
    r.checkpoint_path = cp.str("path", true);
    r.checkpoint_format = cp.str("format");
    r.checkpoint_profile = cp.str("profile");
    for (const auto& x : f.array("findings", true)) {
      x.require_object();
      Finding g;
      g.severity = x.str("severity", true);
      check_one_of(x, "severity", g.severity, {"error", "warning", "info"});
      g.check = x.str("check", true);
      g.message = x.str("message");
      g.tensors = x.strings("tensors");
      r.findings.push_back(std::move(g));
    }
  } else {
    const Field c = f.object("candidate");
    r.spec = c.str("spec", true);
    r.kind = c.str("kind");
    r.description = c.str("description");
    r.device = c.str("device");
    r.fault_class = c.str("fault_class");
    r.fault = c.str("fault");
    if (c.has("reduction")) r.reduction = c.str("reduction");
  }
  for (const auto& c : f.array("cases", r.mode == "run" || r.mode == "check")) r.cases.push_back(case_of(c));
  for (const auto& p : f.array("properties", r.mode == "prop")) {
    p.require_object();
    Property q;
    q.name = p.str("name", true);
    q.verdict = p.str("verdict", true);
    check_one_of(p, "verdict", q.verdict, {"PASSED", "FAILED", "UNSUPPORTED", "CRASHED"});
    q.tests = p.integer("tests");
    if (p.has("seed")) {
      if (!p.at("seed").is_number_unsigned()) p.fail("seed", "expected a non-negative integer");
      q.seed = p.at("seed").get<std::uint64_t>();
    }
    q.reproduce = p.str("reproduce");
    q.message = p.str("message");
    if (p.has("counterexample")) {
      const Field cx = p.object("counterexample");
      q.has_counterexample = true;
      q.cx_fixture = cx.str("fixture");
      q.cx_case_id = cx.str("case_id");
      q.cx_summary = cx.str("summary");
      q.cx_shape = cx.integers("shape");
    }
    q.diagnosis = diagnosis_of(p);
    r.properties.push_back(std::move(q));
  }
  // The summary must agree with the cases: a file cut short and patched up, or edited by hand,
  // would otherwise report numbers that are not the cases'.
  if ((r.mode == "run" || r.mode == "check") && f.has("summary")) {
    const Field s = f.object("summary");
    const auto counted = r.counts();
    for (const auto& v : kVerdictColumns) {
      const std::int64_t said = s.integer(v);
      if (said != counted.at(v))
        s.fail(v, fmt::format("says {} but the file holds {} {} case{}", said, counted.at(v), v,
                              counted.at(v) == 1 ? "" : "s"));
    }
  }
  std::sort(r.cases.begin(), r.cases.end(), [](const Case& a, const Case& b) { return a.case_id < b.case_id; });
  return r;
}

Run read_results(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReportError(fmt::format("{}: cannot open the results file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ReportError(fmt::format("{}: cannot read the results file", path));
  return parse_results(ss.str(), path);
}

Report merge(std::vector<Run> runs) {
  Report rep;
  std::map<std::string, std::size_t> at;  // mode + name -> index in rep.runs
  for (auto& r : runs) {
    const std::string key = r.mode + "\n" + r.name();
    const auto it = at.find(key);
    if (it == at.end()) {
      at[key] = rep.runs.size();
      rep.runs.push_back(std::move(r));
      continue;
    }
    Run& m = rep.runs[it->second];
    if (m.kind != r.kind)
      throw ReportError(fmt::format("{} and {}: the same candidate {} with kinds {} and {}", m.sources.front(),
                                    r.sources.front(), r.name(), m.kind, r.kind));
    std::set<std::string> ids;
    for (const auto& c : m.cases) ids.insert(c.case_id);
    for (auto& c : r.cases) {
      if (!ids.insert(c.case_id).second)
        throw ReportError(fmt::format("{}: case {} of {} is also in {}", r.sources.front(), c.case_id, r.name(),
                                      fmt::format("{}", m.sources.front())));
      m.cases.push_back(std::move(c));
    }
    std::set<std::string> props;
    for (const auto& p : m.properties) props.insert(p.name);
    for (auto& p : r.properties) {
      if (!props.insert(p.name).second)
        throw ReportError(fmt::format("{}: property {} of {} is also in {}", r.sources.front(), p.name, r.name(),
                                      m.sources.front()));
      m.properties.push_back(std::move(p));
    }
    for (auto& f : r.findings) m.findings.push_back(std::move(f));
    for (auto& e : r.errors) m.errors.push_back(std::move(e));
    for (auto& id : r.stale_findings) m.stale_findings.push_back(std::move(id));
    for (auto& s : r.sources) m.sources.push_back(std::move(s));
    if (m.fixtures_path != r.fixtures_path && !r.fixtures_path.empty())
      m.fixtures_path = m.fixtures_path.empty() ? r.fixtures_path : m.fixtures_path + ", " + r.fixtures_path;
    m.seconds += r.seconds;
    std::sort(m.cases.begin(), m.cases.end(), [](const Case& a, const Case& b) { return a.case_id < b.case_id; });
  }
  return rep;
}

}  // namespace normcheck::reports
