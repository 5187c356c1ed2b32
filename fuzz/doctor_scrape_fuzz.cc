// Fuzz target: a /metrics body as `kvroute doctor` could read it from any endpoint (a
// replica, a proxy's error page, a hostile server), through ParseScrape, then Diagnose
// and every rendering over two-scrape histories of it.
//
// Invariants checked (beyond "no crash, no sanitizer report"):
//   - every known figure is finite; KV usage and hit rates are in [0, 1]; counts and rates
//     are non-negative;
//   - ReportJson is valid JSON (simdjson parses it) with the schema tag;
//   - WatchView's lines fit the width it was given;
//   - ScenarioYaml gives text or an error, never both, never neither.
#include <simdjson.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "apps/doctor/diagnosis/doctor.h"

namespace {

using namespace kvroute::doctor;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

void CheckFraction(const std::optional<double>& v, const char* what) {
  if (v) Check(std::isfinite(*v) && *v >= 0 && *v <= 1, what);
}
void CheckNonNegative(const std::optional<double>& v, const char* what) {
  if (v) Check(std::isfinite(*v) && *v >= 0, what);
}

void CheckScrape(const Scrape& s) {
  CheckFraction(s.kv_usage, "scrape kv_usage in [0, 1]");
  CheckFraction(s.hit_rate_gauge, "scrape hit_rate_gauge in [0, 1]");
  for (const auto* v : {&s.running, &s.waiting, &s.prefix_queries, &s.prefix_hits, &s.preemptions,
                        &s.prompt_tokens, &s.generation_tokens, &s.requests_finished}) {
    CheckNonNegative(*v, "scrape count finite and >= 0");
  }
  for (const Histogram* h : {&s.ttft, &s.prompt_len, &s.output_len}) {
    if (h->empty()) continue;
    Check(h->upper.size() == h->cumulative.size(), "histogram bounds and counts agree");
    Check(std::isinf(h->upper.back()), "histogram ends with +Inf");
    for (size_t i = 1; i < h->upper.size(); ++i) {
      Check(h->upper[i] > h->upper[i - 1], "histogram bounds ascending");
      Check(h->cumulative[i] >= h->cumulative[i - 1], "histogram cumulative");
    }
  }
  if (!s.any_engine_series) Check(!s.running && !s.kv_usage, "no engine series, no figures");
}

void CheckReport(const Report& r) {
  for (const ReplicaFigures& x : r.replicas) {
    CheckFraction(x.kv_now, "kv_now in [0, 1]");
    CheckFraction(x.kv_mean, "kv_mean in [0, 1]");
    CheckFraction(x.kv_max, "kv_max in [0, 1]");
    CheckFraction(x.hit_rate, "hit_rate in [0, 1]");
    for (const auto* v :
         {&x.running, &x.waiting, &x.waiting_mean, &x.queried_tokens, &x.preemptions_per_s,
          &x.tokens_per_s, &x.requests_per_s, &x.ttft_s.p50, &x.ttft_s.p99}) {
      CheckNonNegative(*v, "replica figure finite and >= 0");
    }
  }
  CheckFraction(r.fleet.hit_rate, "fleet hit_rate in [0, 1]");
  CheckFraction(r.fleet.kv_spread, "fleet kv_spread in [0, 1]");
  Check(r.ExitCode() >= 0 && r.ExitCode() <= 2, "exit code 0..2");

  const std::string json = ReportJson(r);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  Check(parser.parse(json).get(doc) == simdjson::SUCCESS, "ReportJson is valid JSON");
  std::string_view schema;
  Check(doc["schema"].get(schema) == simdjson::SUCCESS && schema == "kvroute-doctor/1",
        "ReportJson carries the schema");

  Check(!ReportText(r).empty(), "ReportText says something");
  for (int width : {20, 80}) {
    const std::string v = WatchView(r, width);
    size_t start = 0;
    while (start < v.size()) {
      size_t end = v.find('\n', start);
      if (end == std::string::npos) end = v.size();
      Check(end - start <= static_cast<size_t>(width), "WatchView fits its width");
      start = end + 1;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const Scrape whole = ParseScrape(body, 10);
  CheckScrape(whole);
  // A second body: the first half, as an earlier (or truncated) scrape of the same server.
  const Scrape half = ParseScrape(body.substr(0, size / 2), 0);
  CheckScrape(half);

  std::vector<ReplicaHistory> hs = {
      {"same", "a:1", {ParseScrape(body, 0), whole}},
      {"grew", "b:1", {half, whole}},
      {"shrank", "c:1", {whole, ParseScrape(body.substr(0, size / 2), 20)}},
      {"down", "d:1", {whole, FailedScrape(std::string(body.substr(0, 64)), 20)}},
  };
  const Report r = Diagnose(hs, DoctorOptions{});
  CheckReport(r);
  std::string error;
  const std::string yaml = ScenarioYaml(r, hs, &error);
  Check(yaml.empty() != error.empty(), "ScenarioYaml: text or an error");
  // One scrape each: the lifetime path.
  const std::vector<ReplicaHistory> one = {{"one", "e:1", {whole}}};
  CheckReport(Diagnose(one, DoctorOptions{}));
  return 0;
}
