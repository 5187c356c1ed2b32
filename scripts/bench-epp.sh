#!/usr/bin/env bash
# The endpoint picker's cost per request against `kvroute serve` on the same requests
# (issue 8, item 7): 4 sim replicas (no waiting: time_scale 0, max_tokens 1), `serve` and
# `epp` on the same config, and bench/epp_load sending 4 KB, 220 KB and 1 MB prompts to
# each in turn; then picks per second over gRPC with many concurrent streams. Prints a
# Markdown table; CPU per request is the measured process's utime+stime over the run.
#
#   scripts/bench-epp.sh [BUILD_DIR]        (default build; needs kvroute and bench/epp_load)
set -euo pipefail
BUILD=${1:-build}
KV=$BUILD/kvroute
LOAD=$BUILD/bench/epp_load
[ -x "$KV" ] && [ -x "$LOAD" ] || { echo "bench-epp: build kvroute and epp_load in $BUILD first" >&2; exit 2; }
REQUESTS=${REQUESTS:-300}
BASE=${BASE_PORT:-18300}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

"$KV" sim --enable-prompt-tokens-details --replicas 4 --port "$BASE" --time-scale 0 --max-model-len 1073741824 --threads 1 \
  >"$tmp/sim.log" 2>&1 &
pids+=($!)
cat >"$tmp/pool.yaml" <<YAML
threads: 1
pool:
  scrape_interval: 50ms
  endpoints: [127.0.0.1:$BASE, 127.0.0.1:$((BASE + 1)), 127.0.0.1:$((BASE + 2)), 127.0.0.1:$((BASE + 3))]
limits: {max_body_bytes: 4MiB}
YAML
"$KV" serve --config "$tmp/pool.yaml" --listen "127.0.0.1:$((BASE + 80))" >"$tmp/serve.log" 2>&1 &
serve_pid=$!
pids+=($serve_pid)
"$KV" epp --config "$tmp/pool.yaml" --host 127.0.0.1 --secure-serving=false --grpc-port $((BASE + 90)) \
  --grpc-health-port $((BASE + 91)) --metrics-port $((BASE + 92)) >"$tmp/epp.log" 2>&1 &
epp_pid=$!
pids+=($epp_pid)
for _ in $(seq 100); do
  if curl -sf "127.0.0.1:$((BASE + 80))/readyz" >/dev/null; then break; fi
  sleep 0.1
done
sleep 0.5

echo "kvroute $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| front end | prompt | streams | requests | errors | req/s | latency p50 (ms) | latency p99 (ms) | CPU per request |"
echo "|---|---|---|---|---|---|---|---|---|"
for bytes in 4096 225280 1048576; do
  n=$REQUESTS
  [ "$bytes" -ge 1048576 ] && n=$((REQUESTS / 3))
  "$LOAD" --http "127.0.0.1:$((BASE + 80))" --pid "$serve_pid" --streams 4 --requests "$n" \
    --prompt-bytes "$bytes" --label "serve" || true
  "$LOAD" --grpc "127.0.0.1:$((BASE + 90))" --pid "$epp_pid" --streams 4 --requests "$n" \
    --prompt-bytes "$bytes" --mode full_duplex --label "epp (full duplex)" || true
  "$LOAD" --grpc "127.0.0.1:$((BASE + 90))" --pid "$epp_pid" --streams 4 --requests "$n" \
    --prompt-bytes "$bytes" --mode buffered --label "epp (buffered)" || true
done
for streams in 16 64; do
  "$LOAD" --grpc "127.0.0.1:$((BASE + 90))" --pid "$epp_pid" --streams "$streams" \
    --requests $((REQUESTS * 4)) --prompt-bytes 4096 --mode full_duplex --label "epp picks/s" || true
done
