#!/usr/bin/env python3
"""Issue 24's goodput table from scripts/goodput-table.sh's reports.

Goodput here is the issue's: requests meeting both SLOs (`good_requests`), compared within
one run (every policy of a run is offered the same requests). The best peer is the
highest among the policies that are not kvroute's own (kvroute, kvroute-slo, any +flow,
kvroute-region-blind, local-only).

    scripts/goodput-table.py OUT
"""
import json
import os
import sys

OWN = {"kvroute", "kvroute-slo", "kvroute-region-blind", "local-only"}
SCENARIOS = ["seed-8x", "gie-prefix", "multi-turn", "hotspot", "no-sharing",
             "overload-many-2x", "overload-many-5x", "overload-many-10x", "overload-few-2x",
             "overload-few-5x", "overload-few-10x", "overload-no-sharing-5x",
             "overload-multi-turn-5x", "two-tenant", "two-tenant-alone", "regions-2-local",
             "regions-2-spike", "regions-3"]


def main():
    out = sys.argv[1]
    print("| scenario | seed | requests | best peer (good) | kvroute | / best | kvroute+flow "
          "| / best | refused | TTFT p99 best peer / kvroute / +flow |")
    print("|---|--:|--:|---|--:|--:|--:|--:|--:|--:|")
    runs = flow_ge = flow_ge10 = plain_ge = 0
    worst = {}
    for s in SCENARIOS:
        for seed in (1, 2, 3):
            path = os.path.join(out, f"{s}-seed{seed}", "report.json")
            if not os.path.exists(path):
                continue
            pols = {p["policy"]: p for p in json.load(open(path))["policies"]}
            peers = [(p["good_requests"], name) for name, p in pols.items()
                     if name not in OWN and not name.endswith("+flow")]
            best, best_name = max(peers)
            k, f = pols["kvroute"], pols["kvroute+flow"]
            runs += 1
            plain_ge += k["good_requests"] >= best
            flow_ge += f["good_requests"] >= best
            flow_ge10 += f["good_requests"] >= 1.1 * best
            ratio = f["good_requests"] / best if best else float("inf")
            worst[s] = min(worst.get(s, ratio), ratio)
            print(f"| {s} | {seed} | {k['requests']} | {best} ({best_name}) | "
                  f"{k['good_requests']} | {k['good_requests'] / best:.3f} | "
                  f"{f['good_requests']} | {ratio:.3f} | {f['requests'] - f['succeeded']} | "
                  f"{pols[best_name]['ttft_p99_s']:.2f} / {k['ttft_p99_s']:.2f} / "
                  f"{f['ttft_p99_s']:.2f} s |")
    print(f"\nRuns: {runs}. kvroute >= best peer in {plain_ge}; kvroute+flow >= best peer in "
          f"{flow_ge}, >= 1.1x in {flow_ge10}.")
    at_least = [s for s, r in worst.items() if r >= 1.0]
    ahead10 = [s for s, r in worst.items() if r >= 1.1]
    print(f"Scenarios where kvroute+flow >= best peer at every seed: {len(at_least)} of "
          f"{len(worst)}; >= 1.1x at every seed: {len(ahead10)} ({', '.join(ahead10)}).")
    behind = ", ".join(f"{s} {r:.3f}" for s, r in worst.items() if r < 1.0)
    print(f"Behind at some seed (worst ratio): {behind or 'none'}.")


if __name__ == "__main__":
    main()
