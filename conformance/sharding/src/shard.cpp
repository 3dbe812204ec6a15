// Shard plans, the sharding allowance term, and the check of gathered outputs and rank copies
// (README.md in this folder derives the term and lists the dialects).
#include "normcheck/sharding/shard.hpp"

#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/diagnosis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace normcheck::shard {
namespace {

std::vector<std::int64_t> parse_sizes(const std::string& key, const std::string& v, int* count) {
  std::vector<std::int64_t> sizes;
  if (v.find('+') == std::string::npos) {
    std::size_t used = 0;
    int r = 0;
    try {
      r = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || r < 1)
      throw std::invalid_argument(key + "=" + v + ": expected a rank count or sizes s1+s2+...");
    *count = r;
    return sizes;
  }
  std::size_t start = 0;
  while (start <= v.size()) {
    const std::size_t end = std::min(v.find('+', start), v.size());
    const std::string part = v.substr(start, end - start);
    std::size_t used = 0;
    long long s = 0;
    try {
      s = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || s <= 0)
      throw std::invalid_argument(key + "=" + v + ": shard sizes must be positive integers joined by '+'");
    sizes.push_back(s);
    start = end + 1;
  }
  *count = static_cast<int>(sizes.size());
  return sizes;
}

// Shard of each index 0..n-1 for `parts` contiguous shards (numpy.array_split sizes by default).
std::vector<std::int64_t> split(std::int64_t n, int parts, const std::vector<std::int64_t>& sizes,
                                const std::string& what) {
  std::vector<std::int64_t> s = sizes;
  if (s.empty()) {
    if (n < parts)
      throw std::invalid_argument(fmt::format("{} has {} elements, fewer than its {} ranks", what, n, parts));
    for (int k = 0; k < parts; ++k) s.push_back(n / parts + (k < n % parts ? 1 : 0));
  } else if (std::accumulate(s.begin(), s.end(), std::int64_t{0}) != n) {
    throw std::invalid_argument(fmt::format("{} has {} elements; the shard sizes add up to {}", what, n,
                                            std::accumulate(s.begin(), s.end(), std::int64_t{0})));
  }
  std::vector<std::int64_t> owner;
  for (std::size_t k = 0; k < s.size(); ++k)
    owner.insert(owner.end(), static_cast<std::size_t>(s[k]), static_cast<std::int64_t>(k));
  return owner;
}

// gamma(k) = k u / (1 - k u) (TOLERANCE.md section 1); infinite where k u >= 1.
double gamma_of(double k, double u) {
  return k * u < 1 ? k * u / (1 - k * u) : std::numeric_limits<double>::infinity();
}

// The smallest subnormal of a format: the floor of one rounding (TOLERANCE.md takes the full
// spacing per operation, as here).
double subnormal_spacing(ref::DType t) {
  const auto f = ref::format_of(t);
  return std::ldexp(1.0, f.min_exp - f.precision + 1);
}

// Row statistics of the exact computation, in long double: mu (0 for RMSNorm) and r = 1/sqrt(q)
// over the columns `cols` of the row (all of them for the unsharded norm).
struct RowStats {
  long double mu = 0, r = 0;
};

RowStats stats_over(const ref::Case& c, const ref::Geometry& g, std::int64_t row,
                    const std::vector<std::int64_t>& cols, bool div_world_of_means = false,
                    const Layout* lay = nullptr, int tp = 1) {
  const auto& x = c.inputs.at("x").data;
  const std::int64_t base = g.row_base[static_cast<std::size_t>(row)];
  RowStats s;
  const long double n = static_cast<long double>(cols.size());
  if (c.op == ref::Op::layernorm) {
    long double sum = 0;
    for (auto j : cols) sum += x[static_cast<std::size_t>(base + g.col_delta[static_cast<std::size_t>(j)])];
    s.mu = sum / n;
  }
  long double q = 0;
  if (div_world_of_means) {
    // vLLM MiniMaxText01RMSNormTP: (1/T) sum_t (sum over shard t of h^2) / n_t
    std::vector<long double> ss(static_cast<std::size_t>(tp), 0);
    for (auto j : cols) {
      const long double v = x[static_cast<std::size_t>(base + g.col_delta[static_cast<std::size_t>(j)])];
      ss[static_cast<std::size_t>(lay->col_shard[static_cast<std::size_t>(j)])] += v * v;
    }
    for (int t = 0; t < tp; ++t)
      q += ss[static_cast<std::size_t>(t)] /
           static_cast<long double>(lay->n_local[static_cast<std::size_t>(t)]);
    q /= tp;
  } else {
    for (auto j : cols) {
      const long double d =
          x[static_cast<std::size_t>(base + g.col_delta[static_cast<std::size_t>(j)])] - s.mu;
      q += d * d;
    }
    q /= n;
  }
  s.r = 1.0L / std::sqrt(q + static_cast<long double>(c.epsilon));
  return s;
}

// A dialect's outputs in long double: y (forward) or dx, dweight, dbias (backward) of the norm
// whose statistics (and backward row sums) are taken over the column groups `groups` (one group
// of every column: the correct norm; the tp shards: rank-local), or with MiniMax's rstd.
struct Dialect {
  std::string name, explanation;
  std::map<std::string, std::vector<long double>> out;
  // Forward: mean (LayerNorm) and rstd as each tp rank holds them (copy k is rank k's, copy 0
  // the gathered output). Under rank-local statistics the copies are where the fault shows when y
  // is MISTRUSTED (a large mean over a tiny spread) or one rank's shard is small.
  std::map<std::string, std::vector<std::vector<long double>>> stat_copies;
  // The dialect's own allowances where its computation is conditioned otherwise than the correct
  // one (rank_local_allowances); an output not here is judged with the correct allowance.
  std::map<std::string, conf::OutputAllowance> allow;
  std::map<std::string, std::vector<conf::OutputAllowance>> stat_allow;  // per tp rank
};

// Rank-local statistics are each tp rank's correct norm of the case restricted to its own
// columns (a [rows, n_local] case), so they are allowed what a correct kernel of that case is:
// its allowances, and the sharding term of the sp gradient reduce. Its conditioning can be far
// worse than the full row's (two columns of a large mean: a 2-element LayerNorm's dx is 0 by
// cancellation), which the correct computation's allowance does not cover. Sets y or dx and
// dweight (in the full case's layout) and, per tp rank, mean and rstd.
void rank_local_allowances(Dialect& d, const ref::Case& c, const ref::Geometry& g, const Layout& lay,
                           const Plan& p) {
  const bool bwd = c.direction == ref::Direction::backward;
  const std::string xo = bwd ? "dx" : "y";
  const auto n_el = static_cast<std::size_t>(g.rows * g.cols);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  d.allow[xo] = conf::OutputAllowance{std::vector<double>(n_el, nan), std::vector<std::uint8_t>(n_el, 0), 0, ""};
  if (bwd && c.inputs.count("weight"))
    d.allow["dweight"] = conf::OutputAllowance{std::vector<double>(static_cast<std::size_t>(g.cols), nan),
                                               std::vector<std::uint8_t>(static_cast<std::size_t>(g.cols), 0), 0, ""};
  Plan sp_only = p;  // the gradients' sp reduce, without the tp split
  sp_only.tp = 1;
  sp_only.tp_sizes.clear();
  for (int t = 0; t < p.tp; ++t) {
    std::vector<std::size_t> cols;
    for (std::int64_t j = 0; j < g.cols; ++j)
      if (lay.col_shard[static_cast<std::size_t>(j)] == t) cols.push_back(static_cast<std::size_t>(j));
    const auto n = static_cast<std::int64_t>(cols.size());
    ref::Case sub = c;
    sub.axis = -1;
    sub.axes.reset();
    for (const char* name : {"x", "dy"}) {
      if (!c.inputs.count(name)) continue;
      const auto& full = c.inputs.at(name);
      ref::Tensor part{full.dtype, {g.rows, n}, {}};
      for (std::int64_t r = 0; r < g.rows; ++r)
        for (auto j : cols)
          part.data.push_back(full.data[static_cast<std::size_t>(g.row_base[static_cast<std::size_t>(r)] + g.col_delta[j])]);
      sub.inputs[name] = std::move(part);
    }
    for (const char* name : {"weight", "bias"}) {
      if (!c.inputs.count(name)) continue;
      const auto& full = c.inputs.at(name);
      ref::Tensor part{full.dtype, {n}, {}};
      for (auto j : cols) part.data.push_back(full.data[j]);
      sub.inputs[name] = std::move(part);
    }
    auto a = conf::derive_allowances(sub);
    if (p.sp > 1) widen_for_plan(a, sub, sp_only);
    for (std::int64_t r = 0; r < g.rows; ++r)
      for (std::size_t k = 0; k < cols.size(); ++k) {
        const auto full = static_cast<std::size_t>(g.row_base[static_cast<std::size_t>(r)] + g.col_delta[cols[k]]);
        const auto part = static_cast<std::size_t>(r * n) + k;
        d.allow[xo].abs[full] = a.at(xo).abs[part];
        d.allow[xo].nan_ok[full] = a.at(xo).nan_ok[part];
      }
    if (d.allow.count("dweight"))
      for (std::size_t k = 0; k < cols.size(); ++k) d.allow["dweight"].abs[cols[k]] = a.at("dweight").abs[k];
    if (!bwd)
      for (const char* name : {"mean", "rstd"})
        if (a.count(name)) d.stat_allow[name].push_back(a.at(name));
  }
}

// MiniMax's division by the world size all-reduces each shard's mean of squares m_t = S_t / n_t,
// not the sums: under a declared 16-bit (or flushing) statistics all-reduce its own rounding,
// gamma_a(T) sum_t m_t + floor on sum_t m_t (then / T), is up to n_t times what the correct
// kernel's term allows on sum_t S_t / n (TOLERANCE.md, section 11), and a kernel with the fault
// may err by that much around the dialect's value (found by the property tests: float16 means of
// squares near 1e-9 round to 0, rstd = 1/sqrt(eps), diagnosed as a kernel dialect instead). The
// dialect's allowances of rstd, y, dx and dweight are widened by that error carried through
// rstd (relative e_r = e_q / (2 q (1 - e_q / q)), x-hat and m2 as in TOLERANCE.md 3.5 and
// section 4, to first order in e_r: (1 + e_r)^3 - 1); nothing changes without such an
// all-reduce. Elements of rows where e_q / q reaches 1/2 are not compared.
void div_world_allowances(Dialect& d, const ref::Case& c, const ref::Geometry& g, const Layout& lay, const Plan& p,
                          const std::map<std::string, conf::OutputAllowance>& allow) {
  const conf::StatsAllReduce ar = p.stats();
  if (!ar.active(c.dtype_compute)) return;
  const double u_c = ref::unit_roundoff(c.dtype_compute), u_a = ref::unit_roundoff(ar.dtype);
  const double rel = u_a > u_c ? gamma_of(p.tp, u_a + 2 * u_c) : 0.0;
  const double floor = ar.flush_subnormals ? 2.0 * p.tp * std::ldexp(1.0, ref::format_of(ar.dtype).min_exp)
                       : u_a > u_c         ? p.tp * subnormal_spacing(ar.dtype)
                                           : 0.0;
  const double part = 1 + gamma_of(static_cast<double>(g.cols) + 3, u_c);
  const bool bwd = c.direction == ref::Direction::backward;
  const auto& x = c.inputs.at("x").data;
  const auto* w = c.inputs.count("weight") ? &c.inputs.at("weight").data : nullptr;
  const auto* dy = c.inputs.count("dy") ? &c.inputs.at("dy").data : nullptr;
  const std::string xo = bwd ? "dx" : "y";
  if (!allow.count(xo)) return;
  d.allow[xo] = allow.at(xo);
  if (bwd && allow.count("dweight")) d.allow["dweight"] = allow.at("dweight");
  if (!bwd && allow.count("rstd")) d.allow["rstd"] = allow.at("rstd");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::int64_t row = 0; row < g.rows; ++row) {
    const std::int64_t base = g.row_base[static_cast<std::size_t>(row)];
    auto at = [&](std::int64_t j) { return static_cast<std::size_t>(base + g.col_delta[static_cast<std::size_t>(j)]); };
    std::vector<long double> m(static_cast<std::size_t>(p.tp), 0);
    for (std::int64_t j = 0; j < g.cols; ++j)
      m[static_cast<std::size_t>(lay.col_shard[static_cast<std::size_t>(j)])] += static_cast<long double>(x[at(j)]) * x[at(j)];
    long double sum_m = 0;
    for (int t = 0; t < p.tp; ++t) sum_m += m[static_cast<std::size_t>(t)] / lay.n_local[static_cast<std::size_t>(t)];
    const double q = static_cast<double>(sum_m / p.tp) + c.epsilon;
    const double e_q = (rel * part * static_cast<double>(sum_m) + floor) * (1 + u_c) / p.tp;
    const double ratio = q > 0 ? e_q / q : std::numeric_limits<double>::infinity();
    const bool untrusted = !(ratio < 0.5) || !std::isfinite(sum_m);
    const double e_r = untrusted ? 0 : 0.5 * ratio / (1 - ratio);
    const double f = (1 + e_r) * (1 + e_r) * (1 + e_r) - 1;
    const double r = 1 / std::sqrt(q);
    auto scale = [&](std::int64_t j) { return w ? c.weight_offset + (*w)[static_cast<std::size_t>(j)] : 1.0; };
    if (!bwd) {
      if (d.allow.count("rstd")) {
        double& a = d.allow["rstd"].abs[static_cast<std::size_t>(row)];
        a = untrusted ? nan : a + r * e_r;
      }
      for (std::int64_t j = 0; j < g.cols; ++j) {
        double& a = d.allow[xo].abs[at(j)];
        a = untrusted ? nan : a + std::fabs(x[at(j)] * r * scale(j)) * e_r;
      }
      continue;
    }
    double m2 = 0;
    for (std::int64_t j = 0; j < g.cols; ++j) m2 += (*dy)[at(j)] * scale(j) * x[at(j)] * r;
    m2 /= static_cast<double>(g.cols);
    for (std::int64_t j = 0; j < g.cols; ++j) {
      const double xh = x[at(j)] * r, gj = (*dy)[at(j)] * scale(j);
      double& a = d.allow[xo].abs[at(j)];
      a = untrusted ? nan : a + r * (std::fabs(gj) + std::fabs(xh * m2)) * f;
      if (d.allow.count("dweight")) {
        double& aw = d.allow["dweight"].abs[static_cast<std::size_t>(j)];
        aw = untrusted ? nan : aw + std::fabs((*dy)[at(j)] * xh) * f;
      }
    }
  }
  if (!bwd && d.allow.count("rstd")) {
    d.stat_allow["rstd"].assign(static_cast<std::size_t>(p.tp), d.allow["rstd"]);
    d.allow.erase("rstd");
  }
}

Dialect evaluate_dialect(const ref::Case& c, const ref::Geometry& g, const Layout& lay, const Plan& p,
                         bool rank_local, bool div_world) {
  Dialect d;
  const auto& x = c.inputs.at("x").data;
  const auto* w = c.inputs.count("weight") ? &c.inputs.at("weight").data : nullptr;
  const auto* b = c.inputs.count("bias") ? &c.inputs.at("bias").data : nullptr;
  const auto* dy = c.inputs.count("dy") ? &c.inputs.at("dy").data : nullptr;
  const bool bwd = c.direction == ref::Direction::backward;
  std::vector<std::vector<std::int64_t>> groups(rank_local ? static_cast<std::size_t>(p.tp) : 1);
  for (std::int64_t j = 0; j < g.cols; ++j)
    groups[rank_local ? static_cast<std::size_t>(lay.col_shard[static_cast<std::size_t>(j)]) : 0].push_back(
        j);
  const auto n_el = static_cast<std::size_t>(g.rows * g.cols);
  auto& y = d.out[bwd ? "dx" : "y"];
  y.assign(n_el, 0);
  auto& mean = d.stat_copies["mean"];
  auto& rstd = d.stat_copies["rstd"];
  mean.assign(static_cast<std::size_t>(p.tp), std::vector<long double>(static_cast<std::size_t>(g.rows), 0));
  rstd = mean;
  std::vector<long double> dw(static_cast<std::size_t>(g.cols), 0), db(static_cast<std::size_t>(g.cols), 0);
  auto scale = [&](std::int64_t j) {
    return w ? static_cast<long double>(c.weight_offset) + (*w)[static_cast<std::size_t>(j)] : 1.0L;
  };
  for (std::int64_t row = 0; row < g.rows; ++row) {
    const std::int64_t base = g.row_base[static_cast<std::size_t>(row)];
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const auto& cols = groups[gi];
      const RowStats s = stats_over(c, g, row, cols, div_world, &lay, p.tp);
      for (std::size_t t = 0; t < mean.size(); ++t) {
        if (groups.size() > 1 && t != gi) continue;  // one group: every rank holds the same statistics
        mean[t][static_cast<std::size_t>(row)] = s.mu;
        rstd[t][static_cast<std::size_t>(row)] = s.r;
      }
      auto at = [&](std::int64_t j) {
        return static_cast<std::size_t>(base + g.col_delta[static_cast<std::size_t>(j)]);
      };
      // backward row sums over the same columns, with the full n where only rstd is wrong
      long double sg = 0, sgx = 0;
      const long double n =
          static_cast<long double>(div_world ? g.cols : static_cast<std::int64_t>(cols.size()));
      for (auto j : cols) {
        const long double xh = (x[at(j)] - s.mu) * s.r;
        if (!bwd) {
          y[at(j)] = xh * scale(j) + (b ? static_cast<long double>((*b)[static_cast<std::size_t>(j)]) : 0.0L);
          continue;
        }
        const long double gj = (*dy)[at(j)] * scale(j);
        sg += gj;
        sgx += gj * xh;
        dw[static_cast<std::size_t>(j)] += (*dy)[at(j)] * xh;
        db[static_cast<std::size_t>(j)] += (*dy)[at(j)];
      }
      if (!bwd) continue;
      for (auto j : cols) {
        const long double xh = (x[at(j)] - s.mu) * s.r;
        long double k = (*dy)[at(j)] * scale(j) - xh * sgx / n;
        if (c.op == ref::Op::layernorm) k -= sg / n;
        y[at(j)] = s.r * k;
      }
    }
  }
  if (bwd) {
    d.out["dweight"] = dw;
    d.out["dbias"] = db;
  } else if (c.op == ref::Op::rmsnorm) {
    d.stat_copies.erase("mean");
  }
  if (bwd) d.stat_copies.clear();
  return d;
}

// Largest |got - predicted| / allowance over the compared elements of an output. The allowance
// is the element's (derived at the correct value) plus an ulp of the output dtype at the
// dialect's value: a kernel with the fault rounds its own value, which may lie in a binade of
// larger ulp than the correct one.
// `scale` widens the derived part for a dialect whose sums are that many times larger (R times
// the gradient: its 16-bit reduce rounds values R times the size). Elements of rows holding a NaN
// or an infinity (nan_ok) are not compared: their allowance is derived for the correct non-finite
// value and says nothing of a dialect's finite one (rank-local statistics keep a NaN on its rank).
// `may_overflow` (where given) marks elements whose dialect computation may overflow its own
// all-reduce's dtype: a non-finite value there is the dialect's (README.md, "float16 all-reduce").
double worst_ratio(const ref::Tensor& got, const std::vector<long double>& predicted,
                   const conf::OutputAllowance& a, double scale = 1,
                   const std::vector<std::uint8_t>* may_overflow = nullptr) {
  double worst = 0;
  for (std::size_t i = 0; i < got.data.size() && i < predicted.size(); ++i) {
    if (i < a.nan_ok.size() && a.nan_ok[i]) continue;
    if (may_overflow && i < may_overflow->size() && (*may_overflow)[i] && !std::isfinite(got.data[i]))
      continue;
    // the dialect's own NaN or infinity (rank-local statistics of a one-column shard with eps 0:
    // 0/0); ulp_of is finite there, so the difference alone would read as infinitely far
    const long double pv = predicted[i];
    if ((std::isnan(got.data[i]) && std::isnan(pv)) || (std::isinf(got.data[i]) && got.data[i] == pv)) continue;
    // a dialect value beyond the output dtype's range: the faulty kernel's infinity is its rounding
    if (std::isinf(got.data[i]) && ref::round_to(static_cast<double>(pv), got.dtype) == got.data[i]) continue;
    const double al =
        scale * a.abs[i] + conf::ulp_of(std::fabs(static_cast<double>(predicted[i])), got.dtype);
    if (std::isnan(al)) continue;
    // An infinity of the dialect's sign is as far from its value as the output dtype's overflow
    // threshold (the largest finite value plus half an ulp), as the checker measures it
    // (TOLERANCE.md, section 2): a dialect value within its allowance of the threshold may round
    // to infinity (found by the property tests: a float16 dbias reduced twice over 2 sp ranks in
    // bfloat16, no dialect named; tests/shard_test.cpp: 2 x 32750 = 65500 is 65536 in bfloat16,
    // -inf as float16, 20 from the threshold 65520).
    const double threshold =
        ref::max_finite(got.dtype) + 0.5 * conf::ulp_of(ref::max_finite(got.dtype), got.dtype);
    const double e =
        std::isinf(got.data[i]) && !std::isnan(pv) &&
                std::signbit(got.data[i]) == std::signbit(static_cast<double>(pv))
            ? static_cast<double>(std::max(0.0L, threshold - std::fabs(pv)))
            : static_cast<double>(std::fabs(static_cast<long double>(got.data[i]) - predicted[i]));
    worst =
        std::max(worst, std::isnan(e) ? std::numeric_limits<double>::infinity() : e / std::max(al, 1e-300));
  }
  return worst;
}

bool same_bits(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// Where two stored tensors differ bit for bit: how many elements (over the common length) and
// the first one (-1 when none).
struct BitDiff {
  std::int64_t count = 0, first = -1;
};
BitDiff bit_diff(const std::vector<double>& a, const std::vector<double>& b) {
  BitDiff d;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (!same_bits(a[i], b[i]) && d.count++ == 0) d.first = static_cast<std::int64_t>(i);
  return d;
}

}  // namespace

Plan parse_plan(const std::string& text) {
  Plan p;
  p.text = text;
  std::vector<std::string> seen;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || std::find(seen.begin(), seen.end(), key) != seen.end())
      throw std::invalid_argument("plan '" + text + "': '" + item + "' is not a new key=value");
    seen.push_back(key);
    if (key == "tp") {
      p.tp_sizes = parse_sizes(key, value, &p.tp);
    } else if (key == "sp") {
      p.sp_sizes = parse_sizes(key, value, &p.sp);
    } else if (key == "sp_dim") {
      if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value.size() > 2)
        throw std::invalid_argument("plan '" + text + "': sp_dim must be a dim number");
      p.sp_dim = std::stoi(value);
    } else if (key == "reduce" || key == "stats_reduce") {
      const auto t = ref::parse_dtype(value);
      if (!t || *t == ref::DType::float64)
        throw std::invalid_argument("plan '" + text + "': " + key + "=" + value +
                                    " is not one of float32, bfloat16, float16");
      (key == "reduce" ? p.reduce : p.stats_reduce) = *t;
    } else if (key == "flush_subnormals") {
      if (value != "0" && value != "1")
        throw std::invalid_argument("plan '" + text + "': flush_subnormals=" + value + " is not 0 or 1");
      p.flush_subnormals = value == "1";
    } else {
      throw std::invalid_argument("plan '" + text + "': unknown key '" + key +
                                  "' (tp, sp, sp_dim, reduce, stats_reduce, flush_subnormals)");
    }
  }
  if (p.world() < 2) throw std::invalid_argument("plan '" + text + "': a plan needs at least 2 ranks");
  return p;
}

Layout layout_of(const ref::Case& c, const Plan& p) {
  const ref::Geometry g = ref::geometry_of(c);
  const auto rank = static_cast<std::int64_t>(g.shape.size());
  const auto k = static_cast<std::int64_t>(g.norm_dims.size());
  for (std::int64_t i = 0; i < k; ++i)
    if (g.norm_dims[static_cast<std::size_t>(i)] != rank - k + i)
      throw std::invalid_argument(
          "the normalized dims are not trailing (sharded cases normalize trailing dims)");
  const std::int64_t first = rank - k;
  Layout lay;
  const std::int64_t tp_extent = g.shape[static_cast<std::size_t>(first)];
  const std::int64_t inner = g.cols / tp_extent;
  const auto tp_owner = split(tp_extent, p.tp, p.tp_sizes, fmt::format("dim {} (tp)", first));
  lay.n_local.assign(static_cast<std::size_t>(p.tp), 0);
  for (std::int64_t j = 0; j < g.cols; ++j) {
    const auto t = tp_owner[static_cast<std::size_t>(j / inner)];
    lay.col_shard.push_back(t);
    lay.n_local[static_cast<std::size_t>(t)] += 1;
  }
  lay.row_shard.assign(static_cast<std::size_t>(g.rows), 0);
  if (p.sp > 1) {
    if (p.sp_dim >= first)
      throw std::invalid_argument(fmt::format("sp_dim {} is a normalized dim: sp splits rows", p.sp_dim));
    const auto sp_owner = split(g.shape[static_cast<std::size_t>(p.sp_dim)], p.sp, p.sp_sizes,
                                fmt::format("dim {} (sp)", p.sp_dim));
    std::int64_t below = 1;  // row-major stride of sp_dim among the row dims
    for (std::int64_t d = p.sp_dim + 1; d < first; ++d) below *= g.shape[static_cast<std::size_t>(d)];
    for (std::int64_t r = 0; r < g.rows; ++r)
      lay.row_shard[static_cast<std::size_t>(r)] =
          sp_owner[static_cast<std::size_t>((r / below) % g.shape[static_cast<std::size_t>(p.sp_dim)])];
  }
  return lay;
}

namespace {

// What the gradient all-reduce adds up, per column of dweight and dbias: S_j = the sum over the
// rows of |term| (dweight: |dy x-hat|, dbias: |dy|) and the exact sum, from the exact statistics
// in long double; their own relative error (< 2^-50) is covered by a 2^-40 margin where used.
struct ColumnSums {
  std::vector<long double> abs_w, abs_b, w, b;
};
ColumnSums column_sums(const ref::Case& c) {
  const ref::Geometry g = ref::geometry_of(c);
  const auto& x = c.inputs.at("x").data;
  const auto& dy = c.inputs.at("dy").data;
  const auto cols = static_cast<std::size_t>(g.cols);
  ColumnSums cs{std::vector<long double>(cols, 0), std::vector<long double>(cols, 0),
                std::vector<long double>(cols, 0), std::vector<long double>(cols, 0)};
  std::vector<std::int64_t> all(cols);
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t row = 0; row < g.rows; ++row) {
    const RowStats s = stats_over(c, g, row, all);
    const std::int64_t base = g.row_base[static_cast<std::size_t>(row)];
    for (std::size_t j = 0; j < cols; ++j) {
      const auto at = static_cast<std::size_t>(base + g.col_delta[j]);
      const long double term = dy[at] * (x[at] - s.mu) * s.r;
      cs.abs_w[j] += std::fabs(term);
      cs.abs_b[j] += std::fabs(dy[at]);
      cs.w[j] += term;
      cs.b[j] += dy[at];
    }
  }
  return cs;
}

// Whether the plan's gradient all-reduce is narrower than the compute dtype.
bool narrow(const ref::Case& c, const Plan& p) {
  return ref::unit_roundoff(p.reduce) > ref::unit_roundoff(c.dtype_compute);
}
// Whether the term applies: sp ranks, gradients, and an all-reduce narrower than the compute
// dtype or one that flushes subnormals (README.md, "Flushing all-reduces").
bool narrow_reduce(const ref::Case& c, const Plan& p) {
  return p.sp >= 2 && (narrow(c, p) || p.flush_subnormals) && c.inputs.count("dy");
}
// gamma(R) of the all-reduce's roundings: a 16-bit add done in float32 and rounded to 16 bits
// rounds twice, u_a + u_c (1 + u_a) <= u_a + 2 u_c. Nothing for an all-reduce in the compute
// dtype (any summation order is in the unsharded allowance already).
double reduce_gamma(const ref::Case& c, const Plan& p) {
  if (!narrow(c, p)) return 0;
  return gamma_of(p.sp, ref::unit_roundoff(p.reduce) + 2 * ref::unit_roundoff(c.dtype_compute));
}
// The absolute floor of the all-reduce's 2R - 1 roundings (R partials, R - 1 adds): R s_a with
// gradual underflow (each loses at most s_a / 2, and the compute adds' floor fits in the last
// s_a / 2); 2R m_a where it flushes (each may lose up to the smallest normal m_a: a value below it
// becomes 0; the compute adds' floor fits in the last m_a). README.md, "Flushing all-reduces".
double reduce_floor(const ref::Case& c, const Plan& p) {
  if (p.flush_subnormals) return 2.0 * p.sp * std::ldexp(1.0, ref::format_of(p.reduce).min_exp);
  return narrow(c, p) ? p.sp * subnormal_spacing(p.reduce) : 0.0;
}
// The bound on every value the all-reduce rounds to its dtype (README.md, "float16 all-reduce"):
// each rank's partial and each partial sum is at most sum_k |P_k| (1 + gamma) + floor in
// magnitude, with sum_k |P_k| <= S_j + a_j (a_j the unsharded allowance).
double reduce_bound(double s_j, double a_j, double gam, double floor) {
  return (s_j * (1 + 0x1p-40) + a_j) * (1 + gam) + floor;
}

}  // namespace

void widen_for_plan(std::map<std::string, conf::OutputAllowance>& allow, const ref::Case& c, const Plan& p) {
  if (!narrow_reduce(c, p)) return;  // README: no term
  const ColumnSums cs = column_sums(c);
  const auto &s_w = cs.abs_w, &s_b = cs.abs_b, &f_w = cs.w, &f_b = cs.b;
  const double gam = reduce_gamma(c, p);
  const double floor = reduce_floor(c, p);
  struct Column {
    const char* name;
    const std::vector<long double>* abs_sum;
    const std::vector<long double>* sum;
  };
  for (const auto& [name, sums, values] : {Column{"dweight", &s_w, &f_w}, Column{"dbias", &s_b, &f_b}}) {
    auto it = allow.find(name);
    if (it == allow.end()) continue;
    auto& a = it->second.abs;
    std::int64_t overflow = 0;
    double worst_bound = 0;
    for (std::size_t j = 0; j < a.size() && j < sums->size(); ++j) {
      const double sj = static_cast<double>((*sums)[j]);
      // NaN: MISTRUSTED already; infinite: a column a non-finite row enters, unconstrained.
      if (!std::isfinite(a[j]) || !std::isfinite(sj)) continue;
      // The reduce dtype's range (README.md, "float16 all-reduce"): where the bound on the values
      // the all-reduce rounds (reduce_bound) reaches its largest finite value, a correct
      // all-reduce may return +-inf or NaN (float16: 65504, met by loss-scaled gradients): the
      // element is MISTRUSTED, as the judge does for a compute-dtype accumulator that may
      // overflow (TOLERANCE.md, section 5).
      const double bound = reduce_bound(sj, a[j], gam, floor);
      if (!(bound < ref::max_finite(p.reduce))) {
        a[j] = std::numeric_limits<double>::quiet_NaN();
        ++overflow;
        worst_bound = std::max(worst_bound, bound);
        continue;
      }
      const double extra = gam * (sj * (1 + 0x1p-40) + a[j]) + floor;
      // The final rounding's half ulp, taken at the larger error (README.md, "The allowance
      // term"): v is a lower bound on |exact| (the long double sum less its error bound).
      const double v =
          std::max(0.0, static_cast<double>(std::fabs((*values)[j])) * (1 - 0x1p-40) - sj * 0x1p-40);
      const double jump =
          0.5 * (conf::ulp_of(v + a[j] + extra, c.dtype_param) - conf::ulp_of(v, c.dtype_param));
      a[j] += extra + std::max(0.0, jump);
    }
    if (overflow == 0) continue;
    auto& o = it->second;
    o.mistrusted = std::count_if(a.begin(), a.end(), [](double v) { return std::isnan(v); });
    o.reason += fmt::format(
        "{}{} column sum{} may overflow the {} all-reduce of a correct implementation over {} sp ranks: "
        "partials whose |terms| add up to {:.6g} (with their errors), against the largest finite {} {:.6g}",
        o.reason.empty() ? "" : "; ", overflow, overflow == 1 ? "" : "s", ref::name_of(p.reduce), p.sp,
        worst_bound, ref::name_of(p.reduce), ref::max_finite(p.reduce));
  }
}

std::map<std::string, conf::OutputAllowance> sharded_allowances(const ref::Case& c, const Plan& p) {
  auto allow = conf::derive_allowances(c, {}, p.stats());
  widen_for_plan(allow, c, p);
  return allow;
}

conf::CaseResult check_sharded(const fix::FixtureCase& fc, const Plan& p, const ShardedOutputs& stored) {
  // Values are taken as stored (any float type); each output's dtype is the case's.
  ShardedOutputs got = stored;
  for (auto& [name, t] : got.gathered)
    if (fc.expected.count(name)) t.dtype = fc.expected.at(name).value.dtype;
  for (auto& [name, v] : got.copies)
    for (auto& t : v)
      if (fc.expected.count(name)) t.dtype = fc.expected.at(name).value.dtype;
  conf::CaseResult res;
  res.case_id = fc.id;
  res.seconds = got.seconds;
  if (!got.status.empty()) {
    const auto v = conf::parse_verdict(got.status);
    res.verdict = v ? *v : conf::Verdict::crashed;
    res.message = got.message;
    conf::describe_case(res, fc);
    return res;
  }
  // The tolerance model with the plan's statistics all-reduce (TOLERANCE.md, section 11).
  auto allow = conf::derive_allowances(fc.c, {}, p.stats());
  const auto unwidened = allow;  // a_j of the reduce's range bound (the dialect "multiplied by R")
  widen_for_plan(allow, fc.c, p);
  res = conf::check_case(fc, got.gathered, allow);
  // The final rounding is part of what is checked, as in `normcheck check` (SCHEMA.md, "Outputs
  // files"): a value stored wider than its dtype can hold FAILS, unless declared wider_values.
  conf::reject_unrepresentable(res, got.gathered, got.wider_values);
  res.seconds = got.seconds;
  conf::describe_case(res, fc);
  auto worse = [&](conf::Verdict v) { res.verdict = std::max(res.verdict, v); };
  // Copy 0 is outputs/<name> itself (SCHEMA.md, "Sharded outputs"): checked above as the
  // gathered output, so it must hold the same bits, or a file with a right outputs/<name> and
  // every copy wrong alike would pass.
  for (const auto& [name, copies] : got.copies) {
    const auto git = got.gathered.find(name);
    if (copies.empty() || git == got.gathered.end()) continue;
    const auto& a = git->second.data;
    const auto& b = copies[0].data;
    const auto [differ, first] = bit_diff(a, b);
    if (differ == 0 && a.size() == b.size()) continue;
    conf::OutputResult d;
    d.name = fmt::format("{}[copy 0]", name);
    d.verdict = conf::Verdict::failed;
    d.malformed = true;  // not a numerical result: the file contradicts itself
    d.elements = static_cast<std::int64_t>(b.size());
    d.failed = differ;
    d.reason = a.size() != b.size()
                   ? fmt::format("copies/0/{} has {} elements, outputs/{} {}", name, b.size(), name, a.size())
                   : fmt::format("copies/0/{} must hold outputs/{} bit for bit (SCHEMA.md); {} of {} elements differ, "
                                 "first at {}: {} against {}",
                                 name, name, differ, a.size(), first, ref::hex_text(b[static_cast<std::size_t>(first)]),
                                 ref::hex_text(a[static_cast<std::size_t>(first)]));
    worse(conf::Verdict::failed);
    res.outputs.push_back(d);
  }
  // Every copy of a replicated output against the reference, and against copy 0 bit for bit.
  for (const auto& [name, copies] : got.copies) {
    for (std::size_t k = 1; k < copies.size(); ++k) {
      conf::Outputs o = got.gathered;
      o[name] = copies[k];
      conf::CaseResult rk = conf::check_case(fc, o, allow);
      conf::reject_unrepresentable(rk, o, got.wider_values);  // a copy is declared with its output
      for (auto orr : rk.outputs) {
        if (orr.name != name) continue;
        orr.name = fmt::format("{}[copy {}]", name, k);
        worse(orr.verdict);
        res.outputs.push_back(orr);
      }
      const auto& a = copies[0].data;
      const auto& b = copies[k].data;
      const auto [differ, first] = bit_diff(a, b);
      if (differ > 0 || a.size() != b.size()) {
        conf::OutputResult d;
        d.name = fmt::format("{}[copies 0,{}]", name, k);
        d.verdict = conf::Verdict::failed;
        d.elements = static_cast<std::int64_t>(a.size());
        d.failed = differ;
        d.reason =
            a.size() != b.size()
                ? "copies differ in size"
                : fmt::format(
                      "the ranks' copies must be bit-identical (one all-reduce result); {} of {} elements "
                      "differ, first at {}: {} ({}) against {} ({})",
                      differ, a.size(), first, ref::hex_text(b[static_cast<std::size_t>(first)]),
                      b[static_cast<std::size_t>(first)], ref::hex_text(a[static_cast<std::size_t>(first)]),
                      a[static_cast<std::size_t>(first)]);
        worse(conf::Verdict::failed);
        res.outputs.push_back(d);
      }
    }
  }
  // A wrong shape or a value its dtype cannot hold is reported as what it is (the output's
  // reason), never explained by a dialect: conf::diagnosable, as `normcheck check` does.
  if (!conf::diagnosable(res)) return res;

  // Diagnosis: which sharding dialect explains the failing outputs (within their allowance).
  const ref::Geometry g = ref::geometry_of(fc.c);
  const Layout lay = layout_of(fc.c, p);
  std::vector<std::string> lines;
  std::vector<Dialect> dialects;
  if (p.tp > 1) {
    dialects.push_back(evaluate_dialect(fc.c, g, lay, p, true, false));
    rank_local_allowances(dialects.back(), fc.c, g, lay, p);
    dialects.back().name = "rank-local statistics";
    dialects.back().explanation = fmt::format(
        "the norm's sums taken over each rank's own {} columns of {}, not all-reduced "
        "over the {} tp ranks (gpt-neox #1424; QK-norm without its gather, vLLM OLMo2)",
        fmt::join(lay.n_local, "/"), g.cols, p.tp);
    if (fc.c.op == ref::Op::rmsnorm) {
      dialects.push_back(evaluate_dialect(fc.c, g, lay, p, false, true));
      dialects.back().name = "sum of squares divided by the world size";
      div_world_allowances(dialects.back(), fc.c, g, lay, p, allow);
      dialects.back().explanation = fmt::format(
          "rstd from (1/{}) * sum over ranks of each shard's mean square: exact only "
          "for equal shards (these are {}; vLLM MiniMaxText01RMSNormTP)",
          p.tp, fmt::join(lay.n_local, "+"));
    }
  }
  for (const auto& d : dialects) {
    // `label`: an output (or a copy of one, "rstd[copy 1]") as res.outputs names it
    auto match = [&](const std::string& label, const ref::Tensor& t, const std::vector<long double>& pred,
                     const conf::OutputAllowance& a) {
      // only outputs that failed: on equal shards MiniMax's rstd is the correct one
      const auto o = std::find_if(res.outputs.begin(), res.outputs.end(), [&](const conf::OutputResult& x) {
        return x.name == label && x.verdict == conf::Verdict::failed;
      });
      if (o == res.outputs.end()) return;
      const double r = worst_ratio(t, pred, a);
      if (r <= 1) {
        lines.push_back(fmt::format("{}: {} ({}: every element within its allowance of this dialect)", label,
                                    d.name, d.explanation));
      } else if (r * 100 < o->max_ratio) {
        // the allowance is derived for the correct computation; a faulty one can be worse
        // conditioned (a shard of two elements), so a dialect 100 times closer is still named
        lines.push_back(
            fmt::format("{}: closest to {} ({}: {:.3g} times its allowance from this dialect, {:.3g} "
                        "from the correct value)",
                        label, d.name, d.explanation, r, o->max_ratio));
      }
    };
    for (const auto& [oname, pred] : d.out) {
      // dbias (the column sums of dy) does not depend on the statistics; dweight does, and may be
      // the only output that shows them (one-column shards of a LayerNorm: x-hat = 0, where the
      // correct dx of two columns is 0 too), in every sp rank's copy alike
      auto it = got.gathered.find(oname);
      if (it == got.gathered.end() || oname == "dbias") continue;
      const auto& a = d.allow.count(oname) ? d.allow.at(oname) : allow.at(oname);
      match(oname, it->second, pred, a);
      const auto cit = got.copies.find(oname);
      if (oname != "dweight" || cit == got.copies.end()) continue;
      for (std::size_t k = 1; k < cit->second.size(); ++k)
        match(fmt::format("{}[copy {}]", oname, k), cit->second[k], pred, a);
    }
    for (const auto& [oname, per_rank] : d.stat_copies) {
      auto it = got.gathered.find(oname);
      if (it == got.gathered.end() || per_rank.empty()) continue;
      const auto sa = d.stat_allow.find(oname);
      auto a = [&](std::size_t k) -> const conf::OutputAllowance& {
        return sa != d.stat_allow.end() && k < sa->second.size() ? sa->second[k] : allow.at(oname);
      };
      match(oname, it->second, per_rank[0], a(0));
      const auto cit = got.copies.find(oname);
      if (cit == got.copies.end()) continue;
      for (std::size_t k = 1; k < cit->second.size() && k < per_rank.size(); ++k)
        match(fmt::format("{}[copy {}]", oname, k), cit->second[k], per_rank[k], a(k));
    }
  }
  // Replicated gradients: each copy against the full sum, the rank-local sum, the average and R times.
  if (p.sp > 1 && fc.c.direction == ref::Direction::backward) {
    const Dialect full = evaluate_dialect(fc.c, g, lay, p, false, false);
    // Reduced twice in a narrow dtype: the second all-reduce adds R copies of the full sum, so
    // its values reach R times reduce_bound, and a float16 one may overflow where the correct
    // reduce cannot (found by the property tests: a float32 dbias of 18525.8 reduced twice over 4
    // sp ranks in float16 is inf, 4 times it 74103).
    std::map<std::string, std::vector<std::uint8_t>> times_overflow;
    if (narrow_reduce(fc.c, p)) {
      const ColumnSums cs = column_sums(fc.c);
      const double gam = reduce_gamma(fc.c, p);
      for (const auto& [name, sums] : {std::pair{"dweight", &cs.abs_w}, std::pair{"dbias", &cs.abs_b}}) {
        const auto it = unwidened.find(name);
        if (it == unwidened.end()) continue;
        auto& m = times_overflow[name];
        m.assign(sums->size(), 0);
        for (std::size_t j = 0; j < sums->size() && j < it->second.abs.size(); ++j)
          m[j] = !(p.sp * reduce_bound(static_cast<double>((*sums)[j]), it->second.abs[j], gam, reduce_floor(fc.c, p)) <
                   ref::max_finite(p.reduce));
      }
    }
    for (const auto* name : {"dweight", "dbias"}) {
      auto cit = got.copies.find(name);
      if (cit == got.copies.end() || !full.out.count(name)) continue;
      const auto& f = full.out.at(name);
      // per sp rank, its rows' partial sum
      std::vector<std::vector<long double>> local(static_cast<std::size_t>(p.sp),
                                                  std::vector<long double>(f.size(), 0));
      {
        std::vector<std::int64_t> all(static_cast<std::size_t>(g.cols));
        std::iota(all.begin(), all.end(), 0);
        const auto& x = fc.c.inputs.at("x").data;
        const auto& dy = fc.c.inputs.at("dy").data;
        for (std::int64_t row = 0; row < g.rows; ++row) {
          const RowStats s = stats_over(fc.c, g, row, all);
          auto& l = local[static_cast<std::size_t>(lay.row_shard[static_cast<std::size_t>(row)])];
          for (std::int64_t j = 0; j < g.cols; ++j) {
            const auto at = static_cast<std::size_t>(g.row_base[static_cast<std::size_t>(row)] +
                                                     g.col_delta[static_cast<std::size_t>(j)]);
            l[static_cast<std::size_t>(j)] += std::string(name) == "dweight"
                                                  ? dy[at] * (x[at] - s.mu) * s.r
                                                  : static_cast<long double>(dy[at]);
          }
        }
      }
      for (std::size_t k = 0; k < cit->second.size(); ++k) {
        const ref::Tensor& t = cit->second[k];
        std::vector<std::pair<std::string, std::vector<long double>>> hyp;
        hyp.emplace_back(
            fmt::format(
                "rank-local: the sum over sp rank {}'s rows alone, not all-reduced (Megatron-LM #1446)", k),
            local[k]);
        std::vector<long double> avg(f), times(f);
        for (std::size_t j = 0; j < f.size(); ++j) {
          avg[j] = f[j] / p.sp;
          times[j] = f[j] * p.sp;
        }
        hyp.emplace_back(
            fmt::format("averaged: the all-reduced sum divided by the {} sp ranks (gpt-neox #1259)", p.sp),
            avg);
        hyp.emplace_back(
            fmt::format("multiplied by {}: the sum reduced twice, R times the gradient (Megatron-LM #1528)",
                        p.sp),
            times);
        const double scales[] = {1, 1, static_cast<double>(p.sp)};  // R times: sums R times larger
        for (std::size_t h = 0; h < hyp.size(); ++h) {
          const auto& [text, pred] = hyp[h];
          const auto* mask = h == 2 && !times_overflow[name].empty() ? &times_overflow[name] : nullptr;
          if (worst_ratio(t, pred, allow.at(name), scales[h], mask) <= 1 &&
              worst_ratio(t, f, allow.at(name)) > 1)
            lines.push_back(fmt::format("{} copy {}: {}", name, k, text));
        }
      }
    }
  }
  if (lines.empty()) {
    // Not a sharding fault: what the judge's panel says of the gathered outputs (a kernel fault).
    res.diagnosis = conf::diagnose(fc, got.gathered, allow);
    res.diagnosed = true;
    for (const auto& d : res.diagnosis)
      if (d.explains)
        lines.push_back(fmt::format("not a sharding dialect; the kernel dialect '{}' explains it ({})",
                                    d.title, d.evidence));
    if (lines.empty())
      lines.push_back("no sharding dialect (nor any dialect of the panel) explains the failure");
  }
  res.message = "diagnosis: " + fmt::format("{}", fmt::join(lines, "; "));
  return res;
}

}  // namespace normcheck::shard
