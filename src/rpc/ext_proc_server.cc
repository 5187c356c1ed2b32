#include "rpc/ext_proc_server.h"

#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <deque>

#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"

namespace kvroute::rpc {

namespace pb = ::envoy::service::ext_proc::v3;

namespace {

constexpr const char* kExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor";
constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::string GrpcAddress(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace

// One Process call. Every decision is taken under mu_; the gRPC operations it implies
// (StartRead, StartWrite, Finish) are started after mu_ is released, so a reaction the
// library runs inline can never find the lock taken.
class ExtProcServer::Stream : public grpc::ServerBidiReactor<pb::ProcessingRequest, pb::ProcessingResponse> {
 public:
  Stream(ExtProcServer* server, grpc::CallbackServerContext* ctx)
      : server_(server),
        ctx_(ctx),
        exchange_(extproc::ExchangeEnv{&server->core_, server->epp_stats_, server->clock_},
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
      exchange_.Close(server_->clock_(), /*cancelled=*/true);
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
      if (!ok) {
        // Half-close by Envoy (the HTTP request is over) or a cancellation.
        exchange_.Close(server_->clock_(), ctx_->IsCancelled());
        RequestFinishLocked(grpc::Status::OK, a);
      } else if (!finish_wanted_) {
        server_->stats_.messages_in.fetch_add(1, std::memory_order_relaxed);
        out_.clear();
        exchange_.OnRequest(request_, server_->clock_(), out_);
        for (auto& r : out_) queue_.push_back(std::move(r));
        out_.clear();
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
        exchange_.Close(server_->clock_(), true);
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
      exchange_.Close(server_->clock_(), true);
      queue_.clear();
      RequestFinishLocked(grpc::Status::CANCELLED, a);
      NextWriteLocked(a);
    }
    Act(a);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      exchange_.Close(server_->clock_(), true);  // no-op unless something was missed
      done_ = true;
    }
    server_->stats_.open_streams.fetch_sub(1, std::memory_order_relaxed);
    server_->Unregister(this);  // may destroy this
  }

 private:
  struct Actions {
    bool read = false;
    const pb::ProcessingResponse* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };

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

  void Act(Actions& a) {
    if (a.write != nullptr) StartWrite(a.write);
    if (a.read) StartRead(&request_);
    if (a.finish) Finish(std::move(a.status));
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
  service_ = std::make_unique<Service>(this);

  // The ext_proc port serves only ExternalProcessor: no health service there.
  grpc::ServerBuilder builder;
  builder.SetOption(std::unique_ptr<grpc::ServerBuilderOption>(
      new grpc::HealthCheckServiceServerBuilderOption(nullptr)));
  int bound = 0;
  builder.AddListeningPort(GrpcAddress(options.host, options.port), grpc::InsecureServerCredentials(),
                           &bound);
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
    cv_.wait_for(lock, kPollInterval);
    if (stopping_) break;
    const double now = clock_();
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
  // Open streams are cancelled at once (their OnCancel closes their exchanges); Wait
  // returns when every reactor is done.
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
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
