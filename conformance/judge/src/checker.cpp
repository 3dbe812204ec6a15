#include "normcheck/judge/checker.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>

namespace normcheck::conf {

std::string_view name_of(Verdict v) {
  switch (v) {
    case Verdict::passed: return "PASSED";
    case Verdict::unsupported: return "UNSUPPORTED";
    case Verdict::mistrusted: return "MISTRUSTED";
    case Verdict::missing: return "MISSING";
    case Verdict::failed: return "FAILED";
    case Verdict::timeout: return "TIMEOUT";
    case Verdict::crashed: return "CRASHED";
  }
  return "?";
}

std::optional<Verdict> parse_verdict(std::string_view name) {
  for (Verdict v : {Verdict::passed, Verdict::unsupported, Verdict::mistrusted, Verdict::missing, Verdict::failed,
                    Verdict::timeout, Verdict::crashed})
    if (name_of(v) == name) return v;
  return std::nullopt;
}

bool is_failure(Verdict v) {
  return v == Verdict::failed || v == Verdict::missing || v == Verdict::crashed || v == Verdict::timeout;
}

namespace {

std::vector<std::int64_t> coords_of(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> c(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    c[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return c;
}

// Error of `got` against the exact value, in value units; infinite when the kinds differ (NaN
// against a number, an infinity where the value does not overflow).
double error_of(double got, double exact, double expected, ref::DType t) {
  if (std::isnan(exact) || std::isnan(expected)) return std::isnan(got) ? 0.0 : INFINITY;
  if (std::isnan(got)) return INFINITY;
  if (std::isinf(expected) && std::isinf(exact)) return got == expected ? 0.0 : INFINITY;
  if (std::isinf(got)) {
    // Overflow: values from the largest finite value plus half an ulp up round to infinity. An
    // infinity of the right sign is as far from the exact value as that threshold is, so it
    // passes only when the exact value is within its allowance of the threshold.
    const double threshold = ref::max_finite(t) + 0.5 * ulp_of(ref::max_finite(t), t);
    if (std::signbit(got) != std::signbit(exact)) return INFINITY;
    return std::max(0.0, threshold - std::fabs(exact));
  }
  return std::fabs(got - exact);
}

// Row index of every element of a tensor of x's shape (-1 when the case's geometry is invalid).
std::vector<std::int64_t> rows_of(const ref::Geometry& g) {
  std::int64_t numel = 1;
  for (auto e : g.shape) numel *= e;
  std::vector<std::int64_t> row(static_cast<std::size_t>(numel), -1);
  for (std::int64_t r = 0; r < g.rows; ++r)
    for (std::int64_t c = 0; c < g.cols; ++c) row[static_cast<std::size_t>(g.row_base[r] + g.col_delta[c])] = r;
  return row;
}

// The probes of OutputResult::probes on rstd: with r the exact rstd of a row, v + eps = 1/r^2;
// the faulty kernel returns rn(r') with r' = 1/sqrt(v n/(n-1) + eps) or 1/sqrt(v + 1e-6), whose
// error is at least |r' - r| - ulp(r) (half an ulp at a value below 2 r).
// `cols`: the normalized size n (the case's geometry, which check_case has already derived).
void probe_rstd(OutputResult& o, std::int64_t cols, double eps, const ref::Output& exp,
                const std::vector<double>& allow) {
  const double n = static_cast<double>(cols);
  if (cols < 2) return;
  double n1 = 0, e6 = 0;
  for (std::size_t i = 0; i < exp.f64.size(); ++i) {
    const double r = exp.f64[i];
    double a = allow[i];
    if (!std::isfinite(r) || r <= 0 || std::isnan(a)) continue;
    if (!exp.certified[i]) a += ulp_of(r, o.dtype);
    const double v = std::max(0.0, 1.0 / (r * r) - eps), slack = ulp_of(r, o.dtype);
    const auto ratio = [&](double faulty) { return std::max(0.0, std::fabs(faulty - r) - slack) / a; };
    n1 = std::max(n1, ratio(1.0 / std::sqrt(v * n / (n - 1) + eps)));
    e6 = std::max(e6, ratio(1.0 / std::sqrt(v + 1e-6)));
  }
  o.probes["variance_over_n_minus_1"] = n1;
  if (eps != 1e-6) o.probes["eps_1e-6"] = e6;
}

}  // namespace


bool diagnosable(const CaseResult& r) {
  if (r.verdict != Verdict::failed) return false;
  for (const auto& o : r.outputs)
    if (o.malformed) return false;
  return true;
}

void describe_case(CaseResult& r, const fix::FixtureCase& fc) {
  const ref::Case& c = fc.c;
  r.op = ref::name_of(c.op);
  r.direction = ref::name_of(c.direction);
  r.block = c.block == ref::Block::none ? "" : std::string(ref::name_of(c.block));
  r.dtype = ref::name_of(c.dtype_x);
  r.category = fc.category;
  r.row_mean_over_sigma.clear();
  const auto xi = c.inputs.find("x");
  if (xi == c.inputs.end()) return;
  ref::Geometry g;
  try {
    g = ref::geometry_of(c);
  } catch (const std::exception&) {
    return;
  }
  r.normalized_size = g.cols;
  const auto find = [&](const char* n) -> const ref::Tensor* {
    const auto it = c.inputs.find(n);
    return it == c.inputs.end() ? nullptr : &it->second;
  };
  const ref::Tensor* res = c.residual != ref::Residual::none ? find("residual") : nullptr;
  const ref::Tensor* rb = c.residual == ref::Residual::add_bias ? find("residual_bias") : nullptr;
  const auto& x = xi->second.data;
  r.row_mean_over_sigma.resize(static_cast<std::size_t>(g.rows));
  std::vector<double> h(static_cast<std::size_t>(g.cols));
  for (std::int64_t row = 0; row < g.rows; ++row) {
    double sum = 0;
    for (std::int64_t col = 0; col < g.cols; ++col) {
      const auto i = static_cast<std::size_t>(g.row_base[row] + g.col_delta[col]);
      double v = i < x.size() ? x[i] : NAN;
      if (res) v = c.alpha * v + (i < res->data.size() ? res->data[i] : NAN);
      if (rb) v += static_cast<std::size_t>(col) < rb->data.size() ? rb->data[static_cast<std::size_t>(col)] : NAN;
      h[static_cast<std::size_t>(col)] = v;
      sum += v;
    }
    // Two passes in binary64: a descriptive number for plots, not part of any bound.
    const double n = static_cast<double>(g.cols), mean = sum / n;
    double ss = 0;
    for (double v : h) ss += (v - mean) * (v - mean);
    const double sigma = std::sqrt(ss / n);
    r.row_mean_over_sigma[static_cast<std::size_t>(row)] =
        !std::isfinite(mean) || !std::isfinite(sigma) ? NAN : sigma == 0 ? INFINITY : std::fabs(mean) / sigma;
  }
}

double element_error(double got, double exact, double expected, ref::DType t) {
  return error_of(got, exact, expected, t);
}

double flush_slack(double got, ref::DType t) {
  return got == 0 ? std::ldexp(1.0, ref::format_of(t).min_exp) : 0.0;
}

void widen_for_flushed_zeros(std::map<std::string, OutputAllowance>& allow, const Outputs& got) {
  for (auto& [name, a] : allow) {
    const auto it = got.find(name);
    if (it == got.end() || it->second.data.size() != a.abs.size()) continue;
    const ref::Tensor& t = it->second;
    for (std::size_t i = 0; i < a.abs.size(); ++i) a.abs[i] += flush_slack(t.data[i], t.dtype);
  }
}

CaseResult check_case(const fix::FixtureCase& fc, const Outputs& got,
                      const std::map<std::string, OutputAllowance>& allow, const CheckOptions& opt) {
  CaseResult res;
  res.case_id = fc.id;
  // Rows of the outputs of x's shape and of the statistics (mean, rstd), for per-row errors.
  std::optional<ref::Geometry> geom;
  std::vector<std::int64_t> x_rows;
  try {
    geom = ref::geometry_of(fc.c);
  } catch (const std::exception&) {
  }
  for (const auto& [name, exp] : fc.expected) {
    OutputResult o;
    o.name = name;
    o.dtype = exp.value.dtype;
    const auto it = got.find(name);
    const auto at = allow.find(name);
    if (it == got.end()) {
      o.verdict = Verdict::missing;
      o.reason = "the candidate did not produce it";
      res.outputs.push_back(std::move(o));
      continue;
    }
    const ref::Tensor& t = it->second;
    if (t.shape != exp.value.shape) {
      o.verdict = Verdict::failed;
      o.malformed = true;
      o.reason = fmt::format("shape [{}] where [{}] is expected", fmt::join(t.shape, ", "),
                             fmt::join(exp.value.shape, ", "));
      res.outputs.push_back(std::move(o));
      continue;
    }
    if (t.dtype != exp.value.dtype) {
      o.verdict = Verdict::failed;
      o.malformed = true;
      o.reason = fmt::format("dtype {} where {} is expected", ref::name_of(t.dtype), ref::name_of(exp.value.dtype));
      res.outputs.push_back(std::move(o));
      continue;
    }
    if (at == allow.end() || at->second.abs.size() != exp.value.data.size() || t.data.size() != exp.value.data.size()) {
      o.verdict = Verdict::failed;
      o.reason = "internal: allowance or data size does not match the expected output";
      res.outputs.push_back(std::move(o));
      continue;
    }
    const auto& a = at->second.abs;
    const double normal_min = std::ldexp(1.0, ref::format_of(o.dtype).min_exp);
    double worst_key = -1;
    // Row of element i: x's shape maps through the geometry; a statistic has one element per row.
    const std::int64_t* row_of = nullptr;
    bool stat_rows = false;
    const bool x_shaped = name == "y" || name == "dx" || name == "residual_out" || name == "dresidual";
    if (geom && x_shaped && exp.value.shape == geom->shape) {
      if (x_rows.empty()) x_rows = rows_of(*geom);
      row_of = x_rows.data();
    } else if (geom && (name == "mean" || name == "rstd") && exp.value.shape == geom->stat_shape &&
               static_cast<std::int64_t>(exp.value.data.size()) == geom->rows) {
      stat_rows = true;
    }
    std::vector<RowError> rows;
    std::vector<std::uint8_t> row_seen;
    if (row_of || stat_rows) {
      rows.resize(static_cast<std::size_t>(geom->rows));
      row_seen.assign(rows.size(), 0);
    }
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      double allowance = a[i];
      if (std::isnan(allowance)) {
        ++o.mistrusted;
        continue;
      }
      ++o.elements;
      const double exact = exp.f64[i], expected = exp.value.data[i], g = t.data[i];
      if (!exp.certified[i]) {
        // Undecided rounding: either neighbour of the exact value is right.
        ++o.uncertified;
        allowance += ulp_of(exact, o.dtype);
      }
      // Sensitivity (TOLERANCE.md 6.1): rn(exact (1 + d)) errs by at least |d| |exact| - ulp(exact)
      // for |d| < 1 (half an ulp of a value below 2 |exact|), so it fails where that exceeds the
      // allowance. Elements in the subnormal range are left out (a declared flush may accept 0).
      const double unit = ulp_of(std::isfinite(exact) ? exact : expected, o.dtype);
      if (std::isfinite(exact) && std::fabs(exact) >= normal_min && std::isfinite(allowance))
        o.sensitivity = std::min(o.sensitivity, (allowance + unit) / std::fabs(exact));
      const double err = std::isnan(g) && at->second.nan_ok[i] ? 0.0 : error_of(g, exact, expected, o.dtype);
      if (const double slack = opt.flush_subnormal_outputs ? flush_slack(g, o.dtype) : 0.0;
          err > allowance && err <= allowance + slack) {
        // A declared flush of a value that may be subnormal: accepted, counted apart, and scored
        // against the widened allowance (its ratio then says how close to the limit it came).
        ++o.flushed;
        allowance += slack;
      }
      const double ratio = err == 0 ? 0.0 : (allowance > 0 ? err / allowance : INFINITY);
      if (err > allowance) ++o.failed;
      const double ulp = err / unit;
      o.max_ulp = std::max(o.max_ulp, ulp);
      o.hist_ulp.add(ulp);
      o.hist_ratio.add(ratio);
      if (!rows.empty()) {
        const std::int64_t r = stat_rows ? static_cast<std::int64_t>(i) : row_of[i];
        if (r >= 0) {
          auto& re = rows[static_cast<std::size_t>(r)];
          re.max_ulp = std::max(re.max_ulp, std::isnan(ulp) ? INFINITY : ulp);
          re.max_ratio = std::max(re.max_ratio, ratio);
          row_seen[static_cast<std::size_t>(r)] = 1;
        }
      }
      o.max_abs = std::max(o.max_abs, err);
      if (std::isfinite(exact) && exact != 0) o.max_rel = std::max(o.max_rel, err / std::fabs(exact));
      if (ratio > worst_key) {
        worst_key = ratio;
        o.max_ratio = ratio;
        o.worst_index = static_cast<std::int64_t>(i);
        o.worst_got = g;
        o.worst_expected = expected;
        o.worst_exact = exact;
        o.worst_allowance = allowance;
      }
    }
    if (stat_rows && name == "rstd") probe_rstd(o, geom->cols, fc.c.epsilon, exp, at->second.abs);
    if (o.worst_index >= 0) o.worst_coords = coords_of(o.worst_index, exp.value.shape);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (!row_seen[r]) continue;  // every element of the row mistrusted
      rows[r].row = static_cast<std::int64_t>(r);
      o.rows.push_back(rows[r]);
    }
    if (o.failed > 0) {
      o.verdict = Verdict::failed;
      o.reason = fmt::format("{} of {} elements beyond their allowance", o.failed, o.elements);
    } else if (o.mistrusted > 0) {
      o.verdict = Verdict::mistrusted;
      o.reason = at->second.reason;
    }
    res.outputs.push_back(std::move(o));
  }
  for (const auto& o : res.outputs) res.verdict = std::max(res.verdict, o.verdict);
  return res;
}

void reject_unrepresentable(CaseResult& res, const Outputs& got, const std::set<std::string>& wider) {
  for (auto& o : res.outputs) {
    const auto it = got.find(o.name);
    if (it == got.end() || o.malformed || wider.count(o.name) || o.dtype == ref::DType::float64) continue;
    const ref::Tensor& t = it->second;
    std::int64_t bad = 0, first = -1;
    for (std::size_t i = 0; i < t.data.size(); ++i)
      if (!std::isnan(t.data[i]) && !ref::representable(t.data[i], o.dtype) && bad++ == 0)
        first = static_cast<std::int64_t>(i);
    if (bad == 0) continue;
    o.verdict = Verdict::failed;
    o.malformed = true;
    o.reason = fmt::format(
        "not a {} value: element [{}] (flat {}) holds {}, which the output's dtype cannot hold ({} of {} elements); "
        "store the outputs as {} values, or declare wider values with the attribute wider_values = 1",
        ref::name_of(o.dtype), fmt::join(coords_of(first, t.shape), ", "), first,
        ref::hex_text(t.data[static_cast<std::size_t>(first)]), bad, t.data.size(), ref::name_of(o.dtype));
  }
  res.verdict = Verdict::passed;
  for (const auto& o : res.outputs) res.verdict = std::max(res.verdict, o.verdict);
}

}  // namespace normcheck::conf
