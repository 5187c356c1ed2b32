#include "adapters/k8s/list_watch.h"

#include <boost/asio/steady_timer.hpp>

namespace kvroute::k8s {

namespace net = boost::asio;

std::string_view ListWatchPhaseName(ListWatchPhase p) {
  return p == ListWatchPhase::kList ? "list" : "watch";
}

struct ListWatch::State : std::enable_shared_from_this<ListWatch::State> {
  State(ApiClient& c, Callbacks cb, Options o)
      : client(c), callbacks(std::move(cb)), options(o), backoff(o.backoff, o.seed), timer(c.context()) {}

  ApiClient& client;
  Callbacks callbacks;
  Options options;
  Backoff backoff;
  net::steady_timer timer;
  ApiRequest current;
  bool running = false;
  bool parked = false;
  bool open = false;
  // Bumped by every new attempt, Kick and Stop: a completion of an older attempt (a
  // cancel delivers one synchronously) does nothing.
  uint64_t generation = 0;
  uint64_t lists = 0;
  uint64_t watches = 0;

  void Abandon() {
    ++generation;
    timer.cancel();
    open = false;
    ApiRequest old = std::move(current);
    current = ApiRequest();
    old.Cancel();
  }

  void Next() {
    if (!running) return;
    parked = false;
    const uint64_t gen = ++generation;
    std::weak_ptr<State> weak = weak_from_this();
    const bool relist = !callbacks.relist_needed || callbacks.relist_needed();
    if (relist) {
      std::string target = callbacks.list_target ? callbacks.list_target() : std::string();
      if (target.empty()) {
        parked = true;
        return;
      }
      ++lists;
      current = client.Get(std::move(target), [weak, gen](ApiResult&& r) {
        auto self = weak.lock();
        if (!self || !self->running || gen != self->generation) return;
        self->ListDone(std::move(r));
      });
      return;
    }
    ++watches;
    WatchCallbacks w;
    w.on_open = [weak, gen] {
      auto self = weak.lock();
      if (!self || !self->running || gen != self->generation) return;
      self->open = true;
      self->backoff.OnSuccess(std::chrono::steady_clock::now());
      if (self->callbacks.on_watch_open) self->callbacks.on_watch_open();
    };
    w.on_line = [weak, gen](std::string_view line) {
      auto self = weak.lock();
      if (!self || !self->running || gen != self->generation) return;
      Status st = self->callbacks.on_line ? self->callbacks.on_line(line) : Status::Ok();
      if (st.ok() || st.code() == StatusCode::kFailedPrecondition) return;
      // A line the owner could not use: reported, the watch goes on (the next event or
      // a relist repairs the state).
      ApiResult bad;
      bad.error = ApiError::kProtocol;
      bad.http_status = 200;
      bad.status = st;
      if (self->callbacks.on_failure) {
        self->callbacks.on_failure(ListWatchPhase::kWatch, bad, std::chrono::milliseconds(0));
      }
    };
    w.on_done = [weak, gen](ApiResult&& r) {
      auto self = weak.lock();
      if (!self || !self->running || gen != self->generation) return;
      self->WatchDone(std::move(r));
    };
    current = client.Watch(callbacks.watch_target ? callbacks.watch_target() : std::string("/"),
                           std::move(w));
  }

  void ListDone(ApiResult&& r) {
    current = ApiRequest();
    if (r.ok()) {
      Status st = callbacks.on_list ? callbacks.on_list(std::move(r)) : Status::Ok();
      if (st.ok()) {
        backoff.Reset();
        Next();
        return;
      }
      ApiResult bad;
      bad.error = ApiError::kProtocol;
      bad.http_status = 200;
      bad.status = st;
      Fail(ListWatchPhase::kList, bad, backoff.OnFailure(std::chrono::steady_clock::now()));
      return;
    }
    if (r.http_status == 404 && callbacks.on_missing && callbacks.on_missing(r)) {
      backoff.Reset();
      Fail(ListWatchPhase::kList, r, options.missing_retry);
      return;
    }
    Fail(ListWatchPhase::kList, r, backoff.OnFailure(std::chrono::steady_clock::now()));
  }

  void WatchDone(ApiResult&& r) {
    current = ApiRequest();
    const bool was_open = open;
    open = false;
    if (r.ok() && was_open) {
      // The server ended the watch (its timeout): resume from the last version seen.
      Next();
      return;
    }
    if (r.error == ApiError::kGone) {
      // The owner's state has its relist flag set by the ERROR line; a 410 response head
      // (no line) is reported here so the owner can set it too.
      if (callbacks.on_failure) callbacks.on_failure(ListWatchPhase::kWatch, r, std::chrono::milliseconds(0));
      Next();
      return;
    }
    Fail(ListWatchPhase::kWatch, r, backoff.OnFailure(std::chrono::steady_clock::now()));
  }

  void Fail(ListWatchPhase phase, const ApiResult& r, std::chrono::milliseconds delay) {
    if (callbacks.on_failure) callbacks.on_failure(phase, r, delay);
    if (!running) return;
    const uint64_t gen = ++generation;
    timer.expires_after(delay);
    std::weak_ptr<State> weak = weak_from_this();
    timer.async_wait([weak, gen](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || !self->running || gen != self->generation) return;
      self->Next();
    });
  }
};

ListWatch::ListWatch(ApiClient& client, Callbacks callbacks, Options options)
    : state_(std::make_shared<State>(client, std::move(callbacks), options)) {}

ListWatch::~ListWatch() { Stop(); }

void ListWatch::Start() {
  if (state_->running) return;
  state_->running = true;
  state_->Next();
}

void ListWatch::Stop() {
  if (!state_->running) return;
  state_->running = false;
  state_->Abandon();
}

void ListWatch::Kick() {
  if (!state_->running) return;
  state_->Abandon();
  state_->Next();
}

uint64_t ListWatch::lists() const { return state_->lists; }
uint64_t ListWatch::watches() const { return state_->watches; }
bool ListWatch::watching() const { return state_->open; }

}  // namespace kvroute::k8s
