// A stand-in for the Kubernetes API server's wire protocol, for tests: no cluster runs
// here. It speaks what kvroute's client meets in a real cluster (REFERENCE.md 12), over
// real TLS on a loopback port 0:
//   GET /api/v1/namespaces/NS/pods[?labelSelector=...]          -> a PodList with
//       metadata.resourceVersion
//   GET ...?watch=1&resourceVersion=RV&allowWatchBookmarks=true -> 200, chunked,
//       one JSON event per line: the stored events after RV, then new ones as the test
//       emits them; BOOKMARK events; an ERROR Status with code 410 when RV is older than
//       the last compaction (or on Compact() for open watches); the stream ends cleanly
//       on DropWatches(), as the real server ends a watch after its timeout
//   anything without "Authorization: Bearer <token>"            -> 401 Status
// The CA and the server certificate (SAN IP:127.0.0.1, DNS:localhost) are generated at
// start with OpenSSL's API; nothing is committed. Each connection has its own thread
// (blocking Beast), which keeps this simple and obviously right; tests only.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvroute::k8s::testing {

// A private CA and certificates it signs, in PEM.
class TestPki {
 public:
  explicit TestPki(const std::string& ca_name = "kvroute-test-ca") {
    ca_key_ = EVP_EC_gen("P-256");
    ca_cert_ = Make(ca_key_, ca_name, nullptr, nullptr, true, "");
    ca_pem = CertPem(ca_cert_);
  }
  ~TestPki() {
    X509_free(ca_cert_);
    EVP_PKEY_free(ca_key_);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  struct Leaf {
    std::string cert_pem, key_pem;
  };
  // A certificate for `cn` signed by this CA, with subjectAltName `san` ("" for none).
  Leaf Issue(const std::string& cn, const std::string& san) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = Make(key, cn, ca_cert_, ca_key_, false, san);
    Leaf l{CertPem(cert), KeyPem(key)};
    X509_free(cert);
    EVP_PKEY_free(key);
    return l;
  }

  std::string ca_pem;

 private:
  static void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) throw std::runtime_error("X509V3_EXT_conf_nid failed");
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509* Make(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca,
             const std::string& san) {
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), ++serial_);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
    if (ca) {
      AddExt(x, issuer, NID_basic_constraints, "critical,CA:TRUE");
      AddExt(x, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
      AddExt(x, issuer, NID_subject_key_identifier, "hash");
    } else {
      AddExt(x, issuer, NID_basic_constraints, "critical,CA:FALSE");
      AddExt(x, issuer, NID_key_usage, "critical,digitalSignature");
      AddExt(x, issuer, NID_ext_key_usage, "serverAuth,clientAuth");
      if (!san.empty()) AddExt(x, issuer, NID_subject_alt_name, san.c_str());
    }
    X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256());
    return x;
  }
  static std::string Drain(BIO* b) {
    char* data = nullptr;
    long n = BIO_get_mem_data(b, &data);
    std::string s(data, static_cast<size_t>(n));
    BIO_free(b);
    return s;
  }
  static std::string CertPem(X509* x) {
    BIO* b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, x);
    return Drain(b);
  }
  static std::string KeyPem(EVP_PKEY* k) {
    BIO* b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr);
    return Drain(b);
  }

  EVP_PKEY* ca_key_ = nullptr;
  X509* ca_cert_ = nullptr;
  long serial_ = 0;
};

struct FakeApiServerOptions {
  std::string token = "good-token";
  bool require_client_cert = false;  // verified against pki().ca_pem
};

class FakeApiServer {
 public:
  using Options = FakeApiServerOptions;

  explicit FakeApiServer(Options options = {})
      : options_(std::move(options)),
        server_leaf_(pki_.Issue("kube-apiserver", "IP:127.0.0.1,DNS:localhost")),
        tls_(boost::asio::ssl::context::tls_server),
        acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    tls_.use_certificate_chain(boost::asio::buffer(server_leaf_.cert_pem));
    tls_.use_private_key(boost::asio::buffer(server_leaf_.key_pem), boost::asio::ssl::context::pem);
    if (options_.require_client_cert) {
      tls_.add_certificate_authority(boost::asio::buffer(pki_.ca_pem));
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
      for (auto& c : conns_) ::shutdown(c->lowest_layer().native_handle(), SHUT_RDWR);
    }
    for (auto& t : threads_) t.join();
  }

  uint16_t port() const { return port_; }
  TestPki& pki() { return pki_; }

  // The list's items: pod names; each becomes a minimal Pod object at the current version.
  void SetPods(std::vector<std::string> names) {
    std::lock_guard<std::mutex> l(mu_);
    pods_ = std::move(names);
  }
  // A stored event at the next resourceVersion; returns it. `split` writes the line in two
  // chunks 30 ms apart (a client must reassemble it).
  int Emit(const std::string& type, const std::string& pod, bool split = false) {
    std::lock_guard<std::mutex> l(mu_);
    ++rv_;
    events_.push_back({rv_, "{\"type\":\"" + type + "\",\"object\":" + PodJson(pod, rv_) + "}", false, split});
    cv_.notify_all();
    return rv_;
  }
  // A BOOKMARK at the current resourceVersion, to open watches only.
  void Bookmark() {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back({rv_, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\","
                            "\"metadata\":{\"resourceVersion\":\"" + std::to_string(rv_) + "\"}}}",
                       true, false});
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
  int open_watches() {
    std::lock_guard<std::mutex> l(mu_);
    return open_watches_;
  }
  std::vector<std::string> targets() {  // every request target, in arrival order
    std::lock_guard<std::mutex> l(mu_);
    return targets_;
  }

 private:
  using Stream = boost::asio::ssl::stream<boost::asio::ip::tcp::socket>;
  struct Event {
    int rv;
    std::string line;
    bool live_only;
    bool split;
  };

  static std::string PodJson(const std::string& name, int rv) {
    return "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + name +
           "\",\"namespace\":\"ns\",\"resourceVersion\":\"" + std::to_string(rv) +
           "\"},\"status\":{\"podIP\":\"10.0.0.1\"}}";
  }
  static std::string Status(int code, const std::string& reason, const std::string& message) {
    return "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\","
           "\"message\":\"" + message + "\",\"reason\":\"" + reason + "\",\"code\":" +
           std::to_string(code) + "}";
  }
  static std::string Query(const std::string& target, const std::string& key) {
    size_t q = target.find('?');
    if (q == std::string::npos) return "";
    std::string qs = "&" + target.substr(q + 1);
    size_t at = qs.find("&" + key + "=");
    if (at == std::string::npos) return "";
    size_t from = at + key.size() + 2;
    return qs.substr(from, qs.find('&', from) - from);
  }

  void AcceptLoop() {
    for (;;) {
      auto stream = std::make_shared<Stream>(io_, tls_);
      boost::system::error_code ec;
      acceptor_.accept(stream->lowest_layer(), ec);
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return;
      if (ec) continue;
      conns_.push_back(stream);
      threads_.emplace_back([this, stream] { Serve(*stream); });
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
        {
          std::lock_guard<std::mutex> l(mu_);
          targets_.push_back(target);
        }
        if (req[http::field::authorization] != "Bearer " + options_.token) {
          Reply(stream, req, http::status::unauthorized, Status(401, "Unauthorized", "Unauthorized"));
          continue;
        }
        if (target.rfind("/api/v1/namespaces/", 0) != 0 ||
            target.find("/pods") == std::string::npos) {
          Reply(stream, req, http::status::not_found, Status(404, "NotFound", "not found"));
          continue;
        }
        if (Query(target, "watch") == "1" || Query(target, "watch") == "true") {
          Watch(stream, target);
          return;  // a watch ends its connection
        }
        std::string body;
        {
          std::lock_guard<std::mutex> l(mu_);
          body = "{\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"" +
                 std::to_string(rv_) + "\"},\"items\":[";
          for (size_t i = 0; i < pods_.size(); ++i)
            body += (i ? "," : "") + PodJson(pods_[i], rv_);
          body += "]}";
        }
        Reply(stream, req, http::status::ok, body);
      }
    } catch (const std::exception&) {
      // The client left, the handshake failed, or the server is stopping.
    }
  }

  template <typename Req>
  void Reply(Stream& stream, const Req& req, boost::beast::http::status status, std::string body) {
    namespace http = boost::beast::http;
    http::response<http::string_body> res(status, req.version());
    res.set(http::field::content_type, "application/json");
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    http::write(stream, res);
  }

  void Watch(Stream& stream, const std::string& target) {
    namespace http = boost::beast::http;
    http::response<http::empty_body> res(http::status::ok, 11);
    res.set(http::field::content_type, "application/json");
    res.chunked(true);
    http::response_serializer<http::empty_body> sr(res);
    http::write_header(stream, sr);
    auto send = [&](const std::string& line) {
      std::string data = line + "\n";
      boost::asio::write(stream, http::make_chunk(boost::asio::buffer(data)));
    };
    std::string rv_text = Query(target, "resourceVersion");
    int from = rv_text.empty() ? -1 : std::stoi(rv_text);
    std::unique_lock<std::mutex> l(mu_);
    ++open_watches_;
    struct Closer {
      FakeApiServer* s;
      std::unique_lock<std::mutex>& l;
      ~Closer() {  // also when a write threw with the lock released
        if (!l.owns_lock()) l.lock();
        --s->open_watches_;
      }
    } closer{this, l};
    const uint64_t drop_at = drop_generation_, compact_at = compact_generation_;
    auto gone = [&] {
      std::string line = "{\"type\":\"ERROR\",\"object\":" +
                         Status(410, "Expired", "too old resource version: " + rv_text) + "}";
      l.unlock();
      send(line);
      boost::asio::write(stream, http::make_chunk_last());
      l.lock();
    };
    if (from >= 0 && from < compacted_) return gone();
    size_t next = 0;
    if (from < 0) {
      next = events_.size();  // "from now": the test's list gave the state
    } else {
      while (next < events_.size() && (events_[next].rv <= from || events_[next].live_only)) ++next;
    }
    for (;;) {
      cv_.wait(l, [&] {
        return stopping_ || next < events_.size() || drop_generation_ != drop_at ||
               compact_generation_ != compact_at;
      });
      if (stopping_) return;
      if (compact_generation_ != compact_at) return gone();
      if (drop_generation_ != drop_at) {
        l.unlock();
        boost::asio::write(stream, http::make_chunk_last());
        l.lock();
        return;
      }
      Event e = events_[next++];
      l.unlock();
      if (e.split) {
        size_t half = e.line.size() / 2;
        std::string a = e.line.substr(0, half);
        boost::asio::write(stream, http::make_chunk(boost::asio::buffer(a)));
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        send(e.line.substr(half));
      } else {
        send(e.line);
      }
      l.lock();
    }
  }

  Options options_;
  TestPki pki_;
  TestPki::Leaf server_leaf_;
  boost::asio::io_context io_;
  boost::asio::ssl::context tls_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::shared_ptr<Stream>> conns_;
  std::vector<std::thread> threads_;
  std::vector<std::string> pods_;
  std::vector<Event> events_;
  std::vector<std::string> targets_;
  int rv_ = 1;
  int compacted_ = 0;
  uint64_t drop_generation_ = 0, compact_generation_ = 0;
  int open_watches_ = 0;
};

}  // namespace kvroute::k8s::testing
