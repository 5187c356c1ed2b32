#include "simulate/scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <sstream>

#include "core/workload/trace.h"

namespace kvroute::simulate {
namespace {

// Load-time only: a failed check unwinds to ParseScenario, which turns it into the
// error string. Nothing on the simulation path throws.
struct ScenarioError {
  int line;
  std::string field;
  std::string message;
};

int LineOf(const YAML::Node& n) { return n.Mark().line >= 0 ? n.Mark().line + 1 : 0; }

[[noreturn]] void Fail(const YAML::Node& n, const std::string& field, const std::string& msg) {
  throw ScenarioError{LineOf(n), field, msg};
}

void CheckKeys(const YAML::Node& map, const std::string& field,
               std::initializer_list<std::string_view> allowed) {
  if (!map.IsMap()) Fail(map, field, "expected a mapping");
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      Fail(kv.first, field.empty() ? key : field + "." + key, "unknown field");
    }
  }
}

std::string Join(const std::string& a, std::string_view b) {
  return a.empty() ? std::string(b) : a + "." + std::string(b);
}

int64_t AsInt(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) Fail(n, field, "expected an integer");
  try {
    return n.as<int64_t>();
  } catch (const YAML::Exception&) {
    Fail(n, field, "expected an integer, got '" + n.Scalar() + "'");
  }
}

double AsDouble(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) Fail(n, field, "expected a number");
  try {
    const double v = n.as<double>();
    if (!std::isfinite(v)) Fail(n, field, "expected a finite number");
    return v;
  } catch (const YAML::Exception&) {
    Fail(n, field, "expected a number, got '" + n.Scalar() + "'");
  }
}

std::string AsString(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) Fail(n, field, "expected a string");
  return n.Scalar();
}

// Optional scalar fields: only assigned when present.
void OptInt(const YAML::Node& map, std::string_view key, const std::string& parent, int64_t* out) {
  if (YAML::Node n = map[std::string(key)]) *out = AsInt(n, Join(parent, key));
}
void OptInt(const YAML::Node& map, std::string_view key, const std::string& parent, int* out) {
  if (YAML::Node n = map[std::string(key)]) {
    const int64_t v = AsInt(n, Join(parent, key));
    if (v < INT32_MIN || v > INT32_MAX) Fail(n, Join(parent, key), "out of range");
    *out = static_cast<int>(v);
  }
}
void OptDouble(const YAML::Node& map, std::string_view key, const std::string& parent,
               double* out) {
  if (YAML::Node n = map[std::string(key)]) *out = AsDouble(n, Join(parent, key));
}

workload::LengthComponent Component(const YAML::Node& n, const std::string& field,
                                    bool allow_weight) {
  workload::LengthComponent c;
  if (n.IsScalar()) {
    c.min = c.max = AsInt(n, field);
    c.mean = static_cast<double>(c.min);
    return c;
  }
  if (allow_weight) {
    CheckKeys(n, field, {"weight", "value", "min", "max", "mean", "std_dev"});
    OptDouble(n, "weight", field, &c.weight);
  } else {
    CheckKeys(n, field, {"min", "max", "mean", "std_dev"});
  }
  if (YAML::Node v = n["value"]) {
    if (n["min"] || n["max"] || n["mean"] || n["std_dev"]) {
      Fail(v, Join(field, "value"), "use either value or min/max/mean/std_dev");
    }
    c.min = c.max = AsInt(v, Join(field, "value"));
    c.mean = static_cast<double>(c.min);
    return c;
  }
  if (!n["mean"]) Fail(n, Join(field, "mean"), "required");
  OptDouble(n, "mean", field, &c.mean);
  c.min = 1;
  c.max = int64_t{1} << 30;
  OptInt(n, "min", field, &c.min);
  OptInt(n, "max", field, &c.max);
  OptDouble(n, "std_dev", field, &c.std_dev);
  return c;
}

workload::LengthDist Dist(const YAML::Node& n, const std::string& field, int64_t min_allowed) {
  workload::LengthDist d;
  if (n.IsMap() && n["mixture"]) {
    CheckKeys(n, field, {"mixture"});
    const YAML::Node list = n["mixture"];
    if (!list.IsSequence() || list.size() == 0) {
      Fail(list, Join(field, "mixture"), "expected a non-empty list");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      d.components.push_back(
          Component(list[i], Join(field, "mixture") + "[" + std::to_string(i) + "]", true));
    }
  } else {
    d.components.push_back(Component(n, field, false));
  }
  const std::string err = d.Validate(min_allowed);
  if (!err.empty()) Fail(n, field, err);
  return d;
}

std::string ReadFile(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = f.good();
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void ParseWorkload(const YAML::Node& n, std::string_view base_dir, workload::WorkloadSpec* w) {
  const std::string f = "workload";
  CheckKeys(n, f,
            {"type", "endpoint", "num_groups", "num_prompts_per_group", "system_prompt_len",
             "question_len", "output_len", "max_turns", "think_time_s", "input_len", "path",
             "time_scale", "prefix_len"});
  if (!n["type"]) Fail(n, "workload.type", "required");
  const std::string type = AsString(n["type"], "workload.type");
  if (type == "shared-prefix" || type == "shared_prefix") {
    w->kind = workload::WorkloadKind::kSharedPrefix;
  } else if (type == "multi-turn" || type == "multi_turn") {
    w->kind = workload::WorkloadKind::kMultiTurn;
  } else if (type == "random") {
    w->kind = workload::WorkloadKind::kRandom;
  } else if (type == "trace") {
    w->kind = workload::WorkloadKind::kTrace;
  } else {
    Fail(n["type"], "workload.type",
         "unknown type '" + type + "' (shared-prefix, multi-turn, random, trace)");
  }
  if (YAML::Node e = n["endpoint"]) {
    const std::string ep = AsString(e, "workload.endpoint");
    if (ep == "completions") {
      w->endpoint = api::Endpoint::kCompletions;
    } else if (ep == "chat" || ep == "chat-completions") {
      w->endpoint = api::Endpoint::kChatCompletions;
    } else {
      Fail(e, "workload.endpoint", "expected completions or chat");
    }
  }
  OptInt(n, "num_groups", f, &w->num_groups);
  OptInt(n, "num_prompts_per_group", f, &w->num_prompts_per_group);
  if (YAML::Node x = n["system_prompt_len"])
    w->system_prompt_len = Dist(x, "workload.system_prompt_len", 0);
  if (YAML::Node x = n["question_len"]) w->question_len = Dist(x, "workload.question_len", 1);
  if (YAML::Node x = n["output_len"]) w->output_len = Dist(x, "workload.output_len", 1);
  if (YAML::Node x = n["input_len"]) w->input_len = Dist(x, "workload.input_len", 1);
  int64_t max_turns = w->max_turns;
  OptInt(n, "max_turns", f, &max_turns);
  w->max_turns = static_cast<int32_t>(std::clamp<int64_t>(max_turns, -1, 1 << 20));
  OptDouble(n, "think_time_s", f, &w->think_time_s);
  OptDouble(n, "time_scale", f, &w->time_scale);
  OptInt(n, "prefix_len", f, &w->prefix_len);
  if (w->kind == workload::WorkloadKind::kTrace) {
    if (!n["path"]) Fail(n, "workload.path", "required for a trace workload");
    std::filesystem::path p = AsString(n["path"], "workload.path");
    if (p.is_relative()) p = std::filesystem::path(std::string(base_dir)) / p;
    bool ok = false;
    const std::string text = ReadFile(p.string(), &ok);
    if (!ok) Fail(n["path"], "workload.path", "cannot read " + p.string());
    workload::TraceParseResult t = workload::ParseTraceCsv(text, p.string());
    if (!t.ok()) Fail(n["path"], "workload.path", t.error);
    w->trace = std::make_shared<std::vector<workload::TraceRow>>(std::move(t.rows));
  }
  const std::string err = w->Validate();
  if (!err.empty()) {
    const std::string key = err.substr(0, err.find(':'));
    Fail(n[key] ? n[key] : n, "workload." + key, err.substr(err.find(':') + 2));
  }
}

void ParseArrivals(const YAML::Node& n, workload::ArrivalSpec* a, bool trace) {
  const std::string f = "arrivals";
  CheckKeys(
      n, f,
      {"process", "burstiness", "rate", "stages", "num_requests", "duration_s", "max_concurrency"});
  if (YAML::Node p = n["process"]) {
    const std::string kind = AsString(p, "arrivals.process");
    if (kind == "poisson") {
      a->kind = workload::ArrivalKind::kPoisson;
    } else if (kind == "gamma") {
      a->kind = workload::ArrivalKind::kGamma;
    } else if (kind == "constant") {
      a->kind = workload::ArrivalKind::kConstant;
    } else {
      Fail(p, "arrivals.process", "expected poisson, gamma or constant");
    }
  }
  OptDouble(n, "burstiness", f, &a->burstiness);
  if (n["burstiness"] && !n["process"]) a->kind = workload::ArrivalKind::kGamma;
  OptInt(n, "num_requests", f, &a->num_requests);
  OptDouble(n, "duration_s", f, &a->duration_s);
  OptInt(n, "max_concurrency", f, &a->max_concurrency);
  if (n["rate"] && n["stages"]) Fail(n["stages"], "arrivals.stages", "use either rate or stages");
  if (YAML::Node r = n["rate"]) a->stages = {{AsDouble(r, "arrivals.rate")}};
  if (YAML::Node s = n["stages"]) {
    if (!s.IsSequence() || s.size() == 0) Fail(s, "arrivals.stages", "expected a non-empty list");
    a->stages.clear();
    for (size_t i = 0; i < s.size(); ++i) {
      const std::string sf = "arrivals.stages[" + std::to_string(i) + "]";
      CheckKeys(s[i], sf, {"rate", "duration_s"});
      if (!s[i]["rate"]) Fail(s[i], sf + ".rate", "required");
      workload::RateStage st;
      st.rate = AsDouble(s[i]["rate"], sf + ".rate");
      OptDouble(s[i], "duration_s", sf, &st.duration_s);
      a->stages.push_back(st);
    }
  }
  if (trace) {
    // Trace arrivals come from the trace; only the count and duration limits apply.
    if (a->stages.empty()) a->stages = {{1.0}};
    if (a->num_requests < 0) Fail(n["num_requests"], "arrivals.num_requests", "must be >= 0");
    if (a->duration_s < 0) Fail(n["duration_s"], "arrivals.duration_s", "must be >= 0");
    return;
  }
  const std::string err = a->Validate();
  if (!err.empty()) Fail(n, "arrivals", err);
}

void ParseFleet(const YAML::Node& n, FleetSpec* fl) {
  const std::string f = "fleet";
  CheckKeys(n, f,
            {"replicas", "engine_preset", "kv_blocks", "max_num_seqs", "max_num_batched_tokens",
             "max_model_len", "scrape_interval_s", "network_delay_s"});
  OptInt(n, "replicas", f, &fl->replicas);
  if (YAML::Node p = n["engine_preset"]) {
    fl->engine_preset = AsString(p, "fleet.engine_preset");
    if (!engine::PresetConfig(fl->engine_preset)) {
      std::string names;
      for (const std::string& s : engine::PresetNames()) names += (names.empty() ? "" : ", ") + s;
      Fail(p, "fleet.engine_preset", "unknown preset '" + fl->engine_preset + "' (" + names + ")");
    }
  }
  OptInt(n, "kv_blocks", f, &fl->kv_blocks);
  OptInt(n, "max_num_seqs", f, &fl->max_num_seqs);
  OptInt(n, "max_num_batched_tokens", f, &fl->max_num_batched_tokens);
  OptInt(n, "max_model_len", f, &fl->max_model_len);
  OptDouble(n, "scrape_interval_s", f, &fl->scrape_interval_s);
  OptDouble(n, "network_delay_s", f, &fl->network_delay_s);
  if (fl->replicas < 1) Fail(n["replicas"], "fleet.replicas", "must be >= 1");
  if (fl->kv_blocks != 0 && fl->kv_blocks < 2)
    Fail(n["kv_blocks"], "fleet.kv_blocks", "must be >= 2");
  if (fl->max_num_seqs < 0) Fail(n["max_num_seqs"], "fleet.max_num_seqs", "must be >= 1");
  if (fl->max_num_batched_tokens < 0) {
    Fail(n["max_num_batched_tokens"], "fleet.max_num_batched_tokens", "must be >= 1");
  }
  if (!(fl->scrape_interval_s > 0))
    Fail(n["scrape_interval_s"], "fleet.scrape_interval_s", "must be > 0");
  if (!(fl->network_delay_s >= 0))
    Fail(n["network_delay_s"], "fleet.network_delay_s", "must be >= 0");
}

Scenario Parse(const YAML::Node& root, std::string_view base_dir) {
  CheckKeys(root, "",
            {"name", "description", "seed", "workload", "arrivals", "fleet", "slo", "policies",
             "sweep"});
  Scenario s;
  if (YAML::Node n = root["name"]) s.name = AsString(n, "name");
  if (YAML::Node n = root["seed"]) s.seed = static_cast<uint64_t>(AsInt(n, "seed"));
  if (!root["workload"]) Fail(root, "workload", "required");
  ParseWorkload(root["workload"], base_dir, &s.workload);
  const bool trace = s.workload.kind == workload::WorkloadKind::kTrace;
  if (!root["arrivals"] && !trace) Fail(root, "arrivals", "required");
  if (root["arrivals"]) {
    ParseArrivals(root["arrivals"], &s.arrivals, trace);
  } else {
    s.arrivals.stages = {{1.0}};
  }
  if (YAML::Node n = root["fleet"]) ParseFleet(n, &s.fleet);
  if (YAML::Node n = root["slo"]) {
    CheckKeys(n, "slo", {"ttft_s", "tpot_s", "e2e_s"});
    OptDouble(n, "ttft_s", "slo", &s.slo.ttft_s);
    OptDouble(n, "tpot_s", "slo", &s.slo.tpot_s);
    OptDouble(n, "e2e_s", "slo", &s.slo.e2e_s);
  }
  if (YAML::Node n = root["policies"]) {
    if (!n.IsSequence()) Fail(n, "policies", "expected a list of policy names");
    for (size_t i = 0; i < n.size(); ++i) {
      s.policies.push_back(AsString(n[i], "policies[" + std::to_string(i) + "]"));
    }
  }
  if (YAML::Node n = root["sweep"]) {
    CheckKeys(n, "sweep", {"rates", "ttft_p99_bound_s"});
    if (YAML::Node r = n["rates"]) {
      if (!r.IsSequence() || r.size() == 0) Fail(r, "sweep.rates", "expected a non-empty list");
      for (size_t i = 0; i < r.size(); ++i) {
        const std::string f = "sweep.rates[" + std::to_string(i) + "]";
        const double v = AsDouble(r[i], f);
        if (!(v > 0)) Fail(r[i], f, "must be > 0");
        if (!s.sweep_rates.empty() && v <= s.sweep_rates.back()) Fail(r[i], f, "rates must ascend");
        s.sweep_rates.push_back(v);
      }
    }
    OptDouble(n, "ttft_p99_bound_s", "sweep", &s.sweep_ttft_p99_bound_s);
    if (s.sweep_ttft_p99_bound_s < 0) {
      Fail(n["ttft_p99_bound_s"], "sweep.ttft_p99_bound_s", "must be >= 0");
    }
  }
  return s;
}

}  // namespace

engine::EngineConfig FleetSpec::EngineConfigFor() const {
  engine::EngineConfig c = *engine::PresetConfig(engine_preset);
  if (kv_blocks > 0) c.num_gpu_blocks = kv_blocks;
  if (max_num_seqs > 0) c.max_num_seqs = max_num_seqs;
  if (max_num_batched_tokens > 0) c.max_num_batched_tokens = max_num_batched_tokens;
  if (max_model_len > 0) c.max_model_len = max_model_len;
  // Requests run to max_tokens (clients send ignore_eos), so outputs match the workload.
  c.fixed_output_tokens = 0;
  c.mean_output_tokens = 0.0;
  return c;
}

ScenarioLoad ParseScenario(std::string_view yaml, std::string_view source_name,
                           std::string_view base_dir) {
  ScenarioLoad out;
  const std::string src(source_name);
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    if (!root.IsMap()) {
      out.error = src + ":1: expected a mapping at the top level";
      return out;
    }
    out.scenario = Parse(root, base_dir);
    out.scenario->source = src;
    if (out.scenario->name.empty()) {
      out.scenario->name = std::filesystem::path(src).stem().string();
    }
  } catch (const ScenarioError& e) {
    out.error = src + ":" + std::to_string(e.line) + ": " + e.field + ": " + e.message;
  } catch (const YAML::Exception& e) {
    out.error = src + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg;
  }
  return out;
}

ScenarioLoad LoadScenarioFile(const std::string& path) {
  bool ok = false;
  const std::string text = ReadFile(path, &ok);
  if (!ok) {
    ScenarioLoad out;
    out.error = path + ": cannot read file";
    return out;
  }
  return ParseScenario(text, path, std::filesystem::path(path).parent_path().string());
}

}  // namespace kvroute::simulate
