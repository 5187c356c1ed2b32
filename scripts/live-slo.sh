#!/usr/bin/env bash
# Issue 24 live: the latency model and SLO-aware picking through `kvroute serve` in front of
# a `kvroute sim` fleet, driven by `kvroute bench`. For each policy (kvroute, the weighted
# blend; kvroute-slo, the blend unless the model predicts a miss and another replica has
# room; kvroute+flow, kvroute with flow control on at its defaults, so requests predicted to
# miss their objective yield to those that can still meet theirs), on a fresh fleet and
# router with the pool objective scheduling.slo {ttft: 1s, tpot: 50ms}:
#   train   a warm-up at a moderate rate, so the model has its samples
#   run     the measured load (near the fleet's capacity by default)
# serve's latency-model counters are read before and after the run, so the errors printed
# are the run's own: predicted against observed TTFT (dispatch to first byte) and TPOT
# ((end - first chunk) / (chunks - 1)), mean absolute error and mean absolute percentage
# error, and the objective's attainment as serve measured it and as the bench did. After
# each run `kvroute doctor --router` reads the same router and prints its router line.
# Prints one Markdown table. About 3 minutes.
#
#   KVROUTE=build/kvroute scripts/live-slo.sh
#
# Knobs (environment): POLICIES (default "kvroute kvroute-slo kvroute+flow"), RATE (req/s
# of the run), DURATION (s), TRAIN_RATE, TRAIN_S,
# MAX_NUM_SEQS, KEEP (a directory to keep every output in). Capacity at the defaults (4
# replicas, max_num_seqs 8, live-lib.sh's workload): about 48 req/s
# (scripts/live-two-tenant.sh measured it).
set -euo pipefail
KV=${KVROUTE:-build/kvroute}
POLICIES=${POLICIES:-kvroute kvroute-slo kvroute+flow}
RATE=${RATE:-44}
DURATION=${DURATION:-25}
TRAIN_RATE=${TRAIN_RATE:-24}
TRAIN_S=${TRAIN_S:-8}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-8}
REPLICAS=4
SIM_PORT=18801
SERVE=127.0.0.1:18880
[ -x "$KV" ] || { echo "live-slo: no $KV (set KVROUTE)" >&2; exit 2; }
NAME=live-slo
. "$(dirname "$0")/live-lib.sh"
ports_free $(seq "$SIM_PORT" $((SIM_PORT + REPLICAS - 1))) "${SERVE#*:}"

# config POLICY FILE: serve's configuration for POLICY.
config() {
  {
    echo "listen: $SERVE"
    echo "pool:"
    echo "  engine_type: vllm"
    echo "  scrape_interval: 50ms"
    echo "  staleness: 2s"
    echo "  endpoints:"
    for i in $(seq 0 $((REPLICAS - 1))); do echo "    - 127.0.0.1:$((SIM_PORT + i))"; done
    echo "scheduling:"
    echo "  policy: ${1%+flow}"
    echo "  slo: {ttft: 1s, tpot: 50ms}"
    case $1 in *+flow) echo "flow: {enabled: true}" ;; esac
  } >"$2"
}

# model FILE: serve's latency-model and objective counters, "name{labels} value" a line.
model() {
  curl -sf "$SERVE/metrics" |
    grep -E '^kvroute_(latency_(model_samples|predictions_scored|prediction_abs_error_seconds|prediction_abs_relative_error)|slo_(requests|violations))_total' \
      >"$1" || true
}

# run_policy POLICY: a fresh fleet and router, the training load, then the measured run.
run_policy() {
  local p=$1
  config "$p" "$tmp/$p.yaml"
  "$KV" sim --enable-prompt-tokens-details --replicas "$REPLICAS" --port "$SIM_PORT" \
    --max-num-seqs "$MAX_NUM_SEQS" >"$out/$p-sim.log" 2>&1 &
  pids+=($!)
  "$KV" serve --config "$tmp/$p.yaml" >"$out/$p-serve.log" 2>&1 &
  pids+=($!)
  serve_ready "$out/$p-serve.log"
  "$KV" bench --url "http://$SERVE" --label "$p-train" --seed 9 --rate "$TRAIN_RATE" \
    --duration "$TRAIN_S" --drain 60 "${WORKLOAD[@]}" >"$out/$p-train.txt" 2>"$out/$p-train.err"
  model "$out/$p-before.prom"
  "$KV" bench --url "http://$SERVE" --label "$p" --seed 1 --rate "$RATE" --duration "$DURATION" \
    --drain 60 "${WORKLOAD[@]}" >"$out/$p.txt" 2>"$out/$p.err"
  model "$out/$p-after.prom"
  local eps
  eps=$(seq -s, -f "127.0.0.1:%g" "$SIM_PORT" $((SIM_PORT + REPLICAS - 1)))
  "$KV" doctor --endpoints "$eps" --router "$SERVE" --window 0 -q >"$out/$p-doctor.txt" 2>&1 || true
  stop_all
}

start=$(date +%s)
head=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for p in $POLICIES; do run_policy "$p"; done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# grown POLICY SERIES KIND: the series' growth over the run (KIND: ttft or tpot).
grown() {
  awk -v s="$2" -v k="$3" '
    FNR == 1 { f++ }
    index($1, s "{") == 1 && ($1 ~ "kind=\"" k "\"" || $1 ~ "type=\"" k "\"") { v[f] = $2 }
    END { printf "%.6f", v[2] - v[1] }' "$out/$1-before.prom" "$out/$1-after.prom"
}

echo "kvroute at $head ($KV, built $(date -u -r "$KV" '+%H:%M UTC')), $(nproc) cores," \
  "load $load_before at the start, $load_after at the end, $(( $(date +%s) - start )) s"
echo "fleet: kvroute sim --replicas $REPLICAS --max-num-seqs $MAX_NUM_SEQS; objective TTFT <= 1 s," \
  "TPOT <= 50 ms (scheduling.slo); training ${TRAIN_RATE} req/s for ${TRAIN_S} s, then ${RATE} req/s for ${DURATION} s"
echo
echo "| policy | requests | goodput/s | TTFT p50 | TTFT p99 | TTFT met (serve) | TPOT met (serve) | TTFT samples | TTFT MAE | TTFT MAPE | TPOT samples | TPOT MAE | TPOT MAPE |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
for p in $POLICIES; do
  read -r sent good p50 p99 < <(awk '
    /^requests [0-9]+ ok/ { sent = $2; good = $14 }
    /^ttft mean/ { p50 = $5; p99 = $9 }
    END { print sent, good, p50, p99 }' "$out/$p.txt")
  row="| $p | $sent | $good | $p50 | $p99"
  for k in ttft tpot; do
    req=$(grown "$p" kvroute_slo_requests_total "$k")
    vio=$(grown "$p" kvroute_slo_violations_total "$k")
    row="$row | $(awk -v r="$req" -v v="$vio" 'BEGIN { printf (r > 0 ? "%.1f%% of %d" : "-"), 100 * (r - v) / r, r }')"
  done
  for k in ttft tpot; do
    n=$(grown "$p" kvroute_latency_predictions_scored_total "$k")
    abs=$(grown "$p" kvroute_latency_prediction_abs_error_seconds_total "$k")
    rel=$(grown "$p" kvroute_latency_prediction_abs_relative_error_total "$k")
    row="$row | $(awk -v n="$n" 'BEGIN { printf "%d", n }') | $(awk -v n="$n" -v a="$abs" 'BEGIN { printf (n > 0 ? "%.1f ms" : "-"), 1000 * a / n }') | $(awk -v n="$n" -v r="$rel" 'BEGIN { printf (n > 0 ? "%.0f%%" : "-"), 100 * r / n }')"
  done
  echo "$row |"
done
echo
echo "TTFT/TPOT met (serve): streamed requests whose observed value met the objective, of those"
echo "measured in the run; MAE and MAPE over the run's predictions scored against what came back."
echo
echo "kvroute doctor --router after each run (totals since that router started):"
for p in $POLICIES; do
  echo "- $p: $(grep -m1 '^router ' "$out/$p-doctor.txt" || echo 'no router line')"
done
