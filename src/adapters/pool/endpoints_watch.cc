#include "adapters/pool/endpoints_watch.h"

#include <sys/stat.h>

#include <cerrno>
#include <functional>
#include <string_view>
#include <utility>

#include "config/endpoints_file.h"

namespace kvroute::pool {

namespace {

class PosixFileSystem final : public FileSystem {
 public:
  FileStamp Stat(const std::string& path) override {
    FileStamp s;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      s.error = errno;
      return s;
    }
    s.exists = true;
    s.device = static_cast<uint64_t>(st.st_dev);
    s.inode = static_cast<uint64_t>(st.st_ino);
    s.size = static_cast<uint64_t>(st.st_size);
    s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
    return s;
  }
  config::ConfigOr<std::string> Read(const std::string& path) override {
    return config::ReadConfigFile(path);
  }
};

}  // namespace

FileSystem& RealFileSystem() {
  static PosixFileSystem fs;
  return fs;
}

EndpointsFileWatch::EndpointsFileWatch(std::string path) : path_(std::move(path)) {}

WatchDecision EndpointsFileWatch::Poll(FileSystem& fs) {
  // Stat before reading: a change that lands between the two shows as a new stamp at the
  // next poll, so no write is ever missed (at worst one is read twice).
  const FileStamp stamp = fs.Stat(path_);
  if (primed_ && stamp == stamp_) return {};
  primed_ = true;
  stamp_ = stamp;
  config::ConfigOr<std::string> text = fs.Read(path_);
  if (!text.ok()) return Reject(text.error.ToString());
  const uint64_t hash = std::hash<std::string_view>{}(*text.value);
  if (has_applied_ && hash == applied_hash_) {
    WatchDecision d;
    d.recovered = !valid_;
    valid_ = true;
    last_error_.clear();
    return d;
  }
  config::ConfigOr<std::vector<config::EndpointConfig>> parsed =
      config::ParseEndpointsFile(*text.value, path_);
  if (!parsed.ok()) return Reject(parsed.error.ToString());
  pending_hash_ = hash;
  WatchDecision d;
  d.kind = WatchDecision::Kind::kApply;
  d.endpoints = std::move(*parsed.value);
  return d;
}

void EndpointsFileWatch::Applied() {
  has_applied_ = true;
  applied_hash_ = pending_hash_;
  valid_ = true;
  last_error_.clear();
}

WatchDecision EndpointsFileWatch::Rejected(const std::string& error) { return Reject(error); }

WatchDecision EndpointsFileWatch::Reject(const std::string& error) {
  valid_ = false;
  return RejectOnce<WatchDecision>(error, last_error_);
}

}  // namespace kvroute::pool
