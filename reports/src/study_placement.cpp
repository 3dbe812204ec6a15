// The placement study's page and Markdown summary, from its results file
// (normcheck-study-placement v1 to v4; the fields of v2 to v4 are optional here). The page is one self-contained file like the conformance
// report: Chart.js and the data inlined, nothing fetched; one plot per quantity with the layer
// on the x axis and one line (own marker shape and dash) per placement; at initialization, where
// the file has a quantity per seed (v3: the gradients of W1 and W2; v4: the activations too), the
// line is the geometric mean over the seeds with a band from the smallest to the largest seed's
// value (computed here, seed_bands, and inlined with the data); a page check at the bottom
// (#nc-status) that the headless-Chromium test reads.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "normcheck/reports/study.hpp"
#include "text.hpp"

namespace normcheck::reports {

namespace {

using Json = nlohmann::ordered_json;
using text::html_escape;

// ---- reading ------------------------------------------------------------------------------

struct Reader {
  std::string source;
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ReportError(fmt::format("{}: {}: {}", source, path, what));
  }
  const Json& field(const Json& obj, const std::string& path, const char* name, Json::value_t type) const {
    if (!obj.is_object() || !obj.contains(name)) fail(path + name, "missing");
    const Json& v = obj.at(name);
    const bool ok = type == Json::value_t::number_float ? v.is_number() : v.type() == type ||
                    (type == Json::value_t::number_integer && v.is_number_integer());
    if (!ok) fail(path + name, fmt::format("expected {}", type == Json::value_t::string ? "a string" :
                                           type == Json::value_t::array ? "an array" :
                                           type == Json::value_t::object ? "an object" : "a number"));
    return v;
  }
  // `a` (at `where`) is an array of `n` numbers, "inf", "-inf" or "nan".
  void number_array(const Json& a, const std::string& where, std::size_t n) const {
    if (!a.is_array()) fail(where, "expected an array");
    if (a.size() != n) fail(where, fmt::format("expected {} values (one per layer), got {}", n, a.size()));
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!a[i].is_number() && !(a[i].is_string() && (a[i] == "inf" || a[i] == "-inf" || a[i] == "nan")))
        fail(fmt::format("{}[{}]", where, i), "expected a number");
  }
  // Field `name` of `obj`: an array of `n` numbers.
  void numbers(const Json& obj, const std::string& path, const char* name, std::size_t n) const {
    number_array(field(obj, path, name, Json::value_t::array), path + name, n);
  }
  // An array of `seeds` arrays of `n` numbers each (per seed, per layer).
  void per_seed(const Json& obj, const std::string& path, const char* name, std::size_t seeds, std::size_t n) const {
    const Json& a = field(obj, path, name, Json::value_t::array);
    if (a.size() != seeds) fail(path + name, fmt::format("expected {} arrays (one per seed), got {}", seeds, a.size()));
    for (std::size_t k = 0; k < a.size(); ++k) number_array(a[k], fmt::format("{}{}[{}]", path, name, k), n);
  }
};

Json read_study(const std::string& text, const std::string& source) {
  Reader r{source};
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw ReportError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) r.fail("(root)", "expected an object");
  if (r.field(j, "", "format", Json::value_t::string) != kStudyPlacementFormat)
    r.fail("format", fmt::format("expected \"{}\"", kStudyPlacementFormat));
  const int version = r.field(j, "", "format_version", Json::value_t::number_integer).get<int>();
  if (version < 1 || version > kStudyPlacementVersion)
    r.fail("format_version", fmt::format("expected 1 to {} (the versions this normcheck reads), got {}", kStudyPlacementVersion, version));
  r.field(j, "", "options", Json::value_t::object);
  const Json& checks = r.field(j, "", "checks", Json::value_t::array);
  for (std::size_t i = 0; i < checks.size(); ++i)
    for (const char* f : {"id", "source", "claim", "status", "measured"})
      r.field(checks[i], fmt::format("checks[{}].", i), f, Json::value_t::string);
  const Json& runs = r.field(j, "", "runs", Json::value_t::array);
  if (runs.empty()) r.fail("runs", "empty");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string p = fmt::format("runs[{}].", i);
    r.field(runs[i], p, "placement", Json::value_t::string);
    r.field(runs[i], p, "norm", Json::value_t::string);
    const auto layers = r.field(runs[i], p, "layers", Json::value_t::number_integer).get<std::int64_t>();
    if (layers < 1) r.fail(p + "layers", "expected at least 1");
    const Json& steps = r.field(runs[i], p, "steps", Json::value_t::array);
    if (steps.empty()) r.fail(p + "steps", "empty");
    for (std::size_t s = 0; s < steps.size(); ++s) {
      const std::string q = fmt::format("{}steps[{}].", p, s);
      r.field(steps[s], q, "step", Json::value_t::number_integer);
      for (const char* f : {"grad_w1", "grad_w2", "act_in", "act_out", "block_update"})
        r.numbers(steps[s], q, f, static_cast<std::size_t>(layers));
      for (const char* f : {"grad_wq", "grad_wk", "grad_wv", "grad_wo", "prenorm_attn", "prenorm_ffn"})  // version 2, optional
        if (steps[s].contains(f)) r.numbers(steps[s], q, f, static_cast<std::size_t>(layers));
      if (!steps[s].contains("lowp")) continue;
      const Json& lp = r.field(steps[s], q, "lowp", Json::value_t::array);
      for (std::size_t k = 0; k < lp.size(); ++k) {
        const std::string w = fmt::format("{}lowp[{}].", q, k);
        r.field(lp[k], w, "dtype", Json::value_t::string);
        for (const char* f : {"fwd_inf", "fwd_nan", "fwd_subnormal", "bwd_inf", "bwd_nan", "bwd_subnormal"})
          r.numbers(lp[k], w, f, static_cast<std::size_t>(layers + 1));
      }
    }
  }
  if (j.contains("seeds")) {  // version 3, optional
    const Json& ss = r.field(j, "", "seeds", Json::value_t::object);
    const std::size_t n = r.field(ss, "seeds.", "seeds", Json::value_t::array).size();
    if (n < 1) r.fail("seeds.seeds", "empty");
    const Json& rows = r.field(ss, "seeds.", "runs", Json::value_t::array);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string p = fmt::format("seeds.runs[{}].", i);
      r.field(rows[i], p, "placement", Json::value_t::string);
      r.field(rows[i], p, "norm", Json::value_t::string);
      const auto layers = r.field(rows[i], p, "layers", Json::value_t::number_integer).get<std::int64_t>();
      if (layers < 1) r.fail(p + "layers", "expected at least 1");
      r.numbers(rows[i], p, "grad_w2_geomean", static_cast<std::size_t>(layers));
      r.numbers(rows[i], p, "model_update", n);
      for (const char* f : {"grad_w1", "grad_w2", "act_in", "act_out"})  // per seed: v3 (grad_w1, grad_w2), v4 (act_in, act_out)
        if (rows[i].contains(f)) r.per_seed(rows[i], p, f, n, static_cast<std::size_t>(layers));
      for (const char* f : {"grad_w2_log_slope", "grad_w2_log_slope_se", "model_update_geomean"}) {
        const Json& v = r.field(rows[i], p, f, rows[i].contains(f) && rows[i].at(f).is_string() ? Json::value_t::string
                                                                                                : Json::value_t::number_float);
        if (v.is_string() && v != "inf" && v != "-inf" && v != "nan") r.fail(p + f, "expected a number");
      }
    }
  }
  if (j.contains("lr_sweep")) {  // version 2, optional
    const Json& sw = r.field(j, "", "lr_sweep", Json::value_t::object);
    const std::size_t rates = r.field(sw, "lr_sweep.", "lr", Json::value_t::array).size();
    r.numbers(sw, "lr_sweep.", "lr", rates);
    r.field(sw, "lr_sweep.", "steps", Json::value_t::number_integer);
    r.field(sw, "lr_sweep.", "optimizer", Json::value_t::string);
    r.field(sw, "lr_sweep.", "criterion", Json::value_t::string);
    const Json& rows = r.field(sw, "lr_sweep.", "runs", Json::value_t::array);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string p = fmt::format("lr_sweep.runs[{}].", i);
      r.field(rows[i], p, "placement", Json::value_t::string);
      r.field(rows[i], p, "norm", Json::value_t::string);
      r.field(rows[i], p, "layers", Json::value_t::number_integer);
      r.numbers(rows[i], p, "final_over_initial", rates);
      if (r.field(rows[i], p, "usable", Json::value_t::array).size() != rates) r.fail(p + "usable", "expected one per rate");
      for (const char* f : {"largest_usable_lr", "smallest_unusable_lr", "best_lr"})
        if (!rows[i].contains(f) || !(rows[i].at(f).is_null() || rows[i].at(f).is_number())) r.fail(p + f, "expected a number or null");
    }
  }
  return j;
}

std::string num(const Json& v) { return v.is_number() ? text::num(v.get<double>()) : v.get<std::string>(); }

// The per-layer plots over seeds: per stack of `seeds.runs[]` and per quantity it has per seed
// (grad_w1, grad_w2; act_in, act_out from version 4), per layer the geometric mean over the seeds
// (exp of the mean of the logs) and the smallest and largest seed's value. A layer where a seed's
// value is not a finite positive number has "nan" for all three (not drawn; the plot counts it).
// {"seeds": N, "runs": [{placement, norm, layers, <quantity>: {mean, min, max}}]}; empty runs
// without a seeds section.
Json seed_bands(const Json& j) {
  Json out{{"seeds", 0}, {"runs", Json::array()}};
  if (!j.contains("seeds")) return out;
  const Json& ss = j.at("seeds");
  const std::size_t n = ss.at("seeds").size();
  out["seeds"] = n;
  for (const auto& r : ss.at("runs")) {
    Json row{{"placement", r.at("placement")}, {"norm", r.at("norm")}, {"layers", r.at("layers")}};
    const auto layers = r.at("layers").get<std::size_t>();
    for (const char* f : {"grad_w1", "grad_w2", "act_in", "act_out"}) {
      if (!r.contains(f)) continue;
      Json mean = Json::array(), lo = Json::array(), hi = Json::array();
      for (std::size_t l = 0; l < layers; ++l) {
        double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = -mn;
        bool ok = true;
        for (std::size_t k = 0; k < n; ++k) {
          const Json& v = r.at(f).at(k).at(l);
          const double x = v.is_number() ? v.get<double>() : std::nan("");
          if (!(std::isfinite(x) && x > 0)) ok = false;
          else sum += std::log(x), mn = std::min(mn, x), mx = std::max(mx, x);
        }
        if (ok) mean.push_back(std::exp(sum / static_cast<double>(n))), lo.push_back(mn), hi.push_back(mx);
        else mean.push_back("nan"), lo.push_back("nan"), hi.push_back("nan");
      }
      row[f] = Json{{"mean", mean}, {"min", lo}, {"max", hi}};
    }
    out["runs"].push_back(std::move(row));
  }
  return out;
}

// ---- the page -------------------------------------------------------------------------------

constexpr const char* kStyle = R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#111}
h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}
th{background:#f3f3f3} code{font-family:ui-monospace,monospace;font-size:12px}
.reproduced{background:#e3f4e3;font-weight:bold} .notrep{background:#f8c9c4;font-weight:bold} .noteval{background:#eee}
.plots{display:flex;flex-wrap:wrap;gap:12px} .plot{border:1px solid #ddd;padding:6px}
.plot h4{margin:0 0 4px;font-size:13px} .plot p{font-size:11px;color:#444;max-width:460px;margin:2px 0}
#nc-status{font-size:12px;color:#555;margin-top:2em}
)CSS";

// This page's plots, after text::page_script_prologue() (the page check and the shared helpers).
constexpr const char* kScript = R"JS(
  // One look per placement: colour, marker shape and dash, so that the lines read without colour.
  var looks = {post: ['#1f5fa8', 'circle', []], pre: ['#c2410c', 'triangle', [6, 3]],
               sandwich: ['#2e7d32', 'rect', [2, 2]], deepnorm: ['#6a1b9a', 'crossRot', [10, 3, 2, 3]]};
  function look(p) { return looks[p] || ['#37474f', 'star', []]; }
  // series: [{label, placement, points: [{x, y}]}]; log: log y axis (non-positive values left out
  // and counted in the note); logx: log x axis.
  function plot(parent, title, xTitle, yTitle, series, log, logx, note) {
    var dropped = 0, any = false;
    var sets = series.map(function (s) {
      var lk = look(s.placement);
      if (s.point) lk = [lk[0], s.point, s.dash || lk[2]];  // a second series of one placement
      var pts = s.points.filter(function (p) {
        var ok = isFinite(p.y) && (!log || p.y > 0);
        if (!ok) ++dropped;
        return ok;
      });
      any = any || pts.length > 0;
      return {label: s.label + ' (' + lk[1] + ')', data: pts, borderColor: lk[0], backgroundColor: lk[0],
              pointStyle: lk[1], pointRadius: 3, borderDash: lk[2], borderWidth: 1.5, showLine: true, fill: false};
    });
    var yAxis = {title: {display: true, text: yTitle + (log ? ' (log)' : '')}};
    // A min-max band over seeds: its 'min' series, then its 'max' series filled down to the 'min' one.
    series.forEach(function (s, i) {
      if (!s.band) return;
      var d = sets[i];
      d.pointRadius = 0; d.borderWidth = 0.5; d.borderDash = []; d.ncBand = true;
      d.backgroundColor = d.borderColor + '2e';
      if (s.band === 'max') d.fill = '-1';
    });
    if (log) { yAxis.type = 'logarithmic'; yAxis.ticks = {callback: decade}; } else { yAxis.beginAtZero = true; }
    var xAxis = {type: logx ? 'logarithmic' : 'linear', title: {display: true, text: xTitle + (logx ? ' (log)' : '')}};
    if (logx === 'rate') xAxis.ticks = {callback: decade};
    else if (logx) xAxis.ticks = {callback: function (v) { return [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64].indexOf(v) >= 0 ? String(v) : ''; }};
    var chart = make(parent, title, {type: 'scatter', data: {datasets: sets},
      options: {scales: {x: xAxis, y: yAxis}, plugins: {legend: {labels: {usePointStyle: true,
        filter: function (item, cd) { return !cd.datasets[item.datasetIndex].ncBand; }}}}}}, 460);
    var notes = [];
    if (note) notes.push(note);
    if (!any) notes.push('no value to draw at this setting');
    else if (dropped) notes.push(dropped + ' points not drawn (' + (log ? 'zero, negative or ' : '') + 'not finite)');
    if (notes.length) { var p = document.createElement('p'); p.textContent = notes.join('; '); chart.canvas.parentNode.appendChild(p); }
    return chart;
  }
  function runsOf(norm, layers) {
    return data.runs.filter(function (r) { return r.norm === norm && (layers === undefined || r.layers === layers); });
  }
  function stepOf(run, step) {
    for (var i = 0; i < run.steps.length; ++i) if (run.steps[i].step === step) return run.steps[i];
    return null;
  }
  function perLayer(runs, step, get) {
    return runs.map(function (r) {
      var s = stepOf(r, step), v = s ? get(s) : [];
      return {label: r.placement, placement: r.placement,
              points: (v || []).map(function (y, l) { return {x: l + 1, y: num(y)}; })};
    });
  }
  // At initialization, a quantity the file has per seed: per placement the geometric mean over the
  // seeds (the line) and the band from the smallest to the largest seed's value; otherwise (after
  // a step, or a file without it) the first seed, as perLayer. Returns {series, seeds}: seeds 0
  // when no line is over seeds.
  var bands = JSON.parse(document.getElementById('nc-seed-bands').textContent);
  function bandOf(r, field) {
    for (var i = 0; i < bands.runs.length; ++i) {
      var b = bands.runs[i];
      if (b.placement === r.placement && b.norm === r.norm && b.layers === r.layers) return b[field] || null;
    }
    return null;
  }
  function perLayerOverSeeds(runs, step, field) {
    var out = [], over = 0;
    function pts(a) { return a.map(function (y, l) { return {x: l + 1, y: num(y)}; }); }
    runs.forEach(function (r) {
      var b = step === 0 && bands.seeds > 1 ? bandOf(r, field) : null;
      if (!b) { out = out.concat(perLayer([r], step, function (s) { return s[field]; })); return; }
      over = bands.seeds;
      out.push({label: r.placement + ' min', placement: r.placement, points: pts(b.min), band: 'min'});
      out.push({label: r.placement + ' max', placement: r.placement, points: pts(b.max), band: 'max'});
      out.push({label: r.placement, placement: r.placement, points: pts(b.mean)});
    });
    return {series: out, seeds: over};
  }
  function overSeedsNote(o, note) {
    var n = o.seeds ? 'geometric mean over the ' + o.seeds + ' seeds, the band from the smallest to the largest seed\'s value'
                    : 'one seed (the study\'s)';
    return note ? note + '; ' + n : n;
  }
  var sel = {norm: document.getElementById('nc-norm'), layers: document.getElementById('nc-layers'),
             step: document.getElementById('nc-step')};
  var norms = [], depths = [], steps = [];
  data.runs.forEach(function (r) {
    if (norms.indexOf(r.norm) < 0) norms.push(r.norm);
    if (depths.indexOf(r.layers) < 0) depths.push(r.layers);
    r.steps.forEach(function (s) { if (steps.indexOf(s.step) < 0) steps.push(s.step); });
  });
  depths.sort(function (a, b) { return a - b; });
  steps.sort(function (a, b) { return a - b; });
  function fill(el, values, text) {
    values.forEach(function (v) { var o = document.createElement('option'); o.value = String(v); o.textContent = text(v); el.appendChild(o); });
  }
  fill(sel.norm, norms, function (v) { return v; });
  fill(sel.layers, depths, function (v) { return 'L = ' + v; });
  fill(sel.step, steps, function (v) { return v === 0 ? 'at initialization' : 'after step ' + v; });
  sel.layers.value = String(depths[depths.length - 1]);
  var box = document.getElementById('nc-plots');
  function render(norm, layers, step) {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    box.textContent = '';
    var when = step === 0 ? 'at initialization' : 'after step ' + step;
    var runs = runsOf(norm, layers);
    var g = document.createElement('div'); g.className = 'plots'; box.appendChild(g);
    var head = ' (' + norm + ', L = ' + layers + ', ' + when + ')';
    var o1 = perLayerOverSeeds(runs, step, 'grad_w1'), o2 = perLayerOverSeeds(runs, step, 'grad_w2');
    var oi = perLayerOverSeeds(runs, step, 'act_in'), oo = perLayerOverSeeds(runs, step, 'act_out');
    plot(g, '||dL/dW1||_F per layer' + head, 'layer', '||dL/dW1||_F', o1.series, true, false, overSeedsNote(o1));
    plot(g, '||dL/dW2||_F per layer' + head, 'layer', '||dL/dW2||_F', o2.series, true, false,
         overSeedsNote(o2, 'Xiong et al. Figure 3 plots this at initialization'));
    plot(g, 'activation entering the block (the residual stream)' + head, 'layer', 'RMS over tokens of ||x_l||',
         oi.series, true, false, overSeedsNote(oi));
    plot(g, 'activation leaving the block' + head, 'layer', 'RMS over tokens of ||x_l+1||', oo.series, true, false, overSeedsNote(oo));
    plot(g, 'what the block adds, ||x_l+1 - x_l||' + head, 'layer', 'RMS over tokens', perLayer(runs, step, function (s) { return s.block_update; }), true);
    // Version 2: the attention projections' gradients, and post/deepnorm's pre-norm sums.
    function having(field) { return runs.filter(function (r) { var s = stepOf(r, step); return s && s[field]; }); }
    if (having('grad_wo').length) {
      plot(g, '||dL/dWo||_F (attention output projection) per layer' + head, 'layer', '||dL/dWo||_F',
           perLayer(having('grad_wo'), step, function (s) { return s.grad_wo; }), true);
      plot(g, '||dL/dWv||_F (attention value projection) per layer' + head, 'layer', '||dL/dWv||_F',
           perLayer(having('grad_wv'), step, function (s) { return s.grad_wv; }), true);
    }
    if (having('prenorm_ffn').length) {
      var sums = perLayer(having('prenorm_ffn'), step, function (s) { return s.prenorm_ffn; })
        .map(function (x) { x.label += ' FFN'; return x; });
      if (having('prenorm_attn').length)
        sums = sums.concat(perLayer(having('prenorm_attn'), step, function (s) { return s.prenorm_attn; })
          .map(function (x) { x.label += ' attention'; x.point = 'star'; x.dash = [1, 3]; return x; }));
      plot(g, 'pre-norm sum ||αx + F(x)|| inside the block (post, deepnorm)' + head, 'layer', 'RMS over tokens', sums, true, false,
           'recomputed in float64 from the kernel\'s inputs; renormalized, it matches the kernel\'s output');
    }
    var dtypes = [];
    runs.forEach(function (r) { var s = stepOf(r, step); ((s && s.lowp) || []).forEach(function (c) { if (dtypes.indexOf(c.dtype) < 0) dtypes.push(c.dtype); }); });
    var lp = document.createElement('div'); lp.className = 'plots'; box.appendChild(lp);
    if (!dtypes.length) {
      var p = document.createElement('p');
      p.textContent = 'No low-precision counts ' + when + ' (the study counts them at the steps --lowp-every gives).';
      lp.appendChild(p);
    }
    dtypes.forEach(function (dt) {
      function counts(get) {
        return perLayer(runs, step, function (s) {
          var c = (s.lowp || []).filter(function (x) { return x.dtype === dt; })[0];
          return c ? get(c) : [];  // L + 1 values: the layers, then the final norm
        });
      }
      function sum(a, b) { return a.map(function (v, i) { return v + b[i]; }); }
      var scale = data.options.loss_scale;
      plot(lp, dt + ': overflows to inf per layer' + head, 'layer', 'values (forward + backward)',
           counts(function (c) { return sum(c.fwd_inf, c.bwd_inf); }), false, false,
           'backward with loss scale ' + scale + '; layer ' + (layers + 1) + ' is the final norm (pre, sandwich; 0 for the others)');
      plot(lp, dt + ': NaNs per layer' + head, 'layer', 'values (forward + backward)',
           counts(function (c) { return sum(c.fwd_nan, c.bwd_nan); }), false);
      plot(lp, dt + ': subnormal values per layer (flushed by FTZ)' + head, 'layer', 'values (forward + backward)',
           counts(function (c) { return sum(c.fwd_subnormal, c.bwd_subnormal); }), false);
    });
    // Across depths: Theorem 1's last-layer gradient, DeepNet's model update; the loss per step.
    var d = document.createElement('div'); d.className = 'plots'; box.appendChild(d);
    var all = runsOf(norm), byPlacement = {};
    all.forEach(function (r) { (byPlacement[r.placement] = byPlacement[r.placement] || []).push(r); });
    function acrossDepths(get) {
      return Object.keys(byPlacement).map(function (p) {
        return {label: p, placement: p, points: byPlacement[p].map(function (r) { return {x: r.layers, y: num(get(r))}; })
                  .sort(function (a, b) { return a.x - b.x; })};
      });
    }
    plot(d, 'last layer ||dL/dW2||_F against depth (' + norm + ', at initialization)', 'L, layers', '||dL/dW2||_F',
         acrossDepths(function (r) { return r.steps[0].grad_w2[r.layers - 1]; }), true, true,
         'Theorem 1 (Xiong et al.): Post-LN flat in L, Pre-LN ~ 1/sqrt(L)');
    if (step > 0)
      plot(d, '||ΔF|| = ||y(θ_t) - y(θ_0)|| against depth (' + norm + ', ' + when + ')', 'L, layers', 'RMS over tokens',
           acrossDepths(function (r) { var s = stepOf(r, step); return s ? s.model_update : NaN; }), true, true,
           'DeepNet: bounded for DeepNorm, growing for Post-LN');
    if (data.lr_sweep) {
      var sw = data.lr_sweep, rates = sw.lr;
      var mine = sw.runs.filter(function (r) { return r.norm === norm; });
      plot(d, 'final over initial loss against the learning rate (' + norm + ', L = ' + layers + ', ' + sw.steps + ' ' + sw.optimizer + ' steps)',
           'learning rate', 'loss after / before', mine.filter(function (r) { return r.layers === layers; }).map(function (r) {
             return {label: r.placement, placement: r.placement,
                     points: r.final_over_initial.map(function (y, k) { return {x: rates[k], y: num(y)}; })};
           }), true, 'rate', sw.criterion);
      var byP = {};
      mine.forEach(function (r) { (byP[r.placement] = byP[r.placement] || []).push(r); });
      plot(d, 'largest usable learning rate against depth (' + norm + ')', 'L, layers', 'learning rate',
           Object.keys(byP).map(function (p) {
             return {label: p, placement: p, points: byP[p].map(function (r) { return {x: r.layers, y: r.largest_usable_lr === null ? NaN : r.largest_usable_lr}; })
                       .sort(function (a, b) { return a.x - b.x; })};
           }), true, true, 'on the grid ' + rates.join(', ') + '; a line at the top rate means every rate was usable');
    }
    plot(d, 'training loss per step (' + norm + ', L = ' + layers + ')', 'step', 'loss',
         runs.map(function (r) { return {label: r.placement, placement: r.placement, points: r.steps.map(function (s) { return {x: s.step, y: num(s.loss)}; })}; }), true);
    state.views += 1;
    update();
  }
  function current() { render(sel.norm.value, Number(sel.layers.value), Number(sel.step.value)); }
  [sel.norm, sel.layers, sel.step].forEach(function (e) { e.addEventListener('change', current); });
  // Self-test (the headless check): every norm and depth, at initialization and after the last step.
  if (location.hash === '#selftest')
    norms.forEach(function (n) { depths.forEach(function (l) { [steps[0], steps[steps.length - 1]].forEach(function (s) { render(n, l, s); }); }); });
  current();
  update();
})();
)JS";

std::string options_text(const Json& o) {
  std::string s;
  for (const auto& [k, v] : o.items()) s += fmt::format("{}<code>{}</code> = {}", s.empty() ? "" : ", ", html_escape(k), html_escape(v.dump()));
  return s;
}

// The statistics over seeds (version 3) per stack: N, the fitted last-over-first ratio of
// ||dL/dW2|| exp(b) with exp(b ± 2 se), the geometric mean's last over first layer, ||ΔF|| after
// the first step (geometric mean). One row of cells per stack.
std::vector<std::vector<std::string>> seed_rows(const Json& j) {
  std::vector<std::vector<std::string>> rows;
  if (!j.contains("seeds")) return rows;
  const std::size_t n = j.at("seeds").at("seeds").size();
  auto d = [](const Json& v) { return v.is_number() ? v.get<double>() : std::nan(""); };
  for (const auto& r : j.at("seeds").at("runs")) {
    const double b = d(r.at("grad_w2_log_slope")), se = d(r.at("grad_w2_log_slope_se"));
    const Json& g = r.at("grad_w2_geomean");
    const double lof = d(g.back()) / d(g.front());
    rows.push_back({r.at("placement").get<std::string>(), r.at("norm").get<std::string>(),
                    std::to_string(r.at("layers").get<std::int64_t>()), std::to_string(n), text::num(std::exp(b)),
                    fmt::format("{} – {}", text::num(std::exp(b - 2 * se)), text::num(std::exp(b + 2 * se))), text::num(lof),
                    num(r.at("model_update_geomean"))});
  }
  return rows;
}
constexpr const char* kSeedHeads[] = {"placement", "norm", "L", "seeds", "‖dW2‖ trend, last/first", "± 2 se",
                                      "geometric mean, last/first", "‖ΔF‖ step 1, geometric mean"};

const char* status_class(const std::string& s) {
  return s == "reproduced" ? "reproduced" : (s == "not reproduced" ? "notrep" : "noteval");
}

}  // namespace

std::string study_placement_html(const std::string& json_text, const std::string& source,
                                 const std::string& plot_library, const std::string& license) {
  const Json j = read_study(json_text, source);
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>normcheck study: residual placement</title>\n";
  s += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>" + std::string(kStyle) + "</style>\n</head><body>\n";
  s += "<h1>Residual placement study</h1>\n";
  const bool attention = j.at("options").value("model", std::string("ffn")) == "attention+ffn";
  s += fmt::format("<p>Post-LN, Pre-LN, Sandwich and DeepNorm stacks of {} blocks, run by normcheck's CPU block and norm kernels "
                   "(float64 for the norms; low-precision compute for the counts). Written by {}: <code>{}</code></p>\n",
                   attention ? "self-attention + FFN" : "FFN-only",
                   html_escape(j.value("generator", std::string("?"))), html_escape(j.value("command", std::string())));
  s += "<p>Options: " + options_text(j.at("options")) + "</p>\n";
  s += "<h2>Checked against the papers</h2>\n<table><tr><th>check</th><th>claim</th><th>source</th><th>status</th><th>measured</th></tr>\n";
  for (const auto& c : j.at("checks"))
    s += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>\n",
                     html_escape(c.at("id")), html_escape(c.at("claim")), html_escape(c.at("source")),
                     status_class(c.at("status")), html_escape(c.at("status")), html_escape(c.at("measured")));
  s += "</table>\n";
  if (const auto rows = seed_rows(j); !rows.empty()) {
    s += "<h2>Across seeds</h2>\n<p>What the checks of Figure 3, Theorem 1 and DeepNet use: every stack at every seed, "
         "float64, at initialization and after the first step. The trend of ‖dL/dW2‖ is exp(b), b the slope of its log "
         "against the layer position l/(L−1) over all layers, the mean over the seeds (± 2 standard errors). Below, at "
         "initialization, the per-layer plots of ‖dL/dW1‖, ‖dL/dW2‖ (and of the activations, in a results file of version 4) "
         "are the geometric mean over the seeds with a band from the smallest to the largest seed's value; after a step, and "
         "the other quantities, are of the first seed.</p>\n<table><tr>";
    for (const char* h : kSeedHeads) s += fmt::format("<th>{}</th>", h);
    s += "</tr>\n";
    for (const auto& row : rows) {
      s += "<tr>";
      for (const auto& c : row) s += "<td>" + html_escape(c) + "</td>";
      s += "</tr>\n";
    }
    s += "</table>\n";
  }
  s += "<h2>Per layer and across depths</h2>\n<p>One line per placement (each with its own marker shape and dash). "
       "<label>Norm <select id=\"nc-norm\"></select></label> <label>Depth <select id=\"nc-layers\"></select></label> "
       "<label>When <select id=\"nc-step\"></select></label></p>\n<div id=\"nc-plots\"></div>\n";
  s += std::string("<h2>What this study does not show</h2>\n<ul><li>") +
       (attention ? "The model is a small encoder (one short sequence, no masking, no embeddings, no dropout), not the papers' "
                    "translation Transformers; the paper checks are over the seeds above, and so are the per-layer plots at initialization "
                    "of the quantities the file has per seed; the other plots and the sweep are of one seed."
                  : "Attention is not modelled: each block is one position-wise FFN sublayer with its norm(s). Xiong et al.'s "
                    "Figure 3 and DeepNet's experiments are of full Transformers.") +
       "</li><li>The data are synthetic (Gaussian inputs, a random linear teacher), a few tokens, a few steps: early "
       "training only, no claim about final quality.</li><li>No placement is always better: the outcome depends on depth, "
       "initialization, residual scaling, warmup, optimizer, learning rate and precision. Every output here is normalized, so "
       "the loss cannot blow up: an unusable rate shows as a loss that rises above where it started.</li></ul>\n";
  s += "<p id=\"nc-status\" data-status=\"not-run\">page check: the page's script did not run</p>\n";
  s += plot_library.empty() ? "<p>No plots: the plotting library was not available when this page was written.</p>\n"
                            : "<p style=\"font-size:12px;color:#555\">Plots drawn with Chart.js (MIT License; its license "
                              "text is in a comment at the end of this page's source).</p>\n";
  s += "<script type=\"application/json\" id=\"nc-data\">" + text::script_safe(j.dump()) + "</script>\n";
  s += "<script type=\"application/json\" id=\"nc-seed-bands\">" + text::script_safe(seed_bands(j).dump()) + "</script>\n";
  if (!plot_library.empty()) s += "<script>\n" + text::script_safe(plot_library) + "\n</script>\n";
  s += "<script>" + std::string(text::page_script_prologue()) + kScript + "</script>\n";
  if (!license.empty()) s += "<!--\n" + text::comment_safe(license) + "\n-->\n";
  return s + "</body></html>\n";
}

std::string study_placement_markdown(const std::string& json_text, const std::string& source) {
  const Json j = read_study(json_text, source);
  std::string s = "# Residual placement study\n\n";
  s += fmt::format("`{}` ({})\n\n", j.value("command", std::string()), j.value("generator", std::string()));
  s += "## Checked against the papers\n\n| check | status | measured |\n|---|---|---|\n";
  for (const auto& c : j.at("checks"))
    s += fmt::format("| `{}` | **{}** | {} |\n", c.at("id").get<std::string>(), c.at("status").get<std::string>(),
                     text::md_cell(c.at("measured").get<std::string>()));
  s += "\n## Per stack\n\nAt initialization: `||dL/dW2||` of the first and last layer, the activation norm "
       "entering the last layer; `||ΔF||` after the first step and the loss at the first and last step; "
       "inf/NaN counts (forward + backward, all layers) at initialization per low-precision dtype; for post and deepnorm "
       "(version 2) the last layer's pre-norm sum ‖αz + F(z)‖ at initialization.\n\n";
  s += "| placement | norm | L | first ‖dW2‖ | last ‖dW2‖ | last act_in | ‖ΔF‖ step 1 | loss | low precision inf / NaN | last pre-norm sum |\n"
       "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : j.at("runs")) {
    const Json& st = r.at("steps");
    const Json& s0 = st.front();
    const auto L = r.at("layers").get<std::size_t>();
    std::string lowp;
    if (s0.contains("lowp"))
      for (const auto& c : s0.at("lowp")) {
        std::int64_t inf = 0, nan = 0;
        for (const char* f : {"fwd_inf", "bwd_inf"})
          for (const auto& v : c.at(f)) inf += v.is_number() ? v.get<std::int64_t>() : 0;
        for (const char* f : {"fwd_nan", "bwd_nan"})
          for (const auto& v : c.at(f)) nan += v.is_number() ? v.get<std::int64_t>() : 0;
        lowp += fmt::format("{}{} {} / {}", lowp.empty() ? "" : "; ", c.at("dtype").get<std::string>(), inf, nan);
      }
    const std::string prenorm = s0.contains("prenorm_ffn") && s0.at("prenorm_ffn").size() == L ? num(s0.at("prenorm_ffn").at(L - 1)) : "—";
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} → {} | {} | {} |\n", r.at("placement").get<std::string>(),
                     r.at("norm").get<std::string>(), L, num(s0.at("grad_w2").front()), num(s0.at("grad_w2").at(L - 1)),
                     num(s0.at("act_in").at(L - 1)), st.size() > 1 ? num(st.at(1).at("model_update")) : "—",
                     num(s0.at("loss")), num(st.back().at("loss")), lowp.empty() ? "—" : lowp, prenorm);
  }
  if (const auto rows = seed_rows(j); !rows.empty()) {
    s += "\n## Across seeds\n\nEvery stack at every seed (float64, initialization and the first step): the trend of "
         "‖dL/dW2‖ is exp(b), b the slope of its log against the layer position l/(L−1) over all layers, the mean over "
         "the seeds (± 2 standard errors).\n\n|";
    for (const char* h : kSeedHeads) s += fmt::format(" {} |", h);
    s += "\n|";
    for (std::size_t k = 0; k < std::size(kSeedHeads); ++k) s += "---|";
    s += "\n";
    for (const auto& row : rows) {
      s += "|";
      for (const auto& c : row) s += " " + text::md_cell(c) + " |";
      s += "\n";
    }
  }
  if (j.contains("lr_sweep")) {
    const Json& sw = j.at("lr_sweep");
    s += fmt::format("\n## Usable learning rates\n\n{} {} steps per rate; {}. Final over initial loss per rate.\n\n",
                     sw.at("steps").get<std::int64_t>(), sw.at("optimizer").get<std::string>(), sw.at("criterion").get<std::string>());
    s += "| placement | norm | L | largest usable | first unusable | lowest final loss at |";
    for (const auto& lr : sw.at("lr")) s += fmt::format(" {} |", num(lr));
    s += "\n|---|---|---|---|---|---|";
    for (std::size_t k = 0; k < sw.at("lr").size(); ++k) s += "---|";
    s += "\n";
    auto lr_or = [](const Json& v) { return v.is_null() ? std::string("—") : num(v); };
    for (const auto& r : sw.at("runs")) {
      s += fmt::format("| {} | {} | {} | {} | {} | {} |", r.at("placement").get<std::string>(), r.at("norm").get<std::string>(),
                       r.at("layers").get<std::int64_t>(), lr_or(r.at("largest_usable_lr")), lr_or(r.at("smallest_unusable_lr")),
                       lr_or(r.at("best_lr")));
      for (std::size_t k = 0; k < r.at("final_over_initial").size(); ++k)
        s += fmt::format(" {}{} |", num(r.at("final_over_initial")[k]), r.at("usable")[k].get<bool>() ? "" : " ✗");
      s += "\n";
    }
  }
  const bool attention = j.at("options").value("model", std::string("ffn")) == "attention+ffn";
  s += std::string("\n## What this study does not show\n\n") +
       (attention ? "The model is a small encoder (one short sequence, no masking, embeddings or dropout); the paper checks are "
                    "over the seeds above, the per-stack rows and the sweep of one seed; "
                  : "Attention is not modelled (each block is one FFN sublayer with its norms); ") +
       "the data are synthetic and the training is a few steps; no placement is always better — results depend "
       "on depth, initialization, residual scaling, warmup, optimizer, learning rate and precision.\n";
  return s;
}

}  // namespace normcheck::reports
