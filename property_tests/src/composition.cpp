// Residual blocks against their unfused compositions (properties `block_composition` and
// `block_backward_composition`, README.md).
//
// The plugin ABI (and the other transports) run whole cases: a norm, a norm with a fused residual
// add, or a whole block. The FFN is not an op a candidate exposes, so a block is composed from the
// candidate's own norm and fused add, with F evaluated here where it can be exact:
//
// - post / deepnorm, one layer, ReLU, x and the FFN parameters on coarse binary grids: every
//   product and partial sum of F(x) and of h = alpha x + F(x) is exact in the compute dtype in any
//   order (checked from the sums of |terms|), so the exact block output is Norm0(h). The block's y
//   is compared with the candidate's plain norm of h (x := h) and with its fused add
//   (x, residual := F(x), alpha) where it declares one: |y_block - y_unfused| <= a_block + a_unfused.
// - pre, one layer, any activation: y = x + F(Norm0(x)). The candidate's plain Norm0(x) gives n
//   within its allowance a_n of the exact norm; F(n) is evaluated here in long double. F is
//   Lipschitz (ReLU 1, GELU 1.13), so |F(n) - F(Norm0 x)|_j <= sum_i |W2_ji| L sum_k |W1_ik| a_n_k,
//   and |y_block - (x + F(n))| <= a_block + that + our own evaluation error.
// - sandwich, one layer, ReLU: y = x + Norm1(F(Norm0(x))). Norm0 is exact on rows +-a (RMSNorm) or
//   c +- a with as many of each (LayerNorm), a a power of two, eps 0: x-hat = +-1, so Norm0(x) =
//   +-scale + bias is known exactly; with the parameters on grids F of it is exact too, and the
//   candidate's plain Norm1 of that F gives n1: |y_block - (x + n1)| <= a_block + a_n1.
// - post / deepnorm backward, the grids of the forward: the gradients against the candidate's plain
//   norm backward at h (dh, dweight, dbias) composed with F's backward (post_deepnorm_backward).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <rapidcheck.h>

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "property_support.hpp"

namespace normcheck::prop {
namespace {

using namespace detail;
using ref::DType;

// The first layer of a block case: tensors with a leading layer dim keep their first slice.
void keep_first_layer(ref::Case& c) {
  if (c.layers == 1) return;
  for (const char* name : {"ffn_w1", "ffn_b1", "ffn_w2", "ffn_b2", "weight", "bias"}) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) continue;
    auto& t = it->second;
    t.data.resize(t.data.size() / static_cast<std::size_t>(t.shape[0]));
    t.shape[0] = 1;
  }
  c.layers = 1;
}

// Rounds t to a grid of `bits` significant bits below its largest magnitude; returns the grid's
// unit (a power of two; 0 when t is all zero: any unit divides it).
double to_grid(ref::Tensor& t, int bits) {
  double m = 0;
  for (double v : t.data) m = std::max(m, std::fabs(v));
  if (m == 0) return 0;
  const double s = std::ldexp(1.0, std::ilogb(m) + 1 - bits);
  for (double& v : t.data) v = std::nearbyint(v / s) * s;
  return s;
}
// Rounds t to multiples of s (s a power of two).
void to_unit(ref::Tensor& t, double s) {
  if (s > 0)
    for (double& v : t.data) v = std::nearbyint(v / s) * s;
}

// Every partial sum of terms that are multiples of `unit`, whose |terms| add up to `abs_sum`, is a
// value of dtype t (any order): multiples of unit below 2^precision units, unit not below the
// subnormal spacing.
bool sums_exact(double abs_sum, double unit, DType t) {
  if (abs_sum == 0) return true;
  if (!(unit > 0)) return false;
  return unit >= conf::ulp_of(0, t) && abs_sum < std::ldexp(unit, ref::format_of(t).precision) &&
         abs_sum < ref::max_finite(t);
}

// The largest power of two that divides the dyadic value v (v != 0).
double unit_of(double v) {
  double u = std::ldexp(1.0, std::ilogb(v));
  while (std::fmod(v, u) != 0) u /= 2;
  return u;
}

// The plain norm k of layer 0 of block case c, over x (shape [R, D]).
ref::Case plain_norm(const ref::Case& c, std::int64_t k, ref::Tensor x) {
  ref::Case n;
  n.op = c.op;
  n.axis = -1;
  n.epsilon = c.epsilon;
  n.affine = c.affine;
  n.weight_offset = c.weight_offset;
  n.direction = ref::Direction::forward;
  n.contract = "exact";
  n.dtype_x = x.dtype;
  n.dtype_param = c.dtype_param;
  n.dtype_out = c.dtype_out;
  n.dtype_compute = c.dtype_compute;
  n.dtype_residual = x.dtype;
  const std::int64_t D = x.shape.back();
  const std::int64_t K = c.block == ref::Block::sandwich ? 2 : 1;
  for (const char* name : {"weight", "bias"}) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) continue;
    ref::Tensor p{it->second.dtype, {D}, {}};
    const auto from = it->second.data.begin() + static_cast<std::ptrdiff_t>((k % K) * D);
    p.data.assign(from, from + static_cast<std::ptrdiff_t>(D));
    n.inputs[name] = std::move(p);
  }
  n.inputs["x"] = std::move(x);
  return n;
}

// A block case, one layer, forward or backward (the generator draws its FFN, norms and dy).
DrawnCase draw_block(Context& ctx, std::vector<ref::Block> kinds, ref::Direction dir = ref::Direction::forward) {
  if (!ctx.cand.info().caps.blocks) RC_DISCARD("the candidate has no blocks");
  CaseLimits lim = ctx.limits;
  lim.blocks_required = true;
  lim.block_kinds = std::move(kinds);
  lim.directions = {dir};
  auto d = draw_case(ctx.cand.info().caps, lim);
  keep_first_layer(d.c);
  return d;
}

struct Run {
  ref::Case c;
  conf::Outputs got;
  conf::OutputAllowance allow;  // of y
  const ref::Tensor* y = nullptr;
};

// Runs a case and keeps its y and y's allowance; std::nullopt when the candidate declines it.
std::optional<Run> run_y(Context& ctx, ref::Case c, const std::string& family) {
  if (ctx.cand.declines(c)) return std::nullopt;
  Run r;
  r.got = run_candidate(ctx, c, family);
  r.allow = allowances_of(ctx, c, r.got).at("y");
  r.c = std::move(c);
  const auto g = ref::geometry_of(r.c);
  r.y = &output_of(ctx, r.c, family, r.got, "y", g.rows * g.cols);
  return r;
}

// Fails with the side the reference rejects, when one does (the block first).
[[noreturn]] void fail_composition(Context& ctx, const Run& block, const Run* part, const std::string& family,
                                   const std::string& message) {
  auto rb = agreement_of(ctx, block.c, block.got);
  if (conf::is_failure(rb.verdict) || !part) fail(ctx, block.c, family, message, rb, false);
  auto rp = agreement_of(ctx, part->c, part->got);
  if (conf::is_failure(rp.verdict)) fail(ctx, part->c, family, message, rp, false);
  fail(ctx, block.c, family, message, rb, false);
}

// |y_block[i] - composed[i]| <= a_block[i] + slack[i] for every element (mistrusted ones skipped).
void compare(Context& ctx, const Run& block, const Run* part, const std::string& family,
             const std::vector<double>& composed, const std::vector<double>& slack, const std::string& what) {
  for (std::size_t i = 0; i < composed.size(); ++i) {
    if (std::isnan(slack[i])) continue;
    const double yb = block.y->data[i];
    if (auto why = within(yb, block.allow.abs[i], composed[i], slack[i], block.allow.nan_ok[i] != 0))
      fail_composition(ctx, block, part, family,
                       fmt::format("{} block against {}: y element {}: {} in the block, {} composed: {}",
                                   ref::name_of(block.c.block), what, i, value_text(yb, block.y->dtype),
                                   ref::hex_text(composed[i]), *why));
  }
}

// Long double arithmetic that notes whether every operation was exact (TwoSum's error term and
// fmal's residual are exact under round-to-nearest).
struct Exact {
  bool ok = true;
  long double add(long double a, long double b) {
    const long double s = a + b, bb = s - a;
    if ((a - (s - bb)) + (b - bb) != 0) ok = false;
    return s;
  }
  long double mul(long double a, long double b) {
    const long double p = a * b;
    if (std::fmal(a, b, -p) != 0) ok = false;
    return p;
  }
};

// F(v) of layer 0 of c for one position, in long double; with `e_v` (errors of v) also the bound
// sum_i |W2_ji| L sum_k |W1_ik| e_v_k and our own evaluation error, added into `err`. With `ex`
// (ReLU only) every operation is checked exact.
void ffn_of(const ref::Case& c, const double* v, const double* e_v, std::int64_t D, long double* out, double* err,
            Exact* ex = nullptr) {
  const auto& w1 = c.inputs.at("ffn_w1").data;
  const auto& b1 = c.inputs.at("ffn_b1").data;
  const auto& w2 = c.inputs.at("ffn_w2").data;
  const auto& b2 = c.inputs.at("ffn_b2").data;
  const auto F = static_cast<std::int64_t>(b1.size());
  const bool relu = c.activation == ref::Activation::relu;
  const double lip = relu ? 1.0 : 1.13;  // max |act'| (TOLERANCE.md section 7)
  std::vector<long double> a(static_cast<std::size_t>(F));
  std::vector<double> prop_a(static_cast<std::size_t>(F)), mag_a(static_cast<std::size_t>(F));
  for (std::int64_t i = 0; i < F; ++i) {
    long double z = b1[static_cast<std::size_t>(i)];
    double mag = std::fabs(b1[static_cast<std::size_t>(i)]), pe = 0;
    for (std::int64_t k = 0; k < D; ++k) {
      const double w = w1[static_cast<std::size_t>(i * D + k)];
      z = ex ? ex->add(z, ex->mul(w, v[k])) : z + static_cast<long double>(w) * v[k];
      mag += std::fabs(w * v[k]);
      if (e_v) pe += std::fabs(w) * e_v[k];
    }
    a[static_cast<std::size_t>(i)] = relu ? std::max(z, 0.0L) : 0.5L * z * (1 + std::erf(z / std::sqrt(2.0L)));
    prop_a[static_cast<std::size_t>(i)] = lip * pe;
    mag_a[static_cast<std::size_t>(i)] = std::fabs(static_cast<double>(a[static_cast<std::size_t>(i)])) + 1.13 * mag;
  }
  for (std::int64_t j = 0; j < D; ++j) {
    long double f = b2[static_cast<std::size_t>(j)];
    double mag = std::fabs(b2[static_cast<std::size_t>(j)]), pe = 0;
    for (std::int64_t i = 0; i < F; ++i) {
      const double w = w2[static_cast<std::size_t>(j * F + i)];
      f = ex ? ex->add(f, ex->mul(w, a[static_cast<std::size_t>(i)])) : f + w * a[static_cast<std::size_t>(i)];
      mag += std::fabs(w) * mag_a[static_cast<std::size_t>(i)];
      pe += std::fabs(w) * prop_a[static_cast<std::size_t>(i)];
    }
    out[j] = f;
    // Our long double evaluation errs by far less than this binary64-sized slack (erfl within a
    // few ulp, D + F + 4 roundings of 2^-64 each, magnitudes bounded by mag).
    if (err) err[j] += pe + std::ldexp(static_cast<double>(4 * (D + F) + 8), -60) * mag;
  }
}

void post_deepnorm_backward(Context& ctx, const DrawnCase& d, const ref::Tensor& h, double alpha);

// post / deepnorm on exact grids: the block's y against Norm0(h) and the fused add of F(x); or,
// backward, its gradients against the plain norm's backward at h composed with F's backward.
void post_deepnorm(Context& ctx, ref::Direction dir) {
  auto d = draw_block(ctx, {ref::Block::post, ref::Block::deepnorm}, dir);
  ref::Case& c = d.c;
  c.activation = ref::Activation::relu;
  const DType ct = c.dtype_compute;
  ref::Tensor& x = c.inputs.at("x");
  const double sx = to_grid(x, 4);
  const double sw1 = to_grid(c.inputs.at("ffn_w1"), 3);
  const double sa = sx * sw1;
  to_unit(c.inputs.at("ffn_b1"), sa);
  const double sw2 = to_grid(c.inputs.at("ffn_w2"), 3);
  const double sf = sa * sw2;
  to_unit(c.inputs.at("ffn_b2"), sf);
  const double alpha = c.block == ref::Block::deepnorm ? c.alpha : 1.0;
  const auto g = ref::geometry_of(c);
  const std::int64_t D = g.cols;
  // F(x) and h, exactly; the sums of |terms| bound every partial sum a kernel can form.
  ref::Tensor f{x.dtype, x.shape, std::vector<double>(x.data.size())};
  ref::Tensor h = f;
  const auto& w1 = c.inputs.at("ffn_w1").data;
  const auto& b1 = c.inputs.at("ffn_b1").data;
  const auto& w2 = c.inputs.at("ffn_w2").data;
  const auto& b2 = c.inputs.at("ffn_b2").data;
  const auto F = static_cast<std::int64_t>(b1.size());
  const double sh = sx > 0 && sf > 0 ? std::min(sx * unit_of(alpha), sf) : sx > 0 ? sx * unit_of(alpha) : sf;
  for (double p : {sx, sw1, sw2})
    if (p > 0 && !sums_exact(p, p, ct)) RC_DISCARD("grid below the compute dtype's subnormals");
  std::vector<double> a(static_cast<std::size_t>(F));
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const double* xr = &x.data[static_cast<std::size_t>(r * D)];
    for (std::int64_t i = 0; i < F; ++i) {
      double z = b1[static_cast<std::size_t>(i)], mag = std::fabs(z);
      for (std::int64_t k = 0; k < D; ++k) {
        z += w1[static_cast<std::size_t>(i * D + k)] * xr[k];
        mag += std::fabs(w1[static_cast<std::size_t>(i * D + k)] * xr[k]);
      }
      if (!sums_exact(mag, sa, ct)) RC_DISCARD("W1 x + b1 not exact in the compute dtype");
      a[static_cast<std::size_t>(i)] = std::max(z, 0.0);
    }
    for (std::int64_t j = 0; j < D; ++j) {
      double fv = b2[static_cast<std::size_t>(j)], mag = std::fabs(fv);
      for (std::int64_t i = 0; i < F; ++i) {
        fv += w2[static_cast<std::size_t>(j * F + i)] * a[static_cast<std::size_t>(i)];
        mag += std::fabs(w2[static_cast<std::size_t>(j * F + i)] * a[static_cast<std::size_t>(i)]);
      }
      const double ax = alpha * xr[j];
      if (!sums_exact(mag, sf, ct) || !sums_exact(mag + std::fabs(ax), sh, ct) || !sums_exact(std::fabs(ax), sh, ct))
        RC_DISCARD("F(x) or h not exact in the compute dtype");
      const auto k = static_cast<std::size_t>(r * D + j);
      f.data[k] = fv;
      h.data[k] = ax + fv;
      if (!ref::representable(fv, x.dtype) || !ref::representable(h.data[k], x.dtype))
        RC_DISCARD("F(x) or h is not a value of dtype_x");
    }
  }
  if (dir == ref::Direction::backward) return post_deepnorm_backward(ctx, d, h, alpha);
  auto block = run_y(ctx, c, d.family);
  if (!block) RC_DISCARD("the candidate declines the block");
  bool composed_any = false;
  // The plain norm of h.
  if (auto n = run_y(ctx, plain_norm(c, 0, h), d.family)) {
    composed_any = true;
    compare(ctx, *block, &*n, d.family, n->y->data, n->allow.abs, "the plain norm of h = alpha x + F(x)");
  }
  // The fused add: Norm(alpha x + residual) with residual = F(x).
  ref::Case fa = plain_norm(c, 0, x);
  fa.residual = ref::Residual::add;
  fa.alpha = alpha;
  fa.inputs["residual"] = f;
  if (auto n = run_y(ctx, fa, d.family)) {
    composed_any = true;
    compare(ctx, *block, &*n, d.family, n->y->data, n->allow.abs, "the fused add Norm(alpha x + F(x))");
  }
  if (!composed_any) RC_DISCARD("the candidate declines the unfused norms");
}

// pre: the block's y against x + F(n), n the candidate's plain Norm0(x).
void pre(Context& ctx) {
  auto d = draw_block(ctx, {ref::Block::pre});
  const ref::Case& c = d.c;
  const auto g = ref::geometry_of(c);
  const std::int64_t D = g.cols;
  ref::Case nc = plain_norm(c, 0, c.inputs.at("x"));
  // n as wide as the candidate stores it: float64 or float32 where declared.
  for (DType t : {DType::float64, DType::float32})
    if (std::find(ctx.cand.info().caps.dtypes.begin(), ctx.cand.info().caps.dtypes.end(), t) !=
        ctx.cand.info().caps.dtypes.end()) {
      nc.dtype_out = t;
      break;
    }
  auto block = run_y(ctx, c, d.family);
  if (!block) RC_DISCARD("the candidate declines the block");
  auto n = run_y(ctx, nc, d.family);
  if (!n) RC_DISCARD("the candidate declines the plain norm");
  std::vector<double> composed(block->y->data.size()), slack(composed.size(), 0.0);
  std::vector<long double> fv(static_cast<std::size_t>(D));
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const auto base = static_cast<std::size_t>(r * D);
    bool mistrusted = false;
    for (std::int64_t k = 0; k < D; ++k)
      if (std::isnan(n->allow.abs[base + k]) || !std::isfinite(n->y->data[base + k])) mistrusted = true;
    if (mistrusted) {
      std::fill(slack.begin() + static_cast<std::ptrdiff_t>(base),
                slack.begin() + static_cast<std::ptrdiff_t>(base + D), std::nan(""));
      continue;
    }
    ffn_of(c, &n->y->data[base], &n->allow.abs[base], D, fv.data(), &slack[base]);
    for (std::int64_t j = 0; j < D; ++j) {
      const long double v = c.inputs.at("x").data[base + j] + fv[static_cast<std::size_t>(j)];
      composed[base + j] = static_cast<double>(v);
      slack[base + j] += std::ldexp(std::fabs(composed[base + j]), -53);
    }
  }
  compare(ctx, *block, &*n, d.family, composed, slack, "x + F(n), n the candidate's plain Norm0(x)");
}

// sandwich on rows where Norm0 is exact: the block's y against x + n1, n1 the candidate's plain
// Norm1 of F(Norm0(x)).
void sandwich(Context& ctx) {
  auto d = draw_block(ctx, {ref::Block::sandwich});
  ref::Case& c = d.c;
  c.activation = ref::Activation::relu;
  c.epsilon = 0;
  const auto g = ref::geometry_of(c);
  const std::int64_t D = g.cols;
  const bool ln = c.op == ref::Op::layernorm;
  if (ln && D % 2 != 0) RC_DISCARD("LayerNorm rows c +- a need an even length");
  ref::Tensor& x = c.inputs.at("x");
  // Rows c +- a: a a power of two, c a small multiple of it (LayerNorm), signs drawn (half of each
  // for LayerNorm, by a rotation of the pattern + - + - ...).
  const int ea = static_cast<int>(draw_from(std::vector<int>{0, -1, 2, -4, 5}));
  const double aa = std::ldexp(1.0, ea);
  const double cc = ln ? draw_from(std::vector<double>{0, 1, -3, 8}) * aa : 0.0;
  std::uint64_t bits = draw_index(std::size_t{1} << 20);
  for (std::int64_t r = 0; r < g.rows; ++r)
    for (std::int64_t j = 0; j < D; ++j) {
      const bool plus = ln ? ((j + r) % 2 == 0) : ((bits >> ((r * D + j) % 20)) & 1) != 0;
      x.data[static_cast<std::size_t>(r * D + j)] = cc + (plus ? aa : -aa);
    }
  for (double v : x.data)
    if (!ref::representable(v, x.dtype)) RC_DISCARD("c +- a not a value of dtype_x");
  // Parameters on grids: the norm-0 output +-scale + bias and F of it exact (checked).
  if (c.inputs.count("weight")) to_grid(c.inputs.at("weight"), 3);
  if (c.inputs.count("bias")) to_grid(c.inputs.at("bias"), 3);
  to_grid(c.inputs.at("ffn_w1"), 3);
  to_grid(c.inputs.at("ffn_b1"), 3);
  to_grid(c.inputs.at("ffn_w2"), 3);
  to_grid(c.inputs.at("ffn_b2"), 3);
  ref::Tensor f{x.dtype, x.shape, std::vector<double>(x.data.size())};
  std::vector<double> n0(static_cast<std::size_t>(D));
  std::vector<long double> fv(static_cast<std::size_t>(D));
  for (std::int64_t r = 0; r < g.rows; ++r) {
    Exact ex;
    for (std::int64_t j = 0; j < D; ++j) {
      const double xh = x.data[static_cast<std::size_t>(r * D + j)] > cc ? 1.0 : -1.0;
      const long double sc =
          c.inputs.count("weight") ? ex.add(c.weight_offset, c.inputs.at("weight").data[static_cast<std::size_t>(j)]) : 1.0L;
      const double b = c.inputs.count("bias") ? c.inputs.at("bias").data[static_cast<std::size_t>(j)] : 0.0;
      const long double v = ex.add(xh * sc, b);
      n0[static_cast<std::size_t>(j)] = static_cast<double>(v);
      if (static_cast<long double>(n0[static_cast<std::size_t>(j)]) != v) ex.ok = false;
    }
    ffn_of(c, n0.data(), nullptr, D, fv.data(), nullptr, &ex);
    if (!ex.ok) RC_DISCARD("Norm0(x) or F of it is not exact in long double");
    for (std::int64_t j = 0; j < D; ++j) {
      const long double v = fv[static_cast<std::size_t>(j)];
      const double vd = static_cast<double>(v);
      if (static_cast<long double>(vd) != v || !ref::representable(vd, x.dtype))
        RC_DISCARD("F(Norm0 x) is not a value of dtype_x");
      f.data[static_cast<std::size_t>(r * D + j)] = vd;
    }
  }
  auto block = run_y(ctx, c, d.family);
  if (!block) RC_DISCARD("the candidate declines the block");
  auto n1 = run_y(ctx, plain_norm(c, 1, f), d.family);
  if (!n1) RC_DISCARD("the candidate declines the plain norm");
  std::vector<double> composed(block->y->data.size()), slack(composed.size());
  for (std::size_t i = 0; i < composed.size(); ++i) {
    composed[i] = x.data[i] + n1->y->data[i];
    slack[i] = n1->allow.abs[i] + std::ldexp(std::fabs(composed[i]), -53);
  }
  compare(ctx, *block, &*n1, d.family, composed, slack, "x + n1, n1 the candidate's plain Norm1(F(Norm0 x))");
}

// post / deepnorm backward (the grids of post_deepnorm: x, W1, b1, W2, b2 such that z = W1 x + b1,
// F(x) and h = alpha x + F(x) are exact). The exact gradients are those of Norm0 at h with the
// same dy: dh, dweight, dbias; then dx = alpha dh + W1^T (relu'(z) . W2^T dh), dffn_b2 = sum dh,
// dffn_w2 = sum dh a^T (a = relu(z), exact), dffn_b1 = sum g_z, dffn_w1 = sum g_z x^T over the rows
// (g_z = relu'(z) . W2^T dh). The candidate's plain norm backward at x := h gives dh within its
// allowance a_dh (and dweight, dbias within theirs); the rest is evaluated here in long double
// from it, with the bound that a_dh propagates through these linear maps, and compared with the
// block's outputs within their allowances plus that bound (plus our own evaluation error, a
// binary64-sized bound). Where z = 0, relu'(z) may be taken as 0 or 1: both are allowed.
void post_deepnorm_backward(Context& ctx, const DrawnCase& d, const ref::Tensor& h, double alpha) {
  const ref::Case& c = d.c;
  if (ctx.cand.declines(c)) RC_DISCARD("the candidate declines the block");
  ref::Case pc = plain_norm(c, 0, h);
  pc.direction = ref::Direction::backward;
  pc.inputs["dy"] = c.inputs.at("dy");
  if (ctx.cand.declines(pc)) RC_DISCARD("the candidate declines the plain norm's backward");
  Run block, plain;
  block.got = run_candidate(ctx, c, d.family);
  block.c = c;
  plain.got = run_candidate(ctx, pc, d.family);
  plain.c = pc;
  const auto allow_b = allowances_of(ctx, c, block.got), allow_p = allowances_of(ctx, pc, plain.got);
  const auto g = ref::geometry_of(c);
  const std::int64_t R = g.rows, D = g.cols;
  const auto& x = c.inputs.at("x").data;
  const auto& w1 = c.inputs.at("ffn_w1").data;
  const auto& b1 = c.inputs.at("ffn_b1").data;
  const auto& w2 = c.inputs.at("ffn_w2").data;
  const auto F = static_cast<std::int64_t>(b1.size());

  // An output of the block against `composed` (slack NaN: not compared).
  auto check = [&](const std::string& name, const std::vector<long double>& composed, const std::vector<double>& slack,
                   const std::string& what) {
    const auto it = allow_b.find(name);
    if (it == allow_b.end()) return;
    const ref::Tensor& tb = output_of(ctx, c, d.family, block.got, name, static_cast<std::int64_t>(composed.size()));
    for (std::size_t i = 0; i < composed.size(); ++i) {
      if (std::isnan(slack[i])) continue;
      const double v = static_cast<double>(composed[i]);
      if (auto why = within(tb.data[i], it->second.abs[i], v, slack[i], it->second.nan_ok[i] != 0))
        fail_composition(ctx, block, &plain, d.family,
                         fmt::format("{} block backward against {}: {} element {}: {} in the block, {} composed: {}",
                                     ref::name_of(c.block), what, name, i, value_text(tb.data[i], tb.dtype),
                                     ref::hex_text(v), *why));
    }
  };
  // dweight and dbias: the plain norm's at h have the same exact values.
  for (const char* name : {"dweight", "dbias"}) {
    const auto ip = allow_p.find(name);
    if (ip == allow_p.end() || !allow_b.count(name)) continue;
    const auto n = static_cast<std::int64_t>(ip->second.abs.size());
    const ref::Tensor& tp = output_of(ctx, pc, d.family, plain.got, name, n);
    check(name, std::vector<long double>(tp.data.begin(), tp.data.end()), ip->second.abs,
          std::string("the plain norm's ") + name + " at h");
  }

  const ref::Tensor& dh = output_of(ctx, pc, d.family, plain.got, "dx", R * D);
  const auto& a_dh = allow_p.at("dx").abs;
  const bool params = allow_b.count("dffn_w1") != 0;
  std::vector<long double> dx(static_cast<std::size_t>(R * D)), gw1, gb1, gw2, gb2;
  std::vector<double> s_dx(dx.size(), 0.0), s_w1, s_b1, s_w2, s_b2, m_w1, m_b1, m_w2, m_b2;
  if (params) {
    gw1.assign(static_cast<std::size_t>(F * D), 0.0L);
    gb1.assign(static_cast<std::size_t>(F), 0.0L);
    gw2.assign(static_cast<std::size_t>(D * F), 0.0L);
    gb2.assign(static_cast<std::size_t>(D), 0.0L);
    s_w1 = m_w1 = std::vector<double>(gw1.size(), 0.0);
    s_b1 = m_b1 = std::vector<double>(gb1.size(), 0.0);
    s_w2 = m_w2 = std::vector<double>(gw2.size(), 0.0);
    s_b2 = m_b2 = std::vector<double>(gb2.size(), 0.0);
  }
  const double eval = std::ldexp(static_cast<double>(4 * (D + F + R) + 8), -60);
  std::vector<long double> gz(static_cast<std::size_t>(F));
  std::vector<double> sgz(static_cast<std::size_t>(F)), mgz(static_cast<std::size_t>(F)), a(static_cast<std::size_t>(F));
  bool params_ok = true;
  for (std::int64_t r = 0; r < R; ++r) {
    const std::size_t base = static_cast<std::size_t>(r * D);
    bool row_ok = true;
    for (std::int64_t j = 0; j < D; ++j)
      if (std::isnan(a_dh[base + j]) || !std::isfinite(a_dh[base + j]) || !std::isfinite(dh.data[base + j]))
        row_ok = false;
    if (!row_ok) {  // the plain norm's dh is MISTRUSTED or not finite here: nothing to compose
      std::fill(s_dx.begin() + static_cast<std::ptrdiff_t>(base), s_dx.begin() + static_cast<std::ptrdiff_t>(base + D),
                std::nan(""));
      params_ok = false;
      continue;
    }
    for (std::int64_t i = 0; i < F; ++i) {
      double z = b1[static_cast<std::size_t>(i)];  // exact: the grids of post_deepnorm
      for (std::int64_t k = 0; k < D; ++k) z += w1[static_cast<std::size_t>(i * D + k)] * x[base + k];
      a[static_cast<std::size_t>(i)] = std::max(z, 0.0);
      long double ga = 0;
      double pa = 0, ma = 0;
      for (std::int64_t j = 0; j < D; ++j) {
        const double w = w2[static_cast<std::size_t>(j * F + i)];
        ga += static_cast<long double>(w) * dh.data[base + j];
        pa += std::fabs(w) * a_dh[base + j];
        ma += std::fabs(w * dh.data[base + j]);
      }
      const auto ui = static_cast<std::size_t>(i);
      if (z > 0) {
        gz[ui] = ga;
        sgz[ui] = pa + eval * ma;
      } else if (z < 0) {
        gz[ui] = 0;
        sgz[ui] = 0;
      } else {  // relu'(0): 0 or 1
        gz[ui] = ga / 2;
        sgz[ui] = std::fabs(static_cast<double>(ga)) / 2 + pa + eval * ma;
      }
      mgz[ui] = ma;
    }
    for (std::int64_t j = 0; j < D; ++j) {
      long double v = static_cast<long double>(alpha) * dh.data[base + j];
      double sl = std::fabs(alpha) * a_dh[base + j], mag = std::fabs(alpha * dh.data[base + j]);
      for (std::int64_t i = 0; i < F; ++i) {
        const double w = w1[static_cast<std::size_t>(i * D + j)];
        v += w * gz[static_cast<std::size_t>(i)];
        sl += std::fabs(w) * sgz[static_cast<std::size_t>(i)];
        mag += std::fabs(w) * mgz[static_cast<std::size_t>(i)];
      }
      dx[base + j] = v;
      s_dx[base + j] = sl + eval * mag;
    }
    if (!params) continue;
    for (std::int64_t j = 0; j < D; ++j) {
      const double dv = dh.data[base + j], ad = a_dh[base + j];
      gb2[static_cast<std::size_t>(j)] += dv;
      s_b2[static_cast<std::size_t>(j)] += ad;
      m_b2[static_cast<std::size_t>(j)] += std::fabs(dv);
      for (std::int64_t i = 0; i < F; ++i) {
        const auto k = static_cast<std::size_t>(j * F + i);
        gw2[k] += static_cast<long double>(dv) * a[static_cast<std::size_t>(i)];
        s_w2[k] += ad * a[static_cast<std::size_t>(i)];
        m_w2[k] += std::fabs(dv * a[static_cast<std::size_t>(i)]);
      }
    }
    for (std::int64_t i = 0; i < F; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      gb1[ui] += gz[ui];
      s_b1[ui] += sgz[ui];
      m_b1[ui] += std::fabs(static_cast<double>(gz[ui])) + mgz[ui];
      for (std::int64_t k = 0; k < D; ++k) {
        const auto q = static_cast<std::size_t>(i * D + k);
        gw1[q] += gz[ui] * x[base + k];
        s_w1[q] += sgz[ui] * std::fabs(x[base + k]);
        m_w1[q] += (std::fabs(static_cast<double>(gz[ui])) + mgz[ui]) * std::fabs(x[base + k]);
      }
    }
  }
  check("dx", dx, s_dx, "alpha dh + W1^T (relu'(z) . W2^T dh), dh the plain norm's backward at h");
  if (!params) return;
  auto finish = [&](std::vector<double>& sl, const std::vector<double>& mag) {
    for (std::size_t i = 0; i < sl.size(); ++i) sl[i] = params_ok ? sl[i] + eval * mag[i] : std::nan("");
  };
  finish(s_w1, m_w1);
  finish(s_b1, m_b1);
  finish(s_w2, m_w2);
  finish(s_b2, m_b2);
  check("dffn_b2", gb2, s_b2, "the row sums of dh");
  check("dffn_w2", gw2, s_w2, "the row sums of dh a^T");
  check("dffn_b1", gb1, s_b1, "the row sums of relu'(z) . W2^T dh");
  check("dffn_w1", gw1, s_w1, "the row sums of (relu'(z) . W2^T dh) x^T");
}

void block_composition(Context& ctx) {
  switch (draw_index(3)) {
    case 0: post_deepnorm(ctx, ref::Direction::forward); break;
    case 1: pre(ctx); break;
    default: sandwich(ctx); break;
  }
}

void block_backward_composition(Context& ctx) { post_deepnorm(ctx, ref::Direction::backward); }

}  // namespace

std::vector<Property> composition_properties() {
  return {
      {"block_composition",
       "blocks (post, deepnorm, pre, sandwich; one layer) agree with the candidate's own unfused norm and fused add "
       "composed with the FFN, within tolerance",
       block_composition},
      {"block_backward_composition",
       "post and deepnorm blocks backward (one layer) agree with the candidate's own plain norm backward at h "
       "composed with the FFN's backward, within tolerance",
       block_backward_composition},
  };
}

}  // namespace normcheck::prop
