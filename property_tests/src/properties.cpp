// The properties (properties.hpp). Each test draws its case with generators.cpp, runs the
// candidate, and on a broken relation records the counterexample in ctx.last_failure before
// RC_FAIL: RapidCheck's last failing run is its shrunk counterexample.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <rapidcheck.h>

#include "normcheck/conformance/runner.hpp"
#include "normcheck/conformance/candidate.hpp"
#include "normcheck/judge/tolerance.hpp"
#include "normcheck/judge/checker_quant.hpp"
#include "normcheck/judge/declared.hpp"
#include "normcheck/properties/properties.hpp"
#include "normcheck/reference/evaluate.hpp"
#include "property_support.hpp"

namespace normcheck::prop {

using detail::fail;
using detail::run_candidate;

namespace detail {

fix::FixtureCase reference_case(const ref::Case& c, const std::string& id) {
  fix::FixtureCase fc;
  fc.id = id;
  fc.category = "property";
  fc.c = c;
  fc.c.id = id;
  for (auto& [name, out] : ref::evaluate(c).outputs) fc.expected.emplace(name, std::move(out));
  return fc;
}

conf::CaseResult agreement_of(const Context& ctx, const ref::Case& c, const conf::Outputs& got) {
  const auto fc = reference_case(c, "prop");
  // Codes and scales (TOLERANCE.md, section 10), as `normcheck run` judges them.
  if (c.quant) return conf::check_quant_case(fc, got, conf::check_options_of(ctx.cand.info().caps));
  const auto judged = conf::judged_outputs(fc, ctx.cand.info().caps);
  return conf::check_declared(judged ? *judged : fc, got, conf::derive_allowances(c, ctx.reduction), ctx.reduction,
                              conf::check_options_of(ctx.cand.info().caps));
}

std::map<std::string, conf::OutputAllowance> allowances_of(const Context& ctx, const ref::Case& c,
                                                           const conf::Outputs& got) {
  auto allow = conf::derive_allowances(c, ctx.reduction);
  if (ctx.cand.info().caps.flush_subnormal_outputs) conf::widen_for_flushed_zeros(allow, got);
  return allow;
}

[[noreturn]] void fail(Context& ctx, const ref::Case& c, const std::string& family,
                       const std::string& message, std::optional<conf::CaseResult> agreement, bool crashed,
                       const std::string& plan, const std::string& fault) {
  Failure f;
  f.message = message;
  f.plan = plan;
  f.fault = fault;
  f.replay = c;
  f.family = family;
  f.crashed = crashed;
  f.agreement = std::move(agreement);
  *ctx.last_failure = std::move(f);
  RC_FAIL(message);
}

conf::Outputs run_candidate(Context& ctx, const ref::Case& c, const std::string& family) {
  if (auto why = ctx.cand.declines(c)) RC_DISCARD("declined: " + *why);
  try {
    return ctx.cand.run(c);
  } catch (const conf::CandidateDeclined& e) {
    RC_DISCARD(std::string("declined: ") + e.what());
  } catch (const std::exception& e) {
    fail(ctx, c, family, fmt::format("the candidate failed on the case: {}", e.what()), std::nullopt, true);
  }
}

// Bitwise identity of two values, the policy of DESIGN.md "Property tests": raw bits, so +0 and
// -0 differ; any NaN equals any NaN (payloads are not compared: transports canonicalize them).
bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

std::string value_text(double v, ref::DType t) { return fmt::format("{} ({})", ref::decimal_text(v, t), ref::hex_text(v)); }

bool rowwise(const std::string& name) {
  return name == "y" || name == "mean" || name == "rstd" || name == "residual_out" || name == "dx" ||
         name == "dresidual";
}
bool is_stat(const std::string& name) { return name == "mean" || name == "rstd"; }

// Flat index of element (row, col) of an output of `name` in a case of geometry g; stats have
// one element per row.
std::int64_t flat_index(const ref::Geometry& g, const std::string& name, std::int64_t row, std::int64_t col) {
  return is_stat(name) ? row : g.row_base[static_cast<std::size_t>(row)] + g.col_delta[static_cast<std::size_t>(col)];
}

// Outputs the candidate must produce for the case, checked present with the right size.
const ref::Tensor& output_of(Context& ctx, const ref::Case& c, const std::string& family, const conf::Outputs& got,
                             const std::string& name, std::int64_t numel) {
  const auto it = got.find(name);
  if (it == got.end()) fail(ctx, c, family, fmt::format("output {} missing", name), agreement_of(ctx, c, got), false);
  if (static_cast<std::int64_t>(it->second.data.size()) != numel)
    fail(ctx, c, family, fmt::format("output {} has {} elements, {} expected", name, it->second.data.size(), numel),
         agreement_of(ctx, c, got), false);
  return it->second;
}

std::optional<std::string> within(double l, double al, double r, double ar, bool nan_ok) {
  if (std::isnan(al) || std::isnan(ar)) return std::nullopt;  // mistrusted: not compared
  if (std::isnan(l) || std::isnan(r)) {
    if ((std::isnan(l) && std::isnan(r)) || nan_ok) return std::nullopt;
    return std::string("NaN on one side only");
  }
  if (std::isinf(l) || std::isinf(r)) {
    if (l == r) return std::nullopt;
    return std::string("an infinity on one side only");
  }
  const double d = std::fabs(l - r);
  if (d <= al + ar) return std::nullopt;
  return fmt::format("|difference| {:.6g} > slack {:.6g} (allowances {:.6g} + {:.6g})", d, al + ar, al, ar);
}

}  // namespace detail

namespace {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// Agreement with the certified reference under the tolerance model.

// Quantized cases too (CaseLimits::quant): codes, scales and amax judged as `run` judges them.
CaseLimits with_quant(const CaseLimits& l) {
  CaseLimits q = l;
  q.quant = true;
  return q;
}

void agreement(Context& ctx) {
  const auto d = draw_case(ctx.cand.info().caps, with_quant(ctx.limits));
  const conf::Outputs got = run_candidate(ctx, d.c, d.family);
  const auto res = agreement_of(ctx, d.c, got);
  if (conf::is_failure(res.verdict)) fail(ctx, d.c, d.family, conf::describe(res), res, false);
  std::int64_t flushed = 0;
  for (const auto& o : res.outputs) flushed += o.flushed;
  if (flushed > 0 && ctx.flushed_tests && ctx.flushed_elements) {
    ++*ctx.flushed_tests;
    *ctx.flushed_elements += flushed;
  }
}

// ---------------------------------------------------------------------------------------------
// Bitwise relations.

// Compares every output of `a` and `b` bitwise; `map(name, i_b)` gives the index in `a` of
// element i_b of `b` (identity when null). Returns the first difference.
std::optional<std::string> bitwise_diff(const conf::Outputs& a, const conf::Outputs& b,
                                        const std::function<bool(const std::string&)>& compared,
                                        const std::function<std::int64_t(const std::string&, std::int64_t)>& map,
                                        const std::string& what_a, const std::string& what_b) {
  for (const auto& [name, tb] : b) {
    if (compared && !compared(name)) continue;
    const auto it = a.find(name);
    if (it == a.end()) return fmt::format("output {} produced in {} but not in {}", name, what_b, what_a);
    const ref::Tensor& ta = it->second;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(tb.data.size()); ++i) {
      const std::int64_t ia = map ? map(name, i) : i;
      if (ia < 0) continue;
      if (ia >= static_cast<std::int64_t>(ta.data.size()))
        return fmt::format("output {}: {} has {} elements", name, what_a, ta.data.size());
      const double va = ta.data[static_cast<std::size_t>(ia)], vb = tb.data[static_cast<std::size_t>(i)];
      if (!same_bits(va, vb))
        return fmt::format("output {}: element {} is {} in {} but element {} is {} in {} (not bit-identical)", name,
                           ia, value_text(va, ta.dtype), what_a, i, value_text(vb, tb.dtype), what_b);
    }
  }
  return std::nullopt;
}

// Where the candidate declares a batch- and layout-dependent reduction order
// (NC_CAP_BATCH_DEPENDENT_ORDER), batch and layout invariance hold within tolerance: each side is
// within its allowance of the same exact value (the same row of the same inputs), so the two may
// differ by the sum of the allowances. `map` as for bitwise_diff; ca, cb the cases of a and b.
std::optional<std::string> tolerance_diff(const Context& ctx, const ref::Case& ca, const conf::Outputs& a, const ref::Case& cb,
                                          const conf::Outputs& b,
                                          const std::function<bool(const std::string&)>& compared,
                                          const std::function<std::int64_t(const std::string&, std::int64_t)>& map,
                                          const std::string& what_a, const std::string& what_b) {
  const auto allow_a = allowances_of(ctx, ca, a), allow_b = allowances_of(ctx, cb, b);
  for (const auto& [name, tb] : b) {
    if (compared && !compared(name)) continue;
    const auto it = a.find(name);
    if (it == a.end()) return fmt::format("output {} produced in {} but not in {}", name, what_b, what_a);
    const auto aa = allow_a.find(name), ab = allow_b.find(name);
    if (aa == allow_a.end() || ab == allow_b.end()) continue;
    const ref::Tensor& ta = it->second;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(tb.data.size()); ++i) {
      const std::int64_t ia = map ? map(name, i) : i;
      if (ia < 0) continue;
      if (ia >= static_cast<std::int64_t>(ta.data.size()) || ia >= static_cast<std::int64_t>(aa->second.abs.size()) ||
          i >= static_cast<std::int64_t>(ab->second.abs.size()))
        return fmt::format("output {}: {} has {} elements", name, what_a, ta.data.size());
      const auto ua = static_cast<std::size_t>(ia), ub = static_cast<std::size_t>(i);
      if (auto why = within(ta.data[ua], aa->second.abs[ua], tb.data[ub], ab->second.abs[ub],
                            aa->second.nan_ok[ua] != 0 || ab->second.nan_ok[ub] != 0))
        return fmt::format("output {}: element {} is {} in {} but element {} is {} in {}: {} (the candidate declares a "
                           "batch-dependent reduction order: compared within tolerance)",
                           name, ia, value_text(ta.data[ua], ta.dtype), what_a, i, value_text(tb.data[ub], tb.dtype),
                           what_b, *why);
    }
  }
  return std::nullopt;
}

// Bitwise, or within tolerance where the candidate declares a batch-dependent reduction order.
std::optional<std::string> invariance_diff(const Context& ctx, const ref::Case& ca, const conf::Outputs& a,
                                           const ref::Case& cb, const conf::Outputs& b,
                                           const std::function<bool(const std::string&)>& compared,
                                           const std::function<std::int64_t(const std::string&, std::int64_t)>& map,
                                           const std::string& what_a, const std::string& what_b) {
  if (ctx.cand.info().caps.batch_dependent_order) return tolerance_diff(ctx, ca, a, cb, b, compared, map, what_a, what_b);
  return bitwise_diff(a, b, compared, map, what_a, what_b);
}

// The second call runs with the second sentinel pattern where the transport allocates the
// outputs (DESIGN.md: NaN, then a second pattern on a second run): an element the candidate never
// writes differs between the calls even where its expected value is NaN.
constexpr double kSecondSentinel = -0x1.5555555555555p-2;

struct SentinelScope {
  conf::Candidate& cand;
  bool set;
  SentinelScope(conf::Candidate& c, double v) : cand(c), set(c.set_output_sentinel(v)) {}
  ~SentinelScope() {
    if (set) cand.set_output_sentinel(std::numeric_limits<double>::quiet_NaN());
  }
  SentinelScope(const SentinelScope&) = delete;
  SentinelScope& operator=(const SentinelScope&) = delete;
};

void determinism(Context& ctx) {
  const auto d = draw_case(ctx.cand.info().caps, with_quant(ctx.limits));
  const conf::Outputs first = run_candidate(ctx, d.c, d.family);
  conf::Outputs second;
  bool patterned = false;
  {
    SentinelScope scope(ctx.cand, kSecondSentinel);
    patterned = scope.set;
    second = run_candidate(ctx, d.c, d.family);
  }
  if (auto diff = bitwise_diff(first, second, nullptr, nullptr, "the first call",
                               patterned ? fmt::format("the second call (outputs pre-filled with {}, not NaN)",
                                                       ref::hex_text(kSecondSentinel))
                                         : std::string("the second call")))
    fail(ctx, d.c, d.family, "the same call twice: " + *diff, agreement_of(ctx, d.c, second), false);
}

// Applies f to row `row` of every row-shaped input (x, residual, dy), rounding to its dtype.
void change_row(ref::Case& c, const ref::Geometry& g, std::int64_t row, const std::function<double(double)>& f) {
  for (const char* name : {"x", "residual", "dy"}) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) continue;
    auto& t = it->second;
    for (std::int64_t col = 0; col < g.cols; ++col) {
      auto& v = t.data[static_cast<std::size_t>(g.row_base[static_cast<std::size_t>(row)] +
                                                g.col_delta[static_cast<std::size_t>(col)])];
      v = ref::round_to(f(v), t.dtype);
    }
  }
}

void row_independence(Context& ctx) {
  const auto d = draw_case(ctx.cand.info().caps, ctx.limits);
  const auto g = ref::geometry_of(d.c);
  if (g.rows < 2) RC_DISCARD("the case has one row (two or more needed)");
  const std::int64_t row = static_cast<std::int64_t>(draw_index(static_cast<std::size_t>(g.rows)));
  ref::Case changed = d.c;
  // -v/2 + 1/4: every value moves (no fixed point in any dtype), nothing overflows.
  change_row(changed, g, row, [](double v) { return -0.5 * v + 0.25; });
  const conf::Outputs a = run_candidate(ctx, d.c, d.family);
  const conf::Outputs b = run_candidate(ctx, changed, d.family);
  std::vector<std::uint8_t> in_row(d.c.inputs.at("x").data.size(), 0);
  for (std::int64_t col = 0; col < g.cols; ++col) in_row[static_cast<std::size_t>(flat_index(g, "y", row, col))] = 1;
  auto map = [&](const std::string& name, std::int64_t i) -> std::int64_t {
    // Skip every element of the changed row.
    if (is_stat(name)) return i == row ? -1 : i;
    return in_row[static_cast<std::size_t>(i)] ? -1 : i;
  };
  if (auto diff = bitwise_diff(a, b, rowwise, map, "the case", fmt::format("the case with row {} changed", row))) {
    auto res = agreement_of(ctx, changed, b);
    if (conf::is_failure(res.verdict)) fail(ctx, changed, d.family, "row independence: " + *diff, res, false);
    fail(ctx, d.c, d.family, "row independence: " + *diff, agreement_of(ctx, d.c, a), false);
  }
}

// One row of a case as a case of its own: shape [1, hidden] (last-axis layouts only).
ref::Case single_row(const ref::Case& c, const ref::Geometry& g, std::int64_t row) {
  ref::Case s = c;
  for (const char* name : {"x", "residual", "dy"}) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) continue;
    ref::Tensor t{it->second.dtype, {1, g.cols}, {}};
    for (std::int64_t col = 0; col < g.cols; ++col)
      t.data.push_back(it->second.data[static_cast<std::size_t>(g.row_base[static_cast<std::size_t>(row)] +
                                                                g.col_delta[static_cast<std::size_t>(col)])]);
    s.inputs[name] = std::move(t);
  }
  s.axis = -1;
  s.axes.reset();
  return s;
}

void batch_invariance(Context& ctx) {
  CaseLimits lim = ctx.limits;
  lim.general_axes = false;
  lim.blocks = false;
  const auto d = draw_case(ctx.cand.info().caps, lim);
  const auto g = ref::geometry_of(d.c);
  if (g.rows < 2) RC_DISCARD("the case has one row (two or more needed)");
  // The row: the last (where launch grids run out), the first, or any.
  const int where = static_cast<int>(std::vector<int>{0, 0, 1, 2}[draw_index(4)]);
  const std::int64_t row = where == 0 ? g.rows - 1 : where == 1 ? 0 : static_cast<std::int64_t>(draw_index(static_cast<std::size_t>(g.rows)));
  const ref::Case alone = single_row(d.c, g, row);
  const conf::Outputs batch = run_candidate(ctx, d.c, d.family);
  const conf::Outputs one = run_candidate(ctx, alone, d.family);
  const auto g1 = ref::geometry_of(alone);
  auto map = [&](const std::string& name, std::int64_t i) -> std::int64_t {
    return is_stat(name) ? row : flat_index(g, name, row, i - g1.row_base[0]);
  };
  if (auto diff = invariance_diff(ctx, d.c, batch, alone, one, rowwise, map, fmt::format("a batch of {} rows", g.rows),
                                  fmt::format("row {} alone", row))) {
    auto res = agreement_of(ctx, d.c, batch);
    if (conf::is_failure(res.verdict)) fail(ctx, d.c, d.family, "batch invariance: " + *diff, res, false);
    fail(ctx, alone, d.family, "batch invariance: " + *diff, agreement_of(ctx, alone, one), false);
  }
}

// The rows of a last-axis case [R, H] laid out channels-first as [a, H, b] with axes [1]
// (R = a b): the normalized dim has stride b in memory.
void layout_invariance(Context& ctx) {
  if (!ctx.cand.info().caps.general_axes) RC_DISCARD("the candidate normalizes the last dim only (no general axes)");
  CaseLimits lim = ctx.limits;
  lim.general_axes = false;
  lim.blocks = false;
  const auto d = draw_case(ctx.cand.info().caps, lim);
  const auto g = ref::geometry_of(d.c);
  std::vector<std::int64_t> divs;
  for (std::int64_t k = 1; k <= g.rows; ++k)
    if (g.rows % k == 0) divs.push_back(k);
  const std::int64_t b = draw_from(divs);
  const std::int64_t a = g.rows / b, H = g.cols;
  ref::Case t = d.c;
  t.axis = -1;
  t.axes = std::vector<std::int64_t>{1};
  // element (i, h, j) of the strided layout is element (i b + j, h) of the dense one.
  auto strided_index = [&](std::int64_t row, std::int64_t col) { return ((row / b) * H + col) * b + row % b; };
  for (const char* name : {"x", "residual", "dy"}) {
    auto it = d.c.inputs.find(name);
    if (it == d.c.inputs.end()) continue;
    ref::Tensor s{it->second.dtype, {a, H, b}, std::vector<double>(it->second.data.size())};
    for (std::int64_t r = 0; r < g.rows; ++r)
      for (std::int64_t col = 0; col < H; ++col)
        s.data[static_cast<std::size_t>(strided_index(r, col))] =
            it->second.data[static_cast<std::size_t>(r * H + col)];
    t.inputs[name] = std::move(s);
  }
  if (ctx.cand.declines(t)) RC_DISCARD("the strided layout is declined");
  const conf::Outputs dense = run_candidate(ctx, d.c, d.family);
  const conf::Outputs strided = run_candidate(ctx, t, d.family);
  auto map = [&](const std::string& name, std::int64_t i) -> std::int64_t {
    if (!rowwise(name)) return i;  // parameter gradients: same shape, same rows summed
    if (is_stat(name)) return (i / b) * b + i % b;  // [a, 1, b] -> row i
    const std::int64_t j = i % b, col = (i / b) % H, ii = i / (b * H);
    return (ii * b + j) * H + col;
  };
  if (auto diff = invariance_diff(ctx, d.c, dense, t, strided, nullptr, map,
                                  fmt::format("the dense [{}, {}] layout", g.rows, H),
                                  fmt::format("the strided [{}, {}, {}] axes [1] layout", a, H, b))) {
    auto res = agreement_of(ctx, t, strided);
    if (conf::is_failure(res.verdict)) fail(ctx, t, d.family, "layout invariance: " + *diff, res, false);
    fail(ctx, d.c, d.family, "layout invariance: " + *diff, agreement_of(ctx, d.c, dense), false);
  }
}

// The same case with its inputs in other memory layouts, through the transport (the plugin ABI's
// strided host tensors, candidate.h): rows padded with NaN, the tensors starting 64-256 bytes into
// their buffers, column-major strides, or all of these. Bit-identical outputs (within tolerance
// where the candidate declares a batch-dependent reduction order).
struct LayoutScope {
  conf::Candidate& cand;
  bool set;
  LayoutScope(conf::Candidate& c, const conf::InputLayout& l) : cand(c), set(c.set_input_layout(l)) {}
  ~LayoutScope() {
    if (set) cand.set_input_layout(conf::InputLayout{});
  }
  LayoutScope(const LayoutScope&) = delete;
  LayoutScope& operator=(const LayoutScope&) = delete;
};

void memory_layout_invariance(Context& ctx) {
  if (!ctx.cand.set_input_layout(conf::InputLayout{}))
    RC_DISCARD("the transport does not allocate the inputs (plugins only)");
  const auto d = draw_case(ctx.cand.info().caps, ctx.limits);
  const int kind = static_cast<int>(draw_index(4));  // padded + offset, column-major, both, offset only
  conf::InputLayout lay;
  lay.pad = kind == 0 || kind == 2 ? 1 + static_cast<std::int64_t>(draw_index(7)) : 0;
  lay.offset_bytes = kind != 1 ? 64 * (1 + static_cast<std::int64_t>(draw_index(4))) : 0;
  lay.column_major = kind == 1 || kind == 2;
  const conf::Outputs dense = run_candidate(ctx, d.c, d.family);
  conf::Outputs other;
  {
    LayoutScope scope(ctx.cand, lay);
    other = run_candidate(ctx, d.c, d.family);
  }
  const std::string what = fmt::format("inputs{}{}{}", lay.pad ? fmt::format(" padded with {} NaN after each row", lay.pad) : "",
                                       lay.offset_bytes ? fmt::format(" starting {} bytes into their buffers", lay.offset_bytes) : "",
                                       lay.column_major ? " in column-major order" : "");
  if (auto diff = invariance_diff(ctx, d.c, dense, d.c, other, nullptr, nullptr, "dense row-major inputs", what)) {
    auto res = agreement_of(ctx, d.c, dense);  // what `normcheck run` replays: the dense layout
    fail(ctx, d.c, d.family,
         fmt::format("memory layout invariance: {} (the counterexample file replays the dense layout)", *diff), res,
         false);
  }
}

}  // namespace

const std::vector<Property>& properties() {
  static const std::vector<Property> all = [] {
    std::vector<Property> p{
        {"agreement", "outputs agree with the certified reference within the tolerance model", agreement},
        {"determinism",
         "the same call twice gives bit-identical outputs (the second with the outputs pre-filled with a second "
         "sentinel pattern where the transport allocates them)",
         determinism},
        {"row_independence", "changing one row leaves every other row's outputs bit-identical", row_independence},
        {"batch_invariance",
         "a row gives bit-identical outputs alone and in a batch (1, 7, 255-257, 1023-1025, 4096, 65535-65537 rows)",
         batch_invariance},
        {"layout_invariance",
         "rows read from strided memory (channels-first [a, H, b], axes [1]) give bit-identical outputs",
         layout_invariance},
        {"memory_layout_invariance",
         "the same inputs padded, offset or column-major in memory (plugin ABI strides) give bit-identical outputs",
         memory_layout_invariance},
    };
    for (auto& q : metamorphic_properties()) p.push_back(std::move(q));
    for (auto& q : composition_properties()) p.push_back(std::move(q));
    return p;
  }();
  return all;
}

}  // namespace normcheck::prop
