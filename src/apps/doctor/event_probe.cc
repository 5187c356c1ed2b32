#include "apps/doctor/event_probe.h"

#include <algorithm>

#include "adapters/kvevents/subscriber.h"

namespace kvroute::doctor {

EventsProbe::EventsProbe(std::chrono::steady_clock::time_point origin, std::size_t replicas)
    : origin_(origin), seen_(replicas) {}

EventsProbe::~EventsProbe() { Stop(); }

void EventsProbe::Listen(std::size_t index, const std::string& name, const std::string& url) {
  {
    std::lock_guard lock(mu_);
    if (index >= seen_.size()) return;
    seen_[index] = EventProbe{};
    seen_[index]->address = url;
    if (!sub_) sub_ = std::make_unique<kvevents::Subscriber>();
  }
  Status st = sub_->AddEndpoint(
      name + "#" + std::to_string(index), url, "", [this, index](const kvevents::Report& r) {
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_)
                             .count();
        std::lock_guard lock(mu_);
        EventProbe& p = *seen_[index];
        if (r.kind == kvevents::ReportKind::kDecodeError) {
          ++p.decode_errors;
          return;
        }
        if (r.kind != kvevents::ReportKind::kBatch && r.kind != kvevents::ReportKind::kReplayed) {
          return;
        }
        EventBatchSeen b;
        b.t_s = t;
        for (const kvevents::KvEvent& e : r.batch.events) {
          if (e.kind != kvevents::EventKind::kBlockStored) continue;
          if (std::find(b.block_sizes.begin(), b.block_sizes.end(), e.block_size) ==
              b.block_sizes.end()) {
            b.block_sizes.push_back(e.block_size);
          }
        }
        p.batches.push_back(std::move(b));
      });
  if (!st.ok()) {
    std::lock_guard lock(mu_);
    seen_[index]->error = st.message();
  }
}

bool EventsProbe::any() const {
  std::lock_guard lock(mu_);
  return std::any_of(seen_.begin(), seen_.end(), [](const auto& p) { return p.has_value(); });
}

std::vector<std::optional<EventProbe>> EventsProbe::Snapshot(std::optional<double> since_s) {
  std::lock_guard lock(mu_);
  if (since_s) {
    for (std::optional<EventProbe>& p : seen_) {
      if (!p) continue;
      auto keep = std::find_if(p->batches.begin(), p->batches.end(),
                               [&](const EventBatchSeen& b) { return b.t_s >= *since_s; });
      p->batches.erase(p->batches.begin(), keep);
    }
  }
  return seen_;
}

void EventsProbe::Stop() {
  std::unique_ptr<kvevents::Subscriber> sub;
  {
    std::lock_guard lock(mu_);
    sub = std::move(sub_);
  }
  if (sub) sub->Stop();  // joins the thread: no callback runs after this
}

}  // namespace kvroute::doctor
