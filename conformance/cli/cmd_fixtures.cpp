// `normcheck fixtures generate|merge|complete|verify|list|show`: golden fixture files.
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "normcheck/fixtures/case_list.hpp"
#include "normcheck/fixtures/error.hpp"
#include "normcheck/fixtures/generate.hpp"
#include "normcheck/fixtures/hdf5_io.hpp"
#include "normcheck/reference/case.hpp"
#include "normcheck/version.hpp"

namespace normcheck::cli {
namespace {

struct FixturesArgs {
  std::string tier, cases, output, shard, file, case_id;
  std::vector<std::string> inputs;
  std::uint64_t seed = 1;
  int threads = 0;
  int max_bits = 2048;
  bool force = false, all = false;
};

// A one-line progress display on a terminal; nothing when stderr is not one (CI logs).
fix::Progress progress_display() {
  if (!::isatty(STDERR_FILENO)) return {};
  return [](std::size_t done, std::size_t total, const std::string& id) {
    fmt::print(stderr, "\r\033[K[{:>5}/{}] {}", done, total, id);
    if (done == total) fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

std::string size_text(std::uint64_t bytes) {
  if (bytes >= (1u << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (1u << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

void print_summary(const std::string& path, const fix::Summary& s) {
  fmt::print("wrote {}: {} cases, {} output elements ({} uncertified), {}, {:.1f} s\n", path, s.cases, s.elements,
             s.uncertified, size_text(s.bytes), s.seconds);
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out;
  for (auto d : s) out += (out.empty() ? "" : "x") + std::to_string(d);
  return out;
}

int run_generate(const FixturesArgs& a) {
  if (a.tier.empty() == a.cases.empty()) {
    fmt::print(stderr, "normcheck fixtures generate: give exactly one of --tier and --cases\n");
    return kExitBadInput;
  }
  fix::GenerateOptions opt;
  opt.list_path = a.cases.empty() ? fix::tier_path(a.tier) : a.cases;
  opt.seed = a.seed;
  opt.threads = a.threads;
  if (!a.shard.empty()) {
    char slash = 0;
    int k = -1, n = 0;
    if (std::sscanf(a.shard.c_str(), "%d%c%d", &k, &slash, &n) != 3 || slash != '/' || n < 1 || k < 0 || k >= n) {
      fmt::print(stderr, "normcheck fixtures generate: --shard '{}' is not k/n with 0 <= k < n\n", a.shard);
      return kExitBadInput;
    }
    opt.shard_k = k;
    opt.shard_n = n;
  }
  opt.output = a.output;
  opt.overwrite = a.force;
  opt.reference.max_bits = a.max_bits;
  // The command that regenerates this content: thread count, shard and output path are left
  // out because they do not change it (SCHEMA.md).
  opt.command = "normcheck fixtures generate " + (a.cases.empty() ? "--tier " + a.tier : "--cases " + a.cases) +
                " --seed " + std::to_string(a.seed) +
                (a.max_bits != 2048 ? " --max-bits " + std::to_string(a.max_bits) : "");
  opt.generator_version = kVersion;
  opt.progress = progress_display();
  print_summary(a.output, fix::generate(opt));
  return kExitOk;
}

int run_list(const FixturesArgs& a) {
  fix::FixtureReader r(a.file);
  const auto& p = r.provenance();
  fmt::print("{}: normcheck-fixtures v{}, generator {} {}, tier {}, seed {}{}\n", a.file, fix::kFormatVersion,
             p.generator, p.generator_version, p.tier, p.seed, p.shard.empty() ? "" : ", shard " + p.shard);
  fmt::print("command: {}\n{} cases\n\n", p.command, r.case_ids().size());
  fmt::print("{:<44} {:<9} {:<12} {:<9} {:<9} {:<9} {:<22} {}\n", "case", "op", "shape", "x", "out", "direction",
             "contract", "category");
  for (const auto& id : r.case_ids()) {
    const fix::FixtureCase fc = r.read_case(id);
    const auto& c = fc.c;
    std::string op(ref::name_of(c.op));
    if (c.block != ref::Block::none) op += "/" + std::string(ref::name_of(c.block));
    fmt::print("{:<44} {:<9} {:<12} {:<9} {:<9} {:<9} {:<22} {}\n", id, op, shape_text(c.inputs.at("x").shape),
               ref::name_of(c.dtype_x), ref::name_of(c.dtype_out), ref::name_of(c.direction), c.contract, fc.category);
  }
  return kExitOk;
}

void print_values(const std::string& label, const ref::Tensor& t, const std::vector<double>* f64,
                  const std::vector<std::uint8_t>* cert, bool all) {
  fmt::print("  {} ({}, shape {})\n", label, ref::name_of(t.dtype), shape_text(t.shape));
  const std::size_t shown = all ? t.data.size() : std::min<std::size_t>(t.data.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    fmt::print("    [{}] {:>16} {:>22}", i, ref::decimal_text(t.data[i], t.dtype), ref::hex_text(t.data[i]));
    if (f64) fmt::print("  f64 {:>24}", ref::hex_text((*f64)[i]));
    if (cert) fmt::print("  {}", (*cert)[i] ? "certified" : "UNCERTIFIED");
    fmt::print("\n");
  }
  if (shown < t.data.size()) fmt::print("    ... {} more (--all)\n", t.data.size() - shown);
}

int run_show(const FixturesArgs& a) {
  fix::FixtureReader r(a.file);
  const fix::FixtureCase fc = r.read_case(a.case_id);
  const auto& c = fc.c;
  fmt::print("{}  ({})\n  {}\n", fc.id, fc.category, fc.description);
  fmt::print("  op {} axis {}{} epsilon {} ({}) affine {} weight_offset {} residual {} alpha {} block {} layers {} "
             "activation {} direction {} contract {}\n",
             ref::name_of(c.op), c.axis, c.axes ? " (axes given)" : "", ref::decimal_text(c.epsilon, ref::DType::float64),
             ref::hex_text(c.epsilon), ref::name_of(c.affine), c.weight_offset, ref::name_of(c.residual), c.alpha,
             ref::name_of(c.block), c.layers, ref::name_of(c.activation), ref::name_of(c.direction), c.contract);
  fmt::print("  dtypes: x {} param {} out {} compute {} residual {}\n", ref::name_of(c.dtype_x),
             ref::name_of(c.dtype_param), ref::name_of(c.dtype_out), ref::name_of(c.dtype_compute),
             ref::name_of(c.dtype_residual));
  for (const auto& [name, t] : c.inputs) print_values("inputs/" + name, t, nullptr, nullptr, a.all);
  for (const auto& [name, o] : fc.expected) print_values("expected/" + name, o.value, &o.f64, &o.certified, a.all);
  fmt::print("  reproduce: normcheck fixtures show {} {}\n", a.file, fc.id);
  return kExitOk;
}

int run_verify(const FixturesArgs& a) {
  const fix::VerifyReport rep = fix::verify(a.file, a.threads, progress_display());
  for (std::size_t i = 0; i < rep.problems.size() && i < 50; ++i) fmt::print("DIFFERENCE {}\n", rep.problems[i]);
  if (rep.problems.size() > 50) fmt::print("... {} more\n", rep.problems.size() - 50);
  fmt::print("verified {}: {} cases, {} expected elements recomputed, {} differences\n", a.file, rep.cases,
             rep.elements, rep.problems.size());
  return rep.problems.empty() ? kExitOk : kExitFailed;
}

}  // namespace

Runner add_fixtures_command(CLI::App& app) {
  auto args = std::make_shared<FixturesArgs>();
  auto* fx = app.add_subcommand("fixtures", "Golden fixture files (HDF5, fixtures/SCHEMA.md)");
  fx->require_subcommand(1);

  auto* gen = fx->add_subcommand("generate", "Generate a tier's (or a case list's) fixtures with the certified reference");
  gen->add_option("--tier", args->tier, "smoke | ci | nightly (fixtures/cases/<tier>.json)");
  gen->add_option("--cases", args->cases, "A case list file instead of a tier (fixtures/CASES.md)");
  gen->add_option("--seed", args->seed, "Seed of the drawn inputs")->capture_default_str();
  gen->add_option("--threads", args->threads, "Threads (0: all cores); the file does not depend on it");
  gen->add_option("--shard", args->shard, "k/n: generate only shard k of n (merge them with `fixtures merge`)");
  gen->add_option("-o,--output", args->output, "Output file")->required();
  gen->add_flag("--force", args->force, "Replace an existing output file");
  gen->add_option("--max-bits", args->max_bits, "Precision cap of the reference's Ziv loop")->capture_default_str();

  auto* merge = fx->add_subcommand("merge", "Merge shard files (or files of one generation) into one");
  merge->add_option("inputs", args->inputs, "Files to merge")->required()->check(CLI::ExistingFile);
  merge->add_option("-o,--output", args->output, "Output file")->required();
  merge->add_flag("--force", args->force, "Replace an existing output file");

  auto* comp = fx->add_subcommand("complete", "Add certified expected outputs to your own inputs file");
  comp->add_option("inputs", args->file, "Inputs file: case attributes and inputs/ per SCHEMA.md")->required();
  comp->add_option("-o,--output", args->output, "Output file")->required();
  comp->add_option("--threads", args->threads, "Threads (0: all cores)");
  comp->add_option("--max-bits", args->max_bits, "Precision cap of the reference's Ziv loop")->capture_default_str();
  comp->add_flag("--force", args->force, "Replace an existing output file");

  auto* ver = fx->add_subcommand("verify", "Recompute every expected value and check every checksum");
  ver->add_option("file", args->file, "Fixture file")->required();
  ver->add_option("--threads", args->threads, "Threads (0: all cores)");

  auto* list = fx->add_subcommand("list", "List the cases of a fixture file");
  list->add_option("file", args->file, "Fixture file")->required();

  auto* show = fx->add_subcommand("show", "Show one case: attributes, inputs, expected outputs");
  show->add_option("file", args->file, "Fixture file")->required();
  show->add_option("case", args->case_id, "Case id")->required();
  show->add_flag("--all", args->all, "Print every element (default: the first 8)");

  return [args, gen, merge, comp, ver, list, show]() -> int {
    const FixturesArgs& a = *args;
    try {
      if (gen->parsed()) return run_generate(a);
      if (merge->parsed()) {
        print_summary(a.output, fix::merge(a.inputs, a.output, a.force));
        return kExitOk;
      }
      if (comp->parsed()) {
        ref::Options opt;
        opt.max_bits = a.max_bits;
        print_summary(a.output, fix::complete(a.file, a.output, a.force, opt, a.threads, kVersion, progress_display()));
        return kExitOk;
      }
      if (ver->parsed()) return run_verify(a);
      if (list->parsed()) return run_list(a);
      if (show->parsed()) return run_show(a);
    } catch (const fix::FixtureError& e) {
      fmt::print(stderr, "{}normcheck fixtures: {}\n", ::isatty(STDERR_FILENO) ? "\n" : "", e.what());
      return kExitBadInput;
    } catch (const ref::CaseError& e) {
      fmt::print(stderr, "{}normcheck fixtures: invalid case: {}\n", ::isatty(STDERR_FILENO) ? "\n" : "", e.what());
      return kExitBadInput;
    }
    return kExitBadInput;
  };
}

}  // namespace normcheck::cli
