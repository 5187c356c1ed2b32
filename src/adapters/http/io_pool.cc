#include "adapters/http/io_pool.h"

#include <boost/asio/post.hpp>

namespace kvroute::http {

IoPool::IoPool(int threads) {
  if (threads < 1) threads = 1;
  contexts_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    // Concurrency hint 1: each context is run by exactly one thread, which lets Asio
    // skip the locking it would otherwise do around its queues.
    contexts_.push_back(std::make_unique<boost::asio::io_context>(1));
  }
}

IoPool::~IoPool() { Stop(); }

void IoPool::Start() {
  for (auto& ctx : contexts_) {
    guards_.push_back(boost::asio::make_work_guard(*ctx));
    boost::asio::io_context* c = ctx.get();
    threads_.emplace_back([c] { c->run(); });
  }
}

void IoPool::Stop() {
  for (auto& g : guards_) g.reset();
  for (auto& ctx : contexts_) ctx->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  guards_.clear();
}

std::vector<boost::asio::io_context*> IoPool::contexts() {
  std::vector<boost::asio::io_context*> out;
  out.reserve(contexts_.size());
  for (auto& c : contexts_) out.push_back(c.get());
  return out;
}

void CancelSignalWait(IoPool& io, boost::asio::signal_set* signals) {
  if (signals == nullptr) return;
  boost::asio::post(io.context(0), [signals] {
    boost::system::error_code ignored;
    signals->cancel(ignored);
  });
}

}  // namespace kvroute::http
