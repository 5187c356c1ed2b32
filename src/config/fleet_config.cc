#include "config/fleet_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvroute::config {

namespace {

template <typename T>
void Set(const std::optional<T>& v, T& field) {
  if (v) field = *v;
}

constexpr int64_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

constexpr std::string_view kSectionKeys[] = {"name",
                                             "host",
                                             "port",
                                             "preset",
                                             "model",
                                             "kv_blocks",
                                             "block_size",
                                             "max_num_seqs",
                                             "max_batched_tokens",
                                             "max_model_len",
                                             "fixed_output_tokens",
                                             "mean_output_tokens",
                                             "default_max_tokens",
                                             "time_scale",
                                             "latency_ms",
                                             "old_metric_names",
                                             "enable_prefix_caching",
                                             "priority_scheduling",
                                             "enable_prompt_tokens_details",
                                             "hash_seed",
                                             "output_seed",
                                             "max_body_bytes",
                                             "step",
                                             "labels",
                                             "faults",
                                             "kv_events_port",
                                             "kv_events_replay_port",
                                             "kv_events_format",
                                             "kv_events_hash",
                                             "kv_events_topic",
                                             "kv_events_connect",
                                             "kv_lease",
                                             "kv_bytes_per_token",
                                             "kv_transfer_bandwidth",
                                             "kv_min_pull_tokens",
                                             "kv_load_failure_policy",
                                             "kv_engine_id",
                                             "enable_lora",
                                             "max_loras",
                                             "max_cpu_loras",
                                             "lora_load_s",
                                             "lora_modules"};

// Reads one `defaults:` or `replicas[i]` section, key by key in file order.
ReplicaOverrides ReadSection(const ConfigNode& section) {
  ReplicaOverrides o;
  auto integer = [](const ConfigNode& v) { return static_cast<int>(v.Int(kIntMin, kIntMax)); };
  // clang-format off
  section.ForEachKey(kSectionKeys, [&](const std::string& key, const ConfigNode& v) {
    if (key == "name") {
      o.name = v.String();
      if (o.name->empty()) v.Fail("must not be empty");
    } else if (key == "host") o.host = v.String();
    else if (key == "port") o.port = static_cast<int>(v.Int(0, 65535));
    else if (key == "preset") o.preset = v.String();
    else if (key == "model") o.model = v.String();
    else if (key == "kv_blocks") o.kv_blocks = integer(v);
    else if (key == "block_size") o.block_size = integer(v);
    else if (key == "max_num_seqs") o.max_num_seqs = integer(v);
    else if (key == "max_batched_tokens") o.max_batched_tokens = integer(v);
    else if (key == "max_model_len") o.max_model_len = integer(v);
    else if (key == "fixed_output_tokens") o.fixed_output_tokens = integer(v);
    else if (key == "mean_output_tokens") o.mean_output_tokens = v.Number();
    else if (key == "default_max_tokens") o.default_max_tokens = integer(v);
    else if (key == "time_scale") o.time_scale = v.Number();
    else if (key == "latency_ms") o.latency_ms = v.Number();
    else if (key == "old_metric_names") o.old_metric_names = v.Bool();
    else if (key == "enable_prefix_caching") o.enable_prefix_caching = v.Bool();
    else if (key == "priority_scheduling") o.priority_scheduling = v.Bool();
    else if (key == "enable_prompt_tokens_details") o.enable_prompt_tokens_details = v.Bool();
    else if (key == "hash_seed") o.hash_seed = v.Uint();
    else if (key == "output_seed") o.output_seed = v.Uint();
    else if (key == "max_body_bytes") o.max_body_bytes = v.ByteSize();
    else if (key == "kv_events_port") o.kv_events_port = static_cast<int>(v.Int(0, 65535));
    else if (key == "kv_events_replay_port") o.kv_events_replay_port = static_cast<int>(v.Int(0, 65535));
    else if (key == "kv_events_format") {
      o.kv_events_format = v.String();
      if (*o.kv_events_format != "array" && *o.kv_events_format != "map") v.Fail("must be array or map");
    } else if (key == "kv_events_hash") {
      o.kv_events_hash = v.String();
      if (*o.kv_events_hash != "int" && *o.kv_events_hash != "bytes") v.Fail("must be int or bytes");
    } else if (key == "kv_events_topic") o.kv_events_topic = v.String();
    else if (key == "kv_events_connect") {
      o.kv_events_connect = v.String();
      if (o.kv_events_connect->rfind("tcp://", 0) != 0) v.Fail("must be a tcp://HOST:PORT address");
    }
    else if (key == "kv_lease") o.kv_lease_s = v.Duration();
    else if (key == "kv_bytes_per_token") o.kv_bytes_per_token = v.ByteSize();
    else if (key == "kv_transfer_bandwidth") o.kv_transfer_bandwidth = static_cast<double>(v.ByteSize());
    else if (key == "kv_min_pull_tokens") o.kv_min_pull_tokens = static_cast<int>(v.Int(0, kIntMax));
    else if (key == "kv_load_failure_policy") {
      o.kv_load_failure_policy = v.String();
      if (*o.kv_load_failure_policy != "fail" && *o.kv_load_failure_policy != "recompute") {
        v.Fail("must be fail or recompute (got '" + *o.kv_load_failure_policy + "')");
      }
    } else if (key == "kv_engine_id") {
      o.kv_engine_id = v.String();
      if (o.kv_engine_id->empty()) v.Fail("must not be empty");
    }
    else if (key == "enable_lora") o.enable_lora = v.Bool();
    else if (key == "max_loras") o.max_loras = static_cast<int>(v.Int(1, 1024));
    else if (key == "max_cpu_loras") o.max_cpu_loras = static_cast<int>(v.Int(1, 1 << 20));
    else if (key == "lora_load_s") {
      o.lora_load_s = v.Number();
      if (!(*o.lora_load_s >= 0)) v.Fail("must be >= 0 (seconds)");
    }
    else if (key == "lora_modules") {
      o.lora_modules.emplace();
      for (const ConfigNode& m : v.Items("a list of name=path entries or {name, path} maps")) {
        if (m.IsMap()) {
          api::LoraModule& lm = o.lora_modules->emplace_back();
          m.ForEachKey({"name", "path", "base_model_name"},
                       [&](const std::string& k, const ConfigNode& f) {
                         std::string s = f.String();
                         if (s.empty()) f.Fail("must not be empty");
                         (k == "name" ? lm.name : k == "path" ? lm.path : lm.base_model_name) = s;
                       });
          if (lm.name.empty()) (void)m.Require("name");
          if (lm.path.empty()) (void)m.Require("path");
        } else {
          std::string error;
          std::optional<api::LoraModule> lm = api::ParseLoraModule(m.String(), &error);
          if (!lm) m.Fail(error);
          o.lora_modules->push_back(std::move(*lm));
        }
      }
    }
    else if (key == "step") {
      v.ForEachKey({"base_us", "per_prefill_token_us", "per_decode_seq_us",
                    "per_context_token_us"},
                   [&](const std::string& k, const ConfigNode& s) {
                     const double us = s.Number();
                     if (k == "base_us") o.step_base_us = us;
                     else if (k == "per_prefill_token_us") o.step_per_prefill_token_us = us;
                     else if (k == "per_decode_seq_us") o.step_per_decode_seq_us = us;
                     else o.step_per_context_token_us = us;
                   });
    } else if (key == "faults") {
      for (const ConfigNode& f : v.Items("a list of faults")) o.faults.push_back(ReadFaultEntry(f));
    } else {  // labels
      if (!v.IsNull() && !v.IsMap()) v.Fail("must be a mapping of label names to values");
      for (const ConfigNode& l : v.Entries()) {
        o.labels.emplace_back(l.key(), l.String());
        if (l.key() == kRoleLabel) {
          if (std::string e = CheckRoleLabel(o.labels.back().second); !e.empty()) l.Fail(e);
        }
      }
    }
  });
  // clang-format on
  return o;
}

FleetFile ReadFleet(const ConfigNode& root) {
  FleetFile file;
  root.ForEachKey({"defaults", "replicas", "base_port", "threads"},
                  [&](const std::string& key, const ConfigNode& v) {
                    if (key == "defaults") {
                      file.defaults = ReadSection(v);
                    } else if (key == "replicas") {
                      for (const ConfigNode& entry : v.Items("a list of replicas")) {
                        file.replicas.push_back(ReadSection(entry));
                      }
                    } else if (key == "base_port") {
                      file.base_port = static_cast<int>(v.Int(0, 65535));
                    } else {
                      file.threads = static_cast<int>(v.Int(0, 256));
                    }
                  });
  return file;
}

}  // namespace

fault::FaultSpec ReadFaultEntry(
    const ConfigNode& entry, std::span<const std::string_view> extra,
    const std::function<void(const std::string&, const ConfigNode&)>& on_extra) {
  if (!entry.IsMap()) entry.Fail("must be a mapping such as {kind: hang, at: 10s, duration: 2s}");
  fault::FaultSpec spec;
  std::vector<std::string> set;
  const ConfigNode kind = entry.Require("kind");
  const std::string name = kind.String();
  if (!fault::FaultKindFromName(name)) {
    const auto& names = fault::FaultKindNames();
    kind.Fail("unknown fault kind '" + name + "'" +
              Suggest(name, std::span<const std::string_view>(names.data(), names.size())));
  }
  fault::SetField(&spec, "kind", name);
  set.push_back("kind");
  std::vector<std::string_view> allowed(fault::FieldNames().begin(), fault::FieldNames().end());
  allowed.insert(allowed.end(), extra.begin(), extra.end());
  entry.ForEachKey(allowed, [&](const std::string& key, const ConfigNode& v) {
    if (key == "kind") return;
    if (std::find(extra.begin(), extra.end(), key) != extra.end()) {
      if (on_extra) on_extra(key, v);
      return;
    }
    if (auto e = fault::SetField(&spec, key, v.Scalar())) v.Fail(e->message);
    set.push_back(key);
  });
  if (auto e = fault::Validate(spec, set, /*admin=*/false)) {
    entry.Get(e->field).Fail(e->message);  // an absent field: the entry's line
  }
  return spec;
}

std::string CheckRoleLabel(std::string_view role) {
  if (role == "prefill" || role == "decode" || role == "prefill-decode") return {};
  if (role == "both") return "'both' is deprecated in llm-d; use prefill-decode";
  return "must be prefill, decode or prefill-decode (got '" + std::string(role) + "')";
}

void ReplicaOverrides::ApplyTo(ReplicaConfig& r) const {
  Set(name, r.name);
  Set(host, r.host);
  if (port) r.port = static_cast<uint16_t>(*port);
  Set(model, r.engine.model_name);
  Set(kv_blocks, r.engine.num_gpu_blocks);
  Set(block_size, r.engine.block_size);
  Set(max_num_seqs, r.engine.max_num_seqs);
  Set(max_batched_tokens, r.engine.max_num_batched_tokens);
  Set(max_model_len, r.engine.max_model_len);
  Set(fixed_output_tokens, r.engine.fixed_output_tokens);
  Set(mean_output_tokens, r.engine.mean_output_tokens);
  Set(default_max_tokens, r.default_max_tokens);
  Set(time_scale, r.time_scale);
  Set(latency_ms, r.latency_ms);
  Set(old_metric_names, r.old_metric_names);
  Set(enable_prefix_caching, r.engine.enable_prefix_caching);
  Set(priority_scheduling, r.engine.priority_scheduling);
  Set(enable_prompt_tokens_details, r.enable_prompt_tokens_details);
  Set(hash_seed, r.engine.hash_seed);
  Set(output_seed, r.engine.output_seed);
  if (max_body_bytes) r.max_body_bytes = static_cast<std::size_t>(*max_body_bytes);
  if (kv_events_port) r.kv_events.port = *kv_events_port;
  if (kv_events_replay_port) r.kv_events.replay_port = *kv_events_replay_port;
  Set(kv_events_format, r.kv_events.format);
  Set(kv_events_hash, r.kv_events.hash);
  Set(kv_events_topic, r.kv_events.topic);
  Set(kv_events_connect, r.kv_events.connect);
  Set(kv_lease_s, r.pd.lease_s);
  Set(kv_transfer_bandwidth, r.pd.transfer_bandwidth);
  if (kv_bytes_per_token) r.engine.kv_bytes_per_token = static_cast<int64_t>(*kv_bytes_per_token);
  Set(kv_min_pull_tokens, r.pd.min_pull_tokens);
  Set(kv_load_failure_policy, r.pd.load_failure_policy);
  Set(kv_engine_id, r.pd.engine_id);
  Set(enable_lora, r.engine.lora.enabled);
  Set(max_loras, r.engine.lora.max_loras);
  Set(max_cpu_loras, r.engine.lora.max_cpu_loras);
  Set(lora_load_s, r.engine.lora.load_s);
  if (lora_modules) r.lora_modules = *lora_modules;
  Set(step_base_us, r.engine.step.base_us);
  Set(step_per_prefill_token_us, r.engine.step.per_prefill_token_us);
  Set(step_per_decode_seq_us, r.engine.step.per_decode_seq_us);
  Set(step_per_context_token_us, r.engine.step.per_context_token_us);
  for (const auto& [k, v] : labels) {
    bool replaced = false;
    for (auto& [rk, rv] : r.labels) {
      if (rk == k) {
        rv = v;
        replaced = true;
      }
    }
    if (!replaced) r.labels.emplace_back(k, v);
  }
  r.faults.insert(r.faults.end(), faults.begin(), faults.end());
}

ConfigOr<FleetFile> ParseFleetYaml(std::string_view text, std::string_view source) {
  return ParseYaml<FleetFile>(text, source, ReadFleet);
}

ConfigOr<FleetFile> LoadFleetFile(const std::string& path) {
  ConfigOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return {std::nullopt, std::move(text.error)};
  return ParseFleetYaml(*text.value, path);
}

Status ValidateReplica(const ReplicaConfig& r) {
  const auto& e = r.engine;
  auto bad = [&](std::string_view what) {
    return Status::InvalidArgument(r.name + ": " + std::string(what));
  };
  if (e.block_size < 1) return bad("block_size must be >= 1");
  if (e.num_gpu_blocks < 2) return bad("kv_blocks must be >= 2");
  if (e.max_num_seqs < 1) return bad("max_num_seqs must be >= 1");
  if (e.max_num_batched_tokens < 1) return bad("max_batched_tokens must be >= 1");
  if (e.max_model_len < 2) return bad("max_model_len must be >= 2");
  if (r.time_scale < 0) return bad("time_scale must be >= 0");
  if (r.latency_ms < 0) return bad("latency_ms must be >= 0");
  if (r.default_max_tokens < 1) return bad("default_max_tokens must be >= 1");
  if (e.model_name.empty()) return bad("model must not be empty");
  const KvPublishConfig& kv = r.kv_events;
  if (kv.format != "array" && kv.format != "map") return bad("kv_events_format must be array or map");
  if (kv.hash != "int" && kv.hash != "bytes") return bad("kv_events_hash must be int or bytes");
  if (kv.port && (*kv.port < 0 || *kv.port > 65535)) return bad("kv_events_port must be 0-65535");
  if (kv.replay_port && (*kv.replay_port < 0 || *kv.replay_port > 65535)) {
    return bad("kv_events_replay_port must be 0-65535");
  }
  if (kv.replay_port && !kv.port) return bad("kv_events_replay_port needs kv_events_port");
  const PdConfig& pd = r.pd;
  if (!(pd.lease_s > 0) || !std::isfinite(pd.lease_s)) return bad("kv_lease must be > 0");
  if (!(pd.transfer_bandwidth > 0) || !std::isfinite(pd.transfer_bandwidth)) {
    return bad("kv_transfer_bandwidth must be > 0");
  }
  if (e.kv_bytes_per_token < 1) return bad("kv_bytes_per_token must be >= 1");
  if (pd.min_pull_tokens < 0) return bad("kv_min_pull_tokens must be >= 0");
  if (pd.load_failure_policy != "fail" && pd.load_failure_policy != "recompute") {
    return bad("kv_load_failure_policy must be fail or recompute");
  }
  const engine::LoraConfig& lora = e.lora;
  if (lora.max_loras < 1) return bad("max_loras must be >= 1");
  if (lora.max_cpu_loras != 0 && lora.max_cpu_loras < lora.max_loras) {
    return bad("max_cpu_loras (" + std::to_string(lora.max_cpu_loras) +
               ") must be >= max_loras (" + std::to_string(lora.max_loras) + ")");
  }
  if (!(lora.load_s >= 0) || !std::isfinite(lora.load_s)) return bad("lora_load_s must be >= 0");
  if (!r.lora_modules.empty() && !lora.enabled) return bad("lora_modules need enable_lora");
  for (std::size_t i = 0; i < r.lora_modules.size(); ++i) {
    const api::LoraModule& m = r.lora_modules[i];
    if (m.name.empty() || m.path.empty()) return bad("lora_modules: name and path must be set");
    if (m.name == e.model_name) return bad("lora_modules: '" + m.name + "' is the model's name");
    if (!m.base_model_name.empty() && m.base_model_name != e.model_name) {
      return bad("lora_modules: '" + m.name + "' has base_model_name '" + m.base_model_name +
                 "' but the replica serves '" + e.model_name + "'");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (r.lora_modules[j].name == m.name) return bad("lora_modules: '" + m.name + "' twice");
    }
  }
  for (const auto& [k, v] : r.labels) {
    if (k != kRoleLabel) continue;
    if (std::string err = CheckRoleLabel(v); !err.empty()) {
      return bad(std::string(kRoleLabel) + " " + err);
    }
  }
  return Status::Ok();
}

Status ResolveFleet(const FleetFile& file, const ReplicaOverrides& cli, int count, int base_port,
                    std::vector<ReplicaConfig>* out) {
  out->clear();
  if (count <= 0) count = std::max<int>(1, static_cast<int>(file.replicas.size()));
  for (int i = 0; i < count; ++i) {
    const ReplicaOverrides* own =
        i < static_cast<int>(file.replicas.size()) ? &file.replicas[i] : nullptr;
    std::string preset = "llama3-8b-h100";
    if (own && own->preset)
      preset = *own->preset;
    else if (cli.preset)
      preset = *cli.preset;
    else if (file.defaults.preset)
      preset = *file.defaults.preset;
    auto engine = engine::PresetConfig(preset);
    if (!engine) {
      const std::vector<std::string> names = engine::PresetNames();
      const std::vector<std::string_view> views(names.begin(), names.end());
      return Status::InvalidArgument("replica " + std::to_string(i) + ": unknown preset '" +
                                     preset + "'" + Suggest(preset, views));
    }
    ReplicaConfig r;
    r.name = "replica-" + std::to_string(i);
    r.preset = preset;
    r.engine = *engine;
    r.port = base_port == 0 ? 0 : static_cast<uint16_t>(base_port + i);
    file.defaults.ApplyTo(r);
    cli.ApplyTo(r);
    // As vLLM adds the data-parallel rank to both ports: a shared base port is P + i
    // (0 stays "any free port"); a replica's own entry is taken as written.
    if (r.kv_events.port && *r.kv_events.port > 0) *r.kv_events.port += i;
    if (r.kv_events.replay_port && *r.kv_events.replay_port > 0) *r.kv_events.replay_port += i;
    if (own) own->ApplyTo(r);
    if (Status s = ValidateReplica(r); !s.ok()) return s;
    out->push_back(std::move(r));
  }
  return Status::Ok();
}

}  // namespace kvroute::config
