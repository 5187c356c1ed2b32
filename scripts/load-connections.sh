#!/usr/bin/env bash
# Connection load through `kvroute serve` on loopback (issue 13, item 5): 10,000 concurrent
# keep-alive connections, 1,000 concurrent streams, and a slowloris set next to normal
# clients. The server's RSS and descriptor count come from /proc/<serve pid>; the client is
# scripts/load_connections.cc (one Asio event loop), built here if missing.
#
# Usage: [CONNECTIONS=10000] [INTERVAL=5] [STREAMS=1000] [MAX_TOKENS=100] [STREAM_TIME_SCALE=3] [SLOW=300] \
#        [NORMAL=16] [SLOW_DURATION=8] [REQUEST_READ=5s] [THREADS=1] \
#        scripts/load-connections.sh [BUILD_DIR]
# Takes about two minutes; not part of CI. Prints a Markdown table.
#
# Setup: `kvroute sim`, 8 replicas (time scale 0.05; STREAM_TIME_SCALE for the streams),
# `kvroute serve` in front of them
# (round-robin, THREADS worker threads, timeouts.request_read REQUEST_READ so that the
# slowloris phase ends within the run; the production default is 30s), a fresh serve per
# phase. ulimit -n is raised to the hard limit for every process started here. The fds
# "settled" figure is taken after the upstream pool's idle connections expired (4.5 s, then
# a few requests: the pool drops expired connections when it next takes one).
set -euo pipefail

BUILD=${1:-build}
CONNECTIONS=${CONNECTIONS:-10000}
INTERVAL=${INTERVAL:-5}
STREAMS=${STREAMS:-1000}
MAX_TOKENS=${MAX_TOKENS:-100}
STREAM_TIME_SCALE=${STREAM_TIME_SCALE:-3}
SLOW=${SLOW:-300}
NORMAL=${NORMAL:-16}
SLOW_DURATION=${SLOW_DURATION:-8}
REQUEST_READ=${REQUEST_READ:-5s}
THREADS=${THREADS:-1}
SIM_PORT=18401
SERVE_PORT=18400
KV=$(realpath "$BUILD/kvroute")
SRC=$(cd "$(dirname "$0")/.." && pwd)
TOOL="$BUILD/load/load_connections"
WORK=$(mktemp -d /tmp/kvroute-load-connections.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

ulimit -n "$(ulimit -Hn)"
if [[ ! -x "$TOOL" || "$TOOL" -ot "$SRC/scripts/load_connections.cc" ]]; then
  mkdir -p "$BUILD/load"
  c++ -std=c++20 -O2 -pthread -o "$TOOL" "$SRC/scripts/load_connections.cc"
fi

wait_port() {
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$1$2" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "port $1 did not come up" >&2
  exit 1
}

# max-num-seqs 1024: every replica runs all its streams at once (the preset's batch limit
# would queue them, and their heads with them).
SIM_PID=
start_sim() {
  "$KV" sim --enable-prompt-tokens-details --replicas 8 --port "$SIM_PORT" --time-scale "$1" --max-num-seqs 1024 --threads 1 \
    >>"$WORK/sim.log" 2>&1 &
  SIM_PID=$!
  PIDS+=($SIM_PID)
  for i in $(seq 0 7); do wait_port $((SIM_PORT + i)) /health; done
}
stop_sim() {
  kill "$SIM_PID"
  wait "$SIM_PID" 2>/dev/null || true
}

{
  echo "listen: 127.0.0.1:$SERVE_PORT"
  echo "threads: $THREADS"
  echo "pool:"
  echo "  scrape_interval: 100ms"
  echo "  endpoints:"
  for i in $(seq 0 7); do echo "    - 127.0.0.1:$((SIM_PORT + i))"; done
  echo "scheduling: {policy: round-robin}"
  echo "limits: {max_connections: 16384}"
  echo "timeouts: {request_read: $REQUEST_READ}"
} >"$WORK/serve.yaml"
# A fresh serve per phase: freed memory that malloc keeps from one phase would otherwise
# be reused by the next and hide its cost.
SERVE_PID=
start_serve() {
  "$KV" serve --config "$WORK/serve.yaml" >>"$WORK/serve.log" 2>&1 &
  SERVE_PID=$!
  PIDS+=($SERVE_PID)
  wait_port "$SERVE_PORT" /readyz
  # Warm-up: upstream pools and allocator arenas exist before the "before" sample.
  for _ in $(seq 16); do
    curl -fsS -o /dev/null -H 'content-type: application/json' \
      -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"warm up","max_tokens":1}' \
      "http://127.0.0.1:$SERVE_PORT/v1/completions"
  done
  sleep 0.5
}
stop_serve() {
  curl -fsS "http://127.0.0.1:$SERVE_PORT/metrics" | grep '^kvroute_http_' >"$WORK/metrics-$1.txt"
  kill "$SERVE_PID"
  wait "$SERVE_PID" 2>/dev/null || true
}

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
start_sim 0.05
start_serve
"$TOOL" hold --port "$SERVE_PORT" --pid "$SERVE_PID" --connections "$CONNECTIONS" \
  --interval "$INTERVAL" --rounds 2 >"$WORK/hold.txt"
stop_serve hold
LOAD_HOLD=$(cut -d' ' -f1-3 /proc/loadavg)
# Streams at STREAM_TIME_SCALE (3: ~28 tokens/s each, a real replica's pace), so that the
# 1,000 overlap: at time scale 0.05 they would need ~20x the chunks per second, more than one
# serve thread relays (~48k chunks/s here), and the last would start as the first end.
stop_sim
start_sim "$STREAM_TIME_SCALE"
start_serve
"$TOOL" streams --port "$SERVE_PORT" --pid "$SERVE_PID" --streams "$STREAMS" \
  --max-tokens "$MAX_TOKENS" >"$WORK/streams.txt"
stop_serve streams
stop_sim
start_sim 0.05
start_serve
"$TOOL" slowloris --port "$SERVE_PORT" --pid "$SERVE_PID" --slow "$SLOW" --normal "$NORMAL" \
  --duration "$SLOW_DURATION" --drip-ms 500 >"$WORK/slowloris.txt"
stop_serve slowloris
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
T1=$(date +%s)

v() { awk -v k="$2" '$1 == k { print $2 }' "$WORK/$1.txt"; }
f() { printf "%.${3:-0}f" "$(v "$1" "$2")"; }
mb() { awk -v x="$(v "$1" "$2")" 'BEGIN { printf "%.1f", x / 1024 }'; }

cat <<EOF

kvroute serve ($THREADS worker thread(s)) in front of kvroute sim (8 replicas, time scale 0.05; $STREAM_TIME_SCALE for the streams), loopback.
Load average (1/5/15 min): $LOAD_START at the start, $LOAD_HOLD after the 10k phase, $LOAD_END at the end; $((T1 - T0)) s of load.

| Phase | Load | Result | serve RSS before / with (peak) / after (MB) | per connection | serve fds before / with / after the clients closed -> idle upstreams expired |
|---|---|---|---|---|---|
| keep-alive connections | $(v hold connections) connections, 1 completion each every ${INTERVAL} s, 2 rounds after all answered | $(v hold connected) connected in $(f hold connect_seconds 1) s, $(v hold requests_ok)/$(v hold requests_sent) requests 200 ($(v hold requests_failed) failed), latency p50 $(f hold latency_p50_ms 1) ms, p99 $(f hold latency_p99_ms 1) ms | $(mb hold rss_kb_before) / $(mb hold rss_kb_with) / $(mb hold rss_kb_after) | $(f hold rss_kb_per_connection 2) KB | $(v hold fds_before) / $(v hold fds_with) / $(v hold fds_after_clients_closed) -> $(v hold fds_after) |
| concurrent streams | $(v streams streams) streaming completions (max_tokens $MAX_TOKENS), one per connection | $(v streams streams_with_done)/$(v streams streams) ended with [DONE] ($(v streams streams_failed) failed), peak $(f streams peak_inflight) in flight at once in serve ($(v streams streaming_at_peak) of them streaming to the client then), stream p50 $(f streams duration_p50_ms) ms, p99 $(f streams duration_p99_ms) ms, all in $(f streams total_seconds 1) s | $(mb streams rss_kb_before) / $(mb streams rss_kb_with) / $(mb streams rss_kb_after) | $(f streams rss_kb_per_stream 2) KB per stream | $(v streams fds_before) / $(v streams fds_with) / $(v streams fds_after_clients_closed) -> $(v streams fds_after) |
| slowloris | $(v slowloris slow_connections) connections dripping a header (1 byte / 500 ms), request_read $REQUEST_READ; $(v slowloris normal_clients) normal keep-alive clients, ${SLOW_DURATION} s without then with them | normal p50 $(f slowloris baseline_p50_ms 2) -> $(f slowloris slowloris_p50_ms 2) ms (x$(f slowloris p50_ratio 2)), p99 $(f slowloris baseline_p99_ms 2) -> $(f slowloris slowloris_p99_ms 2) ms (x$(f slowloris p99_ratio 2)), errors $(v slowloris baseline_errors) / $(v slowloris slowloris_errors); slow: $(v slowloris slow_got_408)/$(v slowloris slow_connected) got 408 and $(v slowloris slow_closed_by_server) were closed, 408 after $(f slowloris slow_408_after_min_ms) - $(f slowloris slow_408_after_max_ms) ms | $(mb slowloris rss_kb_before) / $(mb slowloris rss_kb_with) / $(mb slowloris rss_kb_after) | | $(v slowloris fds_before) / $(v slowloris fds_with) / $(v slowloris fds_after_clients_closed) -> $(v slowloris fds_after) |

serve's own counters at the end of each phase (hold, streams, slowloris):
\`\`\`
$(paste -d' ' "$WORK/metrics-hold.txt" <(cut -d' ' -f2 "$WORK/metrics-streams.txt") <(cut -d' ' -f2 "$WORK/metrics-slowloris.txt"))
\`\`\`
Raw figures: $WORK/{hold,streams,slowloris}.txt
EOF
