// Fuzzes the ext_proc exchange (epp/extproc/exchange.h) with arbitrary ProcessingRequest
// sequences. Input: one settings byte, then records of [u16 little-endian length][that many
// bytes of a serialized ProcessingRequest] (records that do not parse are skipped). The
// exchange runs over a real routing core of three scraped endpoints. Checks: no crash; at
// most one ImmediateResponse and nothing after it; re-emitted chunks within 62,000 bytes;
// after Close the request is finished and the core has nothing in flight.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "apps/epp/extproc/exchange.h"
#include "fuzz_check.h"

namespace {

using namespace kvroute;

routing::RoutingCore& Core() {
  static routing::RoutingCore* core = [] {
    auto* c = new routing::RoutingCore();
    std::vector<routing::EndpointSpec> eps;
    for (int i = 0; i < 3; ++i) {
      routing::EndpointSpec e;
      e.host = "10.0.0." + std::to_string(i + 1);
      e.port = 8000;
      e.address = e.host + ":8000";
      e.name = e.address;
      eps.push_back(e);
    }
    routing::CoreOptions o;
    o.scheduling.policy = "kvroute";
    o.health.staleness_s = 1e9;  // scraped once, fresh for the whole run
    c->Configure(o, eps, 0.0);
    routing::ScrapeResult r;
    r.ok = true;
    r.sent_at_s = 0.0;
    r.metrics.engines = 1;
    r.metrics.present = metrics::EngineMetrics::kRunning | metrics::EngineMetrics::kWaiting |
                        metrics::EngineMetrics::kKvUsage;
    for (uint32_t id = 0; id < 3; ++id) c->OnScrape(id, r, 0.0);
    return c;
  }();
  return *core;
}

bool NothingInFlight(routing::RoutingCore& core) {
  std::string text;
  core.AppendMetrics(text, 1.0);
  // Every kvroute_endpoint_inflight sample must be 0.
  std::size_t at = 0;
  while ((at = text.find("\nkvroute_endpoint_inflight{", at)) != std::string::npos) {
    std::size_t end = text.find('\n', at + 1);
    std::string line = text.substr(at + 1, end - at - 1);
    if (line.size() < 2 || line.substr(line.size() - 2) != " 0") {
      if (line.substr(line.size() - 4) != " 0.0") return false;
    }
    at = end;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // Records with invalid UTF-8 in string fields fail to parse (as from a real peer); the
  // library would log each one.
  static google::protobuf::LogSilencer* silence = new google::protobuf::LogSilencer();
  (void)silence;
  routing::RoutingCore& core = Core();
  auto settings = std::make_shared<extproc::ExchangeSettings>();
  const uint8_t s = data[0];
  settings->body_mode = static_cast<extproc::BodyMode>(s % 5);
  settings->fallbacks = (s >> 3) & 7;
  settings->max_body_bytes = (s & 0x80) ? 4096 : (1u << 20);
  settings->objectives = {{"batch", -1}, {"chat", 5}};
  extproc::EppStats stats;
  {
    extproc::Exchange ex({&core, &stats, {}}, settings);
    std::vector<envoy::service::ext_proc::v3::ProcessingRequest> in(1);
    std::vector<envoy::service::ext_proc::v3::ProcessingResponse> out;
    std::size_t at = 1;
    int immediates = 0;
    double now = 1.0;
    while (at + 2 <= size) {
      const std::size_t len = data[at] | (static_cast<std::size_t>(data[at + 1]) << 8);
      at += 2;
      const std::size_t n = std::min(len, size - at);
      const bool parsed = in[0].ParseFromArray(data + at, static_cast<int>(n));
      at += n;
      if (!parsed) continue;
      out.clear();
      const bool was_done = ex.done();
      ex.OnRequest(in[0], now, out);
      if (was_done) kvroute::fuzz::Check(out.empty(), "answers after an immediate response");
      for (const auto& r : out) {
        if (r.has_immediate_response()) ++immediates;
        if (r.has_request_body() && r.request_body().response().body_mutation().has_streamed_response()) {
          kvroute::fuzz::Check(
              r.request_body().response().body_mutation().streamed_response().body().size() <=
                  extproc::kMaxStreamedChunk,
              "re-emitted chunk over 62,000 bytes");
        }
      }
      kvroute::fuzz::Check(immediates <= 1, "more than one immediate response");
      if (immediates == 1) kvroute::fuzz::Check(ex.done() && ex.finished(), "immediate without finishing");
    }
    ex.Close(now, (s & 0x40) != 0);
    kvroute::fuzz::Check(ex.finished(), "not finished after Close");
  }
  kvroute::fuzz::Check(NothingInFlight(core), "a request left in flight");
  return 0;
}
