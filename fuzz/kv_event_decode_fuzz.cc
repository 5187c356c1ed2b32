// Fuzz target: a KV-event payload (what a vLLM replica, or anything that reaches the
// router's SUB socket, sends) through kvevents::DecodeBatch.
//
// Invariants: no crash, hang or leak on any input; an error has a message; a batch that
// decodes keeps to the limits, and re-encoding it decodes to the same batch (integer
// hashes, so folded digests stay what they were).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "adapters/kvevents/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvroute::kvevents;
  using kvroute::fuzz::Check;
  KvEventBatch batch;
  DecodeInfo info;
  const kvroute::Status s = DecodeBatch({data, size}, &batch, &info);
  if (!s.ok()) {
    Check(!s.message().empty(), "decode error without a message");
    return 0;
  }
  Check(batch.events.size() <= kMaxEventsPerBatch, "more events than the limit");
  size_t tokens = 0;
  for (const KvEvent& e : batch.events) tokens += e.token_ids.size();
  Check(tokens <= kMaxTokensPerBatch, "more tokens than the limit");
  for (Format f : {Format::kArray, Format::kMap}) {
    std::string again;
    EncodeBatch(batch, f, HashForm::kInt, &again);
    KvEventBatch round;
    Check(DecodeBatch({reinterpret_cast<const uint8_t*>(again.data()), again.size()}, &round).ok(),
          "a decoded batch does not decode after re-encoding");
    Check(round.events.size() == batch.events.size(), "re-encoding changed the event count");
    for (size_t i = 0; i < round.events.size(); ++i) {
      const KvEvent& a = batch.events[i];
      const KvEvent& b = round.events[i];
      Check(a.kind == b.kind && a.block_hashes == b.block_hashes && a.parent_hash == b.parent_hash &&
                a.token_ids == b.token_ids && a.block_size == b.block_size &&
                a.lora_name == b.lora_name,
            "re-encoding changed an event");
    }
  }
  return 0;
}
