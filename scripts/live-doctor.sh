#!/usr/bin/env bash
# Issue 12's "done when", live: `kvroute sim --replicas 8` behind `kvroute serve` with
# round-robin, fed shared-prefix traffic by `kvroute bench`, then `kvroute doctor` on the
# eight replicas: it must report lost prefix reuse (prefix-reuse-lost) and lopsided KV
# (lopsided-kv) and exit 1. Then the same on a fresh fleet behind kvroute's own policy:
# no routing finding (prefix-reuse-lost, lopsided-kv, queue-imbalance) may fire.
#
# The traffic is the seed article's (examples/scenarios/seed-8x.yaml: 16 groups of ~4,000-
# token system prompts, short questions, 70% ~50-token and 30% ~2,000-token answers),
# scaled down as `kvroute demo` scales it to run in real time on two cores: outputs x 0.3,
# 1,024 KV blocks per replica (16 system prompts need ~4,000 blocks: round-robin sends all
# 16 to every replica, kvroute 2-4). At 14 req/s (the default) round-robin is near
# capacity: the replicas that drew the long answers fill their KV and queue while a sibling
# sits half empty with none waiting, the article's symptom (measured: see docs/DOCTOR.md,
# "Command line"); at 20 req/s every replica queues and KV is even again. The doctor starts
# WARMUP seconds into the traffic (cold caches fill first) and reads WINDOW seconds at 1 s
# rounds, inside the traffic. Prints both diagnoses and a table; exits 0 when both
# expectations hold. About 70 seconds.
#
#   KVROUTE=build/kvroute scripts/live-doctor.sh
#
# Knobs (environment): RATE (req/s), KV_BLOCKS, WARMUP, WINDOW (seconds), SEED, KEEP (a
# directory to keep every log and report in).
set -euo pipefail
KV=${KVROUTE:-build/kvroute}
RATE=${RATE:-14}
KV_BLOCKS=${KV_BLOCKS:-1024}
WARMUP=${WARMUP:-10}
WINDOW=${WINDOW:-20}
SEED=${SEED:-1}
SIM_PORT=18901
SERVE=127.0.0.1:18980
[ -x "$KV" ] || { echo "live-doctor: no $KV (set KVROUTE)" >&2; exit 2; }
NAME=live-doctor
. "$(dirname "$0")/live-lib.sh"
ports_free $(seq "$SIM_PORT" $((SIM_PORT + 7))) "${SERVE#*:}"
ENDPOINTS=$(seq -s, -f "127.0.0.1:%g" "$SIM_PORT" $((SIM_PORT + 7)))

# seed-8x's workload with its outputs scaled by 0.3 (the demo's output_scale).
cat >"$tmp/traffic.yaml" <<EOF
name: seed-8x-live
seed: $SEED
workload:
  type: shared-prefix
  num_groups: 16
  num_prompts_per_group: 32
  system_prompt_len: {min: 3600, max: 4400, mean: 4000, std_dev: 200}
  question_len: {min: 50, max: 600, mean: 250, std_dev: 120}
  output_len:
    mixture:
      - {weight: 0.7, min: 6, max: 30, mean: 15, std_dev: 5}
      - {weight: 0.3, min: 450, max: 750, mean: 600, std_dev: 60}
arrivals: {process: poisson, rate: $RATE, duration_s: $((WARMUP + WINDOW + 3))}
slo: {ttft_s: 2.0, tpot_s: 0.05}
EOF

# run_policy POLICY: a fresh fleet and router, the traffic, and the doctor inside it.
run_policy() {
  local p=$1
  cat >"$tmp/$p.yaml" <<EOF
listen: $SERVE
pool:
  scrape_interval: 50ms
  endpoints: [${ENDPOINTS//,/, }]
scheduling: {policy: $p}
EOF
  "$KV" sim --enable-prompt-tokens-details --replicas 8 --port "$SIM_PORT" --kv-blocks "$KV_BLOCKS" >"$out/$p-sim.log" 2>&1 &
  pids+=($!)
  "$KV" serve --config "$tmp/$p.yaml" >"$out/$p-serve.log" 2>&1 &
  pids+=($!)
  serve_ready "$out/$p-serve.log"
  "$KV" bench --url "http://$SERVE" --scenario "$tmp/traffic.yaml" --label "$p" \
    --drain 0 --timeout 120 --quiet >"$out/$p-bench.txt" 2>&1 &
  local bench=$!
  pids+=($bench)
  sleep "$WARMUP"  # pacing: the caches fill before the doctor looks
  set +e
  "$KV" doctor --endpoints "$ENDPOINTS" --window "${WINDOW}s" --interval 1s -q \
    --json-out "$out/$p-doctor.json" >"$out/$p-doctor.txt" 2>&1
  echo $? >"$out/$p-doctor.rc"
  set -e
  wait "$bench" 2>/dev/null || true
  stop_all
}

start=$(date +%s)
head=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_policy round-robin
run_policy kvroute
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# fleet_field POLICY PATTERN: the first match of PATTERN (a sed regex with one group) on the
# report's fleet line.
fleet_field() {
  grep '^  "fleet":' "$out/$1-doctor.json" | sed -n "s/.*$2.*/\1/p"
}
# replica_range POLICY KEY: "min-max" of a per-replica number over the replicas.
replica_range() {
  grep '^    {"name":' "$out/$1-doctor.json" | sed -n "s/.*$2.*/\1/p" |
    awk '$1 != "null" { v = $1 + 0; if (n == 0 || v < lo) lo = v; if (n == 0 || v > hi) hi = v; n++ }
         END { if (n) printf "%.2f-%.2f", lo, hi; else printf "-" }'
}
pct() { awk -v v="$1" 'BEGIN { if (v == "null" || v == "") print "-"; else printf "%.1f%%", 100 * v }'; }
rules() {
  grep -o '"rule": "[^"]*"' "$out/$1-doctor.json" | sed 's/"rule": "\(.*\)"/\1/' | paste -sd, - || true
}
routing() {
  if grep -q '"routing": true' "$out/$1-doctor.json"; then echo yes; else echo no; fi
}

for p in round-robin kvroute; do
  echo "=== kvroute doctor, fleet behind $p (exit $(cat "$out/$p-doctor.rc")) ==="
  cat "$out/$p-doctor.txt"
  echo
done

echo "kvroute at $head ($KV), $(nproc) cores, load $load_before at the start, $load_after at the end, $(( $(date +%s) - start )) s"
echo "traffic: seed-8x shape, outputs x0.3, $RATE req/s Poisson, seed $SEED; 8 replicas, $KV_BLOCKS KV blocks each; doctor window ${WINDOW}s from ${WARMUP}s in"
echo
echo "| policy | doctor exit | findings | routing finding | fleet hit rate | replicas' hit rates | KV mean min / max | waiting mean min / max | lopsided rounds | preemptions/s |"
echo "|---|--:|---|---|--:|--:|--:|--:|--:|--:|"
for p in round-robin kvroute; do
  hit=$(fleet_field "$p" '"hit_rate": \([^,]*\),')
  kvmin=$(fleet_field "$p" '"kv": {"min": \([^,]*\),')
  kvmax=$(fleet_field "$p" '"kv": {"min": [^,]*, "max": \([^,]*\),')
  wmin=$(fleet_field "$p" '"min_mean": \([^,]*\),')
  wmax=$(fleet_field "$p" '"max_mean": \([^,}]*\)[,}]')
  pre=$(fleet_field "$p" '"preemptions_per_s": \([^,]*\),')
  rounds=$(fleet_field "$p" '"rounds": \([0-9]*\),')
  lop=$(fleet_field "$p" '"lopsided_rounds": \([0-9]*\),')
  printf "| %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s of %s | %s |\n" "$p" "$(cat "$out/$p-doctor.rc")" \
    "$(rules "$p")" "$(routing "$p")" "$(pct "$hit")" "$(replica_range "$p" '"hit_rate": \([^,]*\),')" \
    "$(pct "$kvmin")" "$(pct "$kvmax")" \
    "$(awk -v v="$wmin" 'BEGIN { printf (v == "null" ? "-" : "%.1f"), v }')" \
    "$(awk -v v="$wmax" 'BEGIN { printf (v == "null" ? "-" : "%.1f"), v }')" \
    "$lop" "$rounds" "$(awk -v v="$pre" 'BEGIN { printf (v == "null" ? "-" : "%.2f"), v }')"
done

rr=$(cat "$out/round-robin-doctor.rc")
ok=1
[ "$rr" = 1 ] || { echo "FAIL: round-robin: doctor exit $rr, expected 1" >&2; ok=0; }
for r in prefix-reuse-lost lopsided-kv; do
  rules round-robin | tr , '\n' | grep -qx "$r" || { echo "FAIL: round-robin: no $r finding" >&2; ok=0; }
done
[ "$(routing kvroute)" = no ] || { echo "FAIL: kvroute: a routing finding ($(rules kvroute))" >&2; ok=0; }
[ "$ok" = 1 ] && echo "PASS: round-robin diagnosed (prefix-reuse-lost, lopsided-kv, exit 1); kvroute: no routing finding"
[ "$ok" = 1 ]
