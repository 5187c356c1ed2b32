#include "apps/sim/replica.h"

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/api/lora.h"
#include "core/api/openai.h"
#include "core/engine/kv_transfer.h"
#include "core/engine/tokenizer.h"
#include "core/metrics/prom_writer.h"
#include "apps/sim/answers.h"

namespace kvroute::sim {

namespace asio = boost::asio;

namespace {

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
                     std::string param = {}) {
  return ex.Respond(status, api::ErrorBody(api::MakeError(status, std::move(message),
                                                          std::move(param))));
}

std::string_view PathOf(std::string_view target) {
  auto q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

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

// Events on: the engine records them for the publisher.
ReplicaConfig WithKvEvents(ReplicaConfig c) {
  if (c.kv_events.port || !c.kv_events.connect.empty()) c.engine.record_kv_events = true;
  return c;
}

std::chrono::steady_clock::duration WallDuration(double seconds) {
  return std::chrono::ceil<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, seconds)));
}

}  // namespace

// One request from HTTP arrival to its final byte. Lives in live_ (keyed by engine id)
// from arrival; the engine knows it only after Admit.
struct Replica::Live {
  uint64_t id = 0;
  std::shared_ptr<http::Exchange> ex;
  api::ParsedRequest req;
  engine::EngineRequest engine_req;
  std::string response_id;
  int64_t created = 0;
  bool chat = false;  // chat completions, or a Responses request (rendered as chat)
  api::Endpoint kind = api::Endpoint::kCompletions;
  std::vector<std::vector<uint32_t>> embed_inputs;  // embeddings: each input's tokens
  std::size_t embed_dims = 0;
  std::string msg_id;        // responses: the output message's id
  int64_t seq = 0;           // responses: the stream's next sequence_number
  bool admitted = false;
  bool sent_role = false;
  std::string text;  // non-streaming: generated text so far
  std::string model_json;  // the model answers name, a JSON string (adapter requests)
  int chunks_sent = 0;  // streaming: HTTP chunks sent (stall and reset count them)
  bool pd_prefill = false;       // P/D prefill leg: hold the blocks, answer kv_transfer_params
  bool pd_pull_pending = false;  // P/D decode leg whose pull is not settled yet
  Clock::time_point arrival;
  Clock::time_point last_token;
  std::unique_ptr<asio::steady_timer> delay;  // network latency before admission
};

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

double Replica::EngineNow() const {
  double wall = 0.0;
  if (config_.time_scale > 0) {
    wall = std::chrono::duration<double>(Clock::now() - start_).count() / config_.time_scale;
  }
  return std::max(wall, last_step_end_);
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
    return HandleGenerate(std::move(ex), kind);
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (!only(verb::post, "POST")) return;
    return tokenize_api_.Handle(*ex, path == "/detokenize");
  }
  if (path == "/metrics") {
    if (!only(verb::get, "GET")) return;
    return HandleMetrics(std::move(ex));
  }
  if (path == "/reset_prefix_cache") {
    if (!only(verb::post, "POST")) return;
    return HandleResetPrefixCache(std::move(ex));
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
    return HandleLoraAdapter(std::move(ex), path == "/v1/unload_lora_adapter");
  }
  RespondApiError(*ex, 404, "Not Found");
}

void Replica::SetUnixClock(std::function<double()> clock) {
  unix_clock_ = std::move(clock);
  if (!config_.engine.lora.enabled) return;
  lora_series_.clear();
  UpdateLoraInfo();
}

const Adapter* Replica::FindAdapter(std::string_view name) const {
  for (const Adapter& a : adapters_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void Replica::AddAdapter(std::string name, std::string path) {
  Adapter& a = adapters_.emplace_back();
  a.name = std::move(name);
  a.path = std::move(path);
  api::AppendJsonString(a.name_json, a.name);
  a.created = static_cast<int64_t>(unix_clock_());
}

// vLLM's runtime adapter endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING; here with
// --enable-lora). A load registers the adapter at once; its weights load into the
// engine's adapter cache on first use (EngineConfig::lora), where vLLM would read them
// now. An unload forgets it and drops it from the cache; requests already queued for it
// still finish.
void Replica::HandleLoraAdapter(std::shared_ptr<http::Exchange> ex, bool unload) {
  api::LoraAdapterParse parsed = api::ParseLoraAdapterRequest(ex->request().body(), unload);
  if (!parsed.ok()) {
    ex->Respond(parsed.error.status, api::ErrorBody(parsed.error));
    return;
  }
  const std::string& name = parsed.request->lora_name;
  const Adapter* found = FindAdapter(name);
  if (!unload) {
    if (found != nullptr || name == config_.engine.model_name) {
      RespondApiError(*ex, 400, api::LoraAlreadyLoadedMessage(name), "lora_name");
      return;
    }
    AddAdapter(name, std::move(parsed.request->lora_path));
    ex->Respond(200, api::LoraLoadedMessage(name), "text/plain; charset=utf-8");
    return;
  }
  if (found == nullptr) {
    RespondApiError(*ex, 404, api::LoraNotFoundMessage(name), "lora_name");
    return;
  }
  engine_.EvictLora(name);
  std::string answer = api::LoraUnloadedMessage(name);
  adapters_.erase(adapters_.begin() + (found - adapters_.data()));
  ex->Respond(200, std::move(answer), "text/plain; charset=utf-8");
}

void Replica::UpdateLoraInfo() {
  engine_.LoraActivity(&lora_running_scratch_, &lora_waiting_scratch_);
  auto join = [](const std::vector<std::string>& names, std::string* out) {
    out->clear();
    for (const std::string& n : names) {
      if (!out->empty()) out->push_back(',');
      out->append(n);
    }
  };
  join(lora_running_scratch_, &lora_join_running_);
  join(lora_waiting_scratch_, &lora_join_waiting_);
  const double now = unix_clock_();
  for (LoraSeries& series : lora_series_) {
    if (series.running == lora_join_running_ && series.waiting == lora_join_waiting_) {
      series.unix_s = now;
      return;
    }
  }
  if (lora_series_.size() >= kMaxLoraSeries) {
    auto oldest = std::min_element(
        lora_series_.begin(), lora_series_.end(),
        [](const LoraSeries& a, const LoraSeries& b) { return a.unix_s < b.unix_s; });
    lora_series_.erase(oldest);
  }
  lora_series_.push_back({lora_join_running_, lora_join_waiting_, now});
}

std::string Replica::ModelsBody() const {
  std::string out = "{\"object\":\"list\",\"data\":[{\"id\":";
  out += model_json_;
  out += ",\"object\":\"model\",\"created\":";
  out += std::to_string(UnixNow());
  out += ",\"owned_by\":\"vllm\",\"root\":";
  out += model_json_;
  out += ",\"parent\":null,\"max_model_len\":";
  out += std::to_string(config_.engine.max_model_len);
  out += "}";
  // Adapters as vLLM lists them: root is the adapter's path, parent the base model.
  for (const Adapter& a : adapters_) {
    out += ",{\"id\":";
    out += a.name_json;
    out += ",\"object\":\"model\",\"created\":";
    out += std::to_string(a.created);
    out += ",\"owned_by\":\"vllm\",\"root\":";
    api::AppendJsonString(out, a.path);
    out += ",\"parent\":";
    out += model_json_;
    out += ",\"max_model_len\":";
    out += std::to_string(config_.engine.max_model_len);
    out += "}";
  }
  out += "]}";
  return out;
}

void Replica::HandleGenerate(std::shared_ptr<http::Exchange> ex, api::Endpoint endpoint) {
  if (faults_.TakeHttpError()) {
    const int status = faults_.Find(fault::FaultKind::kHttpError)->spec.status;
    RespondApiError(*ex, status, "Injected fault: http_error (kvroute sim).");
    return;
  }
  const bool chat = endpoint == api::Endpoint::kChatCompletions || endpoint == api::Endpoint::kResponses;
  const bool embed = endpoint == api::Endpoint::kEmbeddings;
  api::ParseResult parsed = api::ParseRequest(endpoint, ex->request().body());
  if (!parsed.ok()) {
    ex->Respond(parsed.error.status, api::ErrorBody(parsed.error));
    return;
  }
  api::ParsedRequest& req = *parsed.request;
  const Adapter* adapter = nullptr;
  if (req.model != config_.engine.model_name) {
    if (config_.engine.lora.enabled) adapter = FindAdapter(req.model);
    if (adapter == nullptr) {
      RespondApiError(*ex, 404, "The model `" + req.model + "` does not exist.", "model");
      return;
    }
  }
  auto live = std::make_shared<Live>();
  if (adapter != nullptr) {
    live->model_json = adapter->name_json;
    live->engine_req.lora_name = adapter->name;
  }
  live->id = next_id_++;
  live->chat = chat;
  live->kind = endpoint;
  live->arrival = Clock::now();
  live->created = UnixNow();
  live->response_id = endpoint == api::Endpoint::kResponses ? "resp_"
                      : embed                               ? "embd-"
                      : chat                                ? "chatcmpl-"
                                                            : "cmpl-";
  AppendHex(live->response_id, static_cast<uint64_t>(index_), 4);
  AppendHex(live->response_id, live->id, 12);
  if (endpoint == api::Endpoint::kResponses) {
    live->msg_id = "msg_";
    AppendHex(live->msg_id, static_cast<uint64_t>(index_), 4);
    AppendHex(live->msg_id, live->id, 12);
  }

  engine::EngineRequest& er = live->engine_req;
  er.id = live->id;
  if (embed) {
    // Costed as one prefill of every input's tokens (and the one step an engine request
    // takes); the answer is the inputs' vectors.
    live->embed_dims = answers::kEmbeddingDims;
    if (req.dimensions) {
      if (*req.dimensions > static_cast<int64_t>(answers::kEmbeddingDims)) {
        RespondApiError(*ex, 400,
                        "dimensions must be at most " + std::to_string(answers::kEmbeddingDims) +
                            " for this model, got " + std::to_string(*req.dimensions) + ".",
                        "dimensions");
        return;
      }
      live->embed_dims = static_cast<std::size_t>(*req.dimensions);
    }
    for (const std::string& text : req.inputs) {
      live->embed_inputs.emplace_back();
      engine::TokenizeInto(text, &live->embed_inputs.back());
    }
    for (auto& ids : req.input_token_ids) live->embed_inputs.push_back(std::move(ids));
    for (const auto& ids : live->embed_inputs) {
      if (ids.empty()) {
        RespondApiError(*ex, 400, "The input cannot be empty.", "input");
        return;
      }
      er.prompt_tokens.insert(er.prompt_tokens.end(), ids.begin(), ids.end());
    }
    req.max_tokens = 1;
  } else {
    engine::TokenizeInto(req.prompt_text, &er.prompt_tokens);
    tokenize_api_.Remember(req.prompt_text, er.prompt_tokens);  // for /detokenize
  }
  const int prompt_len = static_cast<int>(er.prompt_tokens.size());
  if (embed) {
    er.max_tokens = 1;
    er.stop_after_tokens = 1;
  } else if (req.max_tokens) {
    er.max_tokens = static_cast<int>(std::min<int64_t>(*req.max_tokens, 1 << 30));
  } else if (chat) {
    // vLLM fills the rest of the context; a simulator wants bounded answers.
    er.max_tokens = std::max(1, std::min(config_.default_max_tokens,
                                         config_.engine.max_model_len - prompt_len));
  } else {
    er.max_tokens = 16;
  }
  if (req.ignore_eos) er.stop_after_tokens = er.max_tokens;
  er.priority = req.priority;
  er.cache_salt = req.cache_salt;
  if (req.kv_transfer_params) {
    // A streaming prefill leg is served as an ordinary stream: nothing could tell its
    // decode leg which blocks to pull (P/D proxies send the prefill leg stream: false).
    if (req.kv_transfer_params->do_remote_decode && !req.stream) {
      live->pd_prefill = true;
      er.kv_hold_s = config_.pd.lease_s;
    }
    live->pd_pull_pending = req.kv_transfer_params->do_remote_prefill;
  }
  live->req = std::move(req);
  live->ex = ex;

  // Validate now (the engine applies the same checks) so bad requests fail fast.
  if (prompt_len == 0) {
    RespondApiError(*ex, 400, "The prompt cannot be empty.",
                    endpoint == api::Endpoint::kChatCompletions ? "messages"
                    : endpoint == api::Endpoint::kCompletions   ? "prompt"
                                                                : "input");
    return;
  }
  if (er.max_tokens < 1) {
    RespondApiError(*ex, 400,
                    "max_tokens must be at least 1, got " + std::to_string(er.max_tokens) + ".",
                    "max_tokens");
    return;
  }
  if (static_cast<int64_t>(prompt_len) + er.max_tokens > config_.engine.max_model_len) {
    RespondApiError(*ex, 400,
                    "This model's maximum context length is " +
                        std::to_string(config_.engine.max_model_len) +
                        " tokens. However, you requested " +
                        std::to_string(static_cast<int64_t>(prompt_len) + er.max_tokens) +
                        " tokens (" + std::to_string(prompt_len) + " in the messages, " +
                        std::to_string(er.max_tokens) +
                        " in the completion). Please reduce the length of the messages or "
                        "completion.");
    return;
  }

  const uint64_t id = live->id;
  ex->OnClientGone([this, id] { OnClientGone(id); });
  live_.emplace(id, live);
  double wait_s = config_.latency_ms / 1000.0;
  if (const fault::ActiveFault* d = faults_.Find(fault::FaultKind::kDelay)) wait_s += d->spec.delay_s;
  if (wait_s > 0) {
    live->delay = std::make_unique<asio::steady_timer>(ctx_, WallDuration(wait_s));
    std::weak_ptr<Live> weak = live;
    live->delay->async_wait([this, weak](boost::system::error_code ec) {
      auto l = weak.lock();
      if (ec || !l || shut_down_) return;
      Admit(l);
    });
    return;
  }
  Admit(live);
}

void Replica::Admit(const std::shared_ptr<Live>& live) {
  if (live->pd_pull_pending) {
    live->pd_pull_pending = false;
    return StartPull(live);  // calls Admit again once the pull is settled
  }
  live->engine_req.arrival_s = EngineNow();
  if (auto err = engine_.AddRequest(std::move(live->engine_req))) {
    Reply(live->ex, [err = *err](http::Exchange& ex) { RespondApiError(ex, 400, err); });
    live_.erase(live->id);
    return;
  }
  live->admitted = true;
  if (config_.engine.lora.enabled) UpdateLoraInfo();
  if (live->req.stream) {
    Reply(live->ex, [](http::Exchange& ex) {
      ex.BeginStream(200, "text/event-stream", {{"cache-control", "no-cache"}});
    });
  }
  Kick();
}

void Replica::Reply(std::shared_ptr<http::Exchange> ex,
                    std::function<void(http::Exchange&)> send) {
  if (config_.latency_ms <= 0) return send(*ex);
  // A constant delay keeps due times in call order, so one FIFO and one timer suffice.
  outbox_.push_back({Clock::now() + WallDuration(config_.latency_ms / 1000.0), std::move(ex),
                     std::move(send)});
  if (outbox_.size() == 1) ArmOutbox();
}

void Replica::ArmOutbox() {
  outbox_timer_.expires_at(outbox_.front().due);
  outbox_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec && !shut_down_) FlushOutbox();
  });
}

void Replica::FlushOutbox() {
  const auto now = Clock::now();
  while (!outbox_.empty() && outbox_.front().due <= now) {
    Outgoing o = std::move(outbox_.front());
    outbox_.pop_front();
    o.send(*o.ex);
  }
  if (!outbox_.empty()) ArmOutbox();
}

void Replica::OnClientGone(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  if (it->second->admitted) engine_.Abort(id);  // frees its KV blocks now
  if (it->second->delay) it->second->delay->cancel();
  live_.erase(it);
}

void Replica::Kick() {
  if (stepping_ && kv_wait_) {
    // The loop sleeps until a decode leg's KV arrives; new work must not wait for that.
    kv_wait_ = false;
    step_timer_.cancel();
    asio::post(ctx_, [this, epoch = epoch_] {
      if (epoch == epoch_) RunStep();
    });
    return;
  }
  if (stepping_ || shut_down_ || !engine_.HasWork()) return;
  stepping_ = true;
  asio::post(ctx_, [this, epoch = epoch_] {
    if (epoch == epoch_) RunStep();
  });
}

void Replica::RunStep() {
  if (shut_down_) return;
  if (!engine_.HasWork()) {
    stepping_ = false;
    return;
  }
  const double now = EngineNow();
  engine_.Step(now, &step_);
  PublishKvEvents();
  if (step_.duration_s <= 0) {
    if (std::optional<double> ready = engine_.NextKvReadyS(); ready && *ready > now) {
      // Only decode legs waiting for their KV: sleep until the first one's arrives.
      if (config_.time_scale <= 0) {
        last_step_end_ = *ready;  // no waiting: engine time jumps there
        asio::post(ctx_, [this, epoch = epoch_] {
          if (epoch == epoch_) RunStep();
        });
        return;
      }
      kv_wait_ = true;
      step_timer_.expires_after(WallDuration((*ready - now) * config_.time_scale) +
                                std::chrono::microseconds(1));
      // Kick may cut this sleep short after the timer already fired (cancel cannot stop a
      // queued handler): the sequence number makes such a handler a no-op, so only one
      // step chain ever runs.
      step_timer_.async_wait(
          [this, epoch = epoch_, seq = ++kv_wait_seq_](boost::system::error_code ec) {
            if (ec || epoch != epoch_ || !kv_wait_ || seq != kv_wait_seq_) return;
            kv_wait_ = false;
            RunStep();
          });
      return;
    }
    // Nothing could be scheduled although work is queued; retry shortly rather than spin.
    step_timer_.expires_after(std::chrono::milliseconds(1));
    step_timer_.async_wait([this, epoch = epoch_](boost::system::error_code ec) {
      if (!ec && epoch == epoch_) RunStep();
    });
    return;
  }
  // Thermal throttling: the same step, `factor` times longer.
  double duration_s = step_.duration_s;
  if (const fault::ActiveFault* slow = faults_.Find(fault::FaultKind::kSlow)) {
    duration_s *= slow->spec.factor;
  }
  last_step_end_ = now + duration_s;
  auto after = [this, epoch = epoch_](boost::system::error_code ec) {
    if (ec || shut_down_ || epoch != epoch_) return;
    Deliver();
    if (config_.engine.lora.enabled) UpdateLoraInfo();
    RunStep();
  };
  if (config_.time_scale <= 0) {
    asio::post(ctx_, [after] { after({}); });
    return;
  }
  step_timer_.expires_after(std::chrono::nanoseconds(
      static_cast<int64_t>(duration_s * config_.time_scale * 1e9)));
  step_timer_.async_wait(after);
}

void Replica::AppendChunkHead(std::string& out, const Live& l) const {
  out += "data: {\"id\":\"";
  out += l.response_id;
  out += l.chat ? "\",\"object\":\"chat.completion.chunk\",\"created\":"
                : "\",\"object\":\"text_completion\",\"created\":";
  out += std::to_string(l.created);
  out += ",\"model\":";
  out += l.model_json.empty() ? model_json_ : l.model_json;
  out += ",\"choices\":[";
}

answers::Response Replica::ResponseOf(const Live& l, const engine::RequestOutput& o) const {
  answers::Response r;
  r.id = l.response_id;
  r.msg_id = l.msg_id;
  r.created = l.created;
  r.model_json = model_json_;
  r.text = l.text;
  r.max_output_tokens = l.req.max_tokens.value_or(-1);
  r.input_tokens = o.prompt_tokens;
  r.cached_tokens = o.cached_tokens;
  r.output_tokens = o.completion_tokens;
  return r;
}

void Replica::AppendUsage(std::string& out, const engine::RequestOutput& o) const {
  out += "\"usage\":{\"prompt_tokens\":";
  out += std::to_string(o.prompt_tokens);
  out += ",\"total_tokens\":";
  out += std::to_string(o.prompt_tokens + o.completion_tokens);
  out += ",\"completion_tokens\":";
  out += std::to_string(o.completion_tokens);
  if (config_.enable_prompt_tokens_details) {
    out += ",\"prompt_tokens_details\":{\"cached_tokens\":";
    out += std::to_string(o.cached_tokens);
    out += "}";
  }
  out += "}";
}

void Replica::Deliver() {
  const auto now = Clock::now();
  for (const engine::RequestOutput& o : step_.outputs) {
    auto it = live_.find(o.id);
    if (it == live_.end()) continue;  // aborted while the step ran
    Live& l = *it->second;
    if (l.req.stream && (o.new_tokens > 0 || o.finished)) {
      // stall and reset act on the chunk a stream would send next.
      const fault::ActiveFault* stall = faults_.Find(fault::FaultKind::kStall);
      const fault::ActiveFault* reset = faults_.Find(fault::FaultKind::kReset);
      const bool stop_stall = stall && l.chunks_sent >= stall->spec.after_chunks;
      const bool stop_reset = reset && l.chunks_sent >= reset->spec.after_chunks;
      if (stop_stall || stop_reset) {
        std::shared_ptr<Live> keep = it->second;
        live_.erase(it);
        if (!o.finished) engine_.Abort(o.id);
        keep->ex->OnClientGone({});
        if (stop_reset) {
          keep->ex->Abort();
        } else {
          Hold(keep->ex, fault::FaultKind::kStall);
        }
        continue;
      }
    }
    if (o.new_tokens > 0) {
      if (o.first_token) {
        ttft_.Observe(std::chrono::duration<double>(now - l.arrival).count());
        queue_.Observe(std::max(0.0, (o.first_scheduled_s - o.arrival_s) * config_.time_scale));
      } else {
        itl_.Observe(std::chrono::duration<double>(now - l.last_token).count());
      }
      l.last_token = now;
    }
    std::string_view reason = o.finished ? engine::FinishReasonName(o.reason) : "";
    if (l.req.stream && l.kind == api::Endpoint::kResponses && (o.new_tokens > 0 || o.finished)) {
      std::string frame;
      answers::Response r = ResponseOf(l, o);
      if (!l.sent_role) {
        answers::AppendResponseStart(frame, r, l.seq);
        l.sent_role = true;
      }
      if (o.new_tokens > 0) {
        std::string_view text =
            engine::OutputTokenText(o.id, static_cast<std::size_t>(o.completion_tokens - 1));
        l.text += text;
        answers::AppendResponseDelta(frame, r, text, l.seq);
      }
      if (o.finished) {
        r.text = l.text;
        r.finish_reason = reason;
        answers::AppendResponseEnd(frame, r, l.seq);
      }
      ++l.chunks_sent;
      Reply(l.ex, [frame = std::move(frame)](http::Exchange& ex) mutable {
        ex.SendChunk(std::move(frame));
      });
    } else if (l.req.stream && (o.new_tokens > 0 || o.finished)) {
      std::string frame;
      frame.reserve(512);
      if (l.chat && !l.sent_role) {
        AppendChunkHead(frame, l);
        frame += "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                 "\"logprobs\":null,\"finish_reason\":null}]";
        if (l.req.include_usage) frame += ",\"usage\":null";
        frame += "}\n\n";
        l.sent_role = true;
      }
      AppendChunkHead(frame, l);
      std::string_view text;
      if (o.new_tokens > 0) {
        text = engine::OutputTokenText(o.id, static_cast<std::size_t>(o.completion_tokens - 1));
      }
      if (l.chat) {
        frame += "{\"index\":0,\"delta\":{\"content\":";
        api::AppendJsonString(frame, text);
        frame += "},\"logprobs\":null,\"finish_reason\":";
      } else {
        frame += "{\"index\":0,\"text\":";
        api::AppendJsonString(frame, text);
        frame += ",\"logprobs\":null,\"finish_reason\":";
      }
      if (o.finished) {
        frame.push_back('"');
        frame += reason;
        frame += "\",\"stop_reason\":null}]";
      } else {
        frame += "null,\"stop_reason\":null}]";
      }
      if (l.req.include_usage) frame += ",\"usage\":null";
      frame += "}\n\n";
      if (o.finished) {
        if (l.req.include_usage) {
          AppendChunkHead(frame, l);
          frame += "],";
          AppendUsage(frame, o);
          frame += "}\n\n";
        }
        frame += "data: [DONE]\n\n";
      }
      ++l.chunks_sent;
      Reply(l.ex, [frame = std::move(frame)](http::Exchange& ex) mutable {
        ex.SendChunk(std::move(frame));
      });
    } else if (!l.req.stream && o.new_tokens > 0) {
      l.text += engine::OutputTokenText(o.id, static_cast<std::size_t>(o.completion_tokens - 1));
    }
    if (o.finished) Finish(l, o);
  }
}

void Replica::Finish(Live& l, const engine::RequestOutput& o) {
  e2e_.Observe(std::chrono::duration<double>(Clock::now() - l.arrival).count());
  // As vLLM: the request-size histograms count a request when it finishes.
  prompt_len_.Observe(static_cast<double>(o.prompt_tokens));
  output_len_.Observe(static_cast<double>(o.completion_tokens));
  std::shared_ptr<Live> keep = live_[o.id];
  live_.erase(o.id);
  if (l.req.stream) {
    Reply(l.ex, [](http::Exchange& ex) { ex.EndStream(); });
    return;
  }
  std::string_view reason = engine::FinishReasonName(o.reason);
  if (l.kind == api::Endpoint::kEmbeddings) {
    std::string body = answers::EmbeddingsBody(l.response_id, l.created, model_json_,
                                               l.embed_inputs, l.embed_dims, l.req.base64,
                                               o.prompt_tokens);
    Reply(l.ex, [body = std::move(body)](http::Exchange& ex) mutable {
      ex.Respond(200, std::move(body));
    });
    return;
  }
  if (l.kind == api::Endpoint::kResponses) {
    answers::Response r = ResponseOf(l, o);
    r.finish_reason = reason;
    std::string body = answers::ResponseObject(r, true);
    Reply(l.ex, [body = std::move(body)](http::Exchange& ex) mutable {
      ex.Respond(200, std::move(body));
    });
    return;
  }
  std::string body;
  body.reserve(256 + l.text.size());
  body += "{\"id\":\"";
  body += l.response_id;
  body += l.chat ? "\",\"object\":\"chat.completion\",\"created\":"
                 : "\",\"object\":\"text_completion\",\"created\":";
  body += std::to_string(l.created);
  body += ",\"model\":";
  body += l.model_json.empty() ? model_json_ : l.model_json;
  if (l.chat) {
    body += ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":";
    api::AppendJsonString(body, l.text);
    body += ",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"";
  } else {
    body += ",\"choices\":[{\"index\":0,\"text\":";
    api::AppendJsonString(body, l.text);
    body += ",\"logprobs\":null,\"finish_reason\":\"";
  }
  body += reason;
  body += "\",\"stop_reason\":null}],";
  AppendUsage(body, o);
  if (l.req.kv_transfer_params) {
    body += ",\"kv_transfer_params\":";
    AppendKvTransferParams(body, l, o);
  }
  body += "}";
  Reply(l.ex, [body = std::move(body)](http::Exchange& ex) mutable {
    ex.Respond(200, std::move(body));
  });
}

// ---- P/D ----

std::string_view KvClaimOutcomeName(KvClaimOutcome o) {
  switch (o) {
    case KvClaimOutcome::kOk:
      return "ok";
    case KvClaimOutcome::kUnknownEngine:
      return "unknown_engine";
    case KvClaimOutcome::kPrefillDown:
      return "prefill_down";
    case KvClaimOutcome::kLeaseExpired:
      break;
  }
  return "lease_expired";
}

void Replica::AppendKvTransferParams(std::string& out, const Live& l,
                                     const engine::RequestOutput& o) {
  // vLLM answers null unless the prefill leg ended by its length cap.
  if (!l.pd_prefill || o.reason != engine::FinishReason::kLength) {
    out += "null";
    return;
  }
  // Holds that ended in an engine step leave stale names behind; without a lease timer
  // (time_scale 0) this is where they go.
  if (pd_holds_.size() >= 64 &&
      pd_holds_.size() > 2 * static_cast<std::size_t>(engine_.Stats().kv_holds)) {
    PruneHolds();
  }
  std::span<const int32_t> held = engine_.HeldBlocks(l.id);
  if (!held.empty()) {
    pd_holds_[l.response_id] = l.id;
    ArmLeaseTimer();
  }
  ++pd_.prefill_legs;
  out += "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_block_ids\":[";
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += std::to_string(held[i]);
  }
  out += "],\"remote_engine_id\":";
  api::AppendJsonString(out, engine_id_);
  out += ",\"remote_request_id\":";
  api::AppendJsonString(out, l.response_id);
  out += ",\"remote_host\":";
  api::AppendJsonString(out, announce_host_.empty() ? config_.host : announce_host_);
  out += ",\"remote_port\":";
  out += std::to_string(announce_port_ ? announce_port_ : config_.port);
  out += ",\"tp_size\":";
  out += std::to_string(config_.engine.tensor_parallel_size);
  out += "}";
}

KvClaimOutcome Replica::ClaimKv(const std::string& remote_request_id, int* blocks) {
  *blocks = 0;
  if (down_ || shut_down_) return KvClaimOutcome::kPrefillDown;
  auto it = pd_holds_.find(remote_request_id);
  if (it == pd_holds_.end()) return KvClaimOutcome::kLeaseExpired;
  const uint64_t id = it->second;
  pd_holds_.erase(it);
  engine_.ExpireHolds(EngineNow());
  const int n = static_cast<int>(engine_.HeldBlocks(id).size());
  if (n == 0) return KvClaimOutcome::kLeaseExpired;
  engine_.ReleaseHold(id);
  *blocks = n;
  ArmLeaseTimer();
  return KvClaimOutcome::kOk;
}

void Replica::StartPull(const std::shared_ptr<Live>& live) {
  const api::KvTransferParams& kv = *live->req.kv_transfer_params;
  const engine::EngineRequest& er = live->engine_req;
  const int bs = config_.engine.block_size;
  const int prompt = static_cast<int>(er.prompt_tokens.size());
  const int ids = kv.remote_block_ids ? static_cast<int>(kv.remote_block_ids->size()) : 0;
  // Only whole blocks travel; prefill held the full blocks of its prompt.
  const int pullable = engine::PullableTokens(prompt, ids, bs);
  const int local = engine_.PeekCachedTokens(er.prompt_tokens, er.cache_salt);
  const KvPeerDirectory::Peer* peer =
      peers_ && kv.remote_engine_id ? peers_->Find(*kv.remote_engine_id) : nullptr;
  const std::string request_id = kv.remote_request_id.value_or("");
  if (!engine::PlanKvPull(pullable, local, config_.pd.TransferModel(config_.engine)).pulls()) {
    // Too little to pull: recompute locally. As vLLM's decode does either way, tell the
    // prefill replica it may drop its hold (nothing waits for the answer).
    if (peer && !request_id.empty()) {
      asio::post(*peer->ctx, [peer, request_id] {
        int unused = 0;
        peer->replica->ClaimKv(request_id, &unused);
      });
    }
    ++pd_.decode_local;
    return Admit(live);
  }
  if (!peer) return OnPulled(live, KvClaimOutcome::kUnknownEngine, 0, pullable, local);
  // The claim runs on the prefill replica's thread, the answer on this one's. Both
  // replicas live until the fleet's loops have stopped; the request may not.
  std::weak_ptr<Live> weak = live;
  asio::post(*peer->ctx, [peer, request_id, weak, self = this, home = &ctx_, pullable, local] {
    int blocks = 0;
    const KvClaimOutcome outcome = peer->replica->ClaimKv(request_id, &blocks);
    asio::post(*home, [self, weak, outcome, blocks, pullable, local] {
      std::shared_ptr<Live> l = weak.lock();
      if (!l || self->shut_down_) return;
      self->OnPulled(l, outcome, blocks, pullable, local);
    });
  });
}

void Replica::OnPulled(const std::shared_ptr<Live>& live, KvClaimOutcome outcome, int blocks,
                       int pullable, int local) {
  if (!live_.contains(live->id)) return;  // dropped meanwhile (client gone, fault)
  engine::EngineRequest& er = live->engine_req;
  if (outcome == KvClaimOutcome::kOk) {
    const int loaded = std::min(blocks * config_.engine.block_size, pullable);
    const engine::KvPull pull =
        engine::PlanKvPull(loaded, local, config_.pd.TransferModel(config_.engine));
    if (!pull.pulls()) {
      ++pd_.decode_local;
    } else {
      er.kv_load_tokens = pull.load_tokens;
      er.kv_ready_s = EngineNow() + pull.transfer_s;
      ++pd_.decode_pulled;
      pd_.pulled_tokens += static_cast<uint64_t>(pull.missing_tokens);
      pd_.transfer_seconds += pull.transfer_s;
    }
    return Admit(live);
  }
  ++pd_.failures[static_cast<int>(outcome)];
  if (config_.pd.load_failure_policy == "recompute") {
    ++pd_.decode_recomputed;
    return Admit(live);
  }
  ++pd_.decode_failed;
  const api::KvTransferParams& kv = *live->req.kv_transfer_params;
  std::string message = "KV transfer failed (" + std::string(KvClaimOutcomeName(outcome)) +
                        "): remote_request_id '" + kv.remote_request_id.value_or("") +
                        "' on remote_engine_id '" + kv.remote_engine_id.value_or("") +
                        "' (kv_load_failure_policy: fail).";
  Reply(live->ex, [message = std::move(message)](http::Exchange& ex) {
    RespondApiError(ex, 500, message);
  });
  live_.erase(live->id);
}

void Replica::ArmLeaseTimer() {
  // Without a clock (time_scale 0) engine time only moves with steps, which expire holds.
  std::optional<double> next = engine_.NextHoldExpiryS();
  if (!next || config_.time_scale <= 0 || shut_down_) {
    lease_timer_.cancel();
    return;
  }
  lease_timer_.expires_after(WallDuration((*next - EngineNow()) * config_.time_scale) +
                             std::chrono::microseconds(1));
  lease_timer_.async_wait([this, epoch = epoch_](boost::system::error_code ec) {
    if (ec || shut_down_ || epoch != epoch_) return;
    engine_.ExpireHolds(EngineNow());
    PruneHolds();
    ArmLeaseTimer();
  });
}

void Replica::PruneHolds() {
  for (auto it = pd_holds_.begin(); it != pd_holds_.end();) {
    it = engine_.HeldBlocks(it->second).empty() ? pd_holds_.erase(it) : std::next(it);
  }
}

// ---- Faults ----

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

void Replica::HandleMetrics(std::shared_ptr<http::Exchange> ex) {
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
        ++generation_;
        ++epoch_;
        step_timer_.cancel();
        stepping_ = false;
        kv_wait_ = false;
        engine_ = engine::Engine(GenerationEngineConfig());
        pd_holds_.clear();
        lease_timer_.cancel();
        if (Status s = kv_->Restart(); !s.ok()) std::fprintf(stderr, "%s: %s\n", config_.name.c_str(), s.message().c_str());
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

void Replica::RestartEngine() {
  // A restarted vLLM: empty prefix cache, every counter and histogram back to zero.
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
  ttft_.Reset();
  itl_.Reset();
  e2e_.Reset();
  queue_.Reset();
  prompt_len_.Reset();
  output_len_.Reset();
}

Status Replica::StartKvEvents() {
  if ((!config_.kv_events.port && config_.kv_events.connect.empty()) || kv_) return Status::Ok();
  Result<std::unique_ptr<KvPublisher>> p =
      KvPublisher::Start(config_.host, config_.engine.model_name, config_.kv_events);
  if (!p.ok()) return p.status();
  kv_ = std::move(*p);
  return Status::Ok();
}

void Replica::PublishKvEvents() {
  if (!kv_) return;
  engine_.DrainKvEvents(&kv_scratch_);
  if (kv_scratch_.empty()) return;
  kv_->PublishStep(std::move(kv_scratch_), faults_);
  kv_scratch_.clear();
}

void Replica::HandleResetPrefixCache(std::shared_ptr<http::Exchange> ex) {
  // vLLM answers 200 with an empty body whether or not the pool agreed (it only logs
  // "Failed to reset prefix cache ... some blocks are not freed yet"); the
  // AllBlocksCleared event, or its absence, is the outcome.
  if (!engine_.ResetPrefixCache()) {
    std::fprintf(stderr, "%s: failed to reset prefix cache: some blocks are not freed yet\n",
                 config_.name.c_str());
  }
  PublishKvEvents();  // its own batch: an idle engine has no next step to carry it
  ex->Respond(200, {}, {});
}

engine::EngineConfig Replica::GenerationEngineConfig() const {
  engine::EngineConfig c = config_.engine;
  if (generation_ > 0) {
    uint64_t x = c.hash_seed + generation_ * 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    c.hash_seed = x ^ (x >> 31);
  }
  return c;
}

std::string Replica::MetricsText() const {
  using metrics::Label;
  using metrics::MetricType;
  const engine::EngineStats s = engine_.Stats();
  const engine::EngineConfig& c = config_.engine;
  const bool old = config_.old_metric_names;
  std::string out;
  out.reserve(16384);
  std::vector<Label> labels;
  if (!old) labels.push_back({"engine", "0"});
  labels.push_back({"model_name", c.model_name});
  // metrics_nan / metrics_missing: the three load gauges a router reads.
  const bool nan = faults_.active(fault::FaultKind::kMetricsNan);
  const bool missing = faults_.active(fault::FaultKind::kMetricsMissing);
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const double running = nan ? kNan : s.running;
  const double waiting = nan ? kNan : s.waiting;
  const double kv_usage = nan ? kNan : s.kv_cache_usage;

  if (!missing) {
    metrics::AppendGauge(out, "vllm:num_requests_running",
                         old ? "Number of requests currently running on GPU."
                             : "Number of requests in model execution batches.",
                         labels, running);
  }
  if (old) {
    metrics::AppendGauge(out, "vllm:num_requests_swapped", "Number of requests swapped to CPU.",
                         labels, 0.0);
  }
  if (!missing) {
    metrics::AppendGauge(out, "vllm:num_requests_waiting",
                         "Number of requests waiting to be processed.", labels, waiting);
  }
  if (old) {
    if (!missing) {
      metrics::AppendGauge(out, "vllm:gpu_cache_usage_perc",
                           "GPU KV-cache usage. 1 means 100 percent usage.", labels, kv_usage);
    }
    metrics::AppendGauge(out, "vllm:cpu_cache_usage_perc",
                         "CPU KV-cache usage. 1 means 100 percent usage.", labels, 0.0);
    metrics::AppendCounter(out, "vllm:gpu_prefix_cache_queries_total",
                           "GPU prefix cache queries, in terms of number of queried tokens.",
                           labels, static_cast<double>(s.prefix_queries_tokens));
    metrics::AppendCounter(out, "vllm:gpu_prefix_cache_hits_total",
                           "GPU prefix cache hits, in terms of number of cached tokens.", labels,
                           static_cast<double>(s.prefix_hits_tokens));
  } else {
    if (!missing) {
      metrics::AppendGauge(out, "vllm:kv_cache_usage_perc",
                           "KV-cache usage. 1 means 100 percent usage.", labels, kv_usage);
    }
    metrics::AppendCounter(out, "vllm:prefix_cache_queries_total",
                           "Prefix cache queries, in terms of number of queried tokens.", labels,
                           static_cast<double>(s.prefix_queries_tokens));
    metrics::AppendCounter(out, "vllm:prefix_cache_hits_total",
                           "Prefix cache hits, in terms of number of cached tokens.", labels,
                           static_cast<double>(s.prefix_hits_tokens));
  }
  metrics::AppendCounter(out, "vllm:num_preemptions_total",
                         "Cumulative number of preemption from the engine.", labels,
                         static_cast<double>(s.preemptions));
  metrics::AppendCounter(out, "vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                         labels, static_cast<double>(s.prompt_tokens));
  metrics::AppendCounter(out, "vllm:generation_tokens_total",
                         "Number of generation tokens processed.", labels,
                         static_cast<double>(s.generation_tokens));
  metrics::AppendHeader(out, "vllm:request_success_total",
                        "Count of successfully processed requests.", MetricType::kCounter);
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_stop), {"finished_reason", "stop"});
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_length), {"finished_reason", "length"});
  metrics::AppendSample(out, "vllm:request_success_total", labels,
                        static_cast<double>(s.finished_abort), {"finished_reason", "abort"});

  auto histogram = [&](std::string_view name, std::string_view help, const Histogram& h) {
    metrics::AppendHeader(out, name, help, MetricType::kHistogram);
    metrics::AppendHistogramSeries(out, name, labels, h.bounds, h.counts, h.sum);
  };
  histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            ttft_);
  if (old) {
    histogram("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds.", itl_);
  } else {
    histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              itl_);
  }
  histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            e2e_);
  histogram("vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.", queue_);
  histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", prompt_len_);
  histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
            output_len_);

  const std::string block_size = std::to_string(c.block_size);
  const std::string num_blocks = std::to_string(c.num_gpu_blocks);
  const char* prefix = c.enable_prefix_caching ? "True" : "False";
  std::vector<Label> info;
  if (old) {
    info = {{"block_size", block_size},      {"cache_dtype", "auto"},
            {"enable_prefix_caching", prefix}, {"gpu_memory_utilization", "0.9"},
            {"num_cpu_blocks", "2048"},      {"num_gpu_blocks", num_blocks},
            {"sliding_window", "None"},      {"swap_space_bytes", "4294967296"}};
  } else {
    info = {{"block_size", block_size},
            {"cache_dtype", "auto"},
            {"calculate_kv_scales", "False"},
            {"cpu_offload_gb", "0"},
            {"enable_prefix_caching", prefix},
            {"engine", "0"},
            {"gpu_memory_utilization", "0.9"},
            {"is_attention_free", "False"},
            {"num_cpu_blocks", "None"},
            {"num_gpu_blocks", num_blocks},
            {"num_gpu_blocks_override", "None"},
            {"prefix_caching_hash_algo", "xxhash"},
            {"sliding_window", "None"},
            {"swap_space", "4"},
            {"swap_space_bytes", "4294967296"}};
  }
  if (c.lora.enabled) {
    // As vLLM writes it: one series per label combination ever set, valued with the Unix
    // time it was last set; a reader takes the largest value (the current state).
    metrics::AppendHeader(out, "vllm:lora_requests_info", "Running stats on lora requests.",
                          MetricType::kGauge);
    const std::string max_lora = std::to_string(c.lora.max_loras);
    for (const LoraSeries& series : lora_series_) {
      const Label l[] = {{"max_lora", max_lora},
                         {"running_lora_adapters", series.running},
                         {"waiting_lora_adapters", series.waiting}};
      metrics::AppendSample(out, "vllm:lora_requests_info", l, series.unix_s);
    }
  }
  metrics::AppendGauge(out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                       info, 1.0);

  // Not a vLLM series: the simulator's identity and the fleet file's labels, so a
  // dashboard can tell replicas apart.
  // A fleet label's key becomes a valid Prometheus label name: every character outside
  // [a-zA-Z0-9_] turns into '_' (llm-d.ai/role -> llm_d_ai_role), a leading digit gets '_'.
  std::vector<Label> ident = {{"replica", config_.name}, {"preset", config_.preset}};
  std::vector<std::string> names;
  names.reserve(config_.labels.size());
  for (const auto& [k, v] : config_.labels) {
    std::string& n = names.emplace_back(k);
    for (char& ch : n) {
      const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_';
      if (!ok) ch = '_';
    }
    if (n.empty() || (n[0] >= '0' && n[0] <= '9')) n.insert(n.begin(), '_');
  }
  for (std::size_t i = 0; i < names.size(); ++i) ident.push_back({names[i], config_.labels[i].second});
  metrics::AppendGauge(out, "kvroute_sim_replica_info", "Simulated replica identity and labels.",
                       ident, 1.0);
  metrics::AppendHeader(out, "kvroute_sim_fault_active",
                        "Injected faults in force (1) or not (0), by kind (docs/FAULTS.md).",
                        MetricType::kGauge);
  const std::vector<Label> replica_label = {{"replica", config_.name}};
  for (int k = 0; k < fault::kNumFaultKinds; ++k) {
    const auto kind = static_cast<fault::FaultKind>(k);
    metrics::AppendSample(out, "kvroute_sim_fault_active", replica_label,
                          faults_.active(kind) ? 1.0 : 0.0,
                          {"kind", fault::FaultKindName(kind)});
  }

  // P/D (docs/SIM_API.md, "Prefill/decode disaggregation").
  metrics::AppendCounter(out, "kvroute_sim_pd_prefill_requests_total",
                         "Prefill legs answered with kv_transfer_params.", replica_label,
                         static_cast<double>(pd_.prefill_legs));
  metrics::AppendHeader(out, "kvroute_sim_pd_decode_requests_total",
                        "Decode legs by how their prompt KV was settled: pulled, local "
                        "(too little missing to pull), recomputed or failed (after a failed "
                        "pull, by kv_load_failure_policy).",
                        MetricType::kCounter);
  const std::pair<const char*, uint64_t> paths[] = {{"pulled", pd_.decode_pulled},
                                                    {"local", pd_.decode_local},
                                                    {"recomputed", pd_.decode_recomputed},
                                                    {"failed", pd_.decode_failed}};
  for (const auto& [path, n] : paths) {
    metrics::AppendSample(out, "kvroute_sim_pd_decode_requests_total", replica_label,
                          static_cast<double>(n), {"path", path});
  }
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_pulls_total",
                         "KV pulls from a prefill replica.", replica_label,
                         static_cast<double>(pd_.decode_pulled));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_pulled_tokens_total",
                         "Prompt tokens whose KV was pulled (missing from the local cache).",
                         replica_label, static_cast<double>(pd_.pulled_tokens));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_transfer_seconds_total",
                         "Engine seconds of KV pulls (tokens x bytes per token / bandwidth).",
                         replica_label, pd_.transfer_seconds);
  metrics::AppendHeader(out, "kvroute_sim_pd_kv_transfer_failures_total",
                        "KV pulls that could not happen, by reason.", MetricType::kCounter);
  for (KvClaimOutcome o : {KvClaimOutcome::kUnknownEngine, KvClaimOutcome::kPrefillDown,
                           KvClaimOutcome::kLeaseExpired}) {
    metrics::AppendSample(out, "kvroute_sim_pd_kv_transfer_failures_total", replica_label,
                          static_cast<double>(pd_.failures[static_cast<int>(o)]),
                          {"reason", KvClaimOutcomeName(o)});
  }
  metrics::AppendGauge(out, "kvroute_sim_pd_kv_leases",
                       "Finished prefill legs whose blocks are held for a decode leg.",
                       replica_label, static_cast<double>(s.kv_holds));
  metrics::AppendGauge(out, "kvroute_sim_pd_kv_held_blocks",
                       "KV blocks held for decode legs (counted in KV-cache usage).",
                       replica_label, static_cast<double>(s.kv_held_blocks));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_leases_released_total",
                         "Holds released by a decode leg's claim (since the engine started).",
                         replica_label, static_cast<double>(s.kv_holds_released));
  metrics::AppendCounter(out, "kvroute_sim_pd_kv_leases_expired_total",
                         "Holds dropped at the end of their lease (since the engine started).",
                         replica_label, static_cast<double>(s.kv_holds_expired));
  metrics::AppendGauge(out, "kvroute_sim_pd_waiting_for_remote_kvs",
                       "Decode legs waiting for their pulled KV (WAITING_FOR_REMOTE_KVS; also "
                       "counted as waiting requests).",
                       replica_label, static_cast<double>(s.waiting_for_remote_kvs));
  return out;
}

}  // namespace kvroute::sim
