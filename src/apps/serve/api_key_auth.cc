#include "apps/serve/api_key_auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <utility>

#include "config/api_keys.h"
#include "core/metrics/prom_writer.h"

namespace kvroute::router {

using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

struct ApiKeyAuth::KeySet {
  struct Key {
    Digest digest;
    std::atomic<uint64_t>* accepted;  // in ApiKeyAuth::accepted_, which outlives every set
  };
  std::vector<Key> keys;
  std::string upstream_authorization;  // "Bearer <key>" with replace, else empty
};

namespace {

Digest Sha256(std::string_view s) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

// The token of "Bearer <token>" (scheme case-insensitive, RFC 9110 section 11.1); nullopt
// for another scheme or no token.
std::optional<std::string_view> BearerToken(std::string_view v) {
  constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size() || (v[kScheme.size()] != ' ' && v[kScheme.size()] != '\t')) {
    return std::nullopt;
  }
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    const char c = v[i] >= 'A' && v[i] <= 'Z' ? static_cast<char>(v[i] - 'A' + 'a') : v[i];
    if (c != kScheme[i]) return std::nullopt;
  }
  v.remove_prefix(kScheme.size());
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return std::nullopt;
  return v;
}

uint64_t Fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

ApiKeyAuth::ApiKeyAuth(config::AuthConfig config, int workers, pool::FileSystem& fs,
                       std::function<void(std::string_view)> log)
    : config_(std::move(config)),
      fs_(fs),
      log_(std::move(log)),
      current_(std::make_shared<const KeySet>()),
      views_(static_cast<std::size_t>(std::max(1, workers))) {}

Status ApiKeyAuth::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  primed_ = true;
  keys_stamp_ = fs_.Stat(config_.api_keys_file_path);
  if (!config_.upstream_api_key_file_path.empty()) upstream_stamp_ = fs_.Stat(config_.upstream_api_key_file_path);
  return ReadAndApply(true);
}

void ApiKeyAuth::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  // Stat before reading: a write landing between the two shows as a new stamp next time.
  const pool::FileStamp keys = fs_.Stat(config_.api_keys_file_path);
  const pool::FileStamp upstream = config_.upstream_api_key_file_path.empty()
                                       ? pool::FileStamp{}
                                       : fs_.Stat(config_.upstream_api_key_file_path);
  if (primed_ && keys == keys_stamp_ && upstream == upstream_stamp_) return;
  primed_ = true;
  keys_stamp_ = keys;
  upstream_stamp_ = upstream;
  ReadAndApply(false);
}

void ApiKeyAuth::Reload() {
  std::lock_guard<std::mutex> lock(mu_);
  ReadAndApply(false);
}

Status ApiKeyAuth::ReadAndApply(bool initial) {
  auto reject = [&](const config::ConfigError& e) {
    std::string error = e.ToString();
    if (!initial) {
      ++reloads_rejected_;
      if (error != last_error_ && log_) {
        log_("API keys not reloaded, keeping the " + std::to_string(keys_loaded_) + " running: " + error);
      }
    }
    last_error_ = error;
    return Status::InvalidArgument(std::move(error));
  };
  config::ConfigOr<std::string> text = fs_.Read(config_.api_keys_file_path);
  if (!text.ok()) return reject(text.error);
  std::string upstream_text;
  if (!config_.upstream_api_key_file_path.empty()) {
    config::ConfigOr<std::string> up = fs_.Read(config_.upstream_api_key_file_path);
    if (!up.ok()) return reject(up.error);
    upstream_text = std::move(*up.value);
  }
  const uint64_t hash = Fnv1a(upstream_text, Fnv1a(*text.value) ^ 0x9e3779b97f4a7c15ull);
  if (has_applied_ && hash == applied_hash_) {
    if (!last_error_.empty() && log_) log_("API keys files valid again: the running keys stay");
    last_error_.clear();
    return Status::Ok();
  }
  config::ConfigOr<std::vector<config::ApiKeyEntry>> keys =
      config::ParseApiKeys(*text.value, config_.api_keys_file_path);
  if (!keys.ok()) return reject(keys.error);
  auto set = std::make_shared<KeySet>();
  if (!config_.upstream_api_key_file_path.empty()) {
    config::ConfigOr<std::string> up =
        config::ParseUpstreamApiKey(upstream_text, config_.upstream_api_key_file_path);
    if (!up.ok()) return reject(up.error);
    set->upstream_authorization = "Bearer " + *up.value;
  }
  set->keys.reserve(keys.value->size());
  for (const config::ApiKeyEntry& e : *keys.value) {
    set->keys.push_back({Sha256(e.key), &accepted_.try_emplace(e.name).first->second});
  }
  // Best effort: the plain keys' buffers are overwritten before they are freed.
  for (config::ApiKeyEntry& e : *keys.value) OPENSSL_cleanse(e.key.data(), e.key.size());
  OPENSSL_cleanse(text.value->data(), text.value->size());
  keys_loaded_ = set->keys.size();
  current_.store(std::move(set));
  generation_.fetch_add(1, std::memory_order_release);
  has_applied_ = true;
  applied_hash_ = hash;
  last_error_.clear();
  if (!initial) {
    ++reloads_applied_;
    if (log_) {
      log_("API keys reloaded from " + config_.api_keys_file_path + ": " + std::to_string(keys_loaded_) +
           " loaded");
    }
  }
  return Status::Ok();
}

const ApiKeyAuth::KeySet* ApiKeyAuth::View(int worker) {
  WorkerView& v = views_[static_cast<std::size_t>(worker) % views_.size()];
  const uint64_t g = generation_.load(std::memory_order_acquire);
  if (v.generation != g) {
    v.set = current_.load();
    v.generation = g;
  }
  return v.set.get();
}

AuthVerdict ApiKeyAuth::Check(std::string_view authorization, int worker, bool count_accepted) {
  if (authorization.empty()) {
    rejected_missing_.fetch_add(1, std::memory_order_relaxed);
    return AuthVerdict::kMissing;
  }
  const std::optional<std::string_view> token = BearerToken(authorization);
  const KeySet* set = View(worker);
  // A missing token is still hashed and compared: the refusal takes the time a wrong key does.
  const Digest presented = Sha256(token.value_or(std::string_view()));
  std::atomic<uint64_t>* matched = nullptr;
  for (const KeySet::Key& k : set->keys) {
    const bool equal = CRYPTO_memcmp(presented.data(), k.digest.data(), presented.size()) == 0;
    if (equal) matched = k.accepted;
  }
  if (!token || matched == nullptr) {
    rejected_invalid_.fetch_add(1, std::memory_order_relaxed);
    return AuthVerdict::kInvalid;
  }
  if (count_accepted) matched->fetch_add(1, std::memory_order_relaxed);
  return AuthVerdict::kAccepted;
}

std::string_view ApiKeyAuth::UpstreamAuthorization(int worker) {
  return View(worker)->upstream_authorization;
}

void ApiKeyAuth::AppendMetrics(std::string& out) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics::AppendHeader(out, "kvroute_auth_requests_total",
                        "Requests under /v1 accepted, by the name of the API key they carried.",
                        metrics::MetricType::kCounter);
  for (const auto& [name, count] : accepted_) {
    const metrics::Label key{"key", name};
    metrics::AppendSample(out, "kvroute_auth_requests_total", {&key, 1},
                          static_cast<double>(count.load(std::memory_order_relaxed)));
  }
  auto load = [](const std::atomic<uint64_t>& a) {
    return static_cast<double>(a.load(std::memory_order_relaxed));
  };
  const metrics::LabeledValue rejected[] = {{"missing", load(rejected_missing_)},
                                            {"invalid", load(rejected_invalid_)}};
  metrics::AppendCounterFamily(out, "kvroute_auth_rejected_total",
                               "Requests under /v1 refused with 401: no Authorization header "
                               "(missing), or another scheme or an unknown key (invalid).",
                               "reason", rejected);
  metrics::AppendGauge(out, "kvroute_auth_keys", "API keys loaded now.", {},
                       static_cast<double>(keys_loaded_));
  const metrics::LabeledValue reloads[] = {{"applied", static_cast<double>(reloads_applied_)},
                                           {"rejected", static_cast<double>(reloads_rejected_)}};
  metrics::AppendCounterFamily(out, "kvroute_auth_reloads_total",
                               "API key file re-reads that changed the keys (applied) or found a "
                               "broken file and kept the running keys (rejected).",
                               "result", reloads);
}

}  // namespace kvroute::router
