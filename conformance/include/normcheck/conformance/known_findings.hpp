// Recorded findings of real libraries: the cases whose verdict is a known fault of the library
// (docs/FINDINGS.md), kept as data next to each bundled real candidate
// (conformance/candidates/ggml/known_findings.json). `normcheck run --known-findings FILE`
// holds a candidate to them: a failure that is a recorded finding is reported as one and does
// not fail the run; a failure that is none does, and so does a recorded finding that no longer
// shows (the library fixed it, or the case changed: the file is to be updated).
//
// File format "normcheck-known-findings" version 1:
//   {"format": "normcheck-known-findings", "version": 1, "description": "...",
//    "candidates": {"builtin:ggml-cpu": [{"case": ID, "verdict": "CRASHED",
//                                          "finding": "docs/FINDINGS.md#anchor", "what": "...",
//                                          "when": "--ignore-flush-declaration"}]}}
// "when" (optional): the entry holds only for runs judged that way. "--ignore-flush-declaration"
// is the one condition: a candidate that declares flush-to-zero outputs conforms under its
// declaration, and its flushing shows as a failure only when the declaration is ignored
// (conformance/candidates/onednn/known_findings.json). Other runs leave such an entry alone.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "normcheck/conformance/runner.hpp"

namespace normcheck::conf {

struct KnownFinding {
  std::string case_id;
  Verdict verdict = Verdict::failed;  // FAILED, CRASHED, TIMEOUT or MISSING
  std::string finding, what;          // the docs anchor; what the library does there
  // Holds only in runs with --ignore-flush-declaration (CandidateInfo::flush_declaration_ignored).
  bool without_flush_declaration = false;
  // Whether the entry applies to this run of the candidate.
  bool applies_to(const CandidateRun& run) const {
    return !without_flush_declaration || run.info.flush_declaration_ignored;
  }
};

// Candidate spec -> its recorded findings.
using KnownFindings = std::map<std::string, std::vector<KnownFinding>>;

// Reads one file and adds its candidates' findings to `into`. Throws std::runtime_error naming
// the file and the field (unreadable, not JSON, another format or version, a verdict that is
// not a failure, the same case twice for a candidate).
void read_known_findings(const std::string& path, KnownFindings& into);

// The recorded finding `r` (a case of `run`) is, of `findings` (one candidate's): same case, same
// verdict, an entry that applies to the run; or null.
const KnownFinding* known_finding_of(const std::vector<KnownFinding>& findings, const CandidateRun& run,
                                     const CaseResult& r);

// Marks the cases of `run` whose verdict is their recorded one (CaseResult::known_finding) and
// lists the recorded cases of the run whose verdict is another (stale_findings). Recorded cases
// the run did not include (other tiers, --cases), and entries that do not apply to the run
// ("when"), are left alone.
void apply_known_findings(CandidateRun& run, const std::vector<KnownFinding>& findings);

}  // namespace normcheck::conf
