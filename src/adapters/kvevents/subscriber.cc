#include "adapters/kvevents/subscriber.h"

#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <vector>
#include <zmq.hpp>

#include "core/kvevents/sequence.h"
#include "adapters/kvevents/codec.h"
#include "adapters/kvevents/zmq_util.h"

namespace kvroute::kvevents {

namespace {

using Clock = std::chrono::steady_clock;

// A source's counters as the subscriber thread updates them.
struct AtomicCounters {
  std::atomic<uint64_t> batches{0}, replayed{0}, events_stored{0}, events_removed{0},
      events_cleared{0}, events_unknown{0}, gaps{0}, gaps_repaired{0}, replay_requests{0},
      duplicates{0}, restarts{0}, decode_errors{0}, last_seq{0};
  std::atomic<bool> has_last{false};
};

// One publisher's seq stream.
struct Stream {
  Stream(bool can_replay, size_t max_held) : tracker(can_replay, max_held) {}
  SequenceTracker tracker;
  std::string topic;            // as last seen
  std::string replay_endpoint;  // "" none
  std::unique_ptr<zmq::socket_t> dealer;
  std::optional<Clock::time_point> deadline;  // a replay is running
};

struct Source {
  std::string name;
  ReportCallback callback;
  bool bound = false;
  std::unique_ptr<zmq::socket_t> sub;
  std::map<std::string, std::unique_ptr<Stream>> streams;   // by topic (bound) or ""
  std::map<std::string, std::string> topic_replay;          // bound: topic -> replay endpoint
  std::shared_ptr<AtomicCounters> counters;
};

// Receives one whole multipart message without blocking; false when none is waiting.
bool RecvMultipart(zmq::socket_t& s, std::vector<zmq::message_t>* frames) {
  frames->clear();
  while (true) {
    zmq::message_t msg;
    if (!s.recv(msg, zmq::recv_flags::dontwait)) return !frames->empty();
    const bool more = msg.more();
    frames->push_back(std::move(msg));
    if (!more) return true;
  }
}

}  // namespace

std::string_view ReportKindName(ReportKind k) {
  switch (k) {
    case ReportKind::kBatch: return "batch";
    case ReportKind::kReplayed: return "replayed";
    case ReportKind::kGap: return "gap";
    case ReportKind::kRestart: return "restart";
    case ReportKind::kDecodeError: return "decode_error";
  }
  return "?";
}

struct Subscriber::Impl {
  explicit Impl(SubscriberOptions o) : options(o) {}

  SubscriberOptions options;
  zmq::context_t ctx{1};
  Waker waker;
  std::thread thread;

  std::mutex mu;
  std::deque<std::function<void()>> commands;  // guarded by mu
  bool stopped = false;                        // guarded by mu
  std::atomic<bool> stop{false};

  mutable std::mutex counters_mu;
  std::unordered_map<std::string, std::shared_ptr<AtomicCounters>> counters;  // guarded

  // The thread's own state.
  std::map<std::string, std::unique_ptr<Source>> sources;

  // Runs `fn` on the subscriber thread and returns its result; `stopped_value` when the
  // subscriber has stopped.
  template <typename T>
  T Call(std::function<T()> fn, T stopped_value) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
    std::future<T> result = task->get_future();
    {
      std::lock_guard lock(mu);
      if (stopped) return stopped_value;
      commands.push_back([task] { (*task)(); });
    }
    waker.Notify();
    return result.get();
  }

  void Run();
  void RunCommands();
  void OnLive(Source& src, std::vector<zmq::message_t>& frames);
  void OnReplayReply(Source& src, Stream& st, std::vector<zmq::message_t>& frames);
  void OnTimeout(Source& src, Stream& st);
  void Execute(Source& src, Stream& st, std::vector<SeqStep>& steps);
  bool SendReplayRequest(Source& src, Stream& st, uint64_t from);
  void Emit(Source& src, Report&& r) {
    if (src.callback) src.callback(r);
  }
  // A source named `name` with its counters, not yet subscribed or added.
  static std::unique_ptr<Source> NewSource(const std::string& name, ReportCallback callback) {
    auto src = std::make_unique<Source>();
    src->name = name;
    src->callback = std::move(callback);
    src->counters = std::make_shared<AtomicCounters>();
    return src;
  }
  // Opens `src`'s SUB socket for messages whose topic starts with `topic` (before its
  // connect or bind). Throws zmq::error_t.
  void Subscribe(Source& src, const std::string& topic) {
    src.sub = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::sub);
    src.sub->set(zmq::sockopt::linger, 0);
    src.sub->set(zmq::sockopt::rcvhwm, options.rcvhwm);
    src.sub->set(zmq::sockopt::subscribe, topic);
  }
  // Adds `src` to the sources read and its counters to those Counters() reports.
  void AddSource(std::unique_ptr<Source> src) {
    {
      std::lock_guard lock(counters_mu);
      counters[src->name] = src->counters;
    }
    const std::string name = src->name;
    sources.emplace(name, std::move(src));
  }
  // A report of `kind` from `src` about the message `seq` of `topic`.
  static Report ReportOf(ReportKind kind, const Source& src, const std::string& topic,
                         uint64_t seq) {
    Report r;
    r.kind = kind;
    r.source = src.name;
    r.topic = topic;
    r.seq = seq;
    return r;
  }
  void DecodeError(Source& src, const std::string& topic, uint64_t seq, std::string message) {
    ++src.counters->decode_errors;
    Report r = ReportOf(ReportKind::kDecodeError, src, topic, seq);
    r.message = std::move(message);
    Emit(src, std::move(r));
  }
  Stream& StreamFor(Source& src, const std::string& key) {
    auto it = src.streams.find(key);
    if (it != src.streams.end()) return *it->second;
    std::string replay;
    if (auto t = src.topic_replay.find(key); t != src.topic_replay.end()) replay = t->second;
    auto st = std::make_unique<Stream>(!replay.empty(), options.max_held);
    st->replay_endpoint = replay;
    st->topic = key;
    return *src.streams.emplace(key, std::move(st)).first->second;
  }
};

Subscriber::Subscriber(SubscriberOptions options) : impl_(std::make_unique<Impl>(options)) {
  impl_->thread = std::thread([m = impl_.get()] { m->Run(); });
}

Subscriber::~Subscriber() { Stop(); }

void Subscriber::Stop() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.stopped) return;
    m.stopped = true;
  }
  m.stop = true;
  m.waker.Notify();
  if (m.thread.joinable()) m.thread.join();
  // Commands queued before `stopped` was set run before the thread ends (RunCommands at
  // exit), so no caller waits forever.
}

Status Subscriber::AddEndpoint(const std::string& name, const std::string& endpoint,
                               const std::string& replay_endpoint, ReportCallback callback,
                               const std::string& topic) {
  Impl& m = *impl_;
  return m.Call<Status>(
      [&]() -> Status {
        if (m.sources.contains(name)) return Status::InvalidArgument("kv events: source '" + name + "' exists");
        std::unique_ptr<Source> src = m.NewSource(name, std::move(callback));
        try {
          m.Subscribe(*src, topic);
          src->sub->connect(endpoint);
        } catch (const zmq::error_t& e) {
          return Status::Unavailable(fmt::format("kv events: connect {}: {}", endpoint, e.what()));
        }
        Stream& st = m.StreamFor(*src, "");
        st.replay_endpoint = replay_endpoint;
        st.tracker.set_can_replay(!replay_endpoint.empty());
        m.AddSource(std::move(src));
        return Status::Ok();
      },
      Status::FailedPrecondition("kv events: subscriber stopped"));
}

Result<std::string> Subscriber::AddBound(const std::string& name, const std::string& bind_endpoint,
                                         ReportCallback callback, const std::string& prefix) {
  Impl& m = *impl_;
  return m.Call<Result<std::string>>(
      [&]() -> Result<std::string> {
        if (m.sources.contains(name)) return Status::InvalidArgument("kv events: source '" + name + "' exists");
        std::unique_ptr<Source> src = m.NewSource(name, std::move(callback));
        src->bound = true;
        std::string bound;
        try {
          m.Subscribe(*src, prefix);
          src->sub->bind(bind_endpoint);
          bound = src->sub->get(zmq::sockopt::last_endpoint);
        } catch (const zmq::error_t& e) {
          return Status::Unavailable(fmt::format("kv events: bind {}: {}", bind_endpoint, e.what()));
        }
        m.AddSource(std::move(src));
        return bound;
      },
      Result<std::string>(Status::FailedPrecondition("kv events: subscriber stopped")));
}

Status Subscriber::SetTopicReplay(const std::string& name, const std::string& topic,
                                  const std::string& replay_endpoint) {
  Impl& m = *impl_;
  return m.Call<Status>(
      [&]() -> Status {
        auto it = m.sources.find(name);
        if (it == m.sources.end()) return Status::NotFound("kv events: no source '" + name + "'");
        Source& src = *it->second;
        src.topic_replay[topic] = replay_endpoint;
        if (auto s = src.streams.find(topic); s != src.streams.end()) {
          s->second->replay_endpoint = replay_endpoint;
          s->second->dealer.reset();
          s->second->tracker.set_can_replay(!replay_endpoint.empty());
        }
        return Status::Ok();
      },
      Status::FailedPrecondition("kv events: subscriber stopped"));
}

Status Subscriber::Remove(const std::string& name) {
  Impl& m = *impl_;
  return m.Call<Status>(
      [&]() -> Status {
        auto it = m.sources.find(name);
        if (it == m.sources.end()) return Status::NotFound("kv events: no source '" + name + "'");
        m.sources.erase(it);
        std::lock_guard lock(m.counters_mu);
        m.counters.erase(name);
        return Status::Ok();
      },
      Status::FailedPrecondition("kv events: subscriber stopped"));
}

std::optional<SubscriberCounters> Subscriber::Counters(const std::string& name) const {
  const Impl& m = *impl_;
  std::shared_ptr<AtomicCounters> a;
  {
    std::lock_guard lock(m.counters_mu);
    auto it = m.counters.find(name);
    if (it == m.counters.end()) return std::nullopt;
    a = it->second;
  }
  SubscriberCounters c;
  c.batches = a->batches;
  c.replayed = a->replayed;
  c.events_stored = a->events_stored;
  c.events_removed = a->events_removed;
  c.events_cleared = a->events_cleared;
  c.events_unknown = a->events_unknown;
  c.gaps = a->gaps;
  c.gaps_repaired = a->gaps_repaired;
  c.replay_requests = a->replay_requests;
  c.duplicates = a->duplicates;
  c.restarts = a->restarts;
  c.decode_errors = a->decode_errors;
  if (a->has_last) c.last_seq = a->last_seq.load();
  return c;
}

void Subscriber::Impl::RunCommands() {
  std::deque<std::function<void()>> todo;
  {
    std::lock_guard lock(mu);
    todo.swap(commands);
  }
  for (auto& fn : todo) fn();
}

void Subscriber::Impl::Run() {
  std::vector<zmq::pollitem_t> items;
  struct Target {
    Source* src;
    Stream* stream;  // null: the source's SUB socket
  };
  std::vector<Target> targets;
  std::vector<zmq::message_t> frames;
  while (!stop) {
    items.clear();
    targets.clear();
    items.push_back({nullptr, waker.fd(), ZMQ_POLLIN, 0});
    targets.push_back({nullptr, nullptr});
    std::optional<Clock::time_point> next_deadline;
    for (auto& [name, src] : sources) {
      items.push_back({src->sub->handle(), 0, ZMQ_POLLIN, 0});
      targets.push_back({src.get(), nullptr});
      for (auto& [key, st] : src->streams) {
        if (st->dealer) {
          items.push_back({st->dealer->handle(), 0, ZMQ_POLLIN, 0});
          targets.push_back({src.get(), st.get()});
        }
        if (st->deadline && (!next_deadline || *st->deadline < *next_deadline)) {
          next_deadline = st->deadline;
        }
      }
    }
    long timeout_ms = -1;
    if (next_deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next_deadline - Clock::now());
      timeout_ms = std::max<long>(0, static_cast<long>(left.count()));
    }
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
      if (items[0].revents & ZMQ_POLLIN) {
        waker.Drain();
        RunCommands();
        continue;  // sources may have changed: poll again with fresh items
      }
      for (size_t i = 1; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        Target t = targets[i];
        // A bounded number per round, so one busy publisher cannot starve the others.
        for (int n = 0; n < 256; ++n) {
          if (t.stream == nullptr) {
            if (!RecvMultipart(*t.src->sub, &frames)) break;
            OnLive(*t.src, frames);
          } else {
            if (!t.stream->dealer || !RecvMultipart(*t.stream->dealer, &frames)) break;
            OnReplayReply(*t.src, *t.stream, frames);
          }
        }
      }
      const auto now = Clock::now();
      for (auto& [name, src] : sources) {
        for (auto& [key, st] : src->streams) {
          if (st->deadline && *st->deadline <= now) OnTimeout(*src, *st);
        }
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      fmt::print(stderr, "kv events subscriber: {}\n", e.what());
    }
  }
  sources.clear();  // closes every socket (linger 0)
  {
    std::lock_guard lock(mu);
    stopped = true;
  }
  RunCommands();  // anything queued before `stopped`: answered, not left waiting
}

void Subscriber::Impl::OnLive(Source& src, std::vector<zmq::message_t>& frames) {
  const std::string topic = frames.empty() ? std::string() : frames[0].to_string();
  if (frames.size() != 3 || frames[1].size() != 8) {
    DecodeError(src, topic, 0,
                fmt::format("live message of {} frames (topic, 8-byte seq, payload expected)",
                            frames.size()));
    return;
  }
  const uint64_t seq = ParseSeqFrame(frames[1].data());
  Stream& st = StreamFor(src, src.bound ? topic : std::string());
  st.topic = topic;
  std::vector<SeqStep> steps;
  st.tracker.OnLive(seq, frames[2].to_string(), &steps);
  Execute(src, st, steps);
}

void Subscriber::Impl::OnReplayReply(Source& src, Stream& st, std::vector<zmq::message_t>& frames) {
  // ["", seq, payload] (before vLLM PR 45177) or ["", topic, seq, payload] (after).
  size_t at = 0;
  if (!frames.empty() && frames[0].size() == 0) at = 1;
  const size_t n = frames.size() - at;
  if ((n != 2 && n != 3) || frames[at + n - 2].size() != 8) {
    DecodeError(src, st.topic, 0,
                fmt::format("replay reply of {} frames ([topic,] 8-byte seq, payload expected)",
                            frames.size()));
    return;
  }
  const uint64_t seq = ParseSeqFrame(frames[at + n - 2].data());
  std::vector<SeqStep> steps;
  if (seq == kEndMarkerSeq) {
    st.deadline.reset();
    st.tracker.OnReplayEnd(&steps);
  } else {
    st.tracker.OnReplayed(seq, frames[at + n - 1].to_string(), &steps);
  }
  Execute(src, st, steps);
}

void Subscriber::Impl::OnTimeout(Source& src, Stream& st) {
  st.deadline.reset();
  st.dealer.reset();  // late replies to this request must not reach the next one
  std::vector<SeqStep> steps;
  st.tracker.OnReplayEnd(&steps);
  Execute(src, st, steps);
}

bool Subscriber::Impl::SendReplayRequest(Source& src, Stream& st, uint64_t from) {
  if (st.replay_endpoint.empty()) return false;
  try {
    if (!st.dealer) {
      st.dealer = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
      st.dealer->set(zmq::sockopt::linger, 0);
      st.dealer->connect(st.replay_endpoint);
    }
    const std::array<uint8_t, 8> seq = SeqFrame(from);
    if (!st.dealer->send(zmq::const_buffer(), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
        !st.dealer->send(zmq::buffer(seq), zmq::send_flags::dontwait)) {
      st.dealer.reset();
      return false;
    }
  } catch (const zmq::error_t&) {
    st.dealer.reset();
    return false;
  }
  ++src.counters->replay_requests;
  st.deadline = Clock::now() + options.replay_timeout;
  return true;
}

void Subscriber::Impl::Execute(Source& src, Stream& st, std::vector<SeqStep>& first) {
  std::deque<SeqStep> work(std::make_move_iterator(first.begin()),
                           std::make_move_iterator(first.end()));
  AtomicCounters& c = *src.counters;
  while (!work.empty()) {
    SeqStep step = std::move(work.front());
    work.pop_front();
    switch (step.kind) {
      case SeqStep::Kind::kDeliver: {
        Report r = ReportOf(step.replayed ? ReportKind::kReplayed : ReportKind::kBatch, src,
                            st.topic, step.seq);
        DecodeInfo info;
        const auto* p = reinterpret_cast<const uint8_t*>(step.payload.data());
        if (Status s = DecodeBatch({p, step.payload.size()}, &r.batch, &info); !s.ok()) {
          DecodeError(src, st.topic, step.seq, fmt::format("seq {}: {}", step.seq, s.message()));
          break;
        }
        r.unknown_events = info.unknown_events;
        ++(step.replayed ? c.replayed : c.batches);
        for (const KvEvent& e : r.batch.events) {
          if (e.kind == EventKind::kBlockStored) ++c.events_stored;
          if (e.kind == EventKind::kBlockRemoved) ++c.events_removed;
          if (e.kind == EventKind::kAllBlocksCleared) ++c.events_cleared;
        }
        c.events_unknown += info.unknown_events;
        c.last_seq = step.seq;
        c.has_last = true;
        Emit(src, std::move(r));
        break;
      }
      case SeqStep::Kind::kDuplicate:
        ++c.duplicates;
        break;
      case SeqStep::Kind::kRestart: {
        ++c.restarts;
        Report r = ReportOf(ReportKind::kRestart, src, st.topic, step.seq);
        r.previous = step.previous;
        Emit(src, std::move(r));
        break;
      }
      case SeqStep::Kind::kGap: {
        ++c.gaps;
        if (step.repaired) ++c.gaps_repaired;
        Report r = ReportOf(ReportKind::kGap, src, st.topic, step.gap_from);
        r.gap_from = step.gap_from;
        r.gap_to = step.gap_to;
        r.repaired = step.repaired;
        Emit(src, std::move(r));
        break;
      }
      case SeqStep::Kind::kRequestReplay:
        if (!SendReplayRequest(src, st, step.seq)) {
          std::vector<SeqStep> more;
          st.tracker.OnReplayEnd(&more);
          for (auto& s : more) work.push_back(std::move(s));
        }
        break;
    }
  }
}

}  // namespace kvroute::kvevents
