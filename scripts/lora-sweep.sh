#!/usr/bin/env bash
# LoRA adapter routing in virtual time (issue 26): examples/scenarios/lora-skew.yaml (24
# adapters of one base model, Zipf 1.1, 80% of the requests naming one) with every policy
# in one run per rate and seed, so all of them see the same arrivals. Writes each rate's
# variant to a temporary directory, runs `kvroute simulate` on it (progress on stderr) and
# prints one Markdown table per rate and seed on stdout. "loads" and "evictions" are the
# fleet's adapter loads and LRU evictions; "adapters/replica" the distinct adapters a
# replica served during the run, averaged over the fleet.
#
#   scripts/lora-sweep.sh [BUILD_DIR]    (default build; needs kvroute and jq)
#   RATES="40 70" SEEDS="1 2 3" REQUESTS=3000 scripts/lora-sweep.sh
#   POLICIES=kvroute-lora-blind,kvroute scripts/lora-sweep.sh
set -euo pipefail
BUILD=${1:-build}
KV=$BUILD/kvroute
[ -x "$KV" ] || { echo "lora-sweep: build kvroute in $BUILD first" >&2; exit 2; }
command -v jq >/dev/null || { echo "lora-sweep: needs jq" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=$ROOT/examples/scenarios/lora-skew.yaml
RATES=${RATES:-40}
SEEDS=${SEEDS:-1}
REQUESTS=${REQUESTS:-3000}
POLICIES=${POLICIES:-round-robin,least-request,gie-default,llm-d-sticky,llm-d-precise,sglang-cache-aware,dynamo-kv,kvroute-lora-blind,kvroute}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for rate in $RATES; do
  sed -e "s/^  rate: .*/  rate: $rate/" "$BASE" >"$tmp/rate-$rate.yaml"
  for seed in $SEEDS; do
    out=$tmp/out-$rate-$seed
    echo "lora-sweep: $rate req/s, $REQUESTS requests, seed $seed" >&2
    "$KV" simulate --scenario "$tmp/rate-$rate.yaml" --policies "$POLICIES" --seed "$seed" \
      --requests "$REQUESTS" --quiet --out "$out" >/dev/null 2>"$tmp/log" ||
      { cat "$tmp/log" >&2; exit 1; }
    echo
    echo "$rate req/s, seed $seed:"
    echo
    echo "| policy | TTFT p50 | TTFT p99 | E2E mean | goodput/s | adapter loads | evictions | adapters/replica |"
    echo "|---|--:|--:|--:|--:|--:|--:|--:|"
    jq -r '
      def fixed(n): (. * pow(10; n) | round) as $c |
        "\($c / pow(10; n) | floor).\($c % pow(10; n) | tostring | ("000" + .)[-n:])";
      def ms: if . < 1 then "\(. * 1000 | round) ms" else "\(fixed(2)) s" end;
      .policies[] |
      "| \(.policy) | \(.ttft_s.p50 | ms) | \(.ttft_s.p99 | ms) | \(.e2e_s.mean | fixed(2)) s" +
      " | \(.goodput_requests_per_s | fixed(2)) | \(.lora.loads) | \(.lora.evictions)" +
      " | \(.lora.adapters_per_replica | fixed(1)) |"' "$out/report.json"
  done
done
