#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of kvroute from Debian 12's
# packages. Idempotent: when everything is present it only runs dpkg-query and exits.
#   --kvroute-only   only what configuring the project and building the kvroute binary
#                    needs (the container image's build stage, deploy/container/Dockerfile)
set -euo pipefail

kvroute_only=""
case "${1:-}" in
  --kvroute-only) kvroute_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--kvroute-only]" >&2; exit 2 ;;
esac

# Configure the project (CMakeLists.txt's find_package calls) and build `kvroute`.
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libboost1.81-dev          # Asio + Beast: HTTP/1.1 server and client
  libsimdjson-dev           # request-body parsing on the hot path
  libyaml-cpp-dev           # configuration files (with line numbers for errors)
  libxxhash-dev             # prefix-block hashing
  libfmt-dev                # formatting
  libcli11-dev              # command-line parsing
  libssl-dev                # TLS: serve's HTTPS, epp's ext_proc, the Kubernetes API client
  openssl                   # the openssl command: test and benchmark (tls4k) certificates
  # vLLM KV-cache events (issue 23): ZMQ PUB/SUB and ROUTER/DEALER replay, msgpack payloads.
  # msgpuck, not libmsgpack-cxx-dev: the latter pulls libboost1.74-dev, which conflicts
  # with libboost1.81-dev (REFERENCE.md section 5).
  libzmq3-dev cppzmq-dev    # libzmq 4.3 and its header-only C++ binding
  libmsgpuck-dev            # msgpack encoder/decoder (one C header + a small static lib)
  libgtest-dev libgmock-dev googletest  # found at configure time, whatever is built
  # `kvroute epp` (gRPC ext_proc picker): stubs generated at build time from third_party/proto/
  libgrpc++-dev             # gRPC C++ (callback API, DefaultHealthCheckService)
  libprotobuf-dev           # protobuf runtime and well-known types (google/protobuf/struct.proto)
  protobuf-compiler         # protoc
  protobuf-compiler-grpc    # grpc_cpp_plugin
)

# Tests, benchmarks, fuzzing and the developer's tools.
PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  curl
  ccache                    # compiler cache: fresh clones reuse earlier builds' objects (CMakeLists.txt)
  libbenchmark-dev          # Google Benchmark micro-benchmarks
  python3-zmq python3-msgpack  # an independent KV-event publisher and decoder for tests
  nginx-light               # reference reverse proxy for the overhead benchmark
  jq                        # scripts/lora-sweep.sh reads simulate's report.json
  prometheus                # tests: promtool (check metrics, check/test rules) and the server (the dashboard's queries)
  wrk                       # HTTP load generator for side-by-side proxy benchmarks
  # Benchmark scripts only (scripts/bench-proxy.sh, scripts/callgrind-proxy.sh):
  valgrind                  # callgrind instruction counts per request
  strace linux-perf         # syscall counts per request
  python3                   # scripts/proxy_load.py: exact request counts over keep-alive
  # `make fuzz`: libFuzzer with -fsanitize=fuzzer,address,undefined (clang 14, libstdc++ 12)
  clang-14                  # the compiler
  libclang-rt-14-dev        # libFuzzer, ASan and UBSan runtimes
  llvm-14                   # llvm-symbolizer: file:line in sanitizer and libFuzzer stacks
  clang-tidy-14             # the curated lint (.clang-tidy, scripts/clang-tidy.sh, make tidy)
)

if [ -n "$kvroute_only" ]; then PACKAGES=("${BUILD_PACKAGES[@]}"); fi
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# tests/interop (the ext_proc interop test) runs on Node.js and npm: Debian's, unless the
# machine has them already.
if [ -z "$kvroute_only" ] && { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
  missing+=(nodejs npm)
fi

# npm ci in tests/interop when node_modules is absent or was installed from another
# package-lock.json (the lock's hash is kept in node_modules/.lock-sha256).
interop_npm() {
  if [ -n "$kvroute_only" ]; then return 0; fi
  local dir want
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/interop"
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$dir/node_modules/.lock-sha256" 2>/dev/null)" = "$want" ]; then return 0; fi
  echo "install-deps: npm ci in tests/interop"
  (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) &&
    echo "$want" >"$dir/node_modules/.lock-sha256"
}

if [ ${#missing[@]} -eq 0 ]; then
  interop_npm
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# nginx's package would start a daemon on port 80; we only need the binary.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
interop_npm
