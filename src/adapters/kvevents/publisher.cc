#include "adapters/kvevents/publisher.h"

#include <fmt/format.h>

#include <zmq.hpp>

#include "adapters/kvevents/zmq_util.h"

namespace kvroute::kvevents {

namespace {

struct Entry {
  uint64_t seq;
  std::string payload;
  bool send;
};

std::string LastEndpoint(zmq::socket_t& s) { return s.get(zmq::sockopt::last_endpoint); }

}  // namespace

struct Publisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::unique_ptr<zmq::socket_t> router;
  Waker waker;

  std::mutex mu;
  std::condition_variable flushed;
  std::deque<Entry> queue;  // guarded by mu
  uint64_t next_seq = 0;    // guarded by mu
  uint64_t handed = 0;      // batches the thread has handled; guarded by mu
  bool stopping = false;    // Stop was called; guarded by mu
  bool done = false;        // the thread has ended; guarded by mu
  std::atomic<bool> stop{false};

  std::deque<Entry> ring;  // the thread's: the last buffer_steps batches
  std::atomic<uint64_t> sent{0}, replay_requests{0}, bad_requests{0};
};

Publisher::Publisher(PublisherOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<Publisher>> Publisher::Start(PublisherOptions options) {
  if (options.buffer_steps == 0) return Status::InvalidArgument("kv events: buffer_steps must be >= 1");
  std::unique_ptr<Publisher> p(new Publisher(std::move(options)));
  Impl& m = *p->impl_;
  if (!m.waker.ok()) return Status::Unavailable("kv events: eventfd failed");
  const PublisherOptions& o = p->options_;
  std::string step;
  try {
    m.pub.set(zmq::sockopt::linger, 0);
    m.pub.set(zmq::sockopt::sndhwm, o.hwm);
    if (o.bind.value_or(ShouldBind(o.endpoint))) {
      step = "bind " + o.endpoint;
      m.pub.bind(o.endpoint);
      p->endpoint_ = LastEndpoint(m.pub);
    } else {
      step = "connect " + o.endpoint;
      m.pub.connect(o.endpoint);
      p->endpoint_ = o.endpoint;
    }
    if (!o.replay_endpoint.empty()) {
      step = "bind " + o.replay_endpoint;
      m.router = std::make_unique<zmq::socket_t>(m.ctx, zmq::socket_type::router);
      m.router->set(zmq::sockopt::linger, 0);
      m.router->bind(o.replay_endpoint);
      p->replay_endpoint_ = LastEndpoint(*m.router);
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(fmt::format("kv events: {}: {}", step, e.what()));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

Publisher::~Publisher() { Stop(); }

uint64_t Publisher::Publish(const KvEventBatch& batch, SendMode mode) {
  std::string payload;
  EncodeBatch(batch, options_.format, options_.hash_form, &payload);
  return PublishPayload(std::move(payload), mode);
}

uint64_t Publisher::PublishPayload(std::string payload, SendMode mode) {
  Impl& m = *impl_;
  uint64_t seq = 0;
  {
    std::lock_guard lock(m.mu);
    seq = m.next_seq++;
    if (m.stopping) return seq;
    m.queue.push_back(Entry{seq, std::move(payload), mode == SendMode::kSend});
  }
  m.waker.Notify();
  return seq;
}

void Publisher::Flush() {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  const uint64_t target = m.next_seq;
  m.flushed.wait(lock, [&] { return m.stopping || m.done || m.handed >= target; });
}

void Publisher::Stop() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.stopping) return;
    m.stopping = true;
  }
  m.stop = true;
  m.waker.Notify();
  m.flushed.notify_all();
  if (thread_.joinable()) thread_.join();
  m.pub.close();
  if (m.router) m.router->close();
}

PublisherCounters Publisher::Counters() const {
  const Impl& m = *impl_;
  PublisherCounters c;
  {
    std::lock_guard lock(const_cast<std::mutex&>(m.mu));
    c.published = m.next_seq;
  }
  c.sent = m.sent;
  c.replay_requests = m.replay_requests;
  c.bad_requests = m.bad_requests;
  return c;
}

void Publisher::Run() {
  Impl& m = *impl_;
  const zmq::const_buffer topic = zmq::buffer(options_.topic);
  const bool with_topic = options_.replay_form == ReplayReplyForm::kTopicSeqPayload;

  auto hand = [&](Entry& e) {
    if (e.send) {
      const std::array<uint8_t, 8> seq = SeqFrame(e.seq);
      // PUB never blocks: past the high-water mark ZMQ drops, as vLLM's does.
      m.pub.send(topic, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      m.pub.send(zmq::buffer(seq), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      m.pub.send(zmq::buffer(e.payload), zmq::send_flags::dontwait);
      ++m.sent;
    }
    m.ring.push_back(std::move(e));
    if (m.ring.size() > options_.buffer_steps) m.ring.pop_front();
  };

  auto answer_replay = [&] {
    std::vector<zmq::message_t> frames;
    while (true) {
      zmq::message_t msg;
      if (!m.router->recv(msg, zmq::recv_flags::dontwait)) break;
      const bool more = msg.more();
      frames.push_back(std::move(msg));
      if (more) continue;
      // [identity, "", start_seq]
      if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
        ++m.bad_requests;
        frames.clear();
        continue;
      }
      ++m.replay_requests;
      const uint64_t start = ParseSeqFrame(frames[2].data());
      const std::string identity = frames[0].to_string();
      auto reply = [&](uint64_t seq, std::string_view payload) {
        const std::array<uint8_t, 8> s = SeqFrame(seq);
        const auto more_flags = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
        m.router->send(zmq::buffer(identity), more_flags);
        m.router->send(zmq::const_buffer(), more_flags);
        if (with_topic) m.router->send(topic, more_flags);
        m.router->send(zmq::buffer(s), more_flags);
        m.router->send(zmq::buffer(payload), zmq::send_flags::dontwait);
      };
      for (const Entry& e : m.ring) {
        if (e.seq >= start) reply(e.seq, e.payload);
      }
      reply(kEndMarkerSeq, {});
      frames.clear();
    }
  };

  try {
    while (!m.stop) {
      zmq::pollitem_t items[2] = {{nullptr, m.waker.fd(), ZMQ_POLLIN, 0},
                                  {m.router ? m.router->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, m.router ? 2 : 1, std::chrono::milliseconds(-1));
      if (items[0].revents & ZMQ_POLLIN) m.waker.Drain();
      std::deque<Entry> batch;
      {
        std::lock_guard lock(m.mu);
        batch.swap(m.queue);
      }
      for (Entry& e : batch) hand(e);
      if (!batch.empty()) {
        std::lock_guard lock(m.mu);
        m.handed += batch.size();
      }
      m.flushed.notify_all();
      // Live batches first: a replay then includes everything published before it.
      if (m.router && (items[1].revents & ZMQ_POLLIN)) answer_replay();
    }
  } catch (const zmq::error_t& e) {
    // A socket error ends publishing; the owner sees it through the counters stopping.
    fmt::print(stderr, "kv events publisher: {}\n", e.what());
  }
  std::lock_guard lock(m.mu);
  m.done = true;
  m.flushed.notify_all();
}

}  // namespace kvroute::kvevents
