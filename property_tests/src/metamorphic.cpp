// Tolerance-based metamorphic relations and backward identities (properties.hpp).
//
// Each relation compares two values whose exact values are equal (after an exact scaling by a
// power of two or a sign): each side is within its allowance of that exact value (the tolerance
// model, conf::derive_allowances), so a correct candidate has |left - right| <= allowance_left +
// allowance_right. Inputs are transformed only where the transformation is exact in the input
// dtype (shifts and residual sums on a grid the dtype holds, scalings by powers of two that
// neither overflow nor lose subnormal bits), so no slack for input rounding is needed.
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
using Allow = std::map<std::string, conf::OutputAllowance>;

struct Side {
  ref::Case c;
  conf::Outputs got;
  Allow allow;
  std::string what;
};

Side run_side(Context& ctx, ref::Case c, const std::string& family, std::string what) {
  Side s;
  s.got = run_candidate(ctx, c, family);
  s.allow = allowances_of(ctx, c, s.got);
  s.c = std::move(c);
  s.what = std::move(what);
  return s;
}

// Fails the test with the side that disagrees with the reference when one does (a fixture that
// `normcheck run` rejects), else with the left side.
[[noreturn]] void fail_relation(Context& ctx, const Side& l, const Side& r, const std::string& family,
                                const std::string& message) {
  auto rl = agreement_of(ctx, l.c, l.got);
  if (conf::is_failure(rl.verdict)) fail(ctx, l.c, family, message, rl, false);
  auto rr = agreement_of(ctx, r.c, r.got);
  if (conf::is_failure(rr.verdict)) fail(ctx, r.c, family, message, rr, false);
  fail(ctx, l.c, family, message, rl, false);
}

// For each output `name` of `names` that the case has: factor(name) * left[map(name, i)] against
// right[i], with slack factor * allowance_left + allowance_right.
void relate(Context& ctx, const Side& l, const Side& r, const std::string& family, const std::vector<std::string>& names,
            const std::function<double(const std::string&)>& factor,
            const std::function<std::int64_t(const std::string&, std::int64_t)>& map, const std::string& relation) {
  const auto specs = conf::output_specs(r.c);
  for (const auto& name : names) {
    const auto sp = specs.find(name);
    if (sp == specs.end()) continue;
    if (is_stat(name) && ctx.cand.info().caps.no_statistics) continue;  // not returned (candidate.h)
    std::int64_t n = 1;
    for (auto d : sp->second.shape) n *= d;
    const ref::Tensor& tr = output_of(ctx, r.c, family, r.got, name, n);
    const ref::Tensor& tl = output_of(ctx, l.c, family, l.got, name, n);
    const auto& ar = r.allow.at(name);
    const auto& al = l.allow.at(name);
    const double f = factor ? factor(name) : 1.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      const auto il = static_cast<std::size_t>(map ? map(name, i) : i);
      const double vl = f * tl.data[il];
      // An infinity on one side is right where the other side's exact value (within its
      // allowance, in this side's units) reaches the overflow threshold of this side's dtype.
      if (std::isinf(tl.data[il]) && std::isfinite(tr.data[iu]) &&
          std::fabs(tr.data[iu] / f) + ar.abs[iu] / std::fabs(f) >= ref::max_finite(tl.dtype))
        continue;
      if (std::isinf(tr.data[iu]) && std::isfinite(vl) &&
          std::fabs(vl) + std::fabs(f) * al.abs[il] >= ref::max_finite(tr.dtype))
        continue;
      if (auto why = within(vl, std::fabs(f) * al.abs[il], tr.data[iu], ar.abs[iu], al.nan_ok[il] || ar.nan_ok[iu]))
        fail_relation(ctx, l, r, family,
                      fmt::format("{}: output {} element {}: {} x {} in {} against {} in {}: {}", relation, name, i, f,
                                  value_text(tl.data[il], tl.dtype), l.what, value_text(tr.data[iu], tr.dtype),
                                  r.what, *why));
    }
  }
}

const std::vector<std::string> kAll{"y", "mean", "rstd", "residual_out", "dx", "dweight", "dbias", "dresidual",
                                    "dresidual_bias"};

CaseLimits plain(const Context& ctx) {
  CaseLimits lim = ctx.limits;
  lim.residual = false;
  lim.blocks = false;
  lim.nonfinite = false;
  return lim;
}

// A plain forward case of `op` with unit scale and no bias, outside any contract (the relations
// of ln_sum_zero and rms_unit_rms hold for the exact y of such a case).
CaseLimits unit_forward(const Context& ctx, ref::Op op) {
  CaseLimits lim = plain(ctx);
  lim.ops = {op};
  lim.directions = {ref::Direction::forward};
  lim.unit_affine = true;
  lim.contracts = false;
  return lim;
}

double max_abs(const ref::Tensor& t) {
  double m = 0;
  for (double v : t.data) m = std::max(m, std::fabs(v));
  return m;
}

// Rounds every value of t to a multiple of q (exact in binary64: q is a power of two).
void quantize(ref::Tensor& t, double q) {
  for (double& v : t.data) v = std::nearbyint(v / q) * q;
}

// ---------------------------------------------------------------------------------------------

// LayerNorm(x + c) = LayerNorm(x): y, rstd and the gradients keep their exact values.
void shift_invariance(Context& ctx) {
  CaseLimits lim = plain(ctx);
  lim.ops = {ref::Op::layernorm};
  auto d = draw_case(ctx.cand.info().caps, lim);
  ref::Tensor& x = d.c.inputs.at("x");
  const ref::DType t = x.dtype;
  const double m = max_abs(x);
  const double scale = m > 0 ? std::ldexp(1.0, std::ilogb(m)) : 1.0;
  const double mult = draw_from(std::vector<double>{1.0, -1.0, 3.0, 0.25, 64.0, -1024.0});
  double c = mult * scale;
  // A grid the dtype holds for every value of both sides: the spacing at 2 (max|x| + |c|).
  const double top = 2 * (m + std::fabs(c));
  if (!(top < ref::max_finite(t))) RC_DISCARD("the shift would overflow the dtype");
  const double q = conf::ulp_of(top, t);
  quantize(x, q);
  c = std::nearbyint(c / q) * q;
  if (c == 0) RC_DISCARD("the shift is 0");
  ref::Case shifted = d.c;
  for (double& v : shifted.inputs.at("x").data) v += c;  // exact: multiples of q below top
  const Side l = run_side(ctx, d.c, d.family, "x");
  const Side r = run_side(ctx, shifted, d.family, fmt::format("x + {}", ref::hex_text(c)));
  relate(ctx, l, r, d.family, {"y", "rstd", "dx", "dweight", "dbias"}, nullptr, nullptr, "shift invariance");
}

// Norm(s x, eps) = Norm(x, eps / s^2) for s a power of two: y and the parameter gradients keep
// their exact values, rstd scales by 1/s, mean by s, dx by 1/s. The eps-aware form is exact for
// every eps (eps = 0 is plain scale invariance).
void scale_invariance(Context& ctx) {
  auto d = draw_case(ctx.cand.info().caps, plain(ctx));
  const int k = draw_from(std::vector<int>{1, -1, 2, -3, 5, -8});
  const double s = std::ldexp(1.0, k);
  ref::Case scaled = d.c;
  for (double& v : scaled.inputs.at("x").data) {
    const double w = v * s;
    if (ref::round_to(w, scaled.inputs.at("x").dtype) != w || w / s != v)
      RC_DISCARD("the scaling is not exact in the dtype");
    v = w;
  }
  ref::Case base = d.c;
  base.epsilon = d.c.epsilon / (s * s);  // exact: a power of two, far from the binary64 limits
  // var + eps must stay finite in the compute dtype on both sides (float16: eps 2^16 is beyond
  // its range; a kernel's q overflows to inf and rstd to 0, outside the tolerance model).
  if (std::max(base.epsilon, d.c.epsilon) > 0.25 * ref::max_finite(d.c.dtype_compute))
    RC_DISCARD("epsilon beyond the compute dtype's range after scaling");
  const Side l = run_side(ctx, scaled, d.family, fmt::format("{} x with eps {}", s, ref::hex_text(d.c.epsilon)));
  const Side r = run_side(ctx, base, d.family, fmt::format("x with eps {}", ref::hex_text(base.epsilon)));
  auto factor = [&](const std::string& n) { return n == "rstd" || n == "dx" ? s : n == "mean" ? 1 / s : 1.0; };
  relate(ctx, l, r, d.family, kAll, factor, nullptr, "scale invariance");
}

// Norm(-x) = -Norm(x) without bias: y and mean change sign, rstd does not; the Jacobian is even,
// so dx keeps its sign and dweight = sum dy x-hat changes it.
void sign_equivariance(Context& ctx) {
  CaseLimits lim = plain(ctx);
  lim.affines = {ref::Affine::none, ref::Affine::weight};
  auto d = draw_case(ctx.cand.info().caps, lim);
  ref::Case neg = d.c;
  for (double& v : neg.inputs.at("x").data) v = -v;
  const Side l = run_side(ctx, d.c, d.family, "x");
  const Side r = run_side(ctx, neg, d.family, "-x");
  auto factor = [](const std::string& n) { return n == "y" || n == "mean" || n == "dweight" ? -1.0 : 1.0; };
  relate(ctx, l, r, d.family, kAll, factor, nullptr, "sign equivariance");
}

// Permuting the normalized columns (x, residual, dy, and the parameters alike) permutes the
// outputs the same way; the statistics do not change.
void permutation_equivariance(Context& ctx) {
  CaseLimits lim = ctx.limits;
  lim.blocks = false;
  lim.general_axes = false;
  lim.nonfinite = false;
  auto d = draw_case(ctx.cand.info().caps, lim);
  const auto g = ref::geometry_of(d.c);
  const std::int64_t H = g.cols;
  if (H < 2) RC_DISCARD("rows of one element (two or more needed)");
  std::vector<std::int64_t> perm(static_cast<std::size_t>(H));
  const int kind = static_cast<int>(draw_index(3));
  const auto rot = 1 + static_cast<std::int64_t>(draw_index(static_cast<std::size_t>(H - 1)));
  std::uint64_t state = 1 + draw_index(std::size_t{1} << 30);
  for (std::int64_t j = 0; j < H; ++j)
    perm[static_cast<std::size_t>(j)] = kind == 0 ? H - 1 - j : kind == 1 ? (j + rot) % H : j;
  if (kind == 2)  // Fisher-Yates from a drawn seed (SplitMix64 steps)
    for (std::int64_t j = H - 1; j > 0; --j) {
      state += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      std::swap(perm[static_cast<std::size_t>(j)], perm[static_cast<std::size_t>(z % static_cast<std::uint64_t>(j + 1))]);
    }
  ref::Case p = d.c;
  for (auto& [name, t] : p.inputs) {
    const auto& src = d.c.inputs.at(name).data;
    if (t.data.size() % static_cast<std::size_t>(H) != 0) continue;
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      const auto row = static_cast<std::int64_t>(i) / H, j = static_cast<std::int64_t>(i) % H;
      t.data[i] = src[static_cast<std::size_t>(row * H + perm[static_cast<std::size_t>(j)])];
    }
  }
  const Side l = run_side(ctx, d.c, d.family, "x");
  const Side r = run_side(ctx, p, d.family, "x with permuted columns");
  auto map = [&](const std::string& n, std::int64_t i) -> std::int64_t {
    if (is_stat(n)) return i;
    return (i / H) * H + perm[static_cast<std::size_t>(i % H)];
  };
  relate(ctx, l, r, d.family, kAll, nullptr, map, "permutation equivariance");
}

// Each row of output `name` sums to zero exactly (LayerNorm's y with unit scale and no bias; dx
// of LayerNorm backward): the sum of the candidate's row may miss 0 by the row's allowances plus
// the long double summation's own error. Rows holding an element without a finite allowance
// (NaN allowed, an overflowed exact value) leave no finite sum to compare; agreement checks those.
void rows_sum_to_zero(Context& ctx, const DrawnCase& d, const ref::Geometry& g, const Side& s,
                      const std::string& name, const std::string& what) {
  const ref::Tensor& out = output_of(ctx, d.c, d.family, s.got, name, g.rows * g.cols);
  const auto& a = s.allow.at(name);
  for (std::int64_t r = 0; r < g.rows; ++r) {
    long double sum = 0, abs_sum = 0, slack = 0;
    bool skip = false;
    for (std::int64_t col = 0; col < g.cols; ++col) {
      const auto i = static_cast<std::size_t>(flat_index(g, name, r, col));
      if (std::isnan(a.abs[i]) || a.nan_ok[i] || std::isinf(a.abs[i]) || std::isinf(out.data[i])) skip = true;
      sum += out.data[i];
      abs_sum += std::fabs(out.data[i]);
      slack += a.abs[i];
    }
    if (skip) continue;
    slack += static_cast<long double>(g.cols) * 0x1p-63L * abs_sum;
    if (!(std::fabs(sum) <= slack))
      fail(ctx, d.c, d.family,
           fmt::format("{}: row {} of {} sums to {} ({}), beyond the allowance {:.6g} (the exact sum is 0)", what, r,
                       name, static_cast<double>(sum), ref::hex_text(static_cast<double>(sum)),
                       static_cast<double>(slack)),
           agreement_of(ctx, d.c, s.got), false);
  }
}

// LayerNorm with unit scale and no bias: the exact y of a row sums to zero (sum of (x - mean)).
void ln_sum_zero(Context& ctx) {
  auto d = draw_case(ctx.cand.info().caps, unit_forward(ctx, ref::Op::layernorm));
  const auto g = ref::geometry_of(d.c);
  const Side s = run_side(ctx, d.c, d.family, "x");
  rows_sum_to_zero(ctx, d, g, s, "y", "LayerNorm with unit weight, no bias");
}

// RMSNorm with unit scale and no bias: sum y^2 over a row = n ms / (ms + eps), ms the mean square
// of x (n when eps is negligible: unit RMS). |sum got^2 - sum exact^2| <= sum a (2|got| + a).
void rms_unit_rms(Context& ctx) {
  auto d = draw_case(ctx.cand.info().caps, unit_forward(ctx, ref::Op::rmsnorm));
  const auto g = ref::geometry_of(d.c);
  const Side s = run_side(ctx, d.c, d.family, "x");
  const ref::Tensor& y = output_of(ctx, d.c, d.family, s.got, "y", g.rows * g.cols);
  const ref::Tensor& x = d.c.inputs.at("x");
  const auto& a = s.allow.at("y");
  for (std::int64_t r = 0; r < g.rows; ++r) {
    long double sq = 0, xsq = 0, slack = 0;
    bool skip = false;
    for (std::int64_t col = 0; col < g.cols; ++col) {
      const auto i = static_cast<std::size_t>(flat_index(g, "y", r, col));
      if (std::isnan(a.abs[i]) || a.nan_ok[i]) skip = true;
      const long double v = y.data[i];
      sq += v * v;
      xsq += static_cast<long double>(x.data[i]) * x.data[i];
      slack += a.abs[i] * (2 * std::fabs(v) + a.abs[i]);
    }
    const long double n = static_cast<long double>(g.cols);
    const long double ms = xsq / n;
    const long double target = n * ms / (ms + static_cast<long double>(d.c.epsilon));
    if (skip || !std::isfinite(static_cast<double>(target))) continue;
    slack += (n + 4) * 0x1p-63L * (target + sq) * 2;
    if (!(std::fabs(sq - target) <= slack))
      fail(ctx, d.c, d.family,
           fmt::format("RMSNorm with unit weight, no bias: row {}: sum y^2 = {:.17g}, exact {:.17g} (n ms/(ms + eps)); "
                       "difference beyond the allowance {:.6g}",
                       r, static_cast<double>(sq), static_cast<double>(target), static_cast<double>(slack)),
           agreement_of(ctx, d.c, s.got), false);
  }
}

// Fused residual: on inputs whose h = alpha x + residual (+ residual_bias) is exact in every dtype
// involved (a grid they all hold), residual_out is h bit for bit, and y (mean, rstd) agree with
// the unfused norm of residual_out within both allowances.
void fused_residual(Context& ctx) {
  CaseLimits lim = plain(ctx);
  lim.residual = true;
  lim.residual_required = true;
  lim.directions = {ref::Direction::forward};
  auto d = draw_case(ctx.cand.info().caps, lim);
  ref::Case& c = d.c;
  const double alpha = c.alpha;
  if (!(alpha == 1 || alpha == 2 || alpha == 0.5)) RC_DISCARD("alpha is not 1, 2 or 1/2");
  double m = std::fabs(alpha) * max_abs(c.inputs.at("x")) + max_abs(c.inputs.at("residual"));
  if (c.inputs.count("residual_bias")) m += max_abs(c.inputs.at("residual_bias"));
  const double top = 4 * std::max(m, 1.0);
  double q = 0;
  for (ref::DType t : {c.dtype_x, c.dtype_residual, c.dtype_param, c.dtype_compute}) {
    if (!(top < ref::max_finite(t))) RC_DISCARD("h would overflow a dtype");
    q = std::max(q, conf::ulp_of(top, t));
  }
  quantize(c.inputs.at("x"), alpha < 1 ? 2 * q : q);
  quantize(c.inputs.at("residual"), q);
  if (c.inputs.count("residual_bias")) quantize(c.inputs.at("residual_bias"), q);
  const auto g = ref::geometry_of(c);
  const Side l = run_side(ctx, c, d.family, "the fused case");
  // h, exactly: every term and partial sum is a multiple of q below `top`.
  ref::Tensor h{c.dtype_residual, g.shape, std::vector<double>(c.inputs.at("x").data.size())};
  for (std::int64_t r = 0; r < g.rows; ++r)
    for (std::int64_t col = 0; col < g.cols; ++col) {
      const auto i = static_cast<std::size_t>(flat_index(g, "y", r, col));
      double v = alpha * c.inputs.at("x").data[i] + c.inputs.at("residual").data[i];
      if (c.inputs.count("residual_bias")) v += c.inputs.at("residual_bias").data[static_cast<std::size_t>(col)];
      h.data[i] = v;
    }
  const ref::Tensor& ro = output_of(ctx, c, d.family, l.got, "residual_out", static_cast<std::int64_t>(h.data.size()));
  for (std::size_t i = 0; i < h.data.size(); ++i)
    if (!same_bits(ro.data[i], h.data[i]))
      fail(ctx, c, d.family,
           fmt::format("fused residual: residual_out element {} is {}, but h = alpha x + residual{} is exactly {}", i,
                       value_text(ro.data[i], ro.dtype), c.inputs.count("residual_bias") ? " + residual_bias" : "",
                       value_text(h.data[i], h.dtype)),
           agreement_of(ctx, c, l.got), false);
  // The unfused composition: Norm(h), no residual, x = h in dtype_x (the grid makes h a value of
  // dtype_x too, so contracts that round at x-hat round to the same dtype as in the fused case).
  ref::Case u = c;
  u.residual = ref::Residual::none;
  u.alpha = 1;
  u.inputs.erase("residual");
  u.inputs.erase("residual_bias");
  h.dtype = c.dtype_x;
  u.inputs["x"] = h;
  for (const char* lowp : {"+fused_add_lowp", "fused_add_lowp+", "fused_add_lowp"})
    if (auto at = u.contract.find(lowp); at != std::string::npos) u.contract.erase(at, std::string(lowp).size());
  if (u.contract.empty()) u.contract = "exact";
  if (ctx.cand.declines(u)) return;
  const Side r = run_side(ctx, u, d.family, "the unfused norm of h");
  relate(ctx, l, r, d.family, {"y", "mean", "rstd"}, nullptr, nullptr, "fused vs unfused");
}

// LayerNorm backward: dx of a row sums to zero (dx = rstd (g - mean g - x-hat mean(g x-hat)),
// and x-hat sums to zero), whatever the weight.
void ln_backward_dx_sum_zero(Context& ctx) {
  CaseLimits lim = plain(ctx);
  lim.ops = {ref::Op::layernorm};
  lim.directions = {ref::Direction::backward};
  lim.contracts = false;
  auto d = draw_case(ctx.cand.info().caps, lim);
  const auto g = ref::geometry_of(d.c);
  const Side s = run_side(ctx, d.c, d.family, "x");
  rows_sum_to_zero(ctx, d, g, s, "dx", "LayerNorm backward");
}

// dbias = the column sums of dy over the rows, for LayerNorm and RMSNorm.
void dbias_is_column_sum(Context& ctx) {
  CaseLimits lim = plain(ctx);
  lim.directions = {ref::Direction::backward};
  lim.affines = {ref::Affine::weight_bias};
  auto d = draw_case(ctx.cand.info().caps, lim);
  const auto g = ref::geometry_of(d.c);
  const Side s = run_side(ctx, d.c, d.family, "x");
  const ref::Tensor& db = output_of(ctx, d.c, d.family, s.got, "dbias", g.cols);
  const ref::Tensor& dy = d.c.inputs.at("dy");
  const auto& a = s.allow.at("dbias");
  for (std::int64_t col = 0; col < g.cols; ++col) {
    long double sum = 0, abs_sum = 0;
    for (std::int64_t r = 0; r < g.rows; ++r) {
      const double v = dy.data[static_cast<std::size_t>(flat_index(g, "dx", r, col))];
      sum += v;
      abs_sum += std::fabs(v);
    }
    const auto i = static_cast<std::size_t>(col);
    if (std::isnan(a.abs[i])) continue;
    const long double slack = a.abs[i] + static_cast<long double>(g.rows) * 0x1p-63L * abs_sum;
    if (!(std::fabs(db.data[i] - sum) <= slack))
      fail(ctx, d.c, d.family,
           fmt::format("dbias column {} is {}, but the column sum of dy is {:.17g}: difference beyond the allowance "
                       "{:.6g}",
                       col, value_text(db.data[i], db.dtype), static_cast<double>(sum), static_cast<double>(slack)),
           agreement_of(ctx, d.c, s.got), false);
  }
}

}  // namespace

std::vector<Property> metamorphic_properties() {
  return {
      {"shift_invariance", "LayerNorm: x + c (exact) leaves y, rstd and the gradients unchanged within tolerance",
       shift_invariance},
      {"scale_invariance", "Norm(s x, eps) = Norm(x, eps/s^2) for s a power of two, within tolerance",
       scale_invariance},
      {"sign_equivariance", "Norm(-x) = -Norm(x) without bias, within tolerance", sign_equivariance},
      {"permutation_equivariance", "permuting the normalized columns permutes the outputs, within tolerance",
       permutation_equivariance},
      {"ln_sum_zero", "LayerNorm with unit weight and no bias: each row of y sums to zero within tolerance",
       ln_sum_zero},
      {"rms_unit_rms", "RMSNorm with unit weight and no bias: sum y^2 = n ms/(ms + eps) within tolerance",
       rms_unit_rms},
      {"fused_residual",
       "residual_out is alpha x + residual (+ bias) bit for bit where that is exact; y agrees with the unfused norm",
       fused_residual},
      {"ln_backward_dx_sum_zero", "LayerNorm backward: each row of dx sums to zero within tolerance",
       ln_backward_dx_sum_zero},
      {"dbias_is_column_sum", "backward: dbias equals the column sums of dy within tolerance", dbias_is_column_sum},
  };
}

}  // namespace normcheck::prop
