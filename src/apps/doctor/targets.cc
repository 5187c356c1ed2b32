// The targets `kvroute doctor` scrapes (declared in doctor_main.h): an --endpoints list,
// the KV-event addresses --kv-events-port or --kv-events give them, or the pool of a
// serve/epp configuration (its endpoints, endpoints file, or the InferencePool's pods from
// Kubernetes, listed once) with the events addresses the router would derive.
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adapters/k8s/kubeconfig.h"
#include "adapters/pool/kubernetes_discovery.h"
#include "adapters/pool/pool.h"
#include "apps/doctor/doctor_main.h"
#include "config/endpoints_file.h"
#include "config/router_config.h"
#include "config/yaml_reader.h"

namespace kvroute::doctor {
namespace {

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

std::vector<Target> TargetsOf(const std::vector<config::EndpointConfig>& eps) {
  std::vector<Target> out;
  out.reserve(eps.size());
  for (const config::EndpointConfig& e : eps) {
    out.push_back(Target{e.name.empty() ? e.address : e.name, e.host_port.host, e.host_port.port,
                         e.kv_events});
  }
  return out;
}

// The pods an InferencePool selects, listed once: the discovery delivers the set after
// its first pool list (possibly empty while the pods are still being listed), so a
// non-empty set ends the wait, an empty one waits on until the deadline. InvalidArgument
// when the cluster access cannot be loaded, DeadlineExceeded when the pool was not listed
// in time, Unavailable when discovery gives no endpoints (with its status when it has one).
Status KubernetesTargets(const config::KubernetesDiscoveryConfig& k, double timeout_s,
                         std::vector<Target>& out) {
  config::ConfigOr<k8s::ClusterAccess> access =
      k.kubeconfig_path.empty() ? k8s::LoadInCluster()
                                : k8s::LoadKubeconfig(k.kubeconfig_path, k.context);
  if (!access.ok()) {
    std::string why = access.error.ToString();
    return Status::InvalidArgument(
        k.kubeconfig_path.empty() ? "pool.discovery.kubernetes without a kubeconfig: " + why : why);
  }
  pool::KubernetesDiscoveryOptions o;
  o.pool_name = k.inference_pool;
  o.namespace_name = k.namespace_name.empty() ? access.value->namespace_name : k.namespace_name;
  if (o.namespace_name.empty()) o.namespace_name = "default";
  o.group = k.group;
  o.objectives = false;  // priorities do not matter to a diagnosis
  const std::string where = "InferencePool " + o.namespace_name + "/" + o.pool_name;

  boost::asio::io_context ctx;
  std::optional<std::vector<routing::EndpointSpec>> got;
  const pool::KubernetesDiscovery* self = nullptr;
  pool::KubernetesDiscovery::Callbacks cb;
  cb.on_endpoints = [&](std::vector<routing::EndpointSpec> eps) {
    // Pods found, or the pool itself is missing (a status says so): nothing to wait for.
    const bool done = !eps.empty() || (self != nullptr && !self->status().empty());
    got = std::move(eps);
    if (done) ctx.stop();
  };
  pool::KubernetesDiscovery discovery(ctx, std::move(*access.value), o, std::move(cb));
  self = &discovery;
  boost::asio::steady_timer deadline(ctx);
  deadline.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  deadline.async_wait([&](boost::system::error_code ec) {
    if (!ec) ctx.stop();
  });
  discovery.Start();
  ctx.run();
  const std::string status = discovery.status();
  discovery.Stop();
  if (!got || got->empty()) {
    if (!status.empty()) return Status::Unavailable("kubernetes: " + status);
    if (got) return Status::Unavailable("kubernetes: " + where + " selects no ready pods");
    return Status::DeadlineExceeded("kubernetes: " + where + ": not listed within " +
                                    std::to_string(std::lround(timeout_s)) + "s");
  }
  for (const routing::EndpointSpec& e : *got) {
    out.push_back(Target{e.name, e.host, e.port, e.kv_events});
  }
  return Status::Ok();
}

}  // namespace

Status ParseEndpointList(std::string_view list, std::vector<Target>& out) {
  out.clear();
  std::size_t start = 0;
  int index = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    const std::string entry = Trim(list.substr(start, end - start));
    start = end + 1;
    ++index;
    if (entry.empty()) continue;  // "a,,b" and a trailing comma are harmless
    std::string error;
    std::optional<config::HostPort> hp = config::ParseHostPort(entry, &error);
    if (!hp) {
      std::string msg = "--endpoints entry " + std::to_string(index);
      msg += " '";
      msg += entry;
      msg += "': ";
      msg += error;
      return Status::InvalidArgument(msg);
    }
    out.push_back(Target{entry, hp->host, hp->port});
  }
  if (out.empty()) return Status::InvalidArgument("--endpoints: no HOST:PORT given");
  return Status::Ok();
}

void ApplyKvEventsPort(uint16_t port, std::vector<Target>& targets) {
  config::KvEventsConfig k;
  k.port = port;
  std::vector<routing::EndpointSpec> specs;
  for (const Target& t : targets) {
    routing::EndpointSpec e;
    e.host = t.host;
    e.port = t.port;
    e.kv_events = t.kv_events;
    specs.push_back(std::move(e));
  }
  pool::ApplyKvEvents(k, specs);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].kv_events = specs[i].kv_events;
}

Status ApplyKvEventsList(std::string_view list, std::vector<Target>& targets) {
  std::vector<std::string> urls;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    urls.push_back(Trim(list.substr(start, end - start)));
    start = end + 1;
  }
  if (urls.size() != targets.size()) {
    return Status::InvalidArgument("--kv-events: " + std::to_string(urls.size()) +
                                   " entries for " + std::to_string(targets.size()) +
                                   " --endpoints (one each, in order; an empty entry for none)");
  }
  for (std::size_t i = 0; i < urls.size(); ++i) {
    if (urls[i].empty()) continue;
    if (Status st = config::CheckKvEventsUrl(urls[i], false); !st.ok()) {
      return Status::InvalidArgument("--kv-events entry " + std::to_string(i + 1) + " '" +
                                     urls[i] + "': " + st.message());
    }
    targets[i].kv_events = urls[i];
  }
  return Status::Ok();
}

namespace {

// The router's own derivation of each endpoint's events address (pool::ApplyKvEvents),
// except the centralized bind: doctor cannot subscribe to the replicas there.
Status WithKvEvents(const config::KvEventsConfig& k, Status st, std::vector<Target>& out,
                    ConfigKvEvents* kv) {
  if (!st.ok()) return st;
  if (k.bind.empty() && k.port != 0) ApplyKvEventsPort(k.port, out);
  if (kv != nullptr) {
    kv->bind = k.bind;
    const bool any = !k.bind.empty() || std::any_of(out.begin(), out.end(), [](const Target& t) {
      return !t.kv_events.empty();
    });
    kv->block_size = any ? k.block_size : 0;
  }
  return st;
}

}  // namespace

Status TargetsFromConfig(const std::string& path, double discovery_timeout_s,
                         std::vector<Target>& out, ConfigKvEvents* kv) {
  out.clear();
  config::ConfigOr<config::RouterConfig> loaded = config::LoadRouterConfig(path);
  if (!loaded.ok()) return loaded.status();
  const config::PoolConfig& pool = loaded.value->pool;
  const config::KvEventsConfig& k = pool.kv_events;
  if (pool.kubernetes.enabled()) {
    return WithKvEvents(k, KubernetesTargets(pool.kubernetes, discovery_timeout_s, out), out, kv);
  }
  if (!pool.endpoints_file_path.empty()) {
    config::ConfigOr<std::string> text = config::ReadConfigFile(pool.endpoints_file_path);
    if (!text.ok()) return text.status();
    config::ConfigOr<std::vector<config::EndpointConfig>> eps =
        config::ParseEndpointsFile(*text.value, pool.endpoints_file_path);
    if (!eps.ok()) return eps.status();
    out = TargetsOf(*eps.value);
    if (out.empty()) {
      return Status::InvalidArgument(pool.endpoints_file_path +
                                     ": the endpoints file lists no endpoints");
    }
    return WithKvEvents(k, Status::Ok(), out, kv);
  }
  out = TargetsOf(pool.endpoints);
  if (out.empty()) {
    return Status::InvalidArgument(path + ": pool.endpoints: the configuration lists no endpoints");
  }
  return WithKvEvents(k, Status::Ok(), out, kv);
}

}  // namespace kvroute::doctor
