#include "normcheck/conformance/checker.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

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

}  // namespace

double element_error(double got, double exact, double expected, ref::DType t) {
  return error_of(got, exact, expected, t);
}

CaseResult check_case(const fix::FixtureCase& fc, const Outputs& got,
                      const std::map<std::string, OutputAllowance>& allow) {
  CaseResult res;
  res.case_id = fc.id;
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
      o.reason = fmt::format("shape [{}] where [{}] is expected", fmt::join(t.shape, ", "),
                             fmt::join(exp.value.shape, ", "));
      res.outputs.push_back(std::move(o));
      continue;
    }
    if (t.dtype != exp.value.dtype) {
      o.verdict = Verdict::failed;
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
    double worst_key = -1;
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
      const double err = std::isnan(g) && at->second.nan_ok[i] ? 0.0 : error_of(g, exact, expected, o.dtype);
      const double ratio = err == 0 ? 0.0 : (allowance > 0 ? err / allowance : INFINITY);
      if (err > allowance) ++o.failed;
      const double ulp = err / ulp_of(std::isfinite(exact) ? exact : expected, o.dtype);
      o.max_ulp = std::max(o.max_ulp, ulp);
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
    if (o.worst_index >= 0) o.worst_coords = coords_of(o.worst_index, exp.value.shape);
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

}  // namespace normcheck::conf
