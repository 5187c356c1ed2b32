#!/usr/bin/env bash
# Runs every `kvroute simulate` command behind a policy table of docs/BENCHMARKS.md with
# one binary and keeps each run's report.json/report.md under OUT/<run>/.
#   scripts/policy-tables.sh BINARY OUT
# Runs one at a time (the tables were measured that way); prints one progress line per run.
# Compare two such folders with scripts/policy-tables-diff.py.
set -euo pipefail
bin=${1:?usage: policy-tables.sh BINARY OUT}
out=${2:?usage: policy-tables.sh BINARY OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
runs=()
for s in seed-8x gie-prefix multi-turn hotspot no-sharing; do
  for seed in 1 2 3; do runs+=("$s-seed$seed|$s|--seed $seed"); done
done
for s in gie-prefix seed-8x multi-turn; do
  runs+=("$s-dynamo|$s|--policies gie-default,dynamo-cost,dynamo-cost-output-blocks,dynamo-kv")
done
for s in overload-many-2x overload-many-5x overload-many-10x overload-few-2x overload-few-5x \
         overload-few-10x overload-no-sharing-5x overload-multi-turn-5x two-tenant \
         two-tenant-alone regions-2-local regions-2-spike regions-3 faults; do
  runs+=("$s|$s|")
done
runs+=("seed-8x-sweep|seed-8x|--sweep")
i=0
for r in "${runs[@]}"; do
  IFS='|' read -r name scenario extra <<<"$r"
  i=$((i + 1))
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$bin" simulate --scenario "$root/examples/scenarios/$scenario.yaml" --out "$out/$name" \
    --quiet $extra >"$out/$name.log" 2>&1 || { echo "FAILED: $name (see $out/$name.log)"; exit 1; }
  echo "[$i/${#runs[@]}] $name: $(( $(date +%s) - start )) s"
done
