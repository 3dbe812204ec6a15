// The shapes the papers predict, measured on a study result, and the results file.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "normcheck/study/placement.hpp"

namespace normcheck::study {

using Json = nlohmann::ordered_json;

namespace {

bool has(const std::vector<Placement>& v, Placement p) { return std::find(v.begin(), v.end(), p) != v.end(); }

// Least-squares slope of y against x.
double slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

std::string g3(double v) { return fmt::format("{:.3g}", v); }

Json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? Json("nan") : Json(v > 0 ? "inf" : "-inf");
}

Json numbers(const std::vector<double>& v) {
  Json a = Json::array();
  for (double e : v) a.push_back(number(e));
  return a;
}

// The thresholds of the checks, set from the papers' statements before the multi-seed numbers
// were measured (README.md "Checked against the papers"). They state the shape, not the papers'
// constants (the papers bound orders of growth; a small synthetic stack has its own constants),
// and each is applied to a statistic over the seeds (the claims are about the expectation over
// the initialization): "grows with the layer index" is a fitted last-over-first ratio
// exp(mean slope) of ||dL/dW2|| over all layers of at least kGrows, with the mean slope more than
// kSignificance standard errors above 0 (a trend the seeds agree on, not one draw's); "roughly
// constant" a fitted ratio within [1/kFlat, kFlat]; 1/sqrt(L) an exponent within kExponentSlack
// of -1/2; "bounded" a growth of ||ΔF|| with L of exponent at most kBoundedExponent (at most 1.5x
// from L = 6 to 48) where Post-LN's exponent is at least kGrowingExponent; "more slowly" an
// exponent at least kSlowerBy below Post-LN's.
constexpr double kGrows = 1.5, kFlat = 1.5, kExponentSlack = 0.2, kSignificance = 2.0;
constexpr double kBoundedExponent = 0.2, kGrowingExponent = 0.5, kSlowerBy = 0.4;

// Mean and standard error of per-seed slopes of y_s against x.
Trend trend_over(const std::vector<double>& x, const std::vector<std::vector<double>>& ys) {
  Trend t;
  for (const auto& y : ys) t.per_seed.push_back(slope(x, y));
  const double n = static_cast<double>(t.per_seed.size());
  for (double b : t.per_seed) t.slope += b / n;
  if (t.per_seed.size() > 1) {
    double ss = 0;
    for (double b : t.per_seed) ss += (b - t.slope) * (b - t.slope);
    t.se = std::sqrt(ss / (n - 1) / n);
  }
  return t;
}

const SeedRun* find_seeds(const StudyResult& r, Placement p, ref::Op n, std::int64_t layers) {
  for (const auto& run : r.seed_runs)
    if (run.placement == p && run.norm == n && run.layers == layers) return &run;
  return nullptr;
}

Json trend_json(const Trend& t) {
  return Json{{"mean", number(t.slope)}, {"se", number(t.se)}, {"per_seed", numbers(t.per_seed)}};
}

std::vector<std::int64_t> depths_from(const StudyResult& r, std::int64_t min_layers) {
  std::vector<std::int64_t> d;
  for (auto l : r.options.depths)
    if (l >= min_layers) d.push_back(l);
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

// The rate of the lowest final loss (null when no run finished).
Json best_lr(const std::vector<double>& lrs, const SweepRun& w) {
  Json best(nullptr);
  double low = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < w.losses.size(); ++k)
    if (!w.losses[k].empty() && std::isfinite(w.losses[k].back()) && w.losses[k].back() < low) low = w.losses[k].back(), best = lrs[k];
  return best;
}

}  // namespace

double geometric_mean(const std::vector<double>& v) {
  double acc = 0;
  for (double e : v) acc += std::log(e);
  return std::exp(acc / static_cast<double>(v.size()));
}

std::vector<double> geometric_mean_profile(const std::vector<std::vector<double>>& per_seed) {
  std::vector<double> g;
  if (per_seed.empty()) return g;
  for (std::size_t l = 0; l < per_seed.front().size(); ++l) {
    std::vector<double> v;
    for (const auto& p : per_seed) v.push_back(p[l]);
    g.push_back(geometric_mean(v));
  }
  return g;
}

Trend layer_trend(const std::vector<std::vector<double>>& per_seed) {
  std::vector<std::vector<double>> ys;
  std::vector<double> x;
  if (per_seed.empty()) return {};
  const std::size_t L = per_seed.front().size();
  for (std::size_t l = 0; l < L; ++l) x.push_back(L > 1 ? static_cast<double>(l) / static_cast<double>(L - 1) : 0.0);
  for (const auto& p : per_seed) {
    ys.emplace_back();
    for (double v : p) ys.back().push_back(std::log(v));
  }
  return trend_over(x, ys);
}

std::vector<PaperCheck> paper_checks(const StudyResult& r) {
  std::vector<PaperCheck> out;
  const auto& o = r.options;
  const auto deep = depths_from(r, 6);
  const std::string xiong = "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture";
  const std::string deepnet = "Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers";

  const std::size_t nseeds = static_cast<std::size_t>(o.seeds);
  const std::string over_seeds = nseeds > 1 ? fmt::format("over {} seeds ({}..{})", nseeds, o.seed, o.seed + nseeds - 1)
                                            : fmt::format("over 1 seed ({}; no spread)", o.seed);
  // Figure 3, at initialization: the trend of ||dL/dW2|| over all layers of one placement, over
  // the seeds, at every depth >= 6 and norm, each of which must pass.
  auto figure3 = [&](std::string id, Placement p, std::string claim, bool grows) {
    PaperCheck c{std::move(id), xiong + ", Figure 3", std::move(claim), "not evaluated", "", Json::array()};
    if (has(o.placements, p) && !deep.empty()) {
      bool ok = true;
      std::string words;
      for (auto n : o.norms)
        for (auto L : deep) {
          const SeedRun& sr = *find_seeds(r, p, n, L);
          const Trend t = layer_trend(sr.grad_w2);
          const double ratio = std::exp(t.slope);
          const auto g = geometric_mean_profile(sr.grad_w2);
          if (grows)
            ok &= ratio >= kGrows && (nseeds < 2 || t.slope > kSignificance * t.se);
          else
            ok &= ratio >= 1.0 / kFlat && ratio <= kFlat;
          Json per_seed_ratio = Json::array();
          for (double b : t.per_seed) per_seed_ratio.push_back(number(std::exp(b)));
          c.values.push_back(Json{{"norm", ref::name_of(n)}, {"layers", L}, {"seeds", nseeds},
                                  {"trend_ratio", number(ratio)}, {"log_slope", trend_json(t)},
                                  {"trend_ratio_per_seed", per_seed_ratio},
                                  {"geomean_last_over_first", number(g.back() / g.front())},
                                  {"geomean_max_over_min", number(*std::max_element(g.begin(), g.end()) /
                                                                  *std::min_element(g.begin(), g.end()))}});
          words += fmt::format("{}{} L={}: {} (±2se {}..{})", words.empty() ? "" : "; ", ref::name_of(n), L, g3(ratio),
                               g3(std::exp(t.slope - kSignificance * t.se)), g3(std::exp(t.slope + kSignificance * t.se)));
        }
      c.status = ok ? "reproduced" : "not reproduced";
      c.measured = fmt::format(
          "fitted last-over-first ratio exp(b) of ||dL/dW2|| at initialization, b the slope of ln ||dL/dW2|| against the "
          "layer position l/(L-1) over all layers, mean {} ({} wanted): {}",
          over_seeds,
          grows ? fmt::format("at least {} and b above {} standard errors", kGrows, kSignificance)
                : fmt::format("within 1/{} .. {}", kFlat, kFlat),
          words);
    }
    out.push_back(std::move(c));
  };
  figure3("post_grad_grows_with_layer", Placement::post,
          "At initialization the gradient norm of Post-LN's FFN weights W2 grows with the layer index (largest at the "
          "last layer), in expectation over the initialization.", true);
  figure3("pre_grad_flat_across_layers", Placement::pre,
          "At initialization the gradient norm of Pre-LN's FFN weights W2 stays roughly constant across layers, in "
          "expectation over the initialization.", false);
  // Theorem 1: Pre-LN's last-layer gradient is O(d sqrt(ln d / L)), Post-LN's O(d sqrt(ln d)).
  // Per seed the exponent of pre/post against L; the mean of those is the exponent of the ratio
  // of the geometric means.
  {
    PaperCheck c{"pre_over_post_last_layer_exponent", xiong + ", Theorem 1",
                 "Pre-LN's last-layer gradient norm scales like 1/sqrt(L) relative to Post-LN's (in expectation over the "
                 "initialization).", "not evaluated", "", Json::array()};
    const auto ds = depths_from(r, 1);
    if (has(o.placements, Placement::pre) && has(o.placements, Placement::post) && ds.size() >= 2) {
      bool ok = true;
      std::string words;
      for (auto n : o.norms) {
        std::vector<double> lx;
        std::vector<std::vector<double>> ly(nseeds);
        Json ratios = Json::array();
        for (auto L : ds) {
          const SeedRun &pre = *find_seeds(r, Placement::pre, n, L), &post = *find_seeds(r, Placement::post, n, L);
          std::vector<double> per;
          for (std::size_t k = 0; k < nseeds; ++k) {
            per.push_back(pre.grad_w2[k].back() / post.grad_w2[k].back());
            ly[k].push_back(std::log(per.back()));
          }
          lx.push_back(std::log(static_cast<double>(L)));
          ratios.push_back(number(geometric_mean(per)));
        }
        const Trend t = trend_over(lx, ly);
        ok &= std::fabs(t.slope + 0.5) <= kExponentSlack;
        c.values.push_back(Json{{"norm", ref::name_of(n)}, {"layers", ds}, {"seeds", nseeds}, {"pre_over_post", ratios},
                                {"exponent", number(t.slope)}, {"exponent_se", number(t.se)},
                                {"exponent_per_seed", numbers(t.per_seed)}});
        words += fmt::format("{}{}: {:.3f} ± {:.3f}", words.empty() ? "" : "; ", ref::name_of(n), t.slope, t.se);
      }
      c.status = ok ? "reproduced" : "not reproduced";
      c.measured = fmt::format("exponent k of (pre/post last-layer ||dL/dW2||) ~ L^k over L = {}..{}, mean ± standard error {} "
                               "(-0.5 ± {} wanted): {}",
                               ds.front(), ds.back(), over_seeds, kExponentSlack, words);
    }
    out.push_back(std::move(c));
  }
  // DeepNet: DeepNorm bounds the model update; Post-LN's grows with depth. Measured after the
  // first step (DeepNet's ||F(x, θ*) - F(x, θ)||), as exponents k of ||ΔF|| ~ L^k.
  const auto ds = depths_from(r, 1);
  const bool deepnet_ok = has(o.placements, Placement::deepnorm) && has(o.placements, Placement::post) &&
                          ds.size() >= 2 && o.steps > 0;
  std::vector<std::pair<Trend, Trend>> exps;  // per norm: (post, deepnorm), over the seeds
  if (deepnet_ok)
    for (auto n : o.norms) {
      auto exponent = [&](Placement p) {
        std::vector<double> lx;
        std::vector<std::vector<double>> ly(nseeds);
        for (auto L : ds) {
          lx.push_back(std::log(static_cast<double>(L)));
          const SeedRun& sr = *find_seeds(r, p, n, L);
          for (std::size_t k = 0; k < nseeds; ++k) ly[k].push_back(std::log(sr.model_update[k]));
        }
        return trend_over(lx, ly);
      };
      exps.emplace_back(exponent(Placement::post), exponent(Placement::deepnorm));
    }
  auto exps_words = [&]() {
    std::string words;
    for (std::size_t i = 0; i < exps.size(); ++i)
      words += fmt::format("{}{}: Post-LN {:.2f} ± {:.2f}, DeepNorm {:.2f} ± {:.2f}", words.empty() ? "" : "; ",
                           ref::name_of(o.norms[i]), exps[i].first.slope, exps[i].first.se, exps[i].second.slope,
                           exps[i].second.se);
    return words;
  };
  auto exps_json = [&]() {
    Json v = Json::array();
    for (std::size_t i = 0; i < exps.size(); ++i) {
      Json geo_post = Json::array(), geo_dn = Json::array();
      for (auto L : ds) {
        geo_post.push_back(number(geometric_mean(find_seeds(r, Placement::post, o.norms[i], L)->model_update)));
        geo_dn.push_back(number(geometric_mean(find_seeds(r, Placement::deepnorm, o.norms[i], L)->model_update)));
      }
      v.push_back(Json{{"norm", ref::name_of(o.norms[i])}, {"layers", ds}, {"seeds", nseeds},
                       {"post_exponent", number(exps[i].first.slope)}, {"deepnorm_exponent", number(exps[i].second.slope)},
                       {"post_exponent_se", number(exps[i].first.se)}, {"deepnorm_exponent_se", number(exps[i].second.se)},
                       {"post_exponent_per_seed", numbers(exps[i].first.per_seed)},
                       {"deepnorm_exponent_per_seed", numbers(exps[i].second.per_seed)},
                       {"post_model_update_geomean", geo_post}, {"deepnorm_model_update_geomean", geo_dn}});
    }
    return v;
  };
  {
    PaperCheck c{"deepnorm_update_bounded", deepnet + ", Section 4 (the model update ||ΔF||)",
                 "DeepNorm's model update ||ΔF|| stays bounded as L grows where Post-LN's grows.", "not evaluated", "",
                 Json::array()};
    if (deepnet_ok) {
      bool ok = true;
      for (const auto& [post, dn] : exps) ok &= dn.slope <= kBoundedExponent && post.slope >= kGrowingExponent;
      c.status = ok ? "reproduced" : "not reproduced";
      c.values = exps_json();
      c.measured = fmt::format("exponent k of ||ΔF|| ~ L^k after the first {} step over L = {}..{}, mean ± standard error {} "
                               "(the exponent of the geometric mean; DeepNorm at most {}, Post-LN at least {} wanted): {}",
                               name_of(o.optimizer), ds.front(), ds.back(), over_seeds, kBoundedExponent, kGrowingExponent,
                               exps_words());
    }
    out.push_back(std::move(c));
  }
  {
    PaperCheck c{"deepnorm_update_slower_than_post", deepnet + ", Section 4",
                 "A weaker form: DeepNorm's model update grows with L clearly more slowly than Post-LN's.",
                 "not evaluated", "", Json::array()};
    if (deepnet_ok) {
      bool ok = true;
      for (const auto& [post, dn] : exps) ok &= post.slope - dn.slope >= kSlowerBy;
      c.status = ok ? "reproduced" : "not reproduced";
      c.values = exps_json();
      c.measured = fmt::format("exponents as above, DeepNorm's at least {} below Post-LN's wanted: {}", kSlowerBy, exps_words());
    }
    out.push_back(std::move(c));
  }
  // Xiong et al., Sections 1 and 3.4: Pre-LN trains without the warm-up stage, at larger rates,
  // where Post-LN needs warm-up. Measured on the sweep: Pre-LN's largest usable rate above
  // Post-LN's at every depth and norm (the sweep's grid is coarse; ties fail).
  {
    PaperCheck c{"pre_usable_lr_above_post", xiong + ", Sections 1 and 3.4 (no warm-up, larger learning rates)",
                 "Without warm-up, Pre-LN still trains at larger learning rates than Post-LN.", "not evaluated", "",
                 Json::array()};
    auto sweep_of = [&](Placement p, ref::Op n, std::int64_t L) -> const SweepRun* {
      for (const auto& w : r.sweep)
        if (w.placement == p && w.norm == n && w.layers == L) return &w;
      return nullptr;
    };
    if (!r.sweep.empty() && has(o.placements, Placement::pre) && has(o.placements, Placement::post)) {
      bool ok = true;
      std::string words;
      auto lr_text = [](const std::optional<double>& v) { return v ? fmt::format("{:g}", *v) : std::string("none"); };
      auto lr_json = [](const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); };
      for (auto n : o.norms)
        for (auto L : ds) {
          const SweepRun *pre = sweep_of(Placement::pre, n, L), *post = sweep_of(Placement::post, n, L);
          const double a = pre->largest_usable.value_or(0), b = post->largest_usable.value_or(0);
          ok &= a > b;
          c.values.push_back(Json{{"norm", ref::name_of(n)}, {"layers", L}, {"pre_largest_usable_lr", lr_json(pre->largest_usable)},
                                  {"post_largest_usable_lr", lr_json(post->largest_usable)},
                                  {"pre_smallest_unusable_lr", lr_json(pre->smallest_unusable)},
                                  {"post_smallest_unusable_lr", lr_json(post->smallest_unusable)}});
          words += fmt::format("{}{} L={}: pre {} / post {} (first unusable: {} / {})", words.empty() ? "" : "; ", ref::name_of(n), L,
                               lr_text(pre->largest_usable), lr_text(post->largest_usable), lr_text(pre->smallest_unusable),
                               lr_text(post->smallest_unusable));
        }
      c.status = ok ? "reproduced" : "not reproduced";
      c.measured = fmt::format("largest usable {} rate on the grid after {} steps (Pre-LN's above Post-LN's wanted): {}",
                               name_of(o.optimizer), o.sweep_steps, words);
    }
    out.push_back(std::move(c));
  }
  return out;
}

Json to_json(const StudyResult& r, const std::vector<PaperCheck>& checks, const std::string& command,
             const std::string& generator) {
  const auto& o = r.options;
  Json j;
  j["format"] = kResultsFormat;
  j["format_version"] = kResultsVersion;
  j["generator"] = generator;
  j["command"] = command;
  j["seconds"] = r.seconds;
  Json opt;
  for (auto p : o.placements) opt["placements"].push_back(name_of(p));
  for (auto n : o.norms) opt["norms"].push_back(ref::name_of(n));
  opt["layers"] = o.depths;
  opt["model"] = name_of(o.model);
  if (o.model == Model::attention_ffn) opt["heads"] = o.heads;
  opt["d_model"] = o.d_model;
  opt["d_ff"] = o.d_ff;
  opt["tokens"] = o.tokens;
  opt["activation"] = ref::name_of(o.activation);
  opt["epsilon"] = o.epsilon;
  opt["deepnorm_alpha"] = o.deepnorm_alpha ? Json(*o.deepnorm_alpha) : Json("(2N)^(1/4)");
  opt["deepnorm_beta"] = o.deepnorm_beta ? Json(*o.deepnorm_beta) : Json("(8N)^(-1/4)");
  opt["optimizer"] = name_of(o.optimizer);
  opt["lr"] = o.lr;
  opt["steps"] = o.steps;
  for (auto t : o.lowp) opt["lowp"].push_back(ref::name_of(t));
  if (o.lowp.empty()) opt["lowp"] = Json::array();
  opt["loss_scale"] = o.loss_scale;
  opt["lowp_every"] = o.lowp_every;
  opt["seed"] = o.seed;
  opt["seeds"] = o.seeds;
  opt["sweep_lr"] = o.sweep_lrs;
  opt["sweep_steps"] = o.sweep_steps;
  j["options"] = std::move(opt);
  Json cs = Json::array();
  for (const auto& c : checks)
    cs.push_back(Json{{"id", c.id}, {"source", c.source}, {"claim", c.claim}, {"status", c.status},
                      {"measured", c.measured}, {"values", c.values}});
  j["checks"] = std::move(cs);
  Json runs = Json::array();
  for (const auto& run : r.runs) {
    Json x{{"placement", name_of(run.placement)}, {"norm", ref::name_of(run.norm)}, {"layers", run.layers},
           {"alpha", run.alpha}, {"beta", run.beta}, {"final_norm", run.final_norm}};
    Json steps = Json::array();
    for (const auto& s : run.steps) {
      Json st{{"step", s.step}, {"loss", number(s.loss)}, {"model_update", number(s.model_update)},
              {"grad_w1", numbers(s.grad_w1)}, {"grad_w2", numbers(s.grad_w2)}, {"act_in", numbers(s.act_in)},
              {"act_out", numbers(s.act_out)}, {"block_update", numbers(s.block_update)}};
      if (!s.grad_wq.empty())
        for (auto [k, v] : {std::pair{"grad_wq", &s.grad_wq}, {"grad_wk", &s.grad_wk}, {"grad_wv", &s.grad_wv}, {"grad_wo", &s.grad_wo}})
          st[k] = numbers(*v);
      if (!s.prenorm_attn.empty()) st["prenorm_attn"] = numbers(s.prenorm_attn);
      if (!s.prenorm_ffn.empty()) st["prenorm_ffn"] = numbers(s.prenorm_ffn);
      if (!s.lowp.empty()) {
        Json lp = Json::array();
        for (const auto& c : s.lowp)
          lp.push_back(Json{{"dtype", ref::name_of(c.dtype)}, {"loss_finite", c.loss_finite},
                            {"fwd_inf", c.fwd_inf}, {"fwd_nan", c.fwd_nan}, {"fwd_subnormal", c.fwd_sub},
                            {"bwd_inf", c.bwd_inf}, {"bwd_nan", c.bwd_nan}, {"bwd_subnormal", c.bwd_sub}});
        st["lowp"] = std::move(lp);
      }
      steps.push_back(std::move(st));
    }
    x["steps"] = std::move(steps);
    if (run.prenorm_recheck >= 0) x["prenorm_recheck"] = number(run.prenorm_recheck);
    runs.push_back(std::move(x));
  }
  j["runs"] = std::move(runs);
  {
    std::vector<std::uint64_t> list;
    for (std::int64_t k = 0; k < o.seeds; ++k) list.push_back(o.seed + static_cast<std::uint64_t>(k));
    Json ss{{"seeds", list},
            {"statistic", "per stack and seed: ||dL/dW1||, ||dL/dW2||, act_in, act_out per layer at initialization and ||ΔF|| after the first "
                          "step (float64); geometric means over the seeds; the trend of ||dL/dW2|| is the slope of its log "
                          "against the layer position l/(L-1), mean over the seeds and its standard error"}};
    Json rows = Json::array();
    for (const auto& sr : r.seed_runs) {
      Json g1 = Json::array(), g2 = Json::array(), ai = Json::array(), ao = Json::array();
      for (const auto& v : sr.grad_w1) g1.push_back(numbers(v));
      for (const auto& v : sr.grad_w2) g2.push_back(numbers(v));
      for (const auto& v : sr.act_in) ai.push_back(numbers(v));
      for (const auto& v : sr.act_out) ao.push_back(numbers(v));
      const Trend t = layer_trend(sr.grad_w2);
      rows.push_back(Json{{"placement", name_of(sr.placement)}, {"norm", ref::name_of(sr.norm)}, {"layers", sr.layers},
                          {"grad_w1", g1}, {"grad_w2", g2}, {"act_in", ai}, {"act_out", ao},
                          {"model_update", numbers(sr.model_update)},
                          {"grad_w1_geomean", numbers(geometric_mean_profile(sr.grad_w1))},
                          {"grad_w2_geomean", numbers(geometric_mean_profile(sr.grad_w2))},
                          {"grad_w2_log_slope", number(t.slope)}, {"grad_w2_log_slope_se", number(t.se)},
                          {"model_update_geomean", number(geometric_mean(sr.model_update))}});
    }
    ss["runs"] = std::move(rows);
    j["seeds"] = std::move(ss);
  }
  if (!r.sweep.empty()) {
    Json sw{{"lr", o.sweep_lrs}, {"steps", o.sweep_steps}, {"optimizer", name_of(o.optimizer)},
            {"criterion", "usable: every loss finite and every loss after step 0 below the initial loss (training decreases "
                          "the loss and no step takes it above where it started)"}};
    Json rows = Json::array();
    for (const auto& w : r.sweep) {
      Json losses = Json::array(), ratio = Json::array();
      for (const auto& l : w.losses) {
        losses.push_back(numbers(l));
        ratio.push_back(number(l.size() == static_cast<std::size_t>(o.sweep_steps + 1) ? l.back() / l.front()
                                                                                        : std::numeric_limits<double>::quiet_NaN()));
      }
      rows.push_back(Json{{"placement", name_of(w.placement)}, {"norm", ref::name_of(w.norm)}, {"layers", w.layers},
                          {"usable", w.usable}, {"final_over_initial", ratio},
                          {"largest_usable_lr", w.largest_usable ? Json(*w.largest_usable) : Json(nullptr)},
                          {"smallest_unusable_lr", w.smallest_unusable ? Json(*w.smallest_unusable) : Json(nullptr)},
                          {"best_lr", best_lr(o.sweep_lrs, w)},
                          {"losses", losses}});
    }
    sw["runs"] = std::move(rows);
    j["lr_sweep"] = std::move(sw);
  }
  return j;
}

}  // namespace normcheck::study
