#include "normcheck/properties/generators.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <rapidcheck.h>

#include "normcheck/fixtures/error.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/quant.hpp"

namespace normcheck::prop {
namespace {

using json = nlohmann::json;
using ref::DType;

template <class T>
bool has(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// One of `choices`, drawn with the given weights; shrinks towards the first choice. Choices
// with weight 0 are left out; an empty list discards the test case.
template <class T>
T pick(const std::vector<std::pair<int, T>>& choices) {
  std::vector<std::size_t> slots;
  for (std::size_t i = 0; i < choices.size(); ++i)
    for (int k = 0; k < choices[i].first; ++k) slots.push_back(i);
  if (slots.empty()) RC_DISCARD("no choice left for this field");
  return choices[slots[draw_index(slots.size())]].second;
}

// Uniform in [lo, hi], shrinking towards lo. Unlike gen::inRange it ignores RapidCheck's size,
// which ramps from 0 over the whole run and would keep the rarer choices of every list out of
// all but the last tests; sizes are scaled where that is meant (draw_case, max_hidden).
rc::Gen<std::int64_t> uniform(std::int64_t lo, std::int64_t hi) {
  return rc::Gen<std::int64_t>([lo, hi](const rc::Random& random, int) {
    const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
    const auto v = lo + static_cast<std::int64_t>(rc::Random(random).next() % span);
    return rc::shrinkable::shrinkRecur(v, [lo](std::int64_t x) { return rc::shrink::towards<std::int64_t>(x, lo); });
  });
}

std::int64_t pick_in(std::int64_t lo, std::int64_t hi) { return *uniform(lo, hi); }

// The divisors of n (n >= 1), smallest first.
std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> d;
  for (std::int64_t k = 1; k * k <= n; ++k)
    if (n % k == 0) {
      d.push_back(k);
      if (k != n / k) d.push_back(n / k);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// A factorization of `rows` into `dims` leading dims (each >= 1).
std::vector<std::int64_t> split_rows(std::int64_t rows, int dims) {
  std::vector<std::int64_t> out;
  std::int64_t left = rows;
  for (int i = 0; i + 1 < dims; ++i) {
    const auto d = draw_from(divisors(left));
    out.push_back(d);
    left /= d;
  }
  out.push_back(left);
  return out;
}

// Dtypes in the order a shrink prefers them: float32 first.
const std::vector<DType> kDtypeOrder{DType::float32, DType::bfloat16, DType::float16, DType::float64};

DType pick_dtype(const std::vector<DType>& allowed, DType same, bool mixed) {
  std::vector<std::pair<int, DType>> ch;
  if (has(allowed, same)) ch.push_back({mixed ? 6 : 1, same});
  if (mixed)
    for (DType t : kDtypeOrder)
      if (t != same && has(allowed, t)) ch.push_back({t == DType::float32 ? 3 : 1, t});
  return pick(ch);
}

// large_mean rows need sigma above the dtype's spacing near the mean (CASES.md).
double spacing_ratio_limit(DType t) {  // largest mean/sigma the dtype resolves: 2^(p-2)
  return std::ldexp(1.0, ref::format_of(t).precision - 2);
}

json draw_x_family(const ref::Case& c, std::int64_t hidden, std::int64_t rows, bool nonfinite, std::string& name) {
  const DType t = c.dtype_x;
  const bool f16 = t == DType::float16;
  enum Fam { ints, normal, large_mean, constant, near_constant, zeros, below_eps, fp16_overflow, subnormal,
             mixed_const, nan_row, inf_row };
  const bool block = c.block != ref::Block::none;
  const Fam f = pick<Fam>({{3, ints},
                           {6, normal},
                           {3, large_mean},
                           {2, constant},
                           {1, near_constant},
                           {1, zeros},
                           {c.epsilon > 0 && !block ? 2 : 0, below_eps},
                           {block ? 0 : 2, fp16_overflow},
                           {block ? 0 : 1, subnormal},
                           {rows > 1 ? 1 : 0, mixed_const},
                           {nonfinite && !block ? 1 : 0, nan_row},
                           {nonfinite && !block ? 1 : 0, inf_row}});
  switch (f) {
    case ints: {
      name = "integers";
      // A short list of small integers tiled over x: shrinks to zeros and ones.
      const auto len = static_cast<std::size_t>(std::min<std::int64_t>(hidden * rows, 16));
      // 0, 1, -1, 2, -2, ... 4, -4: shrinks towards 0.
      auto v = *rc::gen::container<std::vector<std::int64_t>>(len, uniform(0, 8));
      for (auto& k : v) k = k % 2 ? (k + 1) / 2 : -(k / 2);
      return json{{"family", "values"}, {"values", v}};
    }
    case normal: {
      name = "normal";
      const double mean = pick<double>({{4, 0.0}, {2, 1.0}, {1, -3.0}, {1, 5.0}});
      const double sd = pick<double>({{4, 1.0}, {2, 0.1}, {1, 4.0}, {1, 0.003}});
      return json{{"family", "normal"}, {"mean", mean}, {"std", sd}};
    }
    case large_mean: {
      name = "large_mean";
      const double mean = pick<double>({{3, 1000.0}, {1, -100.0}, {1, 10000.0}, {1, 3.0}});
      std::vector<std::pair<int, double>> conds;
      for (double k : {100.0, 1e3, 1e4, 1e5, 1e6})
        if (k <= spacing_ratio_limit(t) && (!f16 || mean * 6 < 60000)) conds.push_back({1, k});
      const double cond = pick(conds);
      if (f16 && std::fabs(mean) > 10000) RC_DISCARD("float16 mean out of range");
      return json{{"family", "large_mean"}, {"mean", mean}, {"cond", cond}};
    }
    case constant: {
      name = "constant";
      const double v = pick<double>({{3, 1.0}, {1, 0.0}, {1, -2.5}, {1, 768.0}, {1, 0.1}});
      return json{{"family", "constant"}, {"value", v}};
    }
    case near_constant: {
      name = "near_constant";
      const double v = pick<double>({{2, 1.0}, {1, 100.0}, {1, -0.3}});
      return json{{"family", "near_constant"}, {"value", v}, {"ulps", pick_in(1, 4)}};
    }
    case zeros: name = "zeros"; return json{{"family", "zeros"}};
    case below_eps: {
      name = "variance_below_eps";
      const double ratio = pick<double>({{2, 1e-4}, {1, 1e-2}, {1, 1.0}});
      return json{{"family", "variance_below_eps"}, {"ratio", ratio}};
    }
    case fp16_overflow: {
      name = "fp16_near_overflow";
      const double hi = pick<double>({{2, 2000.0}, {1, 65504.0}});
      return json{{"family", "fp16_near_overflow"}, {"lo", 256.0}, {"hi", hi}};
    }
    case subnormal: name = "subnormal"; return json{{"family", "subnormal"}, {"fraction", pick<double>({{1, 0.5}, {1, 1.0}})}};
    case mixed_const:
      name = "mixed_constant_rows";
      return json{{"family", "mixed"},
                  {"parts", json::array({json{{"family", "constant"}, {"value", 2.0}}, json{{"family", "normal"}}})}};
    case nan_row: name = "nan_row"; return json{{"family", "nan_row"}};
    case inf_row: name = "inf_row"; return json{{"family", "inf_row"}};
  }
  return json{{"family", "normal"}};
}

// A quantization contract (reference/CASE_JSON.md, "quant"): one of the named presets (as the
// quant tier uses them), or the format, scale kind and every field where real kernels differ drawn
// one by one. Shrinks towards vllm_static_fp8. `block` is set to the format's block size (MX 32,
// NVFP4 16, else 0); `static_scale` whether the case takes the input `scale`.
json draw_quant(const conf::Capabilities& caps, int& block, bool& static_scale) {
  json q = json::object();
  std::string format, scale;
  if (pick<bool>({{1, true}, {1, false}})) {
    const auto& presets = ref::quant_presets();
    const auto& [name, contract] = presets[draw_index(presets.size())];
    q["preset"] = name;
    format = std::string(ref::name_of(contract.format));
    scale = std::string(ref::name_of(contract.scale));
    // The MX presets in E5M2 as well (the quant tier's ocp_mxfp8_e5m2).
    if (contract.scale == ref::ScaleKind::mx_block && pick<bool>({{3, false}, {1, true}})) {
      format = "mxfp8_e5m2";
      q["format"] = format;
    }
  } else {
    format = pick<std::string>({{2, "float8_e4m3fn"}, {1, "float8_e5m2"}, {1, "int8"}, {1, "mxfp8_e4m3"},
                                {1, "mxfp8_e5m2"}, {1, "nvfp4_e2m1"}});
    if (format == "mxfp8_e4m3" || format == "mxfp8_e5m2")
      scale = "mx_block";
    else if (format == "nvfp4_e2m1")
      scale = "nvfp4_block";
    else
      scale = pick<std::string>({{1, "static_tensor"}, {1, "dynamic_token"}});
    q["format"] = format;
    q["scale"] = scale;
    q["residual_sum"] = pick<std::string>({{1, "rounded"}, {1, "unrounded"}});
    q["value"] = pick<std::string>({{1, "activation"}, {1, "float32"}});
    if (scale == "static_tensor" || scale == "dynamic_token")
      q["apply"] = pick<std::string>({{1, "reciprocal"}, {1, "divide"}, {1, "multiply"}});
    if (scale == "mx_block") q["mx_rule"] = pick<std::string>({{1, "floor"}, {1, "round_up"}});
    q["nan"] = pick<std::string>({{2, "nan_code"}, {1, "unspecified"}});
    if (scale == "dynamic_token" && pick<bool>({{3, false}, {1, true}}))
      q["scale_ub"] = pick<double>({{1, 2.0}, {1, 1200.0}});  // a bound some rows' amax exceed
  }
  json outputs = json::array();
  if (pick<bool>({{3, false}, {1, true}})) outputs.push_back("amax");
  if (pick<bool>({{3, false}, {1, true}})) outputs.push_back("y");
  if (!outputs.empty()) q["outputs"] = outputs;
  // A candidate is sent only the formats and scale kinds it declares (capabilities.hpp).
  const auto f = ref::parse_qformat(format);
  const auto k = ref::parse_scale_kind(scale);
  if (!f || std::find(caps.quant_formats.begin(), caps.quant_formats.end(), *f) == caps.quant_formats.end() || !k ||
      std::find(caps.quant_scales.begin(), caps.quant_scales.end(), *k) == caps.quant_scales.end())
    RC_DISCARD("a code format or scale kind the candidate does not declare");
  block = format == "nvfp4_e2m1" ? 16 : (format == "mxfp8_e4m3" || format == "mxfp8_e5m2") ? 32 : 0;
  static_scale = scale == "static_tensor";
  return q;
}

}  // namespace

std::size_t draw_index(std::size_t n) {
  if (n == 0) RC_DISCARD("no choice left for this field");
  return static_cast<std::size_t>(pick_in(0, static_cast<std::int64_t>(n) - 1));
}

std::int64_t draw_hidden(std::int64_t max) {
  max = std::max<std::int64_t>(max, 1);
  enum Kind { tiny, small, odd, pow2, any };
  const Kind k = pick<Kind>({{4, tiny}, {4, small}, {2, odd}, {3, pow2}, {1, any}});
  std::int64_t h = 1;
  switch (k) {
    case tiny: h = pick_in(1, 3); break;
    case small: h = pick_in(4, 32); break;
    case odd: h = 2 * pick_in(0, std::max<std::int64_t>(0, (max - 1) / 2)) + 1; break;
    case pow2: {
      const int e = static_cast<int>(pick_in(1, 13));
      h = (std::int64_t{1} << e) + pick<std::int64_t>({{1, 0}, {1, -1}, {1, 1}});
      break;
    }
    case any: h = pick_in(1, max); break;
  }
  if (h > max) RC_DISCARD("hidden size above the limit");
  return h;
}

std::int64_t draw_rows(std::int64_t hidden, std::int64_t max_elements, bool many) {
  // One list, smallest first, so that a shrink walks down through every smaller count (and the
  // smaller thresholds) towards one row: 1..8 (weight 8 each), 9..64 (1 each), the thresholds
  // where kernels switch code paths (3 each).
  const std::int64_t cap = std::max<std::int64_t>(1, max_elements / hidden);
  std::vector<std::pair<int, std::int64_t>> choices;
  for (std::int64_t r = 1; r <= std::min<std::int64_t>(8, cap); ++r) choices.push_back({8, r});
  for (std::int64_t r = 9; r <= std::min<std::int64_t>(64, cap); ++r) choices.push_back({1, r});
  for (std::int64_t r : {255, 256, 257, 1023, 1024, 1025, 4096})
    if (r * hidden <= max_elements) choices.push_back({3, r});
  if (many && hidden <= 3)
    for (std::int64_t r : {65535, 65536, 65537}) choices.push_back({6, r});
  return pick(choices);
}

DrawnCase materialize_entry(const json& entry, std::uint64_t seed) {
  DrawnCase d;
  d.entry = entry;
  d.seed = seed;
  d.spec = fix::parse_case_entry(entry, "generated");
  d.c = fix::materialize(d.spec, seed);
  return d;
}

DrawnCase draw_case(const conf::Capabilities& caps, const CaseLimits& lim) {
  json e;
  e["id"] = "prop";
  // op
  std::vector<std::pair<int, ref::Op>> ops;
  for (ref::Op o : {ref::Op::layernorm, ref::Op::rmsnorm})
    if (has(caps.ops, o) && (lim.ops.empty() || has(lim.ops, o))) ops.push_back({1, o});
  const ref::Op op = pick(ops);
  e["op"] = ref::name_of(op);
  // fused quantization: forward over the last dim, no block (drawn only where the candidate
  // declares it, so that other candidates' draws are unchanged)
  int qblock = 0;
  bool qstatic = false;
  const bool quant = lim.quant && !caps.quant_formats.empty() && !caps.quant_scales.empty() && !lim.blocks_required && has(caps.directions, ref::Direction::forward) &&
                     (lim.directions.empty() || has(lim.directions, ref::Direction::forward)) &&
                     pick<bool>({{lim.quant_required ? 0 : 3, false}, {1, true}});
  if (lim.quant_required && !quant) RC_DISCARD("only quantized cases (--quant-only), and none fits here");
  if (quant) e["quant"] = draw_quant(caps, qblock, qstatic);
  // block or plain
  const bool block = !quant && (lim.blocks || lim.blocks_required) && caps.blocks &&
                     pick<bool>({{lim.blocks_required ? 0 : 9, false}, {1, true}});
  if (lim.blocks_required && !block) RC_DISCARD("the candidate has no blocks");
  // direction
  std::vector<std::pair<int, ref::Direction>> dirs;
  for (auto [w, d] : {std::pair{3, ref::Direction::forward}, std::pair{1, ref::Direction::backward}})
    if (has(caps.directions, d) && (lim.backward || d == ref::Direction::forward) &&
        (lim.directions.empty() || has(lim.directions, d)) && (!quant || d == ref::Direction::forward))
      dirs.push_back({w, d});
  const ref::Direction dir = pick(dirs);
  e["direction"] = ref::name_of(dir);

  // dtypes
  const DType dx = pick_dtype(caps.dtypes, DType::float32, true);
  const bool mixed = lim.mixed_dtypes && !block;
  const DType dp = pick_dtype(caps.dtypes, dx, mixed);
  // A quantized case's y (the value it quantizes) is float32, float16 or bfloat16.
  DType dout = pick_dtype(caps.dtypes, dx, mixed);
  if (quant && dout == DType::float64) dout = has(caps.dtypes, DType::float32) ? DType::float32 : dout;
  const DType dc = pick_dtype(caps.compute_dtypes, DType::float32, true);
  e["dtype_x"] = ref::name_of(dx);
  e["dtype_param"] = ref::name_of(dp);
  e["dtype_out"] = ref::name_of(dout);
  e["dtype_compute"] = ref::name_of(dc);

  // epsilon
  const double eps = pick<double>({{4, 1e-5}, {2, 1e-6}, {1, 1e-12}, {1, 0.0}, {2, 1e-2}, {1, 1.0}});
  e["epsilon"] = eps;

  // affine and offset
  std::vector<std::pair<int, ref::Affine>> affines;
  for (auto [w, a] : {std::pair{1, ref::Affine::none}, std::pair{2, ref::Affine::weight},
                      std::pair{lim.unit_affine ? 0 : 4, ref::Affine::weight_bias}})
    if (lim.affines.empty() || has(lim.affines, a)) affines.push_back({w, a});
  const ref::Affine affine = pick(affines);
  e["affine"] = ref::name_of(affine);
  double offset = 0;
  if (affine != ref::Affine::none && caps.weight_offset) offset = pick<double>({{4, 0.0}, {1, 1.0}});
  if (offset != 0) e["weight_offset"] = offset;

  // shape and normalized dims
  std::int64_t hidden = 1, rows = 1;
  std::vector<std::int64_t> shape;
  json inputs = json::object();
  if (block) {
    std::vector<std::pair<int, ref::Block>> kinds;
    for (ref::Block k : {ref::Block::post, ref::Block::pre, ref::Block::sandwich, ref::Block::deepnorm})
      if (lim.block_kinds.empty() || has(lim.block_kinds, k)) kinds.push_back({1, k});
    const ref::Block b = pick(kinds);
    e["block"] = ref::name_of(b);
    if (b == ref::Block::deepnorm) e["alpha"] = pick<double>({{1, 2.0}, {1, 0.5}, {1, 1.5}});
    e["layers"] = pick_in(1, 2);
    e["activation"] = pick<std::string>({{1, "relu"}, {1, "gelu"}});
    hidden = pick_in(1, 16);
    rows = pick_in(1, 6);
    e["ffn_hidden"] = pick_in(1, 16);
    shape = {rows, hidden};
  } else {
    // RapidCheck's size (0 .. --max-size, growing over the run) scales the largest row: early
    // tests are small, the last ones reach max_hidden.
    const int size = *rc::gen::withSize([](int sz) { return rc::gen::just(sz); });
    const std::int64_t max_hidden =
        std::max<std::int64_t>(4, lim.max_hidden * std::min(size, 100) / 100);
    // MX and NVFP4 rows are whole blocks: a number of blocks drawn as a hidden size.
    hidden = qblock ? qblock * draw_hidden(std::max<std::int64_t>(1, max_hidden / qblock)) : draw_hidden(max_hidden);
    rows = draw_rows(hidden, lim.max_elements, lim.many_rows);
    enum Layout { last, axis_m2, axes_1 };
    const bool general = lim.general_axes && caps.general_axes && !quant;
    std::vector<std::pair<int, Layout>> layouts{{8, last}};
    std::vector<std::int64_t> hdiv = divisors(hidden);
    if (general && hidden > 1) layouts.push_back({1, axis_m2});
    if (general) layouts.push_back({1, axes_1});
    const Layout layout = pick(layouts);
    const int lead = static_cast<int>(pick_in(rows == 1 && layout == last ? 0 : 1, 3));
    if (layout == last) {
      if (lead > 0) shape = split_rows(rows, lead);
      shape.push_back(hidden);
    } else if (layout == axis_m2) {
      shape = split_rows(rows, std::max(lead, 1));
      const auto h1 = draw_from(hdiv);
      shape.push_back(h1);
      shape.push_back(hidden / h1);
      e["axis"] = -2;
    } else {
      const auto s = split_rows(rows, 2);
      shape = {s[0], hidden, s[1]};
      e["axes"] = json::array({1});
    }
  }
  e["shape"] = shape;

  // residual
  if (!block && lim.residual && caps.residual) {
    const ref::Residual r = pick<ref::Residual>(
        {{lim.residual_required ? 0 : 6, ref::Residual::none}, {2, ref::Residual::add}, {1, ref::Residual::add_bias}});
    if (r != ref::Residual::none) {
      e["residual"] = ref::name_of(r);
      e["dtype_residual"] = ref::name_of(pick_dtype(caps.dtypes, dx, mixed));
      const double alpha = pick<double>({{4, 1.0}, {1, 0.5}, {1, 2.0}, {1, 1.25}});
      if (alpha != 1) e["alpha"] = alpha;
    }
  }

  if (lim.residual_required && !e.contains("residual")) RC_DISCARD("the candidate has no fused residual");

  // contract
  if (!block && lim.contracts) {
    std::vector<std::pair<int, std::string>> cs{{8, "exact"}};
    for (const char* name : {"llama", "gemma", "te", "te_wdtype", "onnx", "fused_add_lowp", "llama+fused_add_lowp"})
      if (!conf::unsupported_reason(caps, [&] {
             ref::Case probe;
             probe.contract = name;
             probe.dtype_x = probe.dtype_param = probe.dtype_out = probe.dtype_residual = caps.dtypes.front();
             probe.dtype_compute = caps.compute_dtypes.front();
             probe.op = caps.ops.front();
             probe.direction = caps.directions.front();
             probe.affine = ref::Affine::none;
             probe.inputs["x"] = ref::Tensor{probe.dtype_x, {1, 1}, {0.0}};
             return probe;
           }()))
        cs.push_back({1, name});
    const std::string contract = pick(cs);
    if (contract != "exact") e["contract"] = contract;
  }

  // value families
  ref::Case probe;
  probe.op = op;
  probe.block = block ? ref::Block::post : ref::Block::none;
  probe.epsilon = eps;
  probe.dtype_x = dx;
  std::string family;
  inputs["x"] = draw_x_family(probe, hidden, rows, lim.nonfinite, family);
  if (affine != ref::Affine::none) {
    if (lim.unit_affine) {
      inputs["weight"] = json{{"family", "constant"}, {"value", 1.0 - offset}};
    } else {
      // Quantized cases also draw weights of sigma 300: y beyond E4M3's 448 and E5M2's clamp
      // faults, static scales that saturate.
      const int kind = pick<int>({{4, 0}, {1, 1}, {1, 2}, {quant ? 1 : 0, 3}});
      if (kind == 1) inputs["weight"] = json{{"family", "gemma_weight"}};
      if (kind == 2) inputs["weight"] = json{{"family", "normal"}, {"mean", 1.0 - offset}, {"std", 1.0}};
      if (kind == 3) inputs["weight"] = json{{"family", "normal"}, {"mean", 0.0}, {"std", 300.0}};
    }
  }
  // A static scale (float32, > 0): 1 (the default), a power of two, 3 (whose float32 reciprocal
  // is inexact: reciprocal and division differ), a small one that saturates.
  if (qstatic) {
    const double s = pick<double>({{2, 1.0}, {1, 3.0}, {1, 0.25}, {1, 0.01}, {1, 64.0}});
    inputs["scale"] = json{{"family", "values"}, {"values", json::array({s})}};
  }
  e["inputs"] = inputs;
  e["category"] = "property";
  e["description"] = "generated by normcheck prop";

  const auto seed = static_cast<std::uint64_t>(pick_in(0, 1 << 20));
  DrawnCase d;
  try {
    d = materialize_entry(e, seed);
  } catch (const fix::FixtureError& err) {
    RC_DISCARD(std::string("not a valid case: ") + err.what());
  }
  d.family = family;
  if (auto why = conf::unsupported_reason(caps, d.c)) RC_DISCARD("candidate declines: " + *why);
  std::string& drawn = drawn_cases();
  drawn += (drawn.empty() ? "" : "; ") + case_summary(d.c, d.family);
  if (d.c.quant) ++drawn_quant_cases();
  return d;
}

std::string& drawn_cases() {
  thread_local std::string drawn;
  return drawn;
}

int& drawn_quant_cases() {
  thread_local int n = 0;
  return n;
}

std::string case_summary(const ref::Case& c, const std::string& family) {
  const auto g = ref::geometry_of(c);
  std::string s = fmt::format("{} {} shape [{}] normalized dims [{}] ({} rows of {})", ref::name_of(c.op),
                              ref::name_of(c.direction), fmt::join(g.shape, ", "), fmt::join(g.norm_dims, ", "),
                              g.rows, g.cols);
  if (c.block != ref::Block::none)
    s += fmt::format(", {} block x{} {} alpha {}", ref::name_of(c.block), c.layers, ref::name_of(c.activation),
                     c.alpha);
  s += fmt::format(", x {} param {} out {} compute {}", ref::name_of(c.dtype_x), ref::name_of(c.dtype_param),
                   ref::name_of(c.dtype_out), ref::name_of(c.dtype_compute));
  if (c.residual != ref::Residual::none)
    s += fmt::format(", residual {} ({}) alpha {}", ref::name_of(c.residual), ref::name_of(c.dtype_residual), c.alpha);
  s += fmt::format(", affine {}", ref::name_of(c.affine));
  if (c.weight_offset != 0) s += fmt::format(" offset {}", c.weight_offset);
  s += fmt::format(", contract {}, epsilon {}", c.contract, ref::hex_text(c.epsilon));
  if (c.quant) {
    const auto& q = *c.quant;
    s += fmt::format(", quant {}{} ({}, {}, {}, {}, nan {}{}{})", q.preset.empty() ? "" : q.preset + " ", ref::name_of(q.format),
                     ref::name_of(q.scale), ref::name_of(q.residual_sum), ref::name_of(q.value),
                     q.scale == ref::ScaleKind::mx_block ? ref::name_of(q.mx_rule) : ref::name_of(q.apply),
                     ref::name_of(q.nan), q.amax ? ", amax out" : "", q.y ? ", y out" : "");
  }
  if (!family.empty()) s += ", x " + family;
  return s;
}

}  // namespace normcheck::prop
