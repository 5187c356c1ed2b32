// Passive outlier detection as pure logic: what proxied requests revealed about one
// endpoint between scrapes. A scrape every 50 ms still lets a replica that answers 503 in
// a millisecond swallow hundreds of requests (it looks idle: nothing queued, KV empty), so
// the router watches the outcomes of its own attempts and ejects an endpoint whose recent
// attempts all failed, for a time that grows with each repeat, before any scrape would
// notice.
//
//   failure   a connect failure, a reset before the response ended, a first-byte or idle
//             timeout, or a 5xx status (500, 502, 503, 504) from the endpoint
//   success   a response head with a status below 500 (4xx is the client's doing)
//
// `consecutive_failures` failures in a row eject the endpoint for
// min(max_ejection_s, base_ejection_s * 2^level), level being how many ejections happened
// recently: it rises by one per ejection and falls by one for each base_ejection_s the
// endpoint then spends without being ejected. When the ejection ends the endpoint gets
// traffic again (its failure count starts over); failing again ejects it for longer.
//
// The panic threshold (EjectionAllowed): at most max_ejection_percent of the pool is
// ejected at once, and at least one endpoint of a pool of two or more may be; a pool of
// one endpoint is never ejected. A failing fleet then keeps serving from its least bad
// endpoints instead of refusing everything.
//
// Thread: value types; the owner serialises access. No clock: every call takes the time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvroute::health {

struct OutlierOptions {
  int consecutive_failures = 5;    // 0: outlier detection off
  double base_ejection_s = 5.0;
  double max_ejection_s = 300.0;
  double max_ejection_percent = 50.0;  // of the configured endpoints, 0..100
};

// How many endpoints of a pool of `pool_size` may be ejected at once.
std::size_t MaxEjected(std::size_t pool_size, const OutlierOptions& options);

// Whether one more endpoint may be ejected while `ejected_now` already are.
inline bool EjectionAllowed(std::size_t ejected_now, std::size_t pool_size,
                            const OutlierOptions& options) {
  return ejected_now < MaxEjected(pool_size, options);
}

// One endpoint's ejection state.
class Ejection {
 public:
  // Starts an ejection at `now_s`; returns its end. Level decays first (see above).
  double Eject(double now_s, const OutlierOptions& options);
  bool Active(double now_s) const { return now_s < until_s_; }
  double until_s() const { return until_s_; }  // end of the last ejection (-inf: never)
  int level() const { return level_; }
  uint64_t count() const { return count_; }  // ejections so far

 private:
  double until_s_ = -1e300;
  int level_ = 0;
  uint64_t count_ = 0;
};

}  // namespace kvroute::health
