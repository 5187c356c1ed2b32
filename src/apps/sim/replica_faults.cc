// Replica's faults (simkit/fault/fault.h, docs/FAULTS.md): the /admin/fault endpoint,
// /metrics under metrics_slow and metrics_stale, each fault's start and end effects on
// requests in flight, crash and restart downtime (the listening socket) and the restarted
// engine.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/sim/replica.h"
#include "apps/sim/replica_internal.h"
#include "core/api/openai.h"

namespace kvroute::sim {

namespace asio = boost::asio;

using detail::RespondApiError;
using detail::WallDuration;

namespace {

// The value of `name` in the target's query string ("/x?kind=hang" -> "hang"); nullopt
// when absent. No percent-decoding: fault kinds need none.
std::optional<std::string_view> QueryParam(std::string_view target, std::string_view name) {
  auto q = target.find('?');
  if (q == std::string_view::npos) return std::nullopt;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    }
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

}  // namespace

double Replica::FaultNow() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void Replica::HandleAdmin(std::shared_ptr<http::Exchange> ex) {
  using boost::beast::http::verb;
  const http::Request& r = ex->request();
  const auto method = r.method();
  if (method == verb::get || method == verb::head) {
    ex->Respond(200, faults_.ToJson(FaultNow()));
    return;
  }
  if (method == verb::delete_) {
    std::optional<std::string_view> kind_name = QueryParam(r.target(), "kind");
    if (kind_name) {
      std::optional<fault::FaultKind> kind = fault::FaultKindFromName(*kind_name);
      if (!kind) {
        RespondApiError(*ex, 400, "Unknown fault kind '" + std::string(*kind_name) + "'.", "kind");
        return;
      }
      if (faults_.Clear(*kind)) ApplyFaultEnd(*kind);
    } else {
      for (fault::FaultKind k : faults_.ClearAll()) ApplyFaultEnd(k);
    }
    ArmExpiry();
    ex->Respond(200, faults_.ToJson(FaultNow()));
    return;
  }
  if (method != verb::post) {
    api::ApiError e = api::MakeError(405, "Method Not Allowed");
    e.type = "MethodNotAllowed";
    ex->Respond(405, api::ErrorBody(e), "application/json", {{"allow", "GET, POST, DELETE"}});
    return;
  }
  fault::FaultOr parsed = fault::ParseFaultJson(r.body());
  if (!parsed.ok()) {
    std::string message = parsed.error.message;
    if (!parsed.error.field.empty()) message = parsed.error.field + ": " + message;
    RespondApiError(*ex, 400, std::move(message), parsed.error.field);
    return;
  }
  ActivateFault(*parsed.spec);
  // Answer first: a crash or restart closes connections, this one included.
  ex->Respond(200, faults_.ToJson(FaultNow()));
  ex.reset();
  ApplyFaultStart(parsed.spec->kind);
}

void Replica::HandleMetrics(const std::shared_ptr<http::Exchange>& ex) {
  const fault::ActiveFault* slow = faults_.Find(fault::FaultKind::kMetricsSlow);
  if (!slow) {
    ex->Respond(200, MetricsBody(), "text/plain; version=0.0.4; charset=utf-8");
    return;
  }
  const uint64_t id = next_hold_++;
  MetricsWait& w = metrics_waits_[id];
  w.ex = ex;
  w.timer = std::make_unique<asio::steady_timer>(ctx_, WallDuration(slow->spec.delay_s));
  ex->OnClientGone([this, id] { metrics_waits_.erase(id); });
  w.timer->async_wait([this, id](boost::system::error_code ec) {
    if (ec) return;
    auto it = metrics_waits_.find(id);
    if (it == metrics_waits_.end()) return;
    std::shared_ptr<http::Exchange> waiting = std::move(it->second.ex);
    metrics_waits_.erase(it);  // destroys the timer whose handler this is: fine after its run
    waiting->Respond(200, MetricsBody(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

std::string Replica::MetricsBody() const {
  if (faults_.active(fault::FaultKind::kMetricsStale)) return frozen_metrics_;
  return MetricsText();
}

void Replica::ActivateFault(const fault::FaultSpec& spec) {
  // Frozen at what /metrics answered just before (a stale one keeps its old text).
  if (spec.kind == fault::FaultKind::kMetricsStale &&
      !faults_.active(fault::FaultKind::kMetricsStale)) {
    frozen_metrics_ = MetricsText();
  }
  faults_.Activate(spec, FaultNow());
  ArmExpiry();
}

void Replica::ApplyFaultStart(fault::FaultKind kind) {
  using K = fault::FaultKind;
  switch (kind) {
    case K::kCrash:
      SetDown(true);
      DropAll(/*abort_engine=*/true);
      if (kv_) kv_->Close();  // a dead process publishes nothing
      break;
    case K::kRestart:
      if (faults_.active(K::kRestart)) SetDown(true);  // downtime first
      DropAll(/*abort_engine=*/false);
      RestartEngine();
      break;
    case K::kHang: {
      // Everything in flight stops answering too: held silently until the hang ends.
      std::vector<std::shared_ptr<Live>> all;
      for (auto& [id, l] : live_) all.push_back(l);
      live_.clear();
      for (auto& l : all) {
        if (l->admitted) engine_.Abort(l->id);
        if (l->delay) l->delay->cancel();
        l->ex->OnClientGone({});
        Hold(std::move(l->ex), K::kHang);
      }
      for (auto& [id, w] : metrics_waits_) {
        w.timer->cancel();
        Hold(std::move(w.ex), K::kHang);
      }
      metrics_waits_.clear();
      break;
    }
    default:
      break;
  }
}

void Replica::ApplyFaultEnd(fault::FaultKind kind) {
  using K = fault::FaultKind;
  switch (kind) {
    case K::kCrash:
    case K::kRestart:
      if (kind == K::kCrash && kv_) {
        // With events on, a crash ends as a process that came back: a new publisher (seq
        // 0) and a new hash seed, so the old cache (whose hashes nobody could match) goes.
        ReplaceEngine();
      }
      if (!faults_.active(K::kCrash) && !faults_.active(K::kRestart)) SetDown(false);
      break;
    case K::kHang:
    case K::kStall:
      ReleaseHeld(kind);
      break;
    case K::kMetricsStale:
      frozen_metrics_.clear();
      break;
    default:
      break;
  }
}

void Replica::ArmExpiry() {
  if (faults_stopped_) return;
  std::optional<double> next = faults_.NextExpiry();
  if (!next) {
    expiry_timer_.cancel();
    return;
  }
  expiry_timer_.expires_at(start_ + WallDuration(*next));
  expiry_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec && !shut_down_) OnExpiry();
  });
}

void Replica::OnExpiry() {
  for (fault::FaultKind k : faults_.Expire(FaultNow())) ApplyFaultEnd(k);
  ArmExpiry();
}

void Replica::Hold(std::shared_ptr<http::Exchange> ex, fault::FaultKind kind) {
  const uint64_t id = next_hold_++;
  ex->OnClientGone([this, id] { held_.erase(id); });
  held_.emplace(id, Held{std::move(ex), kind});
}

void Replica::ReleaseHeld(fault::FaultKind kind) {
  std::vector<std::shared_ptr<http::Exchange>> release;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.kind == kind) {
      release.push_back(std::move(it->second.ex));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& ex : release) ex->Abort();
}

void Replica::DropAll(bool abort_engine) {
  std::vector<std::shared_ptr<http::Exchange>> drop;
  for (auto& [id, l] : live_) {
    if (abort_engine && l->admitted) engine_.Abort(l->id);
    if (l->delay) l->delay->cancel();
    drop.push_back(l->ex);
  }
  live_.clear();
  for (auto& [id, h] : held_) drop.push_back(std::move(h.ex));
  held_.clear();
  for (auto& [id, w] : metrics_waits_) {
    w.timer->cancel();
    drop.push_back(std::move(w.ex));
  }
  metrics_waits_.clear();
  // Replies still on their way: the connection is gone before they arrive.
  outbox_timer_.cancel();
  for (Outgoing& o : outbox_) drop.push_back(std::move(o.ex));
  outbox_.clear();
  for (auto& ex : drop) ex->Abort();
}

void Replica::SetDown(bool down) {
  if (down == down_) return;
  down_ = down;
  if (down) {
    relisten_timer_.cancel();
    if (listen_) listen_(false);
    return;
  }
  TryListen();
}

void Replica::TryListen() {
  if (down_ || shut_down_ || faults_stopped_ || !listen_) return;
  if (listen_(true)) return;
  relisten_timer_.expires_after(std::chrono::milliseconds(50));
  relisten_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) TryListen();
  });
}

void Replica::ReplaceEngine() {
  // Pending step callbacks belong to the old engine: the epoch makes them no-ops.
  ++epoch_;
  ++generation_;
  step_timer_.cancel();
  stepping_ = false;
  kv_wait_ = false;
  engine_ = engine::Engine(GenerationEngineConfig());
  pd_holds_.clear();  // the new engine holds nothing
  lease_timer_.cancel();
  if (kv_) {
    if (Status s = kv_->Restart(); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", config_.name.c_str(), s.message().c_str());
    }
  }
}

void Replica::RestartEngine() {
  // A restarted vLLM: empty prefix cache, every counter and histogram back to zero.
  ReplaceEngine();
  ttft_.Reset();
  itl_.Reset();
  e2e_.Reset();
  queue_.Reset();
  prompt_len_.Reset();
  output_len_.Reset();
}

}  // namespace kvroute::sim
