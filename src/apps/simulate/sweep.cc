#include "apps/simulate/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace kvroute::simulate {
namespace {

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Seconds as "850 ms" / "2.31 s", like the report tables.
std::string Dur(double s) { return s < 1.0 ? Fmt("%.0f ms", s * 1000) : Fmt("%.2f s", s); }

// JSON number; non-finite as null.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return Fmt("%.6g", v);
}

const PolicySweep* Find(std::span<const PolicySweep> sweeps, const std::string& policy) {
  for (const PolicySweep& s : sweeps) {
    if (s.policy == policy) return &s;
  }
  return nullptr;
}

}  // namespace

config::Scenario WithRate(const config::Scenario& scenario, double rate) {
  config::Scenario s = scenario;
  if (s.arrivals.num_requests <= 0) {
    double expected = 0.0;
    for (const workload::RateStage& st : scenario.arrivals.stages) {
      if (std::isfinite(st.duration_s)) expected += st.rate * st.duration_s;
    }
    if (scenario.arrivals.duration_s > 0 && expected == 0.0 && !scenario.arrivals.stages.empty()) {
      expected = scenario.arrivals.stages[0].rate * scenario.arrivals.duration_s;
    }
    s.arrivals.num_requests = static_cast<int64_t>(std::llround(expected));
  }
  s.arrivals.duration_s = 0.0;
  s.arrivals.stages = {workload::RateStage{rate}};
  return s;
}

SteadyThroughput MeasureSteadyThroughput(std::span<const report::RequestRecord> records,
                                         double warmup_fraction) {
  SteadyThroughput t;
  if (records.size() < 2) return t;
  double first = records[0].send_s, last = records[0].send_s;
  for (const report::RequestRecord& r : records) {
    first = std::min(first, r.send_s);
    last = std::max(last, r.send_s);
  }
  const double begin = first + warmup_fraction * (last - first);
  if (!(last > begin)) return t;
  t.window_s = last - begin;
  double tokens = 0.0, requests = 0.0;
  for (const report::RequestRecord& r : records) {
    if (!r.ok() || r.e2e_s < 0) continue;
    const double end = r.send_s + r.e2e_s;
    if (end < begin || end > last) continue;
    tokens += static_cast<double>(r.output_tokens);
    requests += 1.0;
  }
  t.output_tokens_per_s = tokens / t.window_s;
  t.requests_per_s = requests / t.window_s;
  return t;
}

bool MeetsTtftBound(const report::PolicyReport& r, double ttft_p99_bound_s) {
  return r.requests > 0 && r.succeeded == r.requests && r.ttft_s.p99 <= ttft_p99_bound_s;
}

SweepSummary SummarizeSweep(const PolicySweep& sweep, double ttft_p99_bound_s) {
  SweepSummary s;
  s.policy = sweep.policy;
  for (const SweepPoint& p : sweep.points) {
    if (!MeetsTtftBound(p.report, ttft_p99_bound_s)) break;
    s.max_rate = p.rate;
    s.output_tokens_per_s = p.report.output_tokens_per_s;
    s.requests_per_s = p.report.requests_per_s;
    s.goodput_requests_per_s = p.report.goodput_requests_per_s;
    s.ttft_p99_s = p.report.ttft_s.p99;
    s.steady = p.steady;
  }
  return s;
}

double FirstFailingRate(const PolicySweep& sweep, double ttft_p99_bound_s) {
  for (const SweepPoint& p : sweep.points) {
    if (!MeetsTtftBound(p.report, ttft_p99_bound_s)) return p.rate;
  }
  return -1.0;
}

const SweepPoint* PointAt(const PolicySweep& sweep, double rate) {
  for (const SweepPoint& p : sweep.points) {
    if (p.rate == rate) return &p;
  }
  return nullptr;
}

SweepPeak PeakOfSweep(const PolicySweep& sweep) {
  SweepPeak peak;
  for (const SweepPoint& p : sweep.points) {
    if (peak.rate < 0 || p.report.output_tokens_per_s > peak.output_tokens_per_s) {
      peak.output_tokens_per_s = p.report.output_tokens_per_s;
      peak.rate = p.rate;
    }
    if (peak.steady_rate < 0 || p.steady.output_tokens_per_s > peak.steady_output_tokens_per_s) {
      peak.steady_output_tokens_per_s = p.steady.output_tokens_per_s;
      peak.steady_rate = p.rate;
    }
    if (p.rate >= peak.top_rate) {
      peak.top_rate = p.rate;
      peak.ttft_p90_at_top_s = p.report.ttft_s.p90;
    }
  }
  return peak;
}

std::string SweepMarkdown(const std::string& scenario, std::span<const PolicySweep> sweeps,
                          double ttft_p99_bound_s, const std::string& baseline) {
  std::string md = "### " + scenario + ": rate sweep\n\n";
  md += "| policy | rate | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | E2E p99 | "
        "goodput/s | hit rate | preempt | p99 <= " + Dur(ttft_p99_bound_s) + " |\n";
  md += "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n";
  for (const PolicySweep& s : sweeps) {
    for (const SweepPoint& p : s.points) {
      const report::PolicyReport& r = p.report;
      md += "| " + s.policy + " | " + Fmt("%g", p.rate) + " | " + Fmt("%.2f", r.requests_per_s) +
            " | " + Fmt("%.0f", r.output_tokens_per_s) + " | " + Dur(r.ttft_s.p50) + " | " +
            Dur(r.ttft_s.p99) + " | " + Dur(r.tpot_s.p50) + " | " + Dur(r.e2e_s.p99) + " | " +
            Fmt("%.2f", r.goodput_requests_per_s) + " | " +
            Fmt("%.1f%%", r.prefix_hit_rate * 100) + " | " +
            std::to_string(r.preemptions) + " | " +
            (MeetsTtftBound(r, ttft_p99_bound_s) ? "yes" : "no") + " |\n";
    }
  }
  const PolicySweep* base = Find(sweeps, baseline);
  const SweepSummary base_sum =
      base ? SummarizeSweep(*base, ttft_p99_bound_s) : SweepSummary{};
  const double sat = base ? FirstFailingRate(*base, ttft_p99_bound_s) : -1.0;
  const SweepPoint* base_at_sat = (base && sat > 0) ? PointAt(*base, sat) : nullptr;

  md += "\nThroughput at equal p99 TTFT (highest swept rate with TTFT p99 <= " +
        Dur(ttft_p99_bound_s) + " at it and every lower rate)";
  if (base_at_sat) {
    md += "; TTFT p99 at " + Fmt("%g", sat) + " req/s, the first rate where " + baseline +
          " misses the bound";
  }
  md += "; steady = completions inside [first send + " + Fmt("%g", kSteadyWarmupFraction * 100) +
        "% of the arrival span, last send] / that window:\n\n| policy | max rate | out tok/s "
        "there | req/s there | vs " + baseline + " (tok/s) | steady out tok/s | steady req/s | "
        "vs " + baseline + " (steady) | TTFT p99 at " +
        (base_at_sat ? Fmt("%g", sat) : std::string("-")) + " req/s | vs " + baseline +
        " |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
  for (const PolicySweep& s : sweeps) {
    const SweepSummary sum = SummarizeSweep(s, ttft_p99_bound_s);
    md += "| " + s.policy + " | ";
    if (sum.max_rate < 0) {
      md += "none | - | - | - | - | - | - | ";
    } else {
      md += Fmt("%g", sum.max_rate) + " | " + Fmt("%.0f", sum.output_tokens_per_s) + " | " +
            Fmt("%.2f", sum.requests_per_s) + " | ";
      md += (base_sum.max_rate > 0 && base_sum.output_tokens_per_s > 0)
                ? Fmt("%.2fx", sum.output_tokens_per_s / base_sum.output_tokens_per_s)
                : std::string("-");
      md += " | " + Fmt("%.0f", sum.steady.output_tokens_per_s) + " | " +
            Fmt("%.2f", sum.steady.requests_per_s) + " | ";
      md += (base_sum.max_rate > 0 && base_sum.steady.output_tokens_per_s > 0)
                ? Fmt("%.2fx", sum.steady.output_tokens_per_s / base_sum.steady.output_tokens_per_s)
                : std::string("-");
      md += " | ";
    }
    const SweepPoint* at = base_at_sat ? PointAt(s, sat) : nullptr;
    if (at) {
      md += Dur(at->report.ttft_s.p99) + " | " +
            Fmt("%.3f", at->report.ttft_s.p99 / base_at_sat->report.ttft_s.p99) + " |\n";
    } else {
      md += "- | - |\n";
    }
  }
  // Peaks, as the llm-d guides compare policies (no TTFT bound).
  const SweepPeak base_peak = base ? PeakOfSweep(*base) : SweepPeak{};
  const double top = base_peak.top_rate;
  md += "\nPeak output throughput over the swept rates (any TTFT), and TTFT p90 at the highest "
        "rate:\n\n| policy | peak out tok/s | at rate | vs " + baseline +
        " | peak steady out tok/s | at rate | vs " + baseline + " (steady) | TTFT p90 at " +
        (top >= 0 ? Fmt("%g", top) : std::string("-")) + " req/s |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|\n";
  auto ratio = [](double a, double b) { return b > 0 ? Fmt("%.2fx", a / b) : std::string("-"); };
  for (const PolicySweep& s : sweeps) {
    const SweepPeak pk = PeakOfSweep(s);
    if (pk.rate < 0) continue;
    md += "| " + s.policy + " | " + Fmt("%.0f", pk.output_tokens_per_s) + " | " +
          Fmt("%g", pk.rate) + " | " + ratio(pk.output_tokens_per_s, base_peak.output_tokens_per_s) +
          " | " + Fmt("%.0f", pk.steady_output_tokens_per_s) + " | " + Fmt("%g", pk.steady_rate) +
          " | " + ratio(pk.steady_output_tokens_per_s, base_peak.steady_output_tokens_per_s) +
          " | " + Dur(pk.ttft_p90_at_top_s) + " |\n";
  }
  return md;
}

std::string SweepJson(const std::string& scenario, std::span<const PolicySweep> sweeps,
                      double ttft_p99_bound_s, const std::string& baseline) {
  const PolicySweep* base = Find(sweeps, baseline);
  const SweepSummary base_sum =
      base ? SummarizeSweep(*base, ttft_p99_bound_s) : SweepSummary{};
  const double sat = base ? FirstFailingRate(*base, ttft_p99_bound_s) : -1.0;
  const SweepPoint* base_at_sat = (base && sat > 0) ? PointAt(*base, sat) : nullptr;
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::string j = "{\n  \"scenario\": " + quote(scenario) +
                  ",\n  \"ttft_p99_bound_s\": " + Num(ttft_p99_bound_s) +
                  ",\n  \"baseline\": " + quote(baseline) +
                  ",\n  \"baseline_saturation_rate\": " + (sat > 0 ? Num(sat) : "null") +
                  ",\n  \"policies\": [";
  for (size_t i = 0; i < sweeps.size(); ++i) {
    const PolicySweep& s = sweeps[i];
    const SweepSummary sum = SummarizeSweep(s, ttft_p99_bound_s);
    const bool has = sum.max_rate >= 0;
    const SweepPoint* at = base_at_sat ? PointAt(s, sat) : nullptr;
    j += std::string(i ? "," : "") + "\n    {\"policy\": " + quote(s.policy) +
         ", \"max_rate\": " + (has ? Num(sum.max_rate) : "null") +
         ", \"output_tokens_per_s\": " + (has ? Num(sum.output_tokens_per_s) : "null") +
         ", \"requests_per_s\": " + (has ? Num(sum.requests_per_s) : "null") +
         ", \"goodput_requests_per_s\": " + (has ? Num(sum.goodput_requests_per_s) : "null") +
         ", \"ttft_p99_s\": " + (has ? Num(sum.ttft_p99_s) : "null") +
         ", \"vs_baseline\": " +
         (has && base_sum.max_rate > 0 && base_sum.output_tokens_per_s > 0
              ? Num(sum.output_tokens_per_s / base_sum.output_tokens_per_s)
              : "null") +
         ", \"steady_output_tokens_per_s\": " +
         (has ? Num(sum.steady.output_tokens_per_s) : "null") +
         ", \"steady_requests_per_s\": " + (has ? Num(sum.steady.requests_per_s) : "null") +
         ", \"steady_vs_baseline\": " +
         (has && base_sum.max_rate > 0 && base_sum.steady.output_tokens_per_s > 0
              ? Num(sum.steady.output_tokens_per_s / base_sum.steady.output_tokens_per_s)
              : "null") +
         ", \"ttft_p99_at_baseline_saturation_s\": " + (at ? Num(at->report.ttft_s.p99) : "null");
    const SweepPeak pk = PeakOfSweep(s);
    const SweepPeak bp = base ? PeakOfSweep(*base) : SweepPeak{};
    if (pk.rate >= 0) {
      j += ", \"peak\": {\"output_tokens_per_s\": " + Num(pk.output_tokens_per_s) +
           ", \"rate\": " + Num(pk.rate) +
           ", \"steady_output_tokens_per_s\": " + Num(pk.steady_output_tokens_per_s) +
           ", \"steady_rate\": " + Num(pk.steady_rate) + ", \"vs_baseline\": " +
           (bp.output_tokens_per_s > 0 ? Num(pk.output_tokens_per_s / bp.output_tokens_per_s)
                                       : "null") +
           ", \"steady_vs_baseline\": " +
           (bp.steady_output_tokens_per_s > 0
                ? Num(pk.steady_output_tokens_per_s / bp.steady_output_tokens_per_s)
                : "null") +
           ", \"ttft_p90_at_top_s\": " + Num(pk.ttft_p90_at_top_s) + "}";
    }
    j += ", \"points\": [";
    for (size_t k = 0; k < s.points.size(); ++k) {
      const report::PolicyReport& r = s.points[k].report;
      j += std::string(k ? "," : "") + "\n      {\"rate\": " + Num(s.points[k].rate) +
           ", \"requests\": " + std::to_string(r.requests) +
           ", \"succeeded\": " + std::to_string(r.succeeded) +
           ", \"requests_per_s\": " + Num(r.requests_per_s) +
           ", \"output_tokens_per_s\": " + Num(r.output_tokens_per_s) +
           ", \"steady_output_tokens_per_s\": " + Num(s.points[k].steady.output_tokens_per_s) +
           ", \"ttft_p50_s\": " + Num(r.ttft_s.p50) + ", \"ttft_p99_s\": " + Num(r.ttft_s.p99) +
           ", \"tpot_p50_s\": " + Num(r.tpot_s.p50) + ", \"e2e_p99_s\": " + Num(r.e2e_s.p99) +
           ", \"goodput_requests_per_s\": " + Num(r.goodput_requests_per_s) +
           ", \"prefix_hit_rate\": " + Num(r.prefix_hit_rate) +
           ", \"preemptions\": " + std::to_string(r.preemptions) +
           ", \"meets_bound\": " + (MeetsTtftBound(r, ttft_p99_bound_s) ? "true" : "false") +
           "}";
    }
    j += "\n    ]}";
  }
  j += "\n  ]\n}\n";
  return j;
}

}  // namespace kvroute::simulate
