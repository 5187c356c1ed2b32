#include "core/routing/kv_event_input.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>

#include "core/metrics/prom_writer.h"

namespace kvroute::routing {

namespace {

void Bump(std::atomic<uint64_t>& a, uint64_t n = 1) { a.fetch_add(n, std::memory_order_relaxed); }
double GetU(const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); }

}  // namespace

KvEventInput::KvEventInput() : index_(std::make_unique<kvevents::EventIndex>()) {}
KvEventInput::~KvEventInput() = default;

void KvEventInput::Configure(const kvevents::IndexOptions& options, const EndpointTable& table,
                             const EndpointTable& old_table, double now_s,
                             std::vector<std::string>& logs) {
  std::unique_lock<RwSpinLock> lock(mu_);
  index_->SetOptions(options);
  const std::size_t n = std::max(table.by_id.size(), old_table.by_id.size());
  for (uint32_t id = 0; id < n; ++id) {
    const Endpoint* ep = table.Find(id);
    const Endpoint* prev = old_table.Find(id);
    if (prev && (!ep || prev->spec.address != ep->spec.address)) index_->Forget(id);
    if (ep && !ep->spec.kv_events.empty()) {
      index_->Expect(id, now_s);
    } else {
      index_->Forget(id);
    }
  }
  active_.store(index_->active(), std::memory_order_relaxed);
  std::vector<kvevents::StateTransition> transitions;
  index_->DrainTransitions(&transitions);
  for (const auto& t : transitions) {
    if (t.to != kvevents::SourceState::kUnknown && t.to != kvevents::SourceState::kOff) {
      logs.push_back(TransitionLine(table, t));
    }
  }
}

std::string KvEventInput::TransitionLine(const EndpointTable& table, const kvevents::StateTransition& t) {
  const Endpoint* ep = table.Find(t.endpoint);
  std::string name = ep ? ep->spec.name : "#" + std::to_string(t.endpoint);
  std::string line = "endpoint " + name + " KV events: " + std::string(kvevents::SourceStateName(t.from)) +
                     " -> " + std::string(kvevents::SourceStateName(t.to)) + " (" + std::string(t.reason) + ")";
  if (t.to != kvevents::SourceState::kLive) line += "; its prefix scores use the approximate model";
  return line;
}

template <typename F>
void KvEventInput::With(F&& f, const EndpointTable& table, const LogFn& log) {
  std::vector<kvevents::StateTransition> transitions;
  {
    std::unique_lock<RwSpinLock> lock(mu_);
    f(*index_);
    index_->DrainTransitions(&transitions);
  }
  if (!log) return;
  for (const auto& t : transitions) log(TransitionLine(table, t));
}

void KvEventInput::Apply(uint32_t id, const kvevents::KvEventBatch& batch, double now_s,
                         const EndpointTable& table, const LogFn& log) {
  With([&](kvevents::EventIndex& x) { x.ApplyBatch(id, batch, now_s); }, table, log);
}

void KvEventInput::Gap(uint32_t id, bool repaired, double now_s, const EndpointTable& table,
                       const LogFn& log) {
  With([&](kvevents::EventIndex& x) { x.OnGap(id, repaired, now_s); }, table, log);
}

void KvEventInput::Restart(uint32_t id, double now_s, const EndpointTable& table, const LogFn& log) {
  With([&](kvevents::EventIndex& x) { x.OnRestart(id, now_s); }, table, log);
}

void KvEventInput::DecodeError(uint32_t id, double now_s, const EndpointTable& table, const LogFn& log) {
  With([&](kvevents::EventIndex& x) { x.OnDecodeError(id, now_s); }, table, log);
}

void KvEventInput::Tick(double now_s, const EndpointTable& table, std::vector<std::string>* logs) {
  std::vector<kvevents::StateTransition> transitions;
  {
    std::unique_lock<RwSpinLock> lock(mu_);
    index_->Tick(now_s);
    index_->DrainTransitions(&transitions);
  }
  for (const auto& t : transitions) {
    if (logs) logs->push_back(TransitionLine(table, t));
  }
}

const kvevents::EventIndex* KvEventInput::KeysForPick(std::shared_lock<RwSpinLock>& lock,
                                                      std::string_view root,
                                                      std::span<const uint32_t> token_ids,
                                                      std::vector<uint64_t>* keys) {
  lock.lock();
  index_->RequestKeys(root, token_ids, keys);
  return index_.get();
}

int64_t KvEventInput::OnDispatched(std::span<const uint64_t> keys, std::size_t prompt_tokens,
                                   uint32_t first, double now_s) {
  int64_t predicted = -1;
  std::unique_lock<RwSpinLock> lock(mu_);
  const uint32_t held = index_->MatchOne(keys, first, now_s);
  if (index_->Usable(first, now_s)) {
    // The engine computes a prompt's last token even when all of it is cached.
    const int64_t bt = index_->options().block_tokens;
    const int64_t n = static_cast<int64_t>(prompt_tokens);
    predicted = std::min<int64_t>(held * bt, (n - 1) / bt * bt);
  }
  if (held < keys.size()) index_->OnWorkDispatched(first, now_s);
  index_->AddSpeculative(first, keys, now_s);
  return predicted;
}

void KvEventInput::OnRouteReceipt(int64_t predicted, int64_t reported, int64_t block_tokens) {
  if (predicted < 0) return;
  Receipts& r = receipts_;
  if (reported < 0) {
    Bump(r.unreported);
    return;
  }
  const int64_t block = std::max<int64_t>(1, block_tokens);
  const uint64_t err = static_cast<uint64_t>(reported > predicted ? reported - predicted : predicted - reported);
  Bump(r.receipts);
  if (static_cast<int64_t>(err) > block) Bump(r.mispredicted);
  if (predicted > reported) Bump(r.over);
  if (predicted < reported) Bump(r.under);
  const std::size_t i = std::lower_bound(Receipts::kBounds.begin(), Receipts::kBounds.end(),
                                         static_cast<double>(err)) - Receipts::kBounds.begin();
  Bump(r.abs_error[i]);
  Bump(r.abs_error_sum, err);
  Bump(r.predicted_sum, static_cast<uint64_t>(predicted));
  Bump(r.reported_sum, static_cast<uint64_t>(reported));
}

kvevents::EndpointEventStats KvEventInput::Stats(uint32_t id, double now_s) const {
  std::shared_lock<RwSpinLock> lock(mu_);
  return index_->Stats(id, now_s);
}

void KvEventInput::AppendMetrics(std::string& out, const EndpointTable& table, double now_s) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  std::vector<std::pair<const Endpoint*, kvevents::EndpointEventStats>> rows;
  size_t speculative = 0;
  {
    std::shared_lock<RwSpinLock> lock(mu_);
    for (const auto& ep : table.by_id) {
      if (!ep || ep->spec.kv_events.empty()) continue;
      rows.emplace_back(ep.get(), index_->Stats(ep->id, now_s));
    }
    speculative = index_->SpeculativeEntries();
  }
  AppendHeader(out, "kvroute_kv_events_state",
               "1 on the endpoint's KV-event state: unknown (never heard from), live (its "
               "prefix scores come from its events), stale (work dispatched, no events since), "
               "resync (entries dropped after a gap, an undecodable batch or an overflow), "
               "mismatch (engine block size not a multiple of the index's). Every state but "
               "live uses the approximate model.",
               MetricType::kGauge);
  for (const auto& [ep, st] : rows) {
    for (size_t k = 1; k < kvevents::kSourceStates; ++k) {
      const auto state = static_cast<kvevents::SourceState>(k);
      Label labels[] = {{"endpoint", ep->spec.name}, {"state", kvevents::SourceStateName(state)}};
      AppendSample(out, "kvroute_kv_events_state", labels, st.state == state ? 1.0 : 0.0);
    }
  }
  auto family = [&](std::string_view name, std::string_view help, MetricType type, auto value) {
    AppendHeader(out, name, help, type);
    for (const auto& [ep, st] : rows) {
      Label labels[] = {{"endpoint", ep->spec.name}};
      AppendSample(out, name, labels, value(st));
    }
  };
  using Stats = kvevents::EndpointEventStats;
  family("kvroute_kv_events_batches_total", "Event batches applied to the precise index.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.batches); });
  AppendHeader(out, "kvroute_kv_events_events_total", "Events applied, by type.", MetricType::kCounter);
  for (const auto& [ep, st] : rows) {
    const std::pair<std::string_view, uint64_t> types[] = {
        {"BlockStored", st.stored}, {"BlockRemoved", st.removed}, {"AllBlocksCleared", st.cleared}};
    for (const auto& [type, n] : types) {
      Label labels[] = {{"endpoint", ep->spec.name}, {"type", type}};
      AppendSample(out, "kvroute_kv_events_events_total", labels, static_cast<double>(n));
    }
  }
  family("kvroute_kv_events_gaps_total", "Gaps in the event sequence (replayed or not).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.gaps); });
  family("kvroute_kv_events_gaps_unrepaired_total",
         "Gaps replay could not fill: the endpoint's entries were dropped and it resyncs.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.gaps_unrepaired); });
  family("kvroute_kv_events_restarts_total",
         "Publisher restarts (the sequence went back): the endpoint's entries were dropped.",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.restarts); });
  family("kvroute_kv_events_decode_errors_total",
         "Batches or events that could not be decoded or were malformed.", MetricType::kCounter,
         [](const Stats& st) { return static_cast<double>(st.decode_errors); });
  family("kvroute_kv_events_orphans_total",
         "Stored blocks dropped because their parent block was never seen.", MetricType::kCounter,
         [](const Stats& st) { return static_cast<double>(st.orphans); });
  family("kvroute_kv_events_block_size_mismatches_total",
         "Stored runs whose block size is not a multiple of the index's (pool.kv_events.block_size).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.mismatches); });
  family("kvroute_kv_events_overflows_total",
         "Times the endpoint exceeded the index's per-endpoint bound (entries dropped).",
         MetricType::kCounter, [](const Stats& st) { return static_cast<double>(st.overflows); });
  family("kvroute_kv_events_blocks", "Engine blocks the endpoint reports cached (indexed now).",
         MetricType::kGauge, [](const Stats& st) { return static_cast<double>(st.blocks); });
  family("kvroute_kv_events_engine_block_size",
         "Block size (tokens) in the endpoint's last stored run; NaN before one.", MetricType::kGauge,
         [](const Stats& st) {
           return st.block_size > 0 ? static_cast<double>(st.block_size) : std::nan("");
         });
  family("kvroute_kv_events_last_batch_age_seconds",
         "Seconds since the endpoint's last batch was applied; NaN when none arrived.",
         MetricType::kGauge, [&](const Stats& st) {
           return st.last_batch_s >= 0 ? now_s - st.last_batch_s : std::nan("");
         });
  AppendReceiptMetrics(out);
  metrics::AppendGauge(out, "kvroute_kv_events_speculative_entries",
                       "Speculative prefix entries (just-dispatched requests awaiting their events).",
                       {}, static_cast<double>(speculative));
}

void KvEventInput::AppendReceiptMetrics(std::string& out) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  metrics::AppendCounter(out, "kvroute_route_receipts_total",
                         "Answers whose engine reported its cached prompt tokens, for picks that "
                         "predicted them from KV events (route receipts).", {}, GetU(receipts_.receipts));
  metrics::AppendCounter(out, "kvroute_route_receipts_mispredicted_total",
                         "Route receipts where predicted and reported cached tokens differ by "
                         "more than one block of the index.", {}, GetU(receipts_.mispredicted));
  metrics::AppendCounter(out, "kvroute_route_receipts_unreported_total",
                         "Answers to picks with a prediction that carried no cached-token count "
                         "(the engine runs without --enable-prompt-tokens-details).",
                         {}, GetU(receipts_.unreported));
  {
    Label over[] = {{"direction", "over"}};
    Label under[] = {{"direction", "under"}};
    AppendHeader(out, "kvroute_route_receipts_off_total",
                 "Route receipts where the prediction was above (over) or below (under) what "
                 "the engine reported.", MetricType::kCounter);
    AppendSample(out, "kvroute_route_receipts_off_total", over, GetU(receipts_.over));
    AppendSample(out, "kvroute_route_receipts_off_total", under, GetU(receipts_.under));
  }
  metrics::AppendCounter(out, "kvroute_route_receipts_predicted_tokens_total",
                         "Cached prompt tokens predicted, over route receipts.", {}, GetU(receipts_.predicted_sum));
  metrics::AppendCounter(out, "kvroute_route_receipts_reported_tokens_total",
                         "Cached prompt tokens the engines reported, over route receipts.", {},
                         GetU(receipts_.reported_sum));
  AppendHeader(out, "kvroute_route_receipt_error_tokens",
               "|reported - predicted| cached prompt tokens per route receipt.", MetricType::kHistogram);
  {
    std::array<uint64_t, Receipts::kBounds.size() + 1> counts;
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = receipts_.abs_error[i].load(std::memory_order_relaxed);
    metrics::AppendHistogramSeries(out, "kvroute_route_receipt_error_tokens", {}, Receipts::kBounds,
                                   counts, GetU(receipts_.abs_error_sum));
  }
}

}  // namespace kvroute::routing
