#include "apps/bench/load_generator.h"

#include <simdjson.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "apps/bench/request_body.h"
#include "apps/bench/sse.h"
#include "core/engine/engine.h"
#include "simkit/workload/oracle.h"
#include "adapters/http/client.h"
#include "adapters/scrape/scraper.h"

namespace kvroute::bench {
namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The report's error kind for an HTTP status the server answered with.
report::ErrorKind KindForStatus(int status) {
  if (status == 429) return report::ErrorKind::kShed;
  if (status == 503) return report::ErrorKind::kNoEndpoint;
  if (status == 408 || status == 504) return report::ErrorKind::kTimeout;
  if (status >= 400 && status < 500) return report::ErrorKind::kRejected;
  return report::ErrorKind::kUpstream;
}

report::ErrorKind KindForUpstream(http::UpstreamError e) {
  switch (e) {
    case http::UpstreamError::kNone:
      return report::ErrorKind::kNone;
    case http::UpstreamError::kConnectTimeout:
    case http::UpstreamError::kFirstByteTimeout:
    case http::UpstreamError::kIdleTimeout:
      return report::ErrorKind::kTimeout;
    case http::UpstreamError::kCancelled:
      return report::ErrorKind::kAborted;
    default:
      return report::ErrorKind::kUpstream;
  }
}

std::vector<metrics::ScrapeTarget> ScrapeTargets(const std::vector<HostPort>& fleet) {
  std::vector<metrics::ScrapeTarget> targets;
  targets.reserve(fleet.size());
  for (const HostPort& hp : fleet) targets.push_back({hp.host, hp.port});
  return targets;
}

metrics::ScraperOptions ScrapeOptions(const BenchConfig& cfg) {
  metrics::ScraperOptions o;
  o.interval_s = cfg.scrape_interval_s;
  // A loaded replica may be slow to render /metrics; a scrape is not worth failing early.
  o.timeout_s = std::max(2.0, cfg.scrape_interval_s * 8);
  o.connect_timeout_s = cfg.connect_timeout_s;
  o.names = metrics::MetricNames::For(cfg.engine_type);
  return o;
}

// The run's view of the fleet, on top of metrics::MetricsScraper: a round of every
// replica once before the run, rounds every scrape interval during it (each complete
// round one FleetRecorder sample), one round after. Rounds rather than the scraper's own
// per-endpoint ticks so that every fleet sample is one read of every replica.
class FleetScraper {
 public:
  FleetScraper(asio::io_context& ctx, const BenchConfig& cfg)
      : cfg_(cfg),
        scraper_(ctx, ScrapeTargets(cfg.fleet), ScrapeOptions(cfg),
                 [] { return Seconds(Clock::now().time_since_epoch()); },
                 [this](uint32_t i, const metrics::EndpointSnapshot& s) { OnScrape(i, s); }),
        timer_(ctx),
        first_(cfg.fleet.size()) {
    if (!cfg.fleet.empty()) {
      recorder_ = std::make_unique<report::FleetRecorder>(static_cast<int>(cfg.fleet.size()));
    }
    kv_.resize(cfg.fleet.size());
    waiting_.resize(cfg.fleet.size());
  }

  bool empty() const { return cfg_.fleet.empty(); }

  // Scrapes every replica once; `done` runs when all have answered or failed.
  void Round(std::function<void()> done) {
    ++rounds_in_flight_;
    scraper_.ScrapeAll([this, done = std::move(done)] {
      --rounds_in_flight_;
      OnRound();
      done();
    });
  }

  void StartPeriodic(Clock::time_point t0) {
    t0_ = t0;
    recording_ = true;
    periodic_ = true;
    Arm();
  }
  void StopPeriodic() {
    periodic_ = false;
    timer_.cancel();
  }
  // Stops adding samples to the recorder (the final scrape is not "during" the run).
  void StopRecording() { recording_ = false; }

  report::FleetRecorder* recorder() { return recorder_.get(); }
  std::vector<ReplicaScrape> scrapes() const {
    std::vector<ReplicaScrape> out(cfg_.fleet.size());
    for (uint32_t i = 0; i < out.size(); ++i) {
      const auto snap = scraper_.Snapshot(i);
      ReplicaScrape& r = out[i];
      r.address = cfg_.fleet[i];
      r.ok_before = first_[i].has_value();
      if (r.ok_before) r.before = *first_[i];
      r.ok_after = snap->successes > 0;
      r.after = snap->metrics;  // the last successful scrape's
      r.scrapes_ok = static_cast<int64_t>(snap->successes);
      r.scrapes_failed = static_cast<int64_t>(snap->failures);
    }
    return out;
  }
  // Latest KV min/max across replicas and running hit rate, for progress.
  void Latest(double* kv_min, double* kv_max, double* hit_rate) const {
    *kv_min = *kv_max = 0.0;
    bool any = false;
    const std::vector<ReplicaScrape> all = scrapes();
    for (const ReplicaScrape& r : all) {
      if (!r.ok_after) continue;
      const double kv = r.after.kv_usage;
      *kv_min = any ? std::min(*kv_min, kv) : kv;
      *kv_max = any ? std::max(*kv_max, kv) : kv;
      any = true;
    }
    *hit_rate = HitRateFromScrapes(all);
  }

 private:
  void OnScrape(uint32_t i, const metrics::EndpointSnapshot& snap) {
    // The counters at the first successful read are the run's baseline.
    if (snap.ok && !first_[i]) first_[i] = snap.metrics;
  }

  // A round ended: one fleet sample, if every replica has ever been read.
  void OnRound() {
    if (!recording_ || !recorder_) return;
    for (uint32_t k = 0; k < kv_.size(); ++k) {
      const auto snap = scraper_.Snapshot(k);
      if (snap->successes == 0) return;
      kv_[k] = snap->metrics.kv_usage;
      waiting_[k] = snap->metrics.waiting;
    }
    recorder_->AddSample(Seconds(Clock::now() - t0_), kv_, waiting_);
  }

  void Arm() {
    if (!periodic_) return;
    timer_.expires_after(Ms(cfg_.scrape_interval_s));
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || !periodic_) return;
      if (rounds_in_flight_ == 0) Round([] {});  // a slow fleet skips ticks
      Arm();
    });
  }

  const BenchConfig& cfg_;
  metrics::MetricsScraper scraper_;
  asio::steady_timer timer_;
  std::vector<std::optional<metrics::EngineMetrics>> first_;  // per replica
  std::unique_ptr<report::FleetRecorder> recorder_;
  std::vector<double> kv_, waiting_;
  Clock::time_point t0_;
  bool periodic_ = false;
  bool recording_ = false;
  int rounds_in_flight_ = 0;
};

class Runner {
 public:
  Runner(asio::io_context& ctx, const BenchConfig& cfg, BenchResult* out)
      : ctx_(ctx),
        cfg_(cfg),
        out_(out),
        client_(ctx, MakeClientOptions(cfg)),
        scraper_(ctx, cfg),
        generator_(cfg.workload, cfg.arrivals, cfg.seed),
        arrival_timer_(ctx),
        drain_timer_(ctx),
        tick_timer_(ctx) {
    multi_turn_ = cfg.workload.kind == workload::WorkloadKind::kMultiTurn;
    output_text_ = [this](uint64_t id, int32_t tokens, std::string* text) {
      auto it = outputs_.find(id);
      if (it != outputs_.end()) {
        text->append(it->second);
      } else {
        // The turn failed or was cut short: stand-in text of the planned length keeps the
        // prompt's size as the workload meant it.
        workload::AppendSegmentText(Mix64(id ^ 0x6f7574ULL), tokens, text);
      }
    };
    // A router names the replica that served a response (x-kvroute-endpoint, the
    // endpoint's name, by default its address): map it to the fleet index.
    for (size_t i = 0; i < cfg.fleet.size(); ++i) {
      endpoint_index_.emplace(cfg.fleet[i].ToString(), static_cast<int32_t>(i));
    }
    if (cfg.arrivals.num_requests > 0) {
      out_->records.reserve(static_cast<size_t>(cfg.arrivals.num_requests));
    }
  }

  void Begin() {
    wall_start_ = Clock::now();
    Tick();
    DiscoverModel([this] { scraper_.Round([this] { StartRun(); }); });
  }

 private:
  struct Req {
    workload::RequestSpec spec;
    size_t record = 0;
    std::string body;
    std::string error_body;
    std::string output;  // generated text (multi-turn only)
    std::vector<workload::PrefixExtent> extents;
    SseSplitter sse;
    Clock::time_point sent, last_token;
    int status = 0;
    int64_t chunks = 0;
    bool saw_done = false;
    bool stream_error = false;
    int64_t stream_error_code = 0;
    bool has_usage = false;
    int64_t usage_prompt = 0, usage_completion = 0, usage_cached = -1;
    size_t slot = 0;  // index in in_flight_
    http::UpstreamCall call;
  };

  static http::ClientOptions MakeClientOptions(const BenchConfig& cfg) {
    http::ClientOptions o;
    o.connect_timeout = Ms(cfg.connect_timeout_s);
    o.first_byte_timeout = Ms(cfg.first_byte_timeout_s);
    o.idle_timeout = Ms(cfg.idle_timeout_s);
    o.max_idle_per_endpoint = 4096;
    return o;
  }

  double Now() const { return Seconds(Clock::now() - t0_); }

  void DiscoverModel(std::function<void()> next) {
    if (!cfg_.model.empty()) {
      model_ = cfg_.model;
      asio::post(ctx_, std::move(next));
      return;
    }
    auto body = std::make_shared<std::string>();
    auto status = std::make_shared<int>(0);
    http::UpstreamRequest req;
    req.method = bhttp::verb::get;
    req.target = "/v1/models";
    req.headers = &cfg_.headers;
    req.first_byte_timeout = Ms(10.0);
    http::UpstreamCallbacks cb;
    cb.on_head = [status](const http::ResponseHead& h) { *status = h.status; };
    cb.on_data = [body](std::string_view d) {
      if (body->size() < (1u << 20)) body->append(d);
    };
    cb.on_done = [this, body, status, next = std::move(next)](http::UpstreamResult&& r) {
      if (r.ok() && *status == 200) {
        simdjson::dom::parser parser;
        simdjson::dom::element root;
        std::string_view id;
        if (parser.parse(*body).get(root) == simdjson::SUCCESS &&
            root["data"].at(0)["id"].get_string().get(id) == simdjson::SUCCESS) {
          model_ = std::string(id);
        }
      }
      if (model_.empty()) model_ = engine::EngineConfig{}.model_name;
      next();
    };
    client_.Start(cfg_.target.host, cfg_.target.port, req, std::move(cb));
  }

  void StartRun() {
    out_->model = model_;
    t0_ = Clock::now();
    started_ = true;
    if (abandoned_) {  // stopped before the first request
      MaybeFinish();
      return;
    }
    if (!scraper_.empty()) scraper_.StartPeriodic(t0_);
    has_next_ = generator_.Next(&next_);
    if (!has_next_) {
      ArrivalsDone();
      return;
    }
    ArmArrival();
  }

  void ArmArrival() {
    arrival_timer_.expires_at(t0_ + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(next_.arrival_s)));
    arrival_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || arrivals_done_) return;
      OnArrival();
    });
  }

  void OnArrival() {
    // Everything due (timer lateness included) goes now, in arrival order.
    const double now = Now();
    while (has_next_ && next_.arrival_s <= now + 1e-4) {
      Dispatch(std::move(next_));
      has_next_ = generator_.Next(&next_);
    }
    if (has_next_) {
      ArmArrival();
    } else {
      ArrivalsDone();
    }
  }

  void ArrivalsDone() {
    if (arrivals_done_) return;
    arrivals_done_ = true;
    arrival_timer_.cancel();
    drain_timer_.expires_after(Ms(cfg_.drain_timeout_s));
    drain_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) Abandon();
    });
    MaybeFinish();
  }

  // Multi-turn: a turn waits for the one it follows.
  void Dispatch(workload::RequestSpec&& spec) {
    if (spec.after_request >= 0) {
      const uint64_t dep = static_cast<uint64_t>(spec.after_request);
      auto it = finished_at_.find(dep);
      if (it == finished_at_.end()) {
        parked_.emplace(dep, std::move(spec));
        return;
      }
      const double ready = std::max(spec.arrival_s, it->second + spec.think_time_s);
      finished_at_.erase(it);  // each request has at most one follower
      if (ready > Now()) {
        Delay(std::move(spec), ready);
        return;
      }
    }
    MakeReady(std::move(spec));
  }

  void Delay(workload::RequestSpec&& spec, double at_s) {
    const uint64_t id = spec.id;
    auto& d = delayed_[id];
    d.spec = std::move(spec);
    d.timer = std::make_unique<asio::steady_timer>(ctx_);
    d.timer->expires_at(t0_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(at_s)));
    d.timer->async_wait([this, id](boost::system::error_code ec) {
      if (ec) return;
      auto it = delayed_.find(id);
      if (it == delayed_.end()) return;
      workload::RequestSpec s = std::move(it->second.spec);
      delayed_.erase(it);
      MakeReady(std::move(s));
    });
  }

  void MakeReady(workload::RequestSpec&& spec) {
    if (cfg_.arrivals.max_concurrency > 0 &&
        static_cast<int64_t>(in_flight_.size()) >= cfg_.arrivals.max_concurrency) {
      held_.push_back(std::move(spec));
      return;
    }
    Send(std::move(spec));
  }

  Req* AcquireReq() {
    if (free_.empty()) return new Req();
    Req* r = free_.back().release();
    free_.pop_back();
    return r;
  }

  void ReleaseReq(Req* r) {
    r->sse.Reset();
    r->error_body.clear();
    r->output.clear();
    r->status = 0;
    r->chunks = 0;
    r->saw_done = r->stream_error = r->has_usage = false;
    r->stream_error_code = 0;
    r->usage_prompt = r->usage_completion = 0;
    r->usage_cached = -1;
    r->call = http::UpstreamCall();
    free_.emplace_back(r);
  }

  void Send(workload::RequestSpec&& spec) {
    Req* r = AcquireReq();
    r->spec = std::move(spec);
    const workload::RequestSpec& s = r->spec;
    BuildRequestBody(s, model_, output_text_, &scratch_, &r->body);
    // The oracle needs the prompt's segment extents as the server will see them.
    workload::RenderPrompt(s, output_text_, &scratch_, &r->extents);
    oracle_.Observe(r->extents,
                    static_cast<int64_t>(scratch_.size()) / workload::kBytesPerToken);
    if (multi_turn_ && s.turn + 1 >= cfg_.workload.max_turns) {
      // The conversation's last turn: earlier outputs are no longer needed.
      for (const workload::Segment& seg : s.segments) {
        if (seg.is_output) outputs_.erase(seg.key);
      }
    }
    r->record = out_->records.size();
    report::RequestRecord& rec = out_->records.emplace_back();
    rec.id = s.id;
    rec.prompt_tokens = s.prompt_tokens;
    r->sent = Clock::now();
    rec.send_s = Seconds(r->sent - t0_);
    r->slot = in_flight_.size();
    in_flight_.push_back(r);
    ++sent_;

    http::UpstreamRequest req;
    req.method = bhttp::verb::post;
    req.target = RequestTarget(s);
    req.body = r->body;
    req.headers = &cfg_.headers;
    http::UpstreamCallbacks cb;
    cb.on_head = [this, r](const http::ResponseHead& h) {
      r->status = h.status;
      if (!endpoint_index_.empty() && h.fields) {
        auto it = h.fields->find("x-kvroute-endpoint");
        if (it != h.fields->end()) {
          auto ep = endpoint_index_.find(std::string_view(it->value().data(), it->value().size()));
          if (ep != endpoint_index_.end()) out_->records[r->record].endpoint = ep->second;
        }
      }
    };
    cb.on_data = [this, r](std::string_view d) { OnData(r, d); };
    cb.on_done = [this, r](http::UpstreamResult&& res) { OnDone(r, res); };
    r->call = client_.Start(cfg_.target.host, cfg_.target.port, req, std::move(cb));
  }

  void OnData(Req* r, std::string_view data) {
    if (r->status != 200) {
      if (r->error_body.size() < 4096) r->error_body.append(data.substr(0, 4096));
      return;
    }
    const Clock::time_point now = Clock::now();
    report::RequestRecord& rec = out_->records[r->record];
    r->sse.Feed(data, [&](std::string_view payload) {
      const StreamEvent ev = parser_.Parse(payload);
      switch (ev.kind) {
        case StreamEvent::Kind::kDone:
          r->saw_done = true;
          return;
        case StreamEvent::Kind::kError:
          r->stream_error = true;
          r->stream_error_code = ev.error_code;
          return;
        case StreamEvent::Kind::kInvalid:
          return;
        case StreamEvent::Kind::kChunk:
          break;
      }
      if (!ev.text.empty()) {
        if (r->chunks == 0) {
          rec.ttft_s = Seconds(now - r->sent);
        } else {
          const double gap = Seconds(now - r->last_token);
          out_->gaps.Add(gap);
          rec.max_itl_s = std::max(rec.max_itl_s, gap);
        }
        r->last_token = now;
        ++r->chunks;
        if (multi_turn_) r->output.append(ev.text);
      }
      if (ev.has_usage) {
        r->has_usage = true;
        r->usage_prompt = ev.prompt_tokens;
        r->usage_completion = ev.completion_tokens;
        r->usage_cached = ev.cached_tokens;
      }
    });
  }

  void OnDone(Req* r, const http::UpstreamResult& res) {
    report::RequestRecord& rec = out_->records[r->record];
    const Clock::time_point now = Clock::now();
    std::string detail;
    report::ErrorKind kind = report::ErrorKind::kNone;
    if (!res.ok() && !(res.head_received && r->saw_done && r->status == 200)) {
      kind = KindForUpstream(res.error);
      detail = http::UpstreamErrorName(res.error);
    } else if (r->status != 200) {
      kind = KindForStatus(r->status);
      detail = "http_" + std::to_string(r->status);
    } else if (r->stream_error) {
      kind = r->stream_error_code >= 400 ? KindForStatus(static_cast<int>(r->stream_error_code))
                                         : report::ErrorKind::kUpstream;
      detail = "stream_error";
    } else if (!r->saw_done) {
      kind = report::ErrorKind::kUpstream;
      detail = "truncated";
    }
    rec.error = kind;
    if (r->has_usage) {
      rec.prompt_tokens = r->usage_prompt;
      rec.cached_tokens = r->usage_cached;
      rec.output_tokens = r->usage_completion;
    } else {
      rec.output_tokens = r->chunks;
    }
    if (kind == report::ErrorKind::kNone) {
      rec.e2e_s = Seconds((r->chunks > 0 ? r->last_token : now) - r->sent);
      if (rec.ttft_s < 0) rec.ttft_s = rec.e2e_s;  // zero-token answer: first byte = last
      ok_output_tokens_ += rec.output_tokens;
      if (rec.ttft_s >= 0) recent_ttft_.push_back(rec.ttft_s);
    } else {
      ++errors_;
      ++out_->error_details[detail];
    }
    ++finished_;
    const uint64_t id = r->spec.id;
    const int32_t r_turn = r->spec.turn;
    if (multi_turn_) {
      // Later turns quote this output; the oracle learns that it is now cached.
      if (r->spec.turn + 1 < cfg_.workload.max_turns) {
        r->extents.push_back({id, static_cast<uint32_t>(r->output.size())});
        oracle_.Insert(r->extents);
        outputs_[id] = std::move(r->output);
      }
    }
    // Out of the in-flight list (swap-remove).
    Req* last = in_flight_.back();
    in_flight_[r->slot] = last;
    last->slot = r->slot;
    in_flight_.pop_back();
    ReleaseReq(r);

    const double finish_s = Seconds(now - t0_);
    auto parked = parked_.find(id);
    if (parked != parked_.end()) {
      workload::RequestSpec next = std::move(parked->second);
      parked_.erase(parked);
      const double ready = std::max(next.arrival_s, finish_s + next.think_time_s);
      if (abandoned_) {
        ++out_->not_sent;
      } else if (ready > finish_s) {
        Delay(std::move(next), ready);
      } else {
        MakeReady(std::move(next));
      }
    } else if (multi_turn_ && !abandoned_ && r_turn + 1 < cfg_.workload.max_turns) {
      finished_at_[id] = finish_s;
    }
    while (!held_.empty() && !abandoned_ &&
           (cfg_.arrivals.max_concurrency <= 0 ||
            static_cast<int64_t>(in_flight_.size()) < cfg_.arrivals.max_concurrency)) {
      workload::RequestSpec s = std::move(held_.front());
      held_.pop_front();
      Send(std::move(s));
    }
    MaybeFinish();
  }

  // Drain over (or stop requested): drop what was not sent, cancel what is in flight.
  void Abandon() {
    if (abandoned_) return;
    abandoned_ = true;
    if (!arrivals_done_) {
      arrivals_done_ = true;
      arrival_timer_.cancel();
      if (has_next_) ++out_->not_sent;
      workload::RequestSpec s;
      while (generator_.Next(&s)) ++out_->not_sent;
      has_next_ = false;
    }
    out_->not_sent += static_cast<int64_t>(parked_.size() + delayed_.size() + held_.size());
    parked_.clear();
    delayed_.clear();
    held_.clear();
    std::vector<Req*> cancel = in_flight_;
    for (Req* r : cancel) r->call.Cancel();
    MaybeFinish();
  }

  void MaybeFinish() {
    if (!started_ || finishing_ || !arrivals_done_) return;
    if (!in_flight_.empty() || !parked_.empty() || !delayed_.empty() || !held_.empty()) return;
    finishing_ = true;
    drain_timer_.cancel();
    scraper_.StopPeriodic();
    scraper_.StopRecording();
    scraper_.Round([this] { Finish(); });
  }

  void Finish() {
    tick_timer_.cancel();
    BenchResult& out = *out_;
    out.replicas = scraper_.scrapes();
    for (const ReplicaScrape& s : out.replicas) {
      if (!s.ok_before || !s.ok_after) continue;
      out.totals.prefix_queries_tokens += static_cast<int64_t>(
          std::max(0.0, s.after.prefix_queries - s.before.prefix_queries));
      out.totals.prefix_hits_tokens +=
          static_cast<int64_t>(std::max(0.0, s.after.prefix_hits - s.before.prefix_hits));
      out.totals.preemptions +=
          static_cast<int64_t>(std::max(0.0, s.after.preemptions - s.before.preemptions));
      out.waiting_after += s.after.waiting;
    }
    if (oracle_.queried_tokens() > 0) out.totals.oracle_hit_rate = oracle_.HitRate();
    out.wall_s = Seconds(Clock::now() - wall_start_);
    ctx_.stop();
  }

  void Tick() {
    tick_timer_.expires_after(std::chrono::milliseconds(100));
    tick_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || finishing_) return;
      if (cfg_.stop && cfg_.stop->load(std::memory_order_relaxed) && !abandoned_) {
        Abandon();
        if (finishing_) return;
      }
      if (started_ && cfg_.on_progress &&
          Clock::now() - last_progress_ >= Ms(cfg_.progress_interval_s)) {
        last_progress_ = Clock::now();
        Progress p;
        p.elapsed_s = Now();
        p.sent = sent_;
        p.finished = finished_;
        p.in_flight = static_cast<int64_t>(in_flight_.size());
        p.errors = errors_;
        p.output_tokens = ok_output_tokens_;
        p.last_ttft_p50_s = report::Percentile(recent_ttft_, 50);
        recent_ttft_.clear();
        scraper_.Latest(&p.kv_min, &p.kv_max, &p.hit_rate);
        cfg_.on_progress(p);
      }
      Tick();
    });
  }

  struct Delayed {
    workload::RequestSpec spec;
    std::unique_ptr<asio::steady_timer> timer;
  };

  asio::io_context& ctx_;
  const BenchConfig& cfg_;
  BenchResult* out_;
  http::UpstreamClient client_;
  FleetScraper scraper_;
  workload::RequestGenerator generator_;
  asio::steady_timer arrival_timer_, drain_timer_, tick_timer_;
  std::string model_;
  std::map<std::string, int32_t, std::less<>> endpoint_index_;
  bool multi_turn_ = false;
  workload::OutputTextFn output_text_;
  StreamEventParser parser_;
  workload::PrefixOracle oracle_;
  std::string scratch_;

  Clock::time_point wall_start_, t0_, last_progress_;
  bool started_ = false, arrivals_done_ = false, abandoned_ = false, finishing_ = false;
  workload::RequestSpec next_;
  bool has_next_ = false;

  std::vector<Req*> in_flight_;
  std::vector<std::unique_ptr<Req>> free_;
  std::unordered_map<uint64_t, workload::RequestSpec> parked_;  // by the request they follow
  std::unordered_map<uint64_t, Delayed> delayed_;               // by their own id
  std::deque<workload::RequestSpec> held_;                      // over max_concurrency
  std::unordered_map<uint64_t, double> finished_at_;            // multi-turn: finish times
  std::unordered_map<uint64_t, std::string> outputs_;           // multi-turn: generated text

  int64_t sent_ = 0, finished_ = 0, errors_ = 0, ok_output_tokens_ = 0;
  std::vector<double> recent_ttft_;

 public:
  ~Runner() {
    for (Req* r : in_flight_) delete r;
  }
  report::FleetRecorder* recorder() { return scraper_.recorder(); }
};

}  // namespace

double HitRateFromScrapes(const std::vector<ReplicaScrape>& replicas) {
  double q = 0, h = 0;
  for (const ReplicaScrape& s : replicas) {
    if (!s.ok_before || !s.ok_after) continue;
    q += std::max(0.0, s.after.prefix_queries - s.before.prefix_queries);
    h += std::max(0.0, s.after.prefix_hits - s.before.prefix_hits);
  }
  return q > 0 ? h / q : -1.0;
}

BenchResult RunBench(const BenchConfig& config) {
  BenchResult out;
  if (Status st = config.workload.Validate(); !st.ok()) {
    out.error = "workload: " + st.message();
    return out;
  }
  if (Status st = config.arrivals.Validate(); !st.ok()) {
    out.error = "arrivals: " + st.message();
    return out;
  }
  if (config.target.host.empty() || config.target.port == 0) {
    out.error = "no target";
    return out;
  }
  asio::io_context ctx;
  {
    Runner runner(ctx, config, &out);
    runner.Begin();
    ctx.run();
    if (report::FleetRecorder* rec = runner.recorder()) {
      out.fleet = std::make_unique<report::FleetRecorder>(*rec);
    }
  }
  out.summary = report::Summarize(config.label, out.records, config.slo, out.totals, &out.gaps,
                                  out.fleet.get());
  out.summary.wall_s = out.wall_s;
  return out;
}

}  // namespace kvroute::bench
