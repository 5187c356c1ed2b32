#include "simkit/report/charts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "simkit/report/html.h"

namespace kvroute::report {
namespace {

struct Rgb {
  double r, g, b;
};
struct Stop {
  double at;
  Rgb c;
};
// Light at idle, yellow at half, orange where vLLM starts queueing, dark red at full: the
// eye finds the hot replica without reading a legend.
constexpr Stop kStops[] = {{0.0, {247, 251, 255}},
                           {0.5, {254, 217, 118}},
                           {0.8, {253, 141, 60}},
                           {1.0, {189, 0, 38}}};

// The same first colours as the TTFT CDF's palette (writers.cc), so a policy's line
// looks alike in both charts when listed in the same order.
constexpr const char* kLine[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"};

std::string Header(double w, double h, std::string_view title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"18\" font-size=\"14\">{2}</text>\n",
      w, h, HtmlEscape(title));
}

}  // namespace

std::string KvColor(double u) {
  if (!std::isfinite(u)) return "#cccccc";
  u = std::clamp(u, 0.0, 1.0);
  size_t i = 1;
  while (i + 1 < std::size(kStops) && u > kStops[i].at) ++i;
  const Stop& a = kStops[i - 1];
  const Stop& b = kStops[i];
  const double f = (u - a.at) / (b.at - a.at);
  auto ch = [f](double x, double y) { return static_cast<int>(std::lround(x + (y - x) * f)); };
  return fmt::format("#{:02x}{:02x}{:02x}", ch(a.c.r, b.c.r), ch(a.c.g, b.c.g), ch(a.c.b, b.c.b));
}

std::string KvHeatmapSvg(std::span<const PolicyReport> policies, int max_columns) {
  const double w = 760, left = 80, right = 20, row_h = 14, title_h = 22, gap = 34;
  const double pw = w - left - right;
  double h = 30;
  for (const PolicyReport& p : policies) {
    h += title_h + std::max<double>(1, static_cast<double>(p.kv_series.size())) * row_h + gap;
  }
  const double legend_y = h;
  h += 40;
  std::string s = Header(w, h, "KV-cache usage per replica over time (colour: highest in each slice)");
  double y = 30;
  for (const PolicyReport& p : policies) {
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", left,
                     y + 14, HtmlEscape(p.policy));
    y += title_h;
    const size_t n = p.kv_times.size();
    if (n == 0 || p.kv_series.empty()) {
      s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" fill=\"#666\">no samples</text>\n", left,
                       y + 11);
      y += row_h + gap;
      continue;
    }
    const int cols = static_cast<int>(std::min<size_t>(std::max(1, max_columns), n));
    const double t0 = p.kv_times.front(), span = p.kv_times.back() - t0;
    const double cw = pw / cols;
    for (size_t r = 0; r < p.kv_series.size(); ++r) {
      // The highest sample of each slice; NaN where a slice got none.
      std::vector<double> cell(cols, std::nan(""));
      const std::vector<double>& series = p.kv_series[r];
      for (size_t k = 0; k < n && k < series.size(); ++k) {
        int c = span > 0 ? static_cast<int>((p.kv_times[k] - t0) / span * cols) : 0;
        c = std::clamp(c, 0, cols - 1);
        if (!std::isfinite(series[k])) continue;
        cell[c] = std::isnan(cell[c]) ? series[k] : std::max(cell[c], series[k]);
      }
      const double ry = y + static_cast<double>(r) * row_h;
      s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"10\">"
                       "replica {}</text>\n",
                       left - 6, ry + row_h - 3, r);
      for (int c = 0; c < cols; ++c) {
        // Cells overlap by a hair so no white seams show between them.
        s += fmt::format(
            "<rect class=\"kv\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" "
            "fill=\"{}\"/>\n",
            left + c * cw, ry, cw + 0.3, row_h - 1, KvColor(cell[c]));
      }
    }
    const double bottom = y + static_cast<double>(p.kv_series.size()) * row_h;
    s += fmt::format(
        "<text x=\"{}\" y=\"{:.1f}\" font-size=\"10\">0 s</text>"
        "<text x=\"{}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:.0f} s</text>\n",
        left, bottom + 12, left + pw, bottom + 12, span);
    y = bottom + gap;
  }
  // Legend: 11 swatches from 0% to 100%.
  const double sw = 30;
  s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">KV usage</text>\n", left - 6,
                   legend_y + 12);
  for (int k = 0; k <= 10; ++k) {
    const double x = left + k * sw;
    s += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"14\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{}%</text>\n",
        x, legend_y, sw, KvColor(k / 10.0), x + sw / 2, legend_y + 26, k * 10);
  }
  s += "</svg>\n";
  return s;
}

std::string ScalingSvg(std::span<const ScalingPoint> points) {
  const double w = 720, h = 420, left = 80, right = 190, top = 36, bottom = 50;
  const double pw = w - left - right, ph = h - top - bottom;
  const std::vector<ScalingGain> gains = ScalingGains(points);
  int max_replicas = 1;
  double max_y = 0;
  for (const ScalingPoint& p : points) {
    max_replicas = std::max(max_replicas, p.replicas);
    max_y = std::max(max_y, p.output_tokens_per_s);
  }
  for (const ScalingGain& g : gains) {
    if (g.to_replicas > g.from_replicas && g.from_replicas > 0) {
      max_y = std::max(max_y, g.from_tokens_per_s * max_replicas / g.from_replicas);
    }
  }
  if (max_y <= 0) max_y = 1;
  // A round axis top (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) at or above
  // 105% of the data, so five gridlines land on round numbers.
  const double target = max_y * 1.05;
  const double mag = std::pow(10.0, std::floor(std::log10(target)));
  double top_y = mag;
  for (double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    top_y = m * mag;
    if (top_y >= target) break;
  }
  auto X = [&](double r) { return left + r / max_replicas * pw; };
  auto Y = [&](double v) { return top + (1.0 - v / top_y) * ph; };
  std::string s = Header(w, h, "Output tokens/s against fleet size (at capacity)");
  for (int k = 0; k <= 5; ++k) {
    const double v = top_y * k / 5;
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.0f}</text>\n",
        left, Y(v), left + pw, left - 6, Y(v) + 4, v);
  }
  std::vector<int> sizes;
  for (const ScalingPoint& p : points) {
    if (std::find(sizes.begin(), sizes.end(), p.replicas) == sizes.end()) sizes.push_back(p.replicas);
  }
  for (int r : sizes) {
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        X(r), top, top + ph, top + ph + 16, r);
  }
  s += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#999\"/>"
      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#999\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">replicas</text>\n"
      "<text x=\"16\" y=\"{6}\" transform=\"rotate(-90 16 {6})\" text-anchor=\"middle\">"
      "output tokens/s</text>\n",
      left, top, top + ph, left + pw, left + pw / 2, h - 12, top + ph / 2);
  for (size_t i = 0; i < gains.size(); ++i) {
    const ScalingGain& g = gains[i];
    const char* color = kLine[i % std::size(kLine)];
    std::vector<const ScalingPoint*> mine;
    for (const ScalingPoint& p : points) {
      if (p.policy == g.policy) mine.push_back(&p);
    }
    std::sort(mine.begin(), mine.end(),
              [](const ScalingPoint* a, const ScalingPoint* b) { return a->replicas < b->replicas; });
    if (g.to_replicas > g.from_replicas && g.from_replicas > 0) {
      s += fmt::format(
          "<line class=\"ideal\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
          "stroke=\"{}\" stroke-width=\"1\" stroke-dasharray=\"4 4\" stroke-opacity=\"0.6\"/>\n",
          X(g.from_replicas), Y(g.from_tokens_per_s), X(max_replicas),
          Y(g.from_tokens_per_s * max_replicas / g.from_replicas), color);
    }
    std::string pts;
    for (const ScalingPoint* p : mine) {
      pts += fmt::format("{:.1f},{:.1f} ", X(p->replicas), Y(p->output_tokens_per_s));
    }
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\" points=\"{}\"/>\n",
                     color, pts);
    for (const ScalingPoint* p : mine) {
      s += fmt::format(
          "<circle class=\"pt\" cx=\"{0:.1f}\" cy=\"{1:.1f}\" r=\"4\" fill=\"{2}\"/>"
          "<text x=\"{3:.1f}\" y=\"{4:.1f}\" font-size=\"11\" fill=\"{2}\">{5:.0f}</text>\n",
          X(p->replicas), Y(p->output_tokens_per_s), color, X(p->replicas) + 6,
          Y(p->output_tokens_per_s) - 6, p->output_tokens_per_s);
    }
    const double ly = top + 10 + 20 * static_cast<double>(i);
    const std::string gain = g.ratio > 0 ? fmt::format(" x{:.1f}", g.ratio) : "";
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/><text x=\"{4}\" y=\"{5:.1f}\">{6}{7}</text>\n",
        left + pw + 14, ly, left + pw + 34, color, left + pw + 40, ly + 4, HtmlEscape(g.policy),
        gain);
  }
  s += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#666\">dashed: linear scaling</text>\n"
      "<text x=\"{}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#666\">from the smallest fleet</text>\n",
      left + pw + 14, top + 20 * static_cast<double>(gains.size()) + 14, left + pw + 14,
      top + 20 * static_cast<double>(gains.size()) + 27);
  s += "</svg>\n";
  return s;
}

}  // namespace kvroute::report
