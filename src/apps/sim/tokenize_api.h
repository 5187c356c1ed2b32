// A simulated replica's tokenizer endpoints, as vLLM serves them (REFERENCE.md section 21):
//
//   POST /tokenize    completion form {"model","prompt","add_special_tokens",
//                     "return_token_strs"} or chat form {"model","messages",
//                     "add_generation_prompt","continue_final_message","add_special_tokens",
//                     "chat_template","chat_template_kwargs","tools","return_token_strs"}
//                     -> {"count","max_model_len","tokens":[...],"token_strs":null | [...]}
//   POST /detokenize  {"model","tokens":[...]} -> {"prompt"}
//
// The ids are exactly the engine's for the same request: the text is what the replica's
// completion or chat path feeds engine::Tokenize (api::ParseTokenizeRequest renders chat
// messages with api::ParseRequest itself), tokenized by the same function. Special tokens:
// the simulated engine uses none (no BOS, no EOS id), so add_special_tokens is accepted in
// both forms and adds nothing; /tokenize of a completion and of a chat request agrees with
// the engine whatever it says. token_strs are each token's bytes (a 4-byte run; a run that
// cuts a multi-byte UTF-8 character shows U+FFFD for the cut part).
//
// /detokenize: the stand-in tokenizer is a hash (core/engine/tokenizer.h) and cannot be
// inverted, so the replica remembers, per id, the last 4-byte run it saw map to that id:
// every prompt it tokenizes (generation requests and /tokenize) and, from the start, the
// 64 output-token words. An id never seen becomes the placeholder "<unk:ID>". Bound: one
// entry per id of the vocabulary (engine::kVocabSize = 32000), 5 bytes each (160 KB,
// allocated on first use); hash collisions mean an id stands for the run seen last. Ids
// outside the vocabulary are a 400. The text is made valid UTF-8 (U+FFFD as above).
//
// Errors: a malformed body is 400 with an OpenAI-shaped body naming the field; another
// model is vLLM's 404 ("The model `X` does not exist.", NotFoundError, param "model").
//
// Thread: the replica's (no locks).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "adapters/http/server.h"

namespace kvroute::sim {

class TokenizeApi {
 public:
  TokenizeApi(std::string model_name, int max_model_len);

  // Answers POST /tokenize (`detokenize` false) or POST /detokenize on `ex`.
  void Handle(http::Exchange& ex, bool detokenize);

  // Records the runs of `text`, whose engine ids are `ids` (engine::Tokenize(text)).
  void Remember(std::string_view text, std::span<const uint32_t> ids);

  // The text /detokenize answers for `ids` (before UTF-8 repair); ids must be in the
  // vocabulary.
  std::string Detokenize(std::span<const uint32_t> ids);

  // The placeholder for an id never seen: "<unk:ID>".
  static std::string Placeholder(uint32_t id);

 private:
  void HandleTokenize(http::Exchange& ex);
  void HandleDetokenize(http::Exchange& ex);
  void EnsureTable();

  std::string model_name_;
  int max_model_len_;
  // Indexed by id; len_ 0: never seen. Empty until first use.
  std::vector<uint32_t> run_;  // the run's bytes, packed little-endian
  std::vector<uint8_t> len_;   // its length, 1..kBytesPerToken
};

}  // namespace kvroute::sim
