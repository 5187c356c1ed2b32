#include "apps/sim/tokenize_api.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/api/openai.h"
#include "core/api/tokenize.h"
#include "core/engine/tokenizer.h"

namespace kvroute::sim {

TokenizeApi::TokenizeApi(std::string model_name, int max_model_len)
    : model_name_(std::move(model_name)), max_model_len_(max_model_len) {}

void TokenizeApi::EnsureTable() {
  if (!len_.empty()) return;
  run_.assign(engine::kVocabSize, 0);
  len_.assign(engine::kVocabSize, 0);
  for (std::string_view w : engine::OutputTokenWords()) {
    const uint32_t id = engine::TokenId(w);
    Remember(w, std::span<const uint32_t>(&id, 1));
  }
}

void TokenizeApi::Remember(std::string_view text, std::span<const uint32_t> ids) {
  if (len_.empty()) EnsureTable();
  constexpr std::size_t kRun = engine::kBytesPerToken;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::size_t at = i * kRun;
    if (at >= text.size()) break;  // not Tokenize(text)'s ids: keep what fits
    const std::size_t n = std::min(kRun, text.size() - at);
    uint32_t packed = 0;
    std::memcpy(&packed, text.data() + at, n);
    const uint32_t id = ids[i];
    if (id >= engine::kVocabSize) continue;
    run_[id] = packed;
    len_[id] = static_cast<uint8_t>(n);
  }
}

std::string TokenizeApi::Placeholder(uint32_t id) { return "<unk:" + std::to_string(id) + ">"; }

std::string TokenizeApi::Detokenize(std::span<const uint32_t> ids) {
  EnsureTable();
  std::string out;
  out.reserve(ids.size() * engine::kBytesPerToken);
  for (uint32_t id : ids) {
    if (id < len_.size() && len_[id] > 0) {
      char bytes[engine::kBytesPerToken];
      std::memcpy(bytes, &run_[id], sizeof(bytes));
      out.append(bytes, len_[id]);
    } else {
      out += Placeholder(id);
    }
  }
  return out;
}

void TokenizeApi::Handle(http::Exchange& ex, bool detokenize) {
  if (detokenize) {
    HandleDetokenize(ex);
  } else {
    HandleTokenize(ex);
  }
}

namespace {

void RespondError(http::Exchange& ex, const api::ApiError& e) {
  ex.Respond(e.status, api::ErrorBody(e));
}

api::ApiError ModelNotFound(const std::string& model) {
  return api::MakeError(404, "The model `" + model + "` does not exist.", "model");
}

}  // namespace

void TokenizeApi::HandleTokenize(http::Exchange& ex) {
  api::TokenizeParse parsed = api::ParseTokenizeRequest(ex.request().body());
  if (!parsed.ok()) return RespondError(ex, parsed.error);
  const api::TokenizeRequest& req = *parsed.request;
  if (req.model != model_name_) return RespondError(ex, ModelNotFound(req.model));
  const std::vector<uint32_t> ids = engine::Tokenize(req.text);
  Remember(req.text, ids);
  std::vector<std::string> strs;
  if (req.return_token_strs) {
    strs.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      strs.emplace_back(std::string_view(req.text).substr(i * engine::kBytesPerToken,
                                                          engine::kBytesPerToken));
    }
  }
  ex.Respond(200, api::TokenizeAnswerBody(ids, max_model_len_,
                                          req.return_token_strs ? &strs : nullptr));
}

void TokenizeApi::HandleDetokenize(http::Exchange& ex) {
  api::DetokenizeParse parsed = api::ParseDetokenizeRequest(ex.request().body());
  if (!parsed.ok()) return RespondError(ex, parsed.error);
  const api::DetokenizeRequest& req = *parsed.request;
  if (req.model != model_name_) return RespondError(ex, ModelNotFound(req.model));
  for (std::size_t i = 0; i < req.tokens.size(); ++i) {
    if (req.tokens[i] >= engine::kVocabSize) {
      return RespondError(
          ex, api::MakeError(400,
                             "Token id " + std::to_string(req.tokens[i]) +
                                 " is out of vocabulary (ids 0.." +
                                 std::to_string(engine::kVocabSize - 1) + ").",
                             "tokens[" + std::to_string(i) + "]"));
    }
  }
  ex.Respond(200, api::DetokenizeAnswerBody(Detokenize(req.tokens)));
}

}  // namespace kvroute::sim
