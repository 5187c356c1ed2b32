// Workload generators: what each request says. Shared by `kvroute bench` (live load) and
// `kvroute simulate` (virtual time). Pure and deterministic given the seed.
//
// A prompt is a list of segments. Each segment is a run of text identified by a key:
// equal keys give equal text, so two prompts share exactly the text of their common
// leading segments. That is how prefix sharing is expressed (and what the oracle in
// oracle.h reasons about), without holding the text of a million prompts in memory:
// the text is rendered on demand (RenderPrompt).
//
// Lengths are in tokens of the engine's stand-in tokenizer (core/engine/tokenizer.h: one
// token per 4 bytes). Generated text is made of 4-byte words (three lowercase letters and
// a space), so a segment of n tokens is exactly 4n bytes and a completions prompt of
// segments totalling n tokens tokenizes to exactly n tokens, aligned on every segment
// boundary. (Chat prompts add the chat template's bytes, see RenderPrompt.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/api/openai.h"
#include "simkit/workload/arrivals.h"
#include "simkit/workload/distribution.h"
#include "simkit/workload/trace.h"

namespace kvroute::workload {

inline constexpr int kBytesPerToken = 4;

enum class Role : uint8_t { kSystem, kUser, kAssistant };
std::string_view RoleName(Role role);

struct Segment {
  // Text identity. For ordinary segments a hash; for an output segment the id of the
  // request whose generated text this is.
  uint64_t key = 0;
  int32_t tokens = 0;
  Role role = Role::kUser;
  bool is_output = false;  // the text request `key` generated (a previous chat turn)
};

// One request to send.
struct RequestSpec {
  uint64_t id = 0;         // 0, 1, 2, ... in generation order
  double arrival_s = 0.0;  // earliest send time, seconds from the start
  api::Endpoint endpoint = api::Endpoint::kCompletions;
  std::vector<Segment> segments;
  int64_t prompt_tokens = 0;  // sum of segment tokens (a completions prompt's exact count)
  int64_t max_tokens = 0;     // output length; send with ignore_eos so it is exact
  // shared-prefix group (or the trace's prefix group, or a Mooncake row's first hash id);
  // -1 none
  int64_t group_id = -1;
  int64_t conversation_id = -1;
  int32_t turn = 0;  // 0-based turn within the conversation
  // Multi-turn dependency: when >= 0, the request must not be sent before request
  // `after_request` has finished plus `think_time_s` (its prompt contains that
  // request's output). A driver sends at max(arrival_s, finish + think_time_s).
  int64_t after_request = -1;
  double think_time_s = 0.0;
  // LoRA: the adapter the request names as its model (AdapterName(adapter)); -1 for the
  // base model.
  int32_t adapter = -1;
};

// A population of LoRA adapters the requests name (WorkloadSpec::adapters). Each request
// names one with probability `share`, adapter k (0-based) with probability proportional
// to 1 / (k+1)^zipf (0: uniform). The draw is a pure function of (seed, key): the key is
// the conversation id in a multi-turn workload (every turn of a conversation keeps its
// adapter, so its history stays cacheable under it), else the request id; so it never
// shifts the workload's other draws.
struct AdapterPopulation {
  int32_t count = 0;  // 0: no adapters
  double zipf = 1.0;
  double share = 1.0;
};

// "adapter-<k>".
std::string AdapterName(int32_t k);

enum class WorkloadKind { kSharedPrefix, kMultiTurn, kRandom, kTrace };

struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::kSharedPrefix;
  api::Endpoint endpoint = api::Endpoint::kCompletions;
  // shared-prefix and multi-turn (inference-perf names). In multi-turn, each prompt of
  // a group is one conversation (a user) whose system prompt is the group's; each
  // arrival is the next turn of a conversation picked uniformly at random.
  int64_t num_groups = 1;
  int64_t num_prompts_per_group = 1;
  LengthDist system_prompt_len = LengthDist::Fixed(0);
  LengthDist question_len = LengthDist::Fixed(16);
  LengthDist output_len = LengthDist::Fixed(16);
  // multi-turn: after this many turns a conversation starts over (new conversation id,
  // same system prompt); think time between a turn's answer and the next question.
  int32_t max_turns = 8;
  double think_time_s = 0.0;
  // random: prompt length per request (output_len as above).
  LengthDist input_len = LengthDist::Fixed(128);
  AdapterPopulation adapters;
  // trace replay: rows (see trace.h); arrivals come from the trace, scaled by
  // time_scale (2 = twice as fast); requests in the same prefix group share their first
  // min(prefix_len, ContextTokens) tokens (row's PrefixTokens when present). A row with
  // hash ids (Mooncake's format) is one segment of block_size tokens per id instead (the
  // last one what remains of ContextTokens), keyed by the id: equal ids, equal text.
  std::shared_ptr<const std::vector<TraceRow>> trace;
  double time_scale = 1.0;
  int64_t prefix_len = 0;
  int64_t block_size = 512;

  // Ok when usable, else InvalidArgument with the message "field: problem".
  Status Validate() const;
};

// Appends the text of a generated request's output: `tokens` tokens of request `id`.
// Simulate passes the engine's OutputTokenText; a live bench the text it received.
using OutputTextFn = std::function<void(uint64_t id, int32_t tokens, std::string* out)>;

// The bytes of a segment in a rendered prompt, for prefix reasoning (oracle.h).
struct PrefixExtent {
  uint64_t key = 0;
  uint32_t bytes = 0;
};

// Appends a non-output segment's text: exactly segment.tokens * 4 bytes.
void AppendSegmentText(uint64_t key, int32_t tokens, std::string* out);

// Renders `spec`'s prompt into `*text` (cleared first) as the engine will see it:
// completions: the segments' texts concatenated; chat: consecutive segments with the
// same role form one message, rendered with api::AppendChatMessage, followed by the
// generation prompt (the text a server derives from the messages). When `extents` is
// non-null it receives one extent per segment (in chat the message framing bytes are
// counted in the first/last segment of the message) plus, in chat, a final extent for
// the generation prompt. `output_text` is needed only when the spec has output segments.
void RenderPrompt(const RequestSpec& spec, const OutputTextFn& output_text, std::string* text,
                  std::vector<PrefixExtent>* extents = nullptr);

// The chat messages of `spec` (role, content), as a live client sends them.
struct OwnedMessage {
  Role role;
  std::string content;
};
std::vector<OwnedMessage> ChatMessages(const RequestSpec& spec, const OutputTextFn& output_text);

// Generates the requests of a workload in arrival order (by arrival_s; dependent turns
// may be sent later than arrival_s). Streaming: memory does not grow with the count.
class RequestGenerator {
 public:
  // `spec` and `arrivals` must Validate(). Trace workloads ignore `arrivals` except
  // num_requests and duration_s (which truncate the trace).
  RequestGenerator(const WorkloadSpec& spec, const ArrivalSpec& arrivals, uint64_t seed);

  // Fills `*out` (reusing its segment storage) and returns true, or returns false at
  // the end of the workload.
  bool Next(RequestSpec* out);

 private:
  struct Conversation {
    int64_t group = 0;
    int64_t id = -1;
    int32_t turns = 0;
    int64_t last_request = -1;
    std::vector<Segment> history;
  };
  void ShufflePrompts();
  bool NextRequest(RequestSpec* out);

  WorkloadSpec spec_;
  ArrivalSpec arrival_spec_;
  uint64_t seed_;
  ArrivalProcess arrivals_;
  Rng rng_;
  uint64_t next_id_ = 0;
  std::vector<int32_t> system_len_;    // per group
  std::vector<int32_t> question_len_;  // per prompt (group-major)
  std::vector<uint32_t> order_;        // shared-prefix: shuffled prompt order, cycled
  size_t order_pos_ = 0;
  std::vector<Conversation> conversations_;
  int64_t next_conversation_id_ = 0;
  size_t trace_pos_ = 0;
  std::vector<double> adapter_cdf_;  // cumulative Zipf weights, normalised, last = 1
};

}  // namespace kvroute::workload
