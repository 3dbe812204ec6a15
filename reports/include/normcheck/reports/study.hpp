// Pages of the studies (`normcheck study placement`): read from the study's results file
// (format normcheck-study-placement v1 to v4, conformance/study/README.md), like every report here.
#pragma once

#include <string>

#include "normcheck/reports/report.hpp"

namespace normcheck::reports {

inline constexpr const char* kStudyPlacementFormat = "normcheck-study-placement";
inline constexpr int kStudyPlacementVersion = 4;  // the newest version read (1 to 4 are)

// The self-contained HTML page (plots inlined with `plot_library`, its `license` as a comment)
// and the Markdown summary of a placement study's results file. `source` names the file in
// messages. Throw ReportError for text that is not such a file (format, version, a missing or
// mistyped field), naming the field.
std::string study_placement_html(const std::string& json_text, const std::string& source,
                                 const std::string& plot_library, const std::string& license);
std::string study_placement_markdown(const std::string& json_text, const std::string& source);

}  // namespace normcheck::reports
