// The placement study's page and summary from its results file: a minimal valid file renders;
// a file that is not one is refused with the field named (the CLI writes the file itself, so
// these guard the reader against a results file from another version or edited by hand).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "normcheck/reports/study.hpp"

namespace normcheck::reports {
namespace {

nlohmann::ordered_json minimal() {
  nlohmann::ordered_json step = {{"step", 0}, {"loss", 1.5}, {"model_update", 0}, {"grad_w1", {1, 2}},
                                 {"grad_w2", {3, "inf"}}, {"act_in", {1, 1}}, {"act_out", {1, 1}}, {"block_update", {0.5, 0.5}},
                                 {"lowp", {{{"dtype", "float16"}, {"loss_finite", true}, {"fwd_inf", {0, 0, 0}}, {"fwd_nan", {0, 0, 0}},
                                            {"fwd_subnormal", {0, 0, 0}}, {"bwd_inf", {0, 4, 0}}, {"bwd_nan", {9, 0, 0}},
                                            {"bwd_subnormal", {0, 0, 1}}}}}};
  return {{"format", "normcheck-study-placement"}, {"format_version", 1}, {"generator", "normcheck test"},
          {"command", "normcheck study placement"}, {"options", {{"loss_scale", 65536}}},
          {"checks", {{{"id", "c"}, {"source", "s"}, {"claim", "a | b"}, {"status", "reproduced"}, {"measured", "||x|| 1"}}}},
          {"runs", {{{"placement", "post"}, {"norm", "layernorm"}, {"layers", 2}, {"steps", {step}}}}}};
}

// Version 2: attention gradients, pre-norm sums and the learning-rate sweep.
nlohmann::ordered_json minimal2() {
  auto j = minimal();
  j["format_version"] = 2;
  j["options"]["model"] = "attention+ffn";
  auto& st = j["runs"][0]["steps"][0];
  for (const char* f : {"grad_wq", "grad_wk", "grad_wv", "grad_wo", "prenorm_attn", "prenorm_ffn"}) st[f] = {1, 2};
  j["lr_sweep"] = {{"lr", {0.01, 1}}, {"steps", 4}, {"optimizer", "adam"}, {"criterion", "usable: below the start"},
                   {"runs", {{{"placement", "post"}, {"norm", "layernorm"}, {"layers", 2}, {"usable", {true, false}},
                              {"final_over_initial", {0.5, 1.2}}, {"largest_usable_lr", 0.01}, {"smallest_unusable_lr", 1},
                              {"best_lr", 0.01}}}}};
  return j;
}

// Version 3: the statistics over seeds.
nlohmann::ordered_json minimal3() {
  auto j = minimal2();
  j["format_version"] = 3;
  j["options"]["seeds"] = 2;
  j["seeds"] = {{"seeds", {7, 8}}, {"statistic", "geometric means"},
                {"runs", {{{"placement", "post"}, {"norm", "layernorm"}, {"layers", 2}, {"grad_w1", {{1, 2}, {1, 2}}},
                           {"grad_w2", {{1, 2}, {1, 8}}}, {"model_update", {0.1, 0.4}}, {"grad_w2_geomean", {1, 4}},
                           {"grad_w2_log_slope", std::log(4.0)}, {"grad_w2_log_slope_se", 0.0},
                           {"model_update_geomean", 0.2}}}}};
  return j;
}

// Version 4: the activations per seed. Values chosen so that the geometric means are exact.
nlohmann::ordered_json minimal4() {
  auto j = minimal3();
  j["format_version"] = 4;
  auto& row = j["seeds"]["runs"][0];
  row["grad_w1"] = {{1, 2}, {4, 32}};
  row["act_in"] = {{9, "nan"}, {1, 3}};
  row["act_out"] = {{2, 5}, {8, 5}};
  return j;
}

// The page's inlined bands over seeds (the JSON of <script id="nc-seed-bands">).
nlohmann::json bands_of(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"nc-seed-bands\">";
  const auto at = html.find(open);
  if (at == std::string::npos) return nullptr;
  const auto from = at + open.size();
  return nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from));
}

std::string error_of(const nlohmann::ordered_json& j) {
  try {
    study_placement_markdown(j.dump(), "s.json");
  } catch (const ReportError& e) {
    return e.what();
  }
  return "";
}

TEST(StudyPage, MinimalFileRenders) {
  const std::string md = study_placement_markdown(minimal().dump(), "s.json");
  EXPECT_NE(md.find("| `c` | **reproduced** | \\|\\|x\\|\\| 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("float16 4 / 9"), std::string::npos) << md;
  const std::string html = study_placement_html(minimal().dump(), "s.json", "", "");
  EXPECT_NE(html.find("id=\"nc-status\""), std::string::npos);
  EXPECT_NE(html.find("No plots: the plotting library"), std::string::npos);
  // Text from the file ends neither the data's <script> element nor the table early.
  auto j = minimal();
  j["checks"][0]["measured"] = "</script><b>x";
  const std::string page = study_placement_html(j.dump(), "s.json", "", "");
  EXPECT_EQ(page.find("</script><b>x"), std::string::npos);
  EXPECT_NE(page.find("&lt;/script&gt;&lt;b&gt;x"), std::string::npos);
  EXPECT_NE(page.find("<\\/script><b>x"), std::string::npos);
}

TEST(StudyPage, Version2FileRendersTheSweep) {
  const std::string md = study_placement_markdown(minimal2().dump(), "s.json");
  EXPECT_NE(md.find("## Usable learning rates"), std::string::npos) << md;
  EXPECT_NE(md.find("| post | layernorm | 2 | 0.01 | 1 | 0.01 | 0.5 | 1.2 ✗ |"), std::string::npos) << md;
  EXPECT_NE(md.find("small encoder"), std::string::npos) << md;
  EXPECT_NE(md.find("| float16 4 / 9 | 2 |"), std::string::npos) << md;  // the last layer's pre-norm sum
  const std::string html = study_placement_html(minimal2().dump(), "s.json", "", "");
  EXPECT_NE(html.find("self-attention + FFN blocks"), std::string::npos);
}

TEST(StudyPage, Version3FileRendersTheSeeds) {
  const std::string md = study_placement_markdown(minimal3().dump(), "s.json");
  EXPECT_NE(md.find("## Across seeds"), std::string::npos) << md;
  EXPECT_NE(md.find("| post | layernorm | 2 | 2 | 4 | 4 – 4 | 4 | 0.2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Usable learning rates"), std::string::npos) << md;
  const std::string html = study_placement_html(minimal3().dump(), "s.json", "", "");
  EXPECT_NE(html.find("<h2>Across seeds</h2>"), std::string::npos);
  // Versions 1 and 2 have no seeds section.
  EXPECT_EQ(study_placement_markdown(minimal2().dump(), "s.json").find("## Across seeds"), std::string::npos);
  auto j = minimal3();
  j["seeds"]["runs"][0]["model_update"] = {0.1};
  EXPECT_NE(error_of(j).find("seeds.runs[0].model_update: expected 2 values"), std::string::npos);
  j = minimal3();
  j["seeds"]["runs"][0]["grad_w2_log_slope"] = "steep";
  EXPECT_NE(error_of(j).find("seeds.runs[0].grad_w2_log_slope: expected a number"), std::string::npos);
  j = minimal3();
  j["seeds"]["runs"][0].erase("grad_w2_geomean");
  EXPECT_NE(error_of(j).find("seeds.runs[0].grad_w2_geomean: missing"), std::string::npos);
}

// Versions 1 to 4 are read; the per-layer plots at initialization are the geometric mean over
// the seeds with the min-max band, here checked against values worked out by hand.
TEST(StudyPage, Version4FileBandsOverSeeds) {
  for (const auto& j : {minimal(), minimal2(), minimal3(), minimal4()}) EXPECT_EQ(error_of(j), "") << j["format_version"];
  const auto b = bands_of(study_placement_html(minimal4().dump(), "s.json", "", ""));
  ASSERT_TRUE(b.is_object());
  EXPECT_EQ(b["seeds"], 2);
  ASSERT_EQ(b["runs"].size(), 1u);
  const auto& r = b["runs"][0];
  EXPECT_EQ(r["placement"], "post");
  EXPECT_EQ(r["layers"], 2);
  auto near = [](const nlohmann::json& got, std::vector<double> want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (std::isnan(want[i])) EXPECT_EQ(got[i], "nan") << what << "[" << i << "]";
      else EXPECT_NEAR(got[i].get<double>(), want[i], 1e-12 * want[i]) << what << "[" << i << "]";
  };
  const double nan = std::nan("");
  near(r["grad_w1"]["mean"], {2, 8}, "grad_w1 mean");  // sqrt(1 * 4), sqrt(2 * 32)
  near(r["grad_w1"]["min"], {1, 2}, "grad_w1 min");
  near(r["grad_w1"]["max"], {4, 32}, "grad_w1 max");
  near(r["grad_w2"]["mean"], {1, 4}, "grad_w2 mean");  // sqrt(1 * 1), sqrt(2 * 8)
  near(r["grad_w2"]["min"], {1, 2}, "grad_w2 min");
  near(r["grad_w2"]["max"], {1, 8}, "grad_w2 max");
  near(r["act_in"]["mean"], {3, nan}, "act_in mean");  // a seed's NaN: the layer is not drawn
  near(r["act_in"]["min"], {1, nan}, "act_in min");
  near(r["act_in"]["max"], {9, nan}, "act_in max");
  near(r["act_out"]["mean"], {4, 5}, "act_out mean");
  near(r["act_out"]["min"], {2, 5}, "act_out min");
  near(r["act_out"]["max"], {8, 5}, "act_out max");
  // Version 3 has the gradients per seed, not the activations; versions 1 and 2 no seeds.
  const auto b3 = bands_of(study_placement_html(minimal3().dump(), "s.json", "", ""));
  near(b3["runs"][0]["grad_w2"]["mean"], {1, 4}, "v3 grad_w2 mean");
  EXPECT_FALSE(b3["runs"][0].contains("act_in"));
  EXPECT_EQ(bands_of(study_placement_html(minimal2().dump(), "s.json", "", ""))["runs"].size(), 0u);
  // The per-seed arrays are checked: one array per seed, one value per layer.
  auto j = minimal4();
  j["seeds"]["runs"][0]["act_in"] = {{1, 2}};
  EXPECT_NE(error_of(j).find("seeds.runs[0].act_in: expected 2 arrays (one per seed), got 1"), std::string::npos) << error_of(j);
  j = minimal4();
  j["seeds"]["runs"][0]["act_out"][1] = {1};
  EXPECT_NE(error_of(j).find("seeds.runs[0].act_out[1]: expected 2 values (one per layer), got 1"), std::string::npos) << error_of(j);
  j = minimal4();
  j["seeds"]["runs"][0]["grad_w1"][0][1] = "big";
  EXPECT_NE(error_of(j).find("seeds.runs[0].grad_w1[0][1]: expected a number"), std::string::npos) << error_of(j);
}

TEST(StudyPage, BadFilesNameTheField) {
  EXPECT_NE(error_of(nlohmann::ordered_json::array()).find("s.json: (root): expected an object"), std::string::npos);
  auto j = minimal();
  j["format"] = "normcheck-results";
  EXPECT_NE(error_of(j).find("s.json: format: expected \"normcheck-study-placement\""), std::string::npos);
  j = minimal();
  j["format_version"] = 5;
  EXPECT_NE(error_of(j).find("s.json: format_version: expected 1 to 4 (the versions this normcheck reads), got 5"), std::string::npos)
      << error_of(j);
  j = minimal4();
  j["format_version"] = 5;
  EXPECT_NE(error_of(j).find("got 5"), std::string::npos);
  j["format_version"] = 0;
  EXPECT_NE(error_of(j).find("got 0"), std::string::npos);
  j = minimal2();
  j["runs"][0]["steps"][0]["prenorm_ffn"] = {1};
  EXPECT_NE(error_of(j).find("runs[0].steps[0].prenorm_ffn: expected 2 values"), std::string::npos);
  j = minimal2();
  j["lr_sweep"]["runs"][0]["usable"] = {true};
  EXPECT_NE(error_of(j).find("lr_sweep.runs[0].usable"), std::string::npos);
  j = minimal2();
  j["lr_sweep"]["runs"][0]["largest_usable_lr"] = "big";
  EXPECT_NE(error_of(j).find("lr_sweep.runs[0].largest_usable_lr: expected a number or null"), std::string::npos);
  j = minimal();
  j["runs"][0]["steps"][0]["grad_w2"] = {1};
  EXPECT_NE(error_of(j).find("runs[0].steps[0].grad_w2: expected 2 values (one per layer), got 1"), std::string::npos);
  j = minimal();
  j["runs"][0]["steps"][0]["lowp"][0]["bwd_nan"][1] = "x";
  EXPECT_NE(error_of(j).find("runs[0].steps[0].lowp[0].bwd_nan[1]: expected a number"), std::string::npos);
  j = minimal();
  j["checks"][0].erase("status");
  EXPECT_NE(error_of(j).find("checks[0].status: missing"), std::string::npos);
  try {
    study_placement_markdown("{\"format\":", "t.json");
    ADD_FAILURE() << "truncated JSON accepted";
  } catch (const ReportError& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: not valid JSON"), std::string::npos);
  }
}

}  // namespace
}  // namespace normcheck::reports
