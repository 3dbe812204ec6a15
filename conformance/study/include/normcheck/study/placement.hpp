// The placement study (`normcheck study placement`, README.md in this folder): stacks of L
// residual blocks in each placement (post, pre, sandwich, deepnorm), run by the suite's own CPU
// block kernel (forward and backward, float64 for the norms, float16/bfloat16 for the overflow
// counts), at initialization and over a few deterministic optimizer steps on a synthetic
// regression target; per layer the FFN weight-gradient norms, the activation norms, the model
// update ||ΔF|| and the inf/NaN/subnormal counts; and the checks of the shapes Xiong et al. 2020
// and Wang et al. 2022 predict, as statistics over several initializations (--seeds).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "normcheck/reference/case.hpp"

namespace normcheck::study {

enum class Placement : std::uint8_t { post, pre, sandwich, deepnorm };
enum class Optimizer : std::uint8_t { sgd, adam };
// What one block holds: self-attention then the FFN, each a sublayer with its norm(s) in the
// placement, as the papers' Transformer layers; or the FFN sublayer alone.
enum class Model : std::uint8_t { attention_ffn, ffn };

std::string_view name_of(Placement p);
std::string_view name_of(Optimizer o);
std::string_view name_of(Model m);
std::optional<Model> parse_model(std::string_view s);
std::optional<Placement> parse_placement(std::string_view s);
ref::Block block_of(Placement p);

// Bad options: `argument()` is the command-line flag at fault ("--layers", "--d-model" ...).
class StudyInputError : public std::runtime_error {
 public:
  StudyInputError(std::string argument, const std::string& message);
  const std::string& argument() const { return argument_; }

 private:
  std::string argument_;
};

// Ranges accepted (validate()); the memory check comes on top of them.
inline constexpr std::int64_t kMinDModel = 2, kMaxDModel = 8192;
inline constexpr std::int64_t kMaxDff = 65536, kMaxTokens = 4096, kMaxSteps = 1000;
inline constexpr std::int64_t kMaxLayers = ref::kMaxLayers;  // 64
inline constexpr std::int64_t kMaxSweepPoints = 64;
inline constexpr std::int64_t kMaxSeeds = 64;

struct PlacementOptions {
  std::vector<Placement> placements{Placement::post, Placement::pre, Placement::sandwich, Placement::deepnorm};
  std::vector<ref::Op> norms{ref::Op::layernorm, ref::Op::rmsnorm};
  std::vector<std::int64_t> depths{6, 12, 24, 48};
  Model model = Model::attention_ffn;
  std::int64_t heads = 4;  // attention heads; d_model must be a multiple
  std::int64_t d_model = 32, d_ff = 128, tokens = 16;
  ref::Activation activation = ref::Activation::relu;  // Xiong et al.'s analysis is of a ReLU FFN
  double epsilon = 1e-5;
  // DeepNorm's constants; unset: DeepNet's alpha = (2N)^(1/4), beta = (8N)^(-1/4), N = L.
  std::optional<double> deepnorm_alpha, deepnorm_beta;
  Optimizer optimizer = Optimizer::adam;
  double lr = 1e-4;
  std::int64_t steps = 1;  // the checks use initialization and the first step; --full: 4
  // Compute dtypes of the overflow counts (float16, bfloat16), the loss scale of their backward,
  // and at which steps they are counted (every `lowp_every`-th and the last; 0: at init only).
  // None by default (4.5 s of CPU per dtype at the default sizes); --full: float16, bfloat16.
  std::vector<ref::DType> lowp{};
  double loss_scale = 65536.0;
  std::int64_t lowp_every = 0;
  // The learning-rate sweep: each rate trains every stack for sweep_steps steps of the optimizer
  // (README.md "Usable learning rates"); empty: no sweep.
  std::vector<double> sweep_lrs{1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::int64_t sweep_steps = 1;  // --full: 4
  std::uint64_t seed = 20260;
  // Initializations of the paper checks: seed, seed + 1, ..., seed + seeds - 1. The first is the
  // full study (runs[]); each other one is a float64 run of every stack at initialization and
  // after the first step, what the checks use (README.md "Checked against the papers").
  std::int64_t seeds = 4;  // --full: 16
  int threads = 0;                     // 0: std::thread::hardware_concurrency()
  std::int64_t memory_limit_bytes = 0;  // 0: half the machine's physical memory
};

// Throws StudyInputError naming the argument: empty lists, a depth, width, token count, step
// count, rate or constant out of range, or arrays that would not fit in the memory limit.
void validate(const PlacementOptions& o);
// Bytes the study holds at once (threads × the largest stack's parameters, optimizer state,
// gradients and activations), as a double so that it cannot overflow.
double memory_estimate(const PlacementOptions& o);
double deepnorm_alpha(const PlacementOptions& o, std::int64_t layers);
double deepnorm_beta(const PlacementOptions& o, std::int64_t layers);

// ---- one stack --------------------------------------------------------------------------

// One layer's parameters (binary64): FFN W1 [F, D], b1 [F], W2 [D, F], b2 [D], the FFN
// sublayer's norms' weight and bias [K, D] (K = 2 for sandwich); with attention, the projections
// Wq, Wk, Wv, Wo [D, D] (out x in, y = W v + b), their biases [D] and the attention sublayer's
// norms' weight and bias [K, D] (all empty for the FFN-only model).
struct LayerParams {
  std::vector<double> w1, b1, w2, b2, weight, bias;
  std::vector<double> wq, bq, wk, bk, wv, bv, wo, bo, attn_weight, attn_bias;
};

// A stack: the placement, the norm, L layers, and the final norm of pre and sandwich (Xiong et
// al.'s Pre-LN ends with one; post and deepnorm end normalized already).
struct Stack {
  Placement placement = Placement::post;
  ref::Op norm = ref::Op::layernorm;
  ref::Activation activation = ref::Activation::relu;
  double epsilon = 1e-5, alpha = 1.0, beta = 1.0;
  std::int64_t d = 0, f = 0;
  bool attention = false;
  std::int64_t heads = 1;
  std::vector<LayerParams> layers;
  bool final_norm = false;
  std::vector<double> final_weight, final_bias;  // [D]
};

// Xavier-normal weights (std = gain sqrt(2 / (fan_in + fan_out)); gain beta for deepnorm's FFN,
// value and output projections (DeepNet), 1 otherwise), zero biases, norm weights 1 and biases
// 0. The FFN weights of layer l depend on (seed, L, l, D, F) only and the attention weights on
// (seed, L, l, D), so that every placement, norm and model of a depth starts from the same draw.
Stack make_stack(const PlacementOptions& o, Placement p, ref::Op norm, std::int64_t layers);

// The synthetic data: tokens × D inputs x ~ N(0, 1), and the regression target t = x A with
// A ~ N(0, 1/D) (D × D), a random linear teacher; from the seed alone.
struct Data {
  std::int64_t tokens = 0, d = 0;
  std::vector<double> x, target;  // [tokens, D]
};
Data make_data(const PlacementOptions& o);

// A forward and backward pass of the loss (1 / (2 tokens)) ||y - t||_F^2 through the stack in
// one dtype (x, parameters, output and compute all `dtype`; parameters and inputs rounded to
// it), one block-kernel call per layer and direction. The backward's dy is multiplied by
// `loss_scale`. Gradients of the parameters are the kernel's (scaled by loss_scale).
struct AttnCache;  // a layer's attention forward state, for its backward (placement.cpp)
struct Pass {
  std::vector<std::vector<double>> acts;  // acts[l]: the input of layer l [tokens, D]; acts[L] the stack's output
  // mids[l]: the input of layer l's FFN sublayer (the attention sublayer's output; acts[l]
  // without attention). attn_h[l]: for post and deepnorm with attention, the attention
  // sublayer's pre-norm sum alpha x + A(x) as the norm kernel returns it (residual_out).
  std::vector<std::vector<double>> mids, attn_h;
  std::vector<std::shared_ptr<const AttnCache>> attn;
  std::vector<double> y;                  // the model output (after the final norm, if any)
  double loss = 0;
  std::vector<std::vector<double>> dacts;  // dacts[l]: gradient at acts[l] (the kernels' dx, dy of layer l-1)
  std::vector<LayerParams> grads;          // per layer, same shapes as LayerParams
  std::vector<double> final_dweight, final_dbias;
  // Per layer: non-finite and subnormal values among what the layer hands on (forward: its
  // output; backward: its dx and every parameter gradient). Index L: the final norm.
  std::vector<std::int64_t> fwd_inf, fwd_nan, fwd_sub, bwd_inf, bwd_nan, bwd_sub;
};
Pass run_pass(const Stack& s, const Data& data, ref::DType dtype, double loss_scale = 1.0, bool backward = true);

// The block case of layers [first, first + count) of s over x, as the kernel and the reference
// take it (dtypes all `dtype`; dy given for backward). Used by run_pass and by the tests.
ref::Case block_case(const Stack& s, std::int64_t first, std::int64_t count, const std::vector<double>& x,
                     std::int64_t tokens, ref::DType dtype, const std::vector<double>* dy);

// ---- the study --------------------------------------------------------------------------

struct LowpCounts {
  ref::DType dtype = ref::DType::float16;
  std::vector<std::int64_t> fwd_inf, fwd_nan, fwd_sub, bwd_inf, bwd_nan, bwd_sub;  // per layer, then the final norm
  bool loss_finite = true;
};

struct StepStats {
  std::int64_t step = 0;
  double loss = 0;
  double model_update = 0;  // ||y(θ_t) - y(θ_0)||, 0 at step 0
  // Per layer: Frobenius norms of dL/dW1 and dL/dW2; activation norms of the block's input and
  // output and of what the block adds to its input, ||x_{l+1} - x_l||. Activation norms are the
  // root mean square over tokens of each token's L2 norm (||X||_F / sqrt(tokens)).
  std::vector<double> grad_w1, grad_w2, act_in, act_out, block_update;
  // With attention: ||dL/dW|| of the four projections per layer (empty without).
  std::vector<double> grad_wq, grad_wk, grad_wv, grad_wo;
  // Post and deepnorm: the norm of each sublayer's pre-norm sum alpha x + F(x), recomputed in
  // float64 (empty for pre and sandwich, whose sums are the stream itself; prenorm_attn empty
  // without attention).
  std::vector<double> prenorm_attn, prenorm_ffn;
  std::vector<LowpCounts> lowp;  // empty at steps without counts
};

struct StackRun {
  Placement placement = Placement::post;
  ref::Op norm = ref::Op::layernorm;
  std::int64_t layers = 0;
  double alpha = 1.0, beta = 1.0;
  bool final_norm = false;
  std::vector<StepStats> steps;  // 0 (init) .. options.steps
  // Post and deepnorm: the largest difference, over steps, layers and sublayers, between the
  // kernel's normalized output and the float64 recomputation Norm(alpha x + F(x)), relative to
  // the largest output; and for the attention sublayer the kernel's residual_out against the
  // recomputed sum. -1 where not measured.
  double prenorm_recheck = -1;
};

// One stack trained at each rate of the sweep: the loss after each step, and whether the rate
// is usable (README.md "Usable learning rates": every loss finite, every loss after the first
// step below the initial loss).
struct SweepRun {
  Placement placement = Placement::post;
  ref::Op norm = ref::Op::layernorm;
  std::int64_t layers = 0;
  std::vector<std::vector<double>> losses;  // per rate: steps 0 .. sweep_steps
  std::vector<bool> usable;                 // per rate
  std::optional<double> largest_usable;     // none when no rate is usable
  std::optional<double> smallest_unusable;  // none when every rate is usable
};
bool usable_losses(const std::vector<double>& losses);

// One stack at every seed of the checks: per seed, ||dL/dW1|| and ||dL/dW2|| and the activation
// norms entering and leaving each block (act_in, act_out: StepStats's) per layer at
// initialization, and ||ΔF|| after the first step (NaN with --steps 0). Seed 0 is runs[]'s.
struct SeedRun {
  Placement placement = Placement::post;
  ref::Op norm = ref::Op::layernorm;
  std::int64_t layers = 0;
  std::vector<std::uint64_t> seeds;
  std::vector<std::vector<double>> grad_w1, grad_w2;  // [seed][layer]
  std::vector<std::vector<double>> act_in, act_out;   // [seed][layer]
  std::vector<double> model_update;                   // [seed]
};

// The statistics of the checks over seeds. The trend of a per-layer profile g[l] of one seed is
// the least-squares slope b of ln g[l] against the layer's position l / (L - 1) (0 at the first
// layer, 1 at the last), so that exp(b) is the fitted last-over-first ratio over ALL layers; over
// seeds, the mean of b (which is the slope of the geometric mean's profile) and its standard
// error sd(b) / sqrt(N) (0 with one seed).
struct Trend {
  double slope = 0, se = 0;
  std::vector<double> per_seed;
};
Trend layer_trend(const std::vector<std::vector<double>>& per_seed_profiles);
// Per layer, the geometric mean over seeds.
std::vector<double> geometric_mean_profile(const std::vector<std::vector<double>>& per_seed_profiles);
double geometric_mean(const std::vector<double>& v);

struct StudyResult {
  PlacementOptions options;
  std::vector<StackRun> runs;  // placements × norms × depths, in that order
  std::vector<SweepRun> sweep;  // the same order; empty without a sweep
  std::vector<SeedRun> seed_runs;  // the same order, every seed (the first is runs[]'s)
  double seconds = 0;
};

StudyResult run_placement_study(const PlacementOptions& o);

// The shapes the papers predict, measured on a result (README.md "Checked against the papers").
struct PaperCheck {
  std::string id, source, claim;
  std::string status;  // "reproduced", "not reproduced", "not evaluated"
  std::string measured;  // the numbers, in words
  nlohmann::ordered_json values;
};
std::vector<PaperCheck> paper_checks(const StudyResult& r);

// The results file, format `normcheck-study-placement` version 4 (README.md "Results file").
inline constexpr const char* kResultsFormat = "normcheck-study-placement";
inline constexpr int kResultsVersion = 4;
nlohmann::ordered_json to_json(const StudyResult& r, const std::vector<PaperCheck>& checks,
                               const std::string& command, const std::string& generator);

}  // namespace normcheck::study
