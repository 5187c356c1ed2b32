#include "adapters/kvevents/codec.h"

#include <gtest/gtest.h>

#include "core/kvevents/event_index.h"
#include <msgpuck.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_paths.h"

namespace kvroute::kvevents {
namespace {

std::vector<uint8_t> FromHex(std::string_view hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

constexpr uint64_t kH[] = {0x0123456789ABCDEFULL, 0xFEDCBA9876543210ULL, 42,
                           0x8000000000000001ULL};

// The batch tests/adapters/kvevents/kv_payloads.py writes with python3-msgpack.
KvEventBatch TestBatch() {
  KvEventBatch b;
  b.ts = 1.5;
  KvEvent s1;
  s1.kind = EventKind::kBlockStored;
  s1.block_hashes = {kH[0], kH[1]};
  for (uint32_t t = 100; t < 132; ++t) s1.token_ids.push_back(t);
  s1.block_size = 16;
  KvEvent s2;
  s2.kind = EventKind::kBlockStored;
  s2.block_hashes = {kH[2]};
  s2.parent_hash = kH[1];
  for (uint32_t t = 7000; t < 7016; ++t) s2.token_ids.push_back(t);
  s2.block_size = 16;
  s2.lora_name = "sql-lora";
  KvEvent r;
  r.kind = EventKind::kBlockRemoved;
  r.block_hashes = {kH[3]};
  r.medium = Medium::kCpu;
  KvEvent c;
  c.kind = EventKind::kAllBlocksCleared;
  b.events = {s1, s2, r, c};
  return b;
}

// The batch as a decoder sees it when hashes travelled as ExpandHash digests.
KvEventBatch Folded(KvEventBatch b) {
  auto fold = [](uint64_t h) {
    const std::array<uint8_t, 32> d = ExpandHash(h);
    return FoldHashBytes(d);
  };
  for (KvEvent& e : b.events) {
    for (uint64_t& h : e.block_hashes) h = fold(h);
    if (e.parent_hash) e.parent_hash = fold(*e.parent_hash);
  }
  return b;
}

void ExpectSameBatch(const KvEventBatch& got, const KvEventBatch& want) {
  EXPECT_EQ(got.ts, want.ts);
  EXPECT_EQ(got.data_parallel_rank, want.data_parallel_rank);
  ASSERT_EQ(got.events.size(), want.events.size());
  for (size_t i = 0; i < want.events.size(); ++i) {
    SCOPED_TRACE("event " + std::to_string(i));
    const KvEvent& g = got.events[i];
    const KvEvent& w = want.events[i];
    EXPECT_EQ(g.kind, w.kind);
    EXPECT_EQ(g.block_hashes, w.block_hashes);
    EXPECT_EQ(g.parent_hash, w.parent_hash);
    EXPECT_EQ(g.token_ids, w.token_ids);
    EXPECT_EQ(g.block_size, w.block_size);
    EXPECT_EQ(g.lora_name, w.lora_name);
    EXPECT_EQ(g.medium, w.medium);
  }
}

TEST(KvEventCodec, ExpandHashEndsWithTheHashBigEndian) {
  const std::array<uint8_t, 32> d = ExpandHash(0x0102030405060708ULL);
  EXPECT_EQ(std::vector<uint8_t>(d.begin() + 24, d.end()),
            (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_NE(ExpandHash(1), ExpandHash(2));
  EXPECT_EQ(ExpandHash(7), ExpandHash(7));
}

struct FormCase {
  Format format;
  HashForm hash;
  const char* name;
};

class RoundTrip : public ::testing::TestWithParam<FormCase> {};

TEST_P(RoundTrip, DecodesToTheSameBatch) {
  const FormCase c = GetParam();
  std::string payload;
  EncodeBatch(TestBatch(), c.format, c.hash, &payload);
  KvEventBatch got;
  DecodeInfo info;
  ASSERT_TRUE(DecodeBatch(Bytes(payload), &got, &info).ok());
  EXPECT_EQ(info.unknown_events, 0u);
  ExpectSameBatch(got, c.hash == HashForm::kInt ? TestBatch() : Folded(TestBatch()));
}

INSTANTIATE_TEST_SUITE_P(AllForms, RoundTrip,
                         ::testing::Values(FormCase{Format::kArray, HashForm::kInt, "ArrayInt"},
                                           FormCase{Format::kArray, HashForm::kBytes, "ArrayBytes"},
                                           FormCase{Format::kMap, HashForm::kInt, "MapInt"},
                                           FormCase{Format::kMap, HashForm::kBytes, "MapBytes"}),
                         [](const auto& info) { return std::string(info.param.name); });

// Field order and shapes exactly as vLLM declares them, read back with msgpuck.
TEST(KvEventCodec, ArrayFormWritesVllmFieldOrder) {
  std::string payload;
  EncodeBatch(TestBatch(), Format::kArray, HashForm::kInt, &payload);
  const char* p = payload.data();
  ASSERT_EQ(mp_decode_array(&p), 3u);
  EXPECT_EQ(mp_decode_double(&p), 1.5);
  ASSERT_EQ(mp_decode_array(&p), 4u);
  // ["BlockStored", [h0, h1], nil, [32 ids], 16, nil, "GPU"]: lora_name's default dropped.
  ASSERT_EQ(mp_decode_array(&p), 7u);
  uint32_t n = 0;
  const char* s = mp_decode_str(&p, &n);
  EXPECT_EQ(std::string(s, n), "BlockStored");
  ASSERT_EQ(mp_decode_array(&p), 2u);
  EXPECT_EQ(mp_decode_uint(&p), kH[0]);
  EXPECT_EQ(mp_decode_uint(&p), kH[1]);
  ASSERT_EQ(mp_typeof(*p), MP_NIL);
  mp_decode_nil(&p);
  ASSERT_EQ(mp_decode_array(&p), 32u);
  for (uint32_t t = 100; t < 132; ++t) EXPECT_EQ(mp_decode_uint(&p), t);
  EXPECT_EQ(mp_decode_uint(&p), 16u);
  ASSERT_EQ(mp_typeof(*p), MP_NIL);
  mp_decode_nil(&p);
  s = mp_decode_str(&p, &n);
  EXPECT_EQ(std::string(s, n), "GPU");
  // The second BlockStored has a LoRA: 8 items, parent set, lora_name last.
  ASSERT_EQ(mp_decode_array(&p), 8u);
  mp_next(&p);
  mp_next(&p);
  EXPECT_EQ(mp_decode_uint(&p), kH[1]);
  for (int i = 0; i < 4; ++i) mp_next(&p);
  s = mp_decode_str(&p, &n);
  EXPECT_EQ(std::string(s, n), "sql-lora");
  // ["BlockRemoved", [h3], "CPU"], ["AllBlocksCleared"], rank 0.
  ASSERT_EQ(mp_decode_array(&p), 3u);
  for (int i = 0; i < 3; ++i) mp_next(&p);
  ASSERT_EQ(mp_decode_array(&p), 1u);
  mp_next(&p);
  EXPECT_EQ(mp_decode_uint(&p), 0u);
  EXPECT_EQ(p, payload.data() + payload.size());
}

TEST(KvEventCodec, MapFormWritesTypeThenFieldsInDeclarationOrder) {
  KvEventBatch b = TestBatch();
  b.events.resize(1);
  std::string payload;
  EncodeBatch(b, Format::kMap, HashForm::kBytes, &payload);
  const char* p = payload.data();
  mp_decode_array(&p);
  mp_next(&p);
  mp_decode_array(&p);
  ASSERT_EQ(mp_decode_map(&p), 8u);
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    uint32_t n = 0;
    const char* k = mp_decode_str(&p, &n);
    keys.emplace_back(k, n);
    if (keys.back() == "block_hashes") {
      ASSERT_EQ(mp_decode_array(&p), 2u);
      uint32_t len = 0;
      const char* d = mp_decode_bin(&p, &len);
      ASSERT_EQ(len, 32u);
      const std::array<uint8_t, 32> want = ExpandHash(kH[0]);
      EXPECT_EQ(std::memcmp(d, want.data(), 32), 0);
      mp_next(&p);
    } else {
      mp_next(&p);
    }
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"type", "block_hashes", "parent_block_hash",
                                            "token_ids", "block_size", "lora_id", "medium",
                                            "lora_name"}));
}

// Payloads written by Debian's python3-msgpack (tests/adapters/kvevents/kv_payloads.py).
std::map<std::string, std::vector<uint8_t>> PythonPayloads() {
  const std::string cmd = "/usr/bin/python3 " + test_support::SourceDir() +
                          "/tests/adapters/kvevents/kv_payloads.py";
  std::map<std::string, std::vector<uint8_t>> out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  pclose(f);
  std::istringstream lines(text);
  std::string name, hex;
  while (lines >> name >> hex) out[name] = FromHex(hex);
  return out;
}

TEST(KvEventCodec, PythonMsgpackPayloadsDecodeLikeOurOwn) {
  const auto py = PythonPayloads();
  ASSERT_EQ(py.size(), 7u) << "python3-msgpack (Debian) must be installed";
  struct Want {
    const char* name;
    Format format;
    HashForm hash;
  };
  for (const Want& w : {Want{"array-int", Format::kArray, HashForm::kInt},
                        Want{"array-bytes", Format::kArray, HashForm::kBytes},
                        Want{"map-int", Format::kMap, HashForm::kInt},
                        Want{"map-bytes", Format::kMap, HashForm::kBytes}}) {
    SCOPED_TRACE(w.name);
    std::string ours;
    EncodeBatch(TestBatch(), w.format, w.hash, &ours);
    KvEventBatch from_ours, from_python;
    ASSERT_TRUE(DecodeBatch(Bytes(ours), &from_ours).ok());
    const Status s = DecodeBatch(py.at(w.name), &from_python);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectSameBatch(from_python, from_ours);
  }
}

// Indexed the same: the router's precise index built from python3-msgpack's payloads
// holds exactly what it holds from kvroute's own encoding, in every form.
TEST(KvEventCodec, PythonMsgpackPayloadsIndexLikeOurOwn) {
  const auto py = PythonPayloads();
  ASSERT_EQ(py.size(), 7u) << "python3-msgpack (Debian) must be installed";
  std::vector<uint32_t> tokens;
  for (uint32_t t = 100; t < 132; ++t) tokens.push_back(t);
  for (const char* name : {"array-int", "array-bytes", "map-int", "map-bytes"}) {
    SCOPED_TRACE(name);
    KvEventBatch batch;
    ASSERT_TRUE(DecodeBatch(py.at(name), &batch).ok());
    batch.events.pop_back();  // keep the stores and the removal, not the final clear
    EventIndex index(IndexOptions{});
    index.Expect(0, 0);
    index.ApplyBatch(0, batch, 0);
    std::vector<uint64_t> keys;
    index.RequestKeys("", tokens, &keys);
    EXPECT_EQ(index.MatchOne(keys, 0, 0), 2u);
    EXPECT_EQ(index.Stats(0, 0).blocks, 3u);
    EXPECT_EQ(index.Stats(0, 0).orphans, 0u);
    // The same batch from kvroute's encoder in the same form.
    std::string ours;
    const bool map = std::string_view(name).substr(0, 3) == "map";
    const bool bytes = std::string_view(name).ends_with("bytes");
    EncodeBatch(TestBatch(), map ? Format::kMap : Format::kArray, bytes ? HashForm::kBytes : HashForm::kInt,
                &ours);
    KvEventBatch mine;
    ASSERT_TRUE(DecodeBatch(Bytes(ours), &mine).ok());
    mine.events.pop_back();
    EventIndex other(IndexOptions{});
    other.Expect(0, 0);
    other.ApplyBatch(0, mine, 0);
    EXPECT_EQ(other.MatchOne(keys, 0, 0), 2u);
    EXPECT_EQ(other.Stats(0, 0).blocks, index.Stats(0, 0).blocks);
  }
}

TEST(KvEventCodec, OldFormsUnknownFieldsAndTagsAreAccepted) {
  const auto py = PythonPayloads();
  ASSERT_EQ(py.size(), 7u);
  KvEventBatch got;
  DecodeInfo info;
  // [ts, events] with negative int64 hashes: the same 64-bit values.
  ASSERT_TRUE(DecodeBatch(py.at("old-two-items"), &got, &info).ok());
  ExpectSameBatch(got, TestBatch());
  // Trailing fields, a future batch item and an unknown event: skipped, counted.
  ASSERT_TRUE(DecodeBatch(py.at("extras"), &got, &info).ok());
  ExpectSameBatch(got, TestBatch());
  EXPECT_EQ(info.unknown_events, 1u);
  EXPECT_EQ(info.unknown_tags, (std::vector<std::string>{"SomeNewEvent"}));
  // The batch as a map, events as maps with extra keys.
  ASSERT_TRUE(DecodeBatch(py.at("map-batch"), &got, &info).ok());
  ExpectSameBatch(got, TestBatch());
  EXPECT_EQ(info.unknown_events, 1u);
}

// The shared fixtures (../shared/fixtures/vllm-kv-events), copied into testdata.
TEST(KvEventCodec, VllmFixturesDecodeToTheirExpectedBlocks) {
  const std::string dir = test_support::SourceDir() + "/tests/adapters/kvevents/testdata/";
  // expected.json's integer hashes, and folded digests for the bytes form.
  const std::vector<uint64_t> ints = {9460568785227603120ULL, 13769737737868187369ULL,
                                      3522567980584247127ULL, 5544179174226906052ULL};
  const std::vector<std::string> digests = {
      "b8c6f33f1780d30977c5e964f62e7959102a3694f1c28ae0834ab12f98a3dcb0",
      "89a1a98e709fa672374b463bbd8d5946ff4f530c5e65be07bf17ef8473ec96e9",
      "2453695514ac2ba4f06e40a20e20cbc76b7a6c6d9a438c4a30e2acea3be39f57",
      "0a4f88e04b578e42ff125845c9b27ba749498ed4b68a20c94cf0e195aae9cbc4"};
  for (const char* file : {"array-encoding-int-hashes.jsonl", "map-encoding-bytes-hashes.jsonl"}) {
    SCOPED_TRACE(file);
    const bool bytes = std::string(file).starts_with("map");
    std::vector<uint64_t> h;
    for (int i = 0; i < 4; ++i) h.push_back(bytes ? FoldHashBytes(FromHex(digests[i])) : ints[i]);
    std::ifstream in(dir + file);
    std::string line;
    std::vector<KvEventBatch> batches;
    while (std::getline(in, line)) {
      const auto at = line.find("\"payload_hex\": \"") + 16;
      const std::string hex = line.substr(at, line.find('"', at) - at);
      KvEventBatch b;
      const Status s = DecodeBatch(FromHex(hex), &b);
      ASSERT_TRUE(s.ok()) << s.ToString();
      batches.push_back(b);
    }
    ASSERT_EQ(batches.size(), 4u);
    ASSERT_EQ(batches[0].events.size(), 1u);
    const KvEvent& first = batches[0].events[0];
    EXPECT_EQ(first.kind, EventKind::kBlockStored);
    EXPECT_EQ(first.block_hashes, (std::vector<uint64_t>{h[0], h[1], h[2]}));
    EXPECT_FALSE(first.parent_hash.has_value());
    ASSERT_EQ(first.token_ids.size(), 48u);
    EXPECT_EQ(first.token_ids[0], 13u);
    EXPECT_EQ(first.token_ids[47], 68920u);
    EXPECT_EQ(first.block_size, 16);
    EXPECT_EQ(first.medium, Medium::kGpu);
    const KvEvent& child = batches[1].events.at(0);
    EXPECT_EQ(child.block_hashes, (std::vector<uint64_t>{h[3]}));
    EXPECT_EQ(child.parent_hash, h[2]);
    EXPECT_EQ(child.token_ids.size(), 16u);
    EXPECT_EQ(batches[2].events.at(0).kind, EventKind::kBlockRemoved);
    EXPECT_EQ(batches[2].events.at(0).block_hashes, (std::vector<uint64_t>{h[3]}));
    EXPECT_EQ(batches[3].events.at(0).kind, EventKind::kAllBlocksCleared);
    EXPECT_GT(batches[0].ts, 1.7e9);
  }
}

TEST(KvEventCodec, MalformedPayloadsAreClearErrors) {
  std::string good;
  EncodeBatch(TestBatch(), Format::kArray, HashForm::kInt, &good);
  KvEventBatch b;
  auto error = [&](std::span<const uint8_t> p) { return DecodeBatch(p, &b).message(); };
  EXPECT_EQ(error({}), "empty payload");
  // Every truncation is an error, never a crash.
  for (size_t n = 1; n < good.size(); ++n) {
    EXPECT_EQ(error(Bytes(good).first(n)),
              "not one complete msgpack value (truncated or malformed)") << n;
  }
  EXPECT_EQ(error(Bytes(good + "x")), "1 bytes after the batch");
  auto pack = [](const char* fmt_text, auto... args) {
    char buf[512];
    const size_t n = mp_format(buf, sizeof buf, fmt_text, args...);
    return std::string(buf, n);
  };
  EXPECT_EQ(error(Bytes(pack("%d", 5))), "batch: must be an array or a map");
  EXPECT_EQ(error(Bytes(pack("[%f]", 1.0))), "batch: array of 1 items (ts and events expected)");
  EXPECT_EQ(error(Bytes(pack("[%s[]]", "x"))), "ts: must be a number");
  EXPECT_EQ(error(Bytes(pack("[%f%d]", 1.0, 3))), "events: must be an array");
  EXPECT_EQ(error(Bytes(pack("[%f[[]]]", 1.0))), "event 0: empty array (no tag)");
  EXPECT_EQ(error(Bytes(pack("[%f[[%d]]]", 1.0, 1))), "event 0: tag: must be a string");
  EXPECT_EQ(error(Bytes(pack("[%f[[%s[%s]]]]", 1.0, "BlockStored", "h"))),
            "event 0 (BlockStored): block_hashes[0]: must be an integer or bytes");
  EXPECT_EQ(error(Bytes(pack("[%f[[%s[%d]NIL[%d]%d]]]", 1.0, "BlockStored", 1, -5, 1))),
            "event 0 (BlockStored): token_ids[0]: -5 is outside [0, 4294967295]");
  EXPECT_EQ(error(Bytes(pack("[%f[[%s[%d]NIL[%d%d]%d]]]", 1.0, "BlockStored", 1, 1, 2, 16))),
            "event 0 (BlockStored): 2 token_ids for 1 blocks of 16 tokens");
  EXPECT_EQ(error(Bytes(pack("[%f[{%s%d}]]", 1.0, "block_size", 16))),
            "event 0: no \"type\" key");
  EXPECT_EQ(error(Bytes(pack("[%f[[%s[]NIL[]%d]]]", 1.0, "BlockStored", -1))),
            "event 0 (BlockStored): block_size: -1 is outside [0, 1048576]");
  EXPECT_EQ(error(Bytes(pack("[%f[]%d]", 1.0, -2))),
            "data_parallel_rank: -2 is outside [0, 2147483647]");
  // Nesting beyond the limit.
  std::string deep = pack("[%f", 1.0);
  for (int i = 0; i < 40; ++i) deep += '\x91';
  deep += '\x90';
  deep = std::string("\x92") + deep.substr(1);
  EXPECT_EQ(error(Bytes(deep)), "nested deeper than 16 levels");
}

}  // namespace
}  // namespace kvroute::kvevents
