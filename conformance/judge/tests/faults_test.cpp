// The fault catalogue against the panel and against its document: every dialect names a fault of
// the catalogue and takes its class; every fault is named by a dialect; docs/FAULTS.md is the
// catalogue's own Markdown. (That every mutant row has its bundled mutant, and every mutant a
// row, is tested with the mutants: conformance/candidates/cpu/tests.)
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "normcheck/judge/diagnosis.hpp"
#include "normcheck/judge/faults.hpp"

namespace normcheck::conf {
namespace {

TEST(Faults, IdsAreUniqueAndInClassOrder) {
  std::set<std::string_view> ids;
  char last = 'A';
  for (const auto& f : fault_catalogue()) {
    EXPECT_TRUE(ids.insert(f.id).second) << "fault id twice: " << f.id;
    EXPECT_GE(f.cls, 'A') << f.id;
    EXPECT_LE(f.cls, 'H') << f.id;
    EXPECT_GE(f.cls, last) << f.id << " out of class order";
    last = f.cls;
    EXPECT_FALSE(f.what.empty()) << f.id;
    EXPECT_FALSE(f.text.empty()) << f.id;
    if (f.by == Reproduced::mutant) {  // a mutant says where the fault shipped and what shows it
      EXPECT_NE(f.refs.find('#'), std::string_view::npos) << f.id << ": no public issue";
      EXPECT_FALSE(f.shows.empty()) << f.id;
    }
  }
  EXPECT_EQ(find_fault("no_such_fault"), nullptr);
  EXPECT_TRUE(dialects_naming("no_such_fault").empty());
}

TEST(Faults, EveryDialectNamesACatalogueFaultAndTakesItsClass) {
  for (const auto& d : dialect_panel()) {
    const FaultEntry* f = find_fault(d.fault);
    ASSERT_NE(f, nullptr) << d.name << " names " << d.fault;
    EXPECT_EQ(d.fault_class, std::string(1, f->cls)) << d.name;
  }
}

TEST(Faults, EveryFaultIsNamedByADialect) {
  std::set<std::string> panel;
  for (const auto& d : dialect_panel()) panel.insert(d.name);
  for (const auto& f : fault_catalogue()) {
    EXPECT_FALSE(dialects_naming(f.id).empty()) << f.id << ": no dialect names it";
    std::istringstream also{std::string(f.also_named_by)};
    for (std::string d; also >> d;) EXPECT_TRUE(panel.count(d)) << f.id << ": also_named_by " << d << " is no dialect";
  }
}

TEST(Faults, NamingFollowsThePanelAndTheAlsoNamedList) {
  // One fault, several dialects of its own (the three one-pass variance dtypes); one fault also
  // named by a generic dialect of another fault (a skipped rounding point of the contract).
  EXPECT_EQ(dialects_naming("one_pass_variance"),
            (std::vector<std::string>{"one_pass_variance_fp32", "one_pass_variance_fp16", "one_pass_variance_fp64"}));
  EXPECT_EQ(dialects_naming("weight_before_downcast"),
            (std::vector<std::string>{"contract_point_skipped", "other_contract"}));
  EXPECT_EQ(fault_line(*find_fault("eps_hardcoded")),
            "eps hard-coded to 1e-6 instead of the configured value (llama.cpp #2373)");
}

TEST(Faults, DocumentIsTheCataloguesMarkdown) {
  std::ifstream in(NORMCHECK_FAULTS_DOC);
  ASSERT_TRUE(in) << "cannot read " << NORMCHECK_FAULTS_DOC;
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_TRUE(doc.str() == faults_markdown())
      << NORMCHECK_FAULTS_DOC << " differs from the catalogue: write it again with\n"
      << "  normcheck faults --format markdown > docs/FAULTS.md";
}

}  // namespace
}  // namespace normcheck::conf
