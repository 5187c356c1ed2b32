#include "adapters/pool/kubernetes_discovery.h"

#include <boost/asio/post.hpp>
#include <array>
#include <atomic>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <set>

#include "adapters/k8s/objects/objective_watch_state.h"
#include "adapters/k8s/objects/objects.h"
#include "adapters/k8s/objects/pool_watch_state.h"
#include "adapters/k8s/list_watch.h"
#include "core/metrics/prom_writer.h"

namespace kvroute::pool {

namespace net = boost::asio;

std::string PercentEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() + 8);
  for (unsigned char c : s) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '.' || c == '_' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

namespace {

// The collections followed; index into the per-resource counters.
enum Resource : size_t { kPoolRes, kPodsRes, kObjLlmD, kObjXK8s, kResources };

constexpr std::array<std::string_view, kResources> kResourceNames = {
    "inferencepools", "pods", "inferenceobjectives", "inferenceobjectives"};

constexpr size_t kEventTypes = 5;  // WatchEventType values

size_t EventIndex(k8s::WatchEventType t) { return static_cast<size_t>(t); }

std::string FormatDelay(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

struct KubernetesDiscovery::Impl : std::enable_shared_from_this<KubernetesDiscovery::Impl> {
  Impl(net::io_context& c, k8s::ClusterAccess access, KubernetesDiscoveryOptions o, Callbacks cb)
      : ctx(c),
        options(std::move(o)),
        callbacks(std::move(cb)),
        client(c, std::move(access), options.client),
        pool_state(options.pool_name),
        obj_llmd(options.pool_name),
        obj_xk8s(options.pool_name) {
    pool_version = options.group + "/v1alpha2" == k8s::kPoolApiV1Alpha2 ? "v1alpha2" : "v1";
    pool_collection = "/apis/" + options.group + "/" + pool_version + "/namespaces/" +
                      options.namespace_name + "/inferencepools";
    groups[kPoolRes] = options.group;
    groups[kObjLlmD] = std::string(k8s::kObjectiveGroupLlmD);
    groups[kObjXK8s] = std::string(k8s::kObjectiveGroupXK8s);
    SetStatus("InferencePool " + Where() + " not listed yet");
  }

  net::io_context& ctx;
  const KubernetesDiscoveryOptions options;
  Callbacks callbacks;
  k8s::ApiClient client;
  k8s::PoolWatchState pool_state;
  k8s::ObjectiveWatchState obj_llmd;
  k8s::ObjectiveWatchState obj_xk8s;
  std::string pool_version;
  std::string pool_collection;
  std::array<std::string, kResources> groups;  // "" for pods (the core group)
  std::array<bool, kResources> force_relist{};  // a 410 response head: relist next
  std::unique_ptr<k8s::ListWatch> watches[kResources];

  // Held by every handler of ours while it runs (they all run on ctx) and by Stop: once
  // Stop has set `stopped`, no handler delivers anything.
  // Recursive: a handler of the pool's watch kicks the pods' ListWatch, which asks for
  // its targets through handlers of its own.
  std::recursive_mutex mu;
  bool stopped = false;
  bool started = false;

  mutable std::mutex status_mu;
  std::string status_text;  // guarded by status_mu

  // Metrics (read by any thread).
  std::array<std::array<std::array<std::atomic<uint64_t>, k8s::kApiErrorKinds>, 2>, kResources> failures{};
  std::array<std::array<std::atomic<uint64_t>, kEventTypes>, kResources> events{};
  std::array<std::atomic<uint64_t>, kResources> lists{};
  std::array<std::atomic<uint64_t>, kResources> relists{};
  std::atomic<bool> pool_found{false};
  std::atomic<uint64_t> pods_known{0};
  std::atomic<uint64_t> endpoints{0};
  std::atomic<uint64_t> objectives{0};
  std::atomic<uint64_t> endpoint_updates{0};

  std::string Where() const { return options.namespace_name + "/" + options.pool_name; }

  void SetStatus(std::string s) {
    std::lock_guard<std::mutex> lock(status_mu);
    status_text = std::move(s);
  }

  void Log(const std::string& line) {
    if (callbacks.log) callbacks.log("kubernetes: " + line);
  }

  std::string ObjectiveCollection(Resource r) const {
    return "/apis/" + groups[r] + "/v1alpha2/namespaces/" + options.namespace_name +
           "/inferenceobjectives";
  }

  std::string PodsCollection() const { return "/api/v1/namespaces/" + options.namespace_name + "/pods"; }

  static std::string WatchQuery(const std::string& rv) {
    return "watch=1&resourceVersion=" + PercentEncode(rv) + "&allowWatchBookmarks=true";
  }

  std::string Describe(Resource r) const {
    switch (r) {
      case kPoolRes: return "InferencePool " + Where();
      case kPodsRes: return "pods in " + options.namespace_name;
      default: return "InferenceObjectives (" + groups[r] + ") in " + options.namespace_name;
    }
  }

  // ---- After every change of the pool or pods state.
  // `from`: the resource whose handler runs (the pods' own handler never kicks itself: its
  // ListWatch relists after a 410 when the watch ends).
  void AfterPoolOrPods(Resource from) {
    if (pool_state.pool()) {
      pool_found = true;
      SetStatus("");
    } else {
      pool_found = false;
    }
    pods_known = pool_state.pod_count();
    if (from != kPodsRes && pool_state.pods_relist_needed() && watches[kPodsRes]) {
      // A new pool or a changed selector: the pods known were selected by the old one.
      watches[kPodsRes]->Kick();
    }
    if (pool_state.endpoints_changed()) {
      std::vector<routing::EndpointSpec> eps = pool_state.TakeEndpoints();
      endpoints = eps.size();
      endpoint_updates.fetch_add(1, std::memory_order_relaxed);
      if (callbacks.on_endpoints) callbacks.on_endpoints(std::move(eps));
    }
  }

  void AfterObjectives() {
    if (!obj_llmd.changed() && !obj_xk8s.changed()) return;
    obj_llmd.TakePriorities();
    obj_xk8s.TakePriorities();
    Priorities merged = k8s::MergePriorities({}, obj_xk8s.priorities(), obj_llmd.priorities());
    objectives = merged.size();
    if (callbacks.on_objectives) callbacks.on_objectives(std::move(merged));
  }

  // ---- The ListWatch callbacks of one resource.
  k8s::ListWatch::Callbacks CallbacksFor(Resource r) {
    std::weak_ptr<Impl> weak = weak_from_this();
    // Runs `f` under mu unless stopped; the value of `fallback` otherwise.
    auto guard = [weak](auto f, auto fallback) {
      return [weak, f, fallback](auto&&... args) {
        auto self = weak.lock();
        if (!self) return fallback;
        std::lock_guard<std::recursive_mutex> lock(self->mu);
        if (self->stopped) return fallback;
        return f(*self, std::forward<decltype(args)>(args)...);
      };
    };
    k8s::ListWatch::Callbacks c;
    c.relist_needed = guard([r](Impl& s) { return s.RelistNeeded(r); }, false);
    c.list_target = guard([r](Impl& s) { return s.ListTarget(r); }, std::string());
    c.watch_target = guard([r](Impl& s) { return s.WatchTarget(r); }, std::string("/"));
    c.on_list = guard([r](Impl& s, k8s::ApiResult&& res) { return s.OnList(r, std::move(res)); },
                      Status::Ok());
    c.on_missing = guard([r](Impl& s, const k8s::ApiResult& res) { return s.OnMissing(r, res); }, true);
    c.on_line = guard([r](Impl& s, std::string_view line) { return s.OnLine(r, line); }, Status::Ok());
    c.on_failure = guard(
        [r](Impl& s, k8s::ListWatchPhase phase, const k8s::ApiResult& res, std::chrono::milliseconds d) {
          s.OnFailure(r, phase, res, d);
          return true;
        },
        true);
    return c;
  }

  bool RelistNeeded(Resource r) {
    if (force_relist[r]) return true;
    switch (r) {
      case kPoolRes: return pool_state.pool_relist_needed();
      case kPodsRes: return pool_state.pods_relist_needed();
      case kObjLlmD: return obj_llmd.relist_needed();
      default: return obj_xk8s.relist_needed();
    }
  }

  std::string ListTarget(Resource r) {
    switch (r) {
      case kPoolRes:
        return pool_collection + "?fieldSelector=" + PercentEncode("metadata.name=" + options.pool_name);
      case kPodsRes: {
        std::string sel = pool_state.PodLabelSelector();
        if (sel.empty()) return "";  // no pool: nothing to list
        return PodsCollection() + "?labelSelector=" + PercentEncode(sel);
      }
      default: return ObjectiveCollection(r);
    }
  }

  std::string WatchTarget(Resource r) {
    switch (r) {
      case kPoolRes:
        return pool_collection + "?fieldSelector=" + PercentEncode("metadata.name=" + options.pool_name) +
               "&" + WatchQuery(pool_state.pool_resource_version());
      case kPodsRes:
        return PodsCollection() + "?labelSelector=" + PercentEncode(pool_state.PodLabelSelector()) + "&" +
               WatchQuery(pool_state.pods_resource_version());
      case kObjLlmD: return ObjectiveCollection(r) + "?" + WatchQuery(obj_llmd.resource_version());
      default: return ObjectiveCollection(r) + "?" + WatchQuery(obj_xk8s.resource_version());
    }
  }

  Status OnList(Resource r, k8s::ApiResult&& res) {
    lists[r].fetch_add(1, std::memory_order_relaxed);
    switch (r) {
      case kPoolRes: {
        Result<k8s::InferencePoolList> list = k8s::DecodeInferencePoolList(res.body);
        if (!list.ok()) return Status::InvalidArgument("InferencePool list: " + list.status().message());
        std::optional<k8s::InferencePool> mine;
        for (k8s::InferencePool& p : list->items) {
          if (p.meta.name == options.pool_name) mine = std::move(p);
        }
        const bool was_found = pool_state.pool().has_value();
        const bool first = !listed_pool;
        listed_pool = true;
        pool_state.ApplyPoolList(std::move(mine), list->resource_version);
        force_relist[r] = false;
        if (!pool_state.pool()) {
          SetStatus("InferencePool " + Where() + " not found");
          if (was_found || first) {
            Log("InferencePool " + Where() + " not found (group " + options.group + "/" + pool_version +
                "): no endpoints until it is created; watching for it");
          }
        } else if (!was_found) {
          LogPool("found");
        }
        AfterPoolOrPods(kPoolRes);
        return Status::Ok();
      }
      case kPodsRes: {
        Result<k8s::PodList> list = k8s::DecodePodList(res.body);
        if (!list.ok()) return Status::InvalidArgument("pod list: " + list.status().message());
        pool_state.ApplyPodList(*list);
        force_relist[r] = false;
        AfterPoolOrPods(kPodsRes);
        return Status::Ok();
      }
      default: {
        Result<k8s::ObjectiveList> list = k8s::DecodeObjectiveList(res.body);
        if (!list.ok()) return Status::InvalidArgument("InferenceObjective list: " + list.status().message());
        (r == kObjLlmD ? obj_llmd : obj_xk8s).ApplyList(*list);
        force_relist[r] = false;
        AfterObjectives();
        return Status::Ok();
      }
    }
  }

  bool OnMissing(Resource r, const k8s::ApiResult&) {
    force_relist[r] = false;
    switch (r) {
      case kPoolRes:
        SetStatus("the InferencePool resource (" + options.group + "/" + pool_version +
                  ") is not served by the API server: is its CRD installed?");
        if (pool_state.pool() || !listed_pool) {
          pool_state.ApplyPoolMissing();
          AfterPoolOrPods(kPoolRes);
        }
        listed_pool = true;
        return true;
      case kPodsRes: return false;  // pods always exist: a 404 is a real failure
      default:
        (r == kObjLlmD ? obj_llmd : obj_xk8s).ApplyMissing();
        AfterObjectives();
        return true;
    }
  }

  Status OnLine(Resource r, std::string_view line) {
    Status st = ApplyLine(r, line);
    if (st.code() == StatusCode::kFailedPrecondition) Gone(r, k8s::ListWatchPhase::kWatch);
    return st;
  }

  Status ApplyLine(Resource r, std::string_view line) {
    switch (r) {
      case kPoolRes: {
        Result<k8s::PoolEvent> ev = k8s::DecodePoolEvent(line);
        if (!ev.ok()) return Status::InvalidArgument("InferencePool watch event: " + ev.status().message());
        events[r][EventIndex(ev->type)].fetch_add(1, std::memory_order_relaxed);
        const bool was_found = pool_state.pool().has_value();
        const auto old_ports = was_found ? pool_state.pool()->target_ports : std::vector<uint16_t>{};
        const std::string old_selector = pool_state.PodLabelSelector();
        Status st = pool_state.ApplyPoolEvent(*ev);
        if (pool_state.pool()) {
          if (!was_found) {
            LogPool("created");
          } else if (old_ports != pool_state.pool()->target_ports ||
                     old_selector != pool_state.PodLabelSelector()) {
            LogPool("changed");
          }
        } else if (was_found) {
          SetStatus("InferencePool " + Where() + " was deleted");
          Log("InferencePool " + Where() + " deleted: no endpoints until it is created again");
        }
        AfterPoolOrPods(kPoolRes);
        return st;
      }
      case kPodsRes: {
        Result<k8s::PodEvent> ev = k8s::DecodePodEvent(line);
        if (!ev.ok()) return Status::InvalidArgument("pod watch event: " + ev.status().message());
        events[r][EventIndex(ev->type)].fetch_add(1, std::memory_order_relaxed);
        Status st = pool_state.ApplyPodEvent(*ev);
        AfterPoolOrPods(kPodsRes);
        return st;
      }
      default: {
        Result<k8s::ObjectiveEvent> ev = k8s::DecodeObjectiveEvent(line);
        if (!ev.ok()) return Status::InvalidArgument("InferenceObjective watch event: " + ev.status().message());
        events[r][EventIndex(ev->type)].fetch_add(1, std::memory_order_relaxed);
        Status st = (r == kObjLlmD ? obj_llmd : obj_xk8s).ApplyEvent(*ev);
        AfterObjectives();
        return st;
      }
    }
  }

  void OnFailure(Resource r, k8s::ListWatchPhase phase, const k8s::ApiResult& res,
                 std::chrono::milliseconds delay) {
    failures[r][static_cast<size_t>(phase)][static_cast<size_t>(res.error)].fetch_add(
        1, std::memory_order_relaxed);
    std::string what = std::string(k8s::ListWatchPhaseName(phase)) + " " + Describe(r) + ": ";
    if (res.error == k8s::ApiError::kGone) {
      force_relist[r] = true;
      // An ERROR event line was counted by OnLine; a 410 response head is counted here.
      if (res.http_status == 410) Gone(r, phase);
      return;
    }
    const std::string& message = res.status.message();
    std::string line = what + (message.empty() ? std::string(k8s::ApiErrorName(res.error)) : message);
    if (res.http_status == 404 && r != kPodsRes) {
      // Handled by OnMissing: said once per episode, not per retry.
      if (!missing_logged[r]) Log(line + " (the resource is not installed); checking again every " + FormatDelay(delay));
      missing_logged[r] = true;
      return;
    }
    missing_logged[r] = false;
    if (res.error == k8s::ApiError::kUnauthorized) {
      line += " (check the token or client certificate, and that RBAC grants get, list and watch)";
    }
    if (delay.count() > 0) line += "; retrying in " + FormatDelay(delay);
    Log(line);
  }

  // The resource's resourceVersion expired: counted, said, relisted next.
  void Gone(Resource r, k8s::ListWatchPhase phase) {
    relists[r].fetch_add(1, std::memory_order_relaxed);
    Log(std::string(k8s::ListWatchPhaseName(phase)) + " " + Describe(r) +
        ": resourceVersion expired (410 Gone): listing again");
  }

  void LogPool(const char* what) {
    const k8s::InferencePool& p = *pool_state.pool();
    std::string ports;
    for (uint16_t port : p.target_ports) {
      if (!ports.empty()) ports += ",";
      ports += std::to_string(port);
    }
    Log("InferencePool " + Where() + " " + what + ": selector {" + pool_state.PodLabelSelector() +
        "}, target ports " + ports);
  }

  bool listed_pool = false;
  std::array<bool, kResources> missing_logged{};

  // ---- Lifecycle (on ctx).
  void StartOnContext() {
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (stopped || started) return;
    started = true;
    if (!client.init_status().ok()) Log("API client: " + client.init_status().message());
    const size_t n = options.objectives ? kResources : kObjLlmD;
    for (size_t i = 0; i < n; ++i) {
      k8s::ListWatch::Options lo;
      lo.backoff = options.backoff;
      lo.missing_retry = options.missing_retry;
      lo.seed = options.seed + i;
      watches[i] = std::make_unique<k8s::ListWatch>(client, CallbacksFor(static_cast<Resource>(i)), lo);
    }
    for (size_t i = 0; i < n; ++i) watches[i]->Start();
  }

  // Destroys the watches (cancelling their requests) on ctx.
  void Teardown() {
    for (auto& w : watches) w.reset();
  }
};

KubernetesDiscovery::KubernetesDiscovery(net::io_context& ctx, k8s::ClusterAccess access,
                                         KubernetesDiscoveryOptions options, Callbacks callbacks)
    : impl_(std::make_shared<Impl>(ctx, std::move(access), std::move(options), std::move(callbacks))) {}

KubernetesDiscovery::~KubernetesDiscovery() { Stop(); }

void KubernetesDiscovery::Start() {
  net::post(impl_->ctx, [impl = impl_] { impl->StartOnContext(); });
}

void KubernetesDiscovery::Stop() {
  {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  // The watches hold sockets and timers of ctx: they go on its thread. When ctx is not
  // running any more (shutdown), nothing else touches them and they go here.
  if (impl_->ctx.get_executor().running_in_this_thread() || impl_->ctx.stopped()) {
    impl_->Teardown();
    return;
  }
  std::promise<void> done;
  std::future<void> f = done.get_future();
  net::post(impl_->ctx, [impl = impl_, &done] {
    impl->Teardown();
    done.set_value();
  });
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // The context stopped before running the teardown; the promise must outlive the
    // handler, which now never runs before the context is destroyed.
    f.wait();
  }
}

std::string KubernetesDiscovery::status() const {
  std::lock_guard<std::mutex> lock(impl_->status_mu);
  return impl_->status_text;
}

const KubernetesDiscoveryOptions& KubernetesDiscovery::options() const { return impl_->options; }

void KubernetesDiscovery::AppendMetrics(std::string& out) const {
  const Impl& s = *impl_;
  auto load = [](const auto& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  const std::string ns = s.options.namespace_name;
  const std::string pool = s.options.pool_name;
  metrics::Label pool_labels[] = {{"namespace", ns}, {"inference_pool", pool}};
  metrics::AppendGauge(out, "kvroute_k8s_pool_found",
                       "1 while the InferencePool exists and was listed; 0 means no endpoints from it.",
                       pool_labels, load(s.pool_found));
  metrics::AppendGauge(out, "kvroute_k8s_pods", "Pods the pool's selector matched (any readiness).",
                       pool_labels, load(s.pods_known));
  metrics::AppendGauge(out, "kvroute_k8s_endpoints",
                       "Endpoints from Kubernetes: Ready, not deleting pods x target ports.", pool_labels,
                       load(s.endpoints));
  metrics::AppendCounter(out, "kvroute_k8s_endpoint_updates_total",
                         "Times the endpoint set from Kubernetes moved and was applied.", pool_labels,
                         load(s.endpoint_updates));
  metrics::AppendGauge(out, "kvroute_k8s_objectives", "InferenceObjectives with a priority for this pool.",
                       pool_labels, load(s.objectives));

  const size_t n = s.options.objectives ? kResources : kObjLlmD;
  metrics::AppendHeader(out, "kvroute_k8s_lists_total", "Successful LIST responses applied, by resource.",
                        metrics::MetricType::kCounter);
  for (size_t r = 0; r < n; ++r) {
    metrics::Label l[] = {{"resource", kResourceNames[r]}, {"group", s.groups[r]}};
    metrics::AppendSample(out, "kvroute_k8s_lists_total", l, load(s.lists[r]));
  }
  metrics::AppendHeader(out, "kvroute_k8s_relists_total",
                        "Relists after 410 Gone (the resourceVersion expired), by resource.",
                        metrics::MetricType::kCounter);
  for (size_t r = 0; r < n; ++r) {
    metrics::Label l[] = {{"resource", kResourceNames[r]}, {"group", s.groups[r]}};
    metrics::AppendSample(out, "kvroute_k8s_relists_total", l, load(s.relists[r]));
  }
  metrics::AppendHeader(out, "kvroute_k8s_watch_events_total", "Watch events received, by resource and type.",
                        metrics::MetricType::kCounter);
  for (size_t r = 0; r < n; ++r) {
    for (size_t t = 0; t < kEventTypes; ++t) {
      std::string type(k8s::WatchEventTypeName(static_cast<k8s::WatchEventType>(t)));
      metrics::Label l[] = {{"resource", kResourceNames[r]}, {"group", s.groups[r]}, {"type", type}};
      metrics::AppendSample(out, "kvroute_k8s_watch_events_total", l, load(s.events[r][t]));
    }
  }
  metrics::AppendHeader(out, "kvroute_k8s_failures_total",
                        "Failed Kubernetes API requests, by resource, phase (list, watch) and kind.",
                        metrics::MetricType::kCounter);
  for (size_t r = 0; r < n; ++r) {
    for (size_t p = 0; p < 2; ++p) {
      for (size_t k = 1; k < k8s::kApiErrorKinds; ++k) {
        const uint64_t v = s.failures[r][p][k].load(std::memory_order_relaxed);
        if (v == 0 && k != static_cast<size_t>(k8s::ApiError::kUnauthorized)) continue;
        std::string_view phase = k8s::ListWatchPhaseName(static_cast<k8s::ListWatchPhase>(p));
        std::string_view kind = k8s::ApiErrorName(static_cast<k8s::ApiError>(k));
        metrics::Label l[] = {{"resource", kResourceNames[r]}, {"group", s.groups[r]}, {"phase", phase},
                              {"kind", kind}};
        metrics::AppendSample(out, "kvroute_k8s_failures_total", l, static_cast<double>(v));
      }
    }
  }
}

}  // namespace kvroute::pool
