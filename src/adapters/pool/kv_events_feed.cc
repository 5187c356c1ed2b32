#include "adapters/pool/kv_events_feed.h"

#include <chrono>
#include <cmath>
#include <vector>

#include "core/metrics/prom_writer.h"

namespace kvroute::pool {

namespace {

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "kv@10.0.0.7@meta-llama/..." -> "10.0.0.7"; "" when the topic does not have that shape.
std::string_view TopicHost(std::string_view topic) {
  if (topic.substr(0, 3) != "kv@") return {};
  topic.remove_prefix(3);
  const size_t at = topic.find('@');
  return at == std::string_view::npos ? std::string_view() : topic.substr(0, at);
}

}  // namespace

KvEventsFeed::KvEventsFeed(routing::RoutingCore& core, std::function<double()> now,
                           std::function<void(std::string_view)> log)
    : core_(core), now_(std::move(now)), log_(std::move(log)) {
  bound_.store(std::make_shared<const Bound>());
}

KvEventsFeed::~KvEventsFeed() { Stop(); }

void KvEventsFeed::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (sub_) sub_->Stop();
  std::lock_guard<std::mutex> mlock(metrics_mu_);
  sources_.clear();
  bound_url_.clear();
}

void KvEventsFeed::OnReport(uint32_t id, const kvevents::Report& r, std::atomic<double>* lag) {
  const double now = now_();
  switch (r.kind) {
    case kvevents::ReportKind::kBatch:
    case kvevents::ReportKind::kReplayed:
      if (lag != nullptr && r.kind == kvevents::ReportKind::kBatch && std::isfinite(r.batch.ts) &&
          r.batch.ts > 0) {
        lag->store(WallSeconds() - r.batch.ts, std::memory_order_relaxed);
      }
      core_.OnKvEvents(id, r.batch, now);
      break;
    case kvevents::ReportKind::kGap:
      core_.OnKvEventsGap(id, r.repaired, now);
      break;
    case kvevents::ReportKind::kRestart:
      core_.OnKvEventsRestart(id, now);
      break;
    case kvevents::ReportKind::kDecodeError:
      core_.OnKvEventsDecodeError(id, now);
      break;
  }
}

void KvEventsFeed::OnBoundReport(const kvevents::Report& r) {
  auto bound = bound_.load();
  auto it = bound->by_host.find(std::string(TopicHost(r.topic)));
  if (it == bound->by_host.end()) return;  // a publisher that is not in the pool
  auto lag = bound->lag_s.find(it->second);
  OnReport(it->second, r, lag == bound->lag_s.end() ? nullptr : lag->second.get());
}

void KvEventsFeed::Sync(const config::KvEventsConfig& config) {
  std::lock_guard<std::mutex> lock(mu_);
  auto table = core_.table();
  // What the table asks for.
  std::map<std::string, Source> want;
  auto bound = std::make_shared<Bound>();
  for (const auto& ep : table->by_id) {
    if (!ep || ep->spec.kv_events.empty()) continue;
    if (!config.bind.empty() && ep->spec.kv_events == config.bind) {
      bound->by_host[ep->spec.host] = ep->id;
      bound->names[ep->id] = ep->spec.name;
      bound->lag_s[ep->id] = std::make_shared<std::atomic<double>>(std::nan(""));
      continue;
    }
    Source s;
    s.id = ep->id;
    s.url = ep->spec.kv_events;
    s.replay = ep->spec.kv_events_replay;
    s.name = ep->spec.name;
    want.emplace(ep->spec.address, std::move(s));
  }
  const bool any = !want.empty() || !bound->by_host.empty();
  if (!sub_ && !any) return;
  if (!sub_) {
    kvevents::SubscriberOptions o;
    o.replay_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.001, config.replay_timeout_s) * 1000));
    sub_ = std::make_unique<kvevents::Subscriber>(o);
  }
  std::vector<std::string> lines;
  std::map<std::string, Source> next;
  // Removed or changed sources first.
  for (auto& [address, s] : sources_) {
    auto w = want.find(address);
    if (w != want.end() && w->second.url == s.url && w->second.replay == s.replay && w->second.id == s.id) {
      s.name = w->second.name;
      next.emplace(address, std::move(s));
      want.erase(w);
      continue;
    }
    (void)sub_->Remove(address);
    lines.push_back("kv events: stopped following " + s.name + " (" + s.url + ")");
  }
  for (auto& [address, s] : want) {
    s.lag_s = std::make_shared<std::atomic<double>>(std::nan(""));
    std::atomic<double>* lag = s.lag_s.get();
    const uint32_t id = s.id;
    Status st = sub_->AddEndpoint(address, s.url, s.replay,
                                  [this, id, lag](const kvevents::Report& r) { OnReport(id, r, lag); });
    if (!st.ok()) {
      lines.push_back("kv events: cannot follow " + s.name + " at " + s.url + ": " + st.message() +
                      "; its prefix scores use the approximate model");
      continue;
    }
    lines.push_back("kv events: following " + s.name + " at " + s.url +
                    (s.replay.empty() ? std::string(" (no replay)") : " (replay " + s.replay + ")"));
    next.emplace(address, std::move(s));
  }
  // The centralized socket.
  const std::string bind_url = bound->by_host.empty() ? std::string() : config.bind;
  bound_.store(std::move(bound));
  if (bind_url != bound_url_) {
    if (!bound_url_.empty()) {
      (void)sub_->Remove("kv-bind");
      lines.push_back("kv events: closed " + bound_url_);
    }
    bound_url_.clear();
    if (!bind_url.empty()) {
      Result<std::string> bound_at =
          sub_->AddBound("kv-bind", bind_url, [this](const kvevents::Report& r) { OnBoundReport(r); });
      if (bound_at.ok()) {
        bound_url_ = bind_url;
        lines.push_back("kv events: replicas publish to " + bound_at.value() + " (topics kv@<host>@<model>)");
      } else {
        lines.push_back("kv events: cannot bind " + bind_url + ": " + bound_at.status().message() +
                        "; prefix scores use the approximate model");
      }
    }
  }
  {
    std::lock_guard<std::mutex> mlock(metrics_mu_);
    sources_ = std::move(next);
  }
  if (log_) {
    for (const auto& l : lines) log_(l);
  }
}

void KvEventsFeed::AppendMetrics(std::string& out) const {
  using metrics::AppendHeader;
  using metrics::AppendSample;
  using metrics::Label;
  using metrics::MetricType;
  struct Row {
    std::string name;
    kvevents::SubscriberCounters c;
    double lag;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    if (!sub_) return;
    for (const auto& [address, s] : sources_) {
      std::optional<kvevents::SubscriberCounters> c = sub_->Counters(address);
      if (c) rows.push_back({s.name, *c, s.lag_s->load(std::memory_order_relaxed)});
    }
    if (!bound_url_.empty()) {
      std::optional<kvevents::SubscriberCounters> c = sub_->Counters("kv-bind");
      auto bound = bound_.load();
      for (const auto& [id, name] : bound->names) {
        auto lag = bound->lag_s.find(id);
        // The bound socket's transport counters are one set for every publisher: shown once,
        // under the bind address; lag per endpoint.
        rows.push_back({name, {}, lag == bound->lag_s.end() ? std::nan("") : lag->second->load()});
      }
      if (c) rows.push_back({bound_url_, *c, std::nan("")});
    }
  }
  if (rows.empty()) return;
  auto family = [&](std::string_view name, std::string_view help, MetricType type, auto value) {
    AppendHeader(out, name, help, type);
    for (const Row& r : rows) {
      Label labels[] = {{"endpoint", r.name}};
      AppendSample(out, name, labels, value(r));
    }
  };
  family("kvroute_kv_events_replays_total", "Replay requests sent to the endpoint's replay socket.",
         MetricType::kCounter, [](const Row& r) { return static_cast<double>(r.c.replay_requests); });
  family("kvroute_kv_events_replayed_batches_total", "Batches received from replays.",
         MetricType::kCounter, [](const Row& r) { return static_cast<double>(r.c.replayed); });
  family("kvroute_kv_events_duplicates_total", "Batches received twice (after a replay), dropped.",
         MetricType::kCounter, [](const Row& r) { return static_cast<double>(r.c.duplicates); });
  family("kvroute_kv_events_unknown_events_total", "Events of a type this router does not know, skipped.",
         MetricType::kCounter, [](const Row& r) { return static_cast<double>(r.c.events_unknown); });
  family("kvroute_kv_events_lag_seconds",
         "Receive time minus the publisher's batch timestamp for the last live batch (wall "
         "clocks: includes their skew); NaN before one.",
         MetricType::kGauge, [](const Row& r) { return r.lag; });
}

}  // namespace kvroute::pool
