#include "panel.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "normcheck/judge/faults.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/contract.hpp"

namespace normcheck::conf::diag {

namespace {

std::vector<Variant> one(Knobs k) { return {Variant{std::move(k), {}}}; }

bool has_output(const Ctx& x, const char* name) { return x.fc.expected.count(name) > 0; }

// Epsilon implied by the candidate's outputs: per row 1/rstd^2 - var, with rstd from the rstd
// output or fitted to y by least squares (y - bias)/scale = rstd (h - mean). The row where eps
// weighs most against the variance decides; the fit and its 1- and 2-digit roundings are tried.
std::vector<double> fit_epsilon(const Ctx& x) {
  if (x.c.direction != ref::Direction::forward || x.c.block != ref::Block::none) return {};
  const auto& g = x.g;
  const std::int64_t n = g.cols;
  const bool centre = x.c.op == ref::Op::layernorm;
  const auto* w = x.c.affine != ref::Affine::none ? input(x.c, "weight") : nullptr;
  const auto* b = x.c.affine == ref::Affine::weight_bias ? input(x.c, "bias") : nullptr;
  const auto* r = x.c.residual != ref::Residual::none ? input(x.c, "residual") : nullptr;
  const auto* rb = x.c.residual == ref::Residual::add_bias ? input(x.c, "residual_bias") : nullptr;
  const auto* xin = input(x.c, "x");
  const auto ry = x.got.find("y");
  const auto rr = x.got.find("rstd");
  const bool have_y = ry != x.got.end() && ry->second.data.size() == xin->data.size();
  const bool have_r = rr != x.got.end() && rr->second.data.size() == static_cast<std::size_t>(g.rows);
  std::vector<double> out;
  for (int source = 0; source < 2; ++source) {
    if ((source == 0 && !have_r) || (source == 1 && !have_y)) continue;
    double best_eps = kNaN, best_weight = -1;
    std::vector<Wide> h(n);
    for (std::int64_t row : x.rows) {
      Wide mean = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const auto i = static_cast<std::size_t>(g.row_base[row] + g.col_delta[j]);
        h[j] =
            static_cast<Wide>(x.c.alpha) * xin->data[i] + (r ? r->data[i] : 0.0) + (rb ? rb->data[j] : 0.0);
        mean += h[j];
      }
      mean = centre ? mean / n : 0;
      Wide var = 0;
      for (std::int64_t j = 0; j < n; ++j) var += (h[j] - mean) * (h[j] - mean);
      var /= n;
      Wide rstd;
      if (source == 0) {
        rstd = rr->second.data[row];
      } else {
        Wide num = 0, den = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          const auto i = static_cast<std::size_t>(g.row_base[row] + g.col_delta[j]);
          const Wide scale = w ? x.c.weight_offset + w->data[j] : 1.0L;
          if (scale == 0) continue;
          const Wide t = (ry->second.data[i] - (b ? b->data[j] : 0.0)) / scale;
          num += t * (h[j] - mean);
          den += (h[j] - mean) * (h[j] - mean);
        }
        if (den == 0) continue;
        rstd = num / den;
      }
      if (!std::isfinite(static_cast<double>(rstd)) || rstd <= 0) continue;
      const Wide eps = 1.0L / (rstd * rstd) - var;
      // How much eps weighs in q = var + eps: rows where it dominates decide.
      const Wide weight = eps / (var + std::fabs(eps));
      if (std::isfinite(static_cast<double>(eps)) && weight > best_weight) {
        best_weight = static_cast<double>(weight);
        best_eps = static_cast<double>(eps);
      }
    }
    if (!(best_eps > 0)) continue;
    out.push_back(best_eps);
    for (int digits : {1, 2}) {
      const double unit = std::pow(10.0, std::floor(std::log10(best_eps)) - (digits - 1));
      out.push_back(std::round(best_eps / unit) * unit);
    }
  }
  std::vector<double> uniq;
  for (double e : out)
    if (e != x.c.epsilon && std::fabs(e - x.c.epsilon) > 1e-3 * x.c.epsilon &&
        std::find(uniq.begin(), uniq.end(), e) == uniq.end())
      uniq.push_back(e);
  return uniq;
}

// Rows from K on that the candidate left unwritten (all 0, or all NaN): K and the value.
std::optional<std::pair<std::int64_t, double>> unwritten_rows(const Ctx& x) {
  const char* name = x.c.direction == ref::Direction::forward ? "y" : "dx";
  const auto it = x.got.find(name);
  if (it == x.got.end() || it->second.data.size() != input(x.c, "x")->data.size()) return std::nullopt;
  const auto& v = it->second.data;
  std::int64_t k = x.g.rows;
  std::optional<bool> nan_fill;
  for (std::int64_t row = x.g.rows; row-- > 0;) {
    bool zero = true, nan = true;
    for (std::int64_t j = 0; j < x.g.cols; ++j) {
      const double e = v[static_cast<std::size_t>(x.g.row_base[row] + x.g.col_delta[j])];
      zero &= e == 0;
      nan &= std::isnan(e);
    }
    if (!zero && !nan) break;
    if (nan_fill && *nan_fill != nan) break;
    nan_fill = nan;
    k = row;
  }
  if (k == x.g.rows || k == 0) return std::nullopt;
  return std::make_pair(k, *nan_fill ? kNaN : 0.0);
}

using K = Knobs;

// ---- the conditions under which a dialect applies ----------------------------------------------

// A row applies when every condition of its `when` holds for the case (0: always).
enum When : std::uint32_t {
  centred = 1u << 0,           // the statistics subtract the mean (LayerNorm, or the spec's centring)
  is_rmsnorm = 1u << 1,
  is_layernorm = 1u << 2,
  affine = 1u << 3,            // a weight
  weight_and_bias = 1u << 4,
  residual = 1u << 5,          // a fused residual add
  residual_bias = 1u << 6,     // add_bias
  forward = 1u << 7,
  backward = 1u << 8,
  rstd_output = 1u << 9,       // the case has an rstd output
  residual_output = 1u << 10,  // the case has a residual_out output
  alpha_not_1 = 1u << 11,
  offset = 1u << 12,           // weight_offset != 0
  no_offset = 1u << 13,
  eps_not_0 = 1u << 14,
  no_block = 1u << 15,
  pre_block = 1u << 16,
  post_block = 1u << 17,
  deepnorm_block = 1u << 18,
  computes_f64 = 1u << 19,     // dtype_compute is float64
  x_narrower = 1u << 20,       // x's dtype is narrower than the compute dtype (float16 x, float32 statistics)
};

bool holds(std::uint32_t when, const Ctx& x) {
  const auto& c = x.c;
  const std::pair<When, bool> tests[] = {
      {centred, x.spec.centre},
      {is_rmsnorm, c.op == ref::Op::rmsnorm},
      {is_layernorm, c.op == ref::Op::layernorm},
      {affine, c.affine != ref::Affine::none},
      {weight_and_bias, c.affine == ref::Affine::weight_bias},
      {residual, c.residual != ref::Residual::none},
      {residual_bias, c.residual == ref::Residual::add_bias},
      {forward, c.direction == ref::Direction::forward},
      {backward, c.direction == ref::Direction::backward},
      {rstd_output, has_output(x, "rstd")},
      {residual_output, has_output(x, "residual_out")},
      {alpha_not_1, c.alpha != 1},
      {offset, c.weight_offset != 0},
      {no_offset, c.weight_offset == 0},
      {eps_not_0, c.epsilon != 0},
      {no_block, c.block == ref::Block::none},
      {pre_block, c.block == ref::Block::pre},
      {post_block, c.block == ref::Block::post},
      {deepnorm_block, c.block == ref::Block::deepnorm},
      {computes_f64, c.dtype_compute == DType::float64},
      {x_narrower, ref::format_of(c.dtype_x).precision < ref::format_of(c.dtype_compute).precision},
  };
  for (auto [bit, ok] : tests)
    if ((when & bit) && !ok) return false;
  return true;
}

// ---- the dialects whose variants are fitted or enumerated -------------------------------------

// eps rounded to float16, where that changes it and is not 0 (0 is eps_missing).
std::vector<Variant> eps_fp16_variants(const Ctx& x) {
  const double e = ref::round_to(x.c.epsilon, DType::float16);
  if (e == x.c.epsilon || e == 0) return {};
  K k = x.spec;
  k.eps = e;
  return {Variant{k, {{"epsilon", e}}}};
}

// eps fitted from the outputs; backward, or with nothing to fit, the values models are
// configured with.
std::vector<Variant> eps_other_value_variants(const Ctx& x) {
  std::vector<Variant> out;
  std::vector<double> values = fit_epsilon(x);
  if (values.empty())
    for (double e : {1e-12, 1e-8, 1e-6, 1e-5, 1e-3})
      if (e != x.c.epsilon) values.push_back(e);
  for (double e : values) {
    K k = x.spec;
    k.eps = e;
    out.push_back(Variant{k, {{"epsilon", e}}});
  }
  return out;
}

// A one-pass variance in T, its sums in each order kernels use (Knobs::sum_lanes): sequential
// (CPU loops), pairwise (recursive halves), numpy's (float32: blocks of 128 in 8 strided
// partial sums, halves above; numpy_sums), and P strided lanes folded in halves (GPU
// shared-memory trees, P = 32 .. 1024; a tree of P >= N lanes sums as one of bit_ceil(N)).
// The dialect explains a one-pass kernel of any of these orders, and is scored by the best. The
// lane trees only in float32 (what GPU kernels accumulate in; each order is one more run of the
// screen): float16 and float64 one-pass sums are sequential or pairwise. Each order twice: the
// variance as it comes, and clamped at 0 (max(var, 0)); where it cancels below 0 the two differ,
// a NaN rstd against 1/sqrt(eps).
template <DType T>
std::vector<Variant> one_pass_variants(const Ctx& x) {
  std::vector<Variant> out;
  std::vector<std::int64_t> orders = {0, -1};
  if (T == DType::float32) orders.push_back(kNumpySums);  // numpy float32 kernels (sums in float32)
  const auto widest =
      static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(std::max<std::int64_t>(x.g.cols, 1))));
  for (std::int64_t p = 32; T == DType::float32 && p <= 1024; p *= 2)
    if (std::find(orders.begin(), orders.end(), std::min(p, widest)) == orders.end()) orders.push_back(std::min(p, widest));
  for (bool clamp : {false, true})
    for (std::int64_t o : orders) {
      K k = x.spec;
      k.arith = StatArith::one_pass;
      k.arith_dtype = T;
      k.sum_lanes = o;
      k.clamp_var = clamp;
      std::map<std::string, double> p;
      if (o > 0) p["lanes"] = static_cast<double>(o);
      if (o == kNumpySums) p["numpy order"] = 1;
      if (clamp) p["variance floor"] = 0;  // max(var, 0)
      out.push_back(Variant{k, std::move(p)});
    }
  return out;
}

// The statistics over other dims than the case's, where those differ from its own.
std::vector<Variant> stats_over(const Ctx& x, std::vector<std::int64_t> d) {
  if (d == x.g.norm_dims) return {};
  K k = x.spec;
  k.stat_dims = std::move(d);
  return one(k);
}

std::vector<Variant> stats_all_but_batch_variants(const Ctx& x) {
  const auto rank = static_cast<std::int64_t>(x.g.shape.size());
  if (rank < 3) return {};
  std::vector<std::int64_t> d;
  for (std::int64_t i = 1; i < rank; ++i) d.push_back(i);
  return stats_over(x, std::move(d));
}

std::vector<Variant> stats_last_dim_only_variants(const Ctx& x) {
  return stats_over(x, {static_cast<std::int64_t>(x.g.shape.size()) - 1});
}

// Each rounding point of the case's contract left out in turn.
std::vector<Variant> contract_point_skipped_variants(const Ctx& x) {
  std::vector<Variant> out;
  for (int p = 0; p < 4; ++p) {
    K k = x.spec;
    std::optional<DType>* slot[] = {&k.pts.h, &k.pts.xhat, &k.pts.scale, &k.pts.mul};
    if (!*slot[p]) continue;
    *slot[p] = std::nullopt;
    static constexpr const char* kPoint[] = {"h", "xhat", "scale", "mul"};
    out.push_back(Variant{k, {}, fmt::format("the contract's {} rounding skipped", kPoint[p])});
  }
  return out;
}

// The rounding points of each built-in contract for the case's dtypes.
std::vector<Variant> other_contract_variants(const Ctx& x) {
  std::vector<Variant> out;
  for (std::size_t ci = 0; ci < ref::builtin_contracts().size(); ++ci) {
    ref::Case cc;
    cc.contract = ref::builtin_contracts()[ci].name;
    cc.dtype_x = x.c.dtype_x;
    cc.dtype_param = x.c.dtype_param;
    cc.dtype_out = x.c.dtype_out;
    cc.dtype_compute = x.c.dtype_compute;
    cc.dtype_residual = x.c.dtype_residual;
    K k = x.spec;
    k.pts = ref::resolve_points(cc);
    out.push_back(Variant{k, {}, fmt::format("contract '{}' instead of '{}'", cc.contract, x.c.contract)});
  }
  return out;
}

// rstd rounded to T before the multiply; the rstd output holds the rounded value or the one
// before it (both variants).
template <DType T>
std::vector<Variant> rstd_rounded_variants(const Ctx& x) {
  std::vector<Variant> out;
  for (bool unrounded : {false, true}) {
    K k = x.spec;
    k.rstd_round = T;
    k.rstd_out_unrounded = unrounded;
    out.push_back(Variant{k, {}});
  }
  return out;
}

// Rows from the first unwritten one on not computed (fitted: the outputs say which).
std::vector<Variant> rows_not_computed_variants(const Ctx& x) {
  const auto u = unwritten_rows(x);
  if (!u) return {};
  K k = x.spec;
  k.rows_limit = u->first;
  k.unwritten = u->second;
  return {Variant{k, {{"first_row_not_computed", static_cast<double>(u->first)}}}};
}

// The k < rows whose column sums the candidate's dweight and dbias are, fitted: the float64
// prefix sums over the rows of the spec's terms (dy x-hat, dy) match every column of both within
// what a floating-point sum of k terms can err, 8 u sqrt(k) times the largest partial sum (u of
// float32, or of a coarser compute dtype), and the full sums do not. None with a residual (its
// h is not modelled here), one column (a one-dimensional path of prefix sums passes near any
// value), non-finite outputs, or beyond 2^27 elements (one pass over the case is the cost).
std::optional<std::int64_t> fitted_colsum_rows(const Ctx& x) {
  const std::int64_t rows = x.g.rows, n = x.g.cols;
  const ref::Tensor* xt = input(x.c, "x");
  const ref::Tensor* dy = input(x.c, "dy");
  if (!xt || !dy || x.c.residual != ref::Residual::none || n < 2 || rows < 2 || rows * n > (std::int64_t{1} << 27))
    return std::nullopt;
  std::vector<std::pair<bool, const std::vector<double>*>> sums;  // (terms dy x-hat, got)
  for (const auto& [name, of_xhat] : {std::pair{"dweight", true}, std::pair{"dbias", false}}) {
    const auto it = x.got.find(name);
    if (it == x.got.end()) continue;
    if (it->second.data.size() != static_cast<std::size_t>(n)) return std::nullopt;
    for (double v : it->second.data)
      if (!std::isfinite(v)) return std::nullopt;
    sums.emplace_back(of_xhat, &it->second.data);
  }
  if (sums.empty()) return std::nullopt;
  const long double u = std::max(ref::unit_roundoff(DType::float32), ref::unit_roundoff(x.c.dtype_compute));
  const std::size_t S = sums.size(), N = static_cast<std::size_t>(n);
  std::vector<long double> prefix(S * N, 0), largest(S * N, 0), xh(N);
  std::optional<std::int64_t> best;
  long double best_ratio = 1;  // a fit must be within the bound: ratio <= 1
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto at = [&](std::int64_t j) { return static_cast<std::size_t>(x.g.row_base[r] + x.g.col_delta[j]); };
    long double mean = 0, var = 0;
    for (std::int64_t j = 0; x.spec.centre && j < n; ++j) mean += xt->data[at(j)];
    mean /= static_cast<long double>(n);
    for (std::size_t j = 0; j < N; ++j) {
      xh[j] = xt->data[at(static_cast<std::int64_t>(j))] - mean;  // scaled by rstd below
      var += xh[j] * xh[j];
    }
    const long double rstd = 1 / std::sqrt(var / static_cast<long double>(n) + static_cast<long double>(x.c.epsilon));
    for (auto& v : xh) v *= rstd;
    const std::int64_t k = r + 1;
    const long double slack = 8 * u * std::sqrt(static_cast<long double>(k));  // times the largest partial sum
    long double ratio = 0;
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t j = 0; j < N; ++j) {
        const long double d = dy->data[at(static_cast<std::int64_t>(j))];
        const long double t = sums[s].first ? d * xh[j] : d;
        long double& p = prefix[s * N + j];
        p += t;
        long double& m = largest[s * N + j];
        m = std::max({m, std::fabs(p), std::fabs(t)});
        const long double bound = slack * m;
        const long double err = std::fabs(p - (*sums[s].second)[j]);
        ratio = std::max(ratio, bound > 0 ? err / bound : (err > 0 ? kInf : 0));
      }
    if (k == rows) return ratio <= 1 ? std::nullopt : best;  // the full sums fit: no fault of this kind
    if (ratio <= best_ratio) {
      best_ratio = ratio;
      best = k;
    }
  }
  return std::nullopt;
}

// dweight/dbias summed over the rows of one launch grid only: limits of grids and blocks that
// real column-sum kernels have (1024 threads, 65535 blocks), each below the case's row count;
// and the number of rows the outputs say were summed (fitted, above), where that is another.
std::vector<Variant> colsum_rows_variants(const Ctx& x) {
  std::vector<Variant> out;
  for (std::int64_t limit : {256, 1024, 4096, 65535}) {
    if (limit >= x.g.rows) break;
    K k = x.spec;
    k.colsum_rows = limit;
    out.push_back(Variant{k, {{"rows_summed", static_cast<double>(limit)}}});
  }
  if (const auto fit = fitted_colsum_rows(x);
      fit && std::none_of(out.begin(), out.end(), [&](const Variant& v) { return v.k.colsum_rows == *fit; })) {
    K k = x.spec;
    k.colsum_rows = *fit;
    out.push_back(Variant{k, {{"rows_summed", static_cast<double>(*fit)}}});
  }
  return out;
}

// The column sums the candidate left at 0 where the certified ones are not (fitted).
std::vector<Variant> columns_dropped_variants(const Ctx& x) {
  K k = x.spec;
  double dropped = 0;
  for (const char* name : {"dweight", "dbias", "dresidual_bias"}) {
    const auto e = x.fc.expected.find(name);
    const auto gt = x.got.find(name);
    if (e == x.fc.expected.end() || gt == x.got.end() || gt->second.data.size() != e->second.f64.size())
      continue;
    std::vector<std::uint8_t> mask(e->second.f64.size(), 0);
    bool any = false;
    for (std::size_t j = 0; j < mask.size(); ++j)
      if (gt->second.data[j] == 0 && e->second.f64[j] != 0) {
        mask[j] = 1;
        any = true;
        dropped += 1;
      }
    if (any) k.zero_cols[name] = std::move(mask);
  }
  if (k.zero_cols.empty()) return {};
  return {Variant{k, {{"columns_dropped", dropped}}}};
}


// y converted to float16 by truncation (round toward zero) instead of to nearest even. The
// kernel's value before the conversion is within e of the certified y = v (e: the pre-rounding
// error bound, the allowance of the same case with a float64 y, under `any`: any correct
// kernel's), and truncation is monotone, so its float16 output is one of the float16 values in
// [RZ(v - e), RZ(v + e)]: an interval prediction. Where v lies within e of a float16 value, the
// kernel's value may fall on either side of it and truncate a whole ulp apart: both are
// predicted, not only RZ(v). Where v is farther than e from every float16 value, the interval
// is the one value RZ(v), which a correctly rounded y misses wherever it rounds away from zero.
// A contract that rounds to the output dtype before the output is not modelled (no prediction).
std::vector<Variant> output_truncated_variants(const Ctx& x) {
  if (x.c.dtype_out != DType::float16) return {};
  const auto y = x.fc.expected.find("y");
  if (y == x.fc.expected.end()) return {};
  ref::Case wide = x.c;
  wide.dtype_out = DType::float64;
  const auto a = ref::resolve_points(x.c), b = ref::resolve_points(wide);
  if (a.h != b.h || a.xhat != b.xhat || a.scale != b.scale || a.mul != b.mul) return {};
  const auto allow = derive_allowances(wide);
  const auto it = allow.find("y");
  const auto& v = y->second.f64;
  if (it == allow.end() || it->second.abs.size() != v.size()) return {};
  const auto& e = it->second.abs;
  auto iv = std::make_shared<OutputInterval>();
  iv->grid = DType::float16;
  iv->shift.assign(v.size(), 0.0);
  iv->half.assign(v.size(), 0.0);
  const double n = static_cast<double>(x.g.cols);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) continue;  // NaN and infinities are kept as they are
    if (!(e[i] >= 0) || std::isinf(e[i])) {
      iv->half[i] = kInf;  // MISTRUSTED: not scored
      continue;
    }
    // Beyond e: our binary64 error of the certified value (as TOLERANCE.md 9.3's slack), and of
    // the prediction's own arithmetic.
    const double m = std::ldexp(std::fabs(v[i]) * (n + 8), -50);
    const double lo = ref::round_toward_zero(v[i] - e[i] - m, DType::float16);
    const double hi = ref::round_toward_zero(v[i] + e[i] + m, DType::float16);
    iv->shift[i] = (lo + hi) / 2 - v[i];
    iv->half[i] = (hi - lo) / 2 + m + std::ldexp(std::fabs(lo) + std::fabs(hi), -50);
  }
  K k = x.spec;
  k.y_interval = std::move(iv);
  return one(std::move(k));
}

// ---- the panel ---------------------------------------------------------------------------------

using Change = void (*)(K&, const Ctx&);
using Parameters = std::map<std::string, double> (*)(const Ctx&);
using Variants = std::vector<Variant> (*)(const Ctx&);

// One dialect. A simple one changes its knobs (`change`) where `when` holds, and may report
// parameters it derives from the case; a fitted or enumerated one gives its variants itself
// (`variants`, after `when`). Its class is its fault's, from the catalogue.
struct Row {
  const char* name;
  const char* fault;  // the catalogue's id
  std::uint32_t when;
  const char* title;
  Change change = nullptr;
  Parameters parameters = nullptr;
  Variants variants = nullptr;
};

// In panel order: the order names merged dialects (the earliest names the group). By class A-G,
// the residual-block placements after F; a new dialect is a row (and, where the model lacks its
// knob, a knob in fault_model.hpp).
const Row kRows[] = {
    // A. Epsilon
    {"eps_outside_sqrt", "eps_outside_sqrt", 0, "eps added outside the sqrt: 1/(sigma + eps)",
     [](K& k, const Ctx&) { k.eps_place = EpsPlace::outside_sqrt; }},
    {"eps_missing", "eps_dropped", eps_not_0, "eps left out (0)", [](K& k, const Ctx&) { k.eps = 0; }},
    {"eps_in_count", "eps_in_denominator", 0, "eps added to the count: rsqrt(sum / (N + eps))",
     [](K& k, const Ctx&) { k.eps_place = EpsPlace::in_count; }},
    {"eps_fp16", "eps_fp16", 0, "eps rounded to float16 before use", nullptr, nullptr, eps_fp16_variants},
    {"eps_other_value", "eps_hardcoded", 0, "another eps value than the case's (fitted from the outputs)", nullptr,
     nullptr, eps_other_value_variants},
    // B. Variance and reductions
    {"unbiased_variance", "unbiased_variance", centred, "unbiased variance: sum((h - mean)^2) / (N - 1)",
     [](K& k, const Ctx&) { k.unbiased = true; }},
    {"eps_outside_sqrt_unbiased", "eps_outside_sqrt_unbiased", centred,
     "eps outside the sqrt of the unbiased (N-1) variance: 1/(s + eps)",
     [](K& k, const Ctx&) {
       k.eps_place = EpsPlace::outside_sqrt;
       k.unbiased = true;
     }},
    {"one_pass_variance_fp32", "one_pass_variance", centred, "one-pass variance E[h^2] - E[h]^2 in float32",
     nullptr, nullptr, one_pass_variants<DType::float32>},
    {"one_pass_variance_fp16", "one_pass_variance", centred, "one-pass variance E[h^2] - E[h]^2 in float16",
     nullptr, nullptr, one_pass_variants<DType::float16>},
    // In float64 only where the case computes in float64 (elsewhere it is the float32 one's
    // cancellation, far smaller).
    {"one_pass_variance_fp64", "one_pass_variance", centred | computes_f64,
     "one-pass variance E[h^2] - E[h]^2 in float64", nullptr, nullptr, one_pass_variants<DType::float64>},
    {"low_precision_accumulation_fp16", "fp16_accumulation", 0, "row sums accumulated in float16",
     [](K& k, const Ctx&) { k.arith = StatArith::accumulate; k.arith_dtype = DType::float16; }},
    {"low_precision_accumulation_bf16", "bf16_accumulation", 0, "row sums accumulated in bfloat16",
     [](K& k, const Ctx&) { k.arith = StatArith::accumulate; k.arith_dtype = DType::bfloat16; }},
    {"padding_lanes", "padding_lanes", centred,
     "padding lanes counted: variance over the next power of two lanes, zeros loaded",
     [](K& k, const Ctx&) { k.pad_lanes = true; },
     [](const Ctx& x) {
       return std::map<std::string, double>{
           {"lanes", static_cast<double>(std::bit_ceil(static_cast<std::uint64_t>(x.g.cols)))}};
     }},
    {"stats_merged_equal_weights", "welford_merge", 0,
     "parallel statistics merged wrongly: two half-row partials merged with equal weights",
     [](K& k, const Ctx&) { k.arith = StatArith::merge_halves; }},
    {"rstd_holds_std", "rstd_holds_std", rstd_output, "rstd output holds the standard deviation sqrt(var + eps)",
     [](K& k, const Ctx&) { k.rstd_out = RstdOut::std_dev; }},
    {"rstd_holds_variance", "rstd_holds_variance", rstd_output, "rstd output holds the variance",
     [](K& k, const Ctx&) { k.rstd_out = RstdOut::variance; }},
    // C. Axis and shape
    {"stats_all_but_batch", "wrong_axis", 0,
     "statistics over every dim but the first (normalized_shape as 'all but batch')", nullptr, nullptr,
     stats_all_but_batch_variants},
    {"stats_last_dim_only", "last_dim_only", 0, "statistics over the last dim only (axis not honoured)", nullptr,
     nullptr, stats_last_dim_only_variants},
    {"rms_centred", "rms_centred", is_rmsnorm, "RMSNorm computed with mean centring (a LayerNorm)",
     [](K& k, const Ctx&) { k.centre = true; }},
    {"layernorm_uncentred", "layernorm_uncentred", is_layernorm,
     "LayerNorm computed without mean centring (an RMSNorm)", [](K& k, const Ctx&) { k.centre = false; }},
    {"weight_not_broadcast", "weight_not_broadcast", affine,
     "weight/bias laid along x's memory order instead of broadcast over the normalized dims",
     [](K& k, const Ctx&) { k.weight_flat_index = true; }},
    // D. Mixed precision
    {"contract_point_skipped", "contract_point_skipped", 0, "a rounding point of the contract skipped", nullptr,
     nullptr, contract_point_skipped_variants},
    {"other_contract", "other_contract", 0, "another precision contract (rounding points)", nullptr, nullptr,
     other_contract_variants},
    {"scale_rounded_to_param", "offset_in_param_dtype", affine,
     "offset + weight rounded to the weight dtype before the multiply",
     [](K& k, const Ctx& x) { k.pts.scale = x.c.dtype_param; }},
    {"rstd_rounded_bf16", "rstd_bf16", 0, "rstd rounded to bfloat16 before the multiply", nullptr, nullptr,
     rstd_rounded_variants<DType::bfloat16>},
    {"rstd_rounded_fp16", "rstd_fp16", 0, "rstd rounded to float16 before the multiply", nullptr, nullptr,
     rstd_rounded_variants<DType::float16>},
    {"output_truncated_fp16", "fp16_output_truncated", forward | no_block,
     "float16 y truncated toward zero instead of rounded to nearest even", nullptr, nullptr,
     output_truncated_variants},
    {"stats_saved_in_x_dtype", "stats_saved_in_x_dtype", x_narrower | no_block,
     "mean and rstd saved in x's dtype (the returned statistics, and those the backward reads)",
     [](K& k, const Ctx& x) { k.saved_stats = x.c.dtype_x; }},
    // E. Residual and placement
    {"residual_not_added", "residual_not_added", residual, "residual not added before the norm",
     [](K& k, const Ctx&) { k.res = ResMode::not_added; }},
    {"residual_after_norm", "residual_after_norm", residual | forward,
     "residual added after the norm: y = Norm(x) + residual", [](K& k, const Ctx&) { k.res = ResMode::after_norm; }},
    {"alpha_on_residual", "alpha_on_residual", residual | alpha_not_1,
     "alpha applied to the residual instead of x: h = x + alpha residual",
     [](K& k, const Ctx&) { k.res = ResMode::alpha_on_residual; }},
    {"h_rounded_to_input_dtype", "fused_add_rounds_h", residual,
     "h = x + residual rounded to the input dtype before the statistics",
     [](K& k, const Ctx&) { k.h_round_x = true; }},
    {"residual_out_missing_bias", "residual_out_missing_bias", residual_bias | residual_output,
     "residual_out written without residual_bias", [](K& k, const Ctx&) { k.res_out = ResOut::missing_bias; }},
    {"residual_out_holds_y", "residual_out_holds_y", residual_output,
     "residual_out overwritten with the norm's output y", [](K& k, const Ctx&) { k.res_out = ResOut::holds_y; }},
    {"residual_out_holds_xhat", "residual_out_overwritten", residual_output,
     "residual_out overwritten with x-hat (normalized in place)",
     [](K& k, const Ctx&) { k.res_out = ResOut::holds_xhat; }},
    // F. Parameters (checkpoint conventions)
    {"weight_missing", "weight_missing", affine, "weight not applied",
     [](K& k, const Ctx&) { k.weight = WeightMode::missing; }},
    {"bias_missing", "bias_missing", weight_and_bias, "bias not added",
     [](K& k, const Ctx&) { k.bias_missing = true; }},
    {"weight_bias_swapped", "weight_bias_swapped", weight_and_bias, "weight and bias swapped",
     [](K& k, const Ctx&) { k.weight = WeightMode::swapped; }},
    {"weight_and_bias_missing", "affine_reinitialized", weight_and_bias, "neither weight nor bias applied",
     [](K& k, const Ctx&) { k.weight = WeightMode::missing;
       k.bias_missing = true; }},
    {"bias_before_weight", "bias_before_weight", weight_and_bias,
     "bias added before the weight multiply: (x-hat + bias) * weight",
     [](K& k, const Ctx&) { k.weight = WeightMode::bias_first; }},
    {"offset_missing", "offset_missing", affine | offset, "weight offset (1 + w) left out",
     [](K& k, const Ctx&) { k.offset = 0; }},
    {"offset_doubled", "offset_doubled", affine | offset, "weight offset applied twice (scale offset + offset + w)",
     [](K& k, const Ctx& x) { k.offset = 2 * x.c.weight_offset; }},
    {"offset_spurious", "offset_spurious", affine | no_offset,
     "a weight offset 1 + w applied to weights that hold the scale", [](K& k, const Ctx&) { k.offset = 1; }},
    // E. Placement in residual blocks
    {"block_pre_residual_after_norm", "pre_ln_residual_after_norm", pre_block,
     "Pre-LN residual taken after the norm: u' = Norm(u) + F(Norm(u))",
     [](K& k, const Ctx&) { k.block = BlockMode::pre_residual_after_norm; }},
    {"block_deepnorm_alpha_on_f", "deepnorm_alpha_on_f", deepnorm_block | alpha_not_1,
     "DeepNorm alpha applied to the sublayer: Norm(u + alpha F(u))",
     [](K& k, const Ctx&) { k.block = BlockMode::deepnorm_alpha_on_f; }},
    {"block_post_double_norm", "post_ln_double_norm", post_block,
     "Post-LN output normalized again by an extra (non-affine) norm",
     [](K& k, const Ctx&) { k.block = BlockMode::post_double_norm; }},
    // G. Backward and launch limits
    {"rows_not_computed", "rows_beyond_grid_limit", 0, "rows from a limit on never computed (launch grid limit)",
     nullptr, nullptr, rows_not_computed_variants},
    {"dx_without_mean_term", "dx_without_mean_term", backward | centred, "dx without the mean(g) term",
     [](K& k, const Ctx&) { k.dx = DxMode::no_mean; }},
    {"dx_without_projection_term", "dx_without_projection_term", backward,
     "dx without the x-hat * mean(g x-hat) term", [](K& k, const Ctx&) { k.dx = DxMode::no_projection; }},
    {"column_sums_bf16", "dweight_bf16_reduction", backward | affine, "dweight/dbias reduced in bfloat16",
     [](K& k, const Ctx&) { k.colsum = ColSum::bf16_interval; }},
    {"column_sums_first_rows", "dweight_first_rows_only", backward | affine | no_block,
     "dweight/dbias summed over the first rows only (a launch grid limit)", nullptr, nullptr, colsum_rows_variants},
    {"column_sums_columns_dropped", "dweight_warp_width", backward,
     "dweight/dbias of some columns never reduced (left 0)", nullptr, nullptr, columns_dropped_variants},
    {"dweight_wrong_lane_params", "dgamma_wrong_index", backward | affine | no_block,
     "dweight's x-hat rebuilt from y with the weight/bias of the row's tile lane (DeepSpeed #692)",
     [](K& k, const Ctx&) { k.dgamma_tile = kDgammaTile; },
     [](const Ctx&) { return std::map<std::string, double>{{"tile", static_cast<double>(kDgammaTile)}}; }},
};

Dialect dialect_of(const Row& r) {
  const FaultEntry* f = find_fault(r.fault);
  if (!f) throw std::logic_error(fmt::format("panel: dialect {} names fault {}, not in the catalogue", r.name, r.fault));
  auto variants = [r](const Ctx& x) -> std::vector<Variant> {
    if (!holds(r.when, x)) return {};
    if (r.variants) return r.variants(x);
    K k = x.spec;
    r.change(k, x);
    return {Variant{std::move(k), r.parameters ? r.parameters(x) : std::map<std::string, double>{}}};
  };
  return Dialect{{r.name, std::string(1, f->cls), r.title, r.fault}, std::move(variants)};
}

}  // namespace

const std::vector<Dialect>& panel() {
  static const std::vector<Dialect> table = [] {
    std::vector<Dialect> v;
    for (const Row& r : kRows) v.push_back(dialect_of(r));
    return v;
  }();
  return table;
}

}  // namespace normcheck::conf::diag
