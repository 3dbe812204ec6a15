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
//                                          "finding": "docs/FINDINGS.md#anchor", "what": "..."}]}}
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
};

// Candidate spec -> its recorded findings.
using KnownFindings = std::map<std::string, std::vector<KnownFinding>>;

// Reads one file and adds its candidates' findings to `into`. Throws std::runtime_error naming
// the file and the field (unreadable, not JSON, another format or version, a verdict that is
// not a failure, the same case twice for a candidate).
void read_known_findings(const std::string& path, KnownFindings& into);

// The recorded finding `r` is, of `findings` (one candidate's): same case, same verdict; or null.
const KnownFinding* known_finding_of(const std::vector<KnownFinding>& findings, const CaseResult& r);

// Marks the cases of `run` whose verdict is their recorded one (CaseResult::known_finding) and
// lists the recorded cases of the run whose verdict is another (stale_findings). Recorded cases
// the run did not include (other tiers, --cases) are left alone.
void apply_known_findings(CandidateRun& run, const std::vector<KnownFinding>& findings);

}  // namespace normcheck::conf
