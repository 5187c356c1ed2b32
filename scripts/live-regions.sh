#!/usr/bin/env bash
# Issue 10's live story: `kvroute serve` in us-east in front of a `kvroute sim` fleet
# spread over two regions (examples/fleet-regions.yaml: 2 replicas in us-east, 2 in
# eu-west 35 ms away each way), driven by `kvroute bench`, in three phases: a load the
# local region serves, a spike at twice the local capacity, the load again. Run twice on
# a fresh fleet and router: with locality (examples/regions-live.yaml, region us-east) and
# region-blind (the same file with --region "", so kvroute scores every replica alike).
# Requests by region per phase come from serve's kvroute_locality_requests_total{region},
# read before and after each phase (every request finished: the bench drains). Prints one
# Markdown table. About 3 minutes.
#
#   KVROUTE=build/kvroute scripts/live-regions.sh
#
# Knobs (environment): LOW (req/s), SPIKE (req/s), LOW_S, SPIKE_S (seconds), KEEP (a
# directory to keep every bench's output in). Local capacity at these settings (2 replicas,
# max_num_seqs 8, the workload below): about 24 req/s (half of the 4-replica fleet's 48
# that scripts/live-two-tenant.sh measured on the same workload shape).
set -euo pipefail
KV=${KVROUTE:-build/kvroute}
FLEET=${FLEET:-examples/fleet-regions.yaml}
CONFIG=${CONFIG:-examples/regions-live.yaml}
LOW=${LOW:-12}
SPIKE=${SPIKE:-48}
LOW_S=${LOW_S:-20}
SPIKE_S=${SPIKE_S:-15}
SERVE=127.0.0.1:18780
[ -x "$KV" ] || { echo "live-regions: no $KV (set KVROUTE)" >&2; exit 2; }
for f in "$FLEET" "$CONFIG"; do
  [ -f "$f" ] || { echo "live-regions: no $f (run from the repository root)" >&2; exit 2; }
done
NAME=live-regions
. "$(dirname "$0")/live-lib.sh"
ports_free 18701 18702 18703 18704 18780

# by_region FILE: serve's kvroute_locality_requests_total samples, "region count" a line.
by_region() {
  curl -sf "$SERVE/metrics" |
    awk '/^kvroute_locality_requests_total\{/ { r = $1; sub(/.*region="/, "", r); sub(/".*/, "", r); print r, $2 }' >"$1" || true
}
# picks FILE: kvroute_locality_picks_total by decision.
picks() {
  curl -sf "$SERVE/metrics" |
    awk '/^kvroute_locality_picks_total\{/ { d = $1; sub(/.*decision="/, "", d); sub(/".*/, "", d); print d, $2 }' >"$1" || true
}

# run_policy TAG [SERVE FLAGS...]: a fresh fleet and router, a warm-up, then the phases.
run_policy() {
  local tag=$1
  shift
  "$KV" sim --enable-prompt-tokens-details --config "$FLEET" >"$out/$tag-sim.log" 2>&1 &
  pids+=($!)
  "$KV" serve --config "$CONFIG" "$@" >"$out/$tag-serve.log" 2>&1 &
  pids+=($!)
  serve_ready "$out/$tag-serve.log"
  "$KV" bench --url "http://$SERVE" --label warm --seed 9 --rate 8 --duration 4 --drain 30 \
    "${WORKLOAD[@]}" >"$out/$tag-warm.txt" 2>&1
  local i=0
  for phase in "low:$LOW:$LOW_S" "spike:$SPIKE:$SPIKE_S" "after:$LOW:$LOW_S"; do
    IFS=: read -r name rate secs <<<"$phase"
    i=$((i + 1))
    by_region "$out/$tag-$name-before.txt"
    picks "$out/$tag-$name-picks-before.txt"
    "$KV" bench --url "http://$SERVE" --label "$tag-$name" --seed "$i" --rate "$rate" \
      --duration "$secs" --drain 60 "${WORKLOAD[@]}" >"$out/$tag-$name.txt" 2>"$out/$tag-$name.err"
    by_region "$out/$tag-$name-after.txt"
    picks "$out/$tag-$name-picks-after.txt"
  done
  stop_all
}

start=$(date +%s)
head=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run_policy locality
run_policy blind --region ""
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# delta TAG PHASE REGION: requests served in REGION during the phase.
delta() {
  awk -v r="$3" 'FNR == 1 { f++ } $1 == r { v[f] = $2 } END { printf "%d", v[2] - v[1] }' \
    "$out/$1-$2-before.txt" "$out/$1-$2-after.txt"
}
# spills TAG PHASE: spilling picks (spill_* and no_local decisions) during the phase.
spills() {
  awk 'FNR == 1 { f++ } $1 ~ /^(spill_|no_local)/ { v[f] += $2 } END { printf "%d", v[2] - v[1] }' \
    "$out/$1-$2-picks-before.txt" "$out/$1-$2-picks-after.txt"
}
row() {
  local tag=$1 name=$2 label=$3 rate=$4
  local east west
  east=$(delta "$tag" "$name" us-east)
  west=$(delta "$tag" "$name" eu-west)
  awk -v pol="$label" -v ph="$name" -v rate="$rate" -v e="$east" -v w="$west" -v sp="$(spills "$tag" "$name")" '
    /^requests [0-9]+ ok/ { sent = $2; ok = $4; rps = $8; good = $14 }
    /^ttft mean/ { p50 = $5; p99 = $9 }
    function ms(s) { sub(/s$/, "", s); return s < 1 ? sprintf("%.0f ms", s * 1000) : sprintf("%.2f s", s) }
    END {
      t = e + w
      printf "| %s | %s | %s | %d | %d | %s | %s | %s | %d | %d | %s | %s |\n", pol, ph, rate, sent, ok,
        ok ? ms(p50) : "-", ok ? ms(p99) : "-", good, e, w, t ? sprintf("%.1f%%", 100 * w / t) : "-",
        pol == "kvroute (locality)" ? sp : "-"
    }' "$out/$tag-$name.txt"
}

echo "kvroute at $head ($KV), $(nproc) cores, load $load_before at the start, $load_after at the end, $(( $(date +%s) - start )) s"
echo "fleet: $FLEET (2 us-east, 2 eu-west at 35 ms each way, max_num_seqs 8); phases: $LOW req/s for $LOW_S s, $SPIKE req/s for $SPIKE_S s, $LOW req/s for $LOW_S s"
echo
echo "| policy | phase | req/s offered | sent | ok | TTFT p50 | TTFT p99 | goodput/s | us-east | eu-west | remote share | spilling picks |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
for p in "locality:kvroute (locality)" "blind:kvroute region-blind"; do
  tag=${p%%:*}
  label=${p#*:}
  row "$tag" low "$label" "$LOW"
  row "$tag" spike "$label" "$SPIKE"
  row "$tag" after "$label" "$LOW"
done
