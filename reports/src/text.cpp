#include "text.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace normcheck::reports::text {

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.3g}", v);
}

std::string coords(const std::vector<std::int64_t>& c) {
  std::string s = "[";
  for (std::size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + "]";
}

std::string worst_line(const Output& o) {
  if (!o.worst) return o.name + ": " + (o.reason.empty() ? o.verdict : o.reason);
  const Worst& w = *o.worst;
  return fmt::format(
      "{} worst element at {} (flat {}): got {} ({}), expected {} ({}), exact {} ({}); error {} ulp = {} x the "
      "allowance {}",
      o.name, coords(w.coords), w.index, w.got.decimal, w.got.hex, w.expected.decimal, w.expected.hex, w.exact.decimal,
      w.exact.hex, num(o.max_ulp), num(o.max_ratio), num(w.allowance));
}

std::string diagnosis_line(const Diagnosis& d) {
  std::string s = d.dialect;
  if (!d.fault_class.empty() || !d.title.empty())
    s += " (" + (d.fault_class.empty() ? "" : "class " + d.fault_class + (d.title.empty() ? "" : ": ")) + d.title + ")";
  s += d.explains ? ": explains the failure" : ": does not explain it";
  if (!std::isnan(d.score)) s += ", score " + num(d.score) + " tolerance units";
  if (!d.parameters.empty()) s += ", parameters " + d.parameters;
  if (!d.evidence.empty()) s += " — " + d.evidence;
  return s;
}

std::string case_detail(const Case& c) {
  std::string s = c.verdict + " " + c.case_id;
  if (!c.message.empty()) s += ": " + c.message;
  s += "\n";
  for (const auto& o : c.outputs) {
    if (o.verdict == "PASSED") continue;
    s += "  " + o.name + " " + o.verdict + ": " + o.reason + "\n";
    if (o.worst && o.verdict == "FAILED") s += "    " + worst_line(o) + "\n";
  }
  if (!c.diagnosis.empty()) {
    s += "  diagnosis (best first):\n";
    for (const auto& d : c.diagnosis) s += "    " + diagnosis_line(d) + "\n";
  }
  if (!c.repro.empty()) s += "  repro: " + c.repro + "\n";
  return s;
}

std::string property_detail(const Property& p) {
  std::string s = p.verdict + " " + p.name;
  if (!p.message.empty()) s += ": " + p.message;
  s += fmt::format("\n  {} tests", p.tests);
  if (p.seed) s += fmt::format(", seed {}", *p.seed);
  s += "\n";
  if (p.has_counterexample) {
    s += "  counterexample: " + p.cx_case_id + (p.cx_fixture.empty() ? "" : " in " + p.cx_fixture);
    if (!p.cx_shape.empty()) s += ", shape " + coords(p.cx_shape);
    if (!p.cx_summary.empty()) s += ": " + p.cx_summary;
    s += "\n";
  }
  if (!p.diagnosis.empty()) {
    s += "  diagnosis (best first):\n";
    for (const auto& d : p.diagnosis) s += "    " + diagnosis_line(d) + "\n";
  }
  if (!p.reproduce.empty()) s += "  reproduce: " + p.reproduce + "\n";
  return s;
}

std::vector<MatrixRow> matrix_of(const Run& r) {
  std::map<std::tuple<std::string, std::string, std::string>, MatrixRow> m;
  for (const auto& c : r.cases) {
    const auto key = std::make_tuple(c.op_label(), c.dtype.empty() ? "—" : c.dtype, c.category.empty() ? "—" : c.category);
    auto& row = m[key];
    if (row.counts.empty()) {
      std::tie(row.op, row.dtype, row.category) = key;
      for (const auto& v : kVerdictColumns) row.counts[v] = 0;
    }
    ++row.counts[c.verdict];
    ++row.total;
  }
  std::vector<MatrixRow> out;
  for (auto& [k, v] : m) out.push_back(std::move(v));
  return out;
}

std::vector<Ranked> failing_cases(const Report& r, bool mutants) {
  std::vector<Ranked> out;
  for (const auto& run : r.runs) {
    if (run.is_mutant() != mutants) continue;
    for (const auto& c : run.cases)
      if (is_failure(c.verdict)) out.push_back({&run, &c});
  }
  auto ratio = [](const Case* c) {
    const Output* o = c->worst_output();
    return o && !std::isnan(o->max_ratio) ? o->max_ratio : (c->verdict == "FAILED" ? 0.0 : INFINITY);
  };
  std::stable_sort(out.begin(), out.end(), [&](const Ranked& a, const Ranked& b) { return ratio(a.c) > ratio(b.c); });
  return out;
}

std::vector<SensitivitySummary> sensitivity_of(const Report& r) {
  std::vector<SensitivitySummary> out;
  for (const auto& run : r.runs) {
    if (run.mode == "prop" || run.mode == "audit" || run.is_mutant()) continue;
    SensitivitySummary s;
    s.run = &run;
    for (const auto& c : run.cases)
      s.production |= c.normalized_size >= kProductionSize && std::any_of(c.outputs.begin(), c.outputs.end(),
                                                                        [](const Output& o) { return o.sensitivity.has_value(); });
    std::map<std::string, std::vector<double>> values;
    for (const auto& c : run.cases) {
      for (const auto& o : c.outputs) {
        if (!o.sensitivity) continue;
        if (const auto p = o.probes.find("variance_over_n_minus_1"); p != o.probes.end() && c.normalized_size >= 1024) {
          ++s.n1_cases;
          s.n1_caught += p->second > 1;
        }
        if (!s.production || c.normalized_size >= kProductionSize) values[o.name].push_back(*o.sensitivity);
      }
    }
    for (const char* name : {"y", "rstd", "dweight"}) {
      auto it = values.find(name);
      if (it == values.end()) continue;
      auto& v = it->second;
      std::sort(v.begin(), v.end());
      s.outputs.push_back({name, static_cast<std::int64_t>(v.size()), v.front(), v[v.size() / 2]});
    }
    if (!s.outputs.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') o += "?";
        else o += static_cast<char>(c);
    }
  }
  return o;
}

std::string html_escape(const std::string& s) { return xml_escape(s); }

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n') o += "<br>";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '\r') continue;
    else o += c;
  }
  return o;
}

std::string md_code(const std::string& s) {
  std::string fence = "`";
  while (s.find(fence) != std::string::npos) fence += "`";
  std::string body = s;
  for (auto& c : body)
    if (c == '\n') c = ' ';
  const bool pad = !body.empty() && (body.front() == '`' || body.back() == '`');
  return fence + (pad ? " " : "") + body + (pad ? " " : "") + fence;
}

std::string script_safe(std::string s) {
  for (std::size_t at = 0; (at = s.find("</", at)) != std::string::npos; at += 3) s.replace(at, 2, "<\\/");
  return s;
}

std::string comment_safe(std::string s) {
  for (std::size_t at = 0; (at = s.find("--", at)) != std::string::npos;) s.replace(at, 2, "- -");
  return s;
}

const char* page_script_prologue() {
  return R"JS(
(function () {
  'use strict';
  var statusEl = document.getElementById('nc-status');
  var state = {errors: [], charts: 0, blank: 0, views: 0};
  function update() {
    statusEl.setAttribute('data-errors', String(state.errors.length));
    statusEl.setAttribute('data-charts', String(state.charts));
    statusEl.setAttribute('data-blank', String(state.blank));
    statusEl.setAttribute('data-views', String(state.views));
    var ok = state.errors.length === 0 && state.blank === 0;
    statusEl.setAttribute('data-status', ok ? 'ok' : 'bad');
    statusEl.textContent = 'page check: ' + (ok ? 'ok' : 'PROBLEMS') + ', ' + state.charts + ' plots drawn, ' +
        state.blank + ' blank, ' + state.errors.length + ' script errors' +
        (state.errors.length ? ': ' + state.errors.join(' | ') : '');
  }
  function record(msg) { state.errors.push(String(msg)); update(); }
  window.addEventListener('error', function (e) { record('error: ' + e.message); });
  var consoleError = console.error;
  console.error = function () {
    record('console.error: ' + Array.prototype.join.call(arguments, ' '));
    consoleError.apply(console, arguments);
  };
  var data = JSON.parse(document.getElementById('nc-data').textContent);
  if (typeof Chart === 'undefined') {
    statusEl.setAttribute('data-status', 'no-plot-library');
    statusEl.textContent = 'page check: the plotting library is missing; no plots';
    return;
  }
  Chart.defaults.animation = false;
  Chart.defaults.font.size = 11;
  function num(v) { return typeof v === 'number' ? v : (v === 'inf' ? Infinity : (v === '-inf' ? -Infinity : NaN)); }
  var charts = [];
  function drawn(chart) {
    var cv = chart.canvas, g = cv.getContext('2d');
    var px = g.getImageData(0, 0, cv.width, cv.height).data;
    for (var i = 3; i < px.length; i += 4) if (px[i] !== 0) return true;
    return false;
  }
  function make(parent, title, config, width) {
    var box = document.createElement('div');
    box.className = 'plot';
    var h = document.createElement('h4');
    h.textContent = title;
    box.appendChild(h);
    var cv = document.createElement('canvas');
    cv.width = width || 440; cv.height = 240;
    cv.setAttribute('role', 'img');
    cv.setAttribute('aria-label', title);
    box.appendChild(cv);
    parent.appendChild(box);
    config.options = config.options || {};
    config.options.responsive = false;
    var chart = new Chart(cv, config);
    charts.push(chart);
    state.charts += 1;
    if (!drawn(chart)) { state.blank += 1; record('blank plot: ' + title); }
    return chart;
  }
  // Log-axis ticks at powers of ten only, written 1e-3 ... 1e6.
  function decade(v) {
    var l = Math.round(Math.log10(v));
    return Math.abs(Math.log10(v) - l) < 1e-9 ? (l === 0 ? '1' : '1e' + l) : '';
  }
)JS";
}

}  // namespace normcheck::reports::text
