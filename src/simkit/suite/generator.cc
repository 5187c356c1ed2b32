#include "simkit/suite/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/common/rng.h"
#include "core/engine/engine.h"

namespace kvroute::suite {

namespace {

constexpr int64_t kPresetBlocks = 26304;  // llama3-8b-h100's KV blocks

// Draws for one scenario.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  double Uniform(double lo, double hi) { return lo + (hi - lo) * rng_.Uniform(); }
  // Log-uniform: as many small values as large ones.
  double LogUniform(double lo, double hi) { return std::exp(Uniform(std::log(lo), std::log(hi))); }
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng_.Below(static_cast<uint64_t>(hi - lo + 1))); }
  int64_t LogInt(int64_t lo, int64_t hi) {
    return std::clamp<int64_t>(static_cast<int64_t>(std::llround(LogUniform(static_cast<double>(lo), static_cast<double>(hi)))), lo, hi);
  }
  bool Chance(double p) { return rng_.Uniform() < p; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[rng_.Below(v.size())]; }

 private:
  Rng rng_;
};

// A length distribution around `mean` (+-50%, std_dev a quarter of it), as scenario YAML.
std::string Spread(int64_t mean) {
  const int64_t lo = std::max<int64_t>(1, mean / 2), hi = std::max<int64_t>(lo, mean * 3 / 2);
  return fmt::format("{{min: {}, max: {}, mean: {}, std_dev: {}}}", lo, hi, mean, std::max<int64_t>(1, mean / 4));
}

// The family's workload block, its mean prompt and output lengths and expected reuse.
struct Workload {
  std::string yaml;
  double prompt = 0, output = 0, reuse = 0;
  bool lora = false;
  bool trace = false;
};

Workload Chat(Draw& d, bool hot) {
  Workload w;
  const int64_t groups = hot ? 1 : d.LogInt(2, 64);
  const int64_t per_group = d.LogInt(4, 256);
  const int64_t system = hot ? d.LogInt(1000, 8000) : d.LogInt(200, 6000);
  const int64_t question = d.LogInt(30, 600);
  const int64_t output = d.LogInt(20, 400);
  w.yaml = fmt::format(
      "workload:\n  type: shared-prefix\n  num_groups: {}\n  num_prompts_per_group: {}\n"
      "  system_prompt_len: {}\n  question_len: {}\n  output_len: {}\n",
      groups, per_group, Spread(system), Spread(question), Spread(output));
  w.prompt = static_cast<double>(system + question);
  w.output = static_cast<double>(output);
  w.reuse = static_cast<double>(system) / w.prompt;
  return w;
}

Workload MultiTurn(Draw& d, bool agentic) {
  Workload w;
  const int64_t groups = d.LogInt(2, 32);
  const int64_t users = d.LogInt(4, 64);
  const int64_t system = agentic ? d.LogInt(3000, 12000) : d.LogInt(200, 3000);
  const int64_t question = agentic ? d.LogInt(50, 400) : d.LogInt(20, 200);
  const int64_t output = agentic ? d.LogInt(30, 200) : d.LogInt(50, 400);
  const int64_t turns = agentic ? d.Int(10, 30) : d.Int(3, 10);
  const double think = agentic ? 0.0 : d.Uniform(0.0, 5.0);
  w.yaml = fmt::format(
      "workload:\n  type: multi-turn\n  endpoint: chat\n  num_groups: {}\n  num_prompts_per_group: {}\n"
      "  system_prompt_len: {}\n  question_len: {}\n  output_len: {}\n  max_turns: {}\n"
      "  think_time_s: {:.2f}\n",
      groups, users, Spread(system), Spread(question), Spread(output), turns, think);
  // The mean turn quotes about half the conversation's turns.
  const double history = static_cast<double>(turns) / 2.0 * static_cast<double>(question + output);
  w.prompt = static_cast<double>(system) + history;
  w.output = static_cast<double>(output);
  w.reuse = (static_cast<double>(system) + history * 0.8) / w.prompt;
  return w;
}

Workload NoSharing(Draw& d) {
  Workload w;
  const int64_t input = d.LogInt(100, 4000);
  const int64_t output = d.LogInt(20, 500);
  w.yaml = fmt::format("workload:\n  type: random\n  input_len: {}\n  output_len: {}\n", Spread(input),
                       Spread(output));
  w.prompt = static_cast<double>(input);
  w.output = static_cast<double>(output);
  return w;
}

Workload Lora(Draw& d) {
  Workload w = Chat(d, false);
  const int64_t adapters = d.LogInt(2, 32);
  w.yaml += fmt::format("  adapters: {{count: {}, zipf: {:.2f}, share: {:.2f}}}\n", adapters, d.Uniform(0.0, 1.5),
                        d.Uniform(0.5, 1.0));
  w.reuse *= 0.7;  // adapters split the caches
  w.lora = true;
  return w;
}

Workload Trace(Draw& d, const std::vector<std::string>& traces) {
  Workload w;
  w.trace = true;
  std::string quoted;
  for (char c : d.Pick(traces)) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  // time_scale is set with the load (below): the trace's own arrivals, faster or slower.
  w.yaml = fmt::format("workload:\n  type: trace\n  format: mooncake\n  path: \"{}\"\n  block_size: 512\n", quoted);
  w.prompt = 12000;  // the synthetic Mooncake trace's mean input (its ideal reuse 65%)
  w.output = 350;
  w.reuse = 0.4;
  return w;
}

}  // namespace

double EstimateCapacity(double prompt_tokens, double output_tokens, double reuse, int64_t kv_blocks) {
  const engine::StepModel m;
  const double per_seq = std::max(1.0, prompt_tokens + output_tokens);
  const double batch = std::clamp(std::floor(static_cast<double>(kv_blocks) * 16.0 / per_seq), 1.0, 256.0);
  const double output = std::max(1.0, output_tokens);
  const double fresh = prompt_tokens * (1.0 - std::clamp(reuse, 0.0, 0.95));
  // One step: the base, the prefill its share of new requests brings, every decode, and
  // the resident context read.
  const double step_us = m.base_us + m.per_prefill_token_us * fresh * batch / output + m.per_decode_seq_us * batch +
                         m.per_context_token_us * batch * (prompt_tokens + output_tokens / 2);
  return batch / output / (step_us * 1e-6);
}

std::vector<GeneratedScenario> Generate(const GeneratorOptions& options) {
  std::vector<GeneratedScenario> out;
  std::vector<std::string> families = {"chat", "chat", "hot-prefix", "multi-turn", "agentic", "no-sharing", "lora"};
  if (!options.traces.empty()) families.push_back("trace");
  const std::vector<std::string> regimes = {"steady", "steady", "burst", "ramp"};
  for (int i = 0; i < options.count; ++i) {
    Draw d(MixKey(options.seed, static_cast<uint64_t>(i) + 1));
    GeneratedScenario g;
    g.family = d.Pick(families);
    g.regime = d.Pick(regimes);
    if (g.family == "trace") g.regime = "scaled";  // the trace's own arrivals, time-scaled
    Workload w = g.family == "chat"         ? Chat(d, false)
                 : g.family == "hot-prefix" ? Chat(d, true)
                 : g.family == "multi-turn" ? MultiTurn(d, false)
                 : g.family == "agentic"    ? MultiTurn(d, true)
                 : g.family == "no-sharing" ? NoSharing(d)
                 : g.family == "lora"       ? Lora(d)
                                            : Trace(d, options.traces);
    // The fleet: 2-64 replicas (more small fleets than large), the preset's KV or a
    // smaller one, sometimes half the replicas with half the KV.
    const int64_t replicas = d.LogInt(2, 64);
    const int64_t kv = d.Chance(0.5) ? kPresetBlocks : d.LogInt(2048, kPresetBlocks);
    const bool hetero_kv = replicas >= 4 && d.Chance(0.25);
    std::string fleet = "fleet:\n  engine_preset: llama3-8b-h100\n  scrape_interval_s: 0.05\n"
                        "  network_delay_s: 0.0005\n  max_model_len: 262144\n";
    std::string lora_group = w.lora ? fmt::format(", lora: {{max_loras: {}, max_cpu_loras: {}, load_s: 0.05}}",
                                                  d.Int(1, 4), d.Int(4, 16))
                                    : "";
    double fleet_capacity = 0;
    if (hetero_kv) {
      const int64_t half = replicas / 2;
      fleet += fmt::format("  groups:\n    - {{replicas: {}, kv_blocks: {}{}}}\n    - {{replicas: {}, kv_blocks: {}{}}}\n",
                           replicas - half, kv, lora_group, half, std::max<int64_t>(1024, kv / 2), lora_group);
      fleet_capacity = static_cast<double>(replicas - half) * EstimateCapacity(w.prompt, w.output, w.reuse, kv) +
                       static_cast<double>(half) *
                           EstimateCapacity(w.prompt, w.output, w.reuse, std::max<int64_t>(1024, kv / 2));
    } else {
      fleet += fmt::format("  kv_blocks: {}\n", kv);
      if (w.lora) fleet += fmt::format("  groups:\n    - {{replicas: {}{}}}\n", replicas, lora_group);
      else fleet += fmt::format("  replicas: {}\n", replicas);
      fleet_capacity = static_cast<double>(replicas) * EstimateCapacity(w.prompt, w.output, w.reuse, kv);
    }
    // Faults: a replica slow for the whole run, or one that crashes for a while.
    std::string faults;
    const double fault_draw = d.Uniform(0, 1);
    if (fault_draw < 0.15) {
      faults = fmt::format("faults:\n  - {{replica: 0, kind: slow, at: 0s, duration: 100000s, factor: {:.1f}}}\n",
                           d.Uniform(1.5, 4.0));
      g.regime += "+slow";
    } else if (fault_draw < 0.25) {
      faults = fmt::format("faults:\n  - {{replica: 0, kind: crash, at: {:.0f}s, duration: {:.0f}s}}\n",
                           d.Uniform(3, 10), d.Uniform(3, 15));
      g.regime += "+crash";
    }
    // Load: requests, and a base rate against the estimated capacity.
    const int64_t n = d.Int(options.min_requests, options.max_requests);
    const double base = d.Uniform(0.3, 0.9) * fleet_capacity;
    std::string arrivals;
    if (w.trace) {
      // The trace's own arrivals (~3.9 req/s for the synthetic one) scaled to the load.
      const double scale = std::max(0.05, base / 3.9);
      w.yaml += fmt::format("  time_scale: {:.3f}\n", scale);
      arrivals = fmt::format("arrivals:\n  num_requests: {}\n", n);
    } else if (g.regime.starts_with("burst")) {
      const double factor = d.LogUniform(2.0, 10.0);
      const double burst_s = d.Uniform(2.0, 8.0);
      const double before = std::max(1.0, 0.25 * static_cast<double>(n) / base);
      arrivals = fmt::format(
          "arrivals:\n  process: poisson\n  num_requests: {}\n  stages:\n    - {{rate: {:.2f}, duration_s: {:.1f}}}\n"
          "    - {{rate: {:.2f}, duration_s: {:.1f}}}\n    - {{rate: {:.2f}, duration_s: 100000}}\n",
          n, base, before, base * factor, burst_s, base);
      g.regime = fmt::format("burst-{:.0f}x{}", factor, g.regime.substr(5));
    } else if (g.regime.starts_with("ramp")) {
      const double stage = std::max(1.0, static_cast<double>(n) / (base * 1.25 * 3));
      arrivals = fmt::format(
          "arrivals:\n  process: poisson\n  num_requests: {}\n  stages:\n    - {{rate: {:.2f}, duration_s: {:.1f}}}\n"
          "    - {{rate: {:.2f}, duration_s: {:.1f}}}\n    - {{rate: {:.2f}, duration_s: 100000}}\n",
          n, base, stage, 2.0 * fleet_capacity, stage, base);
    } else {
      arrivals = fmt::format("arrivals:\n  process: {}\n  rate: {:.2f}\n  num_requests: {}\n",
                             d.Chance(0.3) ? "gamma\n  burstiness: 0.3" : "poisson", base, n);
    }
    g.name = fmt::format("gen-{}-{:02d}-{}-{}", options.seed, i, g.family, g.regime);
    g.yaml = fmt::format(
        "# Generated (kvroute simulate --suite; simkit/suite/generator.h): family {}, regime {},\n"
        "# estimated fleet capacity {:.1f} req/s, base rate {:.1f} req/s.\n"
        "name: {}\nseed: {}\n{}{}{}{}slo: {{ttft_s: {}, tpot_s: 0.05}}\n",
        g.family, g.regime, fleet_capacity, base, g.name, i + 1, w.yaml, arrivals, fleet, faults,
        w.prompt > 8000 ? "5.0" : "2.0");
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace kvroute::suite
