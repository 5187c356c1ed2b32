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

namespace {
uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = SplitMix64(x);
}

uint64_t Rng::NextU64() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform01() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

uint64_t Rng::Below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased and one multiply in the common case.
  uint64_t x = NextU64();
  __uint128_t m = static_cast<__uint128_t>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      x = NextU64();
      m = static_cast<__uint128_t>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace kvroute::sched
