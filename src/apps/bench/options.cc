#include "apps/bench/options.h"

#include <CLI/CLI.hpp>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>

namespace kvroute::bench {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<double> ParseDouble(std::string_view s) {
  s = Trim(s);
  if (s.empty()) return std::nullopt;
  if (s == "inf") return std::numeric_limits<double>::infinity();
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || std::isnan(v)) return std::nullopt;
  return v;
}

std::optional<int64_t> ParseInt(std::string_view s) {
  s = Trim(s);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Seconds, with an optional "ms"/"us"/"s" suffix.
std::optional<double> ParseSeconds(std::string_view s) {
  s = Trim(s);
  double scale = 1.0;
  if (s.size() > 2 && s.substr(s.size() - 2) == "ms") {
    scale = 1e-3;
    s.remove_suffix(2);
  } else if (s.size() > 2 && s.substr(s.size() - 2) == "us") {
    scale = 1e-6;
    s.remove_suffix(2);
  } else if (s.size() > 1 && s.back() == 's') {
    s.remove_suffix(1);
  }
  auto v = ParseDouble(s);
  if (!v || *v < 0 || std::isinf(*v)) return std::nullopt;
  return *v * scale;
}

template <typename F>
void ForEachItem(std::string_view list, char sep, F&& f) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(sep, start);
    if (end == std::string_view::npos) end = list.size();
    f(Trim(list.substr(start, end - start)));
    start = end + 1;
  }
}

std::optional<HostPort> ParseHostPortItem(std::string_view item, std::string_view default_host,
                                          std::string* error) {
  HostPort hp;
  std::string_view port_text = item;
  const size_t colon = item.rfind(':');
  if (colon != std::string_view::npos) {
    hp.host = std::string(item.substr(0, colon));
    port_text = item.substr(colon + 1);
  }
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  if (hp.host.empty()) hp.host = std::string(default_host);
  auto port = ParseInt(port_text);
  if (!port || *port < 1 || *port > 65535 || hp.host.empty() ||
      hp.host.find_first_of("/@ ") != std::string::npos) {
    *error = "bad host:port '" + std::string(item) + "'";
    return std::nullopt;
  }
  hp.port = static_cast<uint16_t>(*port);
  return hp;
}

// RFC 9110 token characters (a field name).
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::optional<HostPort> ParseUrl(std::string_view url, std::string* error) {
  std::string_view rest = Trim(url);
  if (rest.substr(0, 8) == "https://") {
    *error = "https is not supported: '" + std::string(url) + "'";
    return std::nullopt;
  }
  if (rest.substr(0, 7) == "http://") rest.remove_prefix(7);
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) rest = rest.substr(0, slash);
  if (rest.empty()) {
    *error = "no host in URL '" + std::string(url) + "'";
    return std::nullopt;
  }
  // A bare host (no port, or an IPv6 literal in brackets without one) means port 80.
  const size_t colon = rest.rfind(':');
  const size_t bracket = rest.rfind(']');
  if (colon == std::string_view::npos ||
      (bracket != std::string_view::npos && colon < bracket)) {
    std::string host(rest);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    return HostPort{host, 80};
  }
  auto hp = ParseHostPortItem(rest, "", error);
  if (!hp) *error = "bad URL '" + std::string(url) + "': " + *error;
  return hp;
}

std::optional<std::vector<HostPort>> ParseFleetList(std::string_view list,
                                                    std::string_view default_host,
                                                    std::string* error) {
  std::vector<HostPort> out;
  bool ok = true;
  ForEachItem(list, ',', [&](std::string_view item) {
    if (!ok || item.empty()) return;
    // A replica's URL names it as well as host:port does; its path is not used.
    if (item.substr(0, 7) == "http://") {
      item.remove_prefix(7);
      item = item.substr(0, item.find('/'));
    }
    auto hp = ParseHostPortItem(item, default_host, error);
    if (!hp) {
      ok = false;
      return;
    }
    out.push_back(std::move(*hp));
  });
  if (!ok) return std::nullopt;
  if (out.empty()) {
    *error = "empty fleet list";
    return std::nullopt;
  }
  return out;
}

std::optional<std::vector<HostPort>> ParsePortRange(std::string_view range, std::string_view host,
                                                    std::string* error) {
  const size_t dash = range.find('-');
  std::optional<int64_t> lo, hi;
  if (dash == std::string_view::npos) {
    lo = hi = ParseInt(range);
  } else {
    lo = ParseInt(range.substr(0, dash));
    hi = ParseInt(range.substr(dash + 1));
  }
  if (!lo || !hi || *lo < 1 || *hi > 65535 || *lo > *hi || *hi - *lo >= 1024) {
    *error = "bad port range '" + std::string(range) + "' (want P-Q, 1 <= P <= Q <= 65535)";
    return std::nullopt;
  }
  std::vector<HostPort> out;
  for (int64_t p = *lo; p <= *hi; ++p) out.push_back({std::string(host), static_cast<uint16_t>(p)});
  return out;
}

std::optional<report::Slo> ParseSlo(std::string_view text, std::string* error) {
  report::Slo slo;
  bool seen[3] = {false, false, false};
  bool ok = true;
  ForEachItem(text, ',', [&](std::string_view item) {
    if (!ok || item.empty()) return;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      *error = "bad SLO item '" + std::string(item) + "' (want key=seconds)";
      ok = false;
      return;
    }
    const std::string_view key = Trim(item.substr(0, eq));
    auto value = ParseSeconds(item.substr(eq + 1));
    int k = key == "ttft" ? 0 : key == "tpot" ? 1 : key == "e2e" ? 2 : -1;
    if (k < 0) {
      *error = "unknown SLO '" + std::string(key) + "' (ttft, tpot, e2e)";
      ok = false;
    } else if (!value) {
      *error = "bad SLO value '" + std::string(item) + "'";
      ok = false;
    } else if (seen[k]) {
      *error = "SLO '" + std::string(key) + "' given twice";
      ok = false;
    } else {
      seen[k] = true;
      (k == 0 ? slo.ttft_s : k == 1 ? slo.tpot_s : slo.e2e_s) = *value;
    }
  });
  if (!ok) return std::nullopt;
  return slo;
}

std::optional<workload::LengthDist> ParseLength(std::string_view text, std::string* error) {
  std::vector<std::string_view> parts;
  ForEachItem(text, ':', [&](std::string_view p) { parts.push_back(p); });
  if (parts.size() == 1) {
    auto v = ParseInt(parts[0]);
    if (!v || *v < 0) {
      *error = "bad length '" + std::string(text) + "'";
      return std::nullopt;
    }
    return workload::LengthDist::Fixed(*v);
  }
  if (parts.size() != 2 && parts.size() != 4) {
    *error = "bad length '" + std::string(text) + "' (want N or mean:std_dev[:min:max])";
    return std::nullopt;
  }
  auto mean = ParseDouble(parts[0]);
  auto sd = ParseDouble(parts[1]);
  std::optional<int64_t> lo = 1, hi;
  if (parts.size() == 4) {
    lo = ParseInt(parts[2]);
    hi = ParseInt(parts[3]);
  } else if (mean && sd) {
    hi = static_cast<int64_t>(std::ceil(*mean + 4 * *sd));
  }
  if (!mean || !sd || !lo || !hi || *mean < 0 || *sd < 0 || std::isinf(*mean) ||
      std::isinf(*sd) || *lo < 0 || *lo > *hi) {
    *error = "bad length '" + std::string(text) + "' (want N or mean:std_dev[:min:max])";
    return std::nullopt;
  }
  return workload::LengthDist::Normal(*lo, *hi, *mean, *sd);
}

std::optional<std::vector<workload::RateStage>> ParseStages(std::string_view text,
                                                            std::string* error) {
  std::vector<workload::RateStage> out;
  bool ok = true;
  ForEachItem(text, ',', [&](std::string_view item) {
    if (!ok || item.empty()) return;
    const size_t colon = item.find(':');
    auto rate = ParseDouble(item.substr(0, colon));
    std::optional<double> dur =
        colon == std::string_view::npos ? std::nullopt : ParseDouble(item.substr(colon + 1));
    if (!rate || !dur || *rate <= 0 || std::isinf(*rate) || *dur <= 0) {
      *error = "bad stage '" + std::string(item) + "' (want rate:duration_s)";
      ok = false;
      return;
    }
    out.push_back({*rate, *dur});
  });
  if (!ok) return std::nullopt;
  if (out.empty()) {
    *error = "no stages";
    return std::nullopt;
  }
  return out;
}

std::optional<HeaderField> ParseHeader(std::string_view text, std::string* error) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    *error = "bad header '" + std::string(text) + "' (want NAME:VALUE)";
    return std::nullopt;
  }
  HeaderField h;
  h.name = std::string(text.substr(0, colon));
  if (h.name.empty()) {
    *error = "bad header '" + std::string(text) + "': no name before ':'";
    return std::nullopt;
  }
  for (char c : h.name) {
    if (!IsTokenChar(c)) {
      *error = "bad header name '" + h.name + "' (letters, digits and !#$%&'*+-.^_`|~ only)";
      return std::nullopt;
    }
  }
  // The HTTP client writes these from the request itself; a second copy would contradict it.
  constexpr std::array<std::string_view, 5> kReserved = {"host", "content-length", "content-type",
                                                         "transfer-encoding", "connection"};
  for (std::string_view r : kReserved) {
    if (EqualsIgnoreCase(h.name, r)) {
      *error = "header '" + h.name + "' is set by kvroute bench itself";
      return std::nullopt;
    }
  }
  const std::string_view value = Trim(text.substr(colon + 1));
  for (char c : value) {
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
      *error = "bad value for header '" + h.name + "': control character";
      return std::nullopt;
    }
  }
  h.value = std::string(value);
  return h;
}

void AddFlags(CLI::App& app, BenchOptions& o) {
  app.add_option("--url", o.url, "Target, e.g. http://127.0.0.1:8080")->required();
  app.add_option("--model", o.model, "Model name to send (default: first of GET /v1/models)");
  app.add_option("--header,-H", o.header_texts,
                 "Extra header NAME:VALUE sent on every request to --url (repeatable), e.g. "
                 "-H x-gateway-inference-objective:batch")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--scenario", o.scenario_path,
                 "Scenario YAML (workload, arrivals, seed, slo), as for simulate")
      ->check(CLI::ExistingFile);
  app.add_option("--workload", o.workload_kind, "shared-prefix | multi-turn | random | trace")
      ->capture_default_str();
  app.add_option("--endpoint", o.endpoint, "completions | chat")->capture_default_str();
  app.add_option("--num-groups", o.num_groups, "shared-prefix/multi-turn groups")
      ->capture_default_str();
  app.add_option("--prompts-per-group", o.prompts_per_group,
                 "Prompts (or conversations) per group")
      ->capture_default_str();
  app.add_option("--system-len", o.system_len,
                 "Shared system prompt tokens: N or mean:sd[:min:max]")
      ->capture_default_str();
  app.add_option("--question-len", o.question_len, "Question tokens")->capture_default_str();
  app.add_option("--output-len", o.output_len, "Output tokens (sent as max_tokens "
                                               "with ignore_eos)")
      ->capture_default_str();
  app.add_option("--input-len", o.input_len, "random: prompt tokens")->capture_default_str();
  app.add_option("--max-turns", o.max_turns, "multi-turn: turns per conversation")
      ->capture_default_str();
  app.add_option("--think-time", o.think_time,
                 "multi-turn: seconds between an answer and the next question");
  app.add_option("--trace", o.trace_path,
                 "Replay this trace (implies --workload trace): Mooncake JSON lines or an "
                 "Azure-format CSV (docs/TRACES.md)")
      ->check(CLI::ExistingFile);
  app.add_option("--trace-format", o.trace_format,
                 "mooncake | azure (default: mooncake for a .jsonl file, else azure)");
  app.add_option("--time-scale,--trace-time-scale", o.trace_time_scale,
                 "trace: replay speed (2 = twice as fast)");
  app.add_option("--block-size", o.block_size, "mooncake: prompt tokens per hash id")
      ->capture_default_str();
  app.add_option("--prefix-len", o.prefix_len, "trace: shared prefix tokens per group");
  app.add_option("--arrival", o.arrival, "poisson | gamma | constant")->capture_default_str();
  app.add_option("--burstiness", o.burstiness, "gamma shape (1 = Poisson)");
  app.add_option("--rate", o.rate, "Requests per second")->capture_default_str();
  app.add_option("--stages", o.stages,
                 "Rate sweep 'rate:seconds,rate:seconds,...' (replaces --rate)");
  app.add_option("--num-requests,-n", o.num_requests, "Stop after this many requests");
  app.add_option("--duration", o.duration, "Stop sending after this many seconds");
  app.add_option("--max-concurrency", o.max_concurrency,
                 "Hold requests back while this many are in flight (0: none)");
  app.add_option("--seed", o.seed, "Workload and arrival seed")->capture_default_str();
  app.add_option("--slo", o.slo_text, "Goodput SLOs, e.g. ttft=2s,tpot=50ms");
  app.add_option("--fleet", o.fleet_list, "Replicas whose /metrics to read: host:port,host:port");
  app.add_option("--fleet-ports", o.fleet_ports, "Replica port range P-Q (host: --fleet-host)");
  app.add_option("--fleet-host", o.fleet_host, "Host for --fleet-ports (default: the --url host)");
  app.add_option("--scrape-interval", o.scrape_interval, "Seconds between /metrics reads")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout, "Seconds to wait for a response's first byte")
      ->capture_default_str();
  app.add_option("--drain", o.drain, "Seconds in-flight requests get after the last arrival")
      ->capture_default_str();
  app.add_option("--out", o.out_dir, "Write report.json, report.md and SVG charts here");
  app.add_option("--label", o.label, "Name of this run in the report")->capture_default_str();
  app.add_flag("--quiet,-q", o.quiet, "No progress line");
  app.add_flag("--progress", o.progress, "Progress line even when stderr is not a terminal");
}

void NoteGivenFlags(const CLI::App& app, BenchOptions& o) {
  BenchOptions::Given& g = o.given;
  const auto given = [&app](const char* name) { return app.count(name) > 0; };
  g.scenario = given("--scenario");
  g.workload = given("--workload");
  g.endpoint = given("--endpoint");
  g.num_groups = given("--num-groups");
  g.prompts_per_group = given("--prompts-per-group");
  g.system_len = given("--system-len");
  g.question_len = given("--question-len");
  g.output_len = given("--output-len");
  g.input_len = given("--input-len");
  g.max_turns = given("--max-turns");
  g.think_time = given("--think-time");
  g.trace = given("--trace");
  g.trace_format = given("--trace-format");
  g.trace_time_scale = given("--time-scale");
  g.block_size = given("--block-size");
  g.prefix_len = given("--prefix-len");
  g.arrival = given("--arrival");
  g.burstiness = given("--burstiness");
  g.rate = given("--rate");
  g.stages = given("--stages");
  g.num_requests = given("--num-requests");
  g.duration = given("--duration");
  g.max_concurrency = given("--max-concurrency");
  g.seed = given("--seed");
  g.slo = given("--slo");
}

}  // namespace kvroute::bench
