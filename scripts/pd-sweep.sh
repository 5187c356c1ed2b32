#!/usr/bin/env bash
# Prefill:decode ratio sweep in virtual time (issue 25): examples/scenarios/pd-prefill-heavy.yaml
# (llm-d's P/D guide shape: 5,000-token prompts, 250-token outputs) on the same 8 replicas
# split 2:6, 3:5, 4:4, 5:3 and 6:2, plus all 8 aggregated (pd-prefill-heavy-aggregated.yaml),
# one policy. Writes each variant to a temporary directory, runs `kvroute simulate` on it
# (progress on stderr) and prints one Markdown table on stdout. "busy / KV by role": the
# share of the run a role's replicas spent in engine steps, and their mean KV usage.
#
#   scripts/pd-sweep.sh [BUILD_DIR]    (default build; needs kvroute)
#   RATE=45 REQUESTS=2000 POLICY=least-request SEED=2 scripts/pd-sweep.sh
set -euo pipefail
BUILD=${1:-build}
KV=$BUILD/kvroute
[ -x "$KV" ] || { echo "pd-sweep: build kvroute in $BUILD first" >&2; exit 2; }
command -v jq >/dev/null || { echo "pd-sweep: needs jq" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=$ROOT/examples/scenarios/pd-prefill-heavy.yaml
AGG=$ROOT/examples/scenarios/pd-prefill-heavy-aggregated.yaml
RATE=${RATE:-40}
REQUESTS=${REQUESTS:-3000}
POLICY=${POLICY:-kvroute}
SEED=${SEED:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The scenario file with its rate and, for a split, its two groups replaced.
variant() {  # variant SOURCE OUT [PREFILL DECODE]
  sed -e "s/^  rate: .*/  rate: $RATE/" "$1" >"$2.tmp"
  if [ $# -eq 4 ]; then
    sed -e "s/- {replicas: [0-9]*, role: prefill}/- {replicas: $3, role: prefill}/" \
        -e "s/- {replicas: [0-9]*, role: decode}/- {replicas: $4, role: decode}/" "$2.tmp" >"$2"
  else
    mv "$2.tmp" "$2"
  fi
  rm -f "$2.tmp"
}

run() {  # run LABEL FILE
  echo "pd-sweep: $1 at $RATE req/s, $REQUESTS requests, $POLICY, seed $SEED" >&2
  "$KV" simulate --scenario "$2" --policies "$POLICY" --seed "$SEED" --requests "$REQUESTS" \
    --quiet --out "$tmp/out-$1" >/dev/null 2>"$tmp/$1.log" || { cat "$tmp/$1.log" >&2; exit 1; }
  jq -r --arg name "$1" '
    def fixed(n): (. * pow(10; n) | round) as $c |
      "\($c / pow(10; n) | floor).\($c % pow(10; n) | tostring | ("000" + .)[-n:])";
    .policies[0] as $p | $p.pd as $pd |
    ($pd.roles | map("\(.role) \(.utilization * 100 | round)% / \(.kv_usage_mean * 100 | round)%") | join(", ")) as $busy |
    "| \($name) | \($p.e2e_s.mean | fixed(2)) s | \($p.itl_mean_s * 1000 | fixed(1)) ms" +
    " | \($p.ttft_s.mean * 1000 | round) ms | \($p.ttft_s.p99 * 1000 | round) ms" +
    " | \($p.goodput_requests_per_s | fixed(2)) | \($pd.disaggregated) | \($busy) |"' \
    "$tmp/out-$1/report.json" >>"$tmp/rows.md"
}

variant "$AGG" "$tmp/aggregated.yaml"
run "8 aggregated" "$tmp/aggregated.yaml"
for p in 2 3 4 5 6; do
  d=$((8 - p))
  variant "$BASE" "$tmp/p$p.yaml" "$p" "$d"
  run "$p:$d" "$tmp/p$p.yaml"
done
echo "| P:D | E2E mean | ITL mean | TTFT mean | TTFT p99 | goodput/s | disaggregated | busy / KV by role |"
echo "|---|--:|--:|--:|--:|--:|--:|---|"
cat "$tmp/rows.md"
