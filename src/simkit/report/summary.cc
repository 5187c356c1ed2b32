#include "simkit/report/summary.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/common/enum_names.h"

namespace kvroute::report {

std::string_view ErrorKindName(ErrorKind kind) {
  static constexpr std::array<std::string_view, kNumErrorKinds> kNames = {
      "none", "rejected", "no_endpoint", "shed", "upstream", "timeout", "aborted"};
  return NameAt(kNames, kind, "unknown");
}

double RequestRecord::Tpot() const {
  if (!ok() || output_tokens < 2 || ttft_s < 0 || e2e_s < 0) return -1.0;
  return (e2e_s - ttft_s) / static_cast<double>(output_tokens - 1);
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_s > 0 && !(r.ttft_s >= 0 && r.ttft_s <= slo.ttft_s)) return false;
  if (slo.e2e_s > 0 && !(r.e2e_s >= 0 && r.e2e_s <= slo.e2e_s)) return false;
  if (slo.tpot_s > 0) {
    const double tpot = r.Tpot();
    if (tpot >= 0 && tpot > slo.tpot_s) return false;
  }
  return true;
}

namespace {

// 1-based nearest rank ceil(p/100 * n), clamped to [1, n]. The tiny relative slack
// absorbs binary rounding (99/100 * 100 is 99.00000000000001 in doubles).
size_t NearestRank(double p, size_t n) {
  const double exact = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(n);
  const double rank = std::ceil(exact - exact * 1e-12);
  return std::clamp<size_t>(static_cast<size_t>(rank), 1, n);
}

}  // namespace

double Percentile(std::span<double> values, double p) {
  if (values.empty()) return 0.0;
  const size_t rank = NearestRank(p, values.size());
  std::nth_element(values.begin(), values.begin() + (rank - 1), values.end());
  return values[rank - 1];
}

namespace {

// Nearest rank on already sorted values.
double SortedPercentile(const std::vector<double>& sorted, double p) {
  return sorted[NearestRank(p, sorted.size()) - 1];
}

}  // namespace

Stats Summarize(std::vector<double>& values) {
  Stats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  double sum = 0.0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.min = values.front();
  s.max = values.back();
  s.p50 = SortedPercentile(values, 50);
  s.p90 = SortedPercentile(values, 90);
  s.p99 = SortedPercentile(values, 99);
  return s;
}

void GapHistogram::Add(double gap_s) {
  int bucket = 0;
  if (gap_s == last_gap_) {
    bucket = last_bucket_;
  } else if (gap_s > kLowest) {
    bucket = static_cast<int>(std::floor(std::log10(gap_s / kLowest) * kBucketsPerDecade));
    bucket = std::clamp(bucket, 0, kNumBuckets - 1);
  }
  last_gap_ = gap_s;
  last_bucket_ = bucket;
  ++counts_[bucket];
  ++count_;
  sum_ += gap_s;
}

void GapHistogram::Merge(const GapHistogram& other) {
  for (int i = 0; i < kNumBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
}

double GapHistogram::BucketUpperEdge(int bucket) {
  return kLowest * std::pow(10.0, static_cast<double>(bucket + 1) / kBucketsPerDecade);
}

double GapHistogram::Percentile(double p) const {
  if (count_ == 0) return 0.0;
  const int64_t rank = static_cast<int64_t>(NearestRank(p, static_cast<size_t>(count_)));
  int64_t seen = 0;
  for (int i = 0; i < kNumBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) return BucketUpperEdge(i);
  }
  return BucketUpperEdge(kNumBuckets - 1);
}

FleetRecorder::FleetRecorder(int num_replicas, int max_series, size_t max_points)
    : num_replicas_(num_replicas),
      max_points_(std::max<size_t>(max_points, 2)),
      series_(static_cast<size_t>(std::min(num_replicas, max_series))) {}

void FleetRecorder::AddSample(double t_s, std::span<const double> kv_usage,
                              std::span<const double> waiting) {
  if (kv_usage.empty()) return;
  double lo = kv_usage[0], hi = kv_usage[0];
  for (double v : kv_usage) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  double w = 0.0;
  for (double v : waiting) w += v;
  kv_min_sum_ += lo;
  kv_max_sum_ += hi;
  kv_peak_ = std::max(kv_peak_, hi);
  waiting_sum_ += w;
  waiting_max_ = std::max(waiting_max_, w);
  if (samples_ % keep_every_ == 0 && !series_.empty()) {
    if (times_.size() >= max_points_) {
      // Halve the resolution: keep even-indexed points.
      auto halve = [](std::vector<double>& v) {
        size_t k = 0;
        for (size_t i = 0; i < v.size(); i += 2) v[k++] = v[i];
        v.resize(k);
      };
      halve(times_);
      for (auto& s : series_) halve(s);
      keep_every_ *= 2;
    }
    if (samples_ % keep_every_ == 0) {
      times_.push_back(t_s);
      for (size_t r = 0; r < series_.size(); ++r) series_[r].push_back(kv_usage[r]);
    }
  }
  ++samples_;
}

PolicyReport Summarize(std::string policy, std::span<const RequestRecord> records, const Slo& slo,
                       const FleetTotals& totals, const GapHistogram* gaps,
                       const FleetRecorder* fleet) {
  PolicyReport rep;
  rep.policy = std::move(policy);
  rep.requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot, e2e, max_itl;
  ttft.reserve(records.size());
  e2e.reserve(records.size());
  double first = 0.0, last = 0.0;
  bool any = false;
  int64_t out_tokens = 0, in_tokens = 0, cached = 0, cached_in = 0;
  bool any_cached = false;
  for (const RequestRecord& r : records) {
    const double end = r.e2e_s >= 0 ? r.send_s + r.e2e_s : r.send_s;
    if (!any) {
      first = r.send_s;
      last = end;
      any = true;
    }
    first = std::min(first, r.send_s);
    last = std::max(last, end);
    if (r.retries > 0) {
      ++rep.retried;
      rep.retries += r.retries;
    }
    if (!r.ok()) {
      rep.errors_by_kind[std::string(ErrorKindName(r.error))]++;
      continue;
    }
    ++rep.succeeded;
    if (MeetsSlo(r, slo)) ++rep.good;
    out_tokens += r.output_tokens;
    in_tokens += r.prompt_tokens;
    if (r.cached_tokens >= 0) {
      any_cached = true;
      cached += r.cached_tokens;
      cached_in += r.prompt_tokens;
    }
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    if (r.e2e_s >= 0) e2e.push_back(r.e2e_s);
    const double t = r.Tpot();
    if (t >= 0) tpot.push_back(t);
    max_itl.push_back(r.max_itl_s);
  }
  rep.span_s = any ? last - first : 0.0;
  if (rep.span_s > 0) {
    rep.requests_per_s = rep.succeeded / rep.span_s;
    rep.output_tokens_per_s = out_tokens / rep.span_s;
    rep.input_tokens_per_s = in_tokens / rep.span_s;
    rep.goodput_requests_per_s = rep.good / rep.span_s;
  }
  rep.ttft_s = Summarize(ttft);
  rep.tpot_s = Summarize(tpot);
  rep.e2e_s = Summarize(e2e);
  rep.max_itl_p99_s = Summarize(max_itl).p99;
  // Summarize sorted ttft ascending: sample the CDF at up to 200 evenly spaced ranks.
  if (!ttft.empty()) {
    const size_t n = ttft.size();
    const size_t points = std::min<size_t>(n, 200);
    for (size_t k = 1; k <= points; ++k) {
      const size_t rank = (k * n + points - 1) / points;  // ceil(k n / points)
      rep.ttft_cdf.push_back({ttft[rank - 1], static_cast<double>(rank) / n});
    }
  }
  if (gaps) {
    rep.itl_mean_s = gaps->Mean();
    rep.itl_p50_s = gaps->Percentile(50);
    rep.itl_p99_s = gaps->Percentile(99);
  }
  rep.prefix_hit_rate = totals.prefix_queries_tokens > 0
                            ? static_cast<double>(totals.prefix_hits_tokens) /
                                  static_cast<double>(totals.prefix_queries_tokens)
                            : 0.0;
  if (any_cached) {
    rep.request_cached_fraction =
        cached_in > 0 ? static_cast<double>(cached) / static_cast<double>(cached_in) : 0.0;
  }
  rep.oracle_hit_rate = totals.oracle_hit_rate;
  if (rep.request_cached_fraction < 0) {
    // Unknown: no response said what it found cached.
  } else if (totals.oracle_hit_rate > 0) {
    rep.oracle_ratio = rep.request_cached_fraction / totals.oracle_hit_rate;
  } else if (totals.oracle_hit_rate == 0) {
    rep.oracle_ratio = 1.0;  // nothing could hit, nothing was missed
  }
  rep.preemptions = totals.preemptions;
  if (fleet) {
    rep.kv_usage_min = fleet->KvMinMean();
    rep.kv_usage_max = fleet->KvMaxMean();
    rep.kv_usage_peak = fleet->KvPeak();
    rep.waiting_mean = fleet->WaitingMean();
    rep.waiting_max = fleet->WaitingMax();
    rep.kv_times = fleet->series_times();
    rep.kv_series = fleet->series();
  }
  return rep;
}

}  // namespace kvroute::report
