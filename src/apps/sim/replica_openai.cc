// Replica's OpenAI-compatible generation endpoints (completions, chat, embeddings,
// responses): HandleGenerate turns a request into a Live, Deliver writes each engine
// step's output back (SSE chunks of a stream), Finish the end or the whole body; and
// GET /v1/models.
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "apps/sim/answers.h"
#include "apps/sim/replica.h"
#include "apps/sim/replica_internal.h"
#include "core/api/openai.h"
#include "core/engine/tokenizer.h"

namespace kvroute::sim {

namespace asio = boost::asio;

using detail::AppendHex;
using detail::RespondApiError;
using detail::UnixNow;
using detail::WallDuration;

namespace {

// Answers 400 and returns false when the engine would refuse a request of `prompt_len`
// prompt tokens and `max_tokens`: an empty prompt, max_tokens below 1, or both together
// above `max_model_len`.
bool ValidateLengths(http::Exchange& ex, api::Endpoint endpoint, int prompt_len, int max_tokens,
                     int max_model_len) {
  if (prompt_len == 0) {
    RespondApiError(ex, 400, "The prompt cannot be empty.",
                    endpoint == api::Endpoint::kChatCompletions ? "messages"
                    : endpoint == api::Endpoint::kCompletions   ? "prompt"
                                                                : "input");
    return false;
  }
  if (max_tokens < 1) {
    RespondApiError(ex, 400,
                    "max_tokens must be at least 1, got " + std::to_string(max_tokens) + ".",
                    "max_tokens");
    return false;
  }
  if (static_cast<int64_t>(prompt_len) + max_tokens > max_model_len) {
    RespondApiError(ex, 400,
                    "This model's maximum context length is " + std::to_string(max_model_len) +
                        " tokens. However, you requested " +
                        std::to_string(static_cast<int64_t>(prompt_len) + max_tokens) +
                        " tokens (" + std::to_string(prompt_len) + " in the messages, " +
                        std::to_string(max_tokens) +
                        " in the completion). Please reduce the length of the messages or "
                        "completion.");
    return false;
  }
  return true;
}

}  // namespace

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

void Replica::HandleGenerate(const std::shared_ptr<http::Exchange>& ex, api::Endpoint endpoint) {
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
  if (!ValidateLengths(*ex, endpoint, prompt_len, er.max_tokens, config_.engine.max_model_len)) {
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

void Replica::AppendObjectHead(std::string& out, const Live& l,
                               std::string_view chat_object) const {
  out += "{\"id\":\"";
  out += l.response_id;
  out += "\",\"object\":\"";
  out += l.chat ? chat_object : "text_completion";
  out += "\",\"created\":";
  out += std::to_string(l.created);
  out += ",\"model\":";
  out += l.model_json.empty() ? model_json_ : l.model_json;
}

void Replica::AppendChunkHead(std::string& out, const Live& l) const {
  out += "data: ";
  AppendObjectHead(out, l, "chat.completion.chunk");
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
  AppendObjectHead(body, l, "chat.completion");
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

}  // namespace kvroute::sim
