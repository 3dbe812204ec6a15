// The functional audit: fixture cases recorded from the original model's norm layers, re-run
// through the certified reference with the checkpoint's parameters in place of the recorded
// ones. A checkpoint that loads the parameters the model was recorded with passes every case;
// a wrong load (an offset applied twice, a re-initialized weight) fails them.
#pragma once

#include <string>
#include <vector>

#include "normcheck/audit/audit.hpp"

namespace normcheck::audit {

// Case ids name the norm module as the HF checkpoint names it (`model.layers.0.input_layernorm`:
// its parameters are `<id>.weight` and `<id>.bias`); for a GGUF or renamed checkpoint the
// profile maps them. Throws fix::FixtureError / ref::CaseError for a bad fixture file.
AuditResult functional_audit(const Checkpoint& ckpt, const std::vector<Profile>& profiles, const AuditOptions& opt,
                             const std::string& fixtures_path);

}  // namespace normcheck::audit
