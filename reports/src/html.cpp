// The HTML report: one self-contained file (the plotting library and the data inlined, nothing
// fetched), viewable offline. Tables are static HTML; the plots are drawn by Chart.js from the
// data embedded in the page. Every plot is readable without colour: bars beyond the allowance
// are hatched, outputs have their own marker shapes, and the allowance is a labelled line.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "normcheck/reports/report.hpp"
#include "text.hpp"

namespace normcheck::reports {

namespace {

using Json = nlohmann::ordered_json;
using text::html_escape;

// Points per (candidate, output) in the error-against-conditioning plot: every row beyond its
// allowance, and an even sample of the rest up to this many (a ci-tier run has ~10^5 rows).
constexpr std::size_t kMaxPoints = 3000;
// Failing cases shown in full: all of those of candidates that must conform (up to this many),
// and the worst few of each mutant.
constexpr std::size_t kMaxFailingShown = 200;
constexpr std::size_t kMutantCasesShown = 3;

Json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? Json("nan") : Json(v > 0 ? "inf" : "-inf");
}

void add_hist(Json& into, const Histogram& h) {
  if (into.is_null()) into = Json{{"zero", 0}, {"bins", Json::array()}, {"inf", 0}};
  into["zero"] = into["zero"].get<std::int64_t>() + h.zero;
  into["inf"] = into["inf"].get<std::int64_t>() + h.inf;
  auto& b = into["bins"];
  for (std::size_t i = 0; i < h.bins.size(); ++i) {
    if (b.size() <= i) b.push_back(0);
    b[i] = b[i].get<std::int64_t>() + h.bins[i];
  }
}

// The data the plots are drawn from, per run.
Json plot_data(const Report& r) {
  Json runs = Json::array();
  for (const auto& run : r.runs) {
    if (run.mode == "audit") continue;
    Json x;
    x["name"] = run.name();
    x["kind"] = run.kind;
    x["outcome"] = run.outcome();
    Json cases = Json::array();
    std::map<std::string, Json> hist;  // output -> {log2_min, ratio, ulp, cases}
    struct Pt {
      double mos, ratio, ulp;
      std::size_t c;
    };
    std::map<std::string, std::vector<Pt>> pts;
    std::map<std::string, std::int64_t> constant_rows;
    for (std::size_t ci = 0; ci < run.cases.size(); ++ci) {
      const Case& c = run.cases[ci];
      cases.push_back(c.case_id);
      for (const auto& o : c.outputs) {
        if (o.hist_ratio || o.hist_ulp) {
          Json& h = hist[o.name];
          if (h.is_null()) h = Json{{"output", o.name}, {"log2_min", o.log2_min}, {"ratio", nullptr}, {"ulp", nullptr}, {"cases", 0}};
          if (h["log2_min"].get<int>() != o.log2_min) continue;  // a different binning: not summed
          if (o.hist_ratio) add_hist(h["ratio"], *o.hist_ratio);
          if (o.hist_ulp) add_hist(h["ulp"], *o.hist_ulp);
          h["cases"] = h["cases"].get<int>() + 1;
        }
        if (o.rows)
          for (std::size_t k = 0; k < o.rows->row.size(); ++k) {
            const double mos = o.rows->mean_over_sigma[k];
            if (std::isinf(mos)) ++constant_rows[o.name];
            if (!std::isfinite(mos)) continue;
            pts[o.name].push_back({mos, o.rows->max_ratio[k], o.rows->max_ulp[k], ci});
          }
      }
    }
    x["cases"] = std::move(cases);
    Json hs = Json::array();
    for (auto& [name, h] : hist) hs.push_back(std::move(h));
    x["hist"] = std::move(hs);
    Json rows = Json::array();
    for (auto& [name, v] : pts) {
      std::vector<Pt> keep;
      std::size_t rest = 0;
      for (const auto& p : v) rest += !(p.ratio > 1);
      const std::size_t stride = rest > kMaxPoints ? (rest + kMaxPoints - 1) / kMaxPoints : 1;
      std::size_t i = 0;
      for (const auto& p : v)
        if (p.ratio > 1 || (i++ % stride) == 0) keep.push_back(p);
      Json points = Json::array();
      for (const auto& p : keep) points.push_back(Json::array({p.mos, number(p.ratio), number(p.ulp), p.c}));
      rows.push_back(Json{{"output", name}, {"points", std::move(points)}, {"total", v.size()},
                          {"constant_rows", constant_rows[name]}});
    }
    x["rows"] = std::move(rows);
    runs.push_back(std::move(x));
  }
  return Json{{"runs", std::move(runs)}};
}

std::string short_name(const std::string& s) { return s.rfind("builtin:", 0) == 0 ? s.substr(8) : s; }

std::string value_cell(const Value& v) {
  return fmt::format("{}<br><code>{}</code>", html_escape(v.decimal), html_escape(v.hex));
}

std::string diagnosis_html(const std::vector<Diagnosis>& ds) {
  if (ds.empty()) return "";
  std::string s = "<p class=\"dx\">Diagnosis, best first:</p><ol class=\"dx\">";
  for (const auto& d : ds)
    s += fmt::format("<li>{}<b>{}</b>{}{}: {}{}{}{}</li>", d.explains ? "✔ " : "✘ ", html_escape(d.dialect),
                     d.fault_class.empty() ? "" : " (class " + html_escape(d.fault_class) + ")",
                     d.title.empty() ? "" : ", " + html_escape(d.title),
                     d.explains ? "explains the failure" : "does not explain it",
                     std::isnan(d.score) ? "" : ", score " + text::num(d.score) + " tolerance units",
                     d.parameters.empty() ? "" : ", parameters <code>" + html_escape(d.parameters) + "</code>",
                     d.evidence.empty() ? "" : " — " + html_escape(d.evidence));
  return s + "</ol>";
}

std::string case_html(const Run& run, const Case& c, bool open) {
  std::string s = fmt::format("<details class=\"case\"{}><summary><span class=\"v v-{}\">{}</span>{} <b>{}</b> — {}</summary>",
                              open ? " open" : "", html_escape(c.verdict), html_escape(c.verdict),
                              c.known_finding.empty() ? "" : " (known finding)", html_escape(c.case_id),
                              html_escape(short_name(run.name())));
  s += fmt::format("<p>{} · {} · {}</p>", html_escape(c.op_label()), html_escape(c.dtype.empty() ? "—" : c.dtype),
                   html_escape(c.category.empty() ? "—" : c.category));
  if (!c.known_finding.empty())
    s += "<p><b>Known finding</b> of this library, recorded: <code>" + html_escape(c.known_finding) + "</code>" +
         (c.known_what.empty() ? "" : " — " + html_escape(c.known_what)) + "</p>";
  if (!c.message.empty()) s += "<pre>" + html_escape(c.message) + "</pre>";
  bool any_output = false;
  for (const auto& o : c.outputs) any_output |= o.verdict != "PASSED";
  if (any_output) s += "<table class=\"worst\"><tr><th>output</th><th>verdict</th><th>reason</th><th>worst element</th><th>got</th>"
       "<th>expected (correctly rounded)</th><th>exact (binary64)</th><th>allowance</th><th>error, ulp</th>"
       "<th>error / allowance</th></tr>";
  for (const auto& o : c.outputs) {
    if (o.verdict == "PASSED") continue;
    if (o.worst) {
      const Worst& w = *o.worst;
      s += fmt::format(
          "<tr><td>{}</td><td class=\"v-{}\">{}</td><td>{}</td><td>{} (flat {})</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td><td>{}</td></tr>",
          html_escape(o.name), html_escape(o.verdict), html_escape(o.verdict), html_escape(o.reason),
          html_escape(text::coords(w.coords)), w.index, value_cell(w.got), value_cell(w.expected), value_cell(w.exact),
          text::num(w.allowance), text::num(o.max_ulp), text::num(o.max_ratio));
    } else {
      s += fmt::format("<tr><td>{}</td><td class=\"v-{}\">{}</td><td colspan=\"8\">{}</td></tr>", html_escape(o.name),
                       html_escape(o.verdict), html_escape(o.verdict), html_escape(o.reason));
    }
  }
  if (any_output) s += "</table>";
  s += diagnosis_html(c.diagnosis);
  if (!c.repro.empty()) s += "<p>Repro: <code class=\"repro\">" + html_escape(c.repro) + "</code></p>";
  return s + "</details>\n";
}

// The matrix: rows (op, dtype, category), columns the candidates; each cell a symbol and a count
// so that it reads without colour.
std::string matrix_html(const std::vector<const Run*>& runs) {
  std::set<std::tuple<std::string, std::string, std::string>> keys;
  std::vector<std::map<std::tuple<std::string, std::string, std::string>, text::MatrixRow>> by_run;
  for (const Run* run : runs) {
    auto& m = by_run.emplace_back();
    for (auto& row : text::matrix_of(*run)) {
      auto k = std::make_tuple(row.op, row.dtype, row.category);
      keys.insert(k);
      m[k] = std::move(row);
    }
  }
  // Open when short; a ci-tier matrix (about 120 rows) starts folded so the plots stay near the top.
  std::string s = fmt::format("<details{}><summary>{} rows (op × dtype × category) × {} candidates</summary>\n",
                              keys.size() <= 40 ? " open" : "", keys.size(), runs.size());
  s += "<div class=\"scroll\"><table class=\"matrix\"><thead><tr><th>op</th><th>dtype</th><th>category</th>";
  for (const Run* run : runs)
    s += fmt::format("<th class=\"cand {}\" title=\"{}\"><span>{}</span></th>", run->ok() ? "" : "notok",
                     html_escape(run->name() + " (" + run->kind + "): " + run->outcome()),
                     html_escape(short_name(run->name())));
  s += "</tr></thead><tbody>";
  for (const auto& k : keys) {
    s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td>", html_escape(std::get<0>(k)), html_escape(std::get<1>(k)),
                     html_escape(std::get<2>(k)));
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto it = by_run[i].find(k);
      if (it == by_run[i].end()) {
        s += "<td></td>";
        continue;
      }
      const auto& n = it->second.counts;
      const std::int64_t total = it->second.total;
      const std::int64_t bad = n.at("FAILED") + n.at("MISSING") + n.at("CRASHED") + n.at("TIMEOUT");
      std::string title;
      for (const auto& v : kVerdictColumns)
        if (n.at(v)) title += fmt::format("{}{} {}", title.empty() ? "" : ", ", n.at(v), v);
      std::string cls, txt;
      if (bad) cls = runs[i]->is_mutant() ? "caught" : "fail", txt = fmt::format("✗ {}/{}", bad, total);
      else if (n.at("UNSUPPORTED") == total) cls = "unsup", txt = "–";
      else if (n.at("MISTRUSTED")) cls = "mistr", txt = fmt::format("? {}/{}", n.at("MISTRUSTED"), total);
      else cls = runs[i]->is_mutant() ? "mpass" : "pass", txt = fmt::format("✓ {}", n.at("PASSED"));
      s += fmt::format("<td class=\"{}\" title=\"{}\">{}</td>", cls, html_escape(title), txt);
    }
    s += "</tr>";
  }
  return s + "</tbody></table></div></details>";
}

// The sensitivity section: the summary per candidate, then per declared reduction class the
// cases of n >= 1024 with each output's sensitivity (it depends on the inputs and the class only,
// so candidates of one class share the values; a case any of them ran is listed once).
std::string sensitivity_html(const Report& r) {
  const auto sens = text::sensitivity_of(r);
  if (sens.empty()) return "";
  std::string s =
      "<h2>Sensitivity: what “conforms” rules out</h2>\n<p>The smallest relative fault in an output that the verdict "
      "is sure to catch: a kernel whose every value is the exact one times 1 + d, correctly rounded, fails for |d| at "
      "or above it (conformance/TOLERANCE.md, section 6.1). Median and best over the cases of normalized size 4096 and "
      "above (* none run: every case). It depends on the data and the declared reduction class only. Last column: "
      "cases of n ≥ 1024 on which a variance divided by n − 1 (rstd off by about 1/(2n) where the variance dominates "
      "eps) would be caught; on arbitrary data only a class whose bound is below 1/n can see it. Per case: the probes' "
      "certain error of a kernel making that one fault over the allowance (caught above 1).</p>\n"
      "<table><tr><th>candidate</th><th>reduction</th><th>y</th><th>rstd</th><th>dweight</th><th>n − 1 variance caught</th></tr>\n";
  std::map<std::string, std::vector<const Run*>> by_class;
  for (const auto& x : sens) {
    by_class[x.run->reduction].push_back(x.run);
    s += fmt::format("<tr><td><code>{}</code></td><td><code>{}</code></td>", html_escape(x.run->name()),
                     html_escape(x.run->reduction));
    for (const char* name : {"y", "rstd", "dweight"}) {
      const auto it = std::find_if(x.outputs.begin(), x.outputs.end(), [&](const auto& o) { return o.name == name; });
      s += it == x.outputs.end() ? "<td class=\"num\">—</td>"
                                 : fmt::format("<td class=\"num\">{} (best {}){}</td>", text::num(it->median),
                                               text::num(it->best), x.production ? "" : "*");
    }
    s += fmt::format("<td class=\"num\">{}</td></tr>\n", x.n1_cases ? fmt::format("{} of {}", x.n1_caught, x.n1_cases) : "—");
  }
  s += "</table>\n";
  for (const auto& [cls, runs] : by_class) {
    std::map<std::string, const Case*> cases;
    for (const Run* run : runs)
      for (const auto& c : run->cases)
        if (c.normalized_size >= 1024) cases.emplace(c.case_id, &c);
    if (cases.empty()) continue;
    std::string names;
    for (const Run* run : runs) names += (names.empty() ? "" : ", ") + html_escape(short_name(run->name()));
    s += fmt::format("<details><summary>Per case, n ≥ 1024, declared <code>{}</code> ({} cases; {})</summary>\n"
                     "<table><tr><th>case</th><th>op</th><th>dtype</th><th>n</th><th>y</th><th>rstd</th><th>dweight</th>"
                     "<th>n − 1 variance probe</th><th>eps 1e-6 probe</th></tr>\n",
                     html_escape(cls), cases.size(), names);
    for (const auto& [id, c] : cases) {
      s += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"num\">{}</td>", html_escape(id),
                       html_escape(c->op_label()), html_escape(c->dtype.empty() ? "—" : c->dtype), c->normalized_size);
      for (const char* name : {"y", "rstd", "dweight"}) {
        const auto it = std::find_if(c->outputs.begin(), c->outputs.end(), [&](const Output& o) { return o.name == name; });
        s += fmt::format("<td class=\"num\">{}</td>", it == c->outputs.end() || !it->sensitivity ? "—" : text::num(*it->sensitivity));
      }
      const auto rstd = std::find_if(c->outputs.begin(), c->outputs.end(), [](const Output& o) { return o.name == "rstd"; });
      for (const char* probe : {"variance_over_n_minus_1", "eps_1e-6"}) {
        const auto p = rstd == c->outputs.end() ? std::map<std::string, double>::const_iterator{} : rstd->probes.find(probe);
        s += rstd == c->outputs.end() || p == rstd->probes.end()
                 ? "<td class=\"num\">—</td>"
                 : fmt::format("<td class=\"num {}\">{}</td>", p->second > 1 ? "good" : "bad", text::num(p->second));
      }
      s += "</tr>\n";
    }
    s += "</table></details>\n";
  }
  return s;
}

constexpr const char* kStyle = R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em;color:#111;max-width:100%}
h1{margin:0 0 .2em} h2{margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right}
.scroll{overflow-x:auto}
.matrix th.cand{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal;white-space:nowrap}
.matrix th.notok{font-weight:bold;text-decoration:underline}
.matrix td{text-align:center;white-space:nowrap;font-family:ui-monospace,monospace}
.pass{background:#e3f4e3} .fail{background:#f8c9c4;font-weight:bold} .caught{background:#e8e0f4}
.mpass{background:#f4f4f4} .mistr{background:#fff3c4} .unsup{background:#eee;color:#555}
.v{font-family:ui-monospace,monospace;font-weight:bold}
.v-FAILED,.v-CRASHED,.v-TIMEOUT,.v-MISSING{color:#a00000} .v-MISTRUSTED{color:#7a5a00}
code,pre{font-family:ui-monospace,monospace;font-size:12px} pre{background:#f6f6f6;padding:.4em;white-space:pre-wrap}
code.repro{background:#f6f6f6;padding:1px 4px;user-select:all}
details.case{margin:.3em 0;border-left:3px solid #ccc;padding-left:.6em}
.plots{display:flex;flex-wrap:wrap;gap:12px} .plot{border:1px solid #ddd;padding:6px}
.plot h4{margin:0 0 4px;font-size:13px} .plot p.note{font-size:11px;color:#444;max-width:560px;margin:2px 0}
.bad{color:#a00000;font-weight:bold} .good{color:#0a5a0a;font-weight:bold}
#nc-status{font-size:12px;color:#555;margin-top:2em}
)CSS";

// The page's own script: the page check and the plot helpers every page shares
// (text::page_script_prologue), then this page's plots.
constexpr const char* kScript = R"JS(
  var markers = ['circle', 'triangle', 'rect', 'crossRot', 'star', 'rectRot', 'cross', 'dash', 'line'];
  var colours = ['#1f5fa8', '#c2410c', '#2e7d32', '#6a1b9a', '#8d6e00', '#00838f', '#ad1457', '#4e342e', '#37474f'];
  function hatch(colour) {
    var c = document.createElement('canvas');
    c.width = 8; c.height = 8;
    var g = c.getContext('2d');
    g.fillStyle = '#fff'; g.fillRect(0, 0, 8, 8);
    g.strokeStyle = colour; g.lineWidth = 2;
    g.beginPath(); g.moveTo(0, 8); g.lineTo(8, 0); g.moveTo(-2, 2); g.lineTo(2, -2); g.moveTo(6, 10); g.lineTo(10, 6);
    g.stroke();
    return g.createPattern(c, 'repeat');
  }
  // A histogram over the fixed log2 bins of RESULTS.md: exact zeros, 2^k ... 2^(k+1), infinite.
  function histogram(parent, title, h, log2min, xTitle, splitAtOne) {
    var labels = ['0'], within = [0], beyond = [0];
    within[0] = h.zero;
    for (var k = 0; k < h.bins.length; ++k) {
      var e = log2min + k;
      labels.push(k === 0 ? '<2^' + (e + 1) : (k === h.bins.length - 1 ? '≥2^' + e : '2^' + e));
      var over = splitAtOne && e >= 0;
      within.push(over ? 0 : h.bins[k]);
      beyond.push(over ? h.bins[k] : 0);
    }
    labels.push('∞'); within.push(splitAtOne ? 0 : h.inf); beyond.push(splitAtOne ? h.inf : 0);
    // Leave out the empty tails so that the bars that matter are wide enough to read.
    var first = 0, last = labels.length - 1;
    while (first < last && within[first] === 0 && beyond[first] === 0) ++first;
    while (last > first && within[last] === 0 && beyond[last] === 0) --last;
    if (splitAtOne) { var one = 1 - log2min + 1; first = Math.min(first, one - 1); last = Math.max(last, one); }
    var sl = function (a) { return a.slice(first, last + 1); };
    var sets = [{label: splitAtOne ? 'within the allowance (< 1)' : 'elements', data: sl(within),
                 backgroundColor: '#7fa7d6', borderColor: '#1f5fa8', borderWidth: 1}];
    if (splitAtOne)
      sets.push({label: 'beyond the allowance (≥ 1): hatched', data: sl(beyond), backgroundColor: hatch('#b00020'),
                 borderColor: '#b00020', borderWidth: 2});
    return make(parent, title, {type: 'bar', data: {labels: sl(labels), datasets: sets},
      options: {scales: {x: {stacked: true, title: {display: true, text: xTitle}},
                         y: {stacked: true, title: {display: true, text: 'elements'}}},
                plugins: {legend: {display: true, labels: {boxWidth: 14}}}}});
  }
  function clamp(v, lo, hi) { return v < lo ? lo : (v > hi ? hi : v); }
  // One output's rows: the largest error over the allowance against |mean|/sigma, log-log.
  function scatter(parent, run, r, i) {
    var xmin = Infinity, xmax = 0, floor = 9.5367431640625e-7, notes = [];
    var pts = r.points.map(function (p) {
      var x = clamp(num(p[0]), 1e-4, 1e12), y = num(p[1]);
      y = isNaN(y) ? 1048576 : clamp(y, floor, 1048576);
      xmin = Math.min(xmin, x); xmax = Math.max(xmax, x);
      return {x: x, y: y, ulp: num(p[2]), c: run.cases[p[3]]};
    });
    if (!pts.length) return null;
    if (!(xmin < xmax)) { xmin = xmin / 2; xmax = xmax * 2 || 1; }
    var beyond = pts.filter(function (p) { return p.y > 1; }).length;
    var sets = [
      {label: 'rows within the allowance (' + (pts.length - beyond) + '): ' + markers[i % markers.length],
       data: pts.filter(function (p) { return p.y <= 1; }), pointStyle: markers[i % markers.length], pointRadius: 3.5,
       borderColor: colours[i % colours.length], backgroundColor: 'rgba(0,0,0,0)', borderWidth: 1.2},
      {label: 'rows beyond it (' + beyond + '): hatched ' + markers[(i + 1) % markers.length],
       data: pts.filter(function (p) { return p.y > 1; }), pointStyle: markers[(i + 1) % markers.length], pointRadius: 5,
       borderColor: '#b00020', backgroundColor: hatch('#b00020'), borderWidth: 1.5},
      {label: 'the allowance (error / allowance = 1): dashed line', type: 'line', data: [{x: xmin, y: 1}, {x: xmax, y: 1}],
       borderColor: '#000', borderDash: [6, 4], borderWidth: 1.5, pointRadius: 0, showLine: true}];
    if (r.constant_rows) notes.push(r.constant_rows + ' constant rows (σ = 0) have no place on the axis');
    if (r.points.length < r.total) notes.push(r.points.length + ' of ' + r.total + ' rows drawn (all beyond the allowance, an even sample of the rest)');
    notes.push('errors below 2^-20 of the allowance, exact ones included, are drawn on the bottom line');
    var chart = make(parent, r.output + ': largest error per row against the row\'s |mean|/σ', {type: 'scatter',
      data: {datasets: sets},
      options: {scales: {x: {type: 'logarithmic', title: {display: true, text: '|mean| / σ of the row (log)'},
                             ticks: {callback: decade}},
                         y: {type: 'logarithmic', title: {display: true, text: 'largest error / allowance (log)'},
                             ticks: {callback: decade}}},
                plugins: {legend: {labels: {usePointStyle: true}},
                          tooltip: {callbacks: {label: function (c) {
                            var p = c.raw; return (p.c || '') + ': mean/σ ' + p.x.toPrecision(3) + ', ' +
                              p.y.toPrecision(3) + '× allowance' + (p.ulp !== undefined ? ', ' + p.ulp.toPrecision(3) + ' ulp' : ''); }}}}}}, 560);
    var n = document.createElement('p');
    n.className = 'note';
    n.textContent = notes.join('; ');
    chart.canvas.parentNode.appendChild(n);
    return chart;
  }
  var select = document.getElementById('nc-run');
  var box = document.getElementById('nc-plots');
  function render(i) {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    box.textContent = '';
    var run = data.runs[i];
    if (!run) return;
    var sc = document.createElement('div'); sc.className = 'plots'; box.appendChild(sc);
    // y (or dx) first: the output a reader looks at.
    var rows = run.rows.slice().sort(function (a, b) {
      var rank = function (o) { return o === 'y' ? 0 : (o === 'dx' ? 1 : 2); };
      return rank(a.output) - rank(b.output) || (a.output < b.output ? -1 : 1);
    });
    rows.forEach(function (r, i) { scatter(sc, run, r, i); });
    var hs = document.createElement('div'); hs.className = 'plots'; box.appendChild(hs);
    run.hist.forEach(function (h) {
      var note = ' (' + h.cases + ' case' + (h.cases === 1 ? '' : 's') + ')';
      if (h.ratio) histogram(hs, h.output + ': error / allowance' + note, h.ratio, h.log2_min, 'error / allowance (log2 bins; 1 = the allowance)', true);
      if (h.ulp) histogram(hs, h.output + ': error in ulps' + note, h.ulp, h.log2_min, 'error in ulps of the output dtype (log2 bins)', false);
    });
    if (!run.hist.length && !run.rows.length) {
      var p = document.createElement('p'); p.textContent = 'No per-element data for this candidate (nothing compared, or results written before the histograms were added).'; box.appendChild(p);
    }
    state.views += 1;
    update();
  }
  data.runs.forEach(function (r, i) {
    var o = document.createElement('option'); o.value = String(i); o.textContent = r.name + ' (' + r.kind + '): ' + r.outcome;
    select.appendChild(o);
  });
  select.addEventListener('change', function () { render(Number(select.value)); });
  // Self-test (the headless check): draw every candidate's plots in turn, then the first again.
  if (location.hash === '#selftest') for (var i = 1; i < data.runs.length; ++i) render(i);
  var start = Number(select.getAttribute('data-default') || 0);
  // index.html#candidate=SPEC opens on that candidate.
  if (location.hash.indexOf('#candidate=') === 0) {
    var want = decodeURIComponent(location.hash.slice(11));
    data.runs.forEach(function (r, i) { if (r.name === want) start = i; });
  }
  select.value = String(start);
  render(start);
  update();
})();
)JS";

}  // namespace

std::string html(const Report& r, const std::string& plot_library, const std::string& license) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>normcheck report</title>\n";
  s += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>" + std::string(kStyle) + "</style>\n</head><body>\n";
  s += "<h1>normcheck report</h1>\n";
  std::set<std::string> fixtures;
  std::size_t files = 0;
  for (const auto& run : r.runs) {
    files += run.sources.size();
    if (!run.fixtures_path.empty()) fixtures.insert(run.fixtures_path + (run.fixtures_tier.empty() ? "" : " (tier " + run.fixtures_tier + ")"));
  }
  s += fmt::format("<p>{} candidates from {} results files", r.runs.size(), files);
  for (const auto& f : fixtures) s += " · fixtures <code>" + html_escape(f) + "</code>";
  s += "</p>\n";
  s += r.ok() ? "<p class=\"good\">✔ All as expected: every correct or external candidate conforms, every mutant is rejected.</p>\n"
              : "<p class=\"bad\">✘ Not as expected: see the outcome column (in bold).</p>\n";

  std::vector<const Run*> checks;
  for (const auto& run : r.runs)
    if (run.mode != "prop" && run.mode != "audit") checks.push_back(&run);

  // Candidates.
  s += "<h2>Candidates</h2>\n<table><tr><th>candidate</th><th>kind</th><th>mode</th>";
  for (const auto& v : kVerdictColumns) s += "<th>" + v + "</th>";
  s += "<th>outcome</th></tr>\n";
  for (const auto& run : r.runs) {
    s += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{}</td>", html_escape(run.name()), html_escape(run.kind),
                     html_escape(run.mode));
    const auto n = run.counts();
    for (const auto& v : kVerdictColumns) {
      const auto it = n.find(v);
      s += fmt::format("<td class=\"num\">{}</td>", it == n.end() || it->second == 0 ? "·" : std::to_string(it->second));
    }
    s += fmt::format("<td class=\"{}\">{} {}</td></tr>\n", run.ok() ? "good" : "bad", run.ok() ? "✔" : "✘",
                     html_escape(run.outcome()));
  }
  s += "</table>\n";

  if (!checks.empty()) {
    s += "<h2>Conformance matrix</h2>\n<p>Per op, dtype and category: ✓ n all passed, ✗ f/n failed (for a mutant: "
         "caught), ? m/n mistrusted (not comparable in the compute dtype), – unsupported. Hover a cell for the "
         "counts.</p>\n";
    s += matrix_html(checks);
  }
  s += sensitivity_html(r);

  // Plots.
  std::size_t first_bad = 0;
  for (std::size_t i = 0, k = 0; i < r.runs.size(); ++i) {
    if (r.runs[i].mode == "audit") continue;
    if (!r.runs[i].ok()) {
      first_bad = k;
      break;
    }
    ++k;
  }
  s += "<h2>Errors</h2>\n<p>For the candidate chosen: each row's largest error over its allowance against the row's "
       "|mean|/σ (a one-pass variance rises with it; a correct kernel stays flat below the dashed allowance line), and "
       "per output the histograms of the elements' error over their allowance (hatched: beyond it) and in ulps.</p>\n";
  s += fmt::format("<p><label>Candidate: <select id=\"nc-run\" data-default=\"{}\"></select></label></p>\n<div id=\"nc-plots\"></div>\n",
                   first_bad);

  // Failing cases.
  std::string fails;
  std::size_t shown = 0, hidden = 0;
  for (const auto& f : text::failing_cases(r, false)) {
    if (shown < kMaxFailingShown) fails += case_html(*f.run, *f.c, shown < 20);
    if (shown++ >= kMaxFailingShown) ++hidden;
  }
  std::string mutants;
  std::map<const Run*, std::size_t> per_mutant;
  for (const auto& f : text::failing_cases(r, true))
    if (per_mutant[f.run]++ < kMutantCasesShown) mutants += case_html(*f.run, *f.c, false);
  s += "<h2>Failing cases</h2>\n";
  s += fails.empty() ? "<p>No failing case of a correct or external candidate.</p>\n" : fails;
  if (hidden) s += fmt::format("<p>…and {} more in the results files.</p>\n", hidden);
  if (!mutants.empty())
    s += fmt::format("<h3>Mutants: the {} worst cases that caught each</h3>\n", kMutantCasesShown) + mutants;

  // Properties and audits.
  std::string props;
  for (const auto& run : r.runs)
    for (const auto& p : run.properties)
      props += fmt::format("<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"v-{}\">{}</td><td>{}</td><td>{}</td>"
                           "<td>{}</td><td>{}</td><td><code class=\"repro\">{}</code></td></tr>\n",
                           html_escape(run.name()), html_escape(p.name), html_escape(p.verdict), html_escape(p.verdict),
                           p.tests, p.seed ? std::to_string(*p.seed) : "—",
                           p.has_counterexample ? html_escape(p.cx_case_id + (p.cx_summary.empty() ? "" : ": " + p.cx_summary)) : "—",
                           diagnosis_html(p.diagnosis), html_escape(p.reproduce));
  if (!props.empty())
    s += "<h2>Properties</h2>\n<table><tr><th>candidate</th><th>property</th><th>verdict</th><th>tests</th><th>seed</th>"
         "<th>counterexample</th><th>diagnosis</th><th>reproduce</th></tr>\n" + props + "</table>\n";
  for (const auto& run : r.runs) {
    if (run.mode != "audit") continue;
    s += fmt::format("<h2>Checkpoint audit: <code>{}</code></h2>\n<p>{}{} — {}</p>\n", html_escape(run.checkpoint_path),
                     html_escape(run.checkpoint_format), run.checkpoint_profile.empty() ? "" : ", profile " + html_escape(run.checkpoint_profile),
                     html_escape(run.outcome()));
    if (run.findings.empty()) continue;
    s += "<table><tr><th>severity</th><th>check</th><th>tensors</th><th>message</th></tr>\n";
    for (const auto& f : run.findings) {
      std::string t;
      for (const auto& x : f.tensors) t += (t.empty() ? "" : "<br>") + ("<code>" + html_escape(x) + "</code>");
      s += fmt::format("<tr><td class=\"{}\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n",
                       f.severity == "error" ? "bad" : "", html_escape(f.severity), html_escape(f.check), t,
                       html_escape(f.message));
    }
    s += "</table>\n";
  }
  for (const auto& run : r.runs)
    for (const auto& e : run.errors)
      s += fmt::format("<p class=\"bad\">{} stopped early: {}</p>\n", html_escape(run.name()), html_escape(e));

  s += "<p id=\"nc-status\" data-status=\"not-run\">page check: the page's script did not run</p>\n";
  s += plot_library.empty()
           ? "<p class=\"bad\">No plots: the plotting library was not available when this report was written.</p>\n"
           : "<p style=\"font-size:12px;color:#555\">Plots drawn with Chart.js (MIT License; its license text is in a "
             "comment at the end of this page's source).</p>\n";
  s += "<script type=\"application/json\" id=\"nc-data\">" + text::script_safe(plot_data(r).dump()) + "</script>\n";
  if (!plot_library.empty()) s += "<script>\n" + text::script_safe(plot_library) + "\n</script>\n";
  s += "<script>" + std::string(text::page_script_prologue()) + kScript + "</script>\n";
  if (!license.empty()) s += "<!--\n" + text::comment_safe(license) + "\n-->\n";
  return s + "</body></html>\n";
}

}  // namespace normcheck::reports
