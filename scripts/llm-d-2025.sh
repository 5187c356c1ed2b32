#!/usr/bin/env bash
# llm-d's 2025 precise / approximate / load / random comparison in simulate
# (examples/scenarios/llm-d-2025.yaml): the sweep at seeds 1-3, then one table of each
# policy's mean output throughput over the 16 rates (the benchmark's summary figure) and
# its ratios, against the published ones.
#   scripts/llm-d-2025.sh BINARY OUT
set -euo pipefail
bin=${1:?usage: llm-d-2025.sh BINARY OUT}
out=${2:?usage: llm-d-2025.sh BINARY OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
for seed in 1 2 3; do
  start=$(date +%s)
  "$bin" simulate --scenario "$root/examples/scenarios/llm-d-2025.yaml" --sweep --seed "$seed" \
    --out "$out/seed$seed" --quiet >"$out/seed$seed.log" 2>&1 ||
    { echo "FAILED: seed $seed (see $out/seed$seed.log)"; exit 1; }
  echo "[$seed/3] seed $seed: $(($(date +%s) - start)) s"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
published = {"llm-d-2025-precise": 8730.0, "llm-d-2025-approximate": 6944.4,
             "llm-d-2025-load": 4266.4, "random": 4428.7}
rows = {}
for seed in (1, 2, 3):
    d = json.load(open(f"{out}/seed{seed}/sweep.json"))
    for p in d["policies"]:
        pts = p["points"]
        mean = sum(x["output_tokens_per_s"] for x in pts) / len(pts)
        rows.setdefault(p["policy"], []).append(mean)
print("Mean output tok/s over the 16 rates (the benchmark's summary figure), by seed:\n")
print("| policy | seed 1 | seed 2 | seed 3 | published |")
print("|---|--:|--:|--:|--:|")
for name, v in rows.items():
    pub = f"{published[name]:,.0f}" if name in published else "-"
    print(f"| {name} | " + " | ".join(f"{x:,.0f}" for x in v) + f" | {pub} |")
def ratio(a, b):
    return [x / y for x, y in zip(rows[a], rows[b])]
print("\n| ratio | seed 1 | seed 2 | seed 3 | published | within x1.5 |")
print("|---|--:|--:|--:|--:|---|")
for a, b in (("llm-d-2025-precise", "llm-d-2025-approximate"),
             ("llm-d-2025-approximate", "random"), ("llm-d-2025-precise", "random"),
             ("llm-d-2025-load", "random")):
    r = ratio(a, b)
    pub = published[a] / published[b]
    ok = all(pub / 1.5 <= x <= pub * 1.5 for x in r)
    print(f"| {a} / {b} | " + " | ".join(f"{x:.3f}" for x in r) + f" | {pub:.3f} | {'yes' if ok else 'no'} |")
PY
