#include "simkit/workload/workload.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <utility>

#include "core/common/enum_names.h"

namespace kvroute::workload {
namespace {

// Key namespaces, so segments of different kinds never collide.
enum KeyKind : uint64_t {
  kSystemKey = 1,
  kQuestionKey = 2,
  kTurnKey = 3,
  kRandomKey = 4,
  kTracePrefixKey = 5,
  kTraceBodyKey = 6,
  kAdapterKey = 7,
  kTraceBlockKey = 8,
};

uint64_t SegmentKey(uint64_t seed, KeyKind kind, uint64_t index) {
  return MixKey(MixKey(seed, kind), index);
}

// The extent key of the chat generation prompt; output segments are keyed by request
// id, which never reaches this value.
constexpr uint64_t kGenerationPromptKey = ~0ULL;

Status ValidateDist(const char* field, const LengthDist& d, int64_t min_allowed) {
  Status st = d.Validate(min_allowed);
  if (st.ok()) return st;
  return Status::InvalidArgument(std::string(field) + ": " + st.message());
}

}  // namespace

std::string_view RoleName(Role role) {
  static constexpr EnumName<Role> kNames[] = {
      {Role::kSystem, "system"}, {Role::kUser, "user"}, {Role::kAssistant, "assistant"}};
  return NameOf(kNames, role, "user");
}

Status WorkloadSpec::Validate() const {
  switch (kind) {
    case WorkloadKind::kSharedPrefix:
    case WorkloadKind::kMultiTurn:
      if (num_groups < 1) return Status::InvalidArgument("num_groups: must be >= 1");
      if (num_prompts_per_group < 1) {
        return Status::InvalidArgument("num_prompts_per_group: must be >= 1");
      }
      if (num_groups * num_prompts_per_group > (int64_t{1} << 31)) {
        return Status::InvalidArgument("num_groups: groups x prompts too large");
      }
      if (Status st = ValidateDist("system_prompt_len", system_prompt_len, 0); !st.ok()) return st;
      if (Status st = ValidateDist("question_len", question_len, 1); !st.ok()) return st;
      if (kind == WorkloadKind::kMultiTurn) {
        if (max_turns < 1) return Status::InvalidArgument("max_turns: must be >= 1");
        if (!(think_time_s >= 0.0)) return Status::InvalidArgument("think_time_s: must be >= 0");
      }
      break;
    case WorkloadKind::kRandom:
      if (Status st = ValidateDist("input_len", input_len, 1); !st.ok()) return st;
      break;
    case WorkloadKind::kTrace:
      if (!trace) return Status::InvalidArgument("trace: no trace loaded");
      if (!(time_scale > 0.0)) return Status::InvalidArgument("time_scale: must be > 0");
      if (prefix_len < 0) return Status::InvalidArgument("prefix_len: must be >= 0");
      if (block_size < 1) return Status::InvalidArgument("block_size: must be >= 1");
      return Status::Ok();
  }
  return ValidateDist("output_len", output_len, 1);
}

void AppendSegmentText(uint64_t key, int32_t tokens, std::string* out) {
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(tokens) * kBytesPerToken);
  char* p = out->data() + start;
  // Each token is three letters and a space, from a hash of (key, index): cheap, and
  // different keys diverge on their first token with probability 1 - 1/26^3.
  for (int32_t i = 0; i < tokens; ++i) {
    const uint64_t h = Mix64(key + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL);
    p[0] = static_cast<char>('a' + (h & 0xffff) % 26);
    p[1] = static_cast<char>('a' + ((h >> 16) & 0xffff) % 26);
    p[2] = static_cast<char>('a' + ((h >> 32) & 0xffff) % 26);
    p[3] = ' ';
    p += kBytesPerToken;
  }
}

namespace {

void AppendAnySegment(const Segment& s, const OutputTextFn& output_text, std::string* out) {
  if (s.is_output) {
    assert(output_text);
    output_text(s.key, s.tokens, out);
  } else {
    AppendSegmentText(s.key, s.tokens, out);
  }
}

}  // namespace

void RenderPrompt(const RequestSpec& spec, const OutputTextFn& output_text, std::string* text,
                  std::vector<PrefixExtent>* extents) {
  text->clear();
  if (extents) extents->clear();
  if (spec.endpoint == api::Endpoint::kCompletions) {
    for (const Segment& s : spec.segments) {
      const size_t before = text->size();
      AppendAnySegment(s, output_text, text);
      if (extents) extents->push_back({s.key, static_cast<uint32_t>(text->size() - before)});
    }
    return;
  }
  // Chat: render message by message with the shared template so the bytes equal what a
  // server renders from the messages. Extents: the message header is counted with the
  // message's first segment, its trailing framing with the last one.
  std::string content;
  size_t i = 0;
  const size_t n = spec.segments.size();
  while (i < n) {
    const Role role = spec.segments[i].role;
    const size_t first_extent = extents ? extents->size() : 0;
    size_t j = i;
    content.clear();
    while (j < n && spec.segments[j].role == role) {
      const size_t content_before = content.size();
      AppendAnySegment(spec.segments[j], output_text, &content);
      if (extents) {
        extents->push_back(
            {spec.segments[j].key, static_cast<uint32_t>(content.size() - content_before)});
      }
      ++j;
    }
    const size_t before = text->size();
    api::AppendChatMessage(*text, RoleName(role), content);
    if (extents) {
      const size_t header = text->find(content, before) - before;
      const size_t trailer = text->size() - before - header - content.size();
      (*extents)[first_extent].bytes += static_cast<uint32_t>(header);
      extents->back().bytes += static_cast<uint32_t>(trailer);
    }
    i = j;
  }
  const size_t before = text->size();
  api::AppendChatGenerationPrompt(*text);
  if (extents) {
    extents->push_back({kGenerationPromptKey, static_cast<uint32_t>(text->size() - before)});
  }
}

std::vector<OwnedMessage> ChatMessages(const RequestSpec& spec, const OutputTextFn& output_text) {
  std::vector<OwnedMessage> out;
  for (const Segment& s : spec.segments) {
    if (out.empty() || out.back().role != s.role) out.push_back({s.role, {}});
    AppendAnySegment(s, output_text, &out.back().content);
  }
  return out;
}

RequestGenerator::RequestGenerator(const WorkloadSpec& spec, const ArrivalSpec& arrivals,
                                   uint64_t seed)
    : spec_(spec),
      arrival_spec_(arrivals),
      seed_(seed),
      arrivals_(arrivals, seed),
      rng_(MixKey(seed, 0x5e9ULL)) {
  if (spec_.kind == WorkloadKind::kSharedPrefix || spec_.kind == WorkloadKind::kMultiTurn) {
    // Prompt lengths are properties of the prompt set, drawn once.
    Rng setup(MixKey(seed, 0x5e7ULL));
    system_len_.resize(spec_.num_groups);
    for (int32_t& len : system_len_)
      len = static_cast<int32_t>(spec_.system_prompt_len.Sample(setup));
    question_len_.resize(spec_.num_groups * spec_.num_prompts_per_group);
    for (int32_t& len : question_len_) len = static_cast<int32_t>(spec_.question_len.Sample(setup));
  }
  if (spec_.kind == WorkloadKind::kSharedPrefix) {
    order_.resize(question_len_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
    ShufflePrompts();
  }
  if (spec_.kind == WorkloadKind::kMultiTurn) {
    // Conversations interleave groups (0,0), (1,0), ..., so the first arrivals already
    // touch every group.
    const int64_t total = spec_.num_groups * spec_.num_prompts_per_group;
    conversations_.resize(total);
    for (int64_t c = 0; c < total; ++c) conversations_[c].group = c % spec_.num_groups;
  }
  if (spec_.adapters.count > 0 && spec_.adapters.share > 0) {
    adapter_cdf_.resize(static_cast<size_t>(spec_.adapters.count));
    double sum = 0.0;
    for (int32_t k = 0; k < spec_.adapters.count; ++k) {
      sum += 1.0 / std::pow(static_cast<double>(k + 1), spec_.adapters.zipf);
      adapter_cdf_[static_cast<size_t>(k)] = sum;
    }
    for (double& c : adapter_cdf_) c /= sum;
    adapter_cdf_.back() = 1.0;
  }
}

std::string AdapterName(int32_t k) { return "adapter-" + std::to_string(k); }

bool RequestGenerator::Next(RequestSpec* out) {
  if (!NextRequest(out)) return false;
  out->adapter = -1;
  if (adapter_cdf_.empty()) return true;
  const uint64_t key = out->conversation_id >= 0 ? static_cast<uint64_t>(out->conversation_id)
                                                 : out->id;
  const uint64_t base = MixKey(MixKey(seed_, kAdapterKey), key);
  const double u_share = static_cast<double>(Mix64(base) >> 11) * 0x1.0p-53;
  if (u_share >= spec_.adapters.share) return true;
  const double u_pick = static_cast<double>(Mix64(base ^ 0xada97e5ULL) >> 11) * 0x1.0p-53;
  const auto it = std::upper_bound(adapter_cdf_.begin(), adapter_cdf_.end(), u_pick);
  out->adapter = static_cast<int32_t>(
      std::min<std::ptrdiff_t>(it - adapter_cdf_.begin(),
                               static_cast<std::ptrdiff_t>(adapter_cdf_.size()) - 1));
  return true;
}

void RequestGenerator::ShufflePrompts() {
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng_.Below(i)]);
  order_pos_ = 0;
}

bool RequestGenerator::NextRequest(RequestSpec* out) {
  RequestSpec& r = *out;
  r.segments.clear();
  r.group_id = -1;
  r.conversation_id = -1;
  r.turn = 0;
  r.after_request = -1;
  r.think_time_s = 0.0;
  r.endpoint = spec_.endpoint;

  if (spec_.kind == WorkloadKind::kTrace) {
    const std::vector<TraceRow>& rows = *spec_.trace;
    if (trace_pos_ >= rows.size()) return false;
    if (arrival_spec_.num_requests > 0 &&
        next_id_ >= static_cast<uint64_t>(arrival_spec_.num_requests)) {
      return false;
    }
    const TraceRow& row = rows[trace_pos_++];
    r.arrival_s = row.time_s / spec_.time_scale;
    if (arrival_spec_.duration_s > 0.0 && r.arrival_s >= arrival_spec_.duration_s) return false;
    r.id = next_id_++;
    r.max_tokens = row.generated_tokens;
    r.prompt_tokens = row.context_tokens;
    if (!row.hash_ids.empty()) {
      r.group_id = static_cast<int64_t>(row.hash_ids.front() & (~0ULL >> 1));
      int64_t left = row.context_tokens;
      for (uint64_t id : row.hash_ids) {
        const int64_t tokens = std::min(left, spec_.block_size);
        if (tokens <= 0) break;
        r.segments.push_back({SegmentKey(seed_, kTraceBlockKey, id), static_cast<int32_t>(tokens),
                              Role::kUser, false});
        left -= tokens;
      }
      if (left > 0) {  // fewer ids than blocks: the rest is this request's own text
        r.segments.push_back({SegmentKey(seed_, kTraceBodyKey, r.id), static_cast<int32_t>(left),
                              Role::kUser, false});
      }
      return true;
    }
    int64_t prefix = 0;
    if (row.prefix_group >= 0) {
      prefix = row.prefix_tokens >= 0 ? row.prefix_tokens : spec_.prefix_len;
      prefix = std::min(prefix, row.context_tokens);
      r.group_id = row.prefix_group;
    }
    if (prefix > 0) {
      r.segments.push_back({SegmentKey(seed_, kTracePrefixKey, row.prefix_group),
                            static_cast<int32_t>(prefix), Role::kSystem, false});
    }
    if (row.context_tokens > prefix) {
      r.segments.push_back({SegmentKey(seed_, kTraceBodyKey, r.id),
                            static_cast<int32_t>(row.context_tokens - prefix), Role::kUser, false});
    }
    return true;
  }

  std::optional<double> t = arrivals_.Next();
  if (!t) return false;
  r.arrival_s = *t;
  r.id = next_id_++;
  r.max_tokens = spec_.output_len.Sample(rng_);

  switch (spec_.kind) {
    case WorkloadKind::kSharedPrefix: {
      if (order_pos_ >= order_.size()) ShufflePrompts();
      const uint32_t prompt = order_[order_pos_++];
      const int64_t group = prompt / spec_.num_prompts_per_group;
      r.group_id = group;
      if (system_len_[group] > 0) {
        r.segments.push_back(
            {SegmentKey(seed_, kSystemKey, group), system_len_[group], Role::kSystem, false});
      }
      r.segments.push_back(
          {SegmentKey(seed_, kQuestionKey, prompt), question_len_[prompt], Role::kUser, false});
      break;
    }
    case WorkloadKind::kMultiTurn: {
      // Users take turns at random: a deterministic cycle would line conversations up
      // with round-robin's cycle and hand that policy perfect affinity by accident.
      const size_t c = static_cast<size_t>(rng_.Below(conversations_.size()));
      Conversation& conv = conversations_[c];
      if (conv.id < 0 || conv.turns >= spec_.max_turns) {
        conv.id = next_conversation_id_++;
        conv.turns = 0;
        conv.last_request = -1;
        conv.history.clear();
        if (system_len_[conv.group] > 0) {
          conv.history.push_back({SegmentKey(seed_, kSystemKey, conv.group),
                                  system_len_[conv.group], Role::kSystem, false});
        }
      }
      r.group_id = conv.group;
      r.conversation_id = conv.id;
      r.turn = conv.turns;
      r.after_request = conv.last_request;
      r.think_time_s = conv.last_request >= 0 ? spec_.think_time_s : 0.0;
      // The new user message: the conversation's first question has the prompt set's
      // length; later ones draw fresh lengths.
      const int32_t qlen = conv.turns == 0 ? question_len_[c]
                                           : static_cast<int32_t>(spec_.question_len.Sample(rng_));
      conv.history.push_back({SegmentKey(seed_, kTurnKey, r.id), qlen, Role::kUser, false});
      r.segments = conv.history;
      conv.history.push_back({r.id, static_cast<int32_t>(r.max_tokens), Role::kAssistant, true});
      conv.last_request = static_cast<int64_t>(r.id);
      ++conv.turns;
      break;
    }
    case WorkloadKind::kRandom:
      r.segments.push_back({SegmentKey(seed_, kRandomKey, r.id),
                            static_cast<int32_t>(spec_.input_len.Sample(rng_)), Role::kUser,
                            false});
      break;
    case WorkloadKind::kTrace:
      break;
  }
  r.prompt_tokens = 0;
  for (const Segment& s : r.segments) r.prompt_tokens += s.tokens;
  return true;
}

}  // namespace kvroute::workload
