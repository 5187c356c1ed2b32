// Parsing of `kvroute bench` flag values that are more than a number: SLOs, fleet lists,
// URLs, length distributions, rate stages and extra headers. Each returns the value or an
// error text naming what is wrong; nothing throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "simkit/report/summary.h"
#include "simkit/workload/arrivals.h"
#include "simkit/workload/distribution.h"

namespace kvroute::bench {

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
