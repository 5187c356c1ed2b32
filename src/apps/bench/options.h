// `kvroute bench`'s command line: its flags (BenchOptions, AddFlags) and the parsing of
// flag values that are more than a number: SLOs, fleet lists, URLs, length distributions,
// rate stages and extra headers. Each parser returns the value or an error text naming
// what is wrong; nothing throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "simkit/report/summary.h"
#include "simkit/workload/arrivals.h"
#include "simkit/workload/distribution.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kvroute::bench {

// Every flag of `kvroute bench`, as given (text values not yet parsed; bench_main turns
// them into a BenchConfig). Defaults are the flags' defaults.
struct BenchOptions {
  std::string url, model, scenario_path, out_dir, label = "bench";
  std::string workload_kind = "shared-prefix", endpoint = "completions";
  int64_t num_groups = 8, prompts_per_group = 16;
  std::string system_len = "1000", question_len = "100", output_len = "64", input_len = "256";
  int max_turns = 5;
  double think_time = 0.0;
  std::string trace_path, trace_format;
  double trace_time_scale = 1.0;
  int64_t block_size = 512;
  int64_t prefix_len = 0;
  std::string arrival = "poisson", stages, slo_text, fleet_list, fleet_ports, fleet_host;
  double burstiness = 1.0, rate = 10.0, duration = 0.0;
  int64_t num_requests = 0, max_concurrency = 0;
  uint64_t seed = 1;
  double scrape_interval = 0.25, timeout = 600.0, drain = 120.0;
  bool quiet = false, progress = false;
  std::vector<std::string> header_texts;

  // Which flags were on the command line (set after parsing by NoteGivenFlags): a flag
  // given explicitly overrides the scenario file.
  struct Given {
    bool scenario = false, workload = false, endpoint = false, num_groups = false,
         prompts_per_group = false, system_len = false, question_len = false,
         output_len = false, input_len = false, max_turns = false, think_time = false,
         trace = false, trace_format = false, trace_time_scale = false, block_size = false,
         prefix_len = false, arrival = false,
         burstiness = false, rate = false, stages = false, num_requests = false,
         duration = false, max_concurrency = false, seed = false, slo = false;
  } given;
};

// Registers every flag of `kvroute bench` on `app`, bound to `opts`.
void AddFlags(CLI::App& app, BenchOptions& opts);
// Sets `opts.given` from `app` once it has parsed the command line.
void NoteGivenFlags(const CLI::App& app, BenchOptions& opts);

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port"
};

// "http://host:port[/...]" or "host:port" (only plain http; a path is ignored).
// A missing port means 80.
std::optional<HostPort> ParseUrl(std::string_view url, std::string* error);

// "host:port,host:port,..." (each entry "host:port" or just ":port"/"port", which take
// `default_host`).
std::optional<std::vector<HostPort>> ParseFleetList(std::string_view list,
                                                    std::string_view default_host,
                                                    std::string* error);
// "P-Q" (inclusive, P <= Q, at most 1024 ports) on `host`.
std::optional<std::vector<HostPort>> ParsePortRange(std::string_view range, std::string_view host,
                                                    std::string* error);

// "ttft=2,tpot=0.05,e2e=30" in seconds; a value may carry a unit: "200ms", "2s".
// Keys may appear in any order; each at most once.
std::optional<report::Slo> ParseSlo(std::string_view text, std::string* error);

// A token length: "N" (fixed), or "mean:std_dev[:min:max]" (a truncated normal; min
// defaults to 1, max to mean + 4 std_dev).
std::optional<workload::LengthDist> ParseLength(std::string_view text, std::string* error);

// Rate stages "rate:duration_s,rate:duration_s,..."; the last duration may be "inf".
std::optional<std::vector<workload::RateStage>> ParseStages(std::string_view text,
                                                            std::string* error);

// One extra request header field.
struct HeaderField {
  std::string name;   // as given (HTTP field names are case-insensitive)
  std::string value;  // without the whitespace around it; may be empty
};

// A `--header` value, "NAME:VALUE" (curl's form; "NAME: VALUE" too). The name must be
// an HTTP token (letters, digits, !#$%&'*+-.^_`|~) and not one the client writes itself
// (Host, Content-Length, Content-Type, Transfer-Encoding, Connection); the value must
// hold no control characters but tab. Anything else is an error naming the reason.
std::optional<HeaderField> ParseHeader(std::string_view text, std::string* error);

}  // namespace kvroute::bench
