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
#include <limits>
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
std::string_view name_of(Model m) { return m == Model::attention_ffn ? "attention+ffn" : "ffn"; }
std::optional<Model> parse_model(std::string_view s) {
  for (auto m : {Model::attention_ffn, Model::ffn})
    if (s == name_of(m)) return m;
  return std::nullopt;
}

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

// A plain-norm kernel case over [tokens, D] with the given parameters; with `residual`, the
// fused add h = alpha x + residual that the kernel normalizes (and returns as residual_out).
ref::Case norm_case(const Stack& s, const std::vector<double>& x, const double* weight, const double* bias,
                    std::int64_t tokens, DType dt, const std::vector<double>* dy,
                    const std::vector<double>* residual = nullptr, double alpha = 1.0) {
  ref::Case c;
  c.op = s.norm;
  c.axis = -1;
  c.epsilon = s.epsilon;
  c.affine = affine_of(s.norm);
  c.direction = dy ? ref::Direction::backward : ref::Direction::forward;
  c.contract = "exact";
  c.dtype_x = c.dtype_param = c.dtype_out = c.dtype_compute = c.dtype_residual = dt;
  c.alpha = alpha;
  const auto D = static_cast<std::size_t>(s.d);
  c.inputs["x"] = tensor(dt, {tokens, s.d}, x);
  c.inputs["weight"] = tensor(dt, {s.d}, rounded(std::vector<double>(weight, weight + D), dt));
  if (c.affine == ref::Affine::weight_bias) c.inputs["bias"] = tensor(dt, {s.d}, rounded(std::vector<double>(bias, bias + D), dt));
  if (residual) {
    c.residual = ref::Residual::add;
    c.inputs["residual"] = tensor(dt, {tokens, s.d}, *residual);
  }
  if (dy) c.inputs["dy"] = tensor(dt, {tokens, s.d}, *dy);
  return c;
}
ref::Case final_norm_case(const Stack& s, const std::vector<double>& x, std::int64_t tokens, DType dt,
                          const std::vector<double>* dy) {
  return norm_case(s, x, s.final_weight.data(), s.final_bias.empty() ? nullptr : s.final_bias.data(), tokens, dt, dy);
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

// The arithmetic of a pass outside the kernels (the attention sublayer, the residual adds of
// pre and sandwich): every operation's result rounded to the pass's dtype, as the kernels'
// emulation of a compute dtype does (float64: plain binary64 operations).
struct Arith {
  DType dt;
  bool exact;
  explicit Arith(DType t) : dt(t), exact(t == DType::float64) {}
  double r(double v) const { return exact ? v : ref::round_to(v, dt); }
  double add(double a, double b) const { return r(a + b); }
  double mul(double a, double b) const { return r(a * b); }
};

// y = a W^T + b: a [n, in], W [out, in], b [out]; each element a sequential sum over k from 0,
// then + b. The loops run k outside o so that the exact (float64) instance vectorizes over the
// outputs; each element's sum is in the same order either way. `r` rounds one result.
template <class R>
std::vector<double> linear_impl(R r, const std::vector<double>& a, std::size_t n, std::size_t in, const std::vector<double>& w,
                                const std::vector<double>& b, std::size_t out) {
  std::vector<double> wt(in * out), y(n * out, 0.0);
  for (std::size_t o = 0; o < out; ++o)
    for (std::size_t k = 0; k < in; ++k) wt[k * out + o] = w[o * in + k];
  for (std::size_t i = 0; i < n; ++i) {
    double* yr = &y[i * out];
    for (std::size_t k = 0; k < in; ++k) {
      const double aik = a[i * in + k];
      const double* wr = &wt[k * out];
      for (std::size_t o = 0; o < out; ++o) yr[o] = r(yr[o] + r(aik * wr[o]));
    }
    for (std::size_t o = 0; o < out; ++o) yr[o] = r(yr[o] + b[o]);
  }
  return y;
}

// The backward of linear: dW = dy^T a and db = sum_rows dy (sequential over the rows), and
// da += dy W (each element's sum over the outputs sequential, then added into da).
template <class R>
void linear_backward_impl(R r, const std::vector<double>& dy, const std::vector<double>& a, std::size_t n, std::size_t in,
                          const std::vector<double>& w, std::size_t out, std::vector<double>& dw, std::vector<double>& db,
                          std::vector<double>& da) {
  dw.assign(out * in, 0.0);
  db.assign(out, 0.0);
  std::vector<double> acc(in);
  for (std::size_t i = 0; i < n; ++i) {
    const double* ar = &a[i * in];
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::size_t o = 0; o < out; ++o) {
      const double g = dy[i * out + o];
      db[o] = r(db[o] + g);
      double* dwr = &dw[o * in];
      const double* wr = &w[o * in];
      for (std::size_t k = 0; k < in; ++k) {
        dwr[k] = r(dwr[k] + r(g * ar[k]));
        acc[k] = r(acc[k] + r(g * wr[k]));
      }
    }
    for (std::size_t k = 0; k < in; ++k) da[i * in + k] = r(da[i * in + k] + acc[k]);
  }
}

std::vector<double> linear(const Arith& A, const std::vector<double>& a, std::size_t n, std::size_t in,
                           const std::vector<double>& w, const std::vector<double>& b, std::size_t out) {
  if (A.exact) return linear_impl([](double v) { return v; }, a, n, in, w, b, out);
  return linear_impl([&A](double v) { return A.r(v); }, a, n, in, w, b, out);
}
void linear_backward(const Arith& A, const std::vector<double>& dy, const std::vector<double>& a, std::size_t n,
                     std::size_t in, const std::vector<double>& w, std::size_t out, std::vector<double>& dw,
                     std::vector<double>& db, std::vector<double>& da) {
  if (A.exact) return linear_backward_impl([](double v) { return v; }, dy, a, n, in, w, out, dw, db, da);
  linear_backward_impl([&A](double v) { return A.r(v); }, dy, a, n, in, w, out, dw, db, da);
}

}  // namespace

// A layer's attention forward state: its input u, the projections, the probabilities
// [H, n, n], the heads' output before Wo, the sublayer's output A(u), and the (rounded)
// weights used; for sandwich, the second norm's output m = Norm(A(u)).
struct AttnCache {
  std::vector<double> u, q, k, v, p, o, a, m;
  std::vector<double> wq, wk, wv, wo;
};

namespace {

// Multi-head self-attention over the tokens of one sequence (no mask; an encoder's, as in Xiong
// et al.'s and DeepNet's analyses): Q, K, V = u Wq^T + bq, ...; per head softmax(Q K^T / sqrt(dh)) V;
// A(u) = O Wo^T + bo.
std::shared_ptr<AttnCache> attn_forward(const Arith& A, const Stack& s, const LayerParams& P, std::vector<double> u,
                                        std::size_t n) {
  auto c = std::make_shared<AttnCache>();
  const auto D = static_cast<std::size_t>(s.d), H = static_cast<std::size_t>(s.heads), dh = D / H;
  c->wq = rounded(P.wq, A.dt), c->wk = rounded(P.wk, A.dt), c->wv = rounded(P.wv, A.dt), c->wo = rounded(P.wo, A.dt);
  c->u = std::move(u);
  c->q = linear(A, c->u, n, D, c->wq, rounded(P.bq, A.dt), D);
  c->k = linear(A, c->u, n, D, c->wk, rounded(P.bk, A.dt), D);
  c->v = linear(A, c->u, n, D, c->wv, rounded(P.bv, A.dt), D);
  c->p.assign(H * n * n, 0.0);
  c->o.assign(n * D, 0.0);
  const double scale = A.r(1.0 / std::sqrt(static_cast<double>(dh)));
  std::vector<double> e(n);
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t c0 = h * dh;
    for (std::size_t i = 0; i < n; ++i) {
      double* pr = &c->p[(h * n + i) * n];
      double mx = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < n; ++j) {
        double dot = 0;
        for (std::size_t x = 0; x < dh; ++x) dot = A.add(dot, A.mul(c->q[i * D + c0 + x], c->k[j * D + c0 + x]));
        pr[j] = A.mul(dot, scale);
        mx = std::max(mx, pr[j]);
      }
      double sum = 0;
      for (std::size_t j = 0; j < n; ++j) sum = A.add(sum, e[j] = A.r(std::exp(A.add(pr[j], -mx))));
      for (std::size_t j = 0; j < n; ++j) pr[j] = A.r(e[j] / sum);
      for (std::size_t x = 0; x < dh; ++x) {
        double acc = 0;
        for (std::size_t j = 0; j < n; ++j) acc = A.add(acc, A.mul(pr[j], c->v[j * D + c0 + x]));
        c->o[i * D + c0 + x] = acc;
      }
    }
  }
  c->a = linear(A, c->o, n, D, c->wo, rounded(P.bo, A.dt), D);
  return c;
}

// The attention sublayer's backward from dA: the projections' gradients into g, and du.
std::vector<double> attn_backward(const Arith& A, const Stack& s, const AttnCache& c, const std::vector<double>& da,
                                  std::size_t n, LayerParams& g) {
  const auto D = static_cast<std::size_t>(s.d), H = static_cast<std::size_t>(s.heads), dh = D / H;
  std::vector<double> d_o(n * D, 0.0), dq(n * D, 0.0), dk(n * D, 0.0), dv(n * D, 0.0), du(n * D, 0.0);
  linear_backward(A, da, c.o, n, D, c.wo, D, g.wo, g.bo, d_o);
  const double scale = A.r(1.0 / std::sqrt(static_cast<double>(dh)));
  std::vector<double> dp(n), ds(n * n);
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t c0 = h * dh;
    for (std::size_t i = 0; i < n; ++i) {
      const double* pr = &c.p[(h * n + i) * n];
      double row = 0;
      for (std::size_t j = 0; j < n; ++j) {
        double dot = 0;
        for (std::size_t x = 0; x < dh; ++x) dot = A.add(dot, A.mul(d_o[i * D + c0 + x], c.v[j * D + c0 + x]));
        dp[j] = dot;
        row = A.add(row, A.mul(pr[j], dot));
      }
      for (std::size_t j = 0; j < n; ++j) ds[i * n + j] = A.mul(A.mul(pr[j], A.add(dp[j], -row)), scale);
    }
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t x = 0; x < dh; ++x) {
        double acc_v = 0, acc_k = 0;
        for (std::size_t i = 0; i < n; ++i) {
          acc_v = A.add(acc_v, A.mul(c.p[(h * n + i) * n + j], d_o[i * D + c0 + x]));
          acc_k = A.add(acc_k, A.mul(ds[i * n + j], c.q[i * D + c0 + x]));
        }
        dv[j * D + c0 + x] = acc_v;
        dk[j * D + c0 + x] = acc_k;
      }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t x = 0; x < dh; ++x) {
        double acc = 0;
        for (std::size_t j = 0; j < n; ++j) acc = A.add(acc, A.mul(ds[i * n + j], c.k[j * D + c0 + x]));
        dq[i * D + c0 + x] = acc;
      }
  }
  linear_backward(A, dq, c.u, n, D, c.wq, D, g.wq, g.bq, du);
  linear_backward(A, dk, c.u, n, D, c.wk, D, g.wk, g.bk, du);
  linear_backward(A, dv, c.u, n, D, c.wv, D, g.wv, g.bv, du);
  return du;
}

std::vector<double> add_rounded(const Arith& A, const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> z(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) z[i] = A.add(x[i], y[i]);
  return z;
}

}  // namespace

double deepnorm_alpha(const PlacementOptions& o, std::int64_t layers) {
  return o.deepnorm_alpha ? *o.deepnorm_alpha : std::pow(2.0 * static_cast<double>(layers), 0.25);
}
double deepnorm_beta(const PlacementOptions& o, std::int64_t layers) {
  return o.deepnorm_beta ? *o.deepnorm_beta : std::pow(8.0 * static_cast<double>(layers), -0.25);
}

namespace {
// The terms of memory_estimate in bytes per stack: the FFN's (d x d_ff), the attention
// projections' (d x d), the per-token state (tokens x d), the attention probabilities (tokens^2).
struct MemoryTerms {
  double ffn = 0, proj = 0, tokens = 0, probs = 0;
};
MemoryTerms memory_terms(const PlacementOptions& o) {
  double lmax = 0;
  for (auto l : o.depths) lmax = std::max(lmax, static_cast<double>(l));
  const double d = static_cast<double>(o.d_model), f = static_cast<double>(o.d_ff), n = static_cast<double>(o.tokens);
  const double att = o.model == Model::attention_ffn ? 1.0 : 0.0;
  MemoryTerms m;
  // parameters, gradients, two optimizer moments (4 copies), the kernel's copy of one layer
  m.ffn = 8.0 * (4 * lmax * (2 * d * f + f) + 2 * d * f + 4 * f);
  m.proj = 8.0 * att * (4 * lmax * 4 * d * d + 4 * d * d);
  // norms' parameters and biases; activations, the FFN inputs, the attention sums and their
  // gradients, the initial output; the attention caches (input, Q, K, V, O, A, Norm(A))
  m.tokens = 8.0 * (4 * lmax * (6 * d + 4 * d * att) + 2 * d + (lmax + 1) * n * d * (3 + 2 * att) + n * d + att * lmax * 7 * n * d);
  m.probs = 8.0 * att * lmax * static_cast<double>(o.heads) * n * n;
  return m;
}
}  // namespace

double memory_estimate(const PlacementOptions& o) {
  const double jobs = static_cast<double>(o.placements.size() * o.norms.size() * o.depths.size() *
                                          (o.sweep_lrs.size() + static_cast<std::size_t>(std::max<std::int64_t>(1, o.seeds))));
  const MemoryTerms m = memory_terms(o);
  return (m.ffn + m.proj + m.tokens + m.probs) * std::min<double>(jobs, thread_count(o, static_cast<std::size_t>(jobs)));
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
  if (o.model == Model::attention_ffn && (o.heads < 1 || o.d_model % o.heads != 0))
    throw StudyInputError("--heads", fmt::format("{} does not divide --d-model {}: the heads split the width evenly", o.heads, o.d_model));
  if (static_cast<std::int64_t>(o.sweep_lrs.size()) > kMaxSweepPoints)
    throw StudyInputError("--sweep-lr", fmt::format("{} rates: at most {}", o.sweep_lrs.size(), kMaxSweepPoints));
  for (double lr : o.sweep_lrs)
    if (!finite_positive(lr)) throw StudyInputError("--sweep-lr", "every rate must be a positive finite number");
  if (o.sweep_steps < 1 || o.sweep_steps > kMaxSteps)
    throw StudyInputError("--sweep-steps", fmt::format("{} is out of range: 1 to {}", o.sweep_steps, kMaxSteps));
  if (o.seeds < 1 || o.seeds > kMaxSeeds)
    throw StudyInputError("--seeds", fmt::format("{} is out of range: 1 to {}", o.seeds, kMaxSeeds));
  const double need = memory_estimate(o);
  const double limit = o.memory_limit_bytes > 0 ? static_cast<double>(o.memory_limit_bytes) : physical_memory() / 2;
  if (need > limit) {
    // The flag of the largest term.
    const MemoryTerms m = memory_terms(o);
    const char* arg = m.tokens + m.probs > std::max(m.ffn, m.proj) ? "--tokens" : (m.ffn >= m.proj ? "--d-ff" : "--d-model");
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
  s.attention = o.model == Model::attention_ffn;
  s.heads = o.heads;
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
    if (s.attention) {
      // Xavier normal over D x D (std = gain sqrt(2 / 2D)); DeepNet's gain beta for the value and
      // output projections only, 1 for the query and key ones (Wang et al. 2022, Figure 2).
      Rng ra(mix(o.seed, {3, layers, l, s.d}));
      const double sd_qk = 1.0 / std::sqrt(static_cast<double>(s.d)), sd_vo = s.beta * sd_qk;
      fill_normal(lp.wq, D * D, sd_qk, ra);
      fill_normal(lp.wk, D * D, sd_qk, ra);
      fill_normal(lp.wv, D * D, sd_vo, ra);
      fill_normal(lp.wo, D * D, sd_vo, ra);
      for (auto* b : {&lp.bq, &lp.bk, &lp.bv, &lp.bo}) b->assign(D, 0.0);
      lp.attn_weight.assign(K * D, 1.0);
      if (affine_of(norm) == ref::Affine::weight_bias) lp.attn_bias.assign(K * D, 0.0);
    }
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

// One kernel call per sublayer and direction: the FFN sublayer is the block kernel's one-layer
// block, the attention sublayer's norm the plain norm kernel (with its fused residual add,
// h = alpha x + A(x), for post and deepnorm). The kernel rounds each layer's output to dtype_x
// and passes its gradient unrounded inside a stack; with every dtype equal, a chain of one-layer
// calls computes the same values as one call over the whole stack (placement_test checks it bit
// for bit for the FFN-only model), and it shows what each layer hands on.
Pass run_pass(const Stack& s, const Data& data, DType dt, double loss_scale, bool backward) {
  using conf::cpu::Reduction;
  const auto L = static_cast<std::int64_t>(s.layers.size());
  const std::int64_t n = data.tokens;
  const auto N = static_cast<std::size_t>(n), D = static_cast<std::size_t>(s.d);
  const Arith A(dt);
  const bool post_like = s.placement == Placement::post || s.placement == Placement::deepnorm;
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
  // The attention sublayer's norm k of layer l (k = 1: sandwich's second).
  auto attn_norm = [&](std::int64_t l, std::size_t k, const std::vector<double>& x, const std::vector<double>* dy,
                       const std::vector<double>* residual) {
    const LayerParams& P = s.layers[static_cast<std::size_t>(l)];
    return conf::cpu::run_kernel(norm_case(s, x, P.attn_weight.data() + k * D,
                                           P.attn_bias.empty() ? nullptr : P.attn_bias.data() + k * D, n, dt, dy,
                                           residual, residual ? s.alpha : 1.0),
                                 Reduction::two_pass);
  };
  p.acts.resize(slots);
  p.mids.resize(static_cast<std::size_t>(L));
  p.attn_h.resize(static_cast<std::size_t>(L));
  p.attn.resize(static_cast<std::size_t>(L));
  p.acts[0] = rounded(data.x, dt);
  for (std::int64_t l = 0; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    const std::vector<double>& x = p.acts[i];
    if (!s.attention) {
      p.mids[i] = x;
    } else if (post_like) {
      auto c = attn_forward(A, s, s.layers[i], x, N);
      auto out = attn_norm(l, 0, x, nullptr, &c->a);
      p.mids[i] = std::move(take(out, "y"));
      p.attn_h[i] = std::move(take(out, "residual_out"));
      p.attn[i] = std::move(c);
    } else {
      auto out = attn_norm(l, 0, x, nullptr, nullptr);
      auto c = attn_forward(A, s, s.layers[i], std::move(take(out, "y")), N);
      if (s.placement == Placement::sandwich) {
        auto o2 = attn_norm(l, 1, c->a, nullptr, nullptr);
        c->m = std::move(take(o2, "y"));
      }
      p.mids[i] = add_rounded(A, x, s.placement == Placement::sandwich ? c->m : c->a);
      p.attn[i] = std::move(c);
    }
    if (s.attention) note(true, l, p.mids[i]);
    auto out = conf::cpu::run_kernel(block_case(s, l, 1, p.mids[i], n, dt, nullptr), Reduction::two_pass);
    p.acts[i + 1] = std::move(take(out, "y"));
    note(true, l, p.acts[i + 1]);
  }
  if (s.final_norm) {
    auto out = conf::cpu::run_kernel(final_norm_case(s, p.acts.back(), n, dt, nullptr), Reduction::two_pass);
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
    auto out = conf::cpu::run_kernel(final_norm_case(s, p.acts.back(), n, dt, &dy), Reduction::two_pass);
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
    auto out = conf::cpu::run_kernel(block_case(s, l, 1, p.mids[i], n, dt, &p.dacts[i + 1]), Reduction::two_pass);
    std::vector<double> dz = std::move(take(out, "dx"));
    LayerParams& g = p.grads[i];
    g.w1 = std::move(take(out, "dffn_w1"));
    g.b1 = std::move(take(out, "dffn_b1"));
    g.w2 = std::move(take(out, "dffn_w2"));
    g.b2 = std::move(take(out, "dffn_b2"));
    g.weight = std::move(take(out, "dweight"));
    if (!s.layers[i].bias.empty()) g.bias = std::move(take(out, "dbias"));
    for (const auto* v : {&g.w1, &g.b1, &g.w2, &g.b2, &g.weight, &g.bias}) note(false, l, *v);
    if (!s.attention) {
      p.dacts[i] = std::move(dz);
      note(false, l, p.dacts[i]);
      continue;
    }
    note(false, l, dz);
    const AttnCache& c = *p.attn[i];
    const bool has_bias = !s.layers[i].attn_bias.empty();
    auto take_norm_grads = [&](conf::Outputs& o) {
      const auto& w = take(o, "dweight");
      g.attn_weight.insert(g.attn_weight.end(), w.begin(), w.end());
      if (has_bias) {
        const auto& b = take(o, "dbias");
        g.attn_bias.insert(g.attn_bias.end(), b.begin(), b.end());
      }
    };
    if (post_like) {
      auto nb = attn_norm(l, 0, p.acts[i], &dz, &c.a);
      take_norm_grads(nb);
      const std::vector<double> du = attn_backward(A, s, c, take(nb, "dresidual"), N, g);
      p.dacts[i] = add_rounded(A, take(nb, "dx"), du);
    } else if (s.placement == Placement::pre) {
      const std::vector<double> du = attn_backward(A, s, c, dz, N, g);
      auto nb = attn_norm(l, 0, p.acts[i], &du, nullptr);
      take_norm_grads(nb);
      p.dacts[i] = add_rounded(A, dz, take(nb, "dx"));
    } else {  // sandwich: z = x + Norm_1(A(Norm_0(x)))
      auto nb1 = attn_norm(l, 1, c.a, &dz, nullptr);
      const std::vector<double> du = attn_backward(A, s, c, take(nb1, "dx"), N, g);
      auto nb0 = attn_norm(l, 0, p.acts[i], &du, nullptr);
      take_norm_grads(nb0);
      take_norm_grads(nb1);
      p.dacts[i] = add_rounded(A, dz, take(nb0, "dx"));
    }
    for (const auto* v : {&p.dacts[i], &g.wq, &g.bq, &g.wk, &g.bk, &g.wv, &g.bv, &g.wo, &g.bo, &g.attn_weight, &g.attn_bias})
      note(false, l, *v);
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
    out.insert(out.end(), {{&w.wq, &g.wq}, {&w.bq, &g.bq}, {&w.wk, &g.wk}, {&w.bk, &g.bk}, {&w.wv, &g.wv}, {&w.bv, &g.bv},
                           {&w.wo, &g.wo}, {&w.bo, &g.bo}, {&w.attn_weight, &g.attn_weight}, {&w.attn_bias, &g.attn_bias}});
  }
  if (s.final_norm) out.insert(out.end(), {{&s.final_weight, &p.final_dweight}, {&s.final_bias, &p.final_dbias}});
  return out;
}

// SGD: θ -= lr g. Adam (Kingma & Ba 2015, β1 0.9, β2 0.999, ε 1e-8, bias-corrected).
class Optim {
 public:
  Optim(const PlacementOptions& o, double lr) : o_(o), lr_(lr) {}
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
          w[i] -= lr_ * g[i];
          continue;
        }
        m_[k][i] = b1 * m_[k][i] + (1 - b1) * g[i];
        v_[k][i] = b2 * v_[k][i] + (1 - b2) * g[i] * g[i];
        w[i] -= lr_ * (m_[k][i] / c1) / (std::sqrt(v_[k][i] / c2) + eps);
      }
    }
  }

 private:
  const PlacementOptions& o_;
  double lr_;
  std::vector<std::vector<double>> m_, v_;
  std::int64_t t_ = 0;
};

bool lowp_at(const PlacementOptions& o, std::int64_t step) {
  if (step == 0) return true;
  return o.lowp_every > 0 && (step % o.lowp_every == 0 || step == o.steps);
}

// ---- the pre-norm sums of post and deepnorm, recomputed in float64 -------------------------

// F(z) = W2 act(W1 z + b1) + b2, per token, in binary64 (sequential sums), independently of the kernel.
std::vector<double> ffn64(const Stack& s, const LayerParams& P, const std::vector<double>& z, std::size_t n) {
  const auto D = static_cast<std::size_t>(s.d), F = static_cast<std::size_t>(s.f);
  std::vector<double> hid = linear(Arith(DType::float64), z, n, D, P.w1, P.b1, F);
  for (double& v : hid)
    v = s.activation == ref::Activation::relu ? std::max(v, 0.0) : 0.5 * v * (1.0 + std::erf(v / std::numbers::sqrt2));
  return linear(Arith(DType::float64), hid, n, F, P.w2, P.b2, D);
}

// Norm(h) with the given weight (and bias), per token, in binary64.
std::vector<double> norm64(const Stack& s, const std::vector<double>& h, const double* w, const double* b, std::size_t n) {
  const auto D = static_cast<std::size_t>(s.d);
  std::vector<double> y(h.size());
  for (std::size_t t = 0; t < n; ++t) {
    const double* r = &h[t * D];
    double mean = 0;
    if (s.norm == ref::Op::layernorm) {
      for (std::size_t j = 0; j < D; ++j) mean += r[j];
      mean /= static_cast<double>(D);
    }
    double ss = 0;
    for (std::size_t j = 0; j < D; ++j) ss += (r[j] - mean) * (r[j] - mean);
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(D) + s.epsilon);
    for (std::size_t j = 0; j < D; ++j) y[t * D + j] = (r[j] - mean) * rstd * w[j] + (b ? b[j] : 0.0);
  }
  return y;
}

// max |a - b| / max |b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i])), scale = std::max(scale, std::fabs(b[i]));
  return scale > 0 ? worst / scale : worst;
}

// Per layer, ||alpha x + A(x)|| and ||alpha z + F(z)|| of a float64 pass of a post or deepnorm
// stack, and the largest disagreement with the kernels' outputs (README.md "What it computes").
double prenorm_sums(const Stack& s, const Pass& p, std::size_t n, StepStats& st) {
  double worst = 0;
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const LayerParams& P = s.layers[l];
    if (s.attention) {
      const auto c = attn_forward(Arith(DType::float64), s, P, p.acts[l], n);
      std::vector<double> h(c->a.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = s.alpha * p.acts[l][i] + c->a[i];
      worst = std::max(worst, rel_diff(h, p.attn_h[l]));
      worst = std::max(worst, rel_diff(norm64(s, h, P.attn_weight.data(), P.attn_bias.empty() ? nullptr : P.attn_bias.data(), n),
                                       p.mids[l]));
      st.prenorm_attn.push_back(rms_token_norm(h, static_cast<std::int64_t>(n)));
    }
    const std::vector<double> f = ffn64(s, P, p.mids[l], n);
    std::vector<double> h(f.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = s.alpha * p.mids[l][i] + f[i];
    worst = std::max(worst, rel_diff(norm64(s, h, P.weight.data(), P.bias.empty() ? nullptr : P.bias.data(), n), p.acts[l + 1]));
    st.prenorm_ffn.push_back(rms_token_norm(h, static_cast<std::int64_t>(n)));
  }
  return worst;
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
  Optim opt(o, o.lr);
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
      if (s.attention) {
        st.grad_wq.push_back(frobenius(p.grads[i].wq));
        st.grad_wk.push_back(frobenius(p.grads[i].wk));
        st.grad_wv.push_back(frobenius(p.grads[i].wv));
        st.grad_wo.push_back(frobenius(p.grads[i].wo));
      }
    }
    if (pl == Placement::post || pl == Placement::deepnorm)
      run.prenorm_recheck = std::max(run.prenorm_recheck, prenorm_sums(s, p, static_cast<std::size_t>(data.tokens), st));
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

// One stack at another seed (o.seed is that seed): float64, ||dL/dW1||, ||dL/dW2|| and the
// activation norms entering and leaving each block at initialization, and ||ΔF|| after the first
// step of the optimizer (a forward pass only).
void seed_stack(const PlacementOptions& o, const Data& data, Placement pl, ref::Op norm, std::int64_t layers, SeedRun& out,
                std::size_t k) {
  Stack s = make_stack(o, pl, norm, layers);
  const Pass p = run_pass(s, data, DType::float64);
  out.grad_w1[k].clear();
  out.grad_w2[k].clear();
  for (const auto& g : p.grads) out.grad_w1[k].push_back(frobenius(g.w1)), out.grad_w2[k].push_back(frobenius(g.w2));
  out.act_in[k].clear();
  out.act_out[k].clear();
  for (std::size_t l = 0; l + 1 < p.acts.size() && l < p.grads.size(); ++l) {
    out.act_in[k].push_back(rms_token_norm(p.acts[l], data.tokens));
    out.act_out[k].push_back(rms_token_norm(p.acts[l + 1], data.tokens));
  }
  out.model_update[k] = std::numeric_limits<double>::quiet_NaN();
  if (o.steps < 1) return;
  Optim opt(o, o.lr);
  opt.step(s, p);
  const Pass q = run_pass(s, data, DType::float64, 1.0, false);
  std::vector<double> diff(q.y.size());
  for (std::size_t i = 0; i < diff.size(); ++i) diff[i] = q.y[i] - p.y[i];
  out.model_update[k] = rms_token_norm(diff, data.tokens);
}

// The sweep of one stack: at each rate, the losses at steps 0 .. sweep_steps (stopping at the
// first non-finite one). Every rate starts from the same draw, so the first pass is made once.
std::vector<std::vector<double>> sweep_losses(const PlacementOptions& o, const Data& data, Placement pl, ref::Op norm,
                                              std::int64_t layers) {
  const Stack s0 = make_stack(o, pl, norm, layers);
  const Pass first = run_pass(s0, data, DType::float64);
  std::vector<std::vector<double>> out;
  for (double lr : o.sweep_lrs) {
    Stack s = s0;
    Optim opt(o, lr);
    std::vector<double> losses{first.loss};
    if (std::isfinite(first.loss)) opt.step(s, first);
    for (std::int64_t t = 1; t <= o.sweep_steps && std::isfinite(losses.back()); ++t) {
      const Pass p = run_pass(s, data, DType::float64, 1.0, t < o.sweep_steps);
      losses.push_back(p.loss);
      if (std::isfinite(p.loss) && t < o.sweep_steps) opt.step(s, p);
    }
    out.push_back(std::move(losses));
  }
  return out;
}

}  // namespace

bool usable_losses(const std::vector<double>& losses) {
  if (losses.empty() || !std::isfinite(losses[0])) return false;
  for (std::size_t t = 1; t < losses.size(); ++t)
    if (!std::isfinite(losses[t]) || !(losses[t] < losses[0])) return false;
  return losses.size() > 1;
}

StudyResult run_placement_study(const PlacementOptions& o) {
  validate(o);
  const auto t0 = std::chrono::steady_clock::now();
  StudyResult r;
  r.options = o;
  const Data data = make_data(o);
  // The other seeds' options and data (seed + k).
  std::vector<PlacementOptions> seed_opts;
  std::vector<Data> seed_data;
  for (std::int64_t k = 0; k < o.seeds; ++k) {
    seed_opts.push_back(o);
    seed_opts.back().seed = o.seed + static_cast<std::uint64_t>(k);
    seed_data.push_back(k == 0 ? data : make_data(seed_opts.back()));
  }
  // Jobs: every stack of the study, every stack's sweep, every stack at every other seed; each
  // writes its own slot, so the result does not depend on the threads.
  struct Job {
    Placement p;
    ref::Op norm;
    std::int64_t layers;
    std::size_t slot;
    std::int64_t rate;  // -1: the study's stack; 0: the stack's sweep; -2 - k: the stack at seed + k (k >= 1)
    double cost;        // layers x passes, to start the longest first
  };
  std::vector<Job> jobs;
  const auto rates = static_cast<std::int64_t>(o.sweep_lrs.size());
  const bool sweeping = rates > 0;
  for (auto p : o.placements)
    for (auto n : o.norms)
      for (auto l : o.depths) {
        const std::size_t slot = r.runs.size();
        r.runs.emplace_back();
        r.seed_runs.emplace_back();
        SeedRun& sr = r.seed_runs.back();
        sr.placement = p, sr.norm = n, sr.layers = l;
        const auto ns = static_cast<std::size_t>(o.seeds);
        sr.grad_w1.resize(ns), sr.grad_w2.resize(ns), sr.model_update.resize(ns);
        sr.act_in.resize(ns), sr.act_out.resize(ns);
        for (std::int64_t k = 0; k < o.seeds; ++k) {
          sr.seeds.push_back(o.seed + static_cast<std::uint64_t>(k));
          if (k > 0) jobs.push_back({p, n, l, slot, -2 - k, static_cast<double>(l) * 1.7});
        }
        const double lowp_passes = static_cast<double>(o.lowp.size()) * 2.0;
        jobs.push_back({p, n, l, slot, -1, static_cast<double>(l) * (static_cast<double>(o.steps + 1) + lowp_passes)});
        if (!sweeping) continue;
        r.sweep.emplace_back();
        SweepRun& sw = r.sweep.back();
        sw.placement = p, sw.norm = n, sw.layers = l;
        jobs.push_back({p, n, l, r.sweep.size() - 1, 0, static_cast<double>(l * (rates * o.sweep_steps + 1))});
      }
  // The longest jobs first, so that the last job to start is a short one.
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return jobs[a].cost > jobs[b].cost; });
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&]() {
    for (std::size_t k; (k = next++) < order.size();) {
      const Job& j = jobs[order[k]];
      try {
        if (j.rate <= -3) {
          const auto sk = static_cast<std::size_t>(-2 - j.rate);
          seed_stack(seed_opts[sk], seed_data[sk], j.p, j.norm, j.layers, r.seed_runs[j.slot], sk);
        } else if (j.rate < 0)
          r.runs[j.slot] = run_stack(o, data, j.p, j.norm, j.layers);
        else
          r.sweep[j.slot].losses = sweep_losses(o, data, j.p, j.norm, j.layers);
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
  // Seed 0 is the study's own stack.
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const StepStats& s0 = r.runs[i].steps.front();
    r.seed_runs[i].grad_w1[0] = s0.grad_w1;
    r.seed_runs[i].grad_w2[0] = s0.grad_w2;
    r.seed_runs[i].act_in[0] = s0.act_in;
    r.seed_runs[i].act_out[0] = s0.act_out;
    r.seed_runs[i].model_update[0] =
        r.runs[i].steps.size() > 1 ? r.runs[i].steps[1].model_update : std::numeric_limits<double>::quiet_NaN();
  }
  for (auto& sw : r.sweep)
    for (std::size_t k = 0; k < sw.losses.size(); ++k) {
      sw.usable.push_back(usable_losses(sw.losses[k]));
      const double lr = o.sweep_lrs[k];
      if (sw.usable.back() && (!sw.largest_usable || lr > *sw.largest_usable)) sw.largest_usable = lr;
      if (!sw.usable.back() && (!sw.smallest_unusable || lr < *sw.smallest_unusable)) sw.smallest_unusable = lr;
    }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace normcheck::study
