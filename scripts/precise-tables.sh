#!/usr/bin/env bash
# The runs behind docs/BENCHMARKS.md "Precise prefix routing in simulate (issue 23)": the
# precise-edge scenario, seeds 1-3, router replicas 1 and 3, kvroute without KV-cache
# events (approximate), with them (precise) at loss 0, 0.1 (replayed) and 0.1 without
# replay, and random; the peers beside them: llm-d-sticky and dynamo-cost without events,
# llm-d-precise and dynamo-kv with them under the same losses. Prints the table of means
# over the seeds.
#   scripts/precise-tables.sh BINARY OUT
set -euo pipefail
bin=${1:?usage: precise-tables.sh BINARY OUT}
out=${2:?usage: precise-tables.sh BINARY OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
scenario="$root/examples/scenarios/precise-edge.yaml"
mkdir -p "$out"
for seed in 1 2 3; do
  for r in 1 3; do
    run() {  # name, flags...
      local name=$1
      shift
      "$bin" simulate --scenario "$scenario" --seed "$seed" --router-replicas "$r" --quiet \
        --out "$out/$name-r$r-seed$seed" "$@" >"$out/$name-r$r-seed$seed.log" 2>&1
    }
    run approx --kv-events off --policies kvroute,random,llm-d-sticky,dynamo-cost
    run precise --kv-events on --kv-events-loss 0 --policies kvroute,llm-d-precise,dynamo-kv
    run precise-loss --kv-events on --kv-events-loss 0.1 --policies kvroute,llm-d-precise,dynamo-kv
    run precise-loss-noreplay --kv-events on --kv-events-loss 0.1 --kv-events-replay off \
      --policies kvroute,llm-d-precise,dynamo-kv
    echo "seed $seed, $r router replica(s): done"
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = [("random", "approx", "random", ""), ("kvroute, approximate (no events)", "approx", "kvroute", ""),
        ("kvroute, precise, loss 0", "precise", "kvroute", ""),
        ("kvroute, precise, loss 0.1, replay", "precise-loss", "kvroute", ""),
        ("kvroute, precise, loss 0.1, no replay", "precise-loss-noreplay", "kvroute", ""),
        ("llm-d-sticky (no events)", "approx", "llm-d-sticky", ""),
        ("llm-d-precise, loss 0", "precise", "llm-d-precise", ""),
        ("llm-d-precise, loss 0.1, replay", "precise-loss", "llm-d-precise", ""),
        ("llm-d-precise, loss 0.1, no replay", "precise-loss-noreplay", "llm-d-precise", ""),
        ("dynamo-cost (no events)", "approx", "dynamo-cost", ""),
        ("dynamo-kv, loss 0", "precise", "dynamo-kv", ""),
        ("dynamo-kv, loss 0.1, replay", "precise-loss", "dynamo-kv", ""),
        ("dynamo-kv, loss 0.1, no replay", "precise-loss-noreplay", "dynamo-kv", "")]
def ms(s): return f"{s*1000:.0f} ms" if s < 1 else f"{s:.2f} s"
print("| policy | router replicas | hit rate | TTFT p50 | TTFT p99 | out tok/s | req/s | receipts / picks | receipts error (tokens) | receipts off > 1 block | gaps unrepaired |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in (1, 3):
  for label, run, policy, _ in rows:
    ps = []
    for seed in (1, 2, 3):
      with open(os.path.join(out, f"{run}-r{r}-seed{seed}", "report.json")) as f:
        ps += [p for p in json.load(f)["policies"] if p["policy"] == policy]
    mean = lambda f: sum(f(p) for p in ps) / len(ps)
    kv = [p.get("kv_events") for p in ps]
    rec = all(k and k["enabled"] and k["receipts"] > 0 for k in kv)
    err = f"{mean(lambda p: p['kv_events']['receipt_mae_tokens']):.1f}" if rec else "-"
    off = f"{100*mean(lambda p: p['kv_events']['receipt_off_block_share']):.1f}%" if rec else "-"
    unrep = f"{mean(lambda p: p['kv_events']['gaps_unrepaired']):.0f}" if rec else "-"
    share = (f"{100*mean(lambda p: p['kv_events']['receipts'] / p['kv_events']['picks']):.1f}%"
             if rec else "-")
    print(f"| {label} | {r} | {100*mean(lambda p: p['prefix_hit_rate']):.1f}% | {ms(mean(lambda p: p['ttft_p50_s']))} | "
          f"{ms(mean(lambda p: p['ttft_p99_s']))} | {mean(lambda p: p['output_tokens_per_s']):.0f} | "
          f"{mean(lambda p: p['requests_per_s']):.2f} | {share} | {err} | {off} | {unrep} |")
PY
