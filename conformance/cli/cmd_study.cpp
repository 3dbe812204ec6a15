// `normcheck study placement`: parses the options, runs the study (conformance/study/), writes
// its results file and hands that file's text to reports/ for the HTML page and the Markdown
// summary. Every option is checked and every target tested before the study runs: bad input
// writes nothing.
#include <fmt/core.h>

#include <exception>
#include <filesystem>
#include <string>

#include "commands.hpp"
#include "normcheck/reports/study.hpp"
#include "normcheck/study/placement.hpp"
#include "normcheck/version.hpp"

namespace normcheck::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kFullSeeds = 16;

struct StudyArgs {
  std::vector<std::string> placements{"post", "pre", "sandwich", "deepnorm"}, norms{"layernorm", "rmsnorm"};
  std::vector<std::string> lowp{"none"};
  std::vector<std::string> sweep_lr{"1e-4", "1e-3", "1e-2", "1e-1", "1"};
  std::string activation = "relu", optimizer = "adam", model = "attention+ffn", json, html_dir, markdown;
  std::optional<double> alpha, beta;
  study::PlacementOptions o;
  bool force = false, full = false;
  CLI::App* cmd = nullptr;
};

// --full: the full study where an option is not given (README.md "Speed").
void apply_full(StudyArgs& a) {
  if (!a.full) return;
  auto given = [&](const char* flag) { return a.cmd->get_option(flag)->count() > 0; };
  if (!given("--seeds")) a.o.seeds = kFullSeeds;
  if (!given("--sweep-lr")) a.sweep_lr = {"1e-4", "1e-3", "1e-2", "1e-1", "1"};
  if (!given("--sweep-steps")) a.o.sweep_steps = 4;
  if (!given("--lowp")) a.lowp = {"float16", "bfloat16"};
  if (!given("--steps")) a.o.steps = 4;
}

// The options into o, or a StudyInputError naming the flag.
void parse(StudyArgs& a) {
  apply_full(a);
  auto& o = a.o;
  o.placements.clear();
  for (const auto& s : a.placements) {
    const auto p = study::parse_placement(s);
    if (!p) throw study::StudyInputError("--placement", fmt::format("unknown placement '{}' (post, pre, sandwich, deepnorm)", s));
    o.placements.push_back(*p);
  }
  o.norms.clear();
  for (const auto& s : a.norms) {
    const auto op = ref::enum_parse<ref::Op>(s);
    if (!op) throw study::StudyInputError("--norm", fmt::format("unknown norm '{}' ({})", s, ref::enum_names_text<ref::Op>()));
    o.norms.push_back(*op);
  }
  o.lowp.clear();
  for (const auto& s : a.lowp) {
    if (s == "none") continue;
    const auto t = ref::parse_dtype(s);
    if (!t || *t == ref::DType::float64)
      throw study::StudyInputError("--lowp", fmt::format("'{}' is not a low-precision dtype (float16, bfloat16, float32, none)", s));
    o.lowp.push_back(*t);
  }
  if (a.activation == "relu") o.activation = ref::Activation::relu;
  else if (a.activation == "gelu") o.activation = ref::Activation::gelu;
  else throw study::StudyInputError("--activation", fmt::format("unknown activation '{}' (relu, gelu)", a.activation));
  if (a.optimizer == "adam") o.optimizer = study::Optimizer::adam;
  else if (a.optimizer == "sgd") o.optimizer = study::Optimizer::sgd;
  else throw study::StudyInputError("--optimizer", fmt::format("unknown optimizer '{}' (adam, sgd)", a.optimizer));
  const auto m = study::parse_model(a.model);
  if (!m) throw study::StudyInputError("--model", fmt::format("unknown model '{}' (attention+ffn, ffn)", a.model));
  o.model = *m;
  o.sweep_lrs.clear();
  for (const auto& s : a.sweep_lr) {
    if (s == "none") continue;
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || s.empty()) throw study::StudyInputError("--sweep-lr", fmt::format("'{}' is not a rate (or none)", s));
    o.sweep_lrs.push_back(v);
  }
  o.deepnorm_alpha = a.alpha;
  o.deepnorm_beta = a.beta;
  study::validate(o);
}

int run_study(StudyArgs& a, const std::vector<std::string>& argv_all) {
  const char* me = "normcheck study placement";
  try {
    parse(a);
  } catch (const study::StudyInputError& e) {
    fmt::print(stderr, "{}: {}\n", me, e.what());
    return kExitBadInput;
  }
  const std::string html_path = a.html_dir.empty() ? "" : (fs::path(a.html_dir) / "index.html").string();
  for (const auto& p : {a.json, html_path, a.markdown})
    if (!p.empty() && !a.force && fs::exists(p)) {
      fmt::print(stderr, "{}: {} exists; pass --force to replace it\n", me, p);
      return kExitBadInput;
    }
  reports::PlotLibrary lib;
  if (!html_path.empty()) {
    try {
      lib = reports::load_plot_library();
    } catch (const reports::ReportError& e) {
      fmt::print(stderr, "{}: {}\n", me, e.what());
      return kExitBadInput;
    }
  }
  const study::StudyResult r = study::run_placement_study(a.o);
  const auto checks = study::paper_checks(r);
  std::string command = "normcheck";
  for (const auto& s : argv_all) command += " " + quote(s);
  const std::string json = study::to_json(r, checks, command, fmt::format("normcheck {}", kVersion)).dump(1) + "\n";
  for (const auto& c : checks) fmt::print("{:<15} {}: {}\n", c.status, c.id, c.measured);
  fmt::print("{} stacks in {:.1f} s\n", r.runs.size(), r.seconds);
  // Every document is made before anything is written.
  std::vector<std::pair<std::string, std::string>> docs;
  if (!a.json.empty()) docs.emplace_back(a.json, json);
  try {
    const std::string source = a.json.empty() ? "(the study's results)" : a.json;
    if (!html_path.empty()) docs.emplace_back(html_path, reports::study_placement_html(json, source, lib.js, lib.license));
    if (!a.markdown.empty()) docs.emplace_back(a.markdown, reports::study_placement_markdown(json, source));
    for (const auto& [path, text] : docs) {
      const fs::path parent = fs::path(path).parent_path();
      std::error_code ec;
      if (!parent.empty()) fs::create_directories(parent, ec);
      if (ec) throw reports::ReportError(fmt::format("{}: cannot create the directory: {}", parent.string(), ec.message()));
    }
    for (const auto& [path, text] : docs) {
      reports::write_file_atomic(path, text, a.force);
      fmt::print("study: {}\n", path);
    }
  } catch (const reports::ReportError& e) {
    fmt::print(stderr, "{}: {}\n", me, e.what());
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace

Runner add_study_command(CLI::App& app, std::vector<std::string>& argv_all) {
  auto a = std::make_shared<StudyArgs>();
  auto* study = app.add_subcommand("study", "Studies of normalization placements, computed by the suite's own kernels");
  study->require_subcommand(1);
  auto* cmd = study->add_subcommand(
      "placement", "Post-LN, Pre-LN, Sandwich and DeepNorm stacks of attention + FFN blocks: per-layer gradient and "
                   "activation norms, the model update, low-precision overflow counts and the usable learning rates, checked against Xiong et al. 2020 and Wang et al. 2022 "
                   "(conformance/study/README.md)");
  auto& o = a->o;
  a->cmd = cmd;
  cmd->add_option("--placement", a->placements, "Placements, comma-separated (post,pre,sandwich,deepnorm)")->delimiter(',');
  cmd->add_option("--norm", a->norms, "Norms, comma-separated (layernorm,rmsnorm)")->delimiter(',');
  cmd->add_option("--layers", o.depths, "Depths L, comma-separated (6,12,24,48; 1 to 64)")->delimiter(',');
  cmd->add_option("--model", a->model, "Each block: attention+ffn (default: self-attention then the FFN, as the papers) or ffn");
  cmd->add_option("--heads", o.heads, "Attention heads (4; must divide --d-model)");
  cmd->add_option("--d-model", o.d_model, "Width d (32)");
  cmd->add_option("--d-ff", o.d_ff, "FFN width (128)");
  cmd->add_option("--tokens", o.tokens, "Tokens in the batch (16)");
  cmd->add_option("--activation", a->activation, "FFN activation: relu (default) or gelu");
  cmd->add_option("--eps", o.epsilon, "Norm epsilon (1e-5)");
  cmd->add_option("--deepnorm-alpha", a->alpha, "DeepNorm's residual weight (default (2N)^(1/4), N = L)");
  cmd->add_option("--deepnorm-beta", a->beta, "DeepNorm's FFN init gain (default (8N)^(-1/4), N = L)");
  cmd->add_option("--optimizer", a->optimizer, "adam (default) or sgd");
  cmd->add_option("--lr", o.lr, "Learning rate (1e-4)");
  cmd->add_option("--steps", o.steps, "Optimizer steps after initialization (1; --full: 4)");
  cmd->add_option("--lowp", a->lowp, "Compute dtypes of the overflow counts, comma-separated, or none (none; --full: float16,bfloat16)")
      ->delimiter(',');
  cmd->add_option("--loss-scale", o.loss_scale, "Loss scale of the low-precision backward (65536, GradScaler's initial scale)");
  cmd->add_option("--lowp-every", o.lowp_every, "Count at every k-th step and the last too (0: at initialization only)");
  cmd->add_option("--sweep-lr", a->sweep_lr,
                  "Learning rates of the usable-rate sweep, comma-separated, or none (1e-4,1e-3,1e-2,1e-1,1)")->delimiter(',');
  cmd->add_option("--sweep-steps", o.sweep_steps, "Optimizer steps per rate of the sweep (1; --full: 4)");
  cmd->add_option("--seed", o.seed, "Seed of the weights and the data");
  cmd->add_flag("--full", a->full,
                "The full study where not given otherwise: --seeds 16 --steps 4 --sweep-lr 1e-4,1e-3,1e-2,1e-1,1 "
                "--sweep-steps 4 --lowp float16,bfloat16 (about 40 s of CPU)");
  cmd->add_option("--seeds", o.seeds,
                  "Initializations of the paper checks, seed .. seed + N - 1 (the others float64, initialization and the "
                  "first step only; 4, --full: 16; 1 to 64)");
  cmd->add_option("--threads", o.threads, "Threads (0: all cores)");
  cmd->add_option("--json", a->json, "Write the results file (normcheck-study-placement v4) here");
  cmd->add_option("--html", a->html_dir, "Write the page, DIR/index.html");
  cmd->add_option("--markdown", a->markdown, "Write the Markdown summary here");
  cmd->add_flag("--force", a->force, "Replace existing output files");
  return [a, &argv_all] { return run_study(*a, argv_all); };
}

}  // namespace normcheck::cli
