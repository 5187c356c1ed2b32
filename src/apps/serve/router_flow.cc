// Flow control (flow.enabled): a parsed request admitted, queued or refused (429) by the
// flow gate (core/flow/flow_gate.h); a waiting request picked and forwarded when capacity
// frees (Waiting::Dispatch) or answered when its wait is over (Waiting::Expire); the one
// timer armed at the queue's next expiry.
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "adapters/http/io_pool.h"
#include "adapters/http/server.h"
#include "adapters/pool/pool.h"
#include "apps/serve/router_internal.h"
#include "core/api/openai.h"
#include "core/capture/capture.h"
#include "core/flow/flow_gate.h"
#include "core/flow/flow_queue.h"
#include "core/routing/routing_core.h"

namespace kvroute::router {

namespace asio = boost::asio;
using detail::ErrorJson;
using detail::FrontSettings;
using detail::HeaderValue;
using detail::ObjectiveOf;
using detail::RespondNoEndpoint;

// ---- flow control ----

namespace {

// What a client refused by flow control (shed, over a bound, past its TTL) is told to
// wait before trying again, in seconds.
constexpr std::string_view kRetryAfterS = "1";

// The 429 flow control answers: an OpenAI-shaped RateLimitError with Retry-After, and why
// (x-llm-d-request-dropped-reason).
void RespondRateLimited(http::Exchange& ex, std::string message,
                        std::string_view dropped = api::kDroppedSaturated) {
  ex.Respond(429, ErrorJson(429, std::move(message)), "application/json",
             {{"retry-after", std::string(kRetryAfterS)},
              {std::string(api::kDroppedReasonHeader), std::string(dropped)}});
}

}  // namespace

std::pair<int64_t, uint64_t> Router::Impl::FlowKeys(const http::Request& req, const FrontSettings& fs,
                                                    const api::ParsedRequest& parsed) {
  const std::string_view objective = ObjectiveOf(req);
  // An objective's priority (unknown: 0) wins; else vLLM's `priority`, which orders the
  // other way (lower is more important).
  int64_t priority = -parsed.priority;
  if (!objective.empty()) {
    priority = 0;
    std::shared_ptr<const pool::Priorities> cluster = core_pool->objectives();
    if (auto it = cluster->find(objective); it != cluster->end()) {
      priority = it->second;
    } else if (auto jt = fs.objectives.find(objective); jt != fs.objectives.end()) {
      priority = jt->second;
    }
  }
  // The flow: the configured flow header's value; without one, the fairness id (llm-d's
  // header, then the older one), else the objective.
  std::string_view flow_name;
  if (!fs.flow_header.empty()) {
    flow_name = HeaderValue(req, fs.flow_header);
  } else {
    flow_name = HeaderValue(req, api::kFairnessHeader);
    if (flow_name.empty()) flow_name = HeaderValue(req, api::kFairnessHeaderOld);
    if (flow_name.empty()) flow_name = objective;
  }
  return {priority, flow_name.empty() ? 0 : std::hash<std::string_view>{}(flow_name)};
}

// A request waiting in the gate. Dispatch picks on the gate's thread (so the gate's next
// verdict counts it) and forwards on the connection's; Expire answers there.
struct Router::Impl::Waiting final : flow::FlowWaiter, std::enable_shared_from_this<Waiting> {
  Impl* router = nullptr;
  std::shared_ptr<http::Exchange> ex;
  api::ParsedRequest parsed;  // the SchedRequest built at dispatch time views its strings
  std::string hint;           // routing hint, when allowed
  std::string session_id, session_token;  // the session headers, when sessions are on

  void Dispatch(double now_s, double waited_s) override {
    routing::PickRequest pr;
    pr.request = sched::FromParsed(parsed);
    pr.request.queued_s = waited_s;
    pr.dispatch_first = true;
    pr.hint = hint;
    pr.session_id = session_id;
    pr.session_token = session_token;
    routing::PickResult pick = router->core().Pick(pr, now_s);
    asio::post(ex->executor(), [self = shared_from_this(), pick = std::move(pick)]() mutable {
      self->router->StartPicked(self->ex, self->router->settings.load(), std::move(pick), &self->parsed);
    });
  }

  void Expire(flow::ExpireReason reason) override {
    const bool no_endpoint = reason == flow::ExpireReason::kNoEndpointTtl;
    asio::post(ex->executor(), [self = shared_from_this(), no_endpoint] {
      Impl& r = *self->router;
      if (no_endpoint) {
        RespondNoEndpoint(*self->ex, "No usable endpoint: none became ready while the "
                                     "request waited (flow.no_endpoint_ttl).");
      } else {
        RespondRateLimited(*self->ex, "Too many requests: the pool stayed saturated for the "
                                      "request's whole wait (flow.ttl).",
                           api::kDroppedTtlExpired);
      }
      r.core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint,
                          no_endpoint ? 503 : 429, r.Now());
      r.CaptureUnpicked(*self->ex, *r.settings.load(), self->parsed, no_endpoint ? 503 : 429);
    });
  }
};

bool Router::Impl::AdmitFlow(const std::shared_ptr<http::Exchange>& ex, const FrontSettings& fs,
                             api::ParsedRequest& parsed, std::string_view hint) {
  auto [priority, flow_id] = FlowKeys(ex->request(), fs, parsed);
  flow::FlowRequest fr;
  fr.priority = priority;
  fr.flow_id = flow_id;
  fr.bytes = ex->request().body().size();
  auto w = std::make_shared<Waiting>();
  w->router = this;
  w->ex = ex;
  w->hint.assign(hint);
  if (fs.sessions) {
    w->session_id.assign(HeaderValue(ex->request(), fs.session_header));
    w->session_token.assign(HeaderValue(ex->request(), fs.token_header));
  }
  // The waiter owns the parsed request from before the admission: once queued, a pump on
  // another thread may dispatch it at once.
  w->parsed = std::move(parsed);
  const flow::AdmitResult admitted = flow_gate->Admit(fr, w, sched::FromParsed(w->parsed));
  switch (admitted.outcome) {
    case flow::AdmitOutcome::kDispatchNow:
      parsed = std::move(w->parsed);  // the caller picks it now
      return false;
    case flow::AdmitOutcome::kRejected: {
      std::string why =
          admitted.reason == flow::RejectReason::kSheddable
              ? "the pool is saturated and the request is sheddable (priority " +
                    std::to_string(priority) + ")"
          : admitted.reason == flow::RejectReason::kPredictedMiss
              ? "the request is sheddable (priority " + std::to_string(priority) +
                    ") and predicted to miss its time-to-first-token objective"
              : "the flow queue is full (" +
                    std::string(flow::RejectReasonName(admitted.reason)) + ")";
      RespondRateLimited(*ex, "Too many requests: " + why + ".");
      core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 429, Now());
      CaptureUnpicked(*ex, fs, w->parsed, 429);
      return true;
    }
    case flow::AdmitOutcome::kQueued:
      break;
  }
  // A client leaving while it waits is removed at once. Runs on this connection's thread,
  // the one we are on, so it cannot run before it is set.
  ex->OnClientGone([this, id = fr.id] {
    if (flow_gate->Cancel(id)) {
      core().OnFinished(sched::kNoHandle, routing::RoutingCore::kNoEndpoint, 499, Now());
    }
  });
  // Capacity may have freed between the verdict and the queueing; arms the timer too.
  PumpFlow();
  return true;
}

void Router::Impl::CaptureUnpicked(const http::Exchange& ex, const FrontSettings& fs,
                                   const api::ParsedRequest& parsed, int status) {
  if (!capture_log || !capture_log->Sample()) return;
  std::string_view session;
  if (fs.sessions) session = HeaderValue(ex.request(), fs.session_header);
  const std::string_view target(ex.request().target().data(), ex.request().target().size());
  capture::Entry e = capture::StartEntry(*capture_log, parsed, detail::Path(target), session, parsed.received_s);
  e.status = status;
  capture_log->Submit(std::move(e));
}

void Router::Impl::PumpFlow(uint32_t freed) {
  if (!flow_gate || !flow_gate->waiting()) return;
  flow_gate->Pump(freed);
  ArmFlowTimer(flow_gate->next_expiry());
}

void Router::Impl::ArmFlowTimer(double at) {
  if (!std::isfinite(at)) return;
  {
    std::lock_guard<std::mutex> lock(flow_timer_mu);
    if (at >= flow_timer_at) return;
    flow_timer_at = at;
  }
  // Timers are not thread-safe: armed on their own thread. Posts run in order, and each
  // is for an earlier time than the one before, so the last armed is the earliest.
  asio::post(io->context(0), [this, at] {
    // A millisecond late rather than early: Expire removes what is due at `at`.
    const double delay = std::max(0.0, at - Now()) + 0.001;
    flow_timer->expires_after(std::chrono::microseconds(static_cast<int64_t>(std::ceil(delay * 1e6))));
    flow_timer->async_wait([this, at](boost::system::error_code ec) {
      if (!ec) OnFlowTimer(at);
    });
  });
}

void Router::Impl::OnFlowTimer(double at) {
  {
    std::lock_guard<std::mutex> lock(flow_timer_mu);
    if (flow_timer_at == at) flow_timer_at = std::numeric_limits<double>::infinity();
  }
  PumpFlow();  // expires what is due and re-arms for the next
}

}  // namespace kvroute::router
