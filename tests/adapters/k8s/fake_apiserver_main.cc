// fake-kube-apiserver: FakeApiServer (fake_api_server.h) as a process, so an end-to-end
// test can point the real `kvroute epp` binary at a stand-in Kubernetes API server.
//
//   fake-kube-apiserver --kubeconfig-out PATH [--port N] [--token T] [--namespace NS]
//                       [--ca FILE]
//
// Writes a kubeconfig for the server at PATH (server https://127.0.0.1:PORT, the CA as
// certificate-authority-data, the bearer token, context "fake" as current-context, with
// NS as its namespace when given), prints "ready <port>", then applies one command per
// stdin line and answers each with one line, "ok <rv>" or "error <why>":
//   crd <collection>                      install a custom-resource collection
//   put <collection> <one-line JSON>      store an object; ok <its resourceVersion>
//   delete <collection> <name>            ok <the deletion's rv>, ok 0 when absent
//   bookmark | compact | drop             as FakeApiServer's Bookmark, Compact, DropWatches
//   fail <status> [count]                 FailNext
// Commands other than put and delete answer the current resourceVersion. Empty lines and
// lines starting with '#' are skipped without an answer. Every line written is flushed.
// Exits 0 on end of stdin, SIGTERM or SIGINT; 2 on bad arguments or a server that cannot
// start.
//
// --ca FILE keeps the CA across runs: loaded from FILE (its certificate and key, PEM) when
// it exists, else made and written there. With a fixed --port, a test can then write the
// kubeconfig with a first run, start its client against a server that is down, and start
// the server again later under the same address and CA.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

#include "fake_api_server.h"

namespace {

using kvroute::k8s::testing::FakeApiServer;

void Usage() {
  std::cerr << "usage: fake-kube-apiserver --kubeconfig-out PATH [--port N] [--token T] "
               "[--namespace NS] [--ca FILE]\n";
}

// A whole-string decimal integer in [lo, hi].
std::optional<int> ParseInt(const std::string& s, int lo, int hi) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int n = std::stoi(s);
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

// Answers one command line.
std::string Apply(FakeApiServer& server, const std::string& line) {
  std::istringstream in(line);
  std::string verb;
  in >> verb;
  auto current = [&] { return "ok " + std::to_string(server.resource_version()); };
  auto rest = [&] {  // what follows the next word, spaces before it dropped
    std::string r;
    std::getline(in >> std::ws, r);
    return r;
  };
  try {
    if (verb == "crd") {
      std::string collection;
      if (!(in >> collection)) return "error usage: crd <collection>";
      server.InstallCrd(collection);
      return current();
    }
    if (verb == "put") {
      std::string collection;
      if (!(in >> collection)) return "error usage: put <collection> <json>";
      std::string json = rest();
      if (json.empty()) return "error usage: put <collection> <json>";
      return "ok " + std::to_string(server.Put(collection, json));
    }
    if (verb == "delete") {
      std::string collection, name;
      if (!(in >> collection >> name)) return "error usage: delete <collection> <name>";
      return "ok " + std::to_string(server.Delete(collection, name));
    }
    if (verb == "bookmark") {
      server.Bookmark();
      return current();
    }
    if (verb == "compact") {
      server.Compact();
      return current();
    }
    if (verb == "drop") {
      server.DropWatches();
      return current();
    }
    if (verb == "fail") {
      std::string status_text, count_text = "1";
      if (!(in >> status_text)) return "error usage: fail <status> [count]";
      in >> count_text;
      auto status = ParseInt(status_text, 100, 599);
      auto count = ParseInt(count_text, 0, 1000000);
      if (!status || !count) return "error usage: fail <status 100-599> [count]";
      server.FailNext(*status, *count);
      return current();
    }
    return "error unknown command \"" + verb + "\"";
  } catch (const std::exception& e) {
    return std::string("error ") + e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string kubeconfig_out, token = "test-token", namespace_name, ca_file;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) {
      Usage();
      return 2;
    }
    std::string value = argv[++i];
    if (arg == "--kubeconfig-out") {
      kubeconfig_out = value;
    } else if (arg == "--token") {
      token = value;
    } else if (arg == "--ca") {
      ca_file = value;
    } else if (arg == "--namespace") {
      namespace_name = value;
    } else if (arg == "--port") {
      auto p = ParseInt(value, 0, 65535);
      if (!p) {
        std::cerr << "fake-kube-apiserver: --port: not a port: " << value << "\n";
        return 2;
      }
      port = *p;
    } else {
      Usage();
      return 2;
    }
  }
  if (kubeconfig_out.empty()) {
    Usage();
    return 2;
  }

  // SIGTERM and SIGINT are taken by one thread, before any other starts (threads inherit
  // the mask); a connection dropped mid-write or a closed stdout is an error, not a signal.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::thread([stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fflush(stdout);
    std::_Exit(0);  // nothing to clean up that the kernel does not
  }).detach();

  std::optional<FakeApiServer> server;
  try {
    FakeApiServer::Options options;
    options.token = token;
    options.port = static_cast<uint16_t>(port);
    if (!ca_file.empty()) {
      std::ifstream in(ca_file);
      if (in) {
        std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        options.pki = std::make_shared<kvroute::k8s::testing::TestPki>(pem, pem);
      } else {
        options.pki = std::make_shared<kvroute::k8s::testing::TestPki>();
        std::ofstream(ca_file, std::ios::trunc) << options.pki->cert_pem() << options.pki->key_pem();
      }
    }
    server.emplace(options);
  } catch (const std::exception& e) {
    std::cerr << "fake-kube-apiserver: cannot start on port " << port << ": " << e.what() << "\n";
    return 2;
  }
  {
    std::ofstream out(kubeconfig_out, std::ios::trunc);
    out << server->KubeconfigYaml(namespace_name);
    out.close();
    if (!out) {
      std::cerr << "fake-kube-apiserver: cannot write " << kubeconfig_out << "\n";
      return 2;
    }
  }
  std::cout << "ready " << server->port() << std::endl;

  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::cout << Apply(*server, line) << std::endl;
  }
  server.reset();  // ends open watches, joins every connection's thread
  return 0;
}
