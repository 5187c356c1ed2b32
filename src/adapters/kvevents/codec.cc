#include "adapters/kvevents/codec.h"

#include <fmt/format.h>
#include <msgpuck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

namespace kvroute::kvevents {
namespace {

constexpr std::string_view kBlockStored = "BlockStored";
constexpr std::string_view kBlockRemoved = "BlockRemoved";
constexpr std::string_view kAllBlocksCleared = "AllBlocksCleared";

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ---- encoding --------------------------------------------------------------------------

// Appends msgpack items to a string; msgpuck writes into a buffer it is given, sized with
// its mp_sizeof_* functions.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void Array(uint32_t n) { Put(mp_sizeof_array(n), [&](char* p) { mp_encode_array(p, n); }); }
  void Map(uint32_t n) { Put(mp_sizeof_map(n), [&](char* p) { mp_encode_map(p, n); }); }
  void Uint(uint64_t v) { Put(mp_sizeof_uint(v), [&](char* p) { mp_encode_uint(p, v); }); }
  void Int(int64_t v) {
    if (v >= 0) return Uint(static_cast<uint64_t>(v));
    Put(mp_sizeof_int(v), [&](char* p) { mp_encode_int(p, v); });
  }
  void Double(double v) { Put(mp_sizeof_double(v), [&](char* p) { mp_encode_double(p, v); }); }
  void Nil() { Put(mp_sizeof_nil(), [&](char* p) { mp_encode_nil(p); }); }
  void Str(std::string_view s) {
    const auto n = static_cast<uint32_t>(s.size());
    Put(mp_sizeof_str(n), [&](char* p) { mp_encode_str(p, s.data(), n); });
  }
  void Bin(std::span<const uint8_t> b) {
    const auto n = static_cast<uint32_t>(b.size());
    Put(mp_sizeof_bin(n),
        [&](char* p) { mp_encode_bin(p, reinterpret_cast<const char*>(b.data()), n); });
  }
  void Hash(uint64_t h, HashForm form) {
    if (form == HashForm::kInt) return Uint(h);
    const std::array<uint8_t, 32> d = ExpandHash(h);
    Bin(d);
  }

 private:
  template <typename F>
  void Put(size_t n, F&& encode) {
    const size_t at = out_->size();
    out_->resize(at + n);
    encode(out_->data() + at);
  }
  std::string* out_;
};

void EncodeEvent(Writer& w, const KvEvent& e, Format format, HashForm hf) {
  const bool map = format == Format::kMap;
  auto key = [&](std::string_view k) {
    if (map) w.Str(k);
  };
  auto hashes = [&] {
    key("block_hashes");
    w.Array(static_cast<uint32_t>(e.block_hashes.size()));
    for (uint64_t h : e.block_hashes) w.Hash(h, hf);
  };
  // The event's container (a map of `fields`, or an array of `items`) and its type tag.
  auto begin = [&](uint32_t fields, uint32_t items, std::string_view type) {
    if (map) {
      w.Map(fields);
    } else {
      w.Array(items);
    }
    key("type");
    w.Str(type);
  };
  switch (e.kind) {
    case EventKind::kBlockStored: {
      const bool lora = !e.lora_name.empty();
      begin(8, lora ? 8 : 7, kBlockStored);  // lora_name's default (None) is dropped when last
      hashes();
      key("parent_block_hash");
      if (e.parent_hash) {
        w.Hash(*e.parent_hash, hf);
      } else {
        w.Nil();
      }
      key("token_ids");
      w.Array(static_cast<uint32_t>(e.token_ids.size()));
      for (uint32_t t : e.token_ids) w.Uint(t);
      key("block_size");
      w.Int(e.block_size);
      key("lora_id");
      w.Nil();  // the engine names adapters; it has no numeric LoRA id
      key("medium");
      w.Str(MediumName(e.medium));
      if (map || lora) {
        key("lora_name");
        if (lora) {
          w.Str(e.lora_name);
        } else {
          w.Nil();
        }
      }
      break;
    }
    case EventKind::kBlockRemoved:
      begin(3, 3, kBlockRemoved);
      hashes();
      key("medium");
      w.Str(MediumName(e.medium));
      break;
    case EventKind::kAllBlocksCleared:
      begin(1, 1, kAllBlocksCleared);
      break;
  }
}

// ---- decoding --------------------------------------------------------------------------

// Reads one validated payload. Every read first checks the type; mp_check has already
// proved that every item lies inside the buffer, so the mp_decode_* calls cannot overrun.
class Reader {
 public:
  Reader(const char* p, const char* end) : p_(p), end_(end) {}

  mp_type Type() const { return mp_typeof(*p_); }
  bool AtEnd() const { return p_ >= end_; }
  void Skip() { mp_next(&p_); }

  Status Uint64(std::string_view what, uint64_t* v) {
    if (Type() != MP_UINT) return Bad(what, "must be an unsigned integer");
    *v = mp_decode_uint(&p_);
    return Status::Ok();
  }
  // An integer of either sign into [lo, hi].
  Status Int(std::string_view what, int64_t lo, int64_t hi, int64_t* v) {
    if (Type() == MP_UINT) {
      const uint64_t u = mp_decode_uint(&p_);
      if (u > static_cast<uint64_t>(hi)) return Bad(what, fmt::format("{} is above {}", u, hi));
      *v = static_cast<int64_t>(u);
    } else if (Type() == MP_INT) {
      *v = mp_decode_int(&p_);
    } else {
      return Bad(what, "must be an integer");
    }
    if (*v < lo || *v > hi) return Bad(what, fmt::format("{} is outside [{}, {}]", *v, lo, hi));
    return Status::Ok();
  }
  Status Number(std::string_view what, double* v) {
    switch (Type()) {
      case MP_DOUBLE: *v = mp_decode_double(&p_); break;
      case MP_FLOAT: *v = mp_decode_float(&p_); break;
      case MP_UINT: *v = static_cast<double>(mp_decode_uint(&p_)); break;
      case MP_INT: *v = static_cast<double>(mp_decode_int(&p_)); break;
      default: return Bad(what, "must be a number");
    }
    if (!std::isfinite(*v)) return Bad(what, "must be finite");
    return Status::Ok();
  }
  Status String(std::string_view what, std::string_view* s) {
    if (Type() != MP_STR) return Bad(what, "must be a string");
    uint32_t n = 0;
    const char* d = mp_decode_str(&p_, &n);
    if (n > kMaxStringBytes) return Bad(what, fmt::format("string of {} bytes (limit {})", n, kMaxStringBytes));
    *s = std::string_view(d, n);
    return Status::Ok();
  }
  Status Array(std::string_view what, uint32_t* n) {
    if (Type() != MP_ARRAY) return Bad(what, "must be an array");
    *n = mp_decode_array(&p_);
    return Status::Ok();
  }
  Status Map(std::string_view what, uint32_t* n) {
    if (Type() != MP_MAP) return Bad(what, "must be a map");
    *n = mp_decode_map(&p_);
    return Status::Ok();
  }
  bool TakeNil() {
    if (Type() != MP_NIL) return false;
    mp_decode_nil(&p_);
    return true;
  }
  // A block hash: uint64, negative int64 (two's complement kept), or bin (folded).
  Status Hash(std::string_view what, uint64_t* h) {
    switch (Type()) {
      case MP_UINT:
        *h = mp_decode_uint(&p_);
        return Status::Ok();
      case MP_INT:
        *h = static_cast<uint64_t>(mp_decode_int(&p_));
        return Status::Ok();
      case MP_BIN: {
        uint32_t n = 0;
        const char* d = mp_decode_bin(&p_, &n);
        if (n == 0 || n > 64) return Bad(what, fmt::format("a digest of {} bytes (1-64 expected)", n));
        *h = FoldHashBytes({reinterpret_cast<const uint8_t*>(d), n});
        return Status::Ok();
      }
      default:
        return Bad(what, "must be an integer or bytes");
    }
  }

  static Status Bad(std::string_view what, std::string_view why) {
    return Status::InvalidArgument(fmt::format("{}: {}", what, why));
  }

 private:
  const char* p_;
  const char* end_;
};

// Depth of nested arrays and maps, walked without recursion. mp_check has validated the
// buffer, so headers can be read directly.
Status CheckNesting(const char* p, const char* end) {
  uint64_t pending[kMaxNesting + 1];
  int depth = 0;
  pending[0] = 1;  // the root item
  while (true) {
    while (depth >= 0 && pending[depth] == 0) --depth;
    if (depth < 0) return Status::Ok();
    --pending[depth];
    if (p >= end) return Status::InvalidArgument("truncated payload");
    const mp_type t = mp_typeof(*p);
    if (t == MP_ARRAY || t == MP_MAP) {
      const uint64_t n = t == MP_ARRAY ? mp_decode_array(&p) : 2ull * mp_decode_map(&p);
      if (depth + 1 > kMaxNesting) {
        return Status::InvalidArgument(fmt::format("nested deeper than {} levels", kMaxNesting));
      }
      pending[++depth] = n;
    } else {
      mp_next(&p);
    }
  }
}

struct Fields {
  std::string_view tag;
  bool has_tag = false;
};

std::string EventWhere(size_t i, std::string_view tag) {
  return tag.empty() ? fmt::format("event {}", i) : fmt::format("event {} ({})", i, tag);
}

// Field readers shared by both event forms; `name` is the field, `where` the event.
class EventBuilder {
 public:
  EventBuilder(Reader& r, std::string where, size_t* tokens_left)
      : r_(r), where_(std::move(where)), tokens_left_(tokens_left) {}

  // Reads field `name` into e; unknown names are skipped.
  Status Field(std::string_view name, KvEvent* e) {
    const std::string what = where_ + ": " + std::string(name);
    if (name == "block_hashes") {
      uint32_t n = 0;
      if (Status s = r_.Array(what, &n); !s.ok()) return s;
      if (n > kMaxHashesPerEvent) {
        return Reader::Bad(what, fmt::format("{} hashes (limit {})", n, kMaxHashesPerEvent));
      }
      e->block_hashes.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        if (Status s = r_.Hash(fmt::format("{}[{}]", what, i), &e->block_hashes[i]); !s.ok()) return s;
      }
    } else if (name == "parent_block_hash") {
      if (r_.TakeNil()) {
        e->parent_hash.reset();
      } else {
        uint64_t h = 0;
        if (Status s = r_.Hash(what, &h); !s.ok()) return s;
        e->parent_hash = h;
      }
    } else if (name == "token_ids") {
      uint32_t n = 0;
      if (Status s = r_.Array(what, &n); !s.ok()) return s;
      if (n > *tokens_left_) {
        return Reader::Bad(what, fmt::format("more than {} token ids in one batch", kMaxTokensPerBatch));
      }
      *tokens_left_ -= n;
      e->token_ids.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        int64_t t = 0;
        if (Status s = r_.Int(fmt::format("{}[{}]", what, i), 0, UINT32_MAX, &t); !s.ok()) return s;
        e->token_ids[i] = static_cast<uint32_t>(t);
      }
    } else if (name == "block_size") {
      int64_t v = 0;
      if (Status s = r_.Int(what, 0, kMaxBlockSize, &v); !s.ok()) return s;
      e->block_size = static_cast<int32_t>(v);
    } else if (name == "medium") {
      if (r_.TakeNil()) {
        e->medium = Medium::kGpu;
      } else {
        std::string_view m;
        if (Status s = r_.String(what, &m); !s.ok()) return s;
        e->medium = MediumFromName(m);
      }
    } else if (name == "lora_name") {
      if (r_.TakeNil()) {
        e->lora_name.clear();
      } else {
        std::string_view m;
        if (Status s = r_.String(what, &m); !s.ok()) return s;
        e->lora_name = std::string(m);
      }
    } else {
      r_.Skip();  // lora_id, extra_keys, group_idx, kv_cache_spec_*, and anything newer
    }
    return Status::Ok();
  }

  // The checks a complete event must pass.
  Status Finish(const KvEvent& e) const {
    if (e.kind != EventKind::kBlockStored || e.token_ids.empty()) return Status::Ok();
    const uint64_t want = static_cast<uint64_t>(e.block_hashes.size()) *
                          static_cast<uint64_t>(e.block_size);
    if (want != e.token_ids.size()) {
      return Status::InvalidArgument(
          fmt::format("{}: {} token_ids for {} blocks of {} tokens", where_, e.token_ids.size(),
                      e.block_hashes.size(), e.block_size));
    }
    return Status::Ok();
  }

 private:
  Reader& r_;
  std::string where_;
  size_t* tokens_left_;
};

// Declaration order of each event's fields, for the array form.
constexpr std::string_view kStoredFields[] = {"block_hashes", "parent_block_hash", "token_ids",
                                              "block_size", "lora_id", "medium", "lora_name"};
constexpr std::string_view kRemovedFields[] = {"block_hashes", "medium"};

bool KindOf(std::string_view tag, EventKind* kind) {
  if (tag == kBlockStored) {
    *kind = EventKind::kBlockStored;
  } else if (tag == kBlockRemoved) {
    *kind = EventKind::kBlockRemoved;
  } else if (tag == kAllBlocksCleared) {
    *kind = EventKind::kAllBlocksCleared;
  } else {
    return false;
  }
  return true;
}

void NoteUnknown(DecodeInfo* info, std::string_view tag) {
  if (!info) return;
  ++info->unknown_events;
  if (info->unknown_tags.size() < 8 &&
      std::find(info->unknown_tags.begin(), info->unknown_tags.end(), tag) ==
          info->unknown_tags.end()) {
    info->unknown_tags.emplace_back(tag);
  }
}

// Decodes event i; `*known` false when its tag is unknown (the event is skipped).
Status DecodeEvent(Reader& r, size_t i, size_t* tokens_left, KvEvent* e, bool* known,
                   DecodeInfo* info) {
  *known = false;
  const std::string where = EventWhere(i, {});
  if (r.Type() == MP_ARRAY) {
    uint32_t n = 0;
    (void)r.Array(where, &n);
    if (n == 0) return Status::InvalidArgument(where + ": empty array (no tag)");
    std::string_view tag;
    if (Status s = r.String(where + ": tag", &tag); !s.ok()) return s;
    if (!KindOf(tag, &e->kind)) {
      NoteUnknown(info, tag);
      for (uint32_t k = 1; k < n; ++k) r.Skip();
      return Status::Ok();
    }
    *known = true;
    std::span<const std::string_view> order;
    if (e->kind == EventKind::kBlockStored) order = kStoredFields;
    if (e->kind == EventKind::kBlockRemoved) order = kRemovedFields;
    EventBuilder b(r, EventWhere(i, tag), tokens_left);
    for (uint32_t k = 1; k < n; ++k) {
      if (k - 1 < order.size()) {
        if (Status s = b.Field(order[k - 1], e); !s.ok()) return s;
      } else {
        r.Skip();  // fields a newer release appends
      }
    }
    return b.Finish(*e);
  }
  if (r.Type() == MP_MAP) {
    // The tag may come anywhere; read the fields into a scratch event and decide at the end.
    uint32_t n = 0;
    (void)r.Map(where, &n);
    std::string_view tag;
    bool has_tag = false;
    EventBuilder b(r, where, tokens_left);
    for (uint32_t k = 0; k < n; ++k) {
      std::string_view key;
      if (r.Type() != MP_STR) {
        r.Skip();
        r.Skip();
        continue;
      }
      if (Status s = r.String(where + ": key", &key); !s.ok()) return s;
      if (key == "type") {
        if (Status s = r.String(where + ": type", &tag); !s.ok()) return s;
        has_tag = true;
      } else {
        if (Status s = b.Field(key, e); !s.ok()) return s;
      }
    }
    if (!has_tag) return Status::InvalidArgument(where + ": no \"type\" key");
    if (!KindOf(tag, &e->kind)) {
      NoteUnknown(info, tag);
      return Status::Ok();
    }
    *known = true;
    if (e->kind != EventKind::kBlockStored) {
      e->parent_hash.reset();
      e->token_ids.clear();
      e->block_size = 0;
      e->lora_name.clear();
      if (e->kind == EventKind::kAllBlocksCleared) e->block_hashes.clear();
    }
    return EventBuilder(r, EventWhere(i, tag), tokens_left).Finish(*e);
  }
  return Status::InvalidArgument(where + ": must be an array or a map");
}

Status DecodeEvents(Reader& r, KvEventBatch* out, DecodeInfo* info) {
  uint32_t n = 0;
  if (Status s = r.Array("events", &n); !s.ok()) return s;
  if (n > kMaxEventsPerBatch) {
    return Reader::Bad("events", fmt::format("{} events (limit {})", n, kMaxEventsPerBatch));
  }
  out->events.reserve(n);
  size_t tokens_left = kMaxTokensPerBatch;
  for (uint32_t i = 0; i < n; ++i) {
    KvEvent e;
    bool known = false;
    if (Status s = DecodeEvent(r, i, &tokens_left, &e, &known, info); !s.ok()) return s;
    if (known) out->events.push_back(std::move(e));
  }
  return Status::Ok();
}

Status DecodeRank(Reader& r, KvEventBatch* out) {
  if (r.TakeNil()) return Status::Ok();
  int64_t v = 0;
  if (Status s = r.Int("data_parallel_rank", 0, INT32_MAX, &v); !s.ok()) return s;
  out->data_parallel_rank = static_cast<int32_t>(v);
  return Status::Ok();
}

}  // namespace

std::array<uint8_t, 32> ExpandHash(uint64_t h) {
  std::array<uint8_t, 32> d{};
  constexpr uint64_t kLanes[3] = {0x6b76726f75746531ULL, 0x6b76726f75746532ULL,
                                  0x6b76726f75746533ULL};
  for (int lane = 0; lane < 4; ++lane) {
    const uint64_t v = lane < 3 ? SplitMix64(h ^ kLanes[lane]) : h;
    for (int b = 0; b < 8; ++b) d[lane * 8 + b] = static_cast<uint8_t>(v >> (56 - 8 * b));
  }
  return d;
}

void EncodeBatch(const KvEventBatch& batch, Format format, HashForm hash_form, std::string* out) {
  Writer w(out);
  w.Array(3);
  w.Double(batch.ts);
  w.Array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) EncodeEvent(w, e, format, hash_form);
  w.Int(batch.data_parallel_rank);
}

Status DecodeBatch(std::span<const uint8_t> payload, KvEventBatch* out, DecodeInfo* info) {
  *out = KvEventBatch{};
  if (info) *info = DecodeInfo{};
  if (payload.empty()) return Status::InvalidArgument("empty payload");
  if (payload.size() > kMaxPayloadBytes) {
    return Status::InvalidArgument(
        fmt::format("payload of {} bytes (limit {})", payload.size(), kMaxPayloadBytes));
  }
  const char* begin = reinterpret_cast<const char*>(payload.data());
  const char* end = begin + payload.size();
  const char* check = begin;
  if (mp_check(&check, end) != 0) {
    return Status::InvalidArgument("not one complete msgpack value (truncated or malformed)");
  }
  if (check != end) {
    return Status::InvalidArgument(
        fmt::format("{} bytes after the batch", static_cast<size_t>(end - check)));
  }
  if (Status s = CheckNesting(begin, end); !s.ok()) return s;

  Reader r(begin, end);
  if (r.Type() == MP_ARRAY) {
    uint32_t n = 0;
    (void)r.Array("batch", &n);
    if (n < 2) return Status::InvalidArgument(fmt::format("batch: array of {} items (ts and events expected)", n));
    if (Status s = r.Number("ts", &out->ts); !s.ok()) return s;
    if (Status s = DecodeEvents(r, out, info); !s.ok()) return s;
    if (n >= 3) {
      if (Status s = DecodeRank(r, out); !s.ok()) return s;
    }
    return Status::Ok();  // items after the rank are a newer release's; mp_check saw them
  }
  if (r.Type() == MP_MAP) {
    uint32_t n = 0;
    (void)r.Map("batch", &n);
    bool has_events = false;
    for (uint32_t k = 0; k < n; ++k) {
      if (r.Type() != MP_STR) {
        r.Skip();
        r.Skip();
        continue;
      }
      std::string_view key;
      if (Status s = r.String("batch key", &key); !s.ok()) return s;
      Status s;
      if (key == "ts") {
        s = r.Number("ts", &out->ts);
      } else if (key == "events") {
        if (has_events) return Status::InvalidArgument("batch: \"events\" twice");
        s = DecodeEvents(r, out, info);
        has_events = true;
      } else if (key == "data_parallel_rank") {
        s = DecodeRank(r, out);
      } else {
        r.Skip();
      }
      if (!s.ok()) return s;
    }
    if (!has_events) return Status::InvalidArgument("batch: no \"events\" key");
    return Status::Ok();
  }
  return Status::InvalidArgument("batch: must be an array or a map");
}

}  // namespace kvroute::kvevents
