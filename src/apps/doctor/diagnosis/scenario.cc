// ScenarioYaml: the observed traffic as a `kvroute simulate` scenario, so "what would
// kvroute do with this fleet" is one command away. /metrics does not say everything a
// scenario needs (which prompts share prefixes, the step model of the GPU); what is
// guessed is written into the YAML as comments, next to what was measured.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "apps/doctor/diagnosis/doctor.h"

namespace kvroute::doctor {
namespace {

// One sampled length stays far below the simulated engine's max_model_len (131072) even
// when a prompt and an output both come from an open-ended +Inf bucket.
constexpr int64_t kMaxLength = 65536;
// The scenario runs about this long at the observed rate.
constexpr double kScenarioSeconds = 60;
constexpr int64_t kMaxRequests = 100000;

bool Usable(const Scrape& s) { return s.reachable && s.any_engine_series; }

// A replica's first and last usable scrapes in the window (both null when it has none).
std::pair<const Scrape*, const Scrape*> UsableEnds(const ReplicaHistory& h) {
  const Scrape* first = nullptr;
  const Scrape* last = nullptr;
  for (const Scrape& s : h.scrapes) {
    if (!Usable(s)) continue;
    if (!first) first = &s;
    last = &s;
  }
  return {first, last};
}

struct Component {
  double weight;
  int64_t min, max;
  double mean, std_dev;
};

// Window deltas of one request-size histogram, merged over replicas (bounds must agree).
std::optional<Histogram> MergedWindow(const std::vector<ReplicaHistory>& hs,
                                      Histogram Scrape::*field) {
  std::optional<Histogram> merged;
  for (const ReplicaHistory& h : hs) {
    const auto [first, last] = UsableEnds(h);
    if (!last || first == last || (last->*field).empty() || (first->*field).empty()) continue;
    const std::optional<Histogram> d = HistogramDelta(last->*field, first->*field);
    if (!d) continue;
    if (!merged) {
      merged = d;
    } else if (merged->upper == d->upper) {
      for (size_t i = 0; i < d->cumulative.size(); ++i) merged->cumulative[i] += d->cumulative[i];
      merged->sum += d->sum;
      merged->count += d->count;
    }
  }
  if (!merged || !(merged->cumulative.back() > 0)) return std::nullopt;
  return merged;
}

// A bucket [lower, upper] of a token-count histogram as a mixture component: uniform-ish
// over the bucket (mean in the middle, std a quarter of its width, clipped to it). The
// +Inf bucket is taken as [highest bound, 2 x highest bound].
std::vector<Component> FromBuckets(const Histogram& h) {
  std::vector<Component> out;
  const double total = h.cumulative.back();
  double below = 0;
  for (size_t i = 0; i < h.upper.size(); ++i) {
    const double n = h.cumulative[i] - below;
    below = h.cumulative[i];
    if (!(n > 0)) continue;
    const double lower = i == 0 ? 0.0 : h.upper[i - 1];
    const double upper = std::isinf(h.upper[i]) ? 2 * std::max(lower, 1.0) : h.upper[i];
    const int64_t lo =
        std::clamp<int64_t>(static_cast<int64_t>(std::floor(lower)) + 1, 1, kMaxLength);
    const int64_t hi = std::clamp<int64_t>(static_cast<int64_t>(std::floor(upper)), lo, kMaxLength);
    out.push_back({n / total, lo, hi, (lo + hi) / 2.0, (hi - lo) / 4.0});
  }
  return out;
}

// The mean of a distribution given only by totals: a tight component around it.
std::vector<Component> FromMean(double mean) {
  const int64_t m = std::clamp<int64_t>(std::llround(mean), 1, kMaxLength);
  return {{1.0, std::max<int64_t>(1, m / 2), std::min(kMaxLength, m * 2), static_cast<double>(m),
           m / 4.0}};
}

double MeanOf(const std::vector<Component>& cs) {
  double w = 0, s = 0;
  for (const Component& c : cs) {
    w += c.weight;
    s += c.weight * c.mean;
  }
  return w > 0 ? s / w : 0;
}

// Every length of `cs` times `f` (>= 1 token).
std::vector<Component> Scaled(const std::vector<Component>& cs, double f) {
  std::vector<Component> out;
  for (const Component& c : cs) {
    const int64_t lo = std::max<int64_t>(1, std::llround(c.min * f));
    const int64_t hi = std::max<int64_t>(lo, std::llround(static_cast<double>(c.max) * f));
    out.push_back(
        {c.weight, lo, hi, std::clamp(c.mean * f, double(lo), double(hi)), c.std_dev * f});
  }
  return out;
}

std::string Yaml(const std::vector<Component>& cs) {
  std::string o = "\n    mixture:\n";
  for (const Component& c : cs) {
    o +=
        fmt::format("      - {{weight: {:.4f}, min: {}, max: {}, mean: {:.1f}, std_dev: {:.1f}}}\n",
                    c.weight, c.min, c.max, c.mean, c.std_dev);
  }
  return o;
}

// Totals over the window's first and last usable scrapes of every replica.
double CounterDelta(const std::vector<ReplicaHistory>& hs, std::optional<double> Scrape::*field,
                    bool* known) {
  double total = 0;
  *known = false;
  for (const ReplicaHistory& h : hs) {
    const auto [first, last] = UsableEnds(h);
    if (!last || first == last || !(first->*field) || !(last->*field)) continue;
    if (*(last->*field) < *(first->*field)) continue;
    total += *(last->*field) - *(first->*field);
    *known = true;
  }
  return total;
}

}  // namespace

std::string ScenarioYaml(const Report& report, const std::vector<ReplicaHistory>& replicas,
                         std::string* error) {
  auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return std::string();
  };
  double rate = 0;
  std::string rate_source;
  if (report.fleet.requests_per_s) {
    rate = *report.fleet.requests_per_s;
    rate_source = "requests finished per second over the window, summed over replicas";
  } else {
    for (const ReplicaFigures& r : report.replicas) rate += r.requests_per_s.value_or(0);
    rate_source = "requests finished per second, summed over the replicas that report it";
  }
  if (!(rate > 0) || !std::isfinite(rate)) {
    return fail(
        fmt::format("no requests in the window ({:.1f} s over {} replicas): nothing to "
                    "approximate; scrape for longer, under traffic",
                    report.window_s, replicas.size()));
  }

  bool req_known = false;
  const double requests = CounterDelta(replicas, &Scrape::requests_finished, &req_known);
  // One length distribution: the window's request-size buckets, else the token counter's
  // mean per finished request. Empty `error_out` on success.
  auto lengths = [&](Histogram Scrape::*hist_field, std::optional<double> Scrape::*tokens_field,
                     std::string_view what, std::string_view hist_name,
                     std::string_view counter_name, std::vector<Component>& out,
                     std::string& source, std::string& error_out) {
    if (const std::optional<Histogram> h = MergedWindow(replicas, hist_field)) {
      out = FromBuckets(*h);
      source = fmt::format("{} buckets ({:.0f} requests)", hist_name, h->cumulative.back());
      return true;
    }
    bool known = false;
    const double tokens = CounterDelta(replicas, tokens_field, &known);
    if (!known || !req_known || !(requests > 0) || !(tokens > 0)) {
      error_out = fmt::format(
          "no {} length: neither {} nor {} with vllm:request_success_total moved in the window",
          what, hist_name, counter_name);
      return false;
    }
    out = FromMean(tokens / requests);
    source = fmt::format("mean of {} per finished request (no histogram)", counter_name);
    return false;
  };
  std::vector<Component> prompt, output;
  std::string prompt_source, output_source, why;
  const bool prompt_buckets =
      lengths(&Scrape::prompt_len, &Scrape::prompt_tokens, "prompt", "vllm:request_prompt_tokens",
              "vllm:prompt_tokens_total", prompt, prompt_source, why);
  if (!why.empty()) return fail(why);
  const bool output_buckets = lengths(&Scrape::output_len, &Scrape::generation_tokens, "output",
                                      "vllm:request_generation_tokens",
                                      "vllm:generation_tokens_total", output, output_source, why);
  if (!why.empty()) return fail(why);
  const bool from_buckets = prompt_buckets || output_buckets;

  double best_hit = 0;
  std::string best_name;
  for (const ReplicaFigures& r : report.replicas) {
    if (r.hit_rate && *r.hit_rate > best_hit) {
      best_hit = *r.hit_rate;
      best_name = r.name;
    }
  }
  // The share of a prompt that is a shared prefix is at least the best hit rate any
  // replica achieved (a hit is a reused prefix; a worse router reuses less of what is
  // there). Capped so the question part stays a real part of the prompt.
  const double share = std::clamp(best_hit, 0.0, 0.9);
  const int num_replicas = std::max<int>(1, static_cast<int>(replicas.size()));
  std::optional<int64_t> blocks, block_size;
  for (const ReplicaFigures& r : report.replicas) {
    if (!blocks && r.num_gpu_blocks && *r.num_gpu_blocks >= 2) blocks = r.num_gpu_blocks;
    if (!block_size && r.block_size) block_size = r.block_size;
  }
  const int64_t num_requests =
      std::clamp<int64_t>(std::llround(std::ceil(rate * kScenarioSeconds)), 1, kMaxRequests);

  std::string y;
  y += "# Written by `kvroute doctor --scenario-out`: the traffic it observed, approximated.\n";
  y += fmt::format("# Window {:.1f} s over {} replicas. Measured:\n", report.window_s,
                   replicas.size());
  y += fmt::format("#   rate {:.3f} req/s: {}\n", rate, rate_source);
  y += fmt::format("#   prompt lengths: {}\n", prompt_source);
  y += fmt::format("#   output lengths: {}\n", output_source);
  if (from_buckets) {
    y += "#   each histogram bucket is one mixture component spread over the bucket's range\n";
    y += "#   (the +Inf bucket as [highest bound, 2x highest bound]), weighted by its count.\n";
  }
  if (!prompt_buckets || !output_buckets) {
    y += "#   a length known only by its mean is one component over [mean/2, 2x mean].\n";
  }
  y += "# Assumed (not observable from /metrics; edit to match what you know):\n";
  if (share >= 0.05) {
    y += fmt::format(
        "#   a shared system prompt of {:.0f}% of the mean prompt: the best hit rate seen\n",
        share * 100);
    y += fmt::format(
        "#   ({}, {:.1f}%) is a lower bound of the shared share; the questions are the\n",
        best_name, best_hit * 100);
    y += "#   prompt lengths scaled down by the rest;\n";
    y +=
        fmt::format("#   {} prefix groups (2 per replica) of 32 prompts each;\n", 2 * num_replicas);
  } else {
    y += "#   no shared prefixes (no replica's hit rate reached 5%): workload random;\n";
  }
  y += "#   the engine's speed is the llama3-8b-h100 preset's step model";
  y += block_size && *block_size != 16
           ? fmt::format(" (block size 16; the fleet reports {})", *block_size)
           : std::string(" (block size 16)");
  y += ";\n#   arrivals are Poisson at the mean rate.\n";
  y += "name: doctor-observed\nseed: 1\nworkload:\n";
  const double mean_prompt = MeanOf(prompt);
  if (share >= 0.05) {
    const int64_t system_len = std::max<int64_t>(1, std::llround(share * mean_prompt));
    y += "  type: shared-prefix\n";
    y += fmt::format("  num_groups: {}\n  num_prompts_per_group: 32\n", 2 * num_replicas);
    y += fmt::format("  system_prompt_len: {}\n", system_len);
    y += "  question_len:" + Yaml(Scaled(prompt, 1.0 - share));
  } else {
    y += "  type: random\n";
    y += "  input_len:" + Yaml(prompt);
  }
  y += "  output_len:" + Yaml(output);
  y += fmt::format("arrivals:\n  process: poisson\n  rate: {:.3f}\n  num_requests: {}\n", rate,
                   num_requests);
  y += fmt::format("fleet:\n  replicas: {}\n  engine_preset: llama3-8b-h100\n", num_replicas);
  if (blocks) {
    y += fmt::format("  kv_blocks: {}  # vllm:cache_config_info num_gpu_blocks\n", *blocks);
  } else {
    y += "  # kv_blocks: the preset's (no replica reported num_gpu_blocks)\n";
  }
  y += "policies: [round-robin, kvroute]\n";
  if (error) error->clear();
  return y;
}

}  // namespace kvroute::doctor
