#include "apps/epp/grpc/ext_proc_server.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <chrono>
#include <algorithm>
#include <deque>
#include <limits>
#include <string_view>

#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"

namespace kvroute::rpc {

namespace pb = ::envoy::service::ext_proc::v3;

namespace {

constexpr const char* kExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor";
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// What a stream refused by flow control (shed, over a bound, past its TTL) is told to
// wait before trying again, in seconds (as `kvroute serve` does).
constexpr std::string_view kRetryAfterS = "1";
// How long Stop lets the refusals of held requests (rejected-shutting-down) be written.
constexpr int kShutdownGraceMs = 500;

std::string GrpcAddress(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::shared_ptr<grpc::ServerCredentials> Credentials(const ExtProcTls& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  if (tls.watched_file.empty()) {
    grpc::SslServerCredentialsOptions o(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
    return grpc::SslServerCredentials(o);
  }
  // One file for both: it is replaced by one rename, so a refresh never reads a key
  // without its certificate. (OpenSSL's PEM readers skip blocks of the other kind.)
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.watched_file, tls.watched_file, std::max(1u, tls.refresh_s));
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_identity_key_cert_pairs();
  o.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return grpc::experimental::TlsServerCredentials(o);
}

}  // namespace

// One Process call. Every decision is taken under mu_; the gRPC operations it implies
// (StartRead, StartWrite, Finish) are started after mu_ is released, so a reaction the
// library runs inline can never find the lock taken.
class ExtProcServer::Stream : public grpc::ServerBidiReactor<pb::ProcessingRequest, pb::ProcessingResponse>,
                              public std::enable_shared_from_this<ExtProcServer::Stream> {
 public:
  Stream(ExtProcServer* server, grpc::CallbackServerContext* ctx)
      : server_(server),
        ctx_(ctx),
        exchange_(extproc::ExchangeEnv{&server->core_, server->epp_stats_, server->clock_,
                                       server->want_token_ids_, server->capture_},
                  server->settings_()),
        deadline_s_(server->clock_() + server->timeout_s_.load(std::memory_order_relaxed)) {}

  void Begin() { StartRead(&request_); }

  double deadline_s() const { return deadline_s_; }

  // Called by the poller once the stream's time is up.
  void Expire() {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_called_) return;
      server_->stats_.timeouts.fetch_add(1, std::memory_order_relaxed);
      CloseLocked(/*cancelled=*/true, a);
      queue_.clear();
      RequestFinishLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "ext_proc stream timeout"), a);
      NextWriteLocked(a);
    }
    Act(a);
  }

  void OnReadDone(bool ok) override {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok && exchange_.held() && !ctx_->IsCancelled()) {
        // Half-closed while the answer is held by flow control: the stream stays open
        // for it and ends once it is written (FlowDispatch, FlowExpired).
        half_closed_ = true;
      } else if (!ok) {
        // Half-close by Envoy (the HTTP request is over) or a cancellation.
        CloseLocked(ctx_->IsCancelled(), a);
        RequestFinishLocked(grpc::Status::OK, a);
      } else if (!finish_wanted_) {
        server_->stats_.messages_in.fetch_add(1, std::memory_order_relaxed);
        out_.clear();
        exchange_.OnRequest(request_, server_->clock_(), out_);
        if (exchange_.awaiting_token_ids() && !tokenizing_) StartTokenizeLocked();
        if (!exchange_.awaiting_token_ids() && exchange_.held() && !flow_decided_) AdmitLocked(a);
        TakeOutLocked(a);
        if (exchange_.done()) {
          RequestFinishLocked(grpc::Status::OK, a);  // after the immediate response
        } else {
          a.read = true;
        }
      }
      NextWriteLocked(a);
    }
    Act(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (ok) {
        server_->stats_.messages_out.fetch_add(1, std::memory_order_relaxed);
      } else {
        queue_.clear();
        CloseLocked(true, a);
        RequestFinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"), a);
      }
      NextWriteLocked(a);
    }
    Act(a);
  }

  void OnCancel() override {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      server_->stats_.cancelled.fetch_add(1, std::memory_order_relaxed);
      CloseLocked(true, a);
      queue_.clear();
      RequestFinishLocked(grpc::Status::CANCELLED, a);
      NextWriteLocked(a);
    }
    Act(a);
  }

  void OnDone() override {
    ExtProcServer* server = server_;
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      CloseLocked(true, a);  // no-op unless something was missed
      done_ = true;
    }
    server->stats_.open_streams.fetch_sub(1, std::memory_order_relaxed);
    server->Unregister(this);  // may destroy this
    if (a.pump) server->PumpFlow(a.freed);
  }

  // Flow control let this stream's held request go: picks now and writes the answer.
  void FlowDispatch(double waited_s) {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      flow_id_ = 0;
      if (finish_wanted_ || !exchange_.held()) return;  // ended meanwhile
      exchange_.Resume(server_->clock_(), out_, waited_s);
      TakeOutLocked(a);
      if (half_closed_) {
        CloseLocked(false, a);  // as a half-close after the pick
        RequestFinishLocked(grpc::Status::OK, a);
      }
      NextWriteLocked(a);
    }
    Act(a);
  }

  // The prompt's token ids arrived (empty: none): the pick goes on.
  void TokensDone(std::vector<uint32_t> ids) {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_wanted_ || !exchange_.awaiting_token_ids()) return;  // ended meanwhile
      exchange_.OnTokenIds(std::move(ids), server_->clock_(), out_);
      if (exchange_.held() && !flow_decided_) AdmitLocked(a);
      TakeOutLocked(a);
      if (half_closed_ && !exchange_.held()) {
        CloseLocked(false, a);  // as a half-close after the pick
        RequestFinishLocked(grpc::Status::OK, a);
      }
      NextWriteLocked(a);
    }
    Act(a);
  }

  // The server stops: a request still held (waiting in the flow queue, or for its token
  // ids) is refused with 503 and rejected-shutting-down rather than cut off. True when an
  // answer was queued for writing.
  bool RefuseShuttingDown() {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_wanted_ || !exchange_.held()) return false;
      if (flow_id_ != 0) {
        server_->flow_->Cancel(flow_id_);
        flow_id_ = 0;
      }
      exchange_.Refuse(503, "The router is shutting down.", {}, api::kDroppedShuttingDown, server_->clock_(), out_);
      TakeOutLocked(a);
      NextWriteLocked(a);
    }
    Act(a);
    return true;
  }

  // The held request waited past its TTL (429) or its no-endpoint TTL (503).
  void FlowExpired(flow::ExpireReason reason) {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      flow_id_ = 0;
      if (finish_wanted_ || !exchange_.held()) return;
      if (reason == flow::ExpireReason::kNoEndpointTtl) {
        exchange_.Refuse(503, "No usable endpoint: none became ready while the request waited "
                              "(flow.no_endpoint_ttl).", {}, api::kDroppedNoEndpoints,
                         server_->clock_(), out_);
      } else {
        exchange_.Refuse(429, "Too many requests: the pool stayed saturated for the request's "
                              "whole wait (flow.ttl).", kRetryAfterS, api::kDroppedTtlExpired,
                         server_->clock_(), out_);
      }
      TakeOutLocked(a);
      NextWriteLocked(a);
    }
    Act(a);
  }

 private:
  struct Actions {
    bool read = false;
    const pb::ProcessingResponse* write = nullptr;
    bool finish = false;
    grpc::Status status;
    bool pump = false;  // a picked request finished: flow control may dispatch
    uint32_t freed = routing::RoutingCore::kNoEndpoint;  // where it finished
  };

  // Moves the exchange's answers to the write queue; notes a picked request that just
  // finished (its capacity is free), and an immediate response (the stream ends).
  void TakeOutLocked(Actions& a) {
    for (auto& r : out_) queue_.push_back(std::move(r));
    out_.clear();
    NoteFinishedLocked(a);
    if (exchange_.done()) RequestFinishLocked(grpc::Status::OK, a);
  }

  void NoteFinishedLocked(Actions& a) {
    if (!finish_noted_ && !exchange_.destination().empty() && exchange_.finished()) {
      finish_noted_ = true;
      a.pump = true;
      a.freed = exchange_.served_endpoint();
    }
  }

  // Closes the exchange; a request still waiting in the flow queue leaves it at once.
  void CloseLocked(bool cancelled, Actions& a) {
    if (flow_id_ != 0) {
      server_->flow_->Cancel(flow_id_);
      flow_id_ = 0;
    }
    exchange_.Close(server_->clock_(), cancelled);
    NoteFinishedLocked(a);
  }

  // The exchange waits for token ids: asks the tokenizer (never inline: the answer comes
  // through TokensDone, which takes mu_).
  void StartTokenizeLocked() {
    tokenizing_ = true;
    if (!server_->tokenize_) {
      // No tokenizer: no ids, the pick goes on at once (the caller admits or answers).
      exchange_.OnTokenIds({}, server_->clock_(), out_);
      return;
    }
    std::weak_ptr<Stream> weak = weak_from_this();
    server_->tokenize_(exchange_.token_input(), [weak](std::vector<uint32_t> ids) {
      if (std::shared_ptr<Stream> st = weak.lock()) st->TokensDone(std::move(ids));
    });
  }

  // The exchange holds its pick: admit it into the flow queue.
  void AdmitLocked(Actions& a) {
    flow_decided_ = true;
    const double now = server_->clock_();
    if (!server_->flow_) {
      exchange_.Resume(now, out_);  // settings ask for a deferral nobody makes: pick now
      return;
    }
    flow::FlowRequest fr;
    fr.priority = exchange_.priority();
    const std::string& key = exchange_.flow_key();
    fr.flow_id = key.empty() ? 0 : std::hash<std::string_view>{}(key);
    fr.bytes = exchange_.held_bytes();
    const flow::AdmitResult r = server_->AdmitFlow(fr, weak_from_this(), exchange_.held_request());
    switch (r.outcome) {
      case flow::AdmitOutcome::kDispatchNow:
        exchange_.Resume(now, out_);
        return;
      case flow::AdmitOutcome::kRejected: {
        std::string why =
            r.reason == flow::RejectReason::kSheddable
                ? "The pool is saturated and objective '" + exchange_.objective() +
                      "' is sheddable (priority " + std::to_string(fr.priority) + ")."
            : r.reason == flow::RejectReason::kPredictedMiss
                ? "Objective '" + exchange_.objective() + "' is sheddable (priority " +
                      std::to_string(fr.priority) +
                      ") and the request is predicted to miss its time-to-first-token objective."
                : "Too many requests: the flow queue is full (" +
                      std::string(flow::RejectReasonName(r.reason)) + ").";
        exchange_.Refuse(429, std::move(why), kRetryAfterS, api::kDroppedSaturated, now, out_);
        return;
      }
      case flow::AdmitOutcome::kQueued:
        flow_id_ = fr.id;
        a.pump = true;  // capacity may have freed between the verdict and the queueing
        return;
    }
  }

  void RequestFinishLocked(grpc::Status status, Actions& a) {
    if (finish_wanted_) return;
    finish_wanted_ = true;
    status_ = std::move(status);
    (void)a;
  }

  // Starts the next queued write, or the Finish once nothing is left to write.
  void NextWriteLocked(Actions& a) {
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      a.write = &current_;
      return;
    }
    if (finish_wanted_) {
      finish_called_ = true;
      a.finish = true;
      a.status = status_;
      a.read = false;
    }
  }

  // Starts the gRPC operations decided under mu_, then the flow pump (`this` may be gone
  // by then: Finish can end the reactor).
  void Act(Actions& a) {
    ExtProcServer* server = server_;
    const bool pump = a.pump;
    const uint32_t freed = a.freed;
    if (a.write != nullptr) StartWrite(a.write);
    if (a.read) StartRead(&request_);
    if (a.finish) Finish(std::move(a.status));
    if (pump) server->PumpFlow(freed);
  }

  ExtProcServer* server_;
  grpc::CallbackServerContext* ctx_;
  std::mutex mu_;
  extproc::Exchange exchange_;     // guarded by mu_
  pb::ProcessingRequest request_;  // the read buffer (one read at a time)
  std::vector<pb::ProcessingResponse> out_;
  std::deque<pb::ProcessingResponse> queue_;  // answers not yet written
  pb::ProcessingResponse current_;            // the write in flight
  bool writing_ = false;
  bool finish_wanted_ = false;
  bool finish_called_ = false;
  bool done_ = false;
  bool flow_decided_ = false;  // admission ran (once per stream)
  bool tokenizing_ = false;    // the prompt went to the tokenizer (once per stream)
  bool half_closed_ = false;   // Envoy half-closed while the answer was held
  bool finish_noted_ = false;  // the picked request's end was reported to the pump
  flow::RequestId flow_id_ = 0;  // waiting in the flow queue under this id; 0: not
  grpc::Status status_;
  const double deadline_s_;
};

class ExtProcServer::Service : public pb::ExternalProcessor::CallbackService {
 public:
  explicit Service(ExtProcServer* server) : server_(server) {}
  grpc::ServerBidiReactor<pb::ProcessingRequest, pb::ProcessingResponse>* Process(
      grpc::CallbackServerContext* ctx) override {
    auto s = std::make_shared<Stream>(server_, ctx);
    server_->stats_.streams.fetch_add(1, std::memory_order_relaxed);
    server_->stats_.open_streams.fetch_add(1, std::memory_order_relaxed);
    server_->Register(s);
    s->Begin();
    return s.get();
  }

 private:
  ExtProcServer* server_;
};

ExtProcServer::ExtProcServer(routing::RoutingCore& core, extproc::EppStats* stats,
                             std::function<double()> clock,
                             std::function<std::shared_ptr<const extproc::ExchangeSettings>()> settings)
    : core_(core), epp_stats_(stats), clock_(std::move(clock)), settings_(std::move(settings)) {}

ExtProcServer::~ExtProcServer() { Stop(); }

void ExtProcServer::Register(const std::shared_ptr<Stream>& s) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.emplace(s.get(), s);
}

void ExtProcServer::Unregister(Stream* s) {
  std::shared_ptr<Stream> keep;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(s);
  if (it == streams_.end()) return;
  keep = std::move(it->second);
  streams_.erase(it);
  cv_.notify_all();
}

Status ExtProcServer::Start(const ExtProcServerOptions& options) {
  timeout_s_.store(options.stream_timeout_s, std::memory_order_relaxed);
  flow_ = options.flow_gate;
  tokenize_ = options.tokenize;
  want_token_ids_ = options.want_token_ids;
  capture_ = options.capture;
  service_ = std::make_unique<Service>(this);

  // The ext_proc port serves only ExternalProcessor: no health service there.
  grpc::ServerBuilder builder;
  builder.SetOption(std::unique_ptr<grpc::ServerBuilderOption>(
      new grpc::HealthCheckServiceServerBuilderOption(nullptr)));
  int bound = 0;
  builder.AddListeningPort(GrpcAddress(options.host, options.port), Credentials(options.tls), &bound);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(std::clamp(options.handshake_timeout_s * 1000.0, 1.0, 1e9)));
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<std::size_t>(options.max_message_bytes, INT32_MAX)));
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    server_.reset();
    return Status::Unavailable("ext_proc: cannot listen on " + GrpcAddress(options.host, options.port));
  }
  port_ = static_cast<uint16_t>(bound);

  // The health port: gRPC's own grpc.health.v1 implementation.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder hb;
  // gRPC refuses to start a server without a polled queue; a callback service (the
  // generic one: UNIMPLEMENTED for every other method) gives it one.
  health_fallback_ = std::make_unique<grpc::CallbackGenericService>();
  hb.RegisterCallbackGenericService(health_fallback_.get());
  int hbound = 0;
  hb.AddListeningPort(GrpcAddress(options.host, options.health_port), grpc::InsecureServerCredentials(),
                      &hbound);
  health_server_ = hb.BuildAndStart();
  grpc::EnableDefaultHealthCheckService(false);
  if (!health_server_ || hbound == 0 || health_server_->GetHealthCheckService() == nullptr) {
    health_server_.reset();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    return Status::Unavailable("ext_proc health: cannot listen on " +
                               GrpcAddress(options.host, options.health_port));
  }
  health_port_ = static_cast<uint16_t>(hbound);
  grpc::HealthCheckServiceInterface* h = health_server_->GetHealthCheckService();
  h->SetServingStatus("", true);
  h->SetServingStatus("liveness", true);
  SetReadiness(core_.Ready(clock_()));
  started_ = true;
  poller_ = std::thread([this] { PollLoop(); });
  return Status::Ok();
}

void ExtProcServer::SetReadiness(bool ready) {
  if (readiness_ == static_cast<int>(ready)) return;
  readiness_ = static_cast<int>(ready);
  grpc::HealthCheckServiceInterface* h = health_server_->GetHealthCheckService();
  h->SetServingStatus("readiness", ready);
  h->SetServingStatus(kExtProcService, ready);
}

void ExtProcServer::PollLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // The flow queue's one timer: the wait ends at its next expiry when that comes first.
    auto wait = std::chrono::duration<double>(kPollInterval);
    const double expiry = flow_ ? flow_->next_expiry() : std::numeric_limits<double>::infinity();
    if (expiry < std::numeric_limits<double>::infinity()) {
      wait = std::min(wait, std::chrono::duration<double>(std::max(0.0, expiry - clock_())));
    }
    cv_.wait_for(lock, wait);
    if (stopping_) break;
    const double now = clock_();
    if (flow_ && now >= flow_->next_expiry()) {
      lock.unlock();
      PumpFlow();  // expires what is due, re-arms for the next
      lock.lock();
      if (stopping_) break;
    }
    std::vector<std::shared_ptr<Stream>> expired;
    for (auto& [raw, s] : streams_) {
      if (now >= s->deadline_s()) expired.push_back(s);
    }
    lock.unlock();
    for (auto& s : expired) s->Expire();
    expired.clear();  // may destroy streams: outside the lock
    SetReadiness(core_.Ready(now));
    lock.lock();
  }
}

namespace {

// A held stream in the gate: dispatch resumes its pick, expiry refuses it.
class StreamWaiter final : public flow::FlowWaiter {
 public:
  explicit StreamWaiter(std::weak_ptr<ExtProcServer::Stream> s) : s_(std::move(s)) {}
  void Dispatch(double, double waited_s) override {
    if (std::shared_ptr<ExtProcServer::Stream> st = s_.lock()) st->FlowDispatch(waited_s);
  }
  void Expire(flow::ExpireReason reason) override {
    if (std::shared_ptr<ExtProcServer::Stream> st = s_.lock()) st->FlowExpired(reason);
  }

 private:
  std::weak_ptr<ExtProcServer::Stream> s_;
};

}  // namespace

flow::AdmitResult ExtProcServer::AdmitFlow(flow::FlowRequest& request, const std::weak_ptr<Stream>& s,
                                           const sched::SchedRequest& sched_request) {
  const flow::AdmitResult r = flow_->Admit(request, std::make_shared<StreamWaiter>(s), sched_request);
  if (r.outcome == flow::AdmitOutcome::kQueued) cv_.notify_all();  // the poller re-arms
  return r;
}

void ExtProcServer::PumpFlow(uint32_t freed) {
  if (flow_) flow_->Pump(freed);
}

void ExtProcServer::Stop() {
  if (!started_) return;
  started_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (poller_.joinable()) poller_.join();
  if (health_server_) {
    health_server_->GetHealthCheckService()->SetServingStatus("readiness", false);
    health_server_->GetHealthCheckService()->SetServingStatus(kExtProcService, false);
    health_server_->GetHealthCheckService()->SetServingStatus("liveness", false);
  }
  // Held requests are refused (rejected-shutting-down); their answers get a moment to be
  // written. Other open streams are cancelled at once, or when that moment ends (their
  // OnCancel closes their exchanges); Wait returns when every reactor is done.
  std::vector<std::shared_ptr<Stream>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, st] : streams_) open.push_back(st);
  }
  bool refused = false;
  for (auto& st : open) refused = st->RefuseShuttingDown() || refused;
  open.clear();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(refused ? kShutdownGraceMs : 0));
    server_->Wait();
  }
  if (health_server_) {
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_->Wait();
  }
  server_.reset();
  health_server_.reset();
}

}  // namespace kvroute::rpc
