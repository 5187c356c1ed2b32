#include "sim/fleet_config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace kvroute::sim {

namespace {

template <typename T>
void Set(const std::optional<T>& v, T& field) {
  if (v) field = *v;
}

// A failed field conversion, carried out of the YAML walk with its position.
struct YamlError {
  int line;
  std::string field;
  std::string problem;
};

template <typename T>
bool ReadScalar(const YAML::Node& node, const std::string& field, std::optional<T>& out,
                std::optional<YamlError>& err) {
  if (!node.IsScalar()) {
    err = YamlError{node.Mark().line + 1, field, "expected a scalar value"};
    return false;
  }
  try {
    out = node.as<T>();
    return true;
  } catch (const YAML::Exception&) {
    err = YamlError{node.Mark().line + 1, field, "invalid value '" + node.Scalar() + "'"};
    return false;
  }
}

bool ReadSection(const YAML::Node& map, const std::string& where, ReplicaOverrides& o,
                 std::optional<YamlError>& err) {
  if (!map.IsMap()) {
    err = YamlError{map.Mark().line + 1, where, "expected a mapping"};
    return false;
  }
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    const std::string field = where + "." + key;
    bool ok = true;
    if (key == "name") ok = ReadScalar(v, field, o.name, err);
    else if (key == "host") ok = ReadScalar(v, field, o.host, err);
    else if (key == "port") ok = ReadScalar(v, field, o.port, err);
    else if (key == "preset") ok = ReadScalar(v, field, o.preset, err);
    else if (key == "model") ok = ReadScalar(v, field, o.model, err);
    else if (key == "kv_blocks") ok = ReadScalar(v, field, o.kv_blocks, err);
    else if (key == "block_size") ok = ReadScalar(v, field, o.block_size, err);
    else if (key == "max_num_seqs") ok = ReadScalar(v, field, o.max_num_seqs, err);
    else if (key == "max_batched_tokens") ok = ReadScalar(v, field, o.max_batched_tokens, err);
    else if (key == "max_model_len") ok = ReadScalar(v, field, o.max_model_len, err);
    else if (key == "fixed_output_tokens") ok = ReadScalar(v, field, o.fixed_output_tokens, err);
    else if (key == "mean_output_tokens") ok = ReadScalar(v, field, o.mean_output_tokens, err);
    else if (key == "default_max_tokens") ok = ReadScalar(v, field, o.default_max_tokens, err);
    else if (key == "time_scale") ok = ReadScalar(v, field, o.time_scale, err);
    else if (key == "latency_ms") ok = ReadScalar(v, field, o.latency_ms, err);
    else if (key == "old_metric_names") ok = ReadScalar(v, field, o.old_metric_names, err);
    else if (key == "enable_prefix_caching") ok = ReadScalar(v, field, o.enable_prefix_caching, err);
    else if (key == "priority_scheduling") ok = ReadScalar(v, field, o.priority_scheduling, err);
    else if (key == "hash_seed") ok = ReadScalar(v, field, o.hash_seed, err);
    else if (key == "output_seed") ok = ReadScalar(v, field, o.output_seed, err);
    else if (key == "max_body_bytes") ok = ReadScalar(v, field, o.max_body_bytes, err);
    else if (key == "step") {
      if (!v.IsMap()) {
        err = YamlError{v.Mark().line + 1, field, "expected a mapping"};
        return false;
      }
      for (const auto& s : v) {
        const std::string k = s.first.as<std::string>();
        const std::string f = field + "." + k;
        if (k == "base_us") ok = ReadScalar(s.second, f, o.step_base_us, err);
        else if (k == "per_prefill_token_us") ok = ReadScalar(s.second, f, o.step_per_prefill_token_us, err);
        else if (k == "per_decode_seq_us") ok = ReadScalar(s.second, f, o.step_per_decode_seq_us, err);
        else if (k == "per_context_token_us") ok = ReadScalar(s.second, f, o.step_per_context_token_us, err);
        else {
          err = YamlError{s.first.Mark().line + 1, f, "unknown key"};
          return false;
        }
        if (!ok) return false;
      }
    } else if (key == "labels") {
      if (!v.IsMap()) {
        err = YamlError{v.Mark().line + 1, field, "expected a mapping of label names to values"};
        return false;
      }
      for (const auto& l : v) {
        if (!l.second.IsScalar()) {
          err = YamlError{l.second.Mark().line + 1, field + "." + l.first.as<std::string>(),
                          "expected a scalar value"};
          return false;
        }
        o.labels.emplace_back(l.first.as<std::string>(), l.second.Scalar());
      }
    } else {
      err = YamlError{kv.first.Mark().line + 1, field, "unknown key"};
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

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
  Set(hash_seed, r.engine.hash_seed);
  Set(output_seed, r.engine.output_seed);
  if (max_body_bytes) r.max_body_bytes = static_cast<std::size_t>(*max_body_bytes);
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
}

std::optional<FleetFile> ParseFleetYaml(const std::string& text, const std::string& source,
                                        std::string* error) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    *error = source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg;
    return std::nullopt;
  }
  FleetFile file;
  std::optional<YamlError> err;
  auto fail = [&]() -> std::optional<FleetFile> {
    *error = source + ":" + std::to_string(err->line) + ": " + err->field + ": " + err->problem;
    return std::nullopt;
  };
  if (root.IsNull()) return file;
  if (!root.IsMap()) {
    err = YamlError{root.Mark().line + 1, "(top level)", "expected a mapping"};
    return fail();
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key == "defaults") {
      if (!ReadSection(kv.second, "defaults", file.defaults, err)) return fail();
    } else if (key == "replicas") {
      if (!kv.second.IsSequence()) {
        err = YamlError{kv.second.Mark().line + 1, "replicas", "expected a list"};
        return fail();
      }
      int i = 0;
      for (const auto& entry : kv.second) {
        ReplicaOverrides o;
        if (!ReadSection(entry, "replicas[" + std::to_string(i++) + "]", o, err)) return fail();
        file.replicas.push_back(std::move(o));
      }
    } else if (key == "base_port") {
      if (!ReadScalar(kv.second, key, file.base_port, err)) return fail();
    } else if (key == "threads") {
      if (!ReadScalar(kv.second, key, file.threads, err)) return fail();
    } else {
      err = YamlError{kv.first.Mark().line + 1, key, "unknown key"};
      return fail();
    }
  }
  return file;
}

std::optional<FleetFile> LoadFleetFile(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open";
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseFleetYaml(ss.str(), path, error);
}

std::string ValidateReplica(const ReplicaConfig& r) {
  const auto& e = r.engine;
  std::string who = r.name + ": ";
  if (e.block_size < 1) return who + "block_size must be >= 1";
  if (e.num_gpu_blocks < 2) return who + "kv_blocks must be >= 2";
  if (e.max_num_seqs < 1) return who + "max_num_seqs must be >= 1";
  if (e.max_num_batched_tokens < 1) return who + "max_batched_tokens must be >= 1";
  if (e.max_model_len < 2) return who + "max_model_len must be >= 2";
  if (r.time_scale < 0) return who + "time_scale must be >= 0";
  if (r.latency_ms < 0) return who + "latency_ms must be >= 0";
  if (r.default_max_tokens < 1) return who + "default_max_tokens must be >= 1";
  if (e.model_name.empty()) return who + "model must not be empty";
  return {};
}

std::string ResolveFleet(const FleetFile& file, const ReplicaOverrides& cli, int count,
                         int base_port, std::vector<ReplicaConfig>* out) {
  out->clear();
  if (count <= 0) count = std::max<int>(1, static_cast<int>(file.replicas.size()));
  for (int i = 0; i < count; ++i) {
    const ReplicaOverrides* own =
        i < static_cast<int>(file.replicas.size()) ? &file.replicas[i] : nullptr;
    std::string preset = "llama3-8b-h100";
    if (own && own->preset) preset = *own->preset;
    else if (cli.preset) preset = *cli.preset;
    else if (file.defaults.preset) preset = *file.defaults.preset;
    auto engine = engine::PresetConfig(preset);
    if (!engine) {
      std::string names;
      for (const auto& n : engine::PresetNames()) names += (names.empty() ? "" : ", ") + n;
      return "replica " + std::to_string(i) + ": unknown preset '" + preset +
             "' (known: " + names + ")";
    }
    ReplicaConfig r;
    r.name = "replica-" + std::to_string(i);
    r.preset = preset;
    r.engine = *engine;
    r.port = base_port == 0 ? 0 : static_cast<uint16_t>(base_port + i);
    file.defaults.ApplyTo(r);
    cli.ApplyTo(r);
    if (own) own->ApplyTo(r);
    if (std::string e = ValidateReplica(r); !e.empty()) return e;
    out->push_back(std::move(r));
  }
  return {};
}

}  // namespace kvroute::sim
