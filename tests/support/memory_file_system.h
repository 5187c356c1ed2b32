// An in-memory pool::FileSystem for the file watches' tests (endpoints file, API keys,
// certificates): paths to contents, with the stat a real file would show. Write is a new
// inode (a rename into place, a ConfigMap or Secret swap); WriteInPlace keeps the inode
// and moves mtime (an editor writing in place); Touch moves mtime only. `stats` and
// `reads` count the calls, so a test can assert that an unchanged stamp is not read.
#pragma once

#include <cerrno>
#include <map>
#include <string>

#include "adapters/pool/endpoints_watch.h"

namespace kvroute::test_support {

class MemoryFileSystem : public pool::FileSystem {
 public:
  void Write(const std::string& path, std::string text) {
    File& f = files_[path];
    f.text = std::move(text);
    f.inode = ++next_inode_;
    f.mtime_ns += 1000;
  }
  void WriteInPlace(const std::string& path, std::string text) {
    File& f = files_[path];
    f.text = std::move(text);
    if (f.inode == 0) f.inode = ++next_inode_;
    f.mtime_ns += 1000;
  }
  void Touch(const std::string& path) { files_[path].mtime_ns += 1; }
  void Remove(const std::string& path) { files_.erase(path); }
  int stats = 0, reads = 0;

  pool::FileStamp Stat(const std::string& path) override {
    ++stats;
    pool::FileStamp s;
    auto it = files_.find(path);
    if (it == files_.end()) {
      s.error = ENOENT;
      return s;
    }
    s.exists = true;
    s.inode = it->second.inode;
    s.size = it->second.text.size();
    s.mtime_ns = it->second.mtime_ns;
    return s;
  }
  config::ConfigOr<std::string> Read(const std::string& path) override {
    ++reads;
    config::ConfigOr<std::string> r;
    auto it = files_.find(path);
    if (it == files_.end()) {
      r.error = config::ConfigError{path, 0, "", "cannot read file: No such file or directory"};
    } else {
      r.value = it->second.text;
    }
    return r;
  }

 private:
  struct File {
    std::string text;
    uint64_t inode = 0;
    int64_t mtime_ns = 0;
  };
  std::map<std::string, File> files_;
  uint64_t next_inode_ = 0;
};

}  // namespace kvroute::test_support
