// epp_load: the same OpenAI requests sent to `kvroute epp` as an Envoy-like ext_proc client
// would, or to `kvroute serve` over HTTP, from a number of concurrent streams; prints one
// Markdown row: requests, errors, requests/s, latency p50/p99 and the CPU the measured
// process spent per request (from /proc/<pid>/stat, utime + stime, before and after).
//
//   epp_load --grpc HOST:PORT | --http HOST:PORT   [--pid PID] [--streams N]
//            [--requests M] [--prompt-bytes B] [--mode full_duplex|buffered] [--label L]
//
// gRPC: one ext_proc stream per request: request_headers (:path /v1/completions,
// content-type application/json; protocol_config with the body mode), then the body in
// request_body messages of at most 64 KiB in full duplex or one message when buffered
// (end_of_stream on the last), read until the pick arrives (a header mutation with
// x-gateway-destination-endpoint, or an immediate_response = error) and, in full duplex,
// until the re-emitted body's end_of_stream; then the stream is closed, as Envoy does once
// the upstream answered (the picker finishes the request). Latency is from the first
// write to the pick (buffered) or the re-emitted body's end (full duplex).
// HTTP: the same bodies POSTed on one keep-alive connection per stream; latency to the
// complete response (the sim behind serve answers at once: time_scale 0, max_tokens 1).
//
// Sync gRPC API with a thread per stream: simple, and the client's cost stays out of the
// measured process (the CPU figure is the picker's or the proxy's alone).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/api/openai.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "adapters/http/test_client.h"

namespace {

namespace ep = envoy::service::ext_proc::v3;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string grpc, http, mode = "full_duplex", label;
  int pid = 0, streams = 8, requests = 400;
  std::size_t prompt_bytes = 4096;
};

double CpuSeconds(int pid) {
  if (pid <= 0) return 0.0;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) return 0.0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && (in >> field); ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// 16 prefix groups: half the prompt shared within a group.
std::string Body(std::size_t bytes, int i) {
  const int group = i % 16;
  std::string prompt = "system prompt of group " + std::to_string(group) + ". ";
  while (prompt.size() < bytes / 2) prompt += static_cast<char>('a' + (group * 7 + prompt.size()) % 26);
  prompt += " request " + std::to_string(i) + " ";
  while (prompt.size() < bytes) prompt += static_cast<char>('a' + (i * 13 + prompt.size()) % 26);
  std::string body = "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"max_tokens\":1,\"prompt\":";
  kvroute::api::AppendJsonString(body, prompt);
  return body + "}";
}

void AddHeader(ep::HttpHeaders* h, const std::string& k, const std::string& v) {
  auto* hv = h->mutable_headers()->add_headers();
  hv->set_key(k);
  hv->set_raw_value(v);
}

bool HasPick(const ep::CommonResponse& c) {
  for (const auto& o : c.header_mutation().set_headers()) {
    if (o.header().key() == "x-gateway-destination-endpoint") return true;
  }
  return false;
}

// One request over ext_proc; true when a pick came back.
bool GrpcRequest(ep::ExternalProcessor::Stub& stub, const std::string& body, bool full_duplex) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub.Process(&ctx);
  ep::ProcessingRequest req;
  // As Envoy does on the stream's first message: the body mode the filter is configured with.
  using Mode = envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
  req.mutable_protocol_config()->set_request_body_mode(full_duplex ? Mode::FULL_DUPLEX_STREAMED
                                                                   : Mode::BUFFERED);
  auto* h = req.mutable_request_headers();
  AddHeader(h, ":method", "POST");
  AddHeader(h, ":path", "/v1/completions");
  AddHeader(h, "content-type", "application/json");
  AddHeader(h, "content-length", std::to_string(body.size()));
  if (!stream->Write(req)) return false;
  // Full duplex: the body in pieces as Envoy streams it; buffered: one message.
  const std::size_t kChunk = full_duplex ? (64u << 10) : std::max<std::size_t>(1, body.size());
  for (std::size_t off = 0; off < body.size(); off += kChunk) {
    ep::ProcessingRequest b;
    b.mutable_request_body()->set_body(body.substr(off, kChunk));
    b.mutable_request_body()->set_end_of_stream(off + kChunk >= body.size());
    if (!stream->Write(b)) return false;
  }
  bool picked = false, done = false;
  ep::ProcessingResponse resp;
  while (!done && stream->Read(&resp)) {
    if (resp.has_immediate_response()) break;
    if (resp.has_request_headers() && HasPick(resp.request_headers().response())) picked = true;
    if (resp.has_request_body()) {
      const auto& c = resp.request_body().response();
      if (HasPick(c)) picked = true;
      if (!full_duplex) done = picked;
      if (c.body_mutation().has_streamed_response() && c.body_mutation().streamed_response().end_of_stream()) {
        done = true;
      }
    }
    if (!full_duplex && picked) done = true;
  }
  stream->WritesDone();
  ctx.TryCancel();
  stream->Finish();
  return picked;
}

int Run(const Options& o) {
  std::vector<std::string> bodies;
  for (int i = 0; i < 64; ++i) bodies.push_back(Body(o.prompt_bytes, i));
  std::atomic<int> next{0}, errors{0};
  std::mutex mu;
  std::vector<double> lat_ms;
  const bool grpc = !o.grpc.empty();
  std::shared_ptr<grpc::Channel> channel;
  if (grpc) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    channel = grpc::CreateCustomChannel(o.grpc, grpc::InsecureChannelCredentials(), args);
  }
  const double cpu0 = CpuSeconds(o.pid);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < o.streams; ++s) {
    threads.emplace_back([&] {
      std::unique_ptr<ep::ExternalProcessor::Stub> stub;
      std::unique_ptr<kvroute::http::TestClient> client;
      if (grpc) {
        stub = ep::ExternalProcessor::NewStub(channel);
      }
      std::vector<double> mine;
      for (int i; (i = next.fetch_add(1)) < o.requests;) {
        const std::string& body = bodies[static_cast<std::size_t>(i) % bodies.size()];
        const auto a = Clock::now();
        bool ok;
        if (grpc) {
          ok = GrpcRequest(*stub, body, o.mode == "full_duplex");
        } else {
          if (!client || !client->connected()) {
            auto colon = o.http.rfind(':');
            client = std::make_unique<kvroute::http::TestClient>(
                o.http.substr(0, colon), static_cast<uint16_t>(std::stoi(o.http.substr(colon + 1))),
                std::chrono::milliseconds(30000));
            client->Connect();
          }
          auto r = client->Roundtrip("POST", "/v1/completions", body, {{"content-type", "application/json"}});
          ok = r && r->status == 200;
          if (!ok) client.reset();
        }
        mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
        if (!ok) errors.fetch_add(1);
      }
      std::lock_guard<std::mutex> lock(mu);
      lat_ms.insert(lat_ms.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = CpuSeconds(o.pid) - cpu0;
  std::sort(lat_ms.begin(), lat_ms.end());
  auto pct = [&](double q) { return lat_ms.empty() ? 0.0 : lat_ms[static_cast<std::size_t>(q * (lat_ms.size() - 1))]; };
  const int n = static_cast<int>(lat_ms.size());
  std::printf("| %s | %zu KB | %d | %d | %d | %.0f | %.2f | %.2f | %s |\n", o.label.c_str(),
              o.prompt_bytes >> 10, o.streams, n, errors.load(), n / wall, pct(0.5), pct(0.99),
              o.pid > 0 ? (std::to_string(cpu / n * 1000.0).substr(0, 6) + " ms").c_str() : "-");
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "epp_load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--grpc") o.grpc = val();
    else if (a == "--http") o.http = val();
    else if (a == "--pid") o.pid = std::stoi(val());
    else if (a == "--streams") o.streams = std::stoi(val());
    else if (a == "--requests") o.requests = std::stoi(val());
    else if (a == "--prompt-bytes") o.prompt_bytes = std::stoul(val());
    else if (a == "--mode") o.mode = val();
    else if (a == "--label") o.label = val();
    else {
      std::fprintf(stderr, "usage: epp_load --grpc HOST:PORT | --http HOST:PORT [--pid PID] [--streams N] "
                           "[--requests M] [--prompt-bytes B] [--mode full_duplex|buffered] [--label L]\n");
      return 2;
    }
  }
  if (o.grpc.empty() == o.http.empty()) {
    std::fprintf(stderr, "epp_load: give exactly one of --grpc and --http\n");
    return 2;
  }
  if (o.label.empty()) o.label = o.grpc.empty() ? "serve" : "epp " + o.mode;
  return Run(o);
}
