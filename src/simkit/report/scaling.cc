#include "simkit/report/scaling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/api/openai.h"

namespace kvroute::report {
namespace {

std::string Secs(double s) {
  return s < 1.0 ? fmt::format("{:.0f} ms", s * 1e3) : fmt::format("{:.2f} s", s);
}

std::string GainLine(const ScalingGain& g) {
  return fmt::format("{}: {} -> {} replicas, {:.0f} -> {:.0f} out tok/s ({})", g.policy,
                     g.from_replicas, g.to_replicas, g.from_tokens_per_s, g.to_tokens_per_s,
                     g.ratio > 0 ? fmt::format("x{:.2f}", g.ratio) : std::string("-"));
}

std::string JsonNum(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string JsonStr(std::string_view s) {
  std::string out;
  api::AppendJsonString(out, s);
  return out;
}

}  // namespace

std::vector<ScalingGain> ScalingGains(std::span<const ScalingPoint> points) {
  std::vector<ScalingGain> gains;
  for (const ScalingPoint& p : points) {
    auto it = std::find_if(gains.begin(), gains.end(),
                           [&](const ScalingGain& g) { return g.policy == p.policy; });
    if (it == gains.end()) {
      gains.push_back({p.policy, p.replicas, p.replicas, p.output_tokens_per_s,
                       p.output_tokens_per_s, 0.0});
      continue;
    }
    if (p.replicas < it->from_replicas) {
      it->from_replicas = p.replicas;
      it->from_tokens_per_s = p.output_tokens_per_s;
    }
    if (p.replicas > it->to_replicas) {
      it->to_replicas = p.replicas;
      it->to_tokens_per_s = p.output_tokens_per_s;
    }
  }
  for (ScalingGain& g : gains) {
    g.ratio = g.to_replicas > g.from_replicas && g.from_tokens_per_s > 0
                  ? g.to_tokens_per_s / g.from_tokens_per_s
                  : 0.0;
  }
  return gains;
}

std::string ScalingText(std::span<const ScalingPoint> points) {
  std::string out = fmt::format("{:<15} {:>8} {:>8} {:>10} {:>9} {:>9} {:>7}\n", "policy",
                                "replicas", "req/s in", "out tok/s", "TTFT p50", "TTFT p99",
                                "hit");
  for (const ScalingPoint& p : points) {
    out += fmt::format("{:<15} {:>8} {:>8.1f} {:>10.0f} {:>9} {:>9} {:>7}\n", p.policy,
                       p.replicas, p.offered_rate, p.output_tokens_per_s, Secs(p.ttft_p50_s),
                       Secs(p.ttft_p99_s), fmt::format("{:.1f}%", 100 * p.prefix_hit_rate));
  }
  for (const ScalingGain& g : ScalingGains(points)) out += GainLine(g) + "\n";
  return out;
}

std::string ScalingMarkdown(std::span<const ScalingPoint> points) {
  std::string out =
      "| policy | replicas | offered req/s | out tok/s | TTFT p50 | TTFT p99 | hit rate | "
      "goodput/s |\n|---|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const ScalingPoint& p : points) {
    out += fmt::format("| {} | {} | {:.1f} | {:.0f} | {} | {} | {:.1f}% | {:.2f} |\n", p.policy,
                       p.replicas, p.offered_rate, p.output_tokens_per_s, Secs(p.ttft_p50_s),
                       Secs(p.ttft_p99_s), 100 * p.prefix_hit_rate, p.goodput_requests_per_s);
  }
  out += "\n";
  for (const ScalingGain& g : ScalingGains(points)) out += "- " + GainLine(g) + "\n";
  return out;
}

std::string ScalingJson(std::span<const ScalingPoint> points) {
  std::string out = "{\"points\": [";
  for (size_t i = 0; i < points.size(); ++i) {
    const ScalingPoint& p = points[i];
    out += fmt::format(
        "{}{{\"policy\": {}, \"replicas\": {}, \"offered_rate\": {}, \"requests\": {}, "
        "\"output_tokens_per_s\": {}, \"ttft_p50_s\": {}, \"ttft_p99_s\": {}, "
        "\"prefix_hit_rate\": {}, \"goodput_requests_per_s\": {}}}",
        i ? ", " : "", JsonStr(p.policy), p.replicas, JsonNum(p.offered_rate), p.requests,
        JsonNum(p.output_tokens_per_s), JsonNum(p.ttft_p50_s), JsonNum(p.ttft_p99_s),
        JsonNum(p.prefix_hit_rate), JsonNum(p.goodput_requests_per_s));
  }
  out += "], \"gains\": [";
  const std::vector<ScalingGain> gains = ScalingGains(points);
  for (size_t i = 0; i < gains.size(); ++i) {
    const ScalingGain& g = gains[i];
    out += fmt::format(
        "{}{{\"policy\": {}, \"from_replicas\": {}, \"to_replicas\": {}, "
        "\"from_tokens_per_s\": {}, \"to_tokens_per_s\": {}, \"ratio\": {}}}",
        i ? ", " : "", JsonStr(g.policy), g.from_replicas, g.to_replicas,
        JsonNum(g.from_tokens_per_s), JsonNum(g.to_tokens_per_s), JsonNum(g.ratio));
  }
  out += "]}";
  return out;
}

}  // namespace kvroute::report
