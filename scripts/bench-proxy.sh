#!/usr/bin/env bash
# Proxy overhead: kvroute serve vs nginx (round-robin upstream with keepalive, one worker)
# in front of the same backend (one `kvroute sim` replica, time scale 0, 1 output token).
# Pinning: the proxy under test on CPU 0; backend and wrk share CPU 1 (a 2-core machine).
#
# Usage: [ROUNDS=5] [CASES="issue3 4k tls4k"] [SYSCALLS=1] [BASELINE=other/kvroute] [POLICY=kvroute] \
#          [WAIT_QUIET=seconds] [FOREIGN_MAX=5] scripts/bench-proxy.sh [BUILD_DIR] [DURATION_S]
# Every run is wrk (one thread) POSTing /v1/completions, non-streaming, 1 output token.
# CASES picks what each round measures per target (direct, nginx, kvroute):
#   issue3  p50/p99 at 1 connection, max req/s at 32 connections and the proxy's CPU time
#           per request during that run (the backend's for direct), p50 and CPU/request at
#           1 connection with a 220 KB prompt (small prompt otherwise).
#   4k      the issue 7 case: a 4,096-byte prompt at 32 connections (req/s, p50, p99, CPU
#           per request, and how busy CPU 1 was: near 100% the backend and wrk, not the
#           proxy, set the rate) and at 4 connections (req/s, p50, p99).
#   tls4k   the 4k case with wrk speaking HTTPS to the proxies (issue 29): each proxy
#           terminates TLS (a self-signed EC P-256 certificate for 127.0.0.1 made with
#           `openssl` at start; TLS 1.2 and 1.3 offered, session settings as each ships:
#           nginx's defaults, kvroute's server-side cache) and forwards in plaintext to the
#           same backend. direct stays plaintext HTTP to the backend: "added" includes TLS,
#           the proxy's own and wrk's (on CPU 1). wrk holds its connections open for the
#           whole run, so each connection's one handshake is amortised over thousands of
#           requests: this measures TLS record work, not handshakes. Before the rounds, one
#           short wrk run against a logging nginx server shows the TLS version, cipher and
#           group wrk negotiates, and `openssl s_client` what each proxy picks.
# Then the medians over rounds, the added latency (proxied minus direct, per round, then
# median) and the kvroute/nginx ratios. SYSCALLS=1 adds one run per proxy (4 KB prompt, 32
# connections) under `perf stat` on the syscall tracepoints: syscalls per request, by kind,
# and how often the proxy blocked (sched_switch). BASELINE=path/to/another/kvroute binary adds
# it as target "baseline" (its own serve process, same config, also on CPU 0) to every round,
# with kvroute/baseline ratios: before/after a change in the same rounds. Each 4 KB run also
# records the share of the machine's CPU other processes took meanwhile ("foreign"); the
# 4 KB medians use only the rounds where it stayed under FOREIGN_MAX percent (default 5) for
# every target, when at least 3 rounds qualify. POLICY is kvroute's scheduling policy
# (default kvroute; round-robin parses the request but does no prefix hashing or scoring,
# which separates the routing work from the proxying). WAIT_QUIET=S delays each round (up to
# S seconds) until the machine has been idle for 2 s. The load average is printed before and after:
# latency figures are only as good as the machine is quiet.
set -euo pipefail

BUILD=${1:-build}
DUR=${2:-5}
KV=$(realpath "$BUILD/kvroute")
WORK=$(mktemp -d /tmp/kvroute-bench-proxy.XXXXXX)
BACKEND_PORT=18300
NGINX_PORT=18301
KVROUTE_PORT=18302
BASELINE_PORT=18303
NGINX_TLS_PORT=18304
KVROUTE_TLS_PORT=18305
BASELINE_TLS_PORT=18306
NGINX_PROBE_PORT=18307
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_port() {  # port path [scheme]
  for _ in $(seq 100); do
    curl -kfsS -o /dev/null "${3:-http}://127.0.0.1:$1$2" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not come up" >&2
  exit 1
}

# Backend.
taskset -c 1 "$KV" sim --enable-prompt-tokens-details --port "$BACKEND_PORT" --time-scale 0 --fixed-output-tokens 1 \
  --threads 1 >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
PIDS+=($SIM_PID)
wait_port "$BACKEND_PORT" /health

ROUNDS=${ROUNDS:-5}
CASES=${CASES:-"issue3 4k"}
has() { [[ " $CASES " == *" $1 "* ]]; }

# tls4k: one certificate for both proxies, and an HTTPS server block beside nginx's
# plaintext one (same worker, same upstream) plus a probe server that logs what wrk
# negotiated (only used before the rounds).
NGX_TLS=""
YAML_TLS=""
if has tls4k; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" \
    -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>"$WORK/openssl.log"
  NGX_TLS="
  server {
    listen 127.0.0.1:$NGINX_TLS_PORT ssl;
    ssl_certificate $WORK/tls.crt;
    ssl_certificate_key $WORK/tls.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
    }
  }
  log_format tlsprobe '\$ssl_protocol \$ssl_cipher \$ssl_curve';
  server {
    listen 127.0.0.1:$NGINX_PROBE_PORT ssl;
    ssl_certificate $WORK/tls.crt;
    ssl_certificate_key $WORK/tls.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    access_log $WORK/nginx/logs/tlsprobe.log tlsprobe;
    location / { return 200; }
  }"
  YAML_TLS="
listen_tls:
  address: 127.0.0.1:$KVROUTE_TLS_PORT
  cert: $WORK/tls.crt
  key: $WORK/tls.key"
fi

# nginx.
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
cat >"$WORK/nginx/nginx.conf" <<NGX
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/tmp/body;
  proxy_temp_path $WORK/nginx/tmp/proxy;
  fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
  uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
  scgi_temp_path $WORK/nginx/tmp/scgi;
  upstream backend {
    server 127.0.0.1:$BACKEND_PORT;
    keepalive 128;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }$NGX_TLS
}
NGX
taskset -c 0 /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
NGINX_MASTER=$!
PIDS+=($NGINX_MASTER)
wait_port "$NGINX_PORT" /health
if has tls4k; then wait_port "$NGINX_TLS_PORT" /health https; fi
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)

# kvroute.
cat >"$WORK/kvroute.yaml" <<YAML
listen: 127.0.0.1:$KVROUTE_PORT
threads: 1
pool:
  scrape_interval: 50ms
  endpoints:
    - {address: 127.0.0.1:$BACKEND_PORT, name: sim0}
scheduling:
  policy: ${POLICY:-kvroute}$YAML_TLS
YAML
taskset -c 0 "$KV" serve --config "$WORK/kvroute.yaml" >"$WORK/kvroute.log" 2>&1 &
KVROUTE_PID=$!
PIDS+=($KVROUTE_PID)
wait_port "$KVROUTE_PORT" /readyz
if has tls4k; then wait_port "$KVROUTE_TLS_PORT" /readyz https; fi
TARGETS=(direct nginx kvroute)
PROXIES=(nginx kvroute)
if [ -n "${BASELINE:-}" ]; then
  # A second kvroute build (e.g. the commit before a change) as one more target, measured in
  # the same rounds: before/after without the drift between separate runs.
  sed -e "s/^listen: .*/listen: 127.0.0.1:$BASELINE_PORT/" \
    -e "s/^  address: 127.0.0.1:$KVROUTE_TLS_PORT\$/  address: 127.0.0.1:$BASELINE_TLS_PORT/" \
    "$WORK/kvroute.yaml" >"$WORK/baseline.yaml"
  taskset -c 0 "$(realpath "$BASELINE")" serve --config "$WORK/baseline.yaml" >"$WORK/baseline.log" 2>&1 &
  BASELINE_PID=$!
  PIDS+=($BASELINE_PID)
  wait_port "$BASELINE_PORT" /readyz
  if has tls4k; then wait_port "$BASELINE_TLS_PORT" /readyz https; fi
  TARGETS=(direct nginx baseline kvroute)
  PROXIES=(nginx baseline kvroute)
fi

# Load: POST /v1/completions, non-streaming, 1 output token.
cat >"$WORK/small.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Hello, how are you today?","max_tokens":1}'
LUA
python3 - "$WORK/large.lua" <<'PY'
import sys
prompt = ("The quick brown fox jumps over the lazy dog. " * 5000)[:220 * 1024]
body = '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"%s","max_tokens":1}' % prompt
with open(sys.argv[1], "w") as f:
    f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
    f.write("wrk.body = [[%s]]\n" % body)
PY

python3 - "$WORK/4k.lua" <<'PY'
import sys
prompt = ("The quick brown fox jumps over the lazy dog. " * 100)[:4096]
assert len(prompt) == 4096
body = '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"%s","max_tokens":1}' % prompt
with open(sys.argv[1], "w") as f:
    f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
    f.write("wrk.body = [[%s]]\n" % body)
PY

# wrk's --latency table: "50%  1.23ms"; converts to microseconds.
pct() { awk -v p="$2" '$1==p {v=$2; u=v; sub(/[0-9.]+/,"",u); sub(/[a-z]+$/,"",v);
  m=(u=="us")?1:(u=="ms")?1000:(u=="s")?1e6:1; printf "%.0f", v*m}' "$1"; }
rps() { awk '/Requests\/sec/ {printf "%.0f", $2}' "$1"; }

# CPU time (utime+stime, clock ticks) of a process.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
# CPU microseconds per request of process $1 during wrk output $2 (from ticks $3 -> $4):
# robust to other load on the machine, unlike latency.
cpu_per_req() { awk -v a="$3" -v b="$4" -v t="$TCK" '/^ *[0-9]+ requests in/ {n=$1}
  END {printf "%.1f", (b-a)*1e6/t/n}' "$2"; }

# Busy ticks of the whole machine (user+nice+system+irq+softirq+steal over all CPUs), and the
# CPU ticks of the shell's finished children (wrk), for the share of the machine other work
# took during a run: rows with a large "foreign" share measured the neighbours, not the proxy.
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
NCPU=$(nproc)
children_ticks() {  # needs `times >"$WORK/times"` in the current shell first
  awk -v t="$TCK" 'NR == 2 {n = 0; for (i = 1; i <= 2; i++) {split($i, a, /[ms]/); n += a[1] * 60 + a[2]}
    printf "%.0f", n * t}' "$WORK/times"
}
# Runs wrk like run() and sets FOREIGN: the percentage of the machine's CPU time during the run
# spent by anything but the proxy ($6), the backend and wrk.
# Also sets CPU1: how busy CPU 1 (backend and wrk) was, in percent. Near 100, the load
# generator's side is the limit and requests/s says little about the proxy on CPU 0.
cpu_busy() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
foreign_run() {  # name port script conns out proxy_pid
  local b0 b1 p0 p1 s0 s1 c0 c1 e0 e1 u0 u1
  times >"$WORK/times"; c0=$(children_ticks); b0=$(busy); p0=$(ticks "$6"); s0=$(ticks "$SIM_PID")
  u0=$(cpu_busy 1)
  e0=$(date +%s%N)
  run "$1" "$2" "$3" "$4" "$5"
  e1=$(date +%s%N)
  times >"$WORK/times"; c1=$(children_ticks); b1=$(busy); p1=$(ticks "$6"); s1=$(ticks "$SIM_PID")
  u1=$(cpu_busy 1)
  if [ "$6" = "$SIM_PID" ]; then p1=$p0; fi
  FOREIGN=$(awk -v b=$((b1 - b0)) -v o=$((p1 - p0 + s1 - s0 + c1 - c0)) -v e=$((e1 - e0)) \
    -v t="$TCK" -v n="$NCPU" 'BEGIN {f = (b - o) * 100 / (e / 1e9 * t * n); printf "%.1f", f < 0 ? 0 : f}')
  CPU1=$(awk -v u=$((u1 - u0)) -v e=$((e1 - e0)) -v t="$TCK" 'BEGIN {printf "%.0f", u * 100 / (e / 1e9 * t)}')
}

target_port_pid() {  # sets port and pid (whose CPU time is measured) of target $1, and
  # tls_port: its HTTPS port (direct: the backend's plaintext one)
  case $1 in
    direct) port=$BACKEND_PORT pid=$SIM_PID tls_port=$BACKEND_PORT ;;
    nginx) port=$NGINX_PORT pid=$NGINX_WORKER tls_port=$NGINX_TLS_PORT ;;
    kvroute) port=$KVROUTE_PORT pid=$KVROUTE_PID tls_port=$KVROUTE_TLS_PORT ;;
    baseline) port=$BASELINE_PORT pid=$BASELINE_PID tls_port=$BASELINE_TLS_PORT ;;
  esac
}

SCHEME=http  # tls4k sets https for the proxies' runs
run() {  # name port script conns out
  taskset -c 1 wrk -t1 -c"$4" -d"${DUR}s" --latency -s "$3" "$SCHEME://127.0.0.1:$2/v1/completions" >"$5"
}

if has tls4k; then
  # What wrk negotiates (nginx logs it on the probe server), and what a default OpenSSL
  # client gets from each proxy's TLS port (wrk's client context is OpenSSL's defaults too).
  taskset -c 1 wrk -t1 -c1 -d1s "https://127.0.0.1:$NGINX_PROBE_PORT/" >/dev/null
  echo "TLS: certificate EC P-256 self-signed for 127.0.0.1 ($(openssl version | cut -d' ' -f1-2))"
  echo "TLS wrk negotiated with nginx: $(sort "$WORK/nginx/logs/tlsprobe.log" | uniq -c |
    awk '{n = $1; $1 = ""; sub(/^ /, ""); print $0 " (" n " requests)"}' | paste -sd';')"
  for t in "${PROXIES[@]}"; do
    target_port_pid "$t"
    echo "TLS openssl s_client to $t: $(openssl s_client -connect "127.0.0.1:$tls_port" </dev/null 2>/dev/null |
      awk '/^New, / {v = $2 " " $5} /Server Temp Key:/ {k = $4 " " $5 " " $6} END {print v, k}')"
  done
fi

# Rounds interleave the targets so background load hits all of them alike; each row is one
# round. Compare targets within a round (or medians over rounds). A case not run leaves
# its columns "nan".
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS="$WORK/results.tsv"
: >"$RESULTS"
COLS=(p50_us p99_us max_rps cpu_us/req large_p50_us large_cpu_us/req
  4k_c32_rps 4k_c32_p50_us 4k_c32_p99_us 4k_c32_cpu_us/req 4k_c4_rps 4k_c4_p50_us 4k_c4_p99_us
  4k_c32_foreign% 4k_c4_foreign% 4k_c32_cpu1%
  tls4k_c32_rps tls4k_c32_p50_us tls4k_c32_p99_us tls4k_c32_cpu_us/req tls4k_c4_rps tls4k_c4_p50_us
  tls4k_c4_p99_us tls4k_c32_foreign% tls4k_c4_foreign% tls4k_c32_cpu1%)
printf "%-6s %-8s" round target; printf " %s" "${COLS[@]}"; echo
# WAIT_QUIET=S: before each round, wait (up to S seconds) until the machine has been idle
# for 2 s (under 5% busy; our own processes are idle between rounds).
wait_quiet() {
  local deadline=$((SECONDS + ${WAIT_QUIET:-0})) b0 b1
  while :; do
    b0=$(busy); sleep 2; b1=$(busy)
    awk -v b=$((b1 - b0)) -v t="$TCK" -v n="$NCPU" 'BEGIN {exit !(b * 100 / (2 * t * n) < 5)}' && return 0
    [ "$SECONDS" -ge "$deadline" ] && return 0
    sleep 5
  done
}
for r in $(seq "$ROUNDS"); do
  [ -n "${WAIT_QUIET:-}" ] && wait_quiet
  # direct first, then the proxies in an order rotated every round, so that a drift over a
  # round (the host's, which the guest cannot see) does not always favour the same one.
  order=(direct)
  for ((i = 0; i < ${#PROXIES[@]}; i++)); do order+=("${PROXIES[(i + r) % ${#PROXIES[@]}]}"); done
  for t in "${order[@]}"; do
    target_port_pid "$t"
    row=("$r" "$t")
    if has issue3; then
      run "$t" "$port" "$WORK/small.lua" 1 "$WORK/$t-c1-$r.txt"
      t0=$(ticks "$pid")
      run "$t" "$port" "$WORK/small.lua" 32 "$WORK/$t-c32-$r.txt"
      t1=$(ticks "$pid")
      t2=$(ticks "$pid")
      run "$t" "$port" "$WORK/large.lua" 1 "$WORK/$t-large-$r.txt"
      t3=$(ticks "$pid")
      row+=("$(pct "$WORK/$t-c1-$r.txt" 50%)" "$(pct "$WORK/$t-c1-$r.txt" 99%)"
        "$(rps "$WORK/$t-c32-$r.txt")" "$(cpu_per_req "$pid" "$WORK/$t-c32-$r.txt" "$t0" "$t1")"
        "$(pct "$WORK/$t-large-$r.txt" 50%)" "$(cpu_per_req "$pid" "$WORK/$t-large-$r.txt" "$t2" "$t3")")
    else
      row+=(nan nan nan nan nan nan)
    fi
    if has 4k; then
      t0=$(ticks "$pid")
      foreign_run "$t" "$port" "$WORK/4k.lua" 32 "$WORK/$t-4k-c32-$r.txt" "$pid"
      t1=$(ticks "$pid")
      f32_foreign=$FOREIGN f32_cpu1=$CPU1
      foreign_run "$t" "$port" "$WORK/4k.lua" 4 "$WORK/$t-4k-c4-$r.txt" "$pid"
      f32="$WORK/$t-4k-c32-$r.txt" f4="$WORK/$t-4k-c4-$r.txt"
      row+=("$(rps "$f32")" "$(pct "$f32" 50%)" "$(pct "$f32" 99%)"
        "$(cpu_per_req "$pid" "$f32" "$t0" "$t1")" "$(rps "$f4")" "$(pct "$f4" 50%)" "$(pct "$f4" 99%)"
        "$f32_foreign" "$FOREIGN" "$f32_cpu1")
    else
      row+=(nan nan nan nan nan nan nan nan nan nan)
    fi
    if has tls4k; then
      # The same runs as 4k, over HTTPS to the proxies (plaintext to the backend for direct).
      [ "$t" = direct ] || SCHEME=https
      t0=$(ticks "$pid")
      foreign_run "$t" "$tls_port" "$WORK/4k.lua" 32 "$WORK/$t-tls4k-c32-$r.txt" "$pid"
      t1=$(ticks "$pid")
      f32_foreign=$FOREIGN f32_cpu1=$CPU1
      foreign_run "$t" "$tls_port" "$WORK/4k.lua" 4 "$WORK/$t-tls4k-c4-$r.txt" "$pid"
      SCHEME=http
      f32="$WORK/$t-tls4k-c32-$r.txt" f4="$WORK/$t-tls4k-c4-$r.txt"
      row+=("$(rps "$f32")" "$(pct "$f32" 50%)" "$(pct "$f32" 99%)"
        "$(cpu_per_req "$pid" "$f32" "$t0" "$t1")" "$(rps "$f4")" "$(pct "$f4" 50%)" "$(pct "$f4" 99%)"
        "$f32_foreign" "$FOREIGN" "$f32_cpu1")
    else
      row+=(nan nan nan nan nan nan nan nan nan nan)
    fi
    printf "%-6s %-8s" "${row[0]}" "${row[1]}"; printf " %s" "${row[@]:2}"; echo
    (IFS=$'\t'; echo "${row[*]}") >>"$RESULTS"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Medians over rounds; added latency = proxied - direct within each round, then median.
python3 - "$RESULTS" <<'PY'
import math, os, statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
by = {}
for r in rows:
    by.setdefault(r[1], {})[int(r[0])] = [float(x) for x in r[2:]]
order = ["direct", "nginx", "baseline", "kvroute"]
targets = [t for t in order if t in by]
proxies = [t for t in targets if t != "direct"]
med = lambda xs: statistics.median(xs)
ratio = lambda a, b: a / b if b else float("nan")
def col(t, i):
    return med([v[i] for v in by[t].values()])
def added(t, i):
    return med([by[t][r][i] - by["direct"][r][i] for r in by[t]])
def table(title, cols):
    print("\n%s, median over %d rounds" % (title, len(by["direct"])))
    print("%-8s" % "target" + "".join("%16s" % c for c, _ in cols))
    for t in targets:
        print("%-8s" % t + "".join("%16.1f" % col(t, i) for _, i in cols))
# Each kvroute build against nginx, and kvroute against the baseline build.
pairs = [(t, "nginx") for t in proxies if t != "nginx"] + ([("kvroute", "baseline")] if "baseline" in by else [])
if not math.isnan(col("direct", 0)):
    table("small prompt (issue 3)", [("p50_us", 0), ("p99_us", 1), ("max_rps", 2), ("cpu_us/req", 3),
                                     ("220KB_p50_us", 4), ("220KB_cpu/req", 5)])
    a = {t: {n: added(t, i) for n, i in (("p50", 0), ("p99", 1), ("large_p50", 4))} for t in proxies}
    for t in proxies:
        print("%-8s added latency (median of per-round proxied - direct): p50 %.0f us, p99 %.0f us, 220 KB p50 %.0f us"
              % (t, a[t]["p50"], a[t]["p99"], a[t]["large_p50"]))
    for k, n in pairs:
        print("%s/%s: added p50 %.2f, added p99 %.2f, max req/s %.2f, CPU/request %.2f, 220 KB CPU/request %.2f"
              % (k, n, ratio(a[k]["p50"], a[n]["p50"]), ratio(a[k]["p99"], a[n]["p99"]),
                 ratio(col(k, 2), col(n, 2)), ratio(col(k, 3), col(n, 3)), ratio(col(k, 5), col(n, 5))))
def four_kb(o, label, case):
    # The 4 KB runs whose columns start at 6 + o: 4k (o = 0) or tls4k (o = 10). Rounds in
    # which every target ran with other work under FOREIGN_MAX % of the machine (all rounds
    # if fewer than 3 qualify).
    global by
    all_by = by
    fmax = float(os.environ.get("FOREIGN_MAX", "5"))
    quiet = [r for r in by["direct"] if all(max(by[t][r][13 + o], by[t][r][14 + o]) <= fmax for t in targets)]
    print("\n%s rounds with foreign CPU <= %g%% for every target: %s of %d" % (label, fmax, quiet, len(by["direct"])))
    if len(quiet) >= 3:
        by = {t: {r: v for r, v in by[t].items() if r in quiet} for t in targets}
    else:
        print("(fewer than 3: using every round; the figures below include the neighbours' load)")
    for conns, (ir, i50, i99) in ((32, (6 + o, 7 + o, 8 + o)), (4, (10 + o, 11 + o, 12 + o))):
        cols = [("req/s", ir), ("p50_us", i50), ("p99_us", i99)] + ([("cpu_us/req", 9 + o)] if conns == 32 else []) \
            + [("foreign%", (13 if conns == 32 else 14) + o)] + ([("cpu1_busy%", 15 + o)] if conns == 32 else [])
        table("%s prompt, %d connections (%s)" % (label, conns, case), cols)
        a = {t: (added(t, i50), added(t, i99)) for t in proxies}
        for t in proxies:
            print("%-8s added (median of per-round proxied - direct): p50 %.0f us, p99 %.0f us" % (t, a[t][0], a[t][1]))
        for k, n in pairs:
            extra = ", CPU/request %.2f" % ratio(col(k, 9 + o), col(n, 9 + o)) if conns == 32 else ""
            print("%s/%s at %d connections: req/s %.2f, added p50 %.2f, added p99 %.2f%s"
                  % (k, n, conns, ratio(col(k, ir), col(n, ir)), ratio(a[k][0], a[n][0]),
                     ratio(a[k][1], a[n][1]), extra))
            # Paired: the ratio within each round (the two ran seconds apart), then the median
            # and the middle half of those ratios. Less exposed to slow drifts than the above.
            def paired(i):
                xs = sorted(ratio(by[k][r][i], by[n][r][i]) for r in by[k])
                q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
                return "%.2f (%.2f-%.2f)" % (med(xs), q(0.25), q(0.75))
            print("  paired per round, median (interquartile): req/s %s%s"
                  % (paired(ir), ", CPU/request %s" % paired(9 + o) if conns == 32 else ""))
            if o and conns == 32 and (k, n) == ("kvroute", "nginx"):
                r = ratio(a[k][0], a[n][0])
                print("  issue 29 target, kvroute added p50 <= 1.2x nginx's over HTTPS at 32 connections: %.2f, %s"
                      % (r, "met" if r <= 1.2 else "MISSED"))
    if o:
        print("(HTTPS: wrk keeps every connection open for the whole run, so the handshakes, one per"
              " connection, are amortised over the run's requests; direct is plaintext HTTP)")
    by = all_by
if not math.isnan(col("direct", 6)):
    four_kb(0, "4 KB", "issue 7")
if not math.isnan(col("direct", 16)):
    four_kb(10, "HTTPS 4 KB", "issue 29")
PY
# Syscalls per request of each proxy under wrk (4 KB prompt, 32 connections), counted on the
# syscall tracepoints with perf stat in one more run per target (not during the timed runs).
if [ -n "${SYSCALLS:-}" ]; then
  EV=raw_syscalls:sys_enter,sched:sched_switch
  for sc in recvfrom recvmsg read readv sendto sendmsg write writev epoll_wait epoll_pwait; do
    EV+=",syscalls:sys_enter_$sc"
  done
  echo
  printf "%-8s %12s %10s %10s %10s %10s %10s  (4 KB prompt, 32 connections, perf stat)\n" \
    target syscalls/req epoll_wait recv+read send+write other blocked
  for t in "${PROXIES[@]}"; do
    target_port_pid "$t"
    perf stat -x, -e "$EV" -p "$pid" -o "$WORK/$t-syscalls.perf" &
    PERF=$!
    sleep 0.5
    run "$t" "$port" "$WORK/4k.lua" 32 "$WORK/$t-syscalls.txt"
    kill -INT "$PERF"
    wait "$PERF" || true
    n=$(awk '/^ *[0-9]+ requests in/ {print $1}' "$WORK/$t-syscalls.txt")
    awk -F, -v n="$n" -v t="$t" '
      $3 ~ /:/ { name = $3; sub(/.*:(sys_enter_)?/, "", name); c[name] = $1 }
      END {
        total = c["sys_enter"]; ep = c["epoll_wait"] + c["epoll_pwait"]
        rd = c["recvfrom"] + c["recvmsg"] + c["read"] + c["readv"]
        wr = c["sendto"] + c["sendmsg"] + c["write"] + c["writev"]
        printf "%-8s %12.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", t, total / n, ep / n, rd / n, wr / n,
          (total - ep - rd - wr) / n, c["sched_switch"] / n
      }' "$WORK/$t-syscalls.perf"
  done
fi
echo "raw wrk output in $WORK"
