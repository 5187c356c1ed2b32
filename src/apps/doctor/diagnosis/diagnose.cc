// Diagnose: scrape histories to figures, figures to findings. The rules are the seed
// article's reading of a fleet (docs/DOCTOR.md): a low prefix-cache hit rate on traffic
// that is queried enough, KV pressure on one replica while a sibling idles, queues on some
// replicas and not others, and the plumbing problems that make the figures unknown.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {
namespace {

using Opt = std::optional<double>;

bool Usable(const Scrape& s) { return s.reachable && s.any_engine_series; }

// A counter's increase from `a` to `b`; unknown when either is unknown or it went down
// (the replica restarted in between: the increase is not knowable from two points).
Opt Delta(const Opt& a, const Opt& b) {
  if (!a || !b || *b < *a) return std::nullopt;
  return *b - *a;
}

Opt PerSecond(const Opt& d, double dt) {
  if (!d || !(dt > 0)) return std::nullopt;
  return *d / dt;
}

std::string Pct(double v) { return fmt::format("{:.1f}%", v * 100); }
std::string Num(double v) {
  if (std::fabs(v) >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (std::fabs(v) >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.1f}", v);
}
std::string Threshold(double v) { return fmt::format("{}", v); }

struct Window {
  const Scrape* first = nullptr;  // first usable scrape
  const Scrape* last = nullptr;   // last usable scrape
  double dt = 0;
};

Window WindowOf(const ReplicaHistory& h) {
  Window w;
  for (const Scrape& s : h.scrapes) {
    if (!Usable(s)) continue;
    if (!w.first) w.first = &s;
    w.last = &s;
  }
  if (w.first && w.last != w.first) w.dt = w.last->t_s - w.first->t_s;
  return w;
}


// The tokens a replica computed (and so had to cache) between two usable scrapes:
// Δ prompt tokens − Δ prefix-cache hits, or Δ prompt tokens when the hit counter is absent.
// Unknown when a counter is unknown, went down, or the two disagree.
Opt ComputedTokens(const Scrape& a, const Scrape& b) {
  const Opt dp = Delta(a.prompt_tokens, b.prompt_tokens);
  if (!dp) return std::nullopt;
  if (!a.prefix_hits && !b.prefix_hits) return dp;
  const Opt dh = Delta(a.prefix_hits, b.prefix_hits);
  if (!dh || *dh > *dp) return std::nullopt;
  return *dp - *dh;
}

// Tokens per block for the KV-event rules: the replica's own, else the router's, else 16.
int32_t BlockTokens(const ReplicaFigures& r, const DoctorOptions& o) {
  if (r.block_size && *r.block_size > 0 && *r.block_size <= (int64_t{1} << 20)) {
    return static_cast<int32_t>(*r.block_size);
  }
  return o.router_block_size > 0 ? o.router_block_size : 16;
}

ReplicaFigures::Events EventFigures(const ReplicaHistory& h, const Window& w) {
  const EventProbe& p = *h.events;
  ReplicaFigures::Events e;
  e.address = p.address;
  e.error = p.error;
  e.batches = static_cast<int64_t>(p.batches.size());
  e.decode_errors = p.decode_errors;
  for (const EventBatchSeen& b : p.batches) {
    e.last_batch_s = std::max(e.last_batch_s.value_or(b.t_s), b.t_s);
    for (int32_t bs : b.block_sizes) {
      if (std::find(e.block_sizes.begin(), e.block_sizes.end(), bs) == e.block_sizes.end()) {
        e.block_sizes.push_back(bs);
      }
    }
  }
  std::sort(e.block_sizes.begin(), e.block_sizes.end());
  if (w.dt > 0) e.tokens_computed = ComputedTokens(*w.first, *w.last);
  return e;
}

std::string JoinInts(const std::vector<int32_t>& v) {
  std::string out;
  for (int32_t x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}


// The window's histogram: bucket deltas between the first and last usable scrapes, or,
// with a single scrape, everything since the replica started.
std::optional<Histogram> WindowHist(const Window& w, Histogram Scrape::*field) {
  if (!w.last || (w.last->*field).empty()) return std::nullopt;
  if (w.dt > 0) {
    if ((w.first->*field).empty()) return std::nullopt;
    return HistogramDelta(w.last->*field, w.first->*field);
  }
  return w.last->*field;
}

ReplicaFigures Figures(const ReplicaHistory& h, std::optional<Histogram>* ttft_window) {
  ReplicaFigures r;
  r.name = h.name;
  r.address = h.address;
  r.scrapes = static_cast<int>(h.scrapes.size());
  for (const Scrape& s : h.scrapes) {
    if (!s.reachable) {
      ++r.failures;
      r.error = s.error;
    }
  }
  if (h.scrapes.empty()) {
    r.error = "not scraped";
    return r;
  }
  const Scrape& last = h.scrapes.back();
  r.reachable = last.reachable;
  if (last.reachable) r.error.clear();
  r.garbage = last.garbage;
  r.running = last.running;
  r.waiting = last.waiting;
  r.kv_now = last.kv_usage;

  // Gauges: mean and max over every usable scrape that has them.
  double kv_sum = 0, wait_sum = 0;
  int kv_n = 0, wait_n = 0;
  for (const Scrape& s : h.scrapes) {
    if (!Usable(s)) continue;
    if (s.kv_usage) {
      kv_sum += *s.kv_usage;
      ++kv_n;
      r.kv_max = std::max(r.kv_max.value_or(0.0), *s.kv_usage);
    }
    if (s.waiting) {
      wait_sum += *s.waiting;
      ++wait_n;
    }
  }
  if (kv_n > 0) r.kv_mean = kv_sum / kv_n;
  if (wait_n > 0) r.waiting_mean = wait_sum / wait_n;

  const Window w = WindowOf(h);
  if (!w.last) return r;
  r.prefix_caching = w.last->prefix_caching;
  r.block_size = w.last->block_size;
  r.num_gpu_blocks = w.last->num_gpu_blocks;

  if (w.dt > 0) {
    const Opt dq = Delta(w.first->prefix_queries, w.last->prefix_queries);
    const Opt dh = Delta(w.first->prefix_hits, w.last->prefix_hits);
    if (dq) r.queried_tokens = dq;
    if (dq && dh && *dq > 0 && *dh <= *dq) {
      r.hit_rate = *dh / *dq;
      r.hit_rate_source = "counters";
    }
    r.preemptions_per_s = PerSecond(Delta(w.first->preemptions, w.last->preemptions), w.dt);
    r.tokens_per_s = PerSecond(Delta(w.first->generation_tokens, w.last->generation_tokens), w.dt);
    r.requests_per_s =
        PerSecond(Delta(w.first->requests_finished, w.last->requests_finished), w.dt);
  } else if (w.last->prefix_queries && w.last->prefix_hits && *w.last->prefix_queries > 0 &&
             *w.last->prefix_hits <= *w.last->prefix_queries) {
    // One scrape: no rate, but the totals since start still say how much reuse there was.
    r.hit_rate = *w.last->prefix_hits / *w.last->prefix_queries;
    r.hit_rate_source = "counters-lifetime";
    r.queried_tokens = w.last->prefix_queries;
  }
  // Old vLLM exports only the gauge (its own recent-window rate): the best there is.
  if (!r.hit_rate && !w.last->prefix_queries && w.last->hit_rate_gauge) {
    r.hit_rate = w.last->hit_rate_gauge;
    r.hit_rate_source = "gauge";
    if (w.dt > 0) {
      r.queried_tokens = Delta(w.first->prompt_tokens, w.last->prompt_tokens);
    } else {
      r.queried_tokens = w.last->prompt_tokens;
    }
  }

  *ttft_window = WindowHist(w, &Scrape::ttft);
  if (*ttft_window) {
    r.ttft_s.p50 = HistogramQuantile(**ttft_window, 0.50);
    r.ttft_s.p99 = HistogramQuantile(**ttft_window, 0.99);
  }
  // No success counter (an engine that does not export it): the requests that got a
  // first token are the next best count of requests served.
  if (!r.requests_per_s && w.dt > 0 && *ttft_window) {
    r.requests_per_s = (*ttft_window)->count / w.dt;
  }
  return r;
}

// The figure of every replica in `rs` (unknown if any is unknown).
template <typename Get>
Opt SumAll(const std::vector<const ReplicaFigures*>& rs, Get get) {
  if (rs.empty()) return std::nullopt;
  double total = 0;
  for (const ReplicaFigures* r : rs) {
    const Opt v = get(*r);
    if (!v) return std::nullopt;
    total += *v;
  }
  return total;
}

std::string JoinNames(const std::vector<std::string>& names, size_t max = 4) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max; ++i) {
    if (i) out += ", ";
    out += names[i];
  }
  if (names.size() > max) out += fmt::format(" and {} more", names.size() - max);
  return out;
}

}  // namespace

std::optional<double> HistogramQuantile(const Histogram& h, double q) {
  if (h.empty() || h.upper.size() != h.cumulative.size() || !(q >= 0 && q <= 1)) {
    return std::nullopt;
  }
  const size_t n = h.upper.size();
  const double total = h.cumulative.back();
  if (!(total > 0)) return std::nullopt;
  const double rank = q * total;
  size_t i = 0;
  while (i + 1 < n && h.cumulative[i] < rank) ++i;
  if (std::isinf(h.upper[i])) {
    // Above every finite bound: Prometheus answers with the highest finite bound.
    return n >= 2 ? std::optional<double>(h.upper[n - 2]) : std::nullopt;
  }
  const double lower = i == 0 ? 0.0 : h.upper[i - 1];
  const double upper = h.upper[i];
  if (i == 0 && upper <= 0) return upper;
  const double below = i == 0 ? 0.0 : h.cumulative[i - 1];
  const double in_bucket = h.cumulative[i] - below;
  if (!(in_bucket > 0)) return upper;
  return lower + (upper - lower) * ((rank - below) / in_bucket);
}

std::optional<Histogram> HistogramDelta(const Histogram& later, const Histogram& earlier) {
  if (earlier.empty()) return later;
  if (later.upper != earlier.upper || later.cumulative.size() != earlier.cumulative.size()) {
    return std::nullopt;
  }
  Histogram d = later;
  for (size_t i = 0; i < d.cumulative.size(); ++i) {
    if (later.cumulative[i] < earlier.cumulative[i]) return std::nullopt;
    d.cumulative[i] = later.cumulative[i] - earlier.cumulative[i];
  }
  if (later.count < earlier.count) return std::nullopt;
  d.count = later.count - earlier.count;
  d.sum = later.sum >= earlier.sum ? later.sum - earlier.sum : 0;
  return d;
}

// The router's figures over its scrapes: counter deltas between its first and last usable
// scrapes (totals with one).
RouterFigures RouterFiguresOf(const ReplicaHistory& h) {
  RouterFigures f;
  f.name = h.name;
  f.address = h.address;
  const Scrape* first = nullptr;
  const Scrape* last = nullptr;
  for (const Scrape& s : h.scrapes) {
    ++f.scrapes;
    if (!s.reachable) {
      ++f.failures;
      continue;
    }
    if (!s.any_router_series) continue;
    if (!first) first = &s;
    last = &s;
  }
  if (!h.scrapes.empty()) {
    f.reachable = h.scrapes.back().reachable;
    f.error = h.scrapes.back().error;
  }
  if (!last) return f;
  f.kvroute = true;
  f.flow_control = last->router.flow_control;
  const bool one = first == last;
  auto window = [&](const std::optional<double>(Scrape::RouterSeries::*field)[2], size_t k) -> Opt {
    const Opt b = (last->router.*field)[k];
    if (one) return b;
    return Delta((first->router.*field)[k], b);
  };
  for (size_t k = 0; k < 2; ++k) {
    RouterFigures::Kind& out = k == 0 ? f.ttft : f.tpot;
    out.predictions = window(&Scrape::RouterSeries::scored, k);
    const Opt abs_s = window(&Scrape::RouterSeries::abs_error_s, k);
    const Opt rel = window(&Scrape::RouterSeries::abs_rel_error, k);
    if (out.predictions && *out.predictions > 0) {
      if (rel) out.mape = *rel / *out.predictions;
      if (abs_s) out.mean_abs_error_s = *abs_s / *out.predictions;
    }
    out.slo_requests = window(&Scrape::RouterSeries::slo_requests, k);
    out.slo_violations = window(&Scrape::RouterSeries::slo_violations, k);
    if (out.slo_requests && out.slo_violations && *out.slo_requests > 0 &&
        *out.slo_violations <= *out.slo_requests) {
      out.attainment = 1.0 - *out.slo_violations / *out.slo_requests;
    }
  }
  return f;
}

Report Diagnose(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& o,
                const ReplicaHistory* router) {
  Report rep;
  rep.intended_window_s = o.window_s;
  double t_min = std::numeric_limits<double>::infinity();
  double t_max = -std::numeric_limits<double>::infinity();
  std::vector<std::optional<Histogram>> ttft(replicas.size());
  for (size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaHistory& h = replicas[i];
    for (const Scrape& s : h.scrapes) {
      t_min = std::min(t_min, s.t_s);
      t_max = std::max(t_max, s.t_s);
      if (Usable(s)) rep.readable = true;
    }
    rep.replicas.push_back(Figures(h, &ttft[i]));
    if (h.events) rep.replicas.back().events = EventFigures(h, WindowOf(h));
  }
  if (t_max >= t_min) {
    rep.window_s = t_max - t_min;
    rep.at_s = t_max;
  }

  // --- Fleet figures, over the replicas answering now with vLLM metrics.
  FleetFigures& f = rep.fleet;
  f.replicas = static_cast<int>(replicas.size());
  std::vector<const ReplicaFigures*> live;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaFigures& r = rep.replicas[i];
    if (r.reachable) ++f.reachable;
    if (r.reachable && !replicas[i].scrapes.empty() &&
        replicas[i].scrapes.back().any_engine_series) {
      live.push_back(&r);
    }
  }
  {
    // A ratio stays meaningful over the replicas that measured it; gauges (old vLLM) are
    // averaged only when no replica has counters, since the two do not mix.
    // Window counts and totals since start do not add up either: when some replica has
    // a window, only windows count.
    std::string counter_source = "counters-lifetime";
    for (const ReplicaFigures* r : live) {
      if (r->hit_rate_source == "counters") counter_source = "counters";
    }
    double hits = 0, queries = 0, gauge_sum = 0;
    int counted = 0, gauges = 0;
    for (const ReplicaFigures* r : live) {
      if (r->hit_rate_source == counter_source) {
        hits += *r->hit_rate * *r->queried_tokens;
        queries += *r->queried_tokens;
        ++counted;
      } else if (r->hit_rate_source == "gauge") {
        gauge_sum += *r->hit_rate;
        ++gauges;
      }
    }
    if (counted > 0 && queries > 0) {
      f.hit_rate = hits / queries;
      f.hit_rate_source = counter_source;
      f.queried_tokens = queries;
    } else if (gauges > 0) {
      f.hit_rate = gauge_sum / gauges;
      f.hit_rate_source = "gauge";
      f.queried_tokens = SumAll(live, [](const ReplicaFigures& r) {
        return r.hit_rate_source == "gauge" ? r.queried_tokens : Opt(0.0);
      });
    }
  }
  for (const ReplicaFigures* r : live) {
    if (r->kv_mean) {
      f.kv_min = std::min(f.kv_min.value_or(1.0), *r->kv_mean);
      f.kv_max = std::max(f.kv_max.value_or(0.0), *r->kv_mean);
    }
    if (r->waiting_mean) {
      f.waiting_min = std::min(f.waiting_min.value_or(*r->waiting_mean), *r->waiting_mean);
      f.waiting_max = std::max(f.waiting_max.value_or(*r->waiting_mean), *r->waiting_mean);
    }
    if (r->preemptions_per_s && *r->preemptions_per_s > o.preemptions_per_s) {
      f.preempting.push_back(r->name);
    }
  }
  if (f.kv_min && f.kv_max) f.kv_spread = *f.kv_max - *f.kv_min;
  f.waiting_total = SumAll(live, [](const ReplicaFigures& r) { return r.waiting; });
  f.preemptions_per_s = SumAll(live, [](const ReplicaFigures& r) { return r.preemptions_per_s; });
  f.tokens_per_s = SumAll(live, [](const ReplicaFigures& r) { return r.tokens_per_s; });
  f.requests_per_s = SumAll(live, [](const ReplicaFigures& r) { return r.requests_per_s; });
  {
    std::optional<Histogram> merged;
    bool ok = !live.empty();
    for (size_t i = 0; ok && i < replicas.size(); ++i) {
      const ReplicaFigures& r = rep.replicas[i];
      if (std::find(live.begin(), live.end(), &r) == live.end()) continue;
      if (!ttft[i]) {
        ok = false;
      } else if (!merged) {
        merged = ttft[i];
      } else if (merged->upper != ttft[i]->upper) {
        ok = false;
      } else {
        for (size_t b = 0; b < merged->cumulative.size(); ++b) {
          merged->cumulative[b] += ttft[i]->cumulative[b];
        }
        merged->sum += ttft[i]->sum;
        merged->count += ttft[i]->count;
      }
    }
    if (ok && merged) {
      f.ttft_s.p50 = HistogramQuantile(*merged, 0.50);
      f.ttft_s.p99 = HistogramQuantile(*merged, 0.99);
    }
  }

  // --- Findings. Plumbing first (they explain unknown figures below), then routing.
  auto add = [&](std::string rule, std::string severity, std::string summary, std::string condition,
                 std::string remedy, std::vector<std::string> names, bool routing) {
    rep.findings.push_back(Finding{std::move(rule), std::move(severity), std::move(summary),
                                   std::move(condition), std::move(remedy), std::move(names),
                                   routing});
  };

  {
    std::vector<std::string> names;
    std::string first_error;
    for (const ReplicaFigures& r : rep.replicas) {
      if (r.reachable) continue;
      names.push_back(r.name);
      if (first_error.empty()) first_error = r.name + ": " + r.error;
    }
    if (!names.empty()) {
      add("unreachable", "error",
          fmt::format("{} of {} replicas unreachable at the last scrape ({})", names.size(),
                      rep.replicas.size(), first_error),
          "the last scrape of /metrics failed (connect, timeout or HTTP status)",
          "check the endpoints (address, port, that the model server is up); a router sends no "
          "traffic to them while they fail its health checks",
          names, false);
    }
  }
  {
    std::vector<std::string> names;
    for (size_t i = 0; i < replicas.size(); ++i) {
      const ReplicaFigures& r = rep.replicas[i];
      if (r.reachable && !replicas[i].scrapes.empty() &&
          !replicas[i].scrapes.back().any_engine_series) {
        names.push_back(r.name);
      }
    }
    if (!names.empty()) {
      add("not-vllm", "error",
          fmt::format("{} answered /metrics without any vllm: series", JoinNames(names)),
          "reachable, but no series named vllm:* in the body",
          "point doctor at the model servers' own ports (not the router or a proxy); "
          "an SGLang or other engine is not read by this version",
          names, false);
    }
  }
  {
    std::vector<std::string> names;
    std::string example;
    for (const ReplicaFigures& r : rep.replicas) {
      if (r.garbage.empty()) continue;
      names.push_back(r.name);
      if (example.empty()) example = r.name + ": " + r.garbage.front();
    }
    if (!names.empty()) {
      add("garbage-metrics", "warning",
          fmt::format("{} replica(s) report unusable metrics ({})", names.size(), example),
          "a value NaN, infinite, negative, implausible (count > 1e9, KV outside [0, 1]), "
          "or a body that is not a Prometheus exposition",
          "those figures are unknown and no rule reads them; kvroute's scorers treat such a "
          "replica as having no metrics (docs/FAULTS.md); fix the exporter",
          names, false);
    }
  }
  bool any_caching_off = false;
  {
    std::vector<std::string> names;
    for (const ReplicaFigures* r : live) {
      if (r->prefix_caching == false) names.push_back(r->name);
    }
    any_caching_off = !names.empty();
    if (any_caching_off) {
      add("prefix-caching-off", "warning",
          fmt::format("prefix caching is off on {}", JoinNames(names)),
          "vllm:cache_config_info says enable_prefix_caching=\"False\"",
          "start vLLM with --enable-prefix-caching; without it kvroute's prefix scorer has "
          "no cached prefix to route to and every prompt is computed in full",
          names, false);
    }
  }
  if (f.hit_rate && f.queried_tokens && *f.hit_rate < o.low_hit_rate &&
      *f.queried_tokens >= o.min_queried_tokens && !any_caching_off) {
    std::vector<std::string> names;
    for (const ReplicaFigures* r : live) {
      if (r->hit_rate && *r->hit_rate < o.low_hit_rate) names.push_back(r->name);
    }
    const char* over = f.hit_rate_source == "counters-lifetime" ? "since start"
                       : f.hit_rate_source == "gauge"           ? "prompt tokens in the window"
                                                                : "in the window";
    add("prefix-reuse-lost", "warning",
        fmt::format("fleet prefix-cache hit rate {} over {} queried tokens {} ({} source)",
                    Pct(*f.hit_rate), Num(*f.queried_tokens), over, f.hit_rate_source),
        fmt::format("fleet hit rate < {} with >= {} tokens queried and prefix caching on",
                    Pct(o.low_hit_rate), Threshold(o.min_queried_tokens)),
        "if the traffic shares prefixes (system prompts, few-shot examples, documents), route "
        "by prefix: `scheduling: {policy: kvroute}` in the serve/epp config, or a "
        "prefix-cache-scorer with the highest weight (as examples/seed.yaml does)",
        names, true);
  }
  {
    // Round by round: the i-th scrape of every replica. The worst round (widest gap
    // between a pressured replica and an idle one) is the one the finding quotes.
    struct Worst {
      double gap = -1, t_s = 0;
      size_t hot = 0, cold = 0;
      double hot_kv = 0, hot_waiting = 0, cold_kv = 0, cold_waiting = 0;
      bool hot_preempted = false;
    } worst;
    size_t rounds = 0;
    for (const ReplicaHistory& h : replicas) rounds = std::max(rounds, h.scrapes.size());
    for (size_t k = 0; k < rounds; ++k) {
      int known = 0;
      // Per round: the highest-KV pressured replica and the lowest-KV idle one.
      std::optional<size_t> hot, cold;
      bool hot_preempted = false;
      for (size_t i = 0; i < replicas.size(); ++i) {
        const std::vector<Scrape>& sc = replicas[i].scrapes;
        if (k >= sc.size() || !Usable(sc[k]) || !sc[k].kv_usage || !sc[k].waiting) continue;
        ++known;
        const Scrape& s = sc[k];
        bool preempted = false;
        if (k > 0 && Usable(sc[k - 1])) {
          const Opt d = Delta(sc[k - 1].preemptions, s.preemptions);
          preempted = d && *d > 0;
        }
        // A queue, a preemption since the last look, or a full cache with a queue forming.
        const bool pressured = *s.waiting >= o.queue_busy || preempted ||
                               (*s.kv_usage >= o.kv_hot && *s.waiting > o.queue_idle);
        const bool idle = *s.waiting <= o.queue_idle && *s.kv_usage <= o.kv_cold;
        if (pressured && (!hot || *s.kv_usage > *replicas[*hot].scrapes[k].kv_usage)) {
          hot = i;
          hot_preempted = preempted;
        }
        if (idle && (!cold || *s.kv_usage < *replicas[*cold].scrapes[k].kv_usage)) cold = i;
      }
      if (known < 2) continue;
      ++f.rounds;
      if (!hot || !cold) continue;
      const Scrape& hs = replicas[*hot].scrapes[k];
      const Scrape& cs = replicas[*cold].scrapes[k];
      const double gap = *hs.kv_usage - *cs.kv_usage;
      if (gap < o.kv_spread) continue;
      ++f.lopsided_rounds;
      if (gap > worst.gap) {
        worst = {gap,       hs.t_s,        *hot,          *cold, *hs.kv_usage, *hs.waiting,
                 *cs.kv_usage, *cs.waiting, hot_preempted};
      }
    }
    if (f.rounds > 0 && f.lopsided_rounds > 0 &&
        f.lopsided_rounds >= o.lopsided_share * f.rounds) {
      const std::string& hot_name = rep.replicas[worst.hot].name;
      const std::string& cold_name = rep.replicas[worst.cold].name;
      add("lopsided-kv", "warning",
          fmt::format("in {} of {} scrape rounds ({}) a replica was under pressure while a "
                      "sibling idled; worst at t={:.1f}s: {} at {} KV with {} waiting{}, {} at "
                      "{} with {} waiting ({:.1f} points apart)",
                      f.lopsided_rounds, f.rounds,
                      Pct(static_cast<double>(f.lopsided_rounds) / f.rounds), worst.t_s,
                      hot_name, Pct(worst.hot_kv), Num(worst.hot_waiting),
                      worst.hot_preempted ? " and preempting" : "", cold_name,
                      Pct(worst.cold_kv), Num(worst.cold_waiting), worst.gap * 100),
          fmt::format("in >= {} of scrape rounds: a replica with waiting >= {}, a preemption "
                      "since its previous scrape, or KV >= {} with waiting > {}, while another "
                      "has waiting <= {} and KV <= {}, at least {:.0f} points lower",
                      Pct(o.lopsided_share), Threshold(o.queue_busy), Pct(o.kv_hot),
                      Threshold(o.queue_idle), Threshold(o.queue_idle), Pct(o.kv_cold),
                      o.kv_spread * 100),
          "pick by KV and queue, not by turn or connection count: raise the "
          "kv-cache-utilization-scorer and queue-depth-scorer weights in the "
          "`schedulingProfile`, or use `scheduling: {policy: kvroute}`",
          {hot_name, cold_name}, true);
    }
  }
  {
    std::vector<std::string> busy, idle;
    const ReplicaFigures* busiest = nullptr;
    const ReplicaFigures* idlest = nullptr;
    for (const ReplicaFigures* r : live) {
      if (!r->waiting_mean) continue;
      if (*r->waiting_mean >= o.queue_busy) busy.push_back(r->name);
      if (*r->waiting_mean <= o.queue_idle) idle.push_back(r->name);
      if (!busiest || *r->waiting_mean > *busiest->waiting_mean) busiest = r;
      if (!idlest || *r->waiting_mean < *idlest->waiting_mean) idlest = r;
    }
    if (!busy.empty() && !idle.empty()) {
      std::vector<std::string> names = busy;
      names.insert(names.end(), idle.begin(), idle.end());
      add("queue-imbalance", "warning",
          fmt::format("mean waiting {} on {} while {} has {} ({} replica(s) queueing, {} idle)",
                      Num(*busiest->waiting_mean), busiest->name, idlest->name,
                      Num(*idlest->waiting_mean), busy.size(), idle.size()),
          fmt::format("some replica's mean waiting >= {} while another's <= {}",
                      Threshold(o.queue_busy), Threshold(o.queue_idle)),
          "make picks follow the queues: weight the queue-depth-scorer in the `schedulingProfile`, "
          "or use "
          "`scheduling: {policy: kvroute}`",
          names, true);
    }
  }
  if (!f.preempting.empty()) {
    std::string rates;
    for (const ReplicaFigures* r : live) {
      if (std::find(f.preempting.begin(), f.preempting.end(), r->name) == f.preempting.end()) {
        continue;
      }
      if (!rates.empty()) rates += ", ";
      rates += fmt::format("{} {:.2f}/s", r->name, *r->preemptions_per_s);
    }
    add("preemptions", "warning", fmt::format("preempting: {}", rates),
        fmt::format("preemptions > {}/s on a replica", Threshold(o.preemptions_per_s)),
        "KV cache too small for the running batch: lower vLLM's max_num_seqs or give it more "
        "KV memory, or raise kvroute's kv-cache-utilization-scorer weight; under overload, "
        "`flow: {enabled: true}` holds requests at the router instead",
        f.preempting, false);
  }
  // --- KV-cache events (replicas whose events are configured and were probed).
  {
    const char* kEnable =
        "check that the engine publishes: vLLM needs --kv-events-config "
        "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": "
        "\"tcp://*:5557\"}' (and prefix caching on); that the address is the one it binds (the "
        "endpoint's kv_events, or pool.kv_events.port on every replica; --kv-events-port for "
        "doctor --endpoints); and that no firewall or NetworkPolicy blocks the port. Until its "
        "events arrive the router routes that endpoint by its approximate model "
        "(kvroute_kv_events_state unknown or stale)";
    std::vector<std::string> silent, stale, mismatched;
    std::string silent_text, stale_text, mismatch_text;
    auto append = [](std::string& text, const std::string& part) {
      text += (text.empty() ? "" : "; ") + part;
    };
    for (size_t i = 0; i < replicas.size(); ++i) {
      const ReplicaHistory& h = replicas[i];
      const ReplicaFigures& r = rep.replicas[i];
      if (!h.events || !r.events) continue;
      const ReplicaFigures::Events& e = *r.events;
      const int32_t block = BlockTokens(r, o);
      const double need = o.event_min_blocks * block;
      const Window w = WindowOf(h);
      if (e.batches == 0 && e.tokens_computed && *e.tokens_computed >= need &&
          *e.tokens_computed > 0) {
        silent.push_back(r.name);
        append(silent_text,
               fmt::format("{} ({}) published no batch in {:.1f}s while it computed {} prompt "
                           "tokens ({:.1f} blocks of {}){}{}",
                           r.name, e.address, w.dt, Num(*e.tokens_computed),
                           *e.tokens_computed / block, block,
                           e.decode_errors > 0
                               ? fmt::format(", {} undecodable messages", e.decode_errors)
                               : "",
                           e.error.empty() ? "" : ", probe: " + e.error));
      }
      if (e.batches > 0 && w.dt > 0) {
        // The first usable scrape in the window's second half (not the first or last one).
        const Scrape* mid = nullptr;
        for (const Scrape& s : h.scrapes) {
          if (Usable(s) && &s != w.first && s.t_s >= w.first->t_s + w.dt / 2) {
            mid = &s;
            break;
          }
        }
        if (mid && mid != w.last && e.last_batch_s && *e.last_batch_s <= mid->t_s) {
          const Opt late = ComputedTokens(*mid, *w.last);
          if (late && *late >= need && *late > 0) {
            stale.push_back(r.name);
            append(stale_text,
                   fmt::format("{} ({}): {} batches, the last at t={:.1f}s, none in the last "
                               "{:.1f}s while it computed {} prompt tokens ({:.1f} blocks of {})",
                               r.name, e.address, e.batches, *e.last_batch_s,
                               w.last->t_s - mid->t_s, Num(*late), *late / block, block));
          }
        }
      }
      std::vector<std::string> why;
      if (r.block_size && !e.block_sizes.empty() &&
          (e.block_sizes.size() > 1 || e.block_sizes.front() != *r.block_size)) {
        why.push_back(fmt::format("events say block_size {}, cache_config_info says {}",
                                  JoinInts(e.block_sizes), *r.block_size));
      }
      if (o.router_block_size > 0) {
        std::vector<int32_t> bad;
        for (int32_t bs : e.block_sizes) {
          if (bs <= 0 || bs % o.router_block_size != 0) bad.push_back(bs);
        }
        if (!bad.empty()) {
          why.push_back(fmt::format(
              "events' block_size {} is not a multiple of the router's pool.kv_events.block_size "
              "{}",
              JoinInts(bad), o.router_block_size));
        }
      }
      if (!why.empty()) {
        mismatched.push_back(r.name);
        std::string joined;
        for (const std::string& w2 : why) joined += (joined.empty() ? "" : " and ") + w2;
        append(mismatch_text, fmt::format("{} ({}): {}", r.name, e.address, joined));
      }
    }
    if (!silent.empty()) {
      add("kv-events-silent", "warning", silent_text,
          fmt::format("KV events configured, no batch received in the window, and >= {} "
                      "block(s) of prompt tokens computed (Δ prompt tokens − Δ prefix-cache "
                      "hits)",
                      Threshold(o.event_min_blocks)),
          kEnable, silent, false);
    }
    if (!stale.empty()) {
      add("kv-events-stale", "warning", stale_text,
          fmt::format("batches received early in the window, none since the first scrape of "
                      "its second half, while >= {} block(s) of prompt tokens were computed "
                      "since that scrape",
                      Threshold(o.event_min_blocks)),
          "the publisher stopped while the engine kept working: check the engine's log (a "
          "failed publisher, a restart on another port) and the network path; the router marks "
          "the endpoint stale after pool.kv_events.stale_after and routes it by its "
          "approximate model until batches return",
          stale, false);
    }
    if (!mismatched.empty()) {
      add("kv-events-block-size", "warning", mismatch_text,
          "the block_size of BlockStored events differs from vllm:cache_config_info's "
          "block_size label, or is not a multiple of pool.kv_events.block_size",
          "make the events and the scrapes come from the same engine (the endpoint's kv_events "
          "address must be its own publisher), and set pool.kv_events.block_size to a divisor "
          "of the engines' block size (their block size itself, e.g. 16); until then the "
          "router's index rejects that endpoint's events (kvroute_kv_events_state mismatch) and "
          "routes it by its approximate model",
          mismatched, false);
    }
  }

  // --- The router (--router): its latency model and the objectives' attainment.
  if (router) {
    rep.router = RouterFiguresOf(*router);
    const RouterFigures& r = *rep.router;
    if (!r.kvroute) {
      add("router-unreadable", "warning",
          r.reachable ? fmt::format("router {} answered /metrics without kvroute's latency "
                                    "series",
                                    r.address)
                      : fmt::format("router {} unreachable: {}", r.address, r.error),
          "--router given, and no scrape in the window had kvroute_latency_* or kvroute_slo_* "
          "series",
          "point --router at `kvroute serve`'s listen address or `kvroute epp`'s metrics "
          "address (its /metrics), not at a replica or a gateway",
          {r.name}, false);
    } else {
      std::vector<std::string> off;
      for (size_t k = 0; k < 2; ++k) {
        const RouterFigures::Kind& x = k == 0 ? r.ttft : r.tpot;
        if (x.mape && x.predictions && x.mean_abs_error_s &&
            *x.predictions >= o.latency_min_predictions && *x.mape > o.latency_max_mape &&
            *x.mean_abs_error_s > o.latency_min_abs_error_s) {
          off.push_back(fmt::format("{} predictions off by {} on average (mean {:.3f} s) over "
                                    "{} predictions",
                                    k == 0 ? "TTFT" : "TPOT", Pct(*x.mape),
                                    x.mean_abs_error_s.value_or(0), Num(*x.predictions)));
        }
      }
      if (!off.empty()) {
        std::string summary = "router's latency model: " + off[0];
        if (off.size() > 1) summary += "; " + off[1];
        add("latency-model-inaccurate", "warning", std::move(summary),
            fmt::format("mean relative error > {} and mean absolute error > {} s over >= {} "
                        "scored predictions in the window",
                        Pct(o.latency_max_mape), Threshold(o.latency_min_abs_error_s),
                        Threshold(o.latency_min_predictions)),
            "the model steers flow control by predicted miss (flow.slo_aware) and the "
            "kvroute-slo policy. Check that the replicas' metrics are fresh "
            "(pool.scrape_interval, kvroute_endpoint_scrape_age_seconds) and that answers "
            "stream (only streamed answers teach it). It errs most in bursts; "
            "flow.slo_admit_fraction and flow.slo_release_fraction: 0 keep admission and "
            "release to the saturation detector, "
            "flow.slo_aware: false orders the queue by arrival again",
            {r.name}, false);
      }
      std::vector<std::string> missed;
      for (size_t k = 0; k < 2; ++k) {
        const RouterFigures::Kind& x = k == 0 ? r.ttft : r.tpot;
        if (x.attainment && x.slo_requests && *x.slo_requests >= o.slo_min_requests &&
            1.0 - *x.attainment > o.slo_max_violation) {
          missed.push_back(fmt::format("{} of {} requests missed their {} objective",
                                       Pct(1.0 - *x.attainment), Num(*x.slo_requests),
                                       k == 0 ? "TTFT" : "TPOT"));
        }
      }
      if (!missed.empty()) {
        std::string summary = "at the router: " + missed[0];
        if (missed.size() > 1) summary += "; " + missed[1];
        add("slo-missed", "warning", std::move(summary),
            fmt::format("more than {} of >= {} requests with an objective (x-llm-d-slo-*-ms, "
                        "epp.objectives, scheduling.slo) missed it in the window",
                        Pct(o.slo_max_violation), Threshold(o.slo_min_requests)),
            r.flow_control
                ? "flow control is on: requests predicted to miss already yield to those that "
                  "can still meet theirs, so the fleet lacks capacity for these objectives at "
                  "this load: add replicas, or mark batch traffic sheddable (an objective with "
                  "priority < 0) so it is refused when predicted to miss"
                : "flow: {enabled: true} (flow.slo_aware is its default): in overload, requests "
                  "predicted to miss their objective wait behind those that can still meet "
                  "theirs instead of queueing in the engines (docs/POLICIES.md, \"Flow control "
                  "by predicted miss\"); if they still miss, the fleet lacks capacity",
            {r.name}, true);
      }
    }
  }
  return rep;
}

}  // namespace kvroute::doctor
