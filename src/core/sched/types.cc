#include "core/sched/types.h"

#include <limits>

#include "core/api/openai.h"

namespace kvroute::sched {

double EndpointState::MetricsAge(double now_s) const {
  if (scraped_at_s < 0) return std::numeric_limits<double>::infinity();
  return now_s - scraped_at_s;
}

bool EndpointState::MetricsFresh(double now_s, double stale_after_s) const {
  return scrape_ok && scraped_at_s >= 0 && MetricsAge(now_s) <= stale_after_s;
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
  return s;
}

}  // namespace kvroute::sched
