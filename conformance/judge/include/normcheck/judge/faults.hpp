// The fault catalogue: every fault the suite knows, one row each (docs/FAULTS.md is written from
// it by `normcheck faults --format markdown`, and a test keeps the two equal).
//
// A fault has an id, a class (A-H, the vocabulary of the whole suite; H quantization), the faulty computation,
// the public issues where it shipped and how the suite reproduces it: a bundled mutant
// (`builtin:mut_<id>`, which names the fault by its id) or a dialect of the diagnosis only. The
// dialects that name a fault are the panel's rows whose fault is this id, plus the rows listed in
// `also_named_by` (a generic dialect, such as "a rounding point of the contract skipped", that
// covers this fault among others). Nothing else lists them.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace normcheck::conf {

enum class Reproduced {
  mutant,        // builtin:mut_<id> reproduces it
  dialect_only,  // a dialect names it; no bundled mutant (checkpoint conventions, generic faults)
};

struct FaultEntry {
  std::string_view id;     // "eps_outside_sqrt"; a mutant is builtin:mut_<id>
  char cls;                // 'A' .. 'H'
  std::string_view what;   // the faulty computation, short: "rstd = 1/(sqrt(var) + eps)"
  std::string_view text;   // the fault as it shipped, in one sentence
  std::string_view refs;   // public issues and pull requests where it shipped; "" when none known
  std::string_view shows;  // the inputs that show it (fixture cases), for the mutants
  Reproduced by;
  std::string_view also_named_by = {};  // space-separated dialects (see above)
};

// Every fault, in class order.
std::span<const FaultEntry> fault_catalogue();

// The row of a fault id; nullptr when the catalogue has none.
const FaultEntry* find_fault(std::string_view id);

// "Epsilon", "Variance and reductions", ... "Quantization" for 'A' .. 'H'; "" otherwise.
std::string_view fault_class_name(char cls);

// The fault in one line with its public issues, "text (refs)": a mutant's `fault` metadata.
std::string fault_line(const FaultEntry& f);

// The dialects of the diagnosis panel that name the fault, in panel order (empty for an id the
// catalogue does not have).
std::vector<std::string> dialects_naming(std::string_view id);

// The catalogue as the Markdown of docs/FAULTS.md.
std::string faults_markdown();

}  // namespace normcheck::conf
