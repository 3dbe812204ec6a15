// Writing the reports: atomically, never over an existing file without --force.
#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "normcheck/reports/report.hpp"

#ifndef NORMCHECK_REPORT_WEB_DIR
#define NORMCHECK_REPORT_WEB_DIR ""
#endif

namespace normcheck::reports {

namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, const std::string& text, bool overwrite) {
  if (!overwrite && fs::exists(path)) throw ReportError(fmt::format("{} exists; pass --force to replace it", path));
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw ReportError(fmt::format("{}: cannot open for writing", tmp));
    f << text;
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw ReportError(fmt::format("{}: write failed", tmp));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw ReportError(fmt::format("{}: cannot rename into place: {}", path, ec.message()));
  }
}

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Where Chart.js is: $NORMCHECK_REPORT_WEB_DIR; else an installed normcheck's
// <prefix>/share/normcheck/web (found from <prefix>/bin/normcheck); else the build's source tree.
fs::path plot_library_dir() {
  if (const char* env = std::getenv("NORMCHECK_REPORT_WEB_DIR"); env && *env) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = (exe.parent_path() / ".." / "share" / "normcheck" / "web").lexically_normal();
    if (fs::is_directory(installed, ec)) return installed;
  }
  return NORMCHECK_REPORT_WEB_DIR;
}

}  // namespace

PlotLibrary load_plot_library() {
  const fs::path dir = plot_library_dir();
  PlotLibrary lib;
  lib.name = "Chart.js";
  lib.js = slurp(dir / "chart.js" / "dist" / "chart.umd.js");
  const std::string license = slurp(dir / "chart.js" / "LICENSE.md");
  // chart.umd.js bundles @kurkle/color: its license travels too.
  const std::string color_license = slurp(dir / "@kurkle" / "color" / "LICENSE.md");
  if (lib.js.empty() || license.empty() || color_license.empty())
    throw ReportError(fmt::format(
        "the HTML report needs Chart.js, installed under {} (chart.js/dist/chart.umd.js and the license texts): run "
        "scripts/install-deps.sh, or set NORMCHECK_REPORT_WEB_DIR to a node_modules directory that holds chart.js",
        dir.string()));
  const std::string pkg = slurp(dir / "chart.js" / "package.json");
  const auto at = pkg.find("\"version\"");
  if (at != std::string::npos) {
    const auto q1 = pkg.find('"', pkg.find(':', at) + 1), q2 = pkg.find('"', q1 + 1);
    if (q1 != std::string::npos && q2 != std::string::npos) lib.version = pkg.substr(q1 + 1, q2 - q1 - 1);
  }
  lib.license = "Chart.js " + lib.version + " (https://www.chartjs.org), MIT License:\n" + license +
                "\n\nChart.js bundles @kurkle/color, MIT License:\n" + color_license;
  return lib;
}

std::vector<std::string> write_reports(const Report& r, const Targets& t) {
  const std::string html_path = t.html_dir.empty() ? "" : (fs::path(t.html_dir) / "index.html").string();
  // Everything that can fail before anything is written: existing outputs, the plot library.
  for (const auto& p : {t.junit, t.markdown, html_path, t.summary_json})
    if (!p.empty() && !t.overwrite && fs::exists(p))
      throw ReportError(fmt::format("{} exists; pass --force to replace it", p));
  PlotLibrary lib;
  if (!html_path.empty()) lib = load_plot_library();
  // Render all documents first; write only when every one of them is ready.
  std::vector<std::pair<std::string, std::string>> docs;
  if (!t.junit.empty()) docs.emplace_back(t.junit, junit_xml(r));
  if (!t.markdown.empty()) docs.emplace_back(t.markdown, markdown(r));
  if (!t.summary_json.empty()) docs.emplace_back(t.summary_json, summary_json(r));
  if (!html_path.empty()) docs.emplace_back(html_path, html(r, lib.js, lib.license));
  for (const auto& [path, text] : docs) {
    const fs::path parent = fs::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) throw ReportError(fmt::format("{}: cannot create the directory: {}", parent.string(), ec.message()));
  }
  std::vector<std::string> written;
  for (const auto& [path, text] : docs) {
    write_file_atomic(path, text, t.overwrite);
    written.push_back(path);
  }
  return written;
}

}  // namespace normcheck::reports
