#!/usr/bin/env python3
"""Compares two folders written by scripts/policy-tables.sh (before, after): one markdown
table per run with each policy's goodput/s, req/s, TTFT p99, hit rate and errors, before
-> after, and the goodput change in percent; rows whose goodput, req/s or TTFT p99 moved
by more than 2% are marked. Usage: policy-tables-diff.py BEFORE AFTER [--changed-only]"""
import json
import os
import sys


def load(folder, run):
    path = os.path.join(folder, run, "report.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return {p["policy"]: p for p in json.load(f)["policies"]}


def pct(a, b):
    if a == 0:
        return 0.0 if b == 0 else float("inf")
    return 100.0 * (b - a) / a


def ms(s):
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def errors(p):
    return sum(p.get("errors", {}).values())


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    changed_only = "--changed-only" in sys.argv
    if len(args) != 2:
        sys.exit(__doc__)
    before, after = args
    runs = sorted(d for d in os.listdir(before) if os.path.isdir(os.path.join(before, d)))
    moved_runs = 0
    for run in runs:
        b, a = load(before, run), load(after, run)
        if b is None or a is None:
            continue
        rows = []
        for name, pb in b.items():
            pa = a.get(name)
            if pa is None:
                continue
            g = pct(pb["goodput_requests_per_s"], pa["goodput_requests_per_s"])
            r = pct(pb["requests_per_s"], pa["requests_per_s"])
            t = pct(pb["ttft_p99_s"], pa["ttft_p99_s"])
            moved = max(abs(g), abs(r), abs(t)) > 2.0
            if changed_only and not moved:
                continue
            rows.append(
                f"| {name} | {pb['goodput_requests_per_s']:.2f} -> {pa['goodput_requests_per_s']:.2f}"
                f" | {g:+.1f}% | {pb['requests_per_s']:.2f} -> {pa['requests_per_s']:.2f}"
                f" | {ms(pb['ttft_p99_s'])} -> {ms(pa['ttft_p99_s'])}"
                f" | {100 * pb['prefix_hit_rate']:.1f}% -> {100 * pa['prefix_hit_rate']:.1f}%"
                f" | {errors(pb)} -> {errors(pa)} | {'**yes**' if moved else ''} |")
        if not rows:
            continue
        moved_runs += 1
        print(f"\n#### {run}\n")
        print("| policy | goodput/s | change | req/s | TTFT p99 | hit rate | errors | >2% |")
        print("|---|--:|--:|--:|--:|--:|--:|:-:|")
        print("\n".join(rows))
    if changed_only and moved_runs == 0:
        print("No policy moved by more than 2% in any run.")


if __name__ == "__main__":
    main()
