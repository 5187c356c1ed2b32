// The demo's pure writers: the KV heatmap, the scaling table and chart, the HTML page.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "simkit/report/charts.h"
#include "simkit/report/html.h"
#include "simkit/report/scaling.h"

namespace kvroute::report {
namespace {

int Count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

// The fill of every heatmap cell, in document order (row after row).
std::vector<std::string> CellFills(const std::string& svg) {
  std::vector<std::string> fills;
  const std::string cell = "<rect class=\"kv\"";
  for (size_t at = svg.find(cell); at != std::string::npos; at = svg.find(cell, at + 1)) {
    const size_t f = svg.find("fill=\"", at) + 6;
    fills.push_back(svg.substr(f, 7));
  }
  return fills;
}

PolicyReport WithKv(std::string policy, std::vector<double> times,
                    std::vector<std::vector<double>> series) {
  PolicyReport p;
  p.policy = std::move(policy);
  p.kv_times = std::move(times);
  p.kv_series = std::move(series);
  return p;
}

TEST(KvColorTest, StopsMidpointsClampAndUnknown) {
  EXPECT_EQ(KvColor(0.0), "#f7fbff");
  EXPECT_EQ(KvColor(0.5), "#fed976");
  EXPECT_EQ(KvColor(0.8), "#fd8d3c");
  EXPECT_EQ(KvColor(1.0), "#bd0026");
  // Halfway between #f7fbff and #fed976: (250.5, 234, 186.5) rounded.
  EXPECT_EQ(KvColor(0.25), "#fbeabb");
  EXPECT_EQ(KvColor(-0.3), "#f7fbff");
  EXPECT_EQ(KvColor(1.7), "#bd0026");
  EXPECT_EQ(KvColor(std::nan("")), "#cccccc");
  EXPECT_EQ(KvColor(INFINITY), "#cccccc");
}

TEST(KvHeatmapTest, OneCellPerReplicaAndSampleInOrder) {
  const std::vector<PolicyReport> ps = {
      WithKv("round-robin", {0, 1, 2, 3}, {{0, 0.5, 1, 0.25}, {0.8, 0.8, 0.8, 0.8}})};
  const std::string svg = KvHeatmapSvg(ps, 4);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(CellFills(svg),
            (std::vector<std::string>{"#f7fbff", "#fed976", "#bd0026", "#fbeabb", "#fd8d3c",
                                      "#fd8d3c", "#fd8d3c", "#fd8d3c"}));
  EXPECT_NE(svg.find(">round-robin</text>"), std::string::npos);
  EXPECT_NE(svg.find(">replica 1</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">replica 2</text>"), std::string::npos);
  EXPECT_NE(svg.find(">3 s</text>"), std::string::npos);
  EXPECT_EQ(Count(svg, ">100%</text>"), 1);  // the legend
}

TEST(KvHeatmapTest, ASliceShowsItsHighestSample) {
  // Two slices over [0, 3]: samples at 0 and 1 fall in the first, 2 and 3 in the second.
  const std::vector<PolicyReport> ps = {WithKv("kvroute", {0, 1, 2, 3}, {{0, 0.5, 1, 0.25}})};
  EXPECT_EQ(CellFills(KvHeatmapSvg(ps, 2)), (std::vector<std::string>{"#fed976", "#bd0026"}));
}

TEST(KvHeatmapTest, ASliceWithoutSamplesIsGreyAndAPolicyWithoutSamplesSaysSo) {
  const std::vector<PolicyReport> ps = {WithKv("a", {0, 0.1, 3}, {{0.5, 0.5, 1}}),
                                        WithKv("b", {}, {})};
  const std::string svg = KvHeatmapSvg(ps, 3);
  EXPECT_EQ(CellFills(svg), (std::vector<std::string>{"#fed976", "#cccccc", "#bd0026"}));
  EXPECT_EQ(Count(svg, "no samples"), 1);
}

TEST(KvHeatmapTest, ColumnsAreCappedAndNamesEscaped) {
  std::vector<double> times, kv;
  for (int k = 0; k < 500; ++k) {
    times.push_back(k * 0.1);
    kv.push_back(0.3);
  }
  const std::vector<PolicyReport> ps = {WithKv("a<b & \"c\"", times, {kv, kv, kv})};
  const std::string svg = KvHeatmapSvg(ps, 90);
  EXPECT_EQ(CellFills(svg).size(), 3u * 90u);
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

std::vector<ScalingPoint> Points() {
  auto P = [](std::string policy, int replicas, double tok, double p99) {
    ScalingPoint p;
    p.policy = std::move(policy);
    p.replicas = replicas;
    p.offered_rate = 4.0 * replicas;
    p.output_tokens_per_s = tok;
    p.ttft_p50_s = 0.05;
    p.ttft_p99_s = p99;
    p.prefix_hit_rate = 0.5;
    return p;
  };
  return {P("round-robin", 2, 1000, 3.5),  P("round-robin", 4, 1500, 8.0),
          P("round-robin", 8, 2000, 12.0), P("kvroute", 2, 1200, 0.4),
          P("kvroute", 8, 4800, 0.6),      P("kvroute", 4, 2400, 0.5)};
}

TEST(ScalingTest, GainsFromTheSmallestToTheLargestFleetPerPolicy) {
  const std::vector<ScalingPoint> points = Points();
  const std::vector<ScalingGain> g = ScalingGains(points);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].policy, "round-robin");
  EXPECT_EQ(g[0].from_replicas, 2);
  EXPECT_EQ(g[0].to_replicas, 8);
  EXPECT_DOUBLE_EQ(g[0].ratio, 2.0);
  EXPECT_EQ(g[1].policy, "kvroute");
  EXPECT_DOUBLE_EQ(g[1].ratio, 4.0);
  const std::vector<ScalingPoint> one = {points[0]};
  EXPECT_EQ(ScalingGains(one)[0].ratio, 0.0);
}

TEST(ScalingTest, TextAndMarkdownHaveEveryRowAndTheGains) {
  const std::vector<ScalingPoint> points = Points();
  const std::string text = ScalingText(points);
  EXPECT_EQ(Count(text, "\n"), 1 + 6 + 2);
  EXPECT_NE(text.find("round-robin: 2 -> 8 replicas, 1000 -> 2000 out tok/s (x2.00)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvroute: 2 -> 8 replicas, 1200 -> 4800 out tok/s (x4.00)"),
            std::string::npos);
  EXPECT_NE(text.find("12.00 s"), std::string::npos);
  EXPECT_NE(text.find("400 ms"), std::string::npos);
  const std::string md = ScalingMarkdown(points);
  EXPECT_EQ(Count(md, "\n| "), 6);  // the rows after the header
  EXPECT_NE(md.find("| kvroute | 8 | 32.0 | 4800 | 50 ms | 600 ms | 50.0% |"), std::string::npos)
      << md;
}

TEST(ScalingTest, Json) {
  const std::vector<ScalingPoint> one = {Points()[3]};
  EXPECT_EQ(ScalingJson(one),
            "{\"points\": [{\"policy\": \"kvroute\", \"replicas\": 2, \"offered_rate\": 8, "
            "\"requests\": 0, \"output_tokens_per_s\": 1200, \"ttft_p50_s\": 0.05, "
            "\"ttft_p99_s\": 0.4, \"prefix_hit_rate\": 0.5, \"goodput_requests_per_s\": 0}], "
            "\"gains\": [{\"policy\": \"kvroute\", \"from_replicas\": 2, \"to_replicas\": 2, "
            "\"from_tokens_per_s\": 1200, \"to_tokens_per_s\": 1200, \"ratio\": 0}]}");
}

TEST(ScalingSvgTest, AMarkerPerPointAnIdealLinePerPolicyAndTheGainInTheLegend) {
  const std::vector<ScalingPoint> points = Points();
  const std::string svg = ScalingSvg(points);
  EXPECT_EQ(Count(svg, "<circle class=\"pt\""), 6);
  EXPECT_EQ(Count(svg, "<line class=\"ideal\""), 2);
  EXPECT_EQ(Count(svg, "<polyline"), 2);
  EXPECT_NE(svg.find(">round-robin x2.0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">kvroute x4.0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">4800</text>"), std::string::npos);
  // Linear scaling from round-robin's 1000 at 2 replicas is 4000 at 8, below kvroute's 4800:
  // the axis tops at 6000 (the first round value >= 1.05 x 4800 = 5040).
  EXPECT_NE(svg.find(">6000</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">10000</text>"), std::string::npos);
}

TEST(HtmlTest, SectionsInOrderEscapedAndSelfContained) {
  HtmlSection a{"scaling", "Scaling <story>", {}};
  a.blocks.push_back({HtmlBlock::Kind::kParagraph, "2 -> 8 replicas & \"more\"", {}, {}});
  a.blocks.push_back({HtmlBlock::Kind::kSvg, "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>", {}, {}});
  HtmlSection b{"doctor round robin", "Diagnosis", {}};
  b.blocks.push_back({HtmlBlock::Kind::kPre, "<script>alert('x')</script>", {}, {}});
  b.blocks.push_back({HtmlBlock::Kind::kTable, "", {"policy", "TTFT p99"}, {{"kvroute", "<1 s"}}});
  const std::string html = HtmlPage("kvroute demo & co", "seed-8x", {a, b});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>\n", 0), 0u);
  EXPECT_NE(html.find("<title>kvroute demo &amp; co</title>"), std::string::npos);
  EXPECT_NE(html.find("<h2>Scaling &lt;story&gt;</h2>"), std::string::npos);
  EXPECT_NE(html.find("<p>2 -&gt; 8 replicas &amp; &quot;more&quot;</p>"), std::string::npos);
  EXPECT_NE(html.find("<figure><svg xmlns=\"http://www.w3.org/2000/svg\"></svg></figure>"),
            std::string::npos);
  EXPECT_NE(html.find("<pre>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;</pre>"),
            std::string::npos);
  EXPECT_NE(html.find("<th>TTFT p99</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>kvroute</td><td class=\"n\">&lt;1 s</td>"), std::string::npos);
  // The anchor keeps only safe characters; the contents link it.
  EXPECT_NE(html.find("<section id=\"doctor-round-robin\">"), std::string::npos);
  EXPECT_NE(html.find("<a href=\"#doctor-round-robin\">Diagnosis</a>"), std::string::npos);
  EXPECT_LT(html.find("id=\"scaling\""), html.find("id=\"doctor-round-robin\""));
  // Nothing to fetch: no script, stylesheet link, image or source by URL.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_NE(html.find("<style>"), std::string::npos);
  EXPECT_EQ(html.substr(html.size() - 8), "</html>\n");
}

TEST(HtmlTest, EscapesEveryMarkupCharacter) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(HtmlEscape("plain"), "plain");
}

}  // namespace
}  // namespace kvroute::report
