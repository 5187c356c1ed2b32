// Replica's life (construction with its fault schedule, shutdown), its request dispatch
// (Handle), the histograms of /metrics and the helpers of replica_internal.h. The rest of
// the class, by concern: replica_openai.cc (generation endpoints and their answers),
// replica_loop.cc (the engine-driving loop and the response path), replica_pd.cc (P/D),
// replica_faults.cc, replica_kv_events.cc, replica_lora.cc and replica_metrics.cc.
#include "apps/sim/replica.h"

#include <algorithm>
#include <string_view>

#include "apps/sim/replica_internal.h"
#include "core/api/lora.h"
#include "core/api/openai.h"

namespace kvroute::sim {

namespace asio = boost::asio;

namespace detail {

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void AppendHex(std::string& out, uint64_t v, int width) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = width - 1; i >= 0; --i) out.push_back(kHex[(v >> (4 * i)) & 15]);
}

bool RespondApiError(http::Exchange& ex, int status, std::string message,
                     std::string param) {
  return ex.Respond(status, api::ErrorBody(api::MakeError(status, std::move(message),
                                                          std::move(param))));
}

std::chrono::steady_clock::duration WallDuration(double seconds) {
  return std::chrono::ceil<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, seconds)));
}

}  // namespace detail

using detail::RespondApiError;
using detail::WallDuration;

namespace {

std::string_view PathOf(std::string_view target) {
  auto q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

// Events on: the engine records them for the publisher.
ReplicaConfig WithKvEvents(ReplicaConfig c) {
  if (c.kv_events.port || !c.kv_events.connect.empty()) c.engine.record_kv_events = true;
  return c;
}

}  // namespace

void Histogram::Reset() {
  std::fill(counts.begin(), counts.end(), 0);
  sum = 0.0;
  count = 0;
}

void Histogram::Observe(double v) {
  auto it = std::lower_bound(bounds.begin(), bounds.end(), v);  // le: v <= bound
  ++counts[static_cast<std::size_t>(it - bounds.begin())];
  sum += v;
  ++count;
}

const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}
const std::vector<double>& InterTokenBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                        0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                        7.5,  10.0,  20.0, 40.0,  80.0};
  return b;
}
const std::vector<double>& RequestLatencyBuckets() {
  static const std::vector<double> b = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,
                                        5.0,  10.0, 15.0, 20.0,  30.0,  40.0,  50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

std::vector<double> RequestTokenBuckets(int max_model_len) {
  std::vector<double> b;
  for (double decade = 1; decade <= max_model_len; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * decade > max_model_len) return b;
      b.push_back(m * decade);
    }
  }
  return b;
}

Replica::Replica(asio::io_context& ctx, ReplicaConfig config, int index)
    : ctx_(ctx),
      config_(WithKvEvents(std::move(config))),
      index_(index),
      engine_(config_.engine),
      step_timer_(ctx),
      start_(Clock::now()),
      outbox_timer_(ctx),
      expiry_timer_(ctx),
      relisten_timer_(ctx),
      tokenize_api_(config_.engine.model_name, config_.engine.max_model_len),
      lease_timer_(ctx),
      ttft_(TtftBuckets()),
      itl_(InterTokenBuckets()),
      e2e_(RequestLatencyBuckets()),
      queue_(RequestLatencyBuckets()),
      prompt_len_(RequestTokenBuckets(config_.engine.max_model_len)),
      output_len_(RequestTokenBuckets(config_.engine.max_model_len)) {
  api::AppendJsonString(model_json_, config_.engine.model_name);
  unix_clock_ = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  if (config_.engine.lora.enabled) {
    for (const api::LoraModule& m : config_.lora_modules) AddAdapter(m.name, m.path);
    lora_series_.reserve(kMaxLoraSeries + 1);
    UpdateLoraInfo();
  }
  for (const fault::FaultSpec& spec : config_.faults) {
    auto timer = std::make_unique<asio::steady_timer>(ctx_, start_ + WallDuration(spec.at_s));
    timer->async_wait([this, spec](boost::system::error_code ec) {
      if (ec || shut_down_ || faults_stopped_) return;
      ActivateFault(spec);
      ApplyFaultStart(spec.kind);
    });
    schedule_timers_.push_back(std::move(timer));
  }
}

Replica::~Replica() { Shutdown(); }

void Replica::StopFaults() {
  faults_stopped_ = true;
  for (auto& t : schedule_timers_) t->cancel();
  expiry_timer_.cancel();
  relisten_timer_.cancel();
}

void Replica::Shutdown() {
  if (shut_down_) return;
  StopFaults();
  shut_down_ = true;
  step_timer_.cancel();
  outbox_timer_.cancel();
  lease_timer_.cancel();
  outbox_.clear();
  for (auto& [id, l] : live_) {
    if (l->delay) l->delay->cancel();
  }
  for (auto& [id, w] : metrics_waits_) w.timer->cancel();
  // Dropping the exchanges closes streams / answers 500 to waiting clients.
  live_.clear();
  held_.clear();
  metrics_waits_.clear();
}

void Replica::Handle(std::shared_ptr<http::Exchange> ex) {
  // Crash or restart downtime: a request on a connection opened before is cut off, as
  // the socket of a dead process would be.
  if (down_) return ex->Abort();
  const http::Request& r = ex->request();
  std::string_view path = PathOf(r.target());
  if (path == "/admin/fault") return HandleAdmin(std::move(ex));
  if (faults_.active(fault::FaultKind::kHang)) return Hold(std::move(ex), fault::FaultKind::kHang);
  const auto method = r.method();
  using boost::beast::http::verb;
  auto only = [&](verb allowed, std::string_view allow) {
    if (method == allowed || (allowed == verb::get && method == verb::head)) return true;
    api::ApiError e = api::MakeError(405, "Method Not Allowed");
    e.type = "MethodNotAllowed";  // not in the api table: OpenAI's SDK has no 405 class
    ex->Respond(405, api::ErrorBody(e), "application/json", {{"allow", std::string(allow)}});
    return false;
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/embeddings" ||
      path == "/v1/responses") {
    if (!only(verb::post, "POST")) return;
    const api::Endpoint kind = path == "/v1/completions"        ? api::Endpoint::kCompletions
                               : path == "/v1/chat/completions" ? api::Endpoint::kChatCompletions
                               : path == "/v1/embeddings"       ? api::Endpoint::kEmbeddings
                                                                : api::Endpoint::kResponses;
    return HandleGenerate(ex, kind);
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (!only(verb::post, "POST")) return;
    return tokenize_api_.Handle(*ex, path == "/detokenize");
  }
  if (path == "/metrics") {
    if (!only(verb::get, "GET")) return;
    return HandleMetrics(ex);
  }
  if (path == "/reset_prefix_cache") {
    if (!only(verb::post, "POST")) return;
    return HandleResetPrefixCache(ex);
  }
  if (path == "/health") {
    if (!only(verb::get, "GET")) return;
    ex->Respond(200, {}, {});
    return;
  }
  if (path == "/v1/models") {
    if (!only(verb::get, "GET")) return;
    ex->Respond(200, ModelsBody());
    return;
  }
  if (config_.engine.lora.enabled &&
      (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter")) {
    if (!only(verb::post, "POST")) return;
    return HandleLoraAdapter(ex, path == "/v1/unload_lora_adapter");
  }
  RespondApiError(*ex, 404, "Not Found");
}

}  // namespace kvroute::sim
