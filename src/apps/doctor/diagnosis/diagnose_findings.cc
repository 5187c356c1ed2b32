// The finding rules that read the replicas: the plumbing problems that make figures unknown
// (unreachable, not-vllm, garbage-metrics, prefix-caching-off), the routing findings
// (prefix-reuse-lost, lopsided-kv, queue-imbalance), preemptions, and the KV-event rules.
// Each rule is a function of its own; AddReplicaFindings runs them in report order.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apps/doctor/diagnosis/diagnose_internal.h"
#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor::detail {
namespace {

// Tokens per block for the KV-event rules: the replica's own, else the router's, else 16.
int32_t BlockTokens(const ReplicaFigures& r, const DoctorOptions& o) {
  if (r.block_size && *r.block_size > 0 && *r.block_size <= (int64_t{1} << 20)) {
    return static_cast<int32_t>(*r.block_size);
  }
  return o.router_block_size > 0 ? o.router_block_size : 16;
}

std::string JoinInts(const std::vector<int32_t>& v) {
  std::string out;
  for (int32_t x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

void UnreachableFinding(Report& rep) {
  std::vector<std::string> names;
  std::string first_error;
  for (const ReplicaFigures& r : rep.replicas) {
    if (r.reachable) continue;
    names.push_back(r.name);
    if (first_error.empty()) first_error = r.name + ": " + r.error;
  }
  if (!names.empty()) {
    AddFinding(rep, "unreachable", "error",
        fmt::format("{} of {} replicas unreachable at the last scrape ({})", names.size(),
                    rep.replicas.size(), first_error),
        "the last scrape of /metrics failed (connect, timeout or HTTP status)",
        "check the endpoints (address, port, that the model server is up); a router sends no "
        "traffic to them while they fail its health checks",
        names, false);
  }
}

void NotVllmFinding(const std::vector<ReplicaHistory>& replicas, Report& rep) {
  std::vector<std::string> names;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaFigures& r = rep.replicas[i];
    if (r.reachable && !replicas[i].scrapes.empty() &&
        !replicas[i].scrapes.back().any_engine_series) {
      names.push_back(r.name);
    }
  }
  if (!names.empty()) {
    AddFinding(rep, "not-vllm", "error",
        fmt::format("{} answered /metrics without any vllm: series", JoinNames(names)),
        "reachable, but no series named vllm:* in the body",
        "point doctor at the model servers' own ports (not the router or a proxy); "
        "an SGLang or other engine is not read by this version",
        names, false);
  }
}

void GarbageMetricsFinding(Report& rep) {
  std::vector<std::string> names;
  std::string example;
  for (const ReplicaFigures& r : rep.replicas) {
    if (r.garbage.empty()) continue;
    names.push_back(r.name);
    if (example.empty()) example = r.name + ": " + r.garbage.front();
  }
  if (!names.empty()) {
    AddFinding(rep, "garbage-metrics", "warning",
        fmt::format("{} replica(s) report unusable metrics ({})", names.size(), example),
        "a value NaN, infinite, negative, implausible (count > 1e9, KV outside [0, 1]), "
        "or a body that is not a Prometheus exposition",
        "those figures are unknown and no rule reads them; kvroute's scorers treat such a "
        "replica as having no metrics (docs/FAULTS.md); fix the exporter",
        names, false);
  }
}

// Whether prefix caching is off on some live replica (the finding is then added, and
// prefix-reuse-lost does not fire: the cache is off, not missed).
bool PrefixCachingOffFinding(const std::vector<const ReplicaFigures*>& live, Report& rep) {
  std::vector<std::string> names;
  for (const ReplicaFigures* r : live) {
    if (r->prefix_caching == false) names.push_back(r->name);
  }
  const bool any_caching_off = !names.empty();
  if (any_caching_off) {
    AddFinding(rep, "prefix-caching-off", "warning",
        fmt::format("prefix caching is off on {}", JoinNames(names)),
        "vllm:cache_config_info says enable_prefix_caching=\"False\"",
        "start vLLM with --enable-prefix-caching; without it kvroute's prefix scorer has "
        "no cached prefix to route to and every prompt is computed in full",
        names, false);
  }
  return any_caching_off;
}

void PrefixReuseLostFinding(const std::vector<const ReplicaFigures*>& live,
                            const DoctorOptions& o, bool any_caching_off, Report& rep) {
  const FleetFigures& f = rep.fleet;
  if (f.hit_rate && f.queried_tokens && *f.hit_rate < o.low_hit_rate &&
      *f.queried_tokens >= o.min_queried_tokens && !any_caching_off) {
    std::vector<std::string> names;
    for (const ReplicaFigures* r : live) {
      if (r->hit_rate && *r->hit_rate < o.low_hit_rate) names.push_back(r->name);
    }
    const char* over = f.hit_rate_source == "counters-lifetime" ? "since start"
                       : f.hit_rate_source == "gauge"           ? "prompt tokens in the window"
                                                                : "in the window";
    AddFinding(rep, "prefix-reuse-lost", "warning",
        fmt::format("fleet prefix-cache hit rate {} over {} queried tokens {} ({} source)",
                    Pct(*f.hit_rate), Num(*f.queried_tokens), over, f.hit_rate_source),
        fmt::format("fleet hit rate < {} with >= {} tokens queried and prefix caching on",
                    Pct(o.low_hit_rate), Threshold(o.min_queried_tokens)),
        "if the traffic shares prefixes (system prompts, few-shot examples, documents), route "
        "by prefix: `scheduling: {policy: kvroute}` in the serve/epp config, or a "
        "prefix-cache-scorer with the highest weight (as examples/seed.yaml does)",
        names, true);
  }
}

// Also counts rep.fleet.rounds and rep.fleet.lopsided_rounds.
void LopsidedKvFinding(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& o,
                       Report& rep) {
  FleetFigures& f = rep.fleet;
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
    AddFinding(rep, "lopsided-kv", "warning",
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

void QueueImbalanceFinding(const std::vector<const ReplicaFigures*>& live,
                           const DoctorOptions& o, Report& rep) {
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
    AddFinding(rep, "queue-imbalance", "warning",
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

void PreemptionsFinding(const std::vector<const ReplicaFigures*>& live, const DoctorOptions& o,
                        Report& rep) {
  const FleetFigures& f = rep.fleet;
  if (!f.preempting.empty()) {
    std::string rates;
    for (const ReplicaFigures* r : live) {
      if (std::find(f.preempting.begin(), f.preempting.end(), r->name) == f.preempting.end()) {
        continue;
      }
      if (!rates.empty()) rates += ", ";
      rates += fmt::format("{} {:.2f}/s", r->name, *r->preemptions_per_s);
    }
    AddFinding(rep, "preemptions", "warning", fmt::format("preempting: {}", rates),
        fmt::format("preemptions > {}/s on a replica", Threshold(o.preemptions_per_s)),
        "KV cache too small for the running batch: lower vLLM's max_num_seqs or give it more "
        "KV memory, or raise kvroute's kv-cache-utilization-scorer weight; under overload, "
        "`flow: {enabled: true}` holds requests at the router instead",
        f.preempting, false);
  }
}

// --- KV-cache events (replicas whose events are configured and were probed).

void AppendPart(std::string& text, const std::string& part) {
  text += (text.empty() ? "" : "; ") + part;
}

// The replicas a KV-event finding names, and its summary: their parts, "; "-joined.
struct Flagged {
  std::vector<std::string> names;
  std::string text;
};

// One replica whose KV-cache events were probed, as the KV-event findings read it.
struct EventReplica {
  const ReplicaHistory& h;
  const ReplicaFigures& r;
  const ReplicaFigures::Events& e;
  int32_t block;  // its block size, tokens (BlockTokens)
  double need;    // computed prompt tokens that must have produced a batch
  Window w;
};

// Asks `part` about every replica whose KV-cache events were probed; a replica it says
// something of (not empty) is flagged.
template <class Part>
Flagged FlagEventReplicas(const std::vector<ReplicaHistory>& replicas, const Report& rep,
                          const DoctorOptions& o, Part part) {
  Flagged out;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaHistory& h = replicas[i];
    const ReplicaFigures& r = rep.replicas[i];
    if (!h.events || !r.events) continue;
    const int32_t block = BlockTokens(r, o);
    const std::string said =
        part(EventReplica{h, r, *r.events, block, o.event_min_blocks * block, WindowOf(h)});
    if (said.empty()) continue;
    out.names.push_back(r.name);
    AppendPart(out.text, said);
  }
  return out;
}

void KvEventsSilentFinding(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& o,
                           Report& rep) {
  const char* kEnable =
      "check that the engine publishes: vLLM needs --kv-events-config "
      "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": "
      "\"tcp://*:5557\"}' (and prefix caching on); that the address is the one it binds (the "
      "endpoint's kv_events, or pool.kv_events.port on every replica; --kv-events-port for "
      "doctor --endpoints); and that no firewall or NetworkPolicy blocks the port. Until its "
      "events arrive the router routes that endpoint by its approximate model "
      "(kvroute_kv_events_state unknown or stale)";
  const Flagged silent = FlagEventReplicas(
      replicas, rep, o, [&](const EventReplica& x) -> std::string {
        const auto& [h, r, e, block, need, w] = x;
        if (e.batches != 0 || !e.tokens_computed || !(*e.tokens_computed >= need) ||
            !(*e.tokens_computed > 0)) {
          return {};
        }
        return fmt::format(
            "{} ({}) published no batch in {:.1f}s while it computed {} prompt tokens ({:.1f} "
            "blocks of {}){}{}",
            r.name, e.address, w.dt, Num(*e.tokens_computed), *e.tokens_computed / block, block,
            e.decode_errors > 0 ? fmt::format(", {} undecodable messages", e.decode_errors) : "",
            e.error.empty() ? "" : ", probe: " + e.error);
      });
  if (!silent.names.empty()) {
    AddFinding(rep, "kv-events-silent", "warning", silent.text,
        fmt::format("KV events configured, no batch received in the window, and >= {} "
                    "block(s) of prompt tokens computed (Δ prompt tokens − Δ prefix-cache "
                    "hits)",
                    Threshold(o.event_min_blocks)),
        kEnable, silent.names, false);
  }
}

void KvEventsStaleFinding(const std::vector<ReplicaHistory>& replicas, const DoctorOptions& o,
                          Report& rep) {
  const Flagged stale = FlagEventReplicas(
      replicas, rep, o, [&](const EventReplica& x) -> std::string {
        const auto& [h, r, e, block, need, w] = x;
        if (!(e.batches > 0 && w.dt > 0)) return {};
        // The first usable scrape in the window's second half (not the first or last one).
        const Scrape* mid = nullptr;
        for (const Scrape& s : h.scrapes) {
          if (Usable(s) && &s != w.first && s.t_s >= w.first->t_s + w.dt / 2) {
            mid = &s;
            break;
          }
        }
        if (!mid || mid == w.last || !e.last_batch_s || !(*e.last_batch_s <= mid->t_s)) return {};
        const Opt late = ComputedTokens(*mid, *w.last);
        if (!late || !(*late >= need && *late > 0)) return {};
        return fmt::format(
            "{} ({}): {} batches, the last at t={:.1f}s, none in the last {:.1f}s while it "
            "computed {} prompt tokens ({:.1f} blocks of {})",
            r.name, e.address, e.batches, *e.last_batch_s, w.last->t_s - mid->t_s, Num(*late),
            *late / block, block);
      });
  if (!stale.names.empty()) {
    AddFinding(rep, "kv-events-stale", "warning", stale.text,
        fmt::format("batches received early in the window, none since the first scrape of "
                    "its second half, while >= {} block(s) of prompt tokens were computed "
                    "since that scrape",
                    Threshold(o.event_min_blocks)),
        "the publisher stopped while the engine kept working: check the engine's log (a "
        "failed publisher, a restart on another port) and the network path; the router marks "
        "the endpoint stale after pool.kv_events.stale_after and routes it by its "
        "approximate model until batches return",
        stale.names, false);
  }
}

void KvEventsBlockSizeFinding(const std::vector<ReplicaHistory>& replicas,
                              const DoctorOptions& o, Report& rep) {
  const Flagged mismatched = FlagEventReplicas(
      replicas, rep, o, [&](const EventReplica& x) -> std::string {
        const ReplicaFigures& r = x.r;
        const ReplicaFigures::Events& e = x.e;
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
                "events' block_size {} is not a multiple of the router's "
                "pool.kv_events.block_size {}",
                JoinInts(bad), o.router_block_size));
          }
        }
        if (why.empty()) return {};
        std::string joined;
        for (const std::string& w2 : why) joined += (joined.empty() ? "" : " and ") + w2;
        return fmt::format("{} ({}): {}", r.name, e.address, joined);
      });
  if (!mismatched.names.empty()) {
    AddFinding(rep, "kv-events-block-size", "warning", mismatched.text,
        "the block_size of BlockStored events differs from vllm:cache_config_info's "
        "block_size label, or is not a multiple of pool.kv_events.block_size",
        "make the events and the scrapes come from the same engine (the endpoint's kv_events "
        "address must be its own publisher), and set pool.kv_events.block_size to a divisor "
        "of the engines' block size (their block size itself, e.g. 16); until then the "
        "router's index rejects that endpoint's events (kvroute_kv_events_state mismatch) and "
        "routes it by its approximate model",
        mismatched.names, false);
  }
}

}  // namespace

void AddFinding(Report& rep, std::string rule, std::string severity, std::string summary,
                std::string condition, std::string remedy, std::vector<std::string> names,
                bool routing) {
  rep.findings.push_back(Finding{std::move(rule), std::move(severity), std::move(summary),
                                 std::move(condition), std::move(remedy), std::move(names),
                                 routing});
}

void AddReplicaFindings(const std::vector<ReplicaHistory>& replicas,
                        const std::vector<const ReplicaFigures*>& live, const DoctorOptions& o,
                        Report& rep) {
  UnreachableFinding(rep);
  NotVllmFinding(replicas, rep);
  GarbageMetricsFinding(rep);
  const bool any_caching_off = PrefixCachingOffFinding(live, rep);
  PrefixReuseLostFinding(live, o, any_caching_off, rep);
  LopsidedKvFinding(replicas, o, rep);
  QueueImbalanceFinding(live, o, rep);
  PreemptionsFinding(live, o, rep);
  KvEventsSilentFinding(replicas, o, rep);
  KvEventsStaleFinding(replicas, o, rep);
  KvEventsBlockSizeFinding(replicas, o, rep);
}

}  // namespace kvroute::doctor::detail
