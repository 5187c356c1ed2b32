#!/usr/bin/env bash
# Per-request work of the proxies, immune to machine load: instructions (callgrind) and
# syscalls (perf stat tracepoints, else strace) of kvroute serve and of nginx over an exact
# number of proxied requests, in front of the same backend as scripts/bench-proxy.sh
# (`kvroute sim`, time scale 0, 1 output token) and with the same nginx configuration (plus
# master_process off).
#
# Usage: [POLICY=kvroute] scripts/callgrind-proxy.sh [BUILD_DIR] [REQUESTS] [CONNECTIONS] [PROMPT_BYTES]
#   defaults: build 2000 32 4096
# Per target: the proxy under valgrind --tool=callgrind, 100 warm-up requests, counters
# zeroed (callgrind_control -z), REQUESTS requests over CONNECTIONS keep-alive connections
# (scripts/proxy_load.py), callgrind_control -d; instructions = Ir of that dump / REQUESTS.
# Then the proxy without valgrind, warm-up, and its syscalls over the same REQUESTS, counted
# with perf stat on the syscall tracepoints (strace -c -f if perf cannot; strace slows the
# proxy enough to change how events batch): per request in total, the main ones, and
# "blocked" (sched_switch: how often the proxy went to sleep waiting for work). kvroute runs
# with threads 1, scrape_interval 5 s, staleness 30 s (a scrape or two fall into each
# measurement) and scheduling policy $POLICY (default kvroute). The load generator is Python, slower than the proxies: the syscall mix is
# that of a proxy waiting for its clients (bench-proxy.sh SYSCALLS=1 counts them under wrk).
set -euo pipefail

BUILD=${1:-build}
N=${2:-2000}
CONNS=${3:-32}
PROMPT=${4:-4096}
KV=$(realpath "$BUILD/kvroute")
HERE=$(dirname "$(realpath "$0")")
LOAD="python3 $HERE/proxy_load.py"
WORK=$(mktemp -d /tmp/kvroute-callgrind-proxy.XXXXXX)
BACKEND_PORT=18310
PROXY_PORT=18311
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_port() {  # port path [pid that must stay alive]
  for _ in $(seq 600); do
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      echo "the process serving port $1 exited" >&2
      exit 1
    fi
    curl -fsS -o /dev/null "http://127.0.0.1:$1$2" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not come up" >&2
  exit 1
}

"$KV" sim --enable-prompt-tokens-details --port "$BACKEND_PORT" --time-scale 0 --fixed-output-tokens 1 --threads 1 \
  >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_port "$BACKEND_PORT" /health

mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
cat >"$WORK/nginx/nginx.conf" <<NGX
worker_processes 1;
master_process off;
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
    listen 127.0.0.1:$PROXY_PORT;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGX
cat >"$WORK/kvroute.yaml" <<YAML
listen: 127.0.0.1:$PROXY_PORT
threads: 1
pool:
  scrape_interval: 5s
  staleness: 30s
  endpoints:
    - {address: 127.0.0.1:$BACKEND_PORT, name: sim0}
scheduling:
  policy: ${POLICY:-kvroute}
YAML

start_proxy() {  # target [wrapper...]: starts it, waits until it serves; sets PROXY_PID
  local t=$1
  shift
  case $t in
    kvroute) "$@" "$KV" serve --config "$WORK/kvroute.yaml" >"$WORK/$t.log" 2>&1 & ;;
    nginx) "$@" /usr/sbin/nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/$t.log" 2>&1 & ;;
  esac
  PROXY_PID=$!
  PIDS+=($PROXY_PID)
  wait_port "$PROXY_PORT" "$([ "$t" = kvroute ] && echo /readyz || echo /health)" "$PROXY_PID"
}
stop_proxy() {
  kill "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
}

PERF_EVENTS=raw_syscalls:sys_enter,sched:sched_switch
for sc in recvfrom recvmsg read readv sendto sendmsg write writev epoll_wait epoll_pwait accept4; do
  PERF_EVENTS+=",syscalls:sys_enter_$sc"
done
COUNTER=strace
if perf stat -e "$PERF_EVENTS" true >/dev/null 2>&1; then COUNTER=perf; fi

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$N requests, $CONNS connections, $PROMPT-byte prompt; syscalls counted with $COUNTER"
printf "%-8s %14s %12s %10s %10s %10s %10s %10s %10s\n" target instr/req syscalls/req epoll_wait \
  recv+read send+write accept other blocked
for t in kvroute nginx; do
  # Instructions.
  start_proxy "$t" valgrind --tool=callgrind --callgrind-out-file="$WORK/$t.cg.%p"
  $LOAD "127.0.0.1:$PROXY_PORT" "$CONNS" 100 "$PROMPT"
  callgrind_control -z "$PROXY_PID" >/dev/null 2>&1
  $LOAD "127.0.0.1:$PROXY_PORT" "$CONNS" "$N" "$PROMPT"
  callgrind_control -d "$PROXY_PID" >/dev/null 2>&1
  dump=$(ls -t "$WORK/$t".cg.* | head -1)
  ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
  stop_proxy
  # Syscalls: tracepoint counts (perf stat, negligible overhead, so the timing and the
  # batching of events stay as they are), or strace -c where perf cannot count them.
  start_proxy "$t"
  $LOAD "127.0.0.1:$PROXY_PORT" "$CONNS" 100 "$PROMPT"
  if [ "$COUNTER" = perf ]; then
    perf stat -x, -e "$PERF_EVENTS" -p "$PROXY_PID" -o "$WORK/$t.perf" 2>/dev/null &
  else
    strace -c -f -p "$PROXY_PID" -o "$WORK/$t.strace" 2>/dev/null &
  fi
  COUNTING=$!
  sleep 1
  $LOAD "127.0.0.1:$PROXY_PORT" "$CONNS" "$N" "$PROMPT"
  kill -INT "$COUNTING"
  wait "$COUNTING" 2>/dev/null || true
  stop_proxy
  if [ "$COUNTER" = perf ]; then
    awk -F, -v n="$N" -v t="$t" -v ir="$ir" '
      $3 ~ /:/ { name = $3; sub(/.*:(sys_enter_)?/, "", name); c[name] = $1 }
      END {
        total = c["sys_enter"]
        ep = c["epoll_wait"] + c["epoll_pwait"]
        rd = c["recvfrom"] + c["recvmsg"] + c["read"] + c["readv"]
        wr = c["sendto"] + c["sendmsg"] + c["write"] + c["writev"]
        printf "%-8s %14.0f %12.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", t, ir / n, total / n,
          ep / n, rd / n, wr / n, c["accept4"] / n, (total - ep - rd - wr - c["accept4"]) / n, c["sched_switch"] / n
      }' "$WORK/$t.perf"
  else
    awk -v n="$N" -v t="$t" -v ir="$ir" '
      $NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $1 ~ /^[0-9.]+$/ {
        calls = $4; name = $NF; total += calls
        if (name == "epoll_wait" || name == "epoll_pwait") ep += calls
        else if (name ~ /^(recvfrom|recvmsg|read|readv)$/) rd += calls
        else if (name ~ /^(sendto|sendmsg|write|writev)$/) wr += calls
        else if (name ~ /^accept4?$/) ac += calls
        else { other += calls; names = names " " name "=" calls }
      }
      END {
        printf "%-8s %14.0f %12.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10s\n", t, ir / n, total / n,
          ep / n, rd / n, wr / n, ac / n, other / n, "-"
        if (names != "") print "         other:" names
      }' "$WORK/$t.strace"
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "callgrind dumps and syscall counts in $WORK"
