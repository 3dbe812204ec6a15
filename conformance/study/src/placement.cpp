// The placement study: stacks, data, one pass through the suite's CPU block kernel, the
// optimizer steps and the per-layer measurements (README.md in this folder).
#include "normcheck/study/placement.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <numbers>
#include <thread>

#include "kernels.hpp"

namespace normcheck::study {

using ref::DType;

StudyInputError::StudyInputError(std::string argument, const std::string& message)
    : std::runtime_error(argument + ": " + message), argument_(std::move(argument)) {}

std::string_view name_of(Placement p) {
  switch (p) {
    case Placement::post: return "post";
    case Placement::pre: return "pre";
    case Placement::sandwich: return "sandwich";
    case Placement::deepnorm: return "deepnorm";
  }
  return "?";
}
std::string_view name_of(Optimizer o) { return o == Optimizer::adam ? "adam" : "sgd"; }

std::optional<Placement> parse_placement(std::string_view s) {
  for (auto p : {Placement::post, Placement::pre, Placement::sandwich, Placement::deepnorm})
    if (s == name_of(p)) return p;
  return std::nullopt;
}

ref::Block block_of(Placement p) {
  switch (p) {
    case Placement::post: return ref::Block::post;
    case Placement::pre: return ref::Block::pre;
    case Placement::sandwich: return ref::Block::sandwich;
    case Placement::deepnorm: return ref::Block::deepnorm;
  }
  return ref::Block::none;
}

namespace {

std::int64_t norms_per_layer(Placement p) { return p == Placement::sandwich ? 2 : 1; }
ref::Affine affine_of(ref::Op op) { return op == ref::Op::layernorm ? ref::Affine::weight_bias : ref::Affine::weight; }
bool has_final_norm(Placement p) { return p == Placement::pre || p == Placement::sandwich; }

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 8.0 * (1 << 30);
}

int thread_count(const PlacementOptions& o, std::size_t jobs) {
  int n = o.threads > 0 ? o.threads : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(n), std::max<std::size_t>(jobs, 1)));
}

// splitmix64 (Steele, Lea, Flood 2014): a fixed generator, so that a seed gives the same
// numbers on every platform (std::normal_distribution is not specified bit for bit).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }  // in (0, 1)
  // Box-Muller, both values used in turn.
  double normal() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform())), a = 2.0 * std::numbers::pi * uniform();
    spare_ = r * std::sin(a);
    have_ = true;
    return r * std::cos(a);
  }

 private:
  std::uint64_t s_;
  double spare_ = 0;
  bool have_ = false;
};

std::uint64_t mix(std::uint64_t seed, std::initializer_list<std::int64_t> parts) {
  Rng r(seed);
  std::uint64_t h = r.next();
  for (auto p : parts) h = Rng(h ^ static_cast<std::uint64_t>(p)).next();
  return h;
}

void fill_normal(std::vector<double>& v, std::size_t n, double sd, Rng& r) {
  v.resize(n);
  for (auto& e : v) e = sd * r.normal();
}

std::vector<double> rounded(const std::vector<double>& v, DType t) {
  if (t == DType::float64) return v;
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = ref::round_to(v[i], t);
  return out;
}

ref::Tensor tensor(DType t, std::vector<std::int64_t> shape, std::vector<double> data) {
  return ref::Tensor{t, std::move(shape), std::move(data)};
}

// inf / NaN / subnormal counts of the values in v (subnormal: non-zero, below the smallest
// normal of t, where a flush-to-zero unit gives 0).
struct Counts {
  std::int64_t inf = 0, nan = 0, sub = 0;
  void add(const std::vector<double>& v, DType t) {
    const double min_normal = std::ldexp(1.0, ref::format_of(t).min_exp);
    for (double e : v) {
      if (std::isnan(e)) ++nan;
      else if (std::isinf(e)) ++inf;
      else if (e != 0 && std::fabs(e) < min_normal) ++sub;
    }
  }
};

ref::Case norm_case(const Stack& s, const std::vector<double>& x, std::int64_t tokens, DType dt,
                    const std::vector<double>* dy) {
  ref::Case c;
  c.op = s.norm;
  c.axis = -1;
  c.epsilon = s.epsilon;
  c.affine = affine_of(s.norm);
  c.direction = dy ? ref::Direction::backward : ref::Direction::forward;
  c.contract = "exact";
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = dt;
  c.inputs["x"] = tensor(dt, {tokens, s.d}, x);
  c.inputs["weight"] = tensor(dt, {s.d}, rounded(s.final_weight, dt));
  if (c.affine == ref::Affine::weight_bias) c.inputs["bias"] = tensor(dt, {s.d}, rounded(s.final_bias, dt));
  if (dy) c.inputs["dy"] = tensor(dt, {tokens, s.d}, *dy);
  return c;
}

std::vector<double>& take(conf::Outputs& out, const char* name) {
  auto it = out.find(name);
  if (it == out.end()) throw std::logic_error(fmt::format("the block kernel gave no {}", name));
  return it->second.data;
}

double rms_token_norm(const std::vector<double>& v, std::int64_t tokens) {
  long double s = 0;
  for (double e : v) s += static_cast<long double>(e) * e;
  return static_cast<double>(std::sqrt(s / static_cast<long double>(tokens)));
}
double frobenius(const std::vector<double>& v) { return rms_token_norm(v, 1); }

}  // namespace

double deepnorm_alpha(const PlacementOptions& o, std::int64_t layers) {
  return o.deepnorm_alpha ? *o.deepnorm_alpha : std::pow(2.0 * static_cast<double>(layers), 0.25);
}
double deepnorm_beta(const PlacementOptions& o, std::int64_t layers) {
  return o.deepnorm_beta ? *o.deepnorm_beta : std::pow(8.0 * static_cast<double>(layers), -0.25);
}

double memory_estimate(const PlacementOptions& o) {
  double lmax = 0, jobs = static_cast<double>(o.placements.size() * o.norms.size() * o.depths.size());
  for (auto l : o.depths) lmax = std::max(lmax, static_cast<double>(l));
  const double d = static_cast<double>(o.d_model), f = static_cast<double>(o.d_ff), n = static_cast<double>(o.tokens);
  const double params = lmax * (2 * d * f + f + d + 4 * d) + 2 * d;
  // parameters, gradients, two optimizer moments, the kernel's copy of one layer; activations
  // and their gradients, the initial output, the kernel's per-token FFN state.
  const double per_stack = 8.0 * (4 * params + 2 * d * f + 2 * (lmax + 1) * n * d + n * d + 4 * f);
  return per_stack * std::min<double>(jobs, thread_count(o, static_cast<std::size_t>(jobs)));
}

void validate(const PlacementOptions& o) {
  if (o.placements.empty()) throw StudyInputError("--placement", "no placement given");
  if (o.norms.empty()) throw StudyInputError("--norm", "no norm given");
  if (o.depths.empty()) throw StudyInputError("--layers", "no depth given");
  for (auto l : o.depths)
    if (l < 1 || l > kMaxLayers)
      throw StudyInputError("--layers", fmt::format("{} is out of range: a depth is 1 to {}", l, kMaxLayers));
  if (o.d_model < kMinDModel || o.d_model > kMaxDModel)
    throw StudyInputError("--d-model", fmt::format("{} is out of range: {} to {}", o.d_model, kMinDModel, kMaxDModel));
  if (o.d_ff < 1 || o.d_ff > kMaxDff)
    throw StudyInputError("--d-ff", fmt::format("{} is out of range: 1 to {}", o.d_ff, kMaxDff));
  if (o.tokens < 1 || o.tokens > kMaxTokens)
    throw StudyInputError("--tokens", fmt::format("{} is out of range: 1 to {}", o.tokens, kMaxTokens));
  if (o.steps < 0 || o.steps > kMaxSteps)
    throw StudyInputError("--steps", fmt::format("{} is out of range: 0 to {}", o.steps, kMaxSteps));
  if (!finite_positive(o.lr)) throw StudyInputError("--lr", "must be a positive finite number");
  if (!finite_positive(o.epsilon)) throw StudyInputError("--eps", "must be a positive finite number");
  if (o.deepnorm_alpha && !finite_positive(*o.deepnorm_alpha))
    throw StudyInputError("--deepnorm-alpha", "must be a positive finite number");
  if (o.deepnorm_beta && !finite_positive(*o.deepnorm_beta))
    throw StudyInputError("--deepnorm-beta", "must be a positive finite number");
  if (!finite_positive(o.loss_scale)) throw StudyInputError("--loss-scale", "must be a positive finite number");
  if (o.lowp_every < 0) throw StudyInputError("--lowp-every", "must be 0 (init only) or a positive step interval");
  for (auto t : o.lowp)
    if (t == DType::float64) throw StudyInputError("--lowp", "float64 is the study's own dtype; give float16, bfloat16 or float32");
  if (o.threads < 0) throw StudyInputError("--threads", "must be 0 (all cores) or positive");
  const double need = memory_estimate(o);
  const double limit = o.memory_limit_bytes > 0 ? static_cast<double>(o.memory_limit_bytes) : physical_memory() / 2;
  if (need > limit) {
    const double d = static_cast<double>(o.d_model), f = static_cast<double>(o.d_ff), n = static_cast<double>(o.tokens);
    const char* arg = n * d > 2 * d * f ? "--tokens" : (o.d_ff >= o.d_model ? "--d-ff" : "--d-model");
    throw StudyInputError(arg, fmt::format("the arrays of --d-model {} --d-ff {} --tokens {} at {} layers need {:.1f} GiB, "
                                           "more than the {:.1f} GiB allowed (half this machine's memory)",
                                           o.d_model, o.d_ff, o.tokens,
                                           *std::max_element(o.depths.begin(), o.depths.end()), need / (1 << 30),
                                           limit / (1 << 30)));
  }
}

Stack make_stack(const PlacementOptions& o, Placement p, ref::Op norm, std::int64_t layers) {
  Stack s;
  s.placement = p;
  s.norm = norm;
  s.activation = o.activation;
  s.epsilon = o.epsilon;
  s.d = o.d_model;
  s.f = o.d_ff;
  s.alpha = p == Placement::deepnorm ? deepnorm_alpha(o, layers) : 1.0;
  s.beta = p == Placement::deepnorm ? deepnorm_beta(o, layers) : 1.0;
  const auto D = static_cast<std::size_t>(s.d), F = static_cast<std::size_t>(s.f);
  const auto K = static_cast<std::size_t>(norms_per_layer(p));
  const double sd = s.beta * std::sqrt(2.0 / static_cast<double>(s.d + s.f));
  for (std::int64_t l = 0; l < layers; ++l) {
    Rng r(mix(o.seed, {1, layers, l, s.d, s.f}));
    LayerParams lp;
    fill_normal(lp.w1, F * D, sd, r);
    fill_normal(lp.w2, D * F, sd, r);
    lp.b1.assign(F, 0.0);
    lp.b2.assign(D, 0.0);
    lp.weight.assign(K * D, 1.0);
    if (affine_of(norm) == ref::Affine::weight_bias) lp.bias.assign(K * D, 0.0);
    s.layers.push_back(std::move(lp));
  }
  s.final_norm = has_final_norm(p);
  if (s.final_norm) {
    s.final_weight.assign(D, 1.0);
    if (affine_of(norm) == ref::Affine::weight_bias) s.final_bias.assign(D, 0.0);
  }
  return s;
}

Data make_data(const PlacementOptions& o) {
  Data d;
  d.tokens = o.tokens;
  d.d = o.d_model;
  const auto n = static_cast<std::size_t>(o.tokens), D = static_cast<std::size_t>(o.d_model);
  Rng r(mix(o.seed, {2, o.tokens, o.d_model}));
  fill_normal(d.x, n * D, 1.0, r);
  std::vector<double> a;
  fill_normal(a, D * D, 1.0 / std::sqrt(static_cast<double>(D)), r);
  d.target.assign(n * D, 0.0);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < D; ++j) {
      long double acc = 0;
      for (std::size_t i = 0; i < D; ++i) acc += static_cast<long double>(d.x[t * D + i]) * a[i * D + j];
      d.target[t * D + j] = static_cast<double>(acc);
    }
  return d;
}

ref::Case block_case(const Stack& s, std::int64_t first, std::int64_t count, const std::vector<double>& x,
                     std::int64_t tokens, DType dt, const std::vector<double>* dy) {
  ref::Case c;
  c.op = s.norm;
  c.axis = -1;
  c.epsilon = s.epsilon;
  c.affine = affine_of(s.norm);
  c.block = block_of(s.placement);
  c.alpha = s.alpha;
  c.layers = count;
  c.activation = s.activation;
  c.direction = dy ? ref::Direction::backward : ref::Direction::forward;
  c.contract = "exact";
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = dt;
  const std::int64_t D = s.d, F = s.f, K = norms_per_layer(s.placement);
  std::vector<double> w1, b1, w2, b2, weight, bias;
  for (std::int64_t l = first; l < first + count; ++l) {
    const LayerParams& p = s.layers[static_cast<std::size_t>(l)];
    auto app = [&](std::vector<double>& to, const std::vector<double>& from) { to.insert(to.end(), from.begin(), from.end()); };
    app(w1, p.w1), app(b1, p.b1), app(w2, p.w2), app(b2, p.b2), app(weight, p.weight), app(bias, p.bias);
  }
  c.inputs["x"] = tensor(dt, {tokens, D}, x);
  c.inputs["ffn_w1"] = tensor(dt, {count, F, D}, rounded(w1, dt));
  c.inputs["ffn_b1"] = tensor(dt, {count, F}, rounded(b1, dt));
  c.inputs["ffn_w2"] = tensor(dt, {count, D, F}, rounded(w2, dt));
  c.inputs["ffn_b2"] = tensor(dt, {count, D}, rounded(b2, dt));
  c.inputs["weight"] = tensor(dt, {count, K, D}, rounded(weight, dt));
  if (c.affine == ref::Affine::weight_bias) c.inputs["bias"] = tensor(dt, {count, K, D}, rounded(bias, dt));
  if (dy) c.inputs["dy"] = tensor(dt, {tokens, D}, *dy);
  return c;
}

// One kernel call per layer and direction. The kernel rounds each layer's output to dtype_x and
// passes its gradient unrounded inside a stack; with every dtype equal, a chain of one-layer
// calls computes the same values as one call over the whole stack (placement_test checks it
// bit for bit), and it shows what each layer hands on.
Pass run_pass(const Stack& s, const Data& data, DType dt, double loss_scale, bool backward) {
  using conf::cpu::Reduction;
  const auto L = static_cast<std::int64_t>(s.layers.size());
  const std::int64_t n = data.tokens;
  Pass p;
  const std::size_t slots = static_cast<std::size_t>(L + 1);
  for (auto* v : {&p.fwd_inf, &p.fwd_nan, &p.fwd_sub, &p.bwd_inf, &p.bwd_nan, &p.bwd_sub}) v->assign(slots, 0);
  auto note = [&](bool fwd, std::int64_t at, const std::vector<double>& v) {
    Counts c;
    c.add(v, dt);
    const auto i = static_cast<std::size_t>(at);
    (fwd ? p.fwd_inf : p.bwd_inf)[i] += c.inf;
    (fwd ? p.fwd_nan : p.bwd_nan)[i] += c.nan;
    (fwd ? p.fwd_sub : p.bwd_sub)[i] += c.sub;
  };
  p.acts.resize(slots);
  p.acts[0] = rounded(data.x, dt);
  for (std::int64_t l = 0; l < L; ++l) {
    auto out = conf::cpu::run_kernel(block_case(s, l, 1, p.acts[static_cast<std::size_t>(l)], n, dt, nullptr), Reduction::two_pass);
    p.acts[static_cast<std::size_t>(l + 1)] = std::move(take(out, "y"));
    note(true, l, p.acts[static_cast<std::size_t>(l + 1)]);
  }
  if (s.final_norm) {
    auto out = conf::cpu::run_kernel(norm_case(s, p.acts.back(), n, dt, nullptr), Reduction::two_pass);
    p.y = std::move(take(out, "y"));
    note(true, L, p.y);
  } else {
    p.y = p.acts.back();
  }
  long double loss = 0;
  std::vector<double> dy(p.y.size());
  for (std::size_t i = 0; i < p.y.size(); ++i) {
    const double e = p.y[i] - data.target[i];
    loss += static_cast<long double>(e) * e;
    dy[i] = ref::round_to(e / static_cast<double>(n) * loss_scale, dt);
  }
  p.loss = static_cast<double>(loss / (2.0L * static_cast<long double>(n)));
  if (!backward) return p;
  p.dacts.resize(slots);
  if (s.final_norm) {
    auto out = conf::cpu::run_kernel(norm_case(s, p.acts.back(), n, dt, &dy), Reduction::two_pass);
    p.dacts[static_cast<std::size_t>(L)] = std::move(take(out, "dx"));
    p.final_dweight = std::move(take(out, "dweight"));
    if (!s.final_bias.empty()) p.final_dbias = std::move(take(out, "dbias"));
    for (const auto* v : {&p.dacts[static_cast<std::size_t>(L)], &p.final_dweight, &p.final_dbias}) note(false, L, *v);
  } else {
    p.dacts[static_cast<std::size_t>(L)] = std::move(dy);
  }
  p.grads.resize(static_cast<std::size_t>(L));
  for (std::int64_t l = L - 1; l >= 0; --l) {
    const auto i = static_cast<std::size_t>(l);
    auto out = conf::cpu::run_kernel(block_case(s, l, 1, p.acts[i], n, dt, &p.dacts[i + 1]), Reduction::two_pass);
    p.dacts[i] = std::move(take(out, "dx"));
    LayerParams& g = p.grads[i];
    g.w1 = std::move(take(out, "dffn_w1"));
    g.b1 = std::move(take(out, "dffn_b1"));
    g.w2 = std::move(take(out, "dffn_w2"));
    g.b2 = std::move(take(out, "dffn_b2"));
    g.weight = std::move(take(out, "dweight"));
    if (!s.layers[i].bias.empty()) g.bias = std::move(take(out, "dbias"));
    for (const auto* v : {&p.dacts[i], &g.w1, &g.b1, &g.w2, &g.b2, &g.weight, &g.bias}) note(false, l, *v);
  }
  return p;
}

namespace {

// Every (parameter, gradient) pair of a stack.
std::vector<std::pair<std::vector<double>*, const std::vector<double>*>> pairs(Stack& s, const Pass& p) {
  std::vector<std::pair<std::vector<double>*, const std::vector<double>*>> out;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    LayerParams& w = s.layers[l];
    const LayerParams& g = p.grads[l];
    out.insert(out.end(), {{&w.w1, &g.w1}, {&w.b1, &g.b1}, {&w.w2, &g.w2}, {&w.b2, &g.b2}, {&w.weight, &g.weight}, {&w.bias, &g.bias}});
  }
  if (s.final_norm) out.insert(out.end(), {{&s.final_weight, &p.final_dweight}, {&s.final_bias, &p.final_dbias}});
  return out;
}

// SGD: θ -= lr g. Adam (Kingma & Ba 2015, β1 0.9, β2 0.999, ε 1e-8, bias-corrected).
class Optim {
 public:
  explicit Optim(const PlacementOptions& o) : o_(o) {}
  void step(Stack& s, const Pass& p) {
    auto ps = pairs(s, p);
    if (m_.empty()) {
      for (auto& [w, g] : ps) {
        m_.emplace_back(w->size(), 0.0);
        v_.emplace_back(w->size(), 0.0);
      }
    }
    ++t_;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double c1 = 1 - std::pow(b1, static_cast<double>(t_)), c2 = 1 - std::pow(b2, static_cast<double>(t_));
    for (std::size_t k = 0; k < ps.size(); ++k) {
      auto& w = *ps[k].first;
      const auto& g = *ps[k].second;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (o_.optimizer == Optimizer::sgd) {
          w[i] -= o_.lr * g[i];
          continue;
        }
        m_[k][i] = b1 * m_[k][i] + (1 - b1) * g[i];
        v_[k][i] = b2 * v_[k][i] + (1 - b2) * g[i] * g[i];
        w[i] -= o_.lr * (m_[k][i] / c1) / (std::sqrt(v_[k][i] / c2) + eps);
      }
    }
  }

 private:
  const PlacementOptions& o_;
  std::vector<std::vector<double>> m_, v_;
  std::int64_t t_ = 0;
};

bool lowp_at(const PlacementOptions& o, std::int64_t step) {
  if (step == 0) return true;
  return o.lowp_every > 0 && (step % o.lowp_every == 0 || step == o.steps);
}

StackRun run_stack(const PlacementOptions& o, const Data& data, Placement pl, ref::Op norm, std::int64_t layers) {
  Stack s = make_stack(o, pl, norm, layers);
  StackRun run;
  run.placement = pl;
  run.norm = norm;
  run.layers = layers;
  run.alpha = s.alpha;
  run.beta = s.beta;
  run.final_norm = s.final_norm;
  Optim opt(o);
  std::vector<double> y0;
  for (std::int64_t t = 0; t <= o.steps; ++t) {
    const Pass p = run_pass(s, data, DType::float64);
    if (t == 0) y0 = p.y;
    StepStats st;
    st.step = t;
    st.loss = p.loss;
    std::vector<double> diff(p.y.size());
    for (std::size_t i = 0; i < diff.size(); ++i) diff[i] = p.y[i] - y0[i];
    st.model_update = rms_token_norm(diff, data.tokens);
    for (std::int64_t l = 0; l < layers; ++l) {
      const auto i = static_cast<std::size_t>(l);
      st.grad_w1.push_back(frobenius(p.grads[i].w1));
      st.grad_w2.push_back(frobenius(p.grads[i].w2));
      st.act_in.push_back(rms_token_norm(p.acts[i], data.tokens));
      st.act_out.push_back(rms_token_norm(p.acts[i + 1], data.tokens));
      for (std::size_t k = 0; k < diff.size(); ++k) diff[k] = p.acts[i + 1][k] - p.acts[i][k];
      st.block_update.push_back(rms_token_norm(diff, data.tokens));
    }
    if (lowp_at(o, t))
      for (auto dt : o.lowp) {
        const Pass q = run_pass(s, data, dt, o.loss_scale);
        LowpCounts c{dt, q.fwd_inf, q.fwd_nan, q.fwd_sub, q.bwd_inf, q.bwd_nan, q.bwd_sub, std::isfinite(q.loss)};
        st.lowp.push_back(std::move(c));
      }
    run.steps.push_back(std::move(st));
    if (t < o.steps) opt.step(s, p);
  }
  return run;
}

}  // namespace

StudyResult run_placement_study(const PlacementOptions& o) {
  validate(o);
  const auto t0 = std::chrono::steady_clock::now();
  StudyResult r;
  r.options = o;
  const Data data = make_data(o);
  struct Job {
    Placement p;
    ref::Op norm;
    std::int64_t layers;
  };
  std::vector<Job> jobs;
  for (auto p : o.placements)
    for (auto n : o.norms)
      for (auto l : o.depths) jobs.push_back({p, n, l});
  r.runs.resize(jobs.size());
  // The deepest stacks first, so that the last job to start is a short one.
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return jobs[a].layers > jobs[b].layers; });
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&]() {
    for (std::size_t k; (k = next++) < order.size();) {
      const Job& j = jobs[order[k]];
      try {
        r.runs[order[k]] = run_stack(o, data, j.p, j.norm, j.layers);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = order.size();
      }
    }
  };
  std::vector<std::thread> pool;
  const int nt = thread_count(o, jobs.size());
  for (int i = 1; i < nt; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace normcheck::study
