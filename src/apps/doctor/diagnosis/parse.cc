// ParseScrape: one /metrics body to a Scrape. Reads the vLLM series a person reads when
// diagnosing a fleet by hand (docs/DOCTOR.md lists them), sums them over data-parallel
// engines and keeps every unusable value out of the figures, naming it in `garbage`.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "apps/doctor/diagnosis/doctor.h"
#include "core/metrics/prom_parser.h"

namespace kvroute::doctor {
namespace {

using metrics::Sample;

// Counts above this are taken as garbage, as the router's own extraction does
// (metrics::EngineMetrics::kMaxPlausibleCount): no replica serves 1e9 of anything in a
// scrape interval, and it keeps sums far from overflow.
constexpr double kMaxPlausible = 1e9;
// Engines and buckets kept per series: a body that declares more is garbage, and the
// bound keeps a hostile body from making the parse allocate without limit.
constexpr size_t kMaxEngines = 256;
constexpr size_t kMaxBuckets = 128;
constexpr size_t kMaxGarbageLines = 16;

enum class Field {
  kRunning,
  kWaiting,
  kKv,
  kKvOld,
  kQueries,
  kQueriesOld,
  kHits,
  kHitsOld,
  kHitGauge,
  kPreemptions,
  kPromptTokens,
  kGenTokens,
  kSuccess,
  kCount
};

struct FieldName {
  std::string_view name;
  Field field;
};
constexpr FieldName kFields[] = {
    {"vllm:num_requests_running", Field::kRunning},
    {"vllm:num_requests_waiting", Field::kWaiting},
    {"vllm:kv_cache_usage_perc", Field::kKv},
    {"vllm:gpu_cache_usage_perc", Field::kKvOld},
    {"vllm:prefix_cache_queries_total", Field::kQueries},
    {"vllm:gpu_prefix_cache_queries_total", Field::kQueriesOld},
    {"vllm:prefix_cache_hits_total", Field::kHits},
    {"vllm:gpu_prefix_cache_hits_total", Field::kHitsOld},
    {"vllm:gpu_prefix_cache_hit_rate", Field::kHitGauge},
    {"vllm:num_preemptions_total", Field::kPreemptions},
    {"vllm:prompt_tokens_total", Field::kPromptTokens},
    {"vllm:generation_tokens_total", Field::kGenTokens},
    {"vllm:request_success_total", Field::kSuccess},
};

enum class Hist { kTtft, kPrompt, kOutput, kCount };
constexpr std::string_view kHistNames[] = {
    "vllm:time_to_first_token_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
};

// A value summed over the samples of one series (engines, finish reasons).
struct Acc {
  bool seen = false;
  bool bad = false;
  double sum = 0;
  int n = 0;
};

// One engine's histogram as read: (le, cumulative) in text order, _sum, _count.
struct EngineHist {
  std::vector<std::pair<double, double>> buckets;
  std::optional<double> sum, count;
};

struct HistAcc {
  bool seen = false;
  bool bad = false;
  std::map<std::string, EngineHist> engines;
};

bool IsFraction(Field f) { return f == Field::kKv || f == Field::kKvOld || f == Field::kHitGauge; }

std::string ValueText(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

std::optional<double> ParseLe(std::string_view s) {
  if (s == "+Inf" || s == "Inf" || s == "inf" || s == "+inf") {
    return std::numeric_limits<double>::infinity();
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

class Visitor : public metrics::SampleVisitor {
 public:
  explicit Visitor(Scrape& out) : out_(out) {}

  bool Wants(std::string_view name) override {
    return name.substr(0, 5) == "vllm:" || name.substr(0, 16) == "kvroute_latency_" ||
           name.substr(0, 12) == "kvroute_slo_" || name == "kvroute_flow_dispatched_total";
  }

  void OnSample(const Sample& s) override {
    if (s.name.substr(0, 8) == "kvroute_") return AddRouter(s);
    out_.any_engine_series = true;
    if (out_.model.empty()) {
      if (auto m = s.labels.Get("model_name")) out_.model = std::move(*m);
    }
    for (const FieldName& f : kFields) {
      if (s.name == f.name) return AddValue(f.field, s);
    }
    if (s.name == "vllm:cache_config_info") return AddCacheInfo(s);
    for (int h = 0; h < static_cast<int>(Hist::kCount); ++h) {
      const std::string_view base = kHistNames[h];
      if (s.name.size() <= base.size() || s.name.substr(0, base.size()) != base) continue;
      const std::string_view suffix = s.name.substr(base.size());
      if (suffix == "_bucket" || suffix == "_sum" || suffix == "_count") {
        return AddHist(static_cast<Hist>(h), suffix, s);
      }
    }
  }

  void Finish() {
    auto pick = [&](Field now, Field old) -> std::optional<double> {
      const Acc& a = acc_[Idx(acc_[Idx(now)].seen ? now : old)];
      if (!a.seen || a.bad) return std::nullopt;
      return a.sum;
    };
    out_.running = pick(Field::kRunning, Field::kRunning);
    out_.waiting = pick(Field::kWaiting, Field::kWaiting);
    {
      const Acc& a = acc_[Idx(acc_[Idx(Field::kKv)].seen ? Field::kKv : Field::kKvOld)];
      if (a.seen && !a.bad && a.n > 0) out_.kv_usage = a.sum / a.n;  // mean over engines
    }
    out_.prefix_queries = pick(Field::kQueries, Field::kQueriesOld);
    out_.prefix_hits = pick(Field::kHits, Field::kHitsOld);
    {
      const Acc& a = acc_[Idx(Field::kHitGauge)];
      if (a.seen && !a.bad && a.n > 0) out_.hit_rate_gauge = a.sum / a.n;
    }
    out_.preemptions = pick(Field::kPreemptions, Field::kPreemptions);
    out_.prompt_tokens = pick(Field::kPromptTokens, Field::kPromptTokens);
    out_.generation_tokens = pick(Field::kGenTokens, Field::kGenTokens);
    out_.requests_finished = pick(Field::kSuccess, Field::kSuccess);
    out_.ttft = FinishHist(Hist::kTtft);
    out_.prompt_len = FinishHist(Hist::kPrompt);
    out_.output_len = FinishHist(Hist::kOutput);
    if (!bad_blocks_ && blocks_seen_) out_.num_gpu_blocks = blocks_;
    if (bad_block_size_) out_.block_size.reset();
    Scrape::RouterSeries& r = out_.router;
    for (size_t k = 0; k < 2; ++k) {
      r.scored[k] = router_[k][0].Value();
      r.abs_error_s[k] = router_[k][1].Value();
      r.abs_rel_error[k] = router_[k][2].Value();
      r.slo_requests[k] = router_[k][3].Value();
      r.slo_violations[k] = router_[k][4].Value();
    }
  }

 private:
  static size_t Idx(Field f) { return static_cast<size_t>(f); }

  // One router counter: a single sample per label value (kind/type), never summed.
  struct RouterAcc {
    bool seen = false, bad = false;
    double v = 0;
    std::optional<double> Value() const {
      return seen && !bad ? std::optional<double>(v) : std::nullopt;
    }
  };

  void AddRouter(const Sample& s) {
    if (s.name == "kvroute_flow_dispatched_total") {
      out_.router.flow_control = true;
      return;
    }
    static constexpr std::string_view kNames[] = {
        "kvroute_latency_predictions_scored_total",
        "kvroute_latency_prediction_abs_error_seconds_total",
        "kvroute_latency_prediction_abs_relative_error_total", "kvroute_slo_requests_total",
        "kvroute_slo_violations_total"};
    size_t series = 0;
    while (series < 5 && s.name != kNames[series]) ++series;
    if (series == 5) return;  // another kvroute_latency_/kvroute_slo_ series
    const std::optional<std::string> k = s.labels.Get(series < 3 ? "kind" : "type");
    if (!k || (*k != "ttft" && *k != "tpot")) return;
    out_.any_router_series = true;
    RouterAcc& a = router_[*k == "ttft" ? 0 : 1][series];
    const double v = s.value;
    // The relative-error and seconds sums may exceed a count's plausible bound; a
    // negative, NaN or infinite counter is garbage.
    if (!std::isfinite(v) || v < 0 || a.seen) {
      a.bad = true;
      Garbage(fmt::format("{}{{{}=\"{}\"}} = {} (line {})", s.name, series < 3 ? "kind" : "type",
                          *k, a.seen && std::isfinite(v) && v >= 0 ? "repeated" : ValueText(v),
                          s.line));
      a.seen = true;
      return;
    }
    a.seen = true;
    a.v = v;
  }

  void Garbage(std::string line) {
    if (out_.garbage.size() < kMaxGarbageLines) out_.garbage.push_back(std::move(line));
  }

  void AddValue(Field f, const Sample& s) {
    Acc& a = acc_[Idx(f)];
    a.seen = true;
    const double v = s.value;
    const bool ok = std::isfinite(v) && v >= 0 && (IsFraction(f) ? v <= 1.0 : v <= kMaxPlausible);
    if (!ok) {
      a.bad = true;
      Garbage(fmt::format("{} = {} (line {})", s.name, ValueText(v), s.line));
      return;
    }
    a.sum += v;
    ++a.n;
  }

  void AddCacheInfo(const Sample& s) {
    if (const auto raw = s.labels.Find("block_size")) {
      const std::optional<int64_t> bs = s.labels.GetInt("block_size");
      if (bs && *bs >= 1 && static_cast<double>(*bs) <= kMaxPlausible) {
        if (!out_.block_size) out_.block_size = *bs;
      } else if (bs || *raw != "None") {
        bad_block_size_ = true;
        Garbage(fmt::format("vllm:cache_config_info block_size=\"{}\" (line {})", Printable(*raw),
                            s.line));
      }
    }
    if (const auto raw = s.labels.Find("num_gpu_blocks")) {
      const std::optional<int64_t> b = s.labels.GetInt("num_gpu_blocks");
      // "None" before the engine profiled memory is just unknown, not garbage.
      if (b && *b >= 0 && static_cast<double>(*b) <= kMaxPlausible) {
        blocks_ += *b;
        blocks_seen_ = true;
      } else if (b || *raw != "None") {
        bad_blocks_ = true;
        Garbage(fmt::format("vllm:cache_config_info num_gpu_blocks=\"{}\" (line {})",
                            Printable(*raw), s.line));
      }
    }
    if (const auto p = s.labels.Get("enable_prefix_caching")) {
      if (*p == "True" || *p == "true") {
        if (!out_.prefix_caching) out_.prefix_caching = true;
      } else if (*p == "False" || *p == "false") {
        out_.prefix_caching = false;  // one engine without it is enough to say off
      }
    }
  }

  void AddHist(Hist h, std::string_view suffix, const Sample& s) {
    HistAcc& acc = hist_[static_cast<size_t>(h)];
    acc.seen = true;
    if (acc.bad) return;
    const std::string engine(s.labels.Find("engine").value_or(""));
    auto it = acc.engines.find(engine);
    if (it == acc.engines.end()) {
      if (acc.engines.size() >= kMaxEngines) return Bad(acc, s, "too many engines");
      it = acc.engines.emplace(engine, EngineHist{}).first;
    }
    EngineHist& e = it->second;
    const double v = s.value;
    if (!std::isfinite(v) || v < 0 || (suffix != "_sum" && v > kMaxPlausible)) {
      return Bad(acc, s, ValueText(v));
    }
    if (suffix == "_sum") {
      e.sum = v;
    } else if (suffix == "_count") {
      e.count = v;
    } else {
      const auto le_raw = s.labels.Find("le");
      const std::optional<double> le = le_raw ? ParseLe(*le_raw) : std::nullopt;
      if (!le) return Bad(acc, s, "bucket without a valid le");
      if (e.buckets.size() >= kMaxBuckets) return Bad(acc, s, "too many buckets");
      e.buckets.emplace_back(*le, v);
    }
  }

  void Bad(HistAcc& acc, const Sample& s, std::string_view why) {
    acc.bad = true;
    Garbage(fmt::format("{} = {} (line {})", s.name, why, s.line));
  }

  Histogram FinishHist(Hist h) {
    HistAcc& acc = hist_[static_cast<size_t>(h)];
    if (!acc.seen || acc.bad || acc.engines.empty()) return {};
    const std::string_view name = kHistNames[static_cast<size_t>(h)];
    Histogram out;
    bool first = true;
    for (auto& [engine, e] : acc.engines) {
      std::stable_sort(e.buckets.begin(), e.buckets.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      std::string why;
      if (e.buckets.empty() || !std::isinf(e.buckets.back().first)) why = "no +Inf bucket";
      for (size_t i = 1; why.empty() && i < e.buckets.size(); ++i) {
        if (e.buckets[i].first == e.buckets[i - 1].first) why = "duplicate bucket";
        if (e.buckets[i].second < e.buckets[i - 1].second) why = "buckets not cumulative";
      }
      if (why.empty() && first) {
        for (const auto& [le, c] : e.buckets) {
          out.upper.push_back(le);
          out.cumulative.push_back(c);
        }
      } else if (why.empty()) {
        if (e.buckets.size() != out.upper.size()) why = "bucket bounds differ across engines";
        for (size_t i = 0; why.empty() && i < e.buckets.size(); ++i) {
          if (e.buckets[i].first != out.upper[i]) why = "bucket bounds differ across engines";
          out.cumulative[i] += e.buckets[i].second;
        }
      }
      if (!why.empty()) {
        Garbage(fmt::format("{}: {}{}", name, why,
                            engine.empty() ? "" : fmt::format(" (engine {})", Printable(engine))));
        return {};
      }
      out.sum += e.sum.value_or(0);
      out.count += e.count.value_or(e.buckets.back().second);
      first = false;
    }
    return out;
  }

  // Label values are the replica's text: cut long ones so one line stays one line.
  static std::string Printable(std::string_view v) {
    std::string s(v.substr(0, 64));
    for (char& c : s) {
      if (static_cast<unsigned char>(c) < 0x20) c = '?';
    }
    return s;
  }

  Scrape& out_;
  RouterAcc router_[2][5];  // [ttft, tpot][series]
  Acc acc_[static_cast<size_t>(Field::kCount)];
  HistAcc hist_[static_cast<size_t>(Hist::kCount)];
  int64_t blocks_ = 0;
  bool blocks_seen_ = false, bad_blocks_ = false, bad_block_size_ = false;
};

}  // namespace

Scrape ParseScrape(std::string_view body, double t_s) {
  Scrape out;
  out.t_s = t_s;
  out.reachable = true;
  Visitor v(out);
  const metrics::ParseReport report = metrics::ParsePrometheusText(body, v);
  // Many bad lines, or bad lines and nothing else: an HTML error page, a proxy's login
  // screen, binary. Nothing it seemed to say about the engine can be trusted.
  if (report.aborted || (report.samples == 0 && report.skipped == 0 && !report.errors.empty())) {
    Scrape junk;
    junk.t_s = t_s;
    junk.reachable = true;
    const metrics::ParseError& e = report.errors.front();
    junk.garbage.push_back(
        fmt::format("not a Prometheus text exposition ({} bad lines; line {}: {})",
                    report.errors.size(), e.line, e.message));
    return junk;
  }
  v.Finish();
  // A few bad lines among good ones (a truncated body, one mangled series): the series on
  // them are missing, so say which lines.
  for (const metrics::ParseError& e : report.errors) {
    if (out.garbage.size() >= kMaxGarbageLines) break;
    out.garbage.push_back(fmt::format("line {}: {}", e.line, e.message));
  }
  return out;
}

Scrape FailedScrape(std::string error, double t_s) {
  Scrape s;
  s.t_s = t_s;
  s.reachable = false;
  s.error = std::move(error);
  return s;
}

}  // namespace kvroute::doctor
