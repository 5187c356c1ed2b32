// The endpoint picker's own counters, in the reference picker's metric names where they
// mean the same thing (REFERENCE.md 6 and 17): requests and errors per model, tokens per
// model, the pick's end-to-end duration, and the pool gauges rendered from
// RoutingCore::Gauges.
//
// Threads: every method may be called from any thread. Per-model counters sit behind
// one mutex taken once per request (a map lookup); the histogram is atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>

#include "core/routing/routing_core.h"

namespace kvroute::extproc {

class EppStats {
 public:
  // Upper bounds (seconds) of inference_extension_scheduler_e2e_duration_seconds.
  static constexpr std::array<double, 14> kBounds = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.0002, 0.0005, 0.001,
      0.002,   0.005,    0.01,    0.02,   0.05,   0.1,    1.0};

  // The labels of the llm_d_epp_request_* series: the model the client asked for, the one
  // it is sent as (x-llm-d-model-name-rewrite, else the same), the request's flow
  // (fairness id; "" counts as "default-flow") and its priority. At most
  // kMaxFairnessIds distinct fairness ids per model are kept; later ones count as "other".
  struct RequestLabels {
    std::string_view model;
    std::string_view target_model;
    std::string_view fairness_id;
    int64_t priority = 0;
  };
  static constexpr std::size_t kMaxFairnessIds = 32;
  static constexpr std::string_view kDefaultFlow = "default-flow";
  static constexpr std::string_view kOtherFlow = "other";

  // A request reached the pick (whatever its outcome), for `model` ("" when unknown).
  void OnRequest(const RequestLabels& l);
  // A request answered with an ImmediateResponse `code`.
  void OnError(const RequestLabels& l, int code);
  // Tokens a response reported (negative values are ignored).
  void OnUsage(const RequestLabels& l, int64_t prompt_tokens, int64_t completion_tokens);
  // One pick took `seconds` (Pick call, the subset and shedding checks included).
  void OnPickDuration(double seconds);
  // A pick's outcome: an endpoint chosen, or none usable (llm_d_epp_scheduler_attempts_total).
  void OnPickOutcome(bool ok);

  // A picked request's life, for llm_d_epp_request_*: running from OnPicked until
  // OnDone, which observes its duration (headers to the response's end or the stream's
  // close), its TTFT (pick to the first response body byte; < 0: none seen), its tokens
  // (< 0: not reported) and its normalized time per output token ((end - first byte) /
  // (output tokens - 1), with at least two tokens and a first byte).
  void OnPicked(const RequestLabels& l);
  struct Done {
    double duration_s = -1.0;
    double ttft_s = -1.0;
    double end_after_first_s = -1.0;  // end - first byte
    int64_t input_tokens = -1, output_tokens = -1, cached_tokens = -1;
  };
  void OnDone(const RequestLabels& l, const Done& d);

  // Bucket upper bounds of the request histograms.
  static constexpr std::array<double, 20> kDurationBounds = {
      0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0};
  static constexpr std::array<double, 15> kTtftBounds = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0};
  static constexpr std::array<double, 14> kTpotBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0};
  static constexpr std::array<double, 18> kTokenBounds = {
      1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288};

  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t picks_timed() const;

  // Appends the series, each under llm-d Router v1.0's name (llm_d_epp_*) and, where the
  // reference picker has one, its older name (inference_objective_*, inference_pool_*,
  // inference_extension_*), so dashboards for either read them (REFERENCE.md 17). `pool`
  // names the pool in the `name` label; `gauges` is RoutingCore::Gauges at rendering.
  void AppendMetrics(std::string& out, std::string_view pool,
                     const routing::RoutingCore::PoolGauges& gauges) const;

 private:
  // AppendMetrics' parts from this object's counters (the pool gauges between them).
  void AppendRequestSeries(std::string& out) const;  // takes mu_
  void AppendSchedulerSeries(std::string& out) const;

  template <std::size_t N>
  struct Histogram {
    std::array<uint64_t, N + 1> counts{};
    double sum = 0.0;
    void Observe(const std::array<double, N>& bounds, double v);
  };
  struct PerModel {
    uint64_t requests = 0;
    std::map<int, uint64_t> errors;
    uint64_t prompt_tokens = 0, completion_tokens = 0, usage_reports = 0;
    int64_t running = 0;
    Histogram<kDurationBounds.size()> duration;
    Histogram<kTtftBounds.size()> ttft;
    Histogram<kTpotBounds.size()> ntpot;
    Histogram<kTokenBounds.size()> input, output, cached;
  };
  // A series' labels, owned; ordered by model, target model, fairness id, priority, so
  // the series of one (model, target) pair are adjacent (the older names sum them).
  struct Key {
    std::string model, target, fairness;
    int64_t priority = 0;
  };
  struct KeyView {
    std::string_view model, target, fairness;
    int64_t priority = 0;
  };
  struct KeyLess {
    using is_transparent = void;
    static KeyView View(const Key& k) { return {k.model, k.target, k.fairness, k.priority}; }
    static KeyView View(const KeyView& k) { return k; }
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      const KeyView x = View(a), y = View(b);
      return std::tie(x.model, x.target, x.fairness, x.priority) <
             std::tie(y.model, y.target, y.fairness, y.priority);
    }
  };
  PerModel& ModelLocked(const RequestLabels& l);
  mutable std::mutex mu_;
  std::map<Key, PerModel, KeyLess> models_;  // guarded by mu_
  // The fairness ids given a series of their own, per model (at most kMaxFairnessIds).
  std::map<std::string, std::set<std::string, std::less<>>, std::less<>> flows_;  // guarded by mu_
  std::atomic<uint64_t> requests_{0};
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> picks_ok_{0}, picks_failed_{0};
};

}  // namespace kvroute::extproc
