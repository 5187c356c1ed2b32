// Client-side load for `kvroute serve` (issue 13, item 5; driven by
// scripts/load-connections.sh): many concurrent client connections on one event loop,
// with the server's resident memory and descriptor count read from /proc/<pid> around
// each phase. Not a benchmark of the router's request rate; a check that connections and
// streams cost bounded memory, leak nothing, and that slow senders do not hurt others.
//
//   load_connections hold      --port P --pid PID --connections 10000 --interval 5 --rounds 2
//   load_connections streams   --port P --pid PID --streams 1000 --max-tokens 400
//   load_connections slowloris --port P --pid PID --slow 300 --normal 16 --duration 8
//
// Prints one "key value" line per figure (the script turns them into a table).
// Build: c++ -std=c++20 -O2 -pthread scripts/load_connections.cc (Boost headers only).
#include <dirent.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Args {
  std::string mode;
  std::map<std::string, std::string> kv;
  std::string Str(const std::string& k, const std::string& def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
  double Num(const std::string& k, double def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::stod(it->second);
  }
};

void Out(const std::string& key, double v) { std::printf("%s %.6g\n", key.c_str(), v); }

// ---- the server process, from /proc ----

struct ProcSample {
  double rss_kb = 0;
  int fds = 0;
};

ProcSample Sample(int pid) {
  ProcSample s;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::stod(line.substr(6));
  }
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    closedir(d);
  }
  return s;
}

double ServerMetric(const tcp::endpoint& ep, const std::string& name);
bool WaitServerConnections(const tcp::endpoint& ep, double want, std::chrono::seconds limit);
std::string CompletionBody(const std::string& model, int id, int max_tokens, bool stream);

// After a phase, once the client connections are gone: the sample then ("after clients
// closed"), and the sample once the router's idle upstream connections have expired. The
// upstream pool drops a connection idle past 4 s lazily, when it next takes one for that
// endpoint, so: wait 4.5 s, send `touch` small requests (round-robin: every endpoint gets
// some), then sample ("after").
ProcSample SettledSample(int pid, const tcp::endpoint& ep, int touch) {
  Out("fds_after_clients_closed", Sample(pid).fds);
  std::this_thread::sleep_for(4500ms);
  asio::io_context ctx;
  tcp::socket sock(ctx);
  error_code ec;
  sock.connect(ep, ec);
  beast::flat_buffer buf;
  for (int i = 0; i < touch && !ec; ++i) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
    req.set(bhttp::field::host, "load");
    req.set(bhttp::field::content_type, "application/json");
    req.body() = CompletionBody("meta-llama/Llama-3.1-8B-Instruct", i, 1, false);
    req.prepare_payload();
    bhttp::write(sock, req, ec);
    bhttp::response<bhttp::string_body> res;
    if (!ec) bhttp::read(sock, buf, res, ec);
  }
  sock.close(ec);
  WaitServerConnections(ep, 1, 5s);
  return Sample(pid);
}

void OutSample(const std::string& phase, const ProcSample& s) {
  Out("rss_kb_" + phase, s.rss_kb);
  Out("fds_" + phase, s.fds);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// GET /metrics on a fresh connection (blocking; between phases only); the value of the
// unlabelled sample `name`, or -1.
double ServerMetric(const tcp::endpoint& ep, const std::string& name) {
  asio::io_context ctx;
  tcp::socket s(ctx);
  error_code ec;
  s.connect(ep, ec);
  if (ec) return -1;
  bhttp::request<bhttp::string_body> req{bhttp::verb::get, "/metrics", 11};
  req.set(bhttp::field::host, "load");
  req.set(bhttp::field::connection, "close");
  bhttp::write(s, req, ec);
  beast::flat_buffer buf;
  bhttp::response<bhttp::string_body> res;
  bhttp::read(s, buf, res, ec);
  if (ec && ec != bhttp::error::end_of_stream) return -1;
  const std::string& body = res.body();
  std::size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + name.size() + 2));
}

// The sum of every sample of `name` (all label sets) in the server's /metrics, or -1.
double ServerMetricSum(const tcp::endpoint& ep, const std::string& name) {
  asio::io_context ctx;
  tcp::socket s(ctx);
  error_code ec;
  s.connect(ep, ec);
  if (ec) return -1;
  bhttp::request<bhttp::string_body> req{bhttp::verb::get, "/metrics", 11};
  req.set(bhttp::field::host, "load");
  req.set(bhttp::field::connection, "close");
  bhttp::write(s, req, ec);
  beast::flat_buffer buf;
  bhttp::response<bhttp::string_body> res;
  bhttp::read(s, buf, res, ec);
  if (ec && ec != bhttp::error::end_of_stream) return -1;
  double sum = 0;
  const std::string& body = res.body();
  for (std::size_t at = 0; at < body.size();) {
    std::size_t eol = body.find('\n', at);
    if (eol == std::string::npos) eol = body.size();
    std::string_view line(body.data() + at, eol - at);
    if (line.substr(0, name.size()) == name && line.size() > name.size() &&
        (line[name.size()] == '{' || line[name.size()] == ' ')) {
      sum += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
    at = eol + 1;
  }
  return sum;
}

// Waits (up to `limit`) until the server reports `want` open client connections, the
// probe's own included.
bool WaitServerConnections(const tcp::endpoint& ep, double want, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (ServerMetric(ep, "kvroute_http_open_connections") == want) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

std::string CompletionBody(const std::string& model, int id, int max_tokens, bool stream) {
  std::string b = "{\"model\":\"" + model + "\",\"prompt\":\"load test request " +
                  std::to_string(id) + " says hello\",\"max_tokens\":" +
                  std::to_string(max_tokens);
  if (stream) b += ",\"stream\":true";
  return b + "}";
}

bhttp::request<bhttp::string_body> Post(const std::string& body) {
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/completions", 11};
  req.set(bhttp::field::host, "load");
  req.set(bhttp::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  return req;
}

// Opens connections at most `parallel` at a time (a burst of 10k SYNs would overflow the
// listen backlog and measure SYN retries instead).
class Ramp {
 public:
  Ramp(std::size_t total, std::size_t parallel, std::function<void(std::size_t, std::function<void()>)> open)
      : total_(total), parallel_(parallel), open_(std::move(open)) {}
  void Start() {
    for (std::size_t i = 0; i < parallel_; ++i) Next();
  }

 private:
  void Next() {
    if (next_ >= total_) return;
    open_(next_++, [this] { Next(); });
  }
  std::size_t total_, parallel_, next_ = 0;
  std::function<void(std::size_t, std::function<void()>)> open_;
};

// ---- hold: many keep-alive connections, each sending a request periodically ----

struct HoldStats {
  std::size_t connected = 0, connect_failed = 0, answered_once = 0;
  std::size_t sent = 0, ok = 0, failed = 0;
  std::vector<double> latency_ms;
  std::map<std::string, std::size_t> failures;  // "status_503", "error_<message>"
  bool stop = false;
};

class HoldConn : public std::enable_shared_from_this<HoldConn> {
 public:
  HoldConn(asio::io_context& ctx, HoldStats& st, std::string body, Clock::duration interval)
      : sock_(ctx), timer_(ctx), st_(st), req_(Post(body)), interval_(interval) {}

  // The first request goes out at once (a client connects to send one; the server gives
  // a new connection timeouts.request_read for it); the next after `first_gap`, spreading
  // the connections over the interval, then one every interval.
  void Start(const tcp::endpoint& ep, Clock::duration first_gap, std::function<void()> connected) {
    next_gap_ = first_gap;
    sock_.async_connect(ep, [self = shared_from_this(), connected](error_code ec) {
      connected();
      if (ec) {
        ++self->st_.connect_failed;
        return;
      }
      ++self->st_.connected;
      self->Send();
    });
  }
  void Close() {
    error_code ignored;
    timer_.cancel();
    sock_.close(ignored);
  }
  // At the end: an idle connection closes now, one with a request in flight once it is
  // answered (OnResponse sees st_.stop).
  void Stop() {
    if (!in_flight_) Close();
  }

 private:
  void Wait(Clock::duration d) {
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec && !self->st_.stop) self->Send();
    });
  }
  void Send() {
    ++st_.sent;
    in_flight_ = true;
    t0_ = Clock::now();
    bhttp::async_write(sock_, req_, [self = shared_from_this()](error_code ec, std::size_t) {
      if (ec) return self->Fail("write_" + ec.message());
      self->res_ = {};
      bhttp::async_read(self->sock_, self->buf_, self->res_,
                        [self](error_code ec, std::size_t) { self->OnResponse(ec); });
    });
  }
  void OnResponse(error_code ec) {
    in_flight_ = false;
    if (ec) return Fail("read_" + ec.message());
    st_.latency_ms.push_back(Ms(Clock::now() - t0_));
    if (res_.result_int() == 200) {
      ++st_.ok;
    } else {
      ++st_.failed;
      ++st_.failures["status_" + std::to_string(res_.result_int())];
      std::fprintf(stderr, "hold: %d %s\n", res_.result_int(), res_.body().c_str());
    }
    if (!answered_) {
      answered_ = true;
      ++st_.answered_once;
    }
    if (st_.stop) return Close();
    Wait(next_gap_);
    next_gap_ = interval_;
  }
  void Fail(std::string why) {
    ++st_.failed;
    for (char& c : why) c = c == ' ' ? '_' : c;
    ++st_.failures[why];
    Close();
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  HoldStats& st_;
  bhttp::request<bhttp::string_body> req_;
  bhttp::response<bhttp::string_body> res_;
  beast::flat_buffer buf_;
  Clock::duration interval_;
  Clock::duration next_gap_{};
  Clock::time_point t0_;
  bool answered_ = false;
  bool in_flight_ = false;
};

int Hold(const Args& a, const tcp::endpoint& ep, int pid) {
  const auto n = static_cast<std::size_t>(a.Num("connections", 10000));
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(a.Num("interval", 5)));
  const int rounds = static_cast<int>(a.Num("rounds", 2));
  const std::string model = a.Str("model", "meta-llama/Llama-3.1-8B-Instruct");
  ProcSample before = Sample(pid);

  asio::io_context ctx;
  HoldStats st;
  std::vector<std::shared_ptr<HoldConn>> conns;
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> offset(0, 1);
  auto t_start = Clock::now();
  Ramp ramp(n, 256, [&](std::size_t i, std::function<void()> done) {
    auto c = std::make_shared<HoldConn>(ctx, st, CompletionBody(model, static_cast<int>(i), 1, false),
                                        interval);
    conns.push_back(c);
    auto first_gap = std::chrono::duration_cast<Clock::duration>(interval * (0.5 + offset(rng)));
    c->Start(ep, first_gap, std::move(done));
  });
  ramp.Start();

  // Phases, checked every 100 ms: all connected and each answered once -> sample "with";
  // then `rounds` more intervals -> stop.
  ProcSample with;
  Clock::time_point all_answered{};
  double connect_s = 0;
  asio::steady_timer tick(ctx);
  std::function<void()> check = [&] {
    const bool settled = st.connected + st.connect_failed == n;
    if (settled && connect_s == 0) connect_s = Ms(Clock::now() - t_start) / 1000;
    if (settled && all_answered == Clock::time_point{} &&
        st.answered_once + st.connect_failed >= n) {
      all_answered = Clock::now();
      with = Sample(pid);
    }
    if (all_answered != Clock::time_point{} && Clock::now() - all_answered > interval * rounds) {
      st.stop = true;  // each connection closes after its in-flight request, if any
      for (auto& c : conns) c->Stop();
      return;
    }
    if (Clock::now() - t_start > 120s) {  // a bound: never hang the script
      std::fprintf(stderr, "hold: timed out (connected %zu, answered once %zu)\n", st.connected,
                   st.answered_once);
      st.stop = true;
      for (auto& c : conns) c->Close();
      return;
    }
    tick.expires_after(100ms);
    tick.async_wait([&](error_code) { check(); });
  };
  check();
  ctx.run();
  conns.clear();

  WaitServerConnections(ep, 1, 20s);
  ProcSample after = SettledSample(pid, ep, 32);
  Out("connections", static_cast<double>(n));
  Out("connected", static_cast<double>(st.connected));
  Out("connect_failed", static_cast<double>(st.connect_failed));
  Out("connect_seconds", connect_s);
  Out("requests_sent", static_cast<double>(st.sent));
  Out("requests_ok", static_cast<double>(st.ok));
  Out("requests_failed", static_cast<double>(st.failed));
  for (const auto& [why, count] : st.failures) Out("failed_" + why, static_cast<double>(count));
  Out("latency_p50_ms", Percentile(st.latency_ms, 0.50));
  Out("latency_p99_ms", Percentile(st.latency_ms, 0.99));
  OutSample("before", before);
  OutSample("with", with);
  OutSample("after", after);
  Out("rss_kb_per_connection", (with.rss_kb - before.rss_kb) / static_cast<double>(std::max<std::size_t>(1, st.connected)));
  return 0;
}

// ---- streams: concurrent streaming completions, each on its own connection ----

struct StreamStats {
  std::size_t written = 0, heads = 0, done = 0, with_done_marker = 0, failed = 0, max_concurrent = 0;
  std::vector<double> duration_ms, ttfb_ms;
};

class StreamConn : public std::enable_shared_from_this<StreamConn> {
 public:
  StreamConn(asio::io_context& ctx, StreamStats& st, std::string body,
             std::function<void()> on_written)
      : sock_(ctx), st_(st), req_(Post(body)), on_written_(std::move(on_written)) {
    parser_.body_limit(boost::none);
  }
  void Start(const tcp::endpoint& ep, std::function<void()> connected) {
    t0_ = Clock::now();
    sock_.async_connect(ep, [self = shared_from_this(), connected](error_code ec) {
      connected();
      if (ec) return self->Fail();
      bhttp::async_write(self->sock_, self->req_, [self](error_code ec, std::size_t) {
        if (ec) return self->Fail();
        ++self->st_.written;
        self->on_written_();
        bhttp::async_read_header(self->sock_, self->buf_, self->parser_,
                                 [self](error_code ec, std::size_t) { self->OnHead(ec); });
      });
    });
  }

 private:
  void OnHead(error_code ec) {
    if (ec || parser_.get().result_int() != 200) return Fail();
    st_.ttfb_ms.push_back(Ms(Clock::now() - t0_));
    ++st_.heads;
    bhttp::async_read(sock_, buf_, parser_, [self = shared_from_this()](error_code ec, std::size_t) {
      self->OnBody(ec);
    });
  }
  void OnBody(error_code ec) {
    st_.max_concurrent = std::max(st_.max_concurrent, st_.written - st_.done);
    ++st_.done;
    if (ec) {
      ++st_.failed;
    } else {
      st_.duration_ms.push_back(Ms(Clock::now() - t0_));
      if (parser_.get().body().find("data: [DONE]") != std::string::npos) ++st_.with_done_marker;
    }
    error_code ignored;
    sock_.close(ignored);
  }
  void Fail() {
    ++st_.failed;
    ++st_.done;
    error_code ignored;
    sock_.close(ignored);
  }

  tcp::socket sock_;
  StreamStats& st_;
  bhttp::request<bhttp::string_body> req_;
  bhttp::response_parser<bhttp::string_body> parser_;
  beast::flat_buffer buf_;
  std::function<void()> on_written_;
  Clock::time_point t0_;
};

int Streams(const Args& a, const tcp::endpoint& ep, int pid) {
  const auto n = static_cast<std::size_t>(a.Num("streams", 1000));
  const int max_tokens = static_cast<int>(a.Num("max-tokens", 400));
  const std::string model = a.Str("model", "meta-llama/Llama-3.1-8B-Instruct");
  ProcSample before = Sample(pid);
  asio::io_context ctx;
  StreamStats st;
  // Every 100 ms: the server's RSS and descriptors, and its in-flight count (requests
  // sent to an endpoint and not finished, from its /metrics); the peaks are reported.
  ProcSample peak;
  double peak_inflight = 0;
  std::size_t heads_at_peak = 0;
  auto on_written = [] {};
  asio::steady_timer sampler(ctx);
  std::function<void()> sample = [&] {
    ProcSample now = Sample(pid);
    peak.rss_kb = std::max(peak.rss_kb, now.rss_kb);
    peak.fds = std::max(peak.fds, now.fds);
    double inflight = ServerMetricSum(ep, "kvroute_endpoint_inflight");
    if (inflight > peak_inflight) {
      peak_inflight = inflight;
      heads_at_peak = st.heads - st.done;
    }
    if (st.done == n) return;
    sampler.expires_after(100ms);
    sampler.async_wait([&](error_code ec) {
      if (!ec) sample();
    });
  };
  sample();
  std::vector<std::shared_ptr<StreamConn>> conns;
  auto t_start = Clock::now();
  Ramp ramp(n, 256, [&](std::size_t i, std::function<void()> done) {
    auto c = std::make_shared<StreamConn>(
        ctx, st, CompletionBody(model, static_cast<int>(i), max_tokens, true), on_written);
    conns.push_back(c);
    c->Start(ep, std::move(done));
  });
  ramp.Start();
  asio::steady_timer bound(ctx, 120s);
  bound.async_wait([&](error_code ec) {
    if (!ec) ctx.stop();
  });
  std::function<void()> watch;
  asio::steady_timer tick(ctx);
  watch = [&] {
    if (st.done == n) {
      bound.cancel();
      return;
    }
    tick.expires_after(50ms);
    tick.async_wait([&](error_code) { watch(); });
  };
  watch();
  ctx.run();
  double total_s = Ms(Clock::now() - t_start) / 1000;
  conns.clear();
  WaitServerConnections(ep, 1, 20s);
  ProcSample after = SettledSample(pid, ep, 32);
  Out("streams", static_cast<double>(n));
  Out("streams_completed", static_cast<double>(st.done - st.failed));
  Out("streams_with_done", static_cast<double>(st.with_done_marker));
  Out("streams_failed", static_cast<double>(st.failed));
  Out("max_concurrent", static_cast<double>(st.max_concurrent));
  Out("peak_inflight", peak_inflight);
  Out("streaming_at_peak", static_cast<double>(heads_at_peak));
  Out("total_seconds", total_s);
  Out("head_p50_ms", Percentile(st.ttfb_ms, 0.5));
  Out("duration_p50_ms", Percentile(st.duration_ms, 0.5));
  Out("duration_p99_ms", Percentile(st.duration_ms, 0.99));
  OutSample("before", before);
  OutSample("with", peak);
  OutSample("after", after);
  Out("rss_kb_per_stream", (peak.rss_kb - before.rss_kb) / std::max(1.0, peak_inflight));
  return 0;
}

// ---- slowloris: slow header senders next to normal clients ----

struct SlowStats {
  std::size_t connected = 0, got_408 = 0, got_other = 0, closed = 0;
  std::vector<double> answered_after_ms;  // connect -> first response byte
};

class SlowConn : public std::enable_shared_from_this<SlowConn> {
 public:
  SlowConn(asio::io_context& ctx, SlowStats& st, Clock::duration drip)
      : sock_(ctx), timer_(ctx), st_(st), drip_(drip) {}
  void Start(const tcp::endpoint& ep, std::function<void()> connected) {
    sock_.async_connect(ep, [self = shared_from_this(), connected](error_code ec) {
      connected();
      if (ec) return;
      ++self->st_.connected;
      self->t0_ = Clock::now();
      self->head_ = "POST /v1/completions HTTP/1.1\r\nhost: load\r\ncontent-type: application/json\r\n";
      asio::async_write(self->sock_, asio::buffer(self->head_), [self](error_code ec, std::size_t) {
        if (ec) return;
        self->Read();
        self->Drip();
      });
    });
  }
  void Close() {
    error_code ignored;
    timer_.cancel();
    sock_.close(ignored);
  }

 private:
  // One more byte of a never-ending header ("x-slow-N: ...") every drip interval.
  void Drip() {
    timer_.expires_after(drip_);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->done_) return;
      static constexpr char kHeader[] = "x-slow: abcdefghijklmnop\r\n";
      self->byte_ = kHeader[self->sent_++ % (sizeof(kHeader) - 1)];
      asio::async_write(self->sock_, asio::buffer(&self->byte_, 1), [self](error_code ec, std::size_t) {
        if (!ec) self->Drip();
      });
    });
  }
  void Read() {
    sock_.async_read_some(asio::buffer(rbuf_), [self = shared_from_this()](error_code ec, std::size_t n) {
      if (n > 0) {
        if (self->response_.empty()) self->st_.answered_after_ms.push_back(Ms(Clock::now() - self->t0_));
        self->response_.append(self->rbuf_.data(), n);
      }
      if (ec) return self->OnClosed();
      self->Read();
    });
  }
  void OnClosed() {
    if (done_) return;
    done_ = true;
    ++st_.closed;
    if (response_.rfind("HTTP/1.1 408 ", 0) == 0) {
      ++st_.got_408;
    } else if (!response_.empty()) {
      ++st_.got_other;
    }
    Close();
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  SlowStats& st_;
  Clock::duration drip_;
  Clock::time_point t0_;
  std::string head_, response_;
  std::array<char, 4096> rbuf_;
  char byte_ = 0;
  std::size_t sent_ = 0;
  bool done_ = false;
};

// `clients` keep-alive connections, each sending small completions back to back (with a
// short pause) for `duration`; returns their latencies.
std::vector<double> NormalTraffic(const tcp::endpoint& ep, int clients, Clock::duration duration,
                                  const std::string& model, std::size_t* errors) {
  std::vector<double> lat;
  std::vector<std::thread> threads;
  std::mutex mu;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      asio::io_context ctx;
      tcp::socket s(ctx);
      error_code ec;
      s.connect(ep, ec);
      auto req = Post(CompletionBody(model, i, 1, false));
      beast::flat_buffer buf;
      std::vector<double> mine;
      std::size_t bad = 0;
      auto end = Clock::now() + duration;
      while (!ec && Clock::now() < end) {
        auto t0 = Clock::now();
        bhttp::write(s, req, ec);
        bhttp::response<bhttp::string_body> res;
        if (!ec) bhttp::read(s, buf, res, ec);
        if (ec || res.result_int() != 200) {
          ++bad;
          break;
        }
        mine.push_back(Ms(Clock::now() - t0));
        std::this_thread::sleep_for(20ms);
      }
      std::lock_guard<std::mutex> lock(mu);
      lat.insert(lat.end(), mine.begin(), mine.end());
      *errors += bad;
    });
  }
  for (auto& t : threads) t.join();
  return lat;
}

int Slowloris(const Args& a, const tcp::endpoint& ep, int pid) {
  const auto slow = static_cast<std::size_t>(a.Num("slow", 300));
  const int normal = static_cast<int>(a.Num("normal", 16));
  const auto duration = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(a.Num("duration", 8)));
  const auto drip = std::chrono::milliseconds(static_cast<int64_t>(a.Num("drip-ms", 500)));
  const std::string model = a.Str("model", "meta-llama/Llama-3.1-8B-Instruct");

  std::size_t base_errors = 0, slow_errors = 0;
  std::vector<double> base = NormalTraffic(ep, normal, duration, model, &base_errors);

  ProcSample before = Sample(pid);
  asio::io_context ctx;
  SlowStats st;
  std::vector<std::shared_ptr<SlowConn>> conns;
  Ramp ramp(slow, 64, [&](std::size_t, std::function<void()> done) {
    auto c = std::make_shared<SlowConn>(ctx, st, drip);
    conns.push_back(c);
    c->Start(ep, std::move(done));
  });
  ramp.Start();
  std::thread loop([&] { ctx.run_for(duration + 10s); });
  // Normal traffic starts once the slow set is open.
  for (int i = 0; i < 100 && st.connected < slow; ++i) std::this_thread::sleep_for(20ms);
  ProcSample with = Sample(pid);
  std::vector<double> under = NormalTraffic(ep, normal, duration, model, &slow_errors);
  loop.join();  // slow connections end at the server's deadline (or the bound above)
  for (auto& c : conns) c->Close();
  conns.clear();
  WaitServerConnections(ep, 1, 20s);
  ProcSample after = SettledSample(pid, ep, 32);

  Out("normal_clients", normal);
  Out("baseline_requests", static_cast<double>(base.size()));
  Out("baseline_errors", static_cast<double>(base_errors));
  Out("baseline_p50_ms", Percentile(base, 0.5));
  Out("baseline_p99_ms", Percentile(base, 0.99));
  Out("slowloris_requests", static_cast<double>(under.size()));
  Out("slowloris_errors", static_cast<double>(slow_errors));
  Out("slowloris_p50_ms", Percentile(under, 0.5));
  Out("slowloris_p99_ms", Percentile(under, 0.99));
  Out("p50_ratio", Percentile(under, 0.5) / std::max(1e-9, Percentile(base, 0.5)));
  Out("p99_ratio", Percentile(under, 0.99) / std::max(1e-9, Percentile(base, 0.99)));
  Out("slow_connections", static_cast<double>(slow));
  Out("slow_connected", static_cast<double>(st.connected));
  Out("slow_got_408", static_cast<double>(st.got_408));
  Out("slow_got_other", static_cast<double>(st.got_other));
  Out("slow_closed_by_server", static_cast<double>(st.closed));
  Out("slow_408_after_min_ms", st.answered_after_ms.empty() ? 0 : *std::min_element(st.answered_after_ms.begin(), st.answered_after_ms.end()));
  Out("slow_408_after_p50_ms", Percentile(st.answered_after_ms, 0.5));
  Out("slow_408_after_max_ms", st.answered_after_ms.empty() ? 0 : *std::max_element(st.answered_after_ms.begin(), st.answered_after_ms.end()));
  OutSample("before", before);
  OutSample("with", with);
  OutSample("after", after);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::fprintf(stderr, "usage: load_connections hold|streams|slowloris --port P --pid PID [...]\n");
    return 2;
  }
  a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) {
      std::fprintf(stderr, "bad argument %s\n", argv[i]);
      return 2;
    }
    a.kv[k.substr(2)] = argv[i + 1];
  }
  tcp::endpoint ep(asio::ip::make_address(a.Str("host", "127.0.0.1")),
                   static_cast<uint16_t>(a.Num("port", 8080)));
  int pid = static_cast<int>(a.Num("pid", 0));
  if (a.mode == "hold") return Hold(a, ep, pid);
  if (a.mode == "streams") return Streams(a, ep, pid);
  if (a.mode == "slowloris") return Slowloris(a, ep, pid);
  std::fprintf(stderr, "unknown mode %s\n", a.mode.c_str());
  return 2;
}
