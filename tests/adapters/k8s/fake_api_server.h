// A stand-in for the Kubernetes API server's wire protocol, for tests: no cluster runs
// here. It speaks what kvroute's discovery meets in a real cluster (REFERENCE.md 12), over
// real TLS on loopback (port 0, or a fixed port to start it after its client):
//   GET COLLECTION[?labelSelector=..][&fieldSelector=metadata.name%3DNAME]
//       -> a List (PodList, InferencePoolList, ...) with metadata.resourceVersion
//   GET COLLECTION/NAME                  -> the object, or 404 Status (reason NotFound)
//   GET COLLECTION?watch=1&resourceVersion=RV&allowWatchBookmarks=true[&selectors]
//       -> 200, chunked, one JSON event per line: the collection's stored events after RV
//          that pass the selectors, then new ones; an object modified out of the label
//          selector comes as DELETED (its previous content), one modified into it as
//          ADDED, as the real server's watch cache does; BOOKMARK events; an ERROR Status
//          with code 410 when RV is older than the last compaction (or on Compact() for
//          open watches); a clean end on DropWatches() or after timeoutSeconds, as the
//          real server ends a watch after its timeout. No RV, or RV "0": from now (the
//          real server would first replay the current objects as ADDED; here the
//          client's list gives them)
//   anything without "Authorization: Bearer <token>" -> 401 Status
//   the next N requests after FailNext(status, N)    -> that status, with a Status body
//   a path that is no known collection (a CRD not installed) -> 404 Status, NotFound
// Collections are named by their list path: "/api/v1/namespaces/NS/pods" always exists;
// "/apis/GROUP/VERSION/namespaces/NS/RESOURCE" after InstallCrd. One resourceVersion
// counter for the whole server, like etcd's.
//
// The CA (unless Options::pki gives one) and the server certificate (SAN IP:127.0.0.1,
// DNS:localhost) are generated at start with OpenSSL's API; nothing is committed. Each connection has its own thread
// (blocking Beast), which keeps this simple and obviously right; tests only. Test-helper
// misuse (bad JSON given to Put, an unknown collection) throws std::invalid_argument.
//
// Thread: every public member may be called from any thread.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <simdjson.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "adapters/tls/pki.h"

namespace kvroute::k8s::testing {

// The private CA the stand-in serves under (src/adapters/tls/pki.h).
using TestPki = tls::Authority;

namespace fake_api_detail {

// `s` as a JSON string literal, quotes included.
inline std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// {"k":"v",...} in key order.
inline std::string StringMapJson(const std::map<std::string, std::string>& m) {
  std::string out = "{";
  for (const auto& [k, v] : m) out += (out.size() > 1 ? "," : "") + Quote(k) + ":" + Quote(v);
  return out + "}";
}

// A query component: %XX decoded, '+' read as a space (Go's url.ParseQuery does the same).
inline std::string PercentDecode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The query of a request target, decoded; a repeated key keeps its last value.
inline std::map<std::string, std::string> QueryParams(std::string_view target) {
  std::map<std::string, std::string> out;
  size_t q = target.find('?');
  if (q == std::string_view::npos) return out;
  std::string_view qs = target.substr(q + 1);
  while (!qs.empty()) {
    size_t amp = qs.find('&');
    std::string_view part = qs.substr(0, amp);
    qs = amp == std::string_view::npos ? std::string_view() : qs.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    out[PercentDecode(part.substr(0, eq))] =
        eq == std::string_view::npos ? "" : PercentDecode(part.substr(eq + 1));
  }
  return out;
}

inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A label selector in the API's string form (what labels.Parse accepts, less the numeric
// comparisons): comma-separated requirements "k=v", "k==v", "k!=v", "k in (a,b)",
// "k notin (a,b)", "k" (exists), "!k" (does not exist). Every requirement must hold;
// "k!=v" and "notin" also hold when the label is absent, as in Kubernetes.
class LabelSelector {
 public:
  // "" on success, else why `text` is not a selector.
  std::string Parse(std::string_view text) {
    reqs_.clear();
    std::vector<std::string_view> terms;
    int depth = 0;
    size_t from = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
      if (i == text.size() || (text[i] == ',' && depth == 0)) {
        terms.push_back(text.substr(from, i - from));
        from = i + 1;
      } else if (text[i] == '(') {
        ++depth;
      } else if (text[i] == ')') {
        --depth;
      }
    }
    if (depth != 0) return "unbalanced parentheses in \"" + std::string(text) + "\"";
    if (terms.size() == 1 && Trim(terms[0]).empty()) return "";  // everything
    for (std::string_view term : terms) {
      std::string error = ParseTerm(Trim(term));
      if (!error.empty()) return error;
    }
    return "";
  }

  bool Matches(const std::map<std::string, std::string>& labels) const {
    for (const Requirement& r : reqs_) {
      auto it = labels.find(r.key);
      bool has = it != labels.end();
      bool in = false;
      for (const std::string& v : r.values) in = in || (has && it->second == v);
      switch (r.op) {
        case Op::kExists:
          if (!has) return false;
          break;
        case Op::kNotExists:
          if (has) return false;
          break;
        case Op::kIn:
          if (!in) return false;
          break;
        case Op::kNotIn:
          if (in) return false;
          break;
      }
    }
    return true;
  }

 private:
  enum class Op { kExists, kNotExists, kIn, kNotIn };  // "=" is "in" one value
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };

  static bool KeyChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == '/';
  }

  std::string ParseTerm(std::string_view term) {
    const std::string bad = "unable to parse requirement: \"" + std::string(term) + "\"";
    Requirement r;
    if (!term.empty() && term.front() == '!') {
      r.key = std::string(Trim(term.substr(1)));
      r.op = Op::kNotExists;
      if (r.key.empty() || !std::all_of(r.key.begin(), r.key.end(), KeyChar)) return bad;
      reqs_.push_back(std::move(r));
      return "";
    }
    size_t i = 0;
    while (i < term.size() && KeyChar(term[i])) ++i;
    r.key = std::string(term.substr(0, i));
    if (r.key.empty()) return bad;
    std::string_view rest = Trim(term.substr(i));
    if (rest.empty()) {
      r.op = Op::kExists;
    } else if (rest.rfind("!=", 0) == 0 || rest.rfind("==", 0) == 0 || rest.front() == '=') {
      r.op = rest.front() == '!' ? Op::kNotIn : Op::kIn;
      size_t op_len = rest.rfind("==", 0) == 0 || rest.rfind("!=", 0) == 0 ? 2 : 1;
      std::string_view value = Trim(rest.substr(op_len));
      if (!std::all_of(value.begin(), value.end(), KeyChar)) return bad;
      r.values.emplace_back(value);
    } else {
      size_t w = 0;
      while (w < rest.size() && std::isalpha(static_cast<unsigned char>(rest[w]))) ++w;
      std::string_view word = rest.substr(0, w);
      if (word != "in" && word != "notin") return bad;
      r.op = word == "in" ? Op::kIn : Op::kNotIn;
      std::string_view set = Trim(rest.substr(w));
      if (set.size() < 2 || set.front() != '(' || set.back() != ')') return bad;
      set = set.substr(1, set.size() - 2);
      while (true) {
        size_t comma = set.find(',');
        std::string_view value = Trim(set.substr(0, comma));
        if (!std::all_of(value.begin(), value.end(), KeyChar)) return bad;
        r.values.emplace_back(value);
        if (comma == std::string_view::npos) break;
        set = set.substr(comma + 1);
      }
    }
    reqs_.push_back(std::move(r));
    return "";
  }

  std::vector<Requirement> reqs_;
};

// A field selector on the two fields every resource supports: metadata.name and
// metadata.namespace, with "=", "==" or "!=", comma-separated.
class FieldSelector {
 public:
  std::string Parse(std::string_view text) {
    terms_.clear();
    if (Trim(text).empty()) return "";
    while (true) {
      size_t comma = text.find(',');
      std::string_view term = Trim(text.substr(0, comma));
      size_t op = term.find_first_of("!=");
      if (op == std::string_view::npos)
        return "invalid field selector: \"" + std::string(term) + "\"";
      Term t;
      std::string_view field = Trim(term.substr(0, op));
      t.negate = term[op] == '!';
      size_t value_at = op + (t.negate || term.substr(op, 2) == "==" ? 2 : 1);
      if (t.negate && term.substr(op, 2) != "!=") {
        return "invalid field selector: \"" + std::string(term) + "\"";
      }
      t.value = std::string(Trim(term.substr(std::min(value_at, term.size()))));
      if (field == "metadata.name") {
        t.namespace_field = false;
      } else if (field == "metadata.namespace") {
        t.namespace_field = true;
      } else {
        return "field label not supported: " + std::string(field);
      }
      terms_.push_back(std::move(t));
      if (comma == std::string_view::npos) break;
      text = text.substr(comma + 1);
    }
    return "";
  }

  bool Matches(const std::string& name, const std::string& namespace_name) const {
    for (const Term& t : terms_) {
      bool equal = (t.namespace_field ? namespace_name : name) == t.value;
      if (equal == t.negate) return false;
    }
    return true;
  }

 private:
  struct Term {
    bool namespace_field = false;
    bool negate = false;
    std::string value;
  };
  std::vector<Term> terms_;
};

// What a collection path says about its objects.
struct CollectionInfo {
  std::string api_version;     // "v1", "inference.networking.k8s.io/v1"
  std::string resource;        // "pods", "inferencepools"
  std::string kind;            // "Pod", "InferencePool"
  std::string namespace_name;  // "" for a cluster-scoped collection
};

// "/api/v1/namespaces/NS/RES" or "/apis/GROUP/VERSION[/namespaces/NS]/RES"; nullopt when
// `path` is neither. `kind` overrides the kind derived from the resource name.
inline std::optional<CollectionInfo> DescribeCollection(std::string_view path,
                                                        std::string_view kind = "") {
  std::vector<std::string_view> seg;
  if (path.empty() || path.front() != '/' || path.back() == '/') return std::nullopt;
  for (size_t from = 1; from <= path.size();) {
    size_t slash = path.find('/', from);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash == from) return std::nullopt;  // an empty segment
    seg.push_back(path.substr(from, slash - from));
    from = slash + 1;
  }
  CollectionInfo info;
  size_t rest = 0;
  if (seg.size() >= 2 && seg[0] == "api") {
    info.api_version = std::string(seg[1]);
    rest = 2;
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    info.api_version = std::string(seg[1]) + "/" + std::string(seg[2]);
    rest = 3;
  } else {
    return std::nullopt;
  }
  if (seg.size() == rest + 3 && seg[rest] == "namespaces") {
    info.namespace_name = std::string(seg[rest + 1]);
    info.resource = std::string(seg[rest + 2]);
  } else if (seg.size() == rest + 1) {
    info.resource = std::string(seg[rest]);
  } else {
    return std::nullopt;
  }
  if (!kind.empty()) {
    info.kind = std::string(kind);
  } else {
    static const std::map<std::string, std::string, std::less<>> kKinds = {
        {"pods", "Pod"},
        {"services", "Service"},
        {"endpointslices", "EndpointSlice"},
        {"inferencepools", "InferencePool"},
        {"inferenceobjectives", "InferenceObjective"},
        {"inferencemodels", "InferenceModel"}};
    auto it = kKinds.find(info.resource);
    if (it != kKinds.end()) {
      info.kind = it->second;
    } else {  // "widgets" -> "Widget"
      info.kind = info.resource;
      if (info.kind.size() > 1 && info.kind.back() == 's') info.kind.pop_back();
      info.kind[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(info.kind[0])));
    }
  }
  return info;
}

inline bool IsPodCollection(std::string_view path) {
  auto info = DescribeCollection(path);
  return info && info->api_version == "v1" && info->resource == "pods" &&
         !info->namespace_name.empty();
}

// Standard base64 with padding.
inline std::string Base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t n =
        (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(n >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t n = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) n |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace fake_api_detail

struct FakeApiServerOptions {
  std::string token = "test-token";
  bool require_client_cert = false;  // verified against pki().cert_pem()
  // 0: any free port. A fixed port lets a test start the server after its client ("API
  // server down at start, then up") or start a new one where an old one was.
  uint16_t port = 0;
  // The CA to serve under (a fresh one when null): give the client's CA to a server
  // started after it.
  std::shared_ptr<TestPki> pki;
};

class FakeApiServer {
 public:
  using Options = FakeApiServerOptions;

  // Listening when the constructor returns; throws boost::system::system_error when the
  // port is taken.
  explicit FakeApiServer(Options options = {})
      : options_(std::move(options)),
        pki_(options_.pki ? options_.pki : std::make_shared<TestPki>()),
        server_leaf_(pki_->Issue("kube-apiserver", "IP:127.0.0.1,DNS:localhost")),
        tls_(boost::asio::ssl::context::tls_server),
        acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), options_.port}) {
    tls_.use_certificate_chain(boost::asio::buffer(server_leaf_.cert_pem));
    tls_.use_private_key(boost::asio::buffer(server_leaf_.key_pem), boost::asio::ssl::context::pem);
    if (options_.require_client_cert) {
      tls_.add_certificate_authority(boost::asio::buffer(pki_->cert_pem()));
      tls_.set_verify_mode(boost::asio::ssl::verify_peer |
                           boost::asio::ssl::verify_fail_if_no_peer_cert);
    }
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeApiServer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    try {  // wake the blocking accept
      boost::asio::ip::tcp::socket s(io_);
      s.connect({boost::asio::ip::make_address("127.0.0.1"), port_});
    } catch (...) {
    }
    accept_thread_.join();
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& c : conns_) ::shutdown(c->stream->lowest_layer().native_handle(), SHUT_RDWR);
    }
    for (auto& c : conns_) c->thread.join();
  }
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  uint16_t port() const { return port_; }
  TestPki& pki() { return *pki_; }
  const Options& options() const { return options_; }

  // Makes the custom-resource collection `collection` (a list path such as
  // "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools") exist; until
  // then every request under it is 404 NotFound. `kind` overrides the kind derived from
  // the resource name (inferencepools -> InferencePool; widgets -> Widget). Idempotent.
  void InstallCrd(const std::string& collection, const std::string& kind = "") {
    auto info = fake_api_detail::DescribeCollection(collection, kind);
    if (!info) throw std::invalid_argument("not a collection path: " + collection);
    std::lock_guard<std::mutex> l(mu_);
    collections_.try_emplace(collection, Collection{*info, {}});
  }

  // Stores `object_json` (a full object with metadata.name) under collection/name at the
  // next resourceVersion, which it returns and writes into metadata.resourceVersion
  // (replacing any given); fills in kind, apiVersion and metadata.namespace when absent.
  // Emits ADDED for a new name, else MODIFIED. Throws std::invalid_argument for JSON that
  // is not such an object, a namespace other than the collection's, or an unknown
  // collection (a CRD not installed).
  int Put(const std::string& collection, const std::string& object_json) {
    std::lock_guard<std::mutex> l(mu_);
    Collection* c = FindCollection(collection);
    if (!c) throw std::invalid_argument("no collection " + collection + " (InstallCrd first)");
    auto stored = std::make_shared<Stored>(Normalize(object_json, c->info));
    stored->rv = ++rv_;
    std::shared_ptr<const Stored>& slot = c->objects[stored->name];
    events_.push_back({rv_, collection, slot ? "MODIFIED" : "ADDED", stored, slot, TakeSplit()});
    slot = stored;
    cv_.notify_all();
    return rv_;
  }

  // Removes collection/name at the next resourceVersion, which it returns, emitting
  // DELETED with the last object (at the deletion's resourceVersion). 0 and nothing
  // emitted when there is no such object.
  int Delete(const std::string& collection, const std::string& name) {
    std::lock_guard<std::mutex> l(mu_);
    Collection* c = FindCollection(collection);
    if (!c) return 0;
    auto it = c->objects.find(name);
    if (it == c->objects.end()) return 0;
    ++rv_;
    events_.push_back({rv_, collection, "DELETED", it->second, nullptr, TakeSplit()});
    c->objects.erase(it);
    cv_.notify_all();
    return rv_;
  }

  // The next stored event is written to each watch in two chunks 30 ms apart (a client
  // must reassemble the line).
  void SplitNextEvent() {
    std::lock_guard<std::mutex> l(mu_);
    split_next_ = true;
  }

  // A BOOKMARK at the current resourceVersion to every open watch (not stored: a watch
  // opened later does not see it). Its object is {kind, apiVersion, metadata:
  // {resourceVersion}} of the watch's collection.
  void Bookmark() {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back({rv_, "", "BOOKMARK", nullptr, nullptr, false});
    cv_.notify_all();
  }
  // Forgets history up to now: open watches get an ERROR 410 event and end; a watch from
  // an older resourceVersion gets the same.
  void Compact() {
    std::lock_guard<std::mutex> l(mu_);
    compacted_ = rv_;
    ++compact_generation_;
    cv_.notify_all();
  }
  // Ends every open watch cleanly (last chunk, connection closed).
  void DropWatches() {
    std::lock_guard<std::mutex> l(mu_);
    ++drop_generation_;
    cv_.notify_all();
  }
  // The next `count` requests (any path, before authentication) answer `http_status` with
  // a Status body; 429 and 503 also carry "Retry-After: 1".
  void FailNext(int http_status, int count = 1) {
    std::lock_guard<std::mutex> l(mu_);
    fail_status_ = http_status;
    fail_remaining_ = count;
  }

  int resource_version() {
    std::lock_guard<std::mutex> l(mu_);
    return rv_;
  }
  int open_watches() {
    std::lock_guard<std::mutex> l(mu_);
    return open_watches_;
  }
  std::vector<std::string> targets() {  // every request target, in arrival order
    std::lock_guard<std::mutex> l(mu_);
    return targets_;
  }

  // A kubeconfig for this server: cluster, user (the bearer token), one context "fake"
  // (with `namespace_name` unless empty), current-context "fake".
  std::string KubeconfigYaml(const std::string& namespace_name = "") const {
    std::string y = "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n";
    y += "    server: https://127.0.0.1:" + std::to_string(port_) + "\n";
    y += "    certificate-authority-data: " + fake_api_detail::Base64(pki_->cert_pem()) + "\n";
    y += "users:\n- name: fake\n  user:\n    token: " + fake_api_detail::Quote(options_.token) +
         "\n";
    y += "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n";
    if (!namespace_name.empty())
      y += "    namespace: " + fake_api_detail::Quote(namespace_name) + "\n";
    y += "current-context: fake\n";
    return y;
  }

  // Ready-made objects. A pod: Running, with a Ready condition of `ready`, status.podIP
  // `ip` (none when empty), a deletionTimestamp when `deleting`.
  static std::string PodJson(const std::string& name, const std::string& ip, bool ready,
                             const std::map<std::string, std::string>& labels,
                             bool deleting = false) {
    using fake_api_detail::Quote;
    std::string j =
        "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":" + Quote(name) +
        ",\"labels\":" + fake_api_detail::StringMapJson(labels);
    if (deleting) j += ",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"";
    j += "},\"spec\":{\"containers\":[{\"name\":\"vllm\"}]},\"status\":{\"phase\":\"Running\"";
    if (!ip.empty()) j += ",\"podIP\":" + Quote(ip) + ",\"podIPs\":[{\"ip\":" + Quote(ip) + "}]";
    j += ",\"conditions\":[{\"type\":\"Ready\",\"status\":\"";
    j += ready ? "True" : "False";
    return j + "\"}]}}";
  }
  // An inference.networking.k8s.io/v1 InferencePool: spec.selector.matchLabels,
  // spec.targetPorts[].number, spec.endpointPickerRef {name "<name>-epp", port 9002}.
  static std::string PoolV1Json(const std::string& name,
                                const std::map<std::string, std::string>& match_labels,
                                const std::vector<int>& ports) {
    using fake_api_detail::Quote;
    std::string j =
        "{\"apiVersion\":\"inference.networking.k8s.io/v1\",\"kind\":\"InferencePool\","
        "\"metadata\":{\"name\":" +
        Quote(name) + "},\"spec\":{\"selector\":{\"matchLabels\":" +
        fake_api_detail::StringMapJson(match_labels) + "},\"targetPorts\":[";
    for (size_t i = 0; i < ports.size(); ++i) {
      j += (i ? ",{\"number\":" : "{\"number\":") + std::to_string(ports[i]) + "}";
    }
    return j + "],\"endpointPickerRef\":{\"name\":" + Quote(name + "-epp") +
           ",\"port\":{\"number\":9002},\"failureMode\":\"FailClose\"}}}";
  }
  // The seed's inference.networking.x-k8s.io/v1alpha2 InferencePool: spec.selector (a
  // plain map), spec.targetPortNumber, spec.extensionRef.name "<name>-epp".
  static std::string PoolV1Alpha2Json(const std::string& name,
                                      const std::map<std::string, std::string>& selector,
                                      int port) {
    using fake_api_detail::Quote;
    return "{\"apiVersion\":\"inference.networking.x-k8s.io/v1alpha2\",\"kind\":\"InferencePool\","
           "\"metadata\":{\"name\":" +
           Quote(name) + "},\"spec\":{\"selector\":" + fake_api_detail::StringMapJson(selector) +
           ",\"targetPortNumber\":" + std::to_string(port) +
           ",\"extensionRef\":{\"name\":" + Quote(name + "-epp") + "}}}";
  }
  // An InferenceObjective of `api_version` (e.g. "llm-d.ai/v1alpha2"): spec.priority,
  // spec.poolRef.name.
  static std::string ObjectiveJson(const std::string& api_version, const std::string& name,
                                   const std::string& pool, int priority) {
    using fake_api_detail::Quote;
    return "{\"apiVersion\":" + Quote(api_version) +
           ",\"kind\":\"InferenceObjective\","
           "\"metadata\":{\"name\":" +
           Quote(name) + "},\"spec\":{\"priority\":" + std::to_string(priority) +
           ",\"poolRef\":{\"name\":" + Quote(pool) + "}}}";
  }

  // A Status body as the API server writes it.
  static std::string StatusJson(int code, const std::string& message,
                                const std::string& details_json = "") {
    std::string j =
        "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
        "\"message\":" +
        fake_api_detail::Quote(message) + ",\"reason\":" + fake_api_detail::Quote(Reason(code));
    if (!details_json.empty()) j += ",\"details\":" + details_json;
    return j + ",\"code\":" + std::to_string(code) + "}";
  }

 private:
  using Stream = boost::asio::ssl::stream<boost::asio::ip::tcp::socket>;

  // An object as stored: its JSON with the resourceVersion cut out, so it can be written
  // at any version (a DELETED event carries the deletion's).
  struct Stored {
    std::string name;
    std::map<std::string, std::string> labels;
    std::string head, tail;  // the JSON is head + resourceVersion + tail
    int rv = 0;
    std::string Json(int at) const { return head + std::to_string(at) + tail; }
    std::string Json() const { return Json(rv); }
  };
  struct Collection {
    fake_api_detail::CollectionInfo info;
    std::map<std::string, std::shared_ptr<const Stored>> objects;  // by name, listed in order
  };
  struct Event {
    int rv;
    std::string collection;                  // "" for a bookmark, which goes to every watch
    std::string type;                        // ADDED, MODIFIED, DELETED, BOOKMARK
    std::shared_ptr<const Stored> object;    // the new object; DELETED: the last one
    std::shared_ptr<const Stored> previous;  // MODIFIED: the object it replaced
    bool split;
  };
  struct Conn {
    std::shared_ptr<Stream> stream;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct Filter {
    fake_api_detail::LabelSelector labels;
    fake_api_detail::FieldSelector fields;
    bool Matches(const Stored& o, const std::string& namespace_name) const {
      return labels.Matches(o.labels) && fields.Matches(o.name, namespace_name);
    }
  };

  static std::string Reason(int code) {
    switch (code) {
      case 400:
        return "BadRequest";
      case 401:
        return "Unauthorized";
      case 403:
        return "Forbidden";
      case 404:
        return "NotFound";
      case 405:
        return "MethodNotAllowed";
      case 409:
        return "Conflict";
      case 410:
        return "Expired";
      case 422:
        return "Invalid";
      case 429:
        return "TooManyRequests";
      case 500:
        return "InternalError";
      case 503:
        return "ServiceUnavailable";
      case 504:
        return "Timeout";
      default:
        return "Unknown";
    }
  }

  bool TakeSplit() {
    bool s = split_next_;
    split_next_ = false;
    return s;
  }

  // The collection at exactly `path`: an installed one, or a pod collection (made on first
  // use). Null otherwise. Caller holds mu_.
  Collection* FindCollection(const std::string& path) {
    auto it = collections_.find(path);
    if (it != collections_.end()) return &it->second;
    if (!fake_api_detail::IsPodCollection(path)) return nullptr;
    return &collections_.emplace(path, Collection{*fake_api_detail::DescribeCollection(path), {}})
                .first->second;
  }

  // `json` rewritten as the server stores it. Throws std::invalid_argument.
  static Stored Normalize(const std::string& json, const fake_api_detail::CollectionInfo& info) {
    using fake_api_detail::Quote;
    auto fail = [&](const std::string& why) -> std::invalid_argument {
      return std::invalid_argument("Put " + info.resource + ": " + why);
    };
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    simdjson::dom::object obj, meta;
    if (parser.parse(json).get(root)) throw fail("not valid JSON");
    if (root.get_object().get(obj)) throw fail("not a JSON object");
    if (obj["metadata"].get_object().get(meta)) throw fail("no metadata object");
    Stored s;
    std::string_view name;
    if (meta["name"].get_string().get(name) || name.empty()) throw fail("no metadata.name");
    s.name = std::string(name);
    simdjson::dom::element labels;
    if (meta["labels"].get(labels) == simdjson::SUCCESS && !labels.is_null()) {
      simdjson::dom::object lo;
      if (labels.get_object().get(lo)) throw fail("metadata.labels is not an object");
      for (auto [k, v] : lo) {
        std::string_view value;
        if (v.get_string().get(value)) throw fail("label " + std::string(k) + " is not a string");
        s.labels[std::string(k)] = std::string(value);
      }
    }
    std::string_view ns;
    bool has_ns = meta["namespace"].get_string().get(ns) == simdjson::SUCCESS;
    if (has_ns && ns != info.namespace_name) {
      throw fail("metadata.namespace \"" + std::string(ns) + "\" is not the collection's");
    }

    std::string out = "{";
    auto sep = [&] {
      if (out.size() > 1 && out.back() != '{') out += ',';
    };
    simdjson::dom::element probe;
    if (obj["kind"].get(probe)) out += "\"kind\":" + Quote(info.kind);
    if (obj["apiVersion"].get(probe)) {
      sep();
      out += "\"apiVersion\":" + Quote(info.api_version);
    }
    size_t rv_at = 0;
    for (auto [key, value] : obj) {
      sep();
      out += Quote(key) + ":";
      if (key != "metadata") {
        out += simdjson::to_string(value);
        continue;
      }
      out += "{";
      for (auto [mk, mv] : meta) {
        if (mk == "resourceVersion") continue;
        sep();
        out += Quote(mk) + ":" + simdjson::to_string(mv);
      }
      if (!has_ns && !info.namespace_name.empty()) {
        sep();
        out += "\"namespace\":" + Quote(info.namespace_name);
      }
      sep();
      out += "\"resourceVersion\":\"";
      rv_at = out.size();
      out += "\"}";
    }
    out += "}";
    s.head = out.substr(0, rv_at);
    s.tail = out.substr(rv_at);
    return s;
  }

  // The line a watch with `filter` gets for `e`, or nullopt when it gets none.
  static std::optional<std::string> EventLine(const Event& e, const Collection& c,
                                              const Filter& filter) {
    using fake_api_detail::Quote;
    auto line = [](const char* type, const std::string& object) {
      return std::string("{\"type\":\"") + type + "\",\"object\":" + object + "}";
    };
    const std::string& ns = c.info.namespace_name;
    if (e.type == "BOOKMARK") {
      return line("BOOKMARK", "{\"kind\":" + Quote(c.info.kind) +
                                  ",\"apiVersion\":" + Quote(c.info.api_version) +
                                  ",\"metadata\":{\"resourceVersion\":\"" + std::to_string(e.rv) +
                                  "\"}}");
    }
    bool now = filter.Matches(*e.object, ns);
    if (e.type == "ADDED")
      return now ? std::optional(line("ADDED", e.object->Json())) : std::nullopt;
    if (e.type == "DELETED") {
      return now ? std::optional(line("DELETED", e.object->Json(e.rv))) : std::nullopt;
    }
    bool before = e.previous && filter.Matches(*e.previous, ns);
    if (now) return line(before ? "MODIFIED" : "ADDED", e.object->Json());
    // Left the selector: the watch cache sends the previous content, at this version.
    if (before) return line("DELETED", e.previous->Json(e.rv));
    return std::nullopt;
  }

  void AcceptLoop() {
    for (;;) {
      auto stream = std::make_shared<Stream>(io_, tls_);
      boost::system::error_code ec;
      acceptor_.accept(stream->lowest_layer(), ec);
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      if (ec) continue;
      for (auto it = conns_.begin(); it != conns_.end();) {  // reap finished connections
        if ((*it)->done) {
          (*it)->thread.join();
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      auto conn = std::make_unique<Conn>();
      conn->stream = stream;
      Conn* raw = conn.get();
      conn->thread = std::thread([this, raw] {
        Serve(*raw->stream);
        // Ends the TCP connection without closing the descriptor, which the destructor
        // may still shut down (a closed one could have been reused by then).
        ::shutdown(raw->stream->lowest_layer().native_handle(), SHUT_RDWR);
        raw->done = true;
      });
      conns_.push_back(std::move(conn));
    }
  }

  void Serve(Stream& stream) {
    namespace http = boost::beast::http;
    try {
      stream.handshake(boost::asio::ssl::stream_base::server);
      boost::beast::flat_buffer buffer;
      for (;;) {
        http::request<http::string_body> req;
        http::read(stream, buffer, req);
        std::string target(req.target());
        int fail = 0;
        {
          std::lock_guard<std::mutex> l(mu_);
          targets_.push_back(target);
          if (fail_remaining_ > 0) {
            --fail_remaining_;
            fail = fail_status_;
          }
        }
        if (fail != 0) {
          Reply(stream, req, fail, StatusJson(fail, "injected failure (FailNext)"));
          continue;
        }
        if (req[http::field::authorization] != "Bearer " + options_.token) {
          Reply(stream, req, 401, StatusJson(401, "Unauthorized"));
          continue;
        }
        if (req.method() != http::verb::get) {
          Reply(stream, req, 405, StatusJson(405, "the server does not allow this method"));
          continue;
        }
        if (!Handle(stream, req, target)) return;  // a watch ends its connection
        if (!req.keep_alive()) return;
      }
    } catch (const std::exception&) {
      // The client left, the handshake failed, or the server is stopping.
    }
  }

  // Answers one authenticated GET. False after a watch (the connection is done).
  template <typename Req>
  bool Handle(Stream& stream, const Req& req, const std::string& target) {
    std::string path = target.substr(0, target.find('?'));
    auto query = fake_api_detail::QueryParams(target);
    Filter filter;
    std::string error = filter.labels.Parse(query["labelSelector"]);
    if (error.empty()) error = filter.fields.Parse(query["fieldSelector"]);
    if (!error.empty()) {
      Reply(stream, req, 400, StatusJson(400, error));
      return true;
    }

    std::unique_lock<std::mutex> l(mu_);
    std::string collection = path, name;
    Collection* c = FindCollection(path);
    if (!c) {
      size_t slash = path.rfind('/');
      if (slash != std::string::npos && slash + 1 < path.size()) {
        collection = path.substr(0, slash);
        name = path.substr(slash + 1);
        c = FindCollection(collection);
      }
    }
    if (!c) {
      l.unlock();
      Reply(stream, req, 404, StatusJson(404, "the server could not find the requested resource"));
      return true;
    }
    if (query["watch"] == "1" || query["watch"] == "true") {
      if (!name.empty()) {  // the old per-name watch: a field selector on the name
        filter.fields.Parse(query["fieldSelector"].empty()
                                ? "metadata.name=" + name
                                : query["fieldSelector"] + ",metadata.name=" + name);
      }
      Watch(stream, req.version(), l, collection, filter, query);
      return false;
    }
    if (!name.empty()) {
      auto it = c->objects.find(name);
      if (it == c->objects.end()) {
        std::string message = c->info.resource + " \"" + name + "\" not found";
        std::string details = "{\"name\":" + fake_api_detail::Quote(name) +
                              ",\"kind\":" + fake_api_detail::Quote(c->info.resource) + "}";
        l.unlock();
        Reply(stream, req, 404, StatusJson(404, message, details));
        return true;
      }
      std::string body = it->second->Json();
      l.unlock();
      Reply(stream, req, 200, std::move(body));
      return true;
    }
    std::string body = "{\"kind\":" + fake_api_detail::Quote(c->info.kind + "List") +
                       ",\"apiVersion\":" + fake_api_detail::Quote(c->info.api_version) +
                       ",\"metadata\":{\"resourceVersion\":\"" + std::to_string(rv_) +
                       "\"},\"items\":[";
    bool first = true;
    for (const auto& [n, o] : c->objects) {
      if (!filter.Matches(*o, c->info.namespace_name)) continue;
      body += (first ? "" : ",") + o->Json();
      first = false;
    }
    body += "]}";
    l.unlock();
    Reply(stream, req, 200, std::move(body));
    return true;
  }

  template <typename Req>
  void Reply(Stream& stream, const Req& req, int status, std::string body) {
    namespace http = boost::beast::http;
    http::response<http::string_body> res(static_cast<http::status>(status), req.version());
    res.set(http::field::content_type, "application/json");
    if (status == 429 || status == 503) res.set(http::field::retry_after, "1");
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    http::write(stream, res);
  }

  // Streams `collection`'s events to the client until the watch ends. Called with `l`
  // holding mu_.
  void Watch(Stream& stream, unsigned http_version, std::unique_lock<std::mutex>& l,
             const std::string& collection, const Filter& filter,
             std::map<std::string, std::string>& query) {
    namespace http = boost::beast::http;
    const std::string rv_text = query["resourceVersion"];
    int from = -1;  // from now
    if (!rv_text.empty() && rv_text != "0") {
      try {
        from = std::stoi(rv_text);
      } catch (const std::exception&) {
        l.unlock();
        http::response<http::string_body> res(http::status::bad_request, http_version);
        res.set(http::field::content_type, "application/json");
        res.body() = StatusJson(400, "invalid resourceVersion: " + rv_text);
        res.prepare_payload();
        http::write(stream, res);
        return;
      }
    }
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (!query["timeoutSeconds"].empty()) {
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::seconds(std::atoi(query["timeoutSeconds"].c_str()));
    }
    const Collection& c = collections_.at(collection);  // std::map: stable while we unlock
    // Where the watch starts is fixed now, when the request arrived.
    const bool too_old = from >= 0 && from < compacted_;
    const size_t live_from = events_.size();  // bookmarks before this were for other watches
    size_t next = live_from;
    if (from >= 0) {
      next = 0;
      while (next < events_.size() && events_[next].rv <= from) ++next;
    }
    const uint64_t drop_at = drop_generation_, compact_at = compact_generation_;
    ++open_watches_;
    struct Closer {
      FakeApiServer* s;
      std::unique_lock<std::mutex>& l;
      ~Closer() {  // also when a write threw with the lock released
        if (!l.owns_lock()) l.lock();
        --s->open_watches_;
        l.unlock();
      }
    } closer{this, l};

    l.unlock();
    http::response<http::empty_body> res(http::status::ok, http_version);
    res.set(http::field::content_type, "application/json");
    res.chunked(true);
    http::response_serializer<http::empty_body> sr(res);
    http::write_header(stream, sr);
    auto send = [&](const std::string& data) {
      boost::asio::write(stream, http::make_chunk(boost::asio::buffer(data)));
    };
    l.lock();

    auto end = [&](const std::string& last_line) {
      l.unlock();
      if (!last_line.empty()) send(last_line + "\n");
      boost::asio::write(stream, http::make_chunk_last());
      l.lock();
    };
    auto gone = [&] {
      end("{\"type\":\"ERROR\",\"object\":" +
          StatusJson(410, "too old resource version: " + rv_text + " (" +
                              std::to_string(compacted_) + ")") +
          "}");
    };
    if (too_old) return gone();
    for (;;) {
      auto ready = [&] {
        return stopping_ || next < events_.size() || drop_generation_ != drop_at ||
               compact_generation_ != compact_at;
      };
      if (deadline) {
        if (!cv_.wait_until(l, *deadline, ready)) return end("");  // timeoutSeconds
      } else {
        cv_.wait(l, ready);
      }
      if (stopping_) return;
      if (compact_generation_ != compact_at) return gone();
      if (drop_generation_ != drop_at) return end("");
      const Event& e = events_[next];
      std::optional<std::string> line;
      if (e.collection == collection || (e.collection.empty() && next >= live_from)) {
        line = EventLine(e, c, filter);
      }
      bool split = e.split;
      ++next;
      if (!line) continue;
      l.unlock();
      *line += "\n";
      if (split) {
        size_t half = line->size() / 2;
        send(line->substr(0, half));
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        send(line->substr(half));
      } else {
        send(*line);
      }
      l.lock();
    }
  }

  Options options_;
  std::shared_ptr<TestPki> pki_;
  tls::KeyPair server_leaf_;
  boost::asio::io_context io_;
  boost::asio::ssl::context tls_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::list<std::unique_ptr<Conn>> conns_;
  std::map<std::string, Collection> collections_;  // by list path
  std::vector<Event> events_;                      // every change, in resourceVersion order
  std::vector<std::string> targets_;
  int rv_ = 1;
  int compacted_ = 0;
  bool split_next_ = false;
  int fail_status_ = 0, fail_remaining_ = 0;
  uint64_t drop_generation_ = 0, compact_generation_ = 0;
  int open_watches_ = 0;
};

}  // namespace kvroute::k8s::testing
