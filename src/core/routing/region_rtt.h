// Measured round trips per region (issue 10): the scrape round trips of every endpoint in
// a region, smoothed into one value for the locality-filter. Pure: samples and times are
// passed in; the pool adapter times the scrapes and pushes what this says into
// RoutingCore::SetRegionRtt.
//
//   RegionRttEstimator est;
//   if (auto push = est.Observe("eu-west", 0.081, now_s)) core.SetRegionRtt("eu-west", *push);
//
// The estimate is an exponentially weighted moving average over the region's samples in
// arrival order (every endpoint of the region feeds the same average): the first sample
// is the estimate, each later one moves it by alpha x (sample - estimate). Failed scrapes
// are not samples (the caller leaves them out), nor are negative, NaN or infinite values.
// Pushes are rate-limited per region (the core takes its scheduler lock for each): the
// first sample pushes at once, later ones at most every push_interval_s.
//
// Thread: none of its own; one caller at a time (the pool calls it on the scrape thread).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvroute::routing {

class RegionRttEstimator {
 public:
  struct Options {
    double alpha = 0.2;            // weight of a new sample, in (0, 1]
    double push_interval_s = 1.0;  // a region's estimate is pushed at most this often
  };
  RegionRttEstimator() = default;
  explicit RegionRttEstimator(Options o) : options_(o) {}

  // One successful scrape round trip `rtt_s` of an endpoint in `region` at `now_s`.
  // Returns the region's new estimate when it is due to be pushed, else nullopt (also for
  // an empty region and for samples that are not a finite number >= 0).
  std::optional<double> Observe(std::string_view region, double rtt_s, double now_s);

  // The region's estimate, or nullopt before its first sample.
  std::optional<double> Estimate(std::string_view region) const;
  // Every region's estimate, in region order.
  std::vector<std::pair<std::string, double>> Estimates() const;
  // Forgets every region (their next samples start afresh and push at once).
  void Clear() { regions_.clear(); }

 private:
  struct Region {
    double estimate = 0.0;
    double pushed_at_s = 0.0;
    bool pushed = false;
  };
  Options options_;
  std::map<std::string, Region, std::less<>> regions_;
};

}  // namespace kvroute::routing
