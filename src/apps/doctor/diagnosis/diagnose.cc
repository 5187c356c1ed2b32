// Diagnose: scrape histories to figures, figures to findings. The rules are the seed
// article's reading of a fleet (docs/DOCTOR.md): a low prefix-cache hit rate on traffic
// that is queried enough, KV pressure on one replica while a sibling idles, queues on some
// replicas and not others, and the plumbing problems that make the figures unknown.
// This file holds the figures and the steps of Diagnose; the rules that turn figures into
// findings are in diagnose_findings.cc (the replicas') and diagnose_router.cc (--router's).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "apps/doctor/diagnosis/diagnose_internal.h"
#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {
namespace detail {

bool Usable(const Scrape& s) { return s.reachable && s.any_engine_series; }

Opt Delta(const Opt& a, const Opt& b) {
  if (!a || !b || *b < *a) return std::nullopt;
  return *b - *a;
}

std::string Pct(double v) { return fmt::format("{:.1f}%", v * 100); }
std::string Num(double v) {
  if (std::fabs(v) >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (std::fabs(v) >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.1f}", v);
}
std::string Threshold(double v) { return fmt::format("{}", v); }

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

Opt ComputedTokens(const Scrape& a, const Scrape& b) {
  const Opt dp = Delta(a.prompt_tokens, b.prompt_tokens);
  if (!dp) return std::nullopt;
  if (!a.prefix_hits && !b.prefix_hits) return dp;
  const Opt dh = Delta(a.prefix_hits, b.prefix_hits);
  if (!dh || *dh > *dp) return std::nullopt;
  return *dp - *dh;
}

std::string JoinNames(const std::vector<std::string>& names, size_t max) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max; ++i) {
    if (i) out += ", ";
    out += names[i];
  }
  if (names.size() > max) out += fmt::format(" and {} more", names.size() - max);
  return out;
}

}  // namespace detail

namespace {

using detail::Delta;
using detail::Opt;
using detail::Usable;
using detail::Window;
using detail::WindowOf;

Opt PerSecond(const Opt& d, double dt) {
  if (!d || !(dt > 0)) return std::nullopt;
  return *d / dt;
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
  if (w.dt > 0) e.tokens_computed = detail::ComputedTokens(*w.first, *w.last);
  return e;
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

// Each replica's figures (and its window's TTFT histogram into `ttft`, for the fleet's),
// whether any scrape was usable, and the span of the scrapes' times.
void ReplicaFiguresOf(const std::vector<ReplicaHistory>& replicas, Report& rep,
                      std::vector<std::optional<Histogram>>& ttft) {
  double t_min = std::numeric_limits<double>::infinity();
  double t_max = -std::numeric_limits<double>::infinity();
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
}

// The replicas answering now with vLLM metrics; counts rep.fleet's replicas and reachable.
std::vector<const ReplicaFigures*> LiveReplicas(const std::vector<ReplicaHistory>& replicas,
                                                Report& rep) {
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
  return live;
}

void FleetHitRate(const std::vector<const ReplicaFigures*>& live, FleetFigures& f) {
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

// KV, waiting and the replicas preempting over options.preemptions_per_s; the fleet's sums.
void FleetGauges(const std::vector<const ReplicaFigures*>& live, const DoctorOptions& o,
                 FleetFigures& f) {
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
}

// The fleet's TTFT quantiles from the live replicas' window histograms merged (unknown when
// one is unknown or their buckets differ).
void FleetTtft(const std::vector<ReplicaHistory>& replicas,
               const std::vector<ReplicaFigures>& figures,
               const std::vector<const ReplicaFigures*>& live,
               const std::vector<std::optional<Histogram>>& ttft, FleetFigures& f) {
  std::optional<Histogram> merged;
  bool ok = !live.empty();
  for (size_t i = 0; ok && i < replicas.size(); ++i) {
    const ReplicaFigures& r = figures[i];
    if (std::find(live.begin(), live.end(), &r) == live.end()) continue;
    // A replica without the histogram, or with other bucket bounds, leaves no fleet figure.
    if (!ttft[i] || (merged && merged->upper != ttft[i]->upper)) {
      ok = false;
    } else if (!merged) {
      merged = ttft[i];
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

Report Diagnose(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& o,
                const ReplicaHistory* router) {
  Report rep;
  rep.intended_window_s = o.window_s;
  std::vector<std::optional<Histogram>> ttft(replicas.size());
  ReplicaFiguresOf(replicas, rep, ttft);

  // --- Fleet figures, over the replicas answering now with vLLM metrics.
  const std::vector<const ReplicaFigures*> live = LiveReplicas(replicas, rep);
  FleetHitRate(live, rep.fleet);
  FleetGauges(live, o, rep.fleet);
  FleetTtft(replicas, rep.replicas, live, ttft, rep.fleet);

  // --- Findings. Plumbing first (they explain unknown figures below), then routing.
  detail::AddReplicaFindings(replicas, live, o, rep);

  // --- The router (--router): its latency model and the objectives' attainment.
  if (router) detail::AddRouterFindings(*router, o, rep);
  return rep;
}

}  // namespace kvroute::doctor
