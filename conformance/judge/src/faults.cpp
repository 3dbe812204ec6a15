#include "normcheck/judge/faults.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <sstream>

#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/fault_table.hpp"

namespace normcheck::conf {

namespace {

using enum Reproduced;
using catalogue_rows::kFaults;

constexpr std::array<std::string_view, 8> kClassNames{
    "Epsilon",           "Variance and reductions",   "Axis and shape",           "Mixed precision",
    "Residual and placement", "Parameters as loaded", "Backward and launch limits", "Quantization",
};

}  // namespace

std::span<const FaultEntry> fault_catalogue() { return kFaults; }

const FaultEntry* find_fault(std::string_view id) {
  for (const auto& f : kFaults)
    if (f.id == id) return &f;
  return nullptr;
}

std::string_view fault_class_name(char cls) {
  return cls >= 'A' && cls <= 'H' ? kClassNames[static_cast<std::size_t>(cls - 'A')] : std::string_view{};
}

std::string fault_line(const FaultEntry& f) {
  return f.refs.empty() ? std::string(f.text) : fmt::format("{} ({})", f.text, f.refs);
}

std::vector<std::string> dialects_naming(std::string_view id) {
  const FaultEntry* f = find_fault(id);
  if (!f) return {};
  std::vector<std::string> also;
  std::istringstream in{std::string(f->also_named_by)};
  for (std::string d; in >> d;) also.push_back(d);
  std::vector<std::string> out;
  for (const auto& d : dialect_panel())
    if (d.fault == id || std::find(also.begin(), also.end(), d.name) != also.end()) out.push_back(d.name);
  return out;
}

std::string faults_markdown() {
  std::string md =
      "# Fault catalogue\n"
      "\n"
      "<!-- Written by `normcheck faults --format markdown > docs/FAULTS.md` from the catalogue in\n"
      "     conformance/judge/include/normcheck/judge/fault_table.hpp; the test judge.Faults.DocumentIsTheCataloguesMarkdown\n"
      "     fails when the two differ. -->\n"
      "\n"
      "Every fault normcheck knows: the faults real normalization kernels, model code and checkpoint\n"
      "converters shipped, one row each, grouped by class (A-H, the classes the diagnosis and the\n"
      "mutants name; H, quantization, is diagnosed on quantized cases only). **Reproduced by** is the bundled mutant that has the fault (`builtin:mut_<id>`;\n"
      "every mutant is a correct two-pass kernel with that one line changed), or \"dialect only\" where\n"
      "the suite has no mutant and the diagnosis still names it (checkpoint conventions, generic\n"
      "faults). **Named by** lists the dialects of the diagnosis panel (conformance/DIAGNOSIS.md) that\n"
      "explain it; an alias counts. **Shipped in** gives public issues and pull requests (repository\n"
      "#number) where the fault was seen. **Shown by** names the inputs that reveal a mutant's fault\n"
      "(cases of the smoke and ci tiers). `normcheck faults --format json` prints the same table.\n";
  for (char cls = 'A'; cls <= 'H'; ++cls) {
    md += fmt::format("\n## {}. {}\n\n", cls, fault_class_name(cls));
    md += "| fault | computes | named by | reproduced by | shipped in | shown by |\n";
    md += "|---|---|---|---|---|---|\n";
    for (const auto& f : kFaults) {
      if (f.cls != cls) continue;
      std::string named;
      for (const auto& d : dialects_naming(f.id)) named += fmt::format("{}`{}`", named.empty() ? "" : ", ", d);
      const std::string by = f.by == mutant ? fmt::format("`mut_{}`", f.id) : "dialect only";
      md += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", f.id, f.what, named, by, f.refs, f.shows);
    }
  }
  return md;
}

}  // namespace normcheck::conf
