#include "config/scenario_config.h"

#include "config/fleet_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include "simkit/workload/trace.h"

namespace kvroute::config {
namespace {

constexpr int64_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

// Optional fields: assigned only when the key is present.
void OptInt(const ConfigNode& map, std::string_view key, int64_t* out,
            int64_t min = std::numeric_limits<int64_t>::min()) {
  if (ConfigNode n = map.Get(key)) *out = n.Int(min);
}
void OptInt(const ConfigNode& map, std::string_view key, int* out, int64_t min = kIntMin) {
  if (ConfigNode n = map.Get(key)) *out = static_cast<int>(n.Int(min, kIntMax));
}
void OptNumber(const ConfigNode& map, std::string_view key, double* out) {
  if (ConfigNode n = map.Get(key)) *out = n.Number();
}
template <typename E>
void OptEnum(const ConfigNode& map, std::string_view key, E* out,
             std::initializer_list<std::pair<std::string_view, E>> names) {
  if (ConfigNode n = map.Get(key)) *out = n.Enum<E>(key, names);
}

workload::LengthComponent Component(const ConfigNode& n, bool allow_weight) {
  workload::LengthComponent c;
  if (n.IsScalar()) {
    c.min = c.max = n.Int();
    c.mean = static_cast<double>(c.min);
    return c;
  }
  if (!n.IsMap()) n.Fail("must be a length: an integer or {min, max, mean, std_dev}");
  if (allow_weight) {
    n.CheckKeys({"weight", "value", "min", "max", "mean", "std_dev"});
    OptNumber(n, "weight", &c.weight);
  } else {
    n.CheckKeys({"min", "max", "mean", "std_dev"});
  }
  if (ConfigNode v = n.Get("value")) {
    if (n.Has("min") || n.Has("max") || n.Has("mean") || n.Has("std_dev")) {
      v.Fail("use either value or min/max/mean/std_dev");
    }
    c.min = c.max = v.Int();
    c.mean = static_cast<double>(c.min);
    return c;
  }
  c.mean = n.Require("mean").Number();
  c.min = 1;
  c.max = int64_t{1} << 30;
  OptInt(n, "min", &c.min);
  OptInt(n, "max", &c.max);
  OptNumber(n, "std_dev", &c.std_dev);
  return c;
}

workload::LengthDist Dist(const ConfigNode& n, int64_t min_allowed) {
  workload::LengthDist d;
  if (n.IsMap() && n.Has("mixture")) {
    n.CheckKeys({"mixture"});
    const ConfigNode list = n.Get("mixture");
    const std::vector<ConfigNode> items = list.Items("a non-empty list");
    if (items.empty()) list.Fail("must be a non-empty list");
    for (const ConfigNode& item : items) d.components.push_back(Component(item, true));
  } else {
    d.components.push_back(Component(n, false));
  }
  if (Status st = d.Validate(min_allowed); !st.ok()) n.Fail(st.message());
  return d;
}

void ParseWorkload(const ConfigNode& n, std::string_view base_dir, workload::WorkloadSpec* w) {
  if (!n.IsMap()) n.Fail("must be a mapping");
  n.CheckKeys({"type", "endpoint", "num_groups", "num_prompts_per_group", "system_prompt_len",
               "question_len", "output_len", "max_turns", "think_time_s", "input_len", "path",
               "time_scale", "prefix_len", "adapters", "format", "block_size"});
  w->kind = n.Require("type").Enum<workload::WorkloadKind>(
      "type", {{"shared-prefix", workload::WorkloadKind::kSharedPrefix},
               {"multi-turn", workload::WorkloadKind::kMultiTurn},
               {"random", workload::WorkloadKind::kRandom},
               {"trace", workload::WorkloadKind::kTrace},
               {"shared_prefix", workload::WorkloadKind::kSharedPrefix},
               {"multi_turn", workload::WorkloadKind::kMultiTurn}});
  OptEnum(n, "endpoint", &w->endpoint,
          {{"completions", api::Endpoint::kCompletions},
           {"chat", api::Endpoint::kChatCompletions},
           {"chat-completions", api::Endpoint::kChatCompletions}});
  OptInt(n, "num_groups", &w->num_groups);
  OptInt(n, "num_prompts_per_group", &w->num_prompts_per_group);
  if (ConfigNode x = n.Get("system_prompt_len")) w->system_prompt_len = Dist(x, 0);
  if (ConfigNode x = n.Get("question_len")) w->question_len = Dist(x, 1);
  if (ConfigNode x = n.Get("output_len")) w->output_len = Dist(x, 1);
  if (ConfigNode x = n.Get("input_len")) w->input_len = Dist(x, 1);
  if (ConfigNode x = n.Get("max_turns")) {
    w->max_turns = static_cast<int32_t>(std::clamp<int64_t>(x.Int(), -1, 1 << 20));
  }
  OptNumber(n, "think_time_s", &w->think_time_s);
  OptNumber(n, "time_scale", &w->time_scale);
  OptInt(n, "prefix_len", &w->prefix_len);
  OptInt(n, "block_size", &w->block_size);
  if (ConfigNode a = n.Get("adapters")) {
    if (!a.IsMap()) a.Fail("must be a mapping of count, zipf, share");
    a.CheckKeys({"count", "zipf", "share"});
    workload::AdapterPopulation& p = w->adapters;
    p.count = static_cast<int32_t>(a.Require("count").Int(1, 1 << 20));
    OptNumber(a, "zipf", &p.zipf);
    OptNumber(a, "share", &p.share);
    if (!(p.zipf >= 0) || !std::isfinite(p.zipf)) a.Get("zipf").Fail("must be >= 0");
    if (!(p.share >= 0 && p.share <= 1)) a.Get("share").Fail("must be between 0 and 1");
  }
  if (w->kind == workload::WorkloadKind::kTrace) {
    const ConfigNode path = n.Get("path");
    if (!path) path.Fail("required for a trace workload");
    std::filesystem::path p = path.String();
    if (p.is_relative()) p = std::filesystem::path(std::string(base_dir)) / p;
    std::ifstream in(p, std::ios::binary);
    if (!in) path.Fail("cannot read " + p.string() + ": " + std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    // The format: `format`, else by the file's extension (.jsonl: Mooncake's).
    workload::TraceFormat format = workload::DefaultTraceFormat(p.string());
    OptEnum(n, "format", &format,
            {{"mooncake", workload::TraceFormat::kMooncake},
             {"azure", workload::TraceFormat::kAzureCsv},
             {"csv", workload::TraceFormat::kAzureCsv}});
    if (w->block_size < 1) n.Get("block_size").Fail("must be >= 1");
    workload::TraceParseResult t =
        workload::ParseTrace(format, text.str(), p.string(), w->block_size);
    if (!t.ok()) path.Fail(t.error);
    w->trace = std::make_shared<std::vector<workload::TraceRow>>(std::move(t.rows));
  }
  // Validate() says "<key>: <problem>"; the error goes to that key's line when present.
  const Status st = w->Validate();
  if (!st.ok()) {
    const std::string& err = st.message();
    const size_t colon = err.find(':');
    const std::string key = err.substr(0, colon);
    const std::string problem = colon == std::string::npos ? err : err.substr(colon + 2);
    const ConfigNode at = n.Get(key);
    n.FailAt(at.line(), at.field(), problem);
  }
}

void ParseArrivals(const ConfigNode& n, workload::ArrivalSpec* a, bool trace) {
  n.CheckKeys(
      {"process", "burstiness", "rate", "stages", "num_requests", "duration_s", "max_concurrency"});
  OptEnum(n, "process", &a->kind,
          {{"poisson", workload::ArrivalKind::kPoisson},
           {"gamma", workload::ArrivalKind::kGamma},
           {"constant", workload::ArrivalKind::kConstant}});
  OptNumber(n, "burstiness", &a->burstiness);
  if (n.Has("burstiness") && !n.Has("process")) a->kind = workload::ArrivalKind::kGamma;
  OptInt(n, "num_requests", &a->num_requests);
  OptNumber(n, "duration_s", &a->duration_s);
  OptInt(n, "max_concurrency", &a->max_concurrency);
  if (n.Has("rate") && n.Has("stages")) n.Get("stages").Fail("use either rate or stages");
  if (ConfigNode r = n.Get("rate")) a->stages = {{r.Number()}};
  if (ConfigNode s = n.Get("stages")) {
    const std::vector<ConfigNode> stages = s.Items("a non-empty list");
    if (stages.empty()) s.Fail("must be a non-empty list");
    a->stages.clear();
    for (const ConfigNode& item : stages) {
      if (!item.IsMap()) item.Fail("must be a mapping of rate and duration_s");
      item.CheckKeys({"rate", "duration_s"});
      workload::RateStage st;
      st.rate = item.Require("rate").Number();
      OptNumber(item, "duration_s", &st.duration_s);
      a->stages.push_back(st);
    }
  }
  if (trace) {
    // Trace arrivals come from the trace; only the count and duration limits apply.
    if (a->stages.empty()) a->stages = {{1.0}};
    if (a->num_requests < 0) n.Get("num_requests").Fail("must be >= 0");
    if (a->duration_s < 0) n.Get("duration_s").Fail("must be >= 0");
    return;
  }
  if (Status st = a->Validate(); !st.ok()) n.Fail(st.message());
}

// The keys a fleet group takes; the flat `fleet:` form takes them too (plus its own).
constexpr std::string_view kGroupKeys[] = {
    "replicas",     "region",       "zone",         "engine_preset",          "kv_blocks",
    "max_num_seqs", "max_num_batched_tokens",       "max_model_len",          "network_delay_s",
    "role",         "lora"};

// The group knobs present in `n` onto `g` (a fleet group, or the flat form's defaults).
void ParseGroupKnobs(const ConfigNode& n, FleetGroup* g) {
  OptInt(n, "replicas", &g->replicas, 1);
  for (auto [key, out] : {std::pair{"region", &g->region}, std::pair{"zone", &g->zone}}) {
    if (ConfigNode v = n.Get(key)) {
      *out = v.String();
      if (out->empty()) v.Fail("must not be empty");
    }
  }
  if (ConfigNode v = n.Get("role")) {
    g->role = v.String();
    // The deprecated spelling `both` is the label's business, not a scenario's: one name each.
    if (g->role != "prefill" && g->role != "decode" && g->role != "prefill-decode") {
      static constexpr std::string_view kRoles[] = {"prefill", "decode", "prefill-decode"};
      v.Fail("must be prefill, decode or prefill-decode (got '" + g->role + "')" +
             Suggest(g->role, kRoles));
    }
  }
  if (ConfigNode p = n.Get("engine_preset")) {
    g->engine_preset = p.String();
    if (!engine::PresetConfig(g->engine_preset)) {
      const std::vector<std::string> names = engine::PresetNames();
      const std::vector<std::string_view> views(names.begin(), names.end());
      p.Fail("unknown preset '" + g->engine_preset + "'" + Suggest(g->engine_preset, views));
    }
  }
  OptInt(n, "kv_blocks", &g->kv_blocks, 0);
  OptInt(n, "max_num_seqs", &g->max_num_seqs, 0);
  OptInt(n, "max_num_batched_tokens", &g->max_num_batched_tokens, 0);
  OptInt(n, "max_model_len", &g->max_model_len, 0);
  OptNumber(n, "network_delay_s", &g->network_delay_s);
  if (ConfigNode l = n.Get("lora")) {
    if (!l.IsMap()) l.Fail("must be a mapping of max_loras, max_cpu_loras, load_s");
    l.CheckKeys({"max_loras", "max_cpu_loras", "load_s"});
    g->lora.enabled = true;
    if (ConfigNode v = l.Get("max_loras")) g->lora.max_loras = static_cast<int>(v.Int(1, 1024));
    if (ConfigNode v = l.Get("max_cpu_loras")) {
      g->lora.max_cpu_loras = static_cast<int>(v.Int(1, 1 << 20));
    }
    OptNumber(l, "load_s", &g->lora.load_s);
    if (!(g->lora.load_s >= 0) || !std::isfinite(g->lora.load_s)) {
      l.Get("load_s").Fail("must be >= 0 (seconds)");
    }
    if (g->lora.max_cpu_loras != 0 && g->lora.max_cpu_loras < g->lora.max_loras) {
      l.Get("max_cpu_loras").Fail("must be >= max_loras (" + std::to_string(g->lora.max_loras) + ")");
    }
  }
  if (g->kv_blocks == 1) n.Get("kv_blocks").Fail("must be 0 (the preset's) or >= 2 (got 1)");
  if (!(g->network_delay_s >= 0)) n.Get("network_delay_s").Fail("must be >= 0");
}

void ParseFleet(const ConfigNode& n, FleetSpec* fl) {
  std::vector<std::string_view> keys(std::begin(kGroupKeys), std::end(kGroupKeys));
  keys.push_back("scrape_interval_s");
  keys.push_back("groups");
  n.CheckKeys(keys);
  ParseGroupKnobs(n, fl);
  OptNumber(n, "scrape_interval_s", &fl->scrape_interval_s);
  if (!(fl->scrape_interval_s > 0)) n.Get("scrape_interval_s").Fail("must be > 0");
  const ConfigNode groups = n.Get("groups");
  if (!groups) return;
  if (n.Has("replicas")) n.Get("replicas").Fail("use either replicas or groups");
  const std::vector<ConfigNode> items = groups.Items("a non-empty list of replica groups");
  if (items.empty()) groups.Fail("must be a non-empty list of replica groups");
  int64_t total = 0;
  for (const ConfigNode& item : items) {
    if (!item.IsMap()) item.Fail("must be a mapping of replicas, region, network_delay_s, ...");
    item.CheckKeys(kGroupKeys);
    FleetGroup g = static_cast<const FleetGroup&>(*fl);  // the fleet-level knobs as defaults
    item.Require("replicas");
    ParseGroupKnobs(item, &g);
    total += g.replicas;
    if (total > kIntMax) item.Get("replicas").Fail("too many replicas in all");
    fl->groups.push_back(std::move(g));
  }
  fl->replicas = static_cast<int>(total);
}

// `router:`. The region must be one some group has: a typo would make every replica remote.
// `replicas`: router replicas (>= 1).
void ParseRouter(const ConfigNode& n, const FleetSpec& fleet, std::string* region,
                 int* replicas) {
  if (!n.IsMap()) n.Fail("must be a mapping");
  n.CheckKeys({"region", "replicas"});
  if (ConfigNode v = n.Get("replicas")) *replicas = static_cast<int>(v.Int(1, 1024));
  // One of the two is required (an empty `router:` says nothing).
  const ConfigNode r = n.Has("replicas") ? n.Get("region") : n.Require("region");
  if (!r) return;
  *region = r.String();
  if (region->empty()) r.Fail("must not be empty");
  const std::vector<FleetGroup> groups = fleet.Groups();  // `known` views their names
  std::vector<std::string_view> known;
  for (const FleetGroup& g : groups) {
    if (g.region == *region) return;
    if (!g.region.empty()) known.push_back(g.region);
  }
  if (known.empty()) r.Fail("no fleet replica has a region (set fleet.groups[].region)");
  std::string list;
  for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
  r.Fail("no fleet group has region '" + *region + "' (regions: " + list + ")");
}

// `kv_events:`.
void ParseKvEvents(const ConfigNode& n, ScenarioKvEvents* k) {
  if (!n.IsMap()) n.Fail("must be a mapping");
  n.CheckKeys({"enabled", "delay", "loss", "replay", "buffer_steps"});
  if (ConfigNode v = n.Get("enabled")) k->enabled = v.Bool();
  if (ConfigNode v = n.Get("delay")) {
    const std::string text = v.Scalar("a duration");
    const std::optional<double> d = ParseDuration(text);
    if (!d || !std::isfinite(*d)) {
      v.Fail("must be a duration >= 0 such as 20ms, 0.05 or 0 (got '" + text + "')");
    }
    k->delay_s = *d;
  }
  if (ConfigNode v = n.Get("loss")) {
    k->loss = v.Number();
    if (k->loss < 0 || k->loss > 1) v.Fail("must be in [0, 1] (got " + v.Scalar() + ")");
  }
  if (ConfigNode v = n.Get("replay")) k->replay = v.Bool();
  if (ConfigNode v = n.Get("buffer_steps")) k->buffer_steps = v.Int(1, int64_t{1} << 32);
}

// `pd:`.
void ParsePd(const ConfigNode& n, ScenarioPd* pd) {
  if (!n.IsMap()) n.Fail("must be a mapping");
  n.CheckKeys({"non_cached_tokens", "prompt_tokens", "kv_lease_s", "kv_transfer_bandwidth",
               "kv_min_pull_tokens", "kv_bytes_per_token"});
  OptInt(n, "non_cached_tokens", &pd->options.non_cached_tokens, 0);
  OptInt(n, "prompt_tokens", &pd->options.prompt_tokens, 0);
  OptNumber(n, "kv_lease_s", &pd->kv_lease_s);
  if (!(pd->kv_lease_s > 0) || !std::isfinite(pd->kv_lease_s)) {
    n.Get("kv_lease_s").Fail("must be a number of seconds > 0");
  }
  if (ConfigNode v = n.Get("kv_transfer_bandwidth")) {
    pd->kv_transfer_bandwidth = static_cast<double>(v.ByteSize());
  }
  OptInt(n, "kv_min_pull_tokens", &pd->kv_min_pull_tokens, 0);
  if (ConfigNode v = n.Get("kv_bytes_per_token")) {
    const uint64_t b = v.ByteSize();
    if (b > static_cast<uint64_t>(kIntMax)) v.Fail("must be at most 2GiB");
    pd->kv_bytes_per_token = static_cast<int64_t>(b);
  }
}

void ParseSweep(const ConfigNode& n, Scenario* s) {
  n.CheckKeys({"rates", "ttft_p99_bound_s"});
  if (ConfigNode r = n.Get("rates")) {
    const std::vector<ConfigNode> rates = r.Items("a non-empty list");
    if (rates.empty()) r.Fail("must be a non-empty list");
    for (const ConfigNode& item : rates) {
      const double v = item.Number();
      if (!(v > 0)) item.Fail("must be > 0");
      if (!s->sweep_rates.empty() && v <= s->sweep_rates.back()) item.Fail("rates must ascend");
      s->sweep_rates.push_back(v);
    }
  }
  OptNumber(n, "ttft_p99_bound_s", &s->sweep_ttft_p99_bound_s);
  if (s->sweep_ttft_p99_bound_s < 0) n.Get("ttft_p99_bound_s").Fail("must be >= 0");
}

void ParseFlow(const ConfigNode& n, ScenarioFlow* f) {
  if (!n.IsMap()) n.Fail("must be a mapping");
  n.CheckKeys({"enabled", "max_requests", "ttl", "no_endpoint_ttl", "fairness", "ordering",
               "affinity_window", "max_affinity_skips", "sheddable_reserve", "slo_aware",
               "slo_admit_fraction", "slo_release_fraction"});
  if (ConfigNode v = n.Get("enabled")) f->enabled = v.Bool();
  if (ConfigNode v = n.Get("slo_aware")) f->options.slo_aware = v.Bool();
  if (ConfigNode v = n.Get("slo_admit_fraction")) {
    const double x = v.Number();
    if (x < 0 || x > 1) v.Fail("must be in 0..1");
    f->options.slo_admit_fraction = x;
  }
  if (ConfigNode v = n.Get("slo_release_fraction")) {
    const double x = v.Number();
    if (x < 0 || x > 1) v.Fail("must be in 0..1");
    f->options.slo_release_fraction = x;
  }
  flow::FlowOptions& o = f->options;
  if (ConfigNode v = n.Get("max_requests")) o.max_requests = static_cast<uint64_t>(v.Int(1));
  if (ConfigNode v = n.Get("ttl")) o.default_ttl_s = v.Duration();
  if (ConfigNode v = n.Get("no_endpoint_ttl")) o.no_endpoint_ttl_s = v.Duration();
  OptEnum(n, "fairness", &o.fairness,
          {{"round_robin", flow::Fairness::kRoundRobin}, {"global", flow::Fairness::kGlobal}});
  OptEnum(n, "ordering", &o.ordering,
          {{"fcfs", flow::Ordering::kFcfs},
           {"earliest_deadline", flow::Ordering::kEarliestDeadline}});
  if (ConfigNode v = n.Get("affinity_window")) {
    o.affinity_window = static_cast<uint32_t>(v.Int(1, flow::kMaxAffinityWindow));
  }
  if (ConfigNode v = n.Get("sheddable_reserve")) o.sheddable_reserve = v.Int(0, 4);
  if (ConfigNode v = n.Get("max_affinity_skips")) {
    o.max_affinity_skips = static_cast<uint32_t>(v.Int(0, kIntMax));
  }
  if (Status st = flow::Validate(o); !st.ok()) n.Fail(st.message());
}

void ParseTenants(const ConfigNode& n, std::vector<ScenarioTenant>* out) {
  const std::vector<ConfigNode> items = n.Items("a non-empty list of tenants");
  if (items.empty()) n.Fail("must be a non-empty list of tenants");
  for (const ConfigNode& item : items) {
    if (!item.IsMap()) item.Fail("must be a mapping of name, share and priority");
    item.CheckKeys({"name", "share", "priority"});
    ScenarioTenant t;
    t.name = item.Require("name").String();
    for (const ScenarioTenant& other : *out) {
      if (other.name == t.name) item.Get("name").Fail("duplicate tenant '" + t.name + "'");
    }
    OptNumber(item, "share", &t.share);
    if (!(t.share > 0) || !std::isfinite(t.share)) item.Get("share").Fail("must be > 0");
    OptInt(item, "priority", &t.priority, kIntMin);
    out->push_back(std::move(t));
  }
}

Scenario Parse(const ConfigNode& root, std::string_view base_dir) {
  root.CheckKeys(
      {"name", "description", "seed", "workload", "arrivals", "fleet", "router", "slo", "policies",
       "sweep", "faults", "flow", "tenants", "kv_events", "pd"});
  Scenario s;
  if (ConfigNode n = root.Get("name")) s.name = n.String();
  if (ConfigNode n = root.Get("description")) n.String();
  if (ConfigNode n = root.Get("seed")) s.seed = n.Uint();
  ParseWorkload(root.Require("workload"), base_dir, &s.workload);
  const bool trace = s.workload.kind == workload::WorkloadKind::kTrace;
  if (ConfigNode n = root.Get("arrivals")) {
    ParseArrivals(n, &s.arrivals, trace);
  } else if (trace) {
    s.arrivals.stages = {{1.0}};
  } else {
    n.Fail("required");
  }
  if (ConfigNode n = root.Get("fleet")) {
    ParseFleet(n, &s.fleet);
    // Prefill replicas alone could serve nothing: every pick needs a decode-capable one.
    const std::vector<FleetGroup> groups = s.fleet.Groups();
    const bool prefill = std::any_of(groups.begin(), groups.end(),
                                     [](const FleetGroup& g) { return g.role == "prefill"; });
    const bool decode = std::any_of(groups.begin(), groups.end(),
                                    [](const FleetGroup& g) { return g.role != "prefill"; });
    if (prefill && !decode) {
      n.Fail("every replica has role prefill: some group must be decode-capable (decode, "
             "prefill-decode or no role)");
    }
  }
  if (ConfigNode n = root.Get("pd")) ParsePd(n, &s.pd);
  if (ConfigNode n = root.Get("router")) {
    ParseRouter(n, s.fleet, &s.router_region, &s.router_replicas);
  }
  if (ConfigNode n = root.Get("kv_events")) ParseKvEvents(n, &s.kv_events);
  if (ConfigNode n = root.Get("slo")) {
    n.CheckKeys({"ttft_s", "tpot_s", "e2e_s"});
    OptNumber(n, "ttft_s", &s.slo.ttft_s);
    OptNumber(n, "tpot_s", &s.slo.tpot_s);
    OptNumber(n, "e2e_s", &s.slo.e2e_s);
  }
  if (ConfigNode n = root.Get("policies")) {
    for (const ConfigNode& p : n.Items("a list of policy names")) s.policies.push_back(p.String());
  }
  if (ConfigNode n = root.Get("sweep")) ParseSweep(n, &s);
  if (ConfigNode n = root.Get("faults")) {
    static constexpr std::string_view kExtra[] = {"replica"};
    for (const ConfigNode& entry : n.Items("a list of faults")) {
      ScenarioFault f;
      bool has_replica = false;
      f.spec = ReadFaultEntry(entry, kExtra, [&](const std::string&, const ConfigNode& v) {
        f.replica = static_cast<int>(v.Int(0, s.fleet.replicas - 1));
        has_replica = true;
      });
      if (!has_replica) entry.Get("replica").Fail("required");
      using fault::FaultKind;
      if (f.spec.kind != FaultKind::kCrash && f.spec.kind != FaultKind::kSlow &&
          f.spec.kind != FaultKind::kRestart) {
        entry.Get("kind").Fail("fault kind '" + std::string(fault::FaultKindName(f.spec.kind)) +
                               "' is not modelled by simulate (crash, slow, restart); "
                               "use it with `kvroute sim`");
      }
      s.faults.push_back(f);
    }
  }
  if (ConfigNode n = root.Get("flow")) {
    ParseFlow(n, &s.flow);
    if (s.flow.enabled && s.router_replicas > 1) {
      n.Get("enabled").Fail("flow control is not modelled with several router replicas "
                            "(router.replicas " + std::to_string(s.router_replicas) + ")");
    }
  }
  if (ConfigNode n = root.Get("tenants")) ParseTenants(n, &s.tenants);
  return s;
}

}  // namespace

bool Scenario::HasRoles() const {
  for (const FleetGroup& g : fleet.Groups()) {
    if (!g.role.empty()) return true;
  }
  return false;
}

std::vector<FleetGroup> FleetSpec::Groups() const {
  if (groups.empty()) return {static_cast<const FleetGroup&>(*this)};
  return groups;
}

engine::EngineConfig FleetGroup::EngineConfigFor() const {
  engine::EngineConfig c = *engine::PresetConfig(engine_preset);
  if (kv_blocks > 0) c.num_gpu_blocks = kv_blocks;
  if (max_num_seqs > 0) c.max_num_seqs = max_num_seqs;
  if (max_num_batched_tokens > 0) c.max_num_batched_tokens = max_num_batched_tokens;
  if (max_model_len > 0) c.max_model_len = max_model_len;
  // Requests run to max_tokens (clients send ignore_eos), so outputs match the workload.
  c.fixed_output_tokens = 0;
  c.mean_output_tokens = 0.0;
  c.lora = lora;
  return c;
}

ConfigOr<Scenario> ParseScenario(std::string_view yaml, std::string_view source_name,
                                 std::string_view base_dir) {
  const std::string source(source_name);
  return ParseYaml<Scenario>(yaml, source, [&](const ConfigNode& root) {
    Scenario s = Parse(root, base_dir);
    s.source = source;
    if (s.name.empty()) s.name = std::filesystem::path(source).stem().string();
    return s;
  });
}

ConfigOr<Scenario> LoadScenarioFile(const std::string& path) {
  ConfigOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return {std::nullopt, std::move(text.error)};
  return ParseScenario(*text.value, path, std::filesystem::path(path).parent_path().string());
}

}  // namespace kvroute::config
