// File discovery's decision, apart from its I/O: given what stat(2) says about the
// endpoints file and, when that changed, its contents, say whether to apply a new
// endpoint set, keep the running one, or report a broken file. No clock, no Asio, no
// files of its own: the FileSystem is injected (tests pass an in-memory one and call Poll
// at the virtual times they choose; pool.cc polls the real one on an Asio timer).
//
//   stat unchanged since the last poll          -> kUnchanged (the file is not read)
//   changed, contents equal to the applied ones -> kUnchanged (a touch, a revert, a
//                                                  ConfigMap swap to equal data)
//   changed, unreadable / missing / bad YAML /
//     bad entry / duplicate address             -> kRejected: keep the last good set;
//                                                  `log` only the first time this error
//                                                  is seen in a row
//   changed, parses                             -> kApply with the entries; the caller
//                                                  reports Applied() or Rejected()
//
// "Changed" compares device, inode, size, mtime and ctime of the file the path resolves
// to (symlinks followed): an editor's write-new-then-rename and a Kubernetes ConfigMap's
// `..data` symlink swap both show as a new inode. A content hash (64-bit) decides
// whether a changed file is a new endpoint set.
//
// Thread: not thread-safe; the pool calls it under its own mutex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/router_config.h"
#include "config/yaml_reader.h"

namespace kvroute::pool {

// What stat(2) reports about a path. Two stamps are equal when nothing observable changed.
struct FileStamp {
  bool exists = false;
  int error = 0;  // errno of a failed stat
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

// The file access the watch needs.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // stat(2) of `path`, following symlinks.
  virtual FileStamp Stat(const std::string& path) = 0;
  // The whole file, or "<path>: cannot read file: <why>".
  virtual config::ConfigOr<std::string> Read(const std::string& path) = 0;
};

// The process's real files (stat(2), config::ReadConfigFile). Thread: any.
FileSystem& RealFileSystem();

struct WatchDecision {
  enum class Kind { kUnchanged, kApply, kRejected };
  Kind kind = Kind::kUnchanged;
  std::vector<config::EndpointConfig> endpoints;  // kApply
  std::string error;  // kRejected: "file:line: field: message" or "file: cannot read file: ..."
  bool log = false;   // kRejected: a new error (not the one reported by the previous poll)
  bool recovered = false;  // kUnchanged: the file was broken and is back to the applied set
};

// A watch's decision (WatchDecision, CertDecision) to reject what it read: `error`, to be
// logged unless it is the error reported last (`last_error`, which it becomes).
template <class Decision>
Decision RejectOnce(const std::string& error, std::string& last_error) {
  Decision d;
  d.kind = Decision::Kind::kRejected;
  d.log = error != last_error;
  last_error = error;
  d.error = error;
  return d;
}

class EndpointsFileWatch {
 public:
  // `path` is stat'ed and read as given and names the file in errors.
  explicit EndpointsFileWatch(std::string path);

  // One poll. The first poll always reads the file.
  WatchDecision Poll(FileSystem& fs);
  // The caller applied the kApply entries of the last Poll.
  void Applied();
  // The caller could not apply them (`error` says why); treated like a broken file.
  WatchDecision Rejected(const std::string& error);

  const std::string& path() const { return path_; }
  // True while the file, as last read, is the applied endpoint set.
  bool valid() const { return valid_; }
  // True once some contents were applied.
  bool has_applied() const { return has_applied_; }

 private:
  WatchDecision Reject(const std::string& error);

  std::string path_;
  bool primed_ = false;  // stamp_ holds a real observation
  FileStamp stamp_;
  bool has_applied_ = false;
  uint64_t applied_hash_ = 0;
  uint64_t pending_hash_ = 0;  // of the contents handed out with the last kApply
  bool valid_ = false;
  std::string last_error_;  // empty: the last poll reported no error
};

}  // namespace kvroute::pool
