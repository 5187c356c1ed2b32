#include "core/sched/types.h"

#include <functional>
#include <limits>

#include "core/api/openai.h"
#include "core/common/enum_names.h"

namespace kvroute::sched {

double EndpointState::MetricsAge(double now_s) const {
  if (scraped_at_s < 0) return std::numeric_limits<double>::infinity();
  return now_s - scraped_at_s;
}

bool EndpointState::MetricsFresh(double now_s, double stale_after_s) const {
  return scrape_ok && scraped_at_s >= 0 && MetricsAge(now_s) <= stale_after_s;
}

void EndpointState::SetLabels(Labels l) {
  labels = std::move(l);
  region = RegionOf(labels);
  zone = ZoneOf(labels);
  region_key = RegionKey(region);
}

uint64_t RegionKey(std::string_view region) {
  if (region.empty()) return 0;
  const uint64_t h = std::hash<std::string_view>{}(region);
  return h == 0 ? 1 : h;
}

namespace {
std::string_view LabelOr(const Labels& labels, std::string_view key, std::string_view fallback) {
  const std::string* second = nullptr;
  for (const auto& [k, v] : labels) {
    if (k == key) return v;
    if (k == fallback) second = &v;
  }
  return second ? std::string_view(*second) : std::string_view();
}
}  // namespace

std::string_view RegionOf(const Labels& labels) {
  return LabelOr(labels, "region", "topology.kubernetes.io/region");
}

std::string_view ZoneOf(const Labels& labels) {
  return LabelOr(labels, "zone", "topology.kubernetes.io/zone");
}

std::string_view LocalityName(Locality l) {
  static constexpr EnumName<Locality> kNames[] = {{Locality::kOff, "off"},
                                                  {Locality::kLocal, "local"},
                                                  {Locality::kLocalSaturated, "local_saturated"},
                                                  {Locality::kSpillSaturated, "spill_saturated"},
                                                  {Locality::kSpillWait, "spill_wait"},
                                                  {Locality::kSpillSticky, "spill_sticky"},
                                                  {Locality::kNoLocal, "no_local"}};
  return NameOf(kNames, l, "off");
}

bool IsRemote(Locality l) {
  return l == Locality::kSpillSaturated || l == Locality::kSpillWait ||
         l == Locality::kSpillSticky || l == Locality::kNoLocal;
}

int64_t SchedRequest::EstimatedPromptTokens() const {
  if (prompt_tokens >= 0) return prompt_tokens;
  return static_cast<int64_t>((prompt.size() + 3) / 4);
}

SchedRequest FromParsed(const api::ParsedRequest& r) {
  SchedRequest s;
  s.model = r.model;
  s.prompt = r.prompt_text;
  s.cache_salt = r.cache_salt;
  s.priority = r.priority;
  s.max_tokens = r.max_tokens.value_or(-1);
  s.token_ids = r.token_ids;
  s.slo_ttft_s = r.slo_ttft_s;
  s.slo_tpot_s = r.slo_tpot_s;
  s.streaming = r.stream;
  s.disaggregable = api::Disaggregable(r.endpoint);
  return s;
}

}  // namespace kvroute::sched
