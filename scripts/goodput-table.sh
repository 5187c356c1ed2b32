#!/usr/bin/env bash
# Issue 24's goodput comparison: every example scenario of the issue at seeds 1-3, each
# with its own policy list (every peer) plus `kvroute+flow` where the list lacks it, one
# `kvroute simulate` at a time, reports kept under OUT/<scenario>-seed<N>/. Prints one
# progress line per run, then the table (scripts/goodput-table.py OUT).
#   scripts/goodput-table.sh BINARY OUT
set -euo pipefail
bin=${1:?usage: goodput-table.sh BINARY OUT}
out=${2:?usage: goodput-table.sh BINARY OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
all=round-robin,random,least-request,gie-default,sglang-cache-aware,dynamo-cost,dynamo-kv,llm-d-sticky,llm-d-precise,kvroute
scenarios=(seed-8x gie-prefix multi-turn hotspot no-sharing overload-many-2x overload-many-5x
           overload-many-10x overload-few-2x overload-few-5x overload-few-10x
           overload-no-sharing-5x overload-multi-turn-5x two-tenant two-tenant-alone
           regions-2-local regions-2-spike regions-3)
total=$((${#scenarios[@]} * 3)) i=0
for s in "${scenarios[@]}"; do
  file="$root/examples/scenarios/$s.yaml"
  policies=$(sed -n 's/^policies: *\[\(.*\)\]/\1/p' "$file" | tr -d ' ')
  policies=${policies:-$all}
  case ",$policies," in *,kvroute+flow,*) ;; *) policies="$policies,kvroute+flow" ;; esac
  for seed in 1 2 3; do
    i=$((i + 1))
    start=$(date +%s)
    "$bin" simulate --scenario "$file" --seed "$seed" --policies "$policies" \
      --out "$out/$s-seed$seed" --quiet >"$out/$s-seed$seed.log" 2>&1 ||
      { echo "FAILED: $s seed $seed (see $out/$s-seed$seed.log)"; exit 1; }
    echo "[$i/$total] $s seed $seed: $(($(date +%s) - start)) s"
  done
done
python3 "$root/scripts/goodput-table.py" "$out"
