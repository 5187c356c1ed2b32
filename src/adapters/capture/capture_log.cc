#include "adapters/capture/capture_log.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

namespace kvroute::capture {

namespace fs = std::filesystem;

Result<std::unique_ptr<CaptureLog>> CaptureLog::Open(const CaptureOptions& options, double origin_s) {
  std::random_device rd;
  const uint64_t key = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::unique_ptr<CaptureLog> log(new CaptureLog(options, origin_s, key));
  std::error_code ec;
  // Only a regular file is rotated (a path such as /dev/null is written as it is).
  if (fs::is_regular_file(options.path, ec) && fs::file_size(options.path, ec) > 0 && !ec) log->Rotate();
  if (Status s = log->OpenFile(); !s.ok()) return s;
  log->writer_ = std::thread([raw = log.get()] { raw->Run(); });
  return log;
}

CaptureLog::CaptureLog(const CaptureOptions& options, double origin_s, uint64_t key)
    : options_(options), origin_s_(origin_s), key_(key), sampler_(options.sample),
      formatter_(options.block_size) {}

CaptureLog::~CaptureLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (file_) std::fclose(file_);
}

Status CaptureLog::OpenFile() {
  file_ = std::fopen(options_.path.c_str(), "ab");
  if (!file_) {
    return Status::InvalidArgument(
        fmt::format("capture.path: cannot open '{}' for writing: {}", options_.path, std::strerror(errno)));
  }
  file_bytes_ = 0;
  formatter_.Reset();
  return Status::Ok();
}

void CaptureLog::Rotate() {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
  std::error_code ec;
  const int keep = std::max(1, options_.max_files);
  fs::remove(fmt::format("{}.{}", options_.path, keep), ec);
  for (int i = keep - 1; i >= 1; --i) {
    fs::rename(fmt::format("{}.{}", options_.path, i), fmt::format("{}.{}", options_.path, i + 1), ec);
  }
  fs::rename(options_.path, options_.path + ".1", ec);
}

void CaptureLog::Submit(Entry&& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int64_t>(queue_.size()) >= options_.buffer_lines || stop_) {
      ++counts_.dropped;
      return;
    }
    queue_.push_back(std::move(e));
    ++submitted_;
  }
  wake_.notify_one();
}

void CaptureLog::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  idle_.wait(lock, [&] { return done_ >= target; });
}

void CaptureLog::Hold(bool held) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = held;
  }
  wake_.notify_all();
}

CaptureLog::Counts CaptureLog::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void CaptureLog::Write(Entry& e, std::string& line) {
  line.clear();
  formatter_.Append(e, origin_s_, line);
  bool rotated = false;
  if (file_bytes_ > 0 && file_bytes_ + line.size() > static_cast<uint64_t>(options_.max_bytes)) {
    Rotate();
    rotated = true;
    if (!OpenFile().ok()) file_ = nullptr;
    // The new file numbers its ids afresh: format the line again.
    line.clear();
    formatter_.Append(e, origin_s_, line);
  }
  bool ok = file_ && std::fwrite(line.data(), 1, line.size(), file_) == line.size();
  if (ok && std::fflush(file_) != 0) ok = false;
  if (!ok && !write_error_logged_) {
    write_error_logged_ = true;
    std::fprintf(stderr, "kvroute: capture: writing %s failed: %s (counted in kvroute_capture_lines_total)\n",
                 options_.path.c_str(), std::strerror(errno));
  }
  if (ok) file_bytes_ += line.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (rotated) ++counts_.rotations;
  if (ok) {
    ++counts_.written;
    counts_.bytes += line.size();
  } else {
    ++counts_.failed;
  }
}

void CaptureLog::Run() {
  std::string line;
  std::deque<Entry> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || (!held_ && !queue_.empty()); });
      if (queue_.empty() && stop_) return;
      batch.swap(queue_);
    }
    for (Entry& e : batch) Write(e, line);
    const uint64_t n = batch.size();
    batch.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ += n;
    }
    idle_.notify_all();
  }
}

void CaptureLog::AppendMetrics(std::string& out) const {
  const Counts c = counts();
  out += "# HELP kvroute_capture_lines_total Requests offered to the capture file, by result: "
         "written, dropped (the writer's buffer was full) or failed (the write failed).\n"
         "# TYPE kvroute_capture_lines_total counter\n";
  out += fmt::format("kvroute_capture_lines_total{{result=\"written\"}} {}\n", c.written);
  out += fmt::format("kvroute_capture_lines_total{{result=\"dropped\"}} {}\n", c.dropped);
  out += fmt::format("kvroute_capture_lines_total{{result=\"failed\"}} {}\n", c.failed);
  out += "# HELP kvroute_capture_bytes_total Bytes written to the capture file.\n"
         "# TYPE kvroute_capture_bytes_total counter\n";
  out += fmt::format("kvroute_capture_bytes_total {}\n", c.bytes);
  out += "# HELP kvroute_capture_rotations_total Capture files rotated for reaching capture.max_bytes.\n"
         "# TYPE kvroute_capture_rotations_total counter\n";
  out += fmt::format("kvroute_capture_rotations_total {}\n", c.rotations);
}

}  // namespace kvroute::capture
