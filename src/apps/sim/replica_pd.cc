// Replica's side of P/D (docs/SIM_API.md, "Prefill/decode disaggregation"): a prefill
// leg's hold and its kv_transfer_params, a decode leg's claim on a peer's hold (the pull,
// or a local recompute) before admission, and the lease timer that expires holds.
#include <boost/asio/post.hpp>
#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "apps/sim/replica.h"
#include "apps/sim/replica_internal.h"
#include "core/api/openai.h"
#include "core/engine/kv_transfer.h"
#include "core/common/enum_names.h"

namespace kvroute::sim {

namespace asio = boost::asio;

using detail::RespondApiError;
using detail::WallDuration;

std::string_view KvClaimOutcomeName(KvClaimOutcome o) {
  static constexpr EnumName<KvClaimOutcome> kNames[] = {
      {KvClaimOutcome::kOk, "ok"},
      {KvClaimOutcome::kUnknownEngine, "unknown_engine"},
      {KvClaimOutcome::kPrefillDown, "prefill_down"}};
  return NameOf(kNames, o, "lease_expired");
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

}  // namespace kvroute::sim
