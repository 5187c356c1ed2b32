// What tokenizing a request over loopback HTTP costs the router: HttpTokenizer (one worker
// loop, its UpstreamClient, keep-alive) asking a simulated replica's POST /tokenize, one
// call at a time, for 4 KB and 220 KB prompts in the completion and the chat form. Prints
// p50 / p99 / mean latency per call in microseconds (Tokenize to callback: building the
// body, HTTP both ways, the replica's parse and tokenization, parsing the ids).
//
//   build/bench/tokenize_load [REQUESTS [HOST:PORT]]
//
// REQUESTS per size and form (default 2000). Without HOST:PORT a one-replica sim fleet runs
// in this process on its own thread (the replica must serve model
// meta-llama/Llama-3.1-8B-Instruct otherwise). Not a Google Benchmark: percentiles of
// single calls are the figure wanted.
#include <boost/asio/post.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/api/openai.h"
#include "core/engine/engine.h"
#include "adapters/http/io_pool.h"
#include "apps/sim/fleet.h"
#include "adapters/tokenize/http_tokenizer.h"

namespace {

using namespace kvroute;
using Clock = std::chrono::steady_clock;

constexpr const char* kModel = "meta-llama/Llama-3.1-8B-Instruct";

// Prose-like text of `bytes` characters (as bench/api_bench.cc makes it).
std::string MakeText(size_t bytes) {
  std::string s;
  s.reserve(bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  while (s.size() < bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int len = 3 + static_cast<int>(x % 6);
    for (int i = 0; i < len; ++i) s.push_back(static_cast<char>('a' + (x >> (8 + i * 5)) % 26));
    s.push_back((x >> 50) % 29 == 0 ? '\n' : (x >> 50) % 17 == 0 ? '.' : ' ');
  }
  s.resize(bytes);
  return s;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (requests < 1) {
    std::fprintf(stderr, "usage: tokenize_load [REQUESTS [HOST:PORT]]\n");
    return 2;
  }
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::unique_ptr<sim::Fleet> fleet;
  if (argc > 2) {
    const std::string hp = argv[2];
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos) {
      std::fprintf(stderr, "HOST:PORT expected, got %s\n", hp.c_str());
      return 2;
    }
    host = hp.substr(0, colon);
    port = static_cast<uint16_t>(std::atoi(hp.c_str() + colon + 1));
  } else {
    sim::ReplicaConfig r;
    r.name = "tokenize-load";
    r.engine = *engine::PresetConfig("llama3-8b-h100");
    r.engine.model_name = kModel;
    r.max_body_bytes = 16u << 20;
    fleet = std::make_unique<sim::Fleet>(std::vector<sim::ReplicaConfig>{r}, 1);
    if (Status s = fleet->Start(); !s.ok()) {
      std::fprintf(stderr, "sim: %s\n", s.message().c_str());
      return 1;
    }
    port = fleet->port(0);
  }

  http::IoPool pool(1);
  pool.Start();
  auto on_loop = [&](auto fn) {
    std::promise<void> done;
    boost::asio::post(pool.context(0), [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  };
  std::unique_ptr<http::UpstreamClient> client;
  std::unique_ptr<tokenize::HttpTokenizer> tokenizer;
  on_loop([&] {
    client = std::make_unique<http::UpstreamClient>(pool.context(0));
    tokenizer = std::make_unique<tokenize::HttpTokenizer>(pool.context(0), *client);
  });

  std::printf("HttpTokenizer -> POST /tokenize on %s:%u, %d sequential calls per row, one "
              "keep-alive connection\n",
              host.c_str(), port, requests);
  std::printf("%-10s %-6s %8s %10s %10s %10s %8s\n", "form", "prompt", "tokens", "p50 us",
              "p99 us", "mean us", "fails");
  int exit_code = 0;
  for (size_t bytes : {size_t{4096}, size_t{220} * 1024}) {
    const std::string text = MakeText(bytes);
    std::string chat_body = std::string(R"({"model":")") + kModel + R"(","messages":[)" +
                            R"({"role":"system","content":"You are helpful."},)" +
                            R"({"role":"user","content":)";
    api::AppendJsonString(chat_body, text);
    chat_body += "}]}";
    for (bool chat : {false, true}) {
      tokenize::TokenizeInput in;
      in.endpoint = chat ? api::Endpoint::kChatCompletions : api::Endpoint::kCompletions;
      in.model = kModel;
      in.prompt = text;
      in.body = chat_body;
      in.target_host = host;
      in.target_port = port;
      std::vector<double> us;
      us.reserve(static_cast<size_t>(requests));
      size_t tokens = 0;
      int fails = 0;
      for (int i = -std::min(requests, 50); i < requests; ++i) {  // 50 warm-up calls first
        std::promise<void> done;
        Clock::time_point start;
        Clock::time_point end;
        bool ok = false;
        boost::asio::post(pool.context(0), [&] {
          start = Clock::now();
          tokenizer->Tokenize(in, [&](Result<tokenize::TokenIds> r) {
            end = Clock::now();
            ok = r.ok();
            if (ok) tokens = r->size();
            if (!ok && fails == 0) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
            done.set_value();
          });
        });
        done.get_future().wait();
        if (i < 0) continue;
        if (!ok) ++fails;
        us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      }
      double sum = 0;
      for (double v : us) sum += v;
      std::printf("%-10s %5zuK %8zu %10.0f %10.0f %10.0f %8d\n", chat ? "chat" : "completion",
                  bytes / 1024, tokens, Percentile(us, 0.50), Percentile(us, 0.99),
                  sum / static_cast<double>(us.size()), fails);
      if (fails > 0) exit_code = 1;
    }
  }
  on_loop([&] {
    tokenizer.reset();
    client.reset();
  });
  pool.Stop();
  return exit_code;
}
