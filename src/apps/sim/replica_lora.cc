// Replica's LoRA adapters (docs/SIM_API.md, "LoRA adapters"): the adapters it serves,
// vLLM's runtime load and unload endpoints, and the state behind
// vllm:lora_requests_info (written by replica_metrics.cc).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "apps/sim/replica.h"
#include "apps/sim/replica_internal.h"
#include "core/api/lora.h"
#include "core/api/openai.h"

namespace kvroute::sim {

using detail::RespondApiError;

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
void Replica::HandleLoraAdapter(const std::shared_ptr<http::Exchange>& ex, bool unload) {
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

}  // namespace kvroute::sim
