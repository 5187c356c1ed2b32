#!/usr/bin/env bash
# Issue 11's two-tenant story live (examples/scenarios/two-tenant.yaml is the same story in
# virtual time): an interactive tenant (objective `interactive`, priority 0) and a
# sheddable batch flood (objective `batch`, priority -1) through `kvroute serve` in front
# of a `kvroute sim` fleet, with the interactive tenant alone as the reference.
#
# For flow control on (examples/flow-two-tenant.yaml) and off (the same file with
# `flow.enabled: false`), each on a fresh fleet and router:
#   warm-up  both tenants' prompt prefixes, a few seconds each (so "alone" is not the cold run)
#   (a)      the interactive tenant alone
#   (b)      the same interactive requests (same seed) while a batch flood runs, started
#            FLOOD_LEAD seconds earlier and ending after it; two `kvroute bench` processes
#            told apart by --header x-gateway-inference-objective:...
# Between runs the fleet is left to drain (every replica running = waiting = 0). The
# interactive benches also read the replicas' /metrics (waiting, preemptions); serve's
# kvroute_flow_{rejected,dispatched,expired,cancelled}_total and the router-wait
# histogram's sum and count are read before and after (b), and their growth printed.
# Prints one Markdown table, the ratios and those figures. About 2.5 minutes.
#
#   KVROUTE=build/kvroute scripts/live-two-tenant.sh
#
# Knobs (environment): DURATION (interactive run, s), INTERACTIVE_RATE, BATCH_RATE (req/s),
# MAX_NUM_SEQS, TIME_SCALE (the sim's), FLOOD_LEAD (s), KEEP (a directory to keep every
# bench's output in). The fleet is the config's four endpoints, kept small on purpose:
# with max_num_seqs 8 the engines, not the 2 cores, are what saturates (measured at these
# settings: about 48 req/s and 3,100 output tokens/s at most, while sim and serve use
# about a tenth of a core each). The defaults follow two-tenant.yaml's proportions:
# interactive at ~30% of that capacity, the batch flood at ~2.7x, together ~3x.
set -euo pipefail
KV=${KVROUTE:-build/kvroute}
CONFIG=${CONFIG:-examples/flow-two-tenant.yaml}
DURATION=${DURATION:-25}
INTERACTIVE_RATE=${INTERACTIVE_RATE:-14}
BATCH_RATE=${BATCH_RATE:-130}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-8}
TIME_SCALE=${TIME_SCALE:-1}
FLOOD_LEAD=${FLOOD_LEAD:-3}
SIM_PORT=18601             # examples/flow-two-tenant.yaml's pool.endpoints, consecutive
SERVE=127.0.0.1:18680      # and its listen
OBJECTIVE=x-gateway-inference-objective
[ -x "$KV" ] || { echo "live-two-tenant: no $KV (set KVROUTE)" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "live-two-tenant: no $CONFIG (run from the repository root)" >&2; exit 2; }
REPLICAS=$(grep -c '^    - 127\.0\.0\.1:' "$CONFIG")
NAME=live-two-tenant
# Both tenants send live-lib.sh's WORKLOAD (each its own seed, so its own prompts and
# arrivals): two-tenant.yaml's shape with 16 groups and shorter outputs, so a 25 s run has
# a few hundred interactive requests.
. "$(dirname "$0")/live-lib.sh"
ports_free $(seq "$SIM_PORT" $((SIM_PORT + REPLICAS - 1))) "${SERVE#*:}"

# bench NAME OBJECTIVE SEED RATE SECONDS DRAIN [FLAGS...]: one bench run, its output in
# $out/NAME.txt.
bench() {
  "$KV" bench --url "http://$SERVE" --label "$1" -H "$OBJECTIVE:$2" --seed "$3" --rate "$4" \
    --duration "$5" --drain "$6" "${WORKLOAD[@]}" "${@:7}" >"$out/$1.txt" 2>"$out/$1.err"
}
# The interactive runs also read every replica's /metrics (waiting, preemptions).
FLEET=(--fleet-ports "$SIM_PORT-$((SIM_PORT + REPLICAS - 1))")

# Waits until every replica has nothing running or waiting (at most 60 s).
wait_idle() {
  for _ in $(seq 300); do
    local busy=0
    for i in $(seq 0 $((REPLICAS - 1))); do
      n=$(curl -sf "127.0.0.1:$((SIM_PORT + i))/metrics" |
            awk '/^vllm:num_requests_(running|waiting)[{ ]/ { s += $NF } END { print s + 0 }') || n=1
      busy=$((busy + ${n%.*}))
    done
    [ "$busy" -eq 0 ] && return 0
    sleep 0.2
  done
  echo "live-two-tenant: the fleet did not drain" >&2
}

# flow_counters FILE: serve's kvroute_flow_{rejected,dispatched,expired,cancelled}_total and
# kvroute_flow_wait_seconds_{sum,count} samples, "name{labels} value" a line.
flow_counters() {
  curl -sf "$SERVE/metrics" | grep -E '^kvroute_flow_((rejected|dispatched|expired|cancelled)_total|wait_seconds_(sum|count))' >"$1" || true
}

# cpu_s PID: the process's CPU seconds so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$1/stat"; }

# run_config TAG YAML: a fresh fleet and router on YAML, then warm-up, (a) and (b).
run_config() {
  local tag=$1 yaml=$2
  local t0 sim_pid serve_pid
  t0=$(date +%s.%N)
  "$KV" sim --enable-prompt-tokens-details --replicas "$REPLICAS" --port "$SIM_PORT" --max-num-seqs "$MAX_NUM_SEQS" \
    --time-scale "$TIME_SCALE" >"$out/$tag-sim.log" 2>&1 &
  sim_pid=$!
  pids+=($sim_pid)
  "$KV" serve --config "$yaml" >"$out/$tag-serve.log" 2>&1 &
  serve_pid=$!
  pids+=($serve_pid)
  serve_ready "$out/$tag-serve.log"

  bench "$tag-warm-i" interactive 1 20 3 30
  bench "$tag-warm-b" batch 2 20 3 30
  wait_idle
  bench "$tag-a-interactive" interactive 1 "$INTERACTIVE_RATE" "$DURATION" 60 "${FLEET[@]}"
  wait_idle
  flow_counters "$out/$tag-before.prom"
  # The flood outlasts the interactive run on both sides; 2 s after its last arrival it
  # cancels what it still has in flight, so the fleet's backlog does not outlive the run.
  bench "$tag-b-batch" batch 2 "$BATCH_RATE" $((DURATION + 2 * FLOOD_LEAD)) 2 &
  local batch_pid=$!
  sleep "$FLOOD_LEAD"
  bench "$tag-b-interactive" interactive 1 "$INTERACTIVE_RATE" "$DURATION" 60 "${FLEET[@]}"
  wait "$batch_pid" || true
  flow_counters "$out/$tag-after.prom"
  wait_idle
  # CPU the fleet and the router used over this configuration's runs (utime + stime).
  echo "$(cpu_s "$sim_pid") $(cpu_s "$serve_pid") $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')" \
    >"$out/$tag-cpu.txt"
  stop_all
}

sed 's/^\(  enabled:\) true/\1 false/' "$CONFIG" >"$tmp/flow-off.yaml"
grep -q '^  enabled: false' "$tmp/flow-off.yaml" || { echo "live-two-tenant: no flow.enabled in $CONFIG" >&2; exit 2; }
start=$(date +%s)
head=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_config on "$CONFIG"
run_config off "$tmp/flow-off.yaml"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# row FLOW RUN TENANT NAME: one table row from a bench's summary lines.
row() {
  awk -v flow="$1" -v run="$2" -v tenant="$3" '
    /^requests [0-9]+ ok/ { sent = $2; ok = $4; rps = $8; tok = $10; good = $14 }
    /^ttft mean/ { p50 = $5; p99 = $9 }
    /^errors: http_429 / { shed = $3 }
    /^errors: / && !/http_429/ { other += $3 }
    function ms(s) { sub(/s$/, "", s); return s < 1 ? sprintf("%.0f ms", s * 1000) : sprintf("%.2f s", s) }
    END {
      printf "| %s | %s | %s | %d | %d | %d | %d | %s | %s | %s | %s | %s |\n",
        flow, run, tenant, sent, ok, shed, other, ok ? ms(p50) : "-", ok ? ms(p99) : "-", rps, tok, good
    }' "$out/$4.txt"
}
# p99 NAME: the run's TTFT p99 in seconds.
p99() { awk '/^ttft mean/ { v = $9; sub(/s$/, "", v); print v }' "$out/$1.txt"; }
# shed NAME: its 429s.
shed() { awk '/^errors: http_429 / { n = $3 } END { print n + 0 }' "$out/$1.txt"; }

echo "kvroute at $head ($KV, built $(date -u -r "$KV" '+%H:%M UTC')), $(nproc) cores," \
  "load $load_before at the start, $load_after at the end, $(( $(date +%s) - start )) s"
echo "fleet: kvroute sim --replicas $REPLICAS --max-num-seqs $MAX_NUM_SEQS --time-scale $TIME_SCALE;" \
  "interactive ${INTERACTIVE_RATE} req/s for ${DURATION} s, batch ${BATCH_RATE} req/s for $((DURATION + 2 * FLOOD_LEAD)) s around it"
echo
echo "| flow control | run | tenant | sent | ok | 429 | other errors | TTFT p50 | TTFT p99 | req/s | out tok/s | goodput/s |"
echo "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
for f in on off; do
  row "$f" "(a) alone" interactive "$f-a-interactive"
  row "$f" "(b) flood" interactive "$f-b-interactive"
  row "$f" "(b) flood" batch "$f-b-batch"
done
echo
for f in on off; do
  a=$(p99 "$f-a-interactive")
  b=$(p99 "$f-b-interactive")
  echo "flow $f: interactive TTFT p99 under the flood / alone = $b s / $a s =" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN { printf (a > 0 ? "%.2fx" : "-"), b / a }');" \
    "interactive 429s $(shed "$f-b-interactive"), batch 429s $(shed "$f-b-batch")"
done
echo
echo "The fleet during the interactive runs (total waiting over the replicas, every scrape):"
for f in on off; do
  for r in a b; do
    awk -v t="flow $f ($r)" '/^fleet: / {
        w = $0; sub(/.*waiting mean /, "", w); split(w, x, /[ ,]+/)
        p = $0; sub(/.*preemptions /, "", p)
        printf "  %s: waiting mean %s, max %s, preemptions %s\n", t, x[1], x[3], p }' \
      "$out/$f-$r-interactive.txt"
  done
done
echo
echo "serve /metrics, growth over (b) with flow on (flow off exports no kvroute_flow_* series):"
awk '
  FNR == 1 { f++ }
  { v[f, $1] = $2; if (f == 2) names[++n] = $1 }
  END {
    for (i = 1; i <= n; i++) {
      d = v[2, names[i]] - v[1, names[i]]
      if (names[i] ~ /_sum/) continue
      printf "  %s %d\n", names[i], d
      if (names[i] ~ /^kvroute_flow_wait_seconds_count/ && d > 0) {
        s = names[i]; sub(/_count/, "_sum", s)
        printf "  (router wait, %s: mean %.0f ms over %d admitted; immediate dispatches count 0)\n",
          substr(names[i], index(names[i], "{")), 1000 * (v[2, s] - v[1, s]) / d, d
      }
    }
  }' "$out/on-before.prom" "$out/on-after.prom"
for f in on off; do
  read -r sim_cpu serve_cpu wall <"$out/$f-cpu.txt"
  echo "CPU, flow $f: kvroute sim ${sim_cpu} s, kvroute serve ${serve_cpu} s over ${wall} s"
done
