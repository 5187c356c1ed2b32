// Traffic capture (issue 42): what serve and epp route, as Mooncake-format JSON lines
// (docs/TRACES.md, "Capture") that `kvroute simulate`, `kvroute bench --trace` and
// `kvroute doctor --trace` replay. Pure logic: the prompt's keyed block chain, sampling,
// and one line per request with hashes remapped to small integers per file. The file,
// its rotation and the writer thread are adapters/capture.
//
// Never content: a block is known only by a keyed 64-bit chain hash (the key is random
// per process), and the file holds only the integer each distinct hash got, in order of
// first appearance in that file. Equal integers in one file mean equal leading blocks.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/api/openai.h"

namespace kvroute::capture {

// `capture:` in serve's and epp's configuration.
class Sink;

struct CaptureOptions {
  std::string path;            // the file lines are appended to; empty: capture off
  int64_t block_size = 512;    // prompt tokens per hash id (Mooncake's 512)
  int64_t max_bytes = int64_t{256} << 20;  // a file this large is rotated
  int max_files = 5;           // rotated files kept: path.1 (newest) .. path.N
  double sample = 1.0;         // fraction of requests written, in (0, 1]
  int64_t buffer_lines = 8192;  // lines waiting for the writer; past this they are dropped
  bool enabled() const { return !path.empty(); }
  bool operator==(const CaptureOptions&) const = default;
};

// Text the router has no token ids for is cut into blocks of block_size * this many bytes
// (kvroute sim's tokenizer: four bytes a token; about right for English on real ones).
inline constexpr int64_t kBytesPerToken = 4;

// The prompt's blocks: one keyed chain hash per block_size tokens (the last block
// partial), over its token ids when the router has them, else over its text.
struct PromptBlocks {
  std::vector<uint64_t> hashes;
  int64_t tokens = 0;   // the prompt's length: token ids, or estimated from the text
  bool exact = false;   // true: counted and hashed over token ids
};
PromptBlocks HashPrompt(uint64_t key, std::span<const uint32_t> token_ids, std::string_view text,
                        int64_t block_size);

// Makes `hashes` exactly ceil(input_length / block_size) long (what a Mooncake line must
// hold): cut, or continued by chaining the last hash with the block's index, so two
// requests with equal blocks get equal continuations (an engine's chat template adds the
// same tokens to equal prompts).
void FitBlocks(std::vector<uint64_t>& hashes, int64_t input_length, int64_t block_size);

// Every 1/rate-th request, spread evenly (request n is taken when floor((n+1) rate) >
// floor(n rate)): deterministic, and the same share in any window. Thread-safe.
class Sampler {
 public:
  explicit Sampler(double rate) : rate_(rate) {}
  bool Take();

 private:
  double rate_;
  std::atomic<uint64_t> n_{0};
};

// One routed request, as the front end saw it end.
struct Entry {
  double arrival_s = 0.0;       // front end's clock (seconds) when the request arrived
  PromptBlocks prompt;
  int64_t prompt_tokens = -1;   // the engine's usage.prompt_tokens; -1: not reported
  int64_t output_tokens = -1;   // usage.completion_tokens, else chunks streamed; -1: unknown
  int64_t max_tokens = -1;      // what the request asked for; -1: not stated
  int64_t cached_tokens = -1;   // usage.prompt_tokens_details.cached_tokens; -1: not reported
  double ttft_s = -1.0;         // arrival to the first response byte; -1: none came
  int status = 0;
  std::string api;              // the request's path: "/v1/chat/completions", ...
  std::string model;            // as the request named it (an adapter is a model name)
  std::string endpoint;         // the endpoint that answered; empty: none
  std::string session;          // the session header's value; empty: none
};

// Writes entries as lines of one file: hash ids and sessions get integers per file in order
// of first appearance; Reset() starts a new file's numbering.
class LineFormatter {
 public:
  explicit LineFormatter(int64_t block_size) : block_size_(block_size) {}
  // Appends the entry's JSON line (ending in '\n') to `out`. `origin_s`: the capture's
  // start on the front end's clock; timestamps are milliseconds since it (never negative).
  void Append(Entry& e, double origin_s, std::string& out);
  void Reset();
  std::size_t distinct_ids() const { return ids_.size(); }

 private:
  int64_t block_size_;
  std::unordered_map<uint64_t, uint64_t> ids_;
  std::unordered_map<std::string, uint64_t> sessions_;
};

// An entry for a request the front end parsed, at `arrival_s`: its prompt's blocks (its
// token ids when it has them, else its text), path, model, max_tokens and session.
Entry StartEntry(const Sink& sink, const api::ParsedRequest& request, std::string_view path,
                 std::string_view session, double arrival_s);

// Where a front end hands its captured requests (adapters/capture's CaptureLog; a test's
// recorder). Every call may come from any thread.
class Sink {
 public:
  virtual ~Sink() = default;
  // Whether the next request is written (capture.sample).
  virtual bool Sample() = 0;
  // The chain key and block size the front end hashes prompts with (HashPrompt).
  virtual uint64_t key() const = 0;
  virtual int64_t block_size() const = 0;
  // One finished request; never waits on I/O.
  virtual void Submit(Entry&& e) = 0;
};

}  // namespace kvroute::capture
