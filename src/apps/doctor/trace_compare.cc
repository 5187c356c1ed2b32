#include "apps/doctor/trace_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/api/json_scan.h"

namespace kvroute::doctor {

namespace {

// The value at percentile p (0..100) of sorted `v`, nearest rank.
double Percentile(const std::vector<double>& v, double p) {
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string Pct(std::optional<double> v) { return v ? fmt::format("{:.1f}%", *v * 100) : "-"; }
std::string Ms(std::optional<double> s) {
  if (!s) return "-";
  return *s >= 1.0 ? fmt::format("{:.2f} s", *s) : fmt::format("{:.0f} ms", *s * 1000);
}

}  // namespace

TraceObserved ObserveTrace(std::string_view jsonl) {
  TraceObserved o;
  int64_t ok = 0, with_status = 0, cached = 0, cached_input = 0;
  bool any_cached = false;
  double first = 0, last = 0;
  std::vector<double> ttft;
  size_t at = 0;
  while (at < jsonl.size()) {
    size_t end = jsonl.find('\n', at);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view line = jsonl.substr(at, end - at);
    at = end + 1;
    const int64_t ts = api::IntAfterKey(line, "\"timestamp\"");
    if (ts < 0) continue;  // blank or not a request line
    const double t = static_cast<double>(ts) / 1000.0;
    first = o.requests == 0 ? t : std::min(first, t);
    last = o.requests == 0 ? t : std::max(last, t);
    ++o.requests;
    if (const int64_t status = api::IntAfterKey(line, "\"status\""); status >= 0) {
      ++with_status;
      ok += status == 200 ? 1 : 0;
    }
    if (const int64_t c = api::IntAfterKey(line, "\"cached_tokens\""); c >= 0) {
      any_cached = true;
      cached += c;
      cached_input += std::max<int64_t>(0, api::IntAfterKey(line, "\"input_length\""));
    }
    if (const int64_t ms = api::IntAfterKey(line, "\"ttft_ms\""); ms >= 0) {
      ttft.push_back(static_cast<double>(ms) / 1000.0);
    }
  }
  o.span_s = last - first;
  if (with_status > 0) o.ok = ok;
  if (any_cached && cached_input > 0) {
    o.hit_rate = static_cast<double>(cached) / static_cast<double>(cached_input);
  }
  if (!ttft.empty()) {
    std::sort(ttft.begin(), ttft.end());
    o.ttft_p50_s = Percentile(ttft, 50);
    o.ttft_p99_s = Percentile(ttft, 99);
  }
  return o;
}

std::optional<FleetShape> ShapeFromScrapes(const std::vector<ReplicaHistory>& histories,
                                           std::string* why) {
  FleetShape s;
  int unsized = 0;
  for (const ReplicaHistory& h : histories) {
    const Scrape* newest = nullptr;
    for (const Scrape& sc : h.scrapes) {
      if (sc.reachable && sc.any_engine_series) newest = &sc;
    }
    if (!newest) continue;
    if (!newest->num_gpu_blocks || *newest->num_gpu_blocks <= 1) {
      ++unsized;
      continue;
    }
    ++s.replicas;
    // Capacity in 16-token blocks (the simulated engine's), whatever block size it reports.
    const int64_t bs = newest->block_size.value_or(16);
    const int64_t blocks16 = *newest->num_gpu_blocks * bs / 16;
    s.kv_blocks = s.kv_blocks == 0 ? blocks16 : std::min(s.kv_blocks, blocks16);
    if (newest->block_size) s.block_size = bs;
  }
  if (s.replicas == 0) {
    *why = unsized > 0 ? "no replica reports its KV capacity (vllm:cache_config_info num_gpu_blocks); give --fleet"
                       : "no replica answered with vLLM metrics; give --fleet";
    return std::nullopt;
  }
  s.note = fmt::format("{} replicas of {} KV blocks, from their /metrics{}{}", s.replicas, s.kv_blocks,
                       unsized > 0 ? fmt::format(" ({} more without a KV capacity left out)", unsized) : "",
                       s.block_size > 0 && s.block_size != 16
                           ? fmt::format(" (their {}-token blocks counted as 16-token ones)", s.block_size)
                           : "");
  return s;
}

std::string TraceScenarioYaml(const std::string& trace_path, std::string_view format,
                              int64_t block_size, double time_scale, const FleetShape* shape,
                              std::string_view fleet_yaml) {
  std::string y;
  if (shape) {
    // kv_blocks in the engine preset's 16-token blocks (ShapeFromScrapes converts).
    y += fmt::format("fleet: {{replicas: {}, kv_blocks: {}}}\n", shape->replicas, shape->kv_blocks);
  } else {
    // The --fleet file first, so that its errors name its own lines.
    y += std::string(fleet_yaml);
    if (!y.empty() && y.back() != '\n') y += '\n';
  }
  // The path in double quotes, escaped as YAML reads them.
  std::string quoted = "\"";
  for (char c : trace_path) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  quoted += '"';
  y += fmt::format("workload: {{type: trace, format: {}, path: {}, block_size: {}, time_scale: {}}}\n",
                   format, quoted, block_size, time_scale);
  return y;
}

namespace {

// Within half a percent of the best goodput counts as as much goodput.
bool SameGoodput(const report::PolicyReport& a, const report::PolicyReport& b) {
  return std::abs(a.goodput_requests_per_s - b.goodput_requests_per_s) <=
         0.005 * std::max(a.goodput_requests_per_s, b.goodput_requests_per_s);
}

}  // namespace

std::string BestPolicy(const std::vector<report::PolicyReport>& reports) {
  double top = 0;
  for (const report::PolicyReport& r : reports) top = std::max(top, r.goodput_requests_per_s);
  const report::PolicyReport* best = nullptr;
  for (const report::PolicyReport& r : reports) {
    if (r.goodput_requests_per_s < top * 0.995) continue;
    if (!best || r.ttft_s.p99 < best->ttft_s.p99) best = &r;
  }
  return best ? best->policy : std::string();
}

std::string RenderTraceComparison(const TraceObserved& observed,
                                  const std::vector<report::PolicyReport>& reports,
                                  std::string_view header) {
  std::string out = fmt::format("{}\n\n", header);
  out += "| routing | requests | ok | goodput/s | hit rate | TTFT p50 | TTFT p99 |\n"
         "|---|--:|--:|--:|--:|--:|--:|\n";
  const std::optional<double> observed_rate =
      observed.ok && observed.span_s > 0 ? std::optional<double>(static_cast<double>(*observed.ok) / observed.span_s)
                                         : std::nullopt;
  out += fmt::format("| the fleet (captured) | {} | {} | {} | {} | {} | {} |\n", observed.requests,
                     observed.ok ? std::to_string(*observed.ok) : "-",
                     observed_rate ? fmt::format("{:.2f}", *observed_rate) : "-", Pct(observed.hit_rate),
                     Ms(observed.ttft_p50_s), Ms(observed.ttft_p99_s));
  for (const report::PolicyReport& r : reports) {
    out += fmt::format("| {} | {} | {} | {:.2f} | {} | {} | {} |\n", r.policy, r.requests, r.succeeded,
                       r.goodput_requests_per_s, Pct(r.prefix_hit_rate), Ms(r.ttft_s.p50), Ms(r.ttft_s.p99));
  }
  const std::string best = BestPolicy(reports);
  if (!best.empty()) {
    const report::PolicyReport* b = nullptr;
    for (const report::PolicyReport& r : reports) {
      if (r.policy == best) b = &r;
    }
    std::string ties;
    for (const report::PolicyReport& r : reports) {
      if (&r != b && SameGoodput(r, *b) && std::abs(r.ttft_s.p99 - b->ttft_s.p99) <= 0.01 * b->ttft_s.p99) {
        ties += (ties.empty() ? "" : ", ") + r.policy;
      }
    }
    out += fmt::format("\nWould pick: {} (the most goodput on this traffic and fleet, then the lowest "
                       "TTFT p99{}", best, ties.empty() ? "" : "; tied with " + ties);
    out += observed.ok ? "; the fleet's row is what it got, measured at the router)\n" : ")\n";
  }
  if (!observed.ok) {
    out += "The trace carries no outcome fields (status, ttft_ms, cached_tokens): a public "
           "trace, or a capture by another tool; only the simulated rows are figures.\n";
  }
  return out;
}

}  // namespace kvroute::doctor
