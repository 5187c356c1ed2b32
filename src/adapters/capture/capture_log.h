// The capture file (`capture:`, core/capture/capture.h): requests are handed over in
// memory and written by a thread of its own, so the request path never waits on the disk.
// A full buffer drops the line and counts it. A file that reaches max_bytes is rotated:
// path -> path.1 -> ... -> path.<max_files> (the oldest deleted). A file already at `path`
// when the capture opens is rotated first, so each file has one origin.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/capture/capture.h"
#include "core/common/status.h"

namespace kvroute::capture {

class CaptureLog final : public Sink {
 public:
  // Opens (creates) options.path and starts the writer. `origin_s`: now on the front end's
  // clock; line timestamps count from it. An unwritable path is an error naming it.
  static Result<std::unique_ptr<CaptureLog>> Open(const CaptureOptions& options, double origin_s);
  // Writes what is buffered, then stops the writer.
  ~CaptureLog();
  CaptureLog(const CaptureLog&) = delete;
  CaptureLog& operator=(const CaptureLog&) = delete;

  const CaptureOptions& options() const { return options_; }
  // The chain key (random per process): front ends hash prompts with it (HashPrompt).
  uint64_t key() const override { return key_; }
  int64_t block_size() const override { return options_.block_size; }
  // Whether this request is written (options.sample). Thread-safe.
  bool Sample() override { return sampler_.Take(); }
  // Hands one finished request to the writer; never does I/O. Thread-safe.
  void Submit(Entry&& e) override;
  // Returns when every entry submitted before the call is written (tests, shutdown).
  void Flush();
  // While held, the writer takes nothing from the buffer, which then fills and drops
  // (tests of the full buffer).
  void Hold(bool held);

  struct Counts {
    uint64_t written = 0, dropped = 0, failed = 0, bytes = 0, rotations = 0;
  };
  Counts counts() const;
  // kvroute_capture_* in Prometheus text.
  void AppendMetrics(std::string& out) const;

 private:
  CaptureLog(const CaptureOptions& options, double origin_s, uint64_t key);
  Status OpenFile();
  void Rotate();
  void Run();
  void Write(Entry& e, std::string& line);

  const CaptureOptions options_;
  const double origin_s_;
  const uint64_t key_;
  Sampler sampler_;
  LineFormatter formatter_;  // the writer thread's
  std::FILE* file_ = nullptr;  // the writer thread's (and Open's, before it starts)
  uint64_t file_bytes_ = 0;
  bool write_error_logged_ = false;

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Entry> queue_;  // mu_
  uint64_t submitted_ = 0, done_ = 0;  // mu_
  bool stop_ = false;        // mu_
  bool held_ = false;        // mu_
  Counts counts_;            // mu_
  std::thread writer_;
};

}  // namespace kvroute::capture
