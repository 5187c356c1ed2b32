#include "apps/doctor/collect.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "adapters/http/client.h"

namespace kvroute::doctor {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

std::chrono::milliseconds Ms(double s) {
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000)));
}

// "2s", "500ms": how a timeout reads in an error text.
std::string DurationText(double s) {
  char buf[32];
  if (s >= 1 && std::fabs(s - std::round(s)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else if (s >= 1) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fms", s * 1000);
  }
  return buf;
}

// What an operator should read for a failed exchange: the client's own text for connect
// errors (it names the address and the OS reason), a sentence for the timeouts (the
// client says only "first_byte_timeout").
std::string ErrorText(const http::UpstreamResult& r, double timeout_s) {
  switch (r.error) {
    case http::UpstreamError::kConnectTimeout:
      return "connect: no answer within " + DurationText(timeout_s);
    case http::UpstreamError::kFirstByteTimeout:
      return "no response within " + DurationText(timeout_s);
    case http::UpstreamError::kIdleTimeout:
      return "response body stalled for " + DurationText(timeout_s);
    default:
      return r.message.empty() ? std::string(http::UpstreamErrorName(r.error)) : r.message;
  }
}

// One target's exchange in the current round.
struct Pending {
  http::UpstreamCall call;
  std::string body;
  int status = 0;
  bool too_large = false;
  bool finished = false;
  bool abandoned = false;  // cancelled by the round's deadline or the stop flag
  bool by_deadline = false;
};

class Collector {
 public:
  explicit Collector(const CollectOptions& options)
      : options_(options), client_(ctx_, ClientOptionsFor(options)),
        start_(options.origin.value_or(Clock::now())) {
    histories_.resize(options.targets.size());
    for (std::size_t i = 0; i < options.targets.size(); ++i) {
      const Target& t = options.targets[i];
      histories_[i].address = AddressOf(t);
      histories_[i].name = t.name.empty() ? histories_[i].address : t.name;
    }
  }

  std::vector<ReplicaHistory> Run() {
    const double window = std::max(0.0, options_.window_s);
    const double interval = options_.interval_s > 0 ? options_.interval_s : 2.0;
    for (int round = 0;; ++round) {
      if (Stopped()) break;
      // Rounds are scheduled on a fixed grid from the start (0, interval, 2*interval...)
      // so a slow round does not shift the later ones; the last one lands on the window's
      // end, which also gives at least two rounds for any window > 0.
      const double planned = std::min(round * interval, window);
      if (!WaitUntil(planned)) break;
      ScrapeRound();
      if (options_.on_round) options_.on_round(histories_);
      if (planned >= window) break;
    }
    client_.CloseIdle();
    return std::move(histories_);
  }

 private:
  static http::ClientOptions ClientOptionsFor(const CollectOptions& o) {
    http::ClientOptions c;
    c.connect_timeout = Ms(o.timeout_s);
    c.first_byte_timeout = Ms(o.timeout_s);
    c.idle_timeout = Ms(o.timeout_s);
    // Keep each connection from one round to the next so a scrape does not pay a
    // handshake each time (a peer that closed it meanwhile: the client resends the request
    // on a fresh one).
    c.pool_idle_timeout = Ms(std::max(4.0, o.interval_s * 2 + 1));
    return c;
  }

  static std::string AddressOf(const Target& t) {
    const bool v6 = t.host.find(':') != std::string::npos;
    return (v6 ? "[" + t.host + "]" : t.host) + ":" + std::to_string(t.port);
  }

  double Now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool Stopped() const { return options_.stop != nullptr && options_.stop->load(); }

  // Sleeps until `t_s` (collection clock), polling the stop flag; false when stopped.
  bool WaitUntil(double t_s) {
    while (true) {
      if (Stopped()) return false;
      const double left = t_s - Now();
      if (left <= 0) return true;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.05)));
    }
  }

  // Scrapes every target at once and returns when each has answered, failed, hit the
  // round's deadline (timeout_s: the client's timeouts bound each phase, not a body
  // trickling in forever) or the stop flag was raised.
  void ScrapeRound() {
    const std::size_t n = options_.targets.size();
    std::vector<std::shared_ptr<Pending>> pending(n);
    std::size_t open = n;
    const double started = Now();
    const double deadline = started + options_.timeout_s;
    round_starts_.push_back(started);
    for (std::size_t i = 0; i < n; ++i) {
      auto p = std::make_shared<Pending>();
      pending[i] = p;
      const Target& t = options_.targets[i];
      http::UpstreamRequest req;
      req.method = boost::beast::http::verb::get;
      req.target = "/metrics";
      http::UpstreamCallbacks cb;
      cb.on_head = [p](const http::ResponseHead& h) { p->status = h.status; };
      cb.on_data = [this, p](std::string_view d) {
        if (p->body.size() + d.size() > options_.max_body_bytes) {
          p->too_large = true;
          p->body.clear();
          p->call.Cancel();
          return;
        }
        p->body.append(d);
      };
      cb.on_done = [this, p, i, &open](http::UpstreamResult&& r) {
        p->finished = true;
        --open;
        if (p->abandoned && !p->by_deadline) return;  // stopped: the round is cut short
        Record(i, *p, r);
      };
      p->call = client_.Start(t.host, t.port, req, std::move(cb));
    }
    // A watchdog on the same loop: the stop flag is another thread's, so it is polled.
    asio::steady_timer watchdog(ctx_);
    bool armed = false;
    std::function<void()> arm = [&] {
      armed = true;
      watchdog.expires_after(std::chrono::milliseconds(50));
      watchdog.async_wait([&](boost::system::error_code ec) {
        armed = false;
        if (ec || open == 0) return;
        const bool stop = Stopped();
        if (stop || Now() >= deadline) {
          for (auto& p : pending) {
            if (p->finished) continue;
            p->abandoned = true;
            p->by_deadline = !stop;
            p->call.Cancel();
          }
          return;
        }
        arm();
      });
    };
    if (open > 0) arm();
    // Not run(): kept-alive connections leave work on the loop (their idle timers), so
    // run() would wait for them; the round is over when every scrape is.
    while (open > 0 && ctx_.run_one() > 0) {
    }
    if (armed) {
      watchdog.cancel();
      while (armed && ctx_.run_one() > 0) {
      }  // its handler refers to this frame: let it finish here
    }
    if (ctx_.stopped()) ctx_.restart();
    // Each call's callbacks hold its Pending, which holds the call: break the cycle.
    for (auto& p : pending) p->call = {};
    if (options_.keep_s > 0) Trim();
  }

  // Drops whole rounds, the same ones from every history, so the i-th scrape of each
  // replica stays the same round (the lopsided-kv rule compares replicas round by round).
  void Trim() {
    if (round_starts_.empty()) return;
    const double oldest = round_starts_.back() - options_.keep_s;
    std::size_t drop = 0;
    while (drop < round_starts_.size() && round_starts_[drop] < oldest - 1e-9) ++drop;
    if (drop == 0) return;
    round_starts_.erase(round_starts_.begin(),
                        round_starts_.begin() + static_cast<std::ptrdiff_t>(drop));
    for (ReplicaHistory& h : histories_) {
      const std::size_t n = std::min(drop, h.scrapes.size());
      h.scrapes.erase(h.scrapes.begin(), h.scrapes.begin() + static_cast<std::ptrdiff_t>(n));
    }
  }

  void Record(std::size_t i, const Pending& p, const http::UpstreamResult& r) {
    const double t = Now();
    ReplicaHistory& h = histories_[i];
    if (p.too_large) {
      const std::size_t max = options_.max_body_bytes;
      h.scrapes.push_back(
          FailedScrape("/metrics body larger than " + (max >= (1u << 20) && max % (1u << 20) == 0
                                                           ? std::to_string(max >> 20) + " MiB"
                                                           : std::to_string(max) + " bytes"),
                       t));
    } else if (p.by_deadline) {
      h.scrapes.push_back(
          FailedScrape("no complete response within " + DurationText(options_.timeout_s), t));
    } else if (!r.ok()) {
      h.scrapes.push_back(FailedScrape(ErrorText(r, options_.timeout_s), t));
    } else if (p.status != 200) {
      h.scrapes.push_back(FailedScrape("HTTP " + std::to_string(p.status), t));
    } else {
      h.scrapes.push_back(ParseScrape(p.body, t));
    }
  }

  const CollectOptions& options_;
  asio::io_context ctx_;
  http::UpstreamClient client_;
  const Clock::time_point start_;
  std::vector<ReplicaHistory> histories_;
  std::vector<double> round_starts_;  // kept in step with the histories (keep_s)
};

}  // namespace

std::vector<ReplicaHistory> Collect(const CollectOptions& options) {
  return Collector(options).Run();
}

}  // namespace kvroute::doctor
