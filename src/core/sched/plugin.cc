#include "core/sched/plugin.h"

#include <algorithm>
#include <cmath>

namespace kvroute::sched {

void PluginTiming::Observe(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  const auto i = static_cast<std::size_t>(
      std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  counts[i].fetch_add(1, std::memory_order_relaxed);
  double old = sum.load(std::memory_order_relaxed);
  while (!sum.compare_exchange_weak(old, old + seconds, std::memory_order_relaxed)) {
  }
}

uint64_t PluginTiming::total() const {
  uint64_t n = 0;
  for (const auto& c : counts) n += c.load(std::memory_order_relaxed);
  return n;
}

void RankByMaxScore(std::span<const double> totals, size_t max_ranked, Rng& rng,
                    std::vector<uint32_t>& scratch, std::vector<uint64_t>& tiebreak,
                    std::vector<uint32_t>& ranked) {
  const size_t n = totals.size();
  const size_t k = RankCount(max_ranked, n);
  scratch.resize(n);
  tiebreak.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    scratch[i] = i;
    tiebreak[i] = rng.Next();
  }
  // A random key per candidate breaks ties uniformly (equal keys are astronomically rare
  // and then fall back to index order).
  auto better = [&](uint32_t a, uint32_t b) {
    if (totals[a] != totals[b]) return totals[a] > totals[b];
    if (tiebreak[a] != tiebreak[b]) return tiebreak[a] < tiebreak[b];
    return a < b;
  };
  if (k == 1) {
    ranked.assign(1, *std::min_element(scratch.begin(), scratch.end(), better));
    return;
  }
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), better);
  ranked.assign(scratch.begin(), scratch.begin() + k);
}

}  // namespace kvroute::sched
