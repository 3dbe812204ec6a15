#include "scoring.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "normcheck/judge/checker.hpp"

namespace normcheck::conf::diag {

bool scorable(const ref::Output& exp, const Outputs& got, const std::string& name,
              const std::map<std::string, OutputAllowance>& allow) {
  const auto it = got.find(name);
  const auto at = allow.find(name);
  return it != got.end() && at != allow.end() && it->second.shape == exp.value.shape &&
         it->second.dtype == exp.value.dtype && it->second.data.size() == exp.value.data.size() &&
         at->second.abs.size() == exp.value.data.size();
}

// The error the checker measures where got or p is not finite; `expected` (the prediction
// rounded to the output dtype) only matters to element_error where it is NaN or infinite, so
// finite in-range predictions skip the rounding.
double error_against_slow(double got, double p, DType t) {
  if (std::isfinite(got) && std::isfinite(p)) return std::fabs(got - p);  // element_error then is this
  const double expected = std::isfinite(p) && std::fabs(p) <= ref::max_finite(t) ? p : ref::round_to(p, t);
  return element_error(got, p, expected, t);
}

double a_abs(const OutputAllowance& a, const ref::Output& exp, std::size_t i, DType t) {
  double allowance = a.abs[i];
  if (!std::isnan(allowance) && !exp.certified[i]) allowance += ulp_of(exp.f64[i], t);
  return allowance;
}


const OutputTable* Scorer::table(const std::string& name, const ref::Output& exp) const {
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    std::optional<OutputTable> t;
    if (scorable(exp, got_, name, allow_)) {
      t.emplace();
      t->exp = &exp;
      t->a = &allow_.at(name);
      t->got = &got_.at(name).data;
      t->t = exp.value.dtype;
      t->al.resize(t->got->size());
      for (std::size_t i = 0; i < t->al.size(); ++i) t->al[i] = a_abs(*t->a, exp, i, t->t);
    }
    it = tables_.emplace(name, std::move(t)).first;
  }
  return it->second ? &*it->second : nullptr;
}

Score score_of(const fix::FixtureCase& fc, const Outputs& got,
               const std::map<std::string, OutputAllowance>& allow, const Layout* lay,
               const Predictions* dialect, const Predictions* spec, SpecScores* same_as_spec,
               const std::string& only, bool need_distinct) {
  return Scorer(fc, got, allow).score(lay, dialect, spec, same_as_spec, only, need_distinct);
}

Score Scorer::score(const Layout* lay, const Predictions* dialect, const Predictions* spec,
                    SpecScores* same_as_spec, const std::string& only, bool need_distinct,
                    double stop_at) const {
  OutputScore total;
  auto stopped = [](const OutputScore& o) {
    Score s = o.s;
    s.partial = true;
    return s;
  };
  auto see = [](OutputScore& acc, double ratio, const std::string& name, std::size_t i) {
    if (ratio > 1) ++acc.s.beyond;
    if (ratio > acc.worst) {
      acc.worst = ratio;
      acc.s.score = ratio;
      acc.s.worst_output = name;
      acc.s.worst_index = static_cast<std::int64_t>(i);
    }
  };
  auto merge = [&](const OutputScore& o) {
    total.s.beyond += o.s.beyond;
    total.s.unpredicted += o.s.unpredicted;
    total.s.distinct = total.s.distinct || o.s.distinct;
    if (o.worst > total.worst) {
      total.worst = o.worst;
      total.s.score = o.s.score;
      total.s.worst_output = o.s.worst_output;
      total.s.worst_index = o.s.worst_index;
    }
  };
  for (const auto& [name, exp] : fc_.expected) {
    if (!only.empty() && name != only) continue;
    const OutputTable* tb = table(name, exp);
    if (!tb) continue;
    const double* gv = tb->got->data();
    const double* al = tb->al.data();
    const double* f64 = exp.f64.data();
    const OutputAllowance& a = *tb->a;
    const DType t = tb->t;
    auto ratio_at = [&](std::size_t i, double p) {
      const double allowance = al[i];
      if (std::isnan(allowance)) return -1.0;
      const double g = gv[i];
      const double err = std::isnan(g) && a.nan_ok[i] ? 0.0 : error_against(g, p, t);
      return err == 0 ? 0.0 : (allowance > 0 ? err / allowance : kInf);
    };
    // Whether prediction p of element i differs from the certified value by more than the
    // outputs resolve (kSameWithin allowance, and a different value of the dtype).
    auto tells_apart = [&](std::size_t i, double p) {
      if (std::fabs(p - f64[i]) <= kSameWithin * a.abs[i] || std::isnan(a.abs[i])) return false;
      const double rp = ref::round_to(p, t), re = ref::round_to(f64[i], t);
      return !(rp == re || (std::isnan(rp) && std::isnan(re)));
    };
    OutputScore acc;
    if (!dialect) {
      const std::size_t n = tb->got->size();
      for (std::size_t i = 0; i < n; ++i) see(acc, ratio_at(i, f64[i]), name, i);
      merge(acc);
      continue;
    }
    const auto fi = lay->flat.find(name);
    const auto di = dialect->find(name), si = spec->find(name);
    if (fi == lay->flat.end() || di == dialect->end() || si == spec->end()) continue;
    const auto& flat = fi->second;
    const auto sl = dialect->slack.find(name);
    const auto gr = dialect->grid.find(name);
    const bool identical = same_as_spec && sl == dialect->slack.end() && gr == dialect->grid.end() &&
                           di->second.size() == si->second.size() &&
                           std::memcmp(di->second.data(), si->second.data(), di->second.size() * sizeof(double)) == 0;
    if (identical) {
      const auto it = same_as_spec->find(name);
      if (it != same_as_spec->end()) {
        merge(it->second);
        if (total.worst >= stop_at) return stopped(total);
        continue;
      }
    }
    if (gr != dialect->grid.end()) acc.s.distinct = true;  // an interval prediction
    const bool has_slack = sl != dialect->slack.end();
    const bool wide = t == DType::float64;
    const double* dv = di->second.data();
    const double* sv = si->second.data();
    if (!has_slack) {
      // The common case, without intervals: until some element tells the dialect apart, the
      // test of distinctness; then the ratios alone.
      std::size_t ci = 0;
      const std::size_t n = flat.size();
      for (; ci < n && need_distinct && !(total.s.distinct || acc.s.distinct); ++ci) {
        const std::size_t i = flat[ci];
        const double p = predicted(dv[ci], sv[ci], f64[i], wide);
        if (tells_apart(i, p)) acc.s.distinct = true;
        see(acc, ratio_at(i, p), name, i);
        if (acc.worst >= stop_at) return stopped(acc);
      }
      for (; ci < n; ++ci) {
        const std::size_t i = flat[ci];
        see(acc, ratio_at(i, predicted(dv[ci], sv[ci], f64[i], wide)), name, i);
        if (acc.worst >= stop_at) return stopped(acc);
      }
      if (identical) same_as_spec->emplace(name, acc);
      merge(acc);
      continue;
    }
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      const double p = predicted(dv[ci], sv[ci], f64[i], wide);
      if (gr == dialect->grid.end() && std::isinf(sl->second[ci])) {  // no prediction
        ++acc.s.unpredicted;
        continue;
      }
      if (need_distinct && !(total.s.distinct || acc.s.distinct) && tells_apart(i, p)) acc.s.distinct = true;
      if (gr != dialect->grid.end() && std::isfinite(gv[i])) {
        // An interval prediction: the values of the grid within the slack of p. The error is
        // the distance from got to that set: at least its distance to the grid.
        const double alw = al[i];
        if (std::isnan(alw)) continue;
        const double off_grid = std::fabs(gv[i] - ref::round_to(gv[i], gr->second));
        const double err = std::max({0.0, std::fabs(gv[i] - p) - sl->second[ci], off_grid});
        see(acc, err == 0 ? 0.0 : (alw > 0 ? err / alw : kInf), name, i);
        continue;
      }
      see(acc, ratio_at(i, p), name, i);
    }
    if (identical) same_as_spec->emplace(name, acc);
    merge(acc);
    if (total.worst >= stop_at) return stopped(total);
  }
  return total.s;
}

std::vector<double> Scorer::spec_row_ratios(const ref::Geometry& g, const Layout& all, double* spec_max,
                                            double* spec_others) const {
  std::vector<double> r(static_cast<std::size_t>(g.rows), 0.0);
  double others = 0;  // outputs not per row (column sums): their largest ratio
  for (const auto& [name, exp] : fc_.expected) {
    const OutputTable* tb = table(name, exp);
    if (!tb) continue;
    const auto fi = all.flat.find(name);
    const std::size_t cols_all = static_cast<std::size_t>(g.cols);
    const bool per_row = fi != all.flat.end() && fi->second.size() == r.size() && (name == "mean" || name == "rstd");
    if (fi == all.flat.end() || (!per_row && fi->second.size() != r.size() * cols_all)) {
      others = std::max(others, score(nullptr, nullptr, nullptr, nullptr, name).score);
      continue;
    }
    const auto& flat = fi->second;
    const std::size_t cols = per_row ? 1 : cols_all;
    const auto& gv = *tb->got;
    const auto& a = *tb->a;
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      const double al = tb->al[i];
      if (std::isnan(al)) continue;
      const double g0 = gv[i];
      const double err = std::isnan(g0) && a.nan_ok[i] ? 0.0 : error_against(g0, exp.f64[i], exp.value.dtype);
      const double ratio = err == 0 ? 0.0 : (al > 0 ? err / al : kInf);
      double& row = r[ci / cols];
      row = std::max(row, ratio);
    }
  }
  if (spec_others) *spec_others = others;
  if (spec_max) {
    *spec_max = others;
    for (double v : r) *spec_max = std::max(*spec_max, v);
  }
  return r;
}

std::vector<std::int64_t> worst_spec_columns(const fix::FixtureCase& fc, const Outputs& got,
                                             const std::map<std::string, OutputAllowance>& allow,
                                             std::int64_t cols, std::size_t k) {
  if (static_cast<std::size_t>(cols) <= 2 * k) return {};
  std::vector<double> r(static_cast<std::size_t>(cols), 0.0);
  for (const char* name : {"dweight", "dbias"}) {
    const auto e = fc.expected.find(name);
    if (e == fc.expected.end() || !scorable(e->second, got, name, allow)) continue;
    const auto& exp = e->second;
    if (exp.value.data.size() != r.size()) return {};
    const auto& gv = got.at(name).data;
    const auto& a = allow.at(name);
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double al = a_abs(a, exp, i, exp.value.dtype);
      if (std::isnan(al)) continue;
      const double err =
          std::isnan(gv[i]) && a.nan_ok[i] ? 0.0 : error_against(gv[i], exp.f64[i], exp.value.dtype);
      r[i] = std::max(r[i], err == 0 ? 0.0 : (al > 0 ? err / al : kInf));
    }
  }
  std::vector<std::int64_t> order(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int64_t x, std::int64_t y) { return r[x] > r[y] || (r[x] == r[y] && x < y); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// A fault whose values round like the spec's (a rounding point to the output dtype just before
// the output's own rounding) cannot be seen in the outputs.
bool same_score(const Score& a, const Score& b) {
  const bool nan_a = std::isnan(a.score), nan_b = std::isnan(b.score);
  return (a.score == b.score || (nan_a && nan_b)) && a.beyond == b.beyond && a.worst_index == b.worst_index &&
         a.worst_output == b.worst_output && a.distinct == b.distinct;
}

bool distinguishable(const fix::FixtureCase& fc, const Outputs& got,
                     const std::map<std::string, OutputAllowance>& allow, const Layout& lay,
                     const Predictions* a, const Predictions* b, const Predictions& spec) {
  if (a->grid != (b ? b->grid : spec.grid)) return true;  // an interval prediction
  for (const auto& [name, exp] : fc.expected) {
    if (!scorable(exp, got, name, allow)) continue;
    const auto fi = lay.flat.find(name);
    const auto si = spec.find(name);
    const auto ai = a->find(name);
    if (fi == lay.flat.end() || si == spec.end() || ai == a->end()) continue;
    const std::vector<double>* bv = nullptr;
    if (b) {
      const auto bi = b->find(name);
      if (bi == b->end()) continue;
      bv = &bi->second;
    }
    const auto& al = allow.at(name);
    const DType t = exp.value.dtype;
    const auto& flat = fi->second;
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      if (std::isnan(al.abs[i])) continue;
      const double exact = exp.f64[i];
      const double pa = predicted(ai->second[ci], si->second[ci], exact, t == DType::float64);
      const double pb = bv ? predicted((*bv)[ci], si->second[ci], exact, t == DType::float64) : exact;
      if (std::fabs(pa - pb) <= kSameWithin * al.abs[i]) continue;
      const double ra = ref::round_to(pa, t), rb = ref::round_to(pb, t);
      if (ra == rb || (std::isnan(ra) && std::isnan(rb))) continue;
      return true;
    }
  }
  return false;
}

std::uint64_t hash_of(const Predictions& p) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto* m : {&p.values, &p.slack})
    for (const auto& [name, v] : *m) {
      for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
      for (double d : v) {
        const std::uint64_t b = std::isnan(d) ? 0x7ff8000000000000ull : std::bit_cast<std::uint64_t>(d);
        h = (h ^ b) * 1099511628211ull;
      }
    }
  return h;
}
}  // namespace normcheck::conf::diag
