#include "config/suite_config.h"

#include <filesystem>

namespace kvroute::config {

namespace {

std::string Resolve(std::string_view base_dir, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.is_absolute() || base_dir.empty()) return p.lexically_normal().string();
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

std::vector<std::string> StringList(const ConfigNode& n) {
  std::vector<std::string> out;
  for (const ConfigNode& item : n.Items("a list of strings")) {
    std::string s = item.String();
    if (s.empty()) item.Fail("must not be empty");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

ConfigOr<SuiteSpec> ParseSuite(std::string_view yaml, std::string_view source, std::string_view base_dir) {
  return ParseYaml<SuiteSpec>(yaml, source, [&](const ConfigNode& root) {
    SuiteSpec s;
    s.source = std::string(source);
    s.name = std::filesystem::path(std::string(source)).stem().string();
    root.ForEachKey({"name", "scenarios", "generate", "policies", "reference"},
                    [&](const std::string& key, const ConfigNode& v) {
                      if (key == "name") {
                        s.name = v.String();
                      } else if (key == "scenarios") {
                        for (const std::string& p : StringList(v)) s.scenarios.push_back(Resolve(base_dir, p));
                      } else if (key == "policies") {
                        s.policies = StringList(v);
                      } else if (key == "reference") {
                        s.reference = v.String();
                      } else {
                        suite::GeneratorOptions g;
                        v.ForEachKey({"count", "seed", "traces", "min_requests", "max_requests"},
                                     [&](const std::string& k, const ConfigNode& gv) {
                                       if (k == "count") {
                                         g.count = static_cast<int>(gv.Int(1, 10000));
                                       } else if (k == "seed") {
                                         g.seed = static_cast<uint64_t>(gv.Int(0, int64_t{1} << 53));
                                       } else if (k == "traces") {
                                         for (const std::string& p : StringList(gv)) g.traces.push_back(Resolve(base_dir, p));
                                       } else if (k == "min_requests") {
                                         g.min_requests = gv.Int(1, int64_t{1} << 30);
                                       } else {
                                         g.max_requests = gv.Int(1, int64_t{1} << 30);
                                       }
                                     });
                        if (g.max_requests < g.min_requests) v.Fail("max_requests must be >= min_requests");
                        s.generate = g;
                      }
                    });
    if (s.scenarios.empty() && !s.generate) root.Fail("a suite needs scenarios, generate or both");
    return s;
  });
}

ConfigOr<SuiteSpec> LoadSuiteFile(const std::string& path) {
  ConfigOr<std::string> text = ReadConfigFile(path);
  if (!text.ok()) return {std::nullopt, text.error};
  return ParseSuite(*text.value, path, std::filesystem::path(path).parent_path().string());
}

}  // namespace kvroute::config
