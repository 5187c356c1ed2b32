#include "apps/bench/output.h"

#include <filesystem>
#include <fstream>

namespace kvroute::bench {
namespace {

bool WriteFile(const std::filesystem::path& path, const std::string& text, std::string* error) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (f) f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) {
    *error = "cannot write " + path.string();
    return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> WriteReportFiles(const std::string& dir, const report::ReportMeta& meta,
                                          std::span<const report::PolicyReport> policies,
                                          std::string* error) {
  std::vector<std::string> written;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *error = "cannot create " + dir + ": " + ec.message();
    return written;
  }
  const std::filesystem::path base(dir);
  const std::pair<const char*, std::string> files[] = {
      {"report.json", report::ReportJson(meta, policies)},
      {"report.md", report::ReportMarkdown(meta, policies)},
      {"ttft_cdf.svg", report::TtftCdfSvg(policies)},
      {"kv_usage.svg", report::KvUsageSvg(policies)},
  };
  for (const auto& [name, text] : files) {
    if (!WriteFile(base / name, text, error)) return written;
    written.push_back((base / name).string());
  }
  return written;
}

void AddRunInfo(const BenchResult& result, const std::string& prefix, report::ReportMeta* meta) {
  auto add = [&](const std::string& key, std::string value) {
    meta->info.emplace_back(prefix + key, std::move(value));
  };
  add("model", result.model);
  add("requests_not_sent", std::to_string(result.not_sent));
  for (const auto& [cause, n] : result.error_details) add("errors." + cause, std::to_string(n));
  int64_t ok = 0, failed = 0;
  for (const ReplicaScrape& s : result.replicas) {
    ok += s.scrapes_ok;
    failed += s.scrapes_failed;
  }
  if (!result.replicas.empty()) {
    add("replicas_scraped", std::to_string(result.replicas.size()));
    add("scrapes_ok", std::to_string(ok));
    add("scrapes_failed", std::to_string(failed));
  }
}

}  // namespace kvroute::bench
