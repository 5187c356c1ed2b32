#!/usr/bin/env python3
"""Tables of every run scripts/policy-tables.sh made, and where kvroute stands in each.

    scripts/peer-tables.py OUT > tables.md

For each run folder under OUT (in the order they were written): one table of every policy (goodput, throughput, TTFT, hit rate,
preemptions, errors), then one standing table: the best goodput of any policy, kvroute's
goodput and rank, and kvroute's goodput over each 2026 peer's (llm-d-sticky,
llm-d-precise, dynamo-kv) and over the best policy that is not kvroute. A sweep run
(sweep.json) gets its summary and peak tables from sweep.md instead.
"""
import json
import os
import sys

PEERS_2026 = ["llm-d-sticky", "llm-d-precise", "dynamo-kv"]
OWN = {"kvroute", "kvroute+flow", "kvroute-region-blind", "local-only"}


def dur(s):
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def runs_in_order(out):
    """Run folders in the order they were written (policy-tables.sh runs one at a time)."""
    names = [d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d))]
    return sorted(names, key=lambda n: os.path.getmtime(os.path.join(out, n)))


def errors(p):
    e = p.get("errors") or {}
    if isinstance(e, dict):
        return sum(v for v in e.values() if isinstance(v, (int, float)))
    return e


def main():
    out = sys.argv[1]
    standing = []
    for run in runs_in_order(out):
        d = os.path.join(out, run)
        rep = os.path.join(d, "report.json")
        sweep = os.path.join(d, "sweep.md")
        if not os.path.exists(rep):
            if os.path.exists(sweep):
                with open(sweep) as f:
                    text = f.read()
                keep = text[text.find("Throughput at equal"):]
                print(f"#### {run}\n\n{keep.strip()}\n")
            continue
        with open(rep) as f:
            r = json.load(f)
        ps = r["policies"]
        print(f"#### {run}\n")
        print("| policy | goodput/s | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | hit rate | preempt | errors |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for p in ps:
            name = p["policy"]
            label = f"**{name}**" if name in PEERS_2026 else name
            print(f"| {label} | {p['goodput_requests_per_s']:.2f} | {p['requests_per_s']:.2f} | "
                  f"{p['output_tokens_per_s']:.0f} | {dur(p['ttft_p50_s'])} | {dur(p['ttft_p99_s'])} | "
                  f"{dur(p['tpot_p50_s'])} | {100 * p['prefix_hit_rate']:.1f}% | {p['preemptions']} | "
                  f"{errors(p)} |")
        print()
        by = {p["policy"]: p["goodput_requests_per_s"] for p in ps}
        if "kvroute" not in by:
            continue
        ranked = sorted(by.items(), key=lambda kv: -kv[1])
        rank = 1 + sum(1 for _, g in ranked if g > by["kvroute"])
        others = [(n, g) for n, g in by.items() if n not in OWN]
        best_other = max(others, key=lambda kv: kv[1]) if others else None
        standing.append((run, ranked[0], by["kvroute"], rank, len(by), best_other,
                         {peer: by.get(peer) for peer in PEERS_2026}, by.get("kvroute+flow")))

    if not standing:
        return
    print("#### Where kvroute stands (goodput/s; ratio = kvroute / the other)\n")
    print("| run | best (policy) | kvroute | rank | best not kvroute | vs it | vs llm-d-sticky | "
          "vs llm-d-precise | vs dynamo-kv | kvroute+flow |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for run, best, kv, rank, n, bo, peers, flow in standing:
        def ratio(g):
            return f"{kv / g:.3f}" if g else "-"
        print(f"| {run} | {best[1]:.2f} ({best[0]}) | {kv:.2f} | {rank} of {n} | "
              f"{bo[1]:.2f} ({bo[0]}) | {ratio(bo[1])} | {ratio(peers['llm-d-sticky'])} | "
              f"{ratio(peers['llm-d-precise'])} | {ratio(peers['dynamo-kv'])} | "
              f"{'-' if flow is None else f'{flow:.2f}'} |")


if __name__ == "__main__":
    main()
