#include "core/sched/profile_scheduler.h"

#include <algorithm>

#include "core/sched/plugins/max_score_picker/max_score_picker.h"

namespace kvroute::sched {

size_t ProfileScheduler::CountPlugins(const Parts& p) {
  return p.filters.size() + p.scorers.size() + 1 + p.others.size();
}

ProfileScheduler::ProfileScheduler(Parts parts, const SchedulerOptions& options)
    : SchedulerBase(options, CountPlugins(parts)),
      policy_(std::move(parts.policy)),
      filters_(std::move(parts.filters)),
      scorers_(std::move(parts.scorers)),
      picker_(std::move(parts.picker)),
      others_(std::move(parts.others)),
      inflight_adjustment_(parts.inflight_adjustment) {
  if (!picker_) {
    picker_ = MakeMaxScorePicker();
    picker_->type_ = picker_->name_ = "max-score-picker";
  }
  for (auto& f : filters_) all_.push_back(f.get());
  for (auto& s : scorers_) all_.push_back(s.scorer.get());
  all_.push_back(picker_.get());
  for (auto& o : others_) all_.push_back(o.get());
  for (size_t i = 0; i < all_.size(); ++i) all_[i]->index_ = i;
  // What the plugins declare (roles, consumed fields) is read here, once; picks use the
  // results.
  for (Plugin* p : all_) consumed_fields_ |= p->consumed_fields();
  for (auto& s : scorers_) {
    const ScorerRole role = s.scorer->role();
    scorer_names_.push_back(s.scorer->name());
    weights_.push_back(s.weight);
    // The first prefix row is the one pickers read (PickContext::prefix_row); its scorer's
    // model answers the prefix probe and PrefixEntries when it is the built-in one.
    if (role == ScorerRole::kPrefix &&
        std::find(scorer_roles_.begin(), scorer_roles_.end(), role) == scorer_roles_.end()) {
      prefix_ = dynamic_cast<const PrefixCacheScorer*>(s.scorer.get());
    }
    scorer_roles_.push_back(role);
  }
  for (auto& f : filters_) {
    // By class: a locality-filter needs the router's region, round trips and commits.
    auto* l = dynamic_cast<LocalityFilter*>(f.get());
    if (l == nullptr) continue;
    l->Configure(options.region, options.region_rtt_s);
    localities_.push_back(l);
  }
}

RequestHandle ProfileScheduler::Commit(PickScratch& scratch,
                                       std::span<const EndpointState> endpoints) {
  const RequestHandle h = SchedulerBase::Commit(scratch, endpoints);
  for (LocalityFilter* l : localities_) l->OnCommit(scratch, endpoints);
  return h;
}

void ProfileScheduler::SetRegionRtt(std::string_view region, double seconds) {
  for (LocalityFilter* l : localities_) l->SetRegionRtt(region, seconds);
}

LocalityStats ProfileScheduler::locality_stats() const {
  return localities_.empty() ? LocalityStats{} : localities_.front()->stats();
}

namespace {
// Moves the candidate at endpoint position `pinned` to the front of `order` (inserting it
// when the picker's top-k left it out), when it is still a candidate.
void PinFirst(PickScratch& sc, size_t max_ranked) {
  const auto c = std::find(sc.candidates.begin(), sc.candidates.end(), sc.pinned);
  if (c == sc.candidates.end()) return;
  const uint32_t idx = static_cast<uint32_t>(c - sc.candidates.begin());
  auto it = std::find(sc.order.begin(), sc.order.end(), idx);
  if (it == sc.order.end()) {
    sc.order.insert(sc.order.begin(), idx);
    if (max_ranked > 0 && sc.order.size() > max_ranked) sc.order.pop_back();
  } else {
    std::rotate(sc.order.begin(), it, it + 1);
  }
}
}  // namespace

void ProfileScheduler::PrefixKey(const SchedRequest& req, std::vector<uint64_t>& out) const {
  out.clear();
  if (prefix_ == nullptr) return;
  const PrefixCacheScorer::Params& p = prefix_->params();
  HashPromptBlocks(req.model, req.cache_salt, req.prompt, p.block_chars, p.max_blocks, out);
}

void ProfileScheduler::AdoptPolicyState(SchedulerBase& previous) {
  auto* prev = dynamic_cast<ProfileScheduler*>(&previous);
  if (prev == nullptr) return;
  auto count_type = [](const std::vector<Plugin*>& v, const std::string& type) {
    return std::count_if(v.begin(), v.end(), [&](Plugin* p) { return p->type() == type; });
  };
  for (Plugin* mine : all_) {
    Plugin* match = nullptr;
    for (Plugin* old : prev->all_) {
      if (old->type() == mine->type() && old->name() == mine->name()) match = old;
    }
    if (match == nullptr && count_type(all_, mine->type()) == 1 &&
        count_type(prev->all_, mine->type()) == 1) {
      for (Plugin* old : prev->all_) {
        if (old->type() == mine->type()) match = old;
      }
    }
    if (match != nullptr) mine->AdoptStateFrom(*match);
  }
}

PickResult ProfileScheduler::Pick(const SchedRequest& req,
                                  std::span<const EndpointState> endpoints, double now_s) {
  PickResult r = Rank(req, endpoints, now_s, own_);
  if (r.ok()) r.handle = Commit(own_, endpoints);
  return r;
}

PickResult ProfileScheduler::Rank(const SchedRequest& req,
                                  std::span<const EndpointState> endpoints, double now_s,
                                  PickScratch& sc) {
  sc.now_s = now_s;
  sc.locality = Locality::kOff;
  sc.pinned = PickScratch::kNoPin;
  sc.candidates.clear();
  for (uint32_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].healthy) sc.candidates.push_back(i);
  }
  if (sc.candidates.empty()) return Fail(PickStatus::kNoHealthyEndpoint);

  FillPending(sc.pending, req);
  ComputeLoads(sc, endpoints, inflight_adjustment_);
  PickContext ctx;
  ctx.request = &req;
  ctx.now_s = now_s;
  ctx.endpoints = endpoints;
  ctx.loads = sc.loads;
  ctx.inflight = &tracker_;
  ctx.pending = &sc.pending;
  ctx.rng = &sc.rng;
  ctx.scratch = &sc;
  for (size_t s = 0; s < scorer_roles_.size(); ++s) {
    if (scorer_roles_[s] == Scheduler::ScorerRole::kPrefix) {
      ctx.prefix_row = static_cast<int>(s);
      break;
    }
  }

  // Each plugin call timed when a clock is set: one read between consecutive calls (each
  // call's time runs from the previous read to the next), and a few atomics per call.
  const std::function<double()>* timer = timer_ != nullptr && *timer_ ? timer_ : nullptr;
  double mark = timer ? (*timer)() : 0.0;
  auto lap = [&](Plugin& p) {
    if (timer == nullptr) return;
    const double t = (*timer)();
    p.timing().Observe(t - mark);
    mark = t;
  };
  for (auto& f : filters_) {
    f->Apply(ctx, sc.candidates);
    lap(*f);
    if (sc.candidates.empty()) return Fail(PickStatus::kAllFiltered);
  }

  const size_t n = sc.candidates.size();
  sc.scores.resize(scorers_.size() * n);
  sc.totals.assign(n, 0.0);
  for (size_t s = 0; s < scorers_.size(); ++s) {
    scorers_[s].scorer->Score(ctx, sc.candidates, std::span<double>(sc.scores.data() + s * n, n));
    lap(*scorers_[s].scorer);
  }
  // The weighted sum, in scorer order (outside the timed calls).
  for (size_t s = 0; s < scorers_.size(); ++s) {
    std::span<double> row(sc.scores.data() + s * n, n);
    const double w = scorers_[s].weight;
    for (size_t c = 0; c < n; ++c) {
      // NaN (a scorer's 0/0) counts as 0 rather than poisoning the sum.
      double v = row[c] == row[c] ? std::clamp(row[c], 0.0, 1.0) : 0.0;
      row[c] = v;
      sc.totals[c] += w * v;
    }
  }
  if (timer) mark = (*timer)();
  picker_->Rank(ctx, sc.candidates, sc.totals, options_.max_ranked, sc.order);
  lap(*picker_);
  if (sc.pinned != PickScratch::kNoPin) PinFirst(sc, options_.max_ranked);
  return Finish(sc, endpoints);
}

void ProfileScheduler::TimedPlugins(std::vector<TimedPlugin>& out) const {
  for (const auto& f : filters_) out.push_back({"Filter", f.get()});
  for (const auto& s : scorers_) out.push_back({"Scorer", s.scorer.get()});
  out.push_back({"Picker", picker_.get()});
}

double ProfileScheduler::OnRequestDispatched(PendingRequest& p, uint32_t endpoint_id,
                                             const EndpointState& e, double now_s) {
  // The plugins record the prompt there and say how much of it was already held (one
  // walk of the chain instead of a lookup and then a record).
  int64_t cached_chars = 0;
  for (Plugin* pl : all_) cached_chars = std::max(cached_chars, pl->OnDispatched(p, e, now_s));
  return EstimateBlocks(p, e, cached_chars);
}

void ProfileScheduler::OnEndpointRemoved(uint32_t endpoint_id) {
  for (Plugin* pl : all_) pl->OnEndpointRemoved(endpoint_id);
  tracker_.ResetEndpoint(endpoint_id);
}

}  // namespace kvroute::sched
