#!/usr/bin/env bash
# Live vs virtual-time cross-check (issue 4).
#
# For each policy: a fresh `kvroute sim` fleet (cold caches), `kvroute serve` with a
# generated config whose scheduling.policy is that policy, and `kvroute bench --scenario`
# through the router, scraping every replica's /metrics. Then `kvroute simulate` on the same
# scenario, plus 8 variants with slightly different network delay and scrape interval (the
# "simulate band": how much the simulation itself moves with sub-millisecond timing).
# Prints a side-by-side Markdown table (hit rate, TTFT, TPOT, throughput, goodput per
# policy, live and simulated) and whether hit rates agree within a tolerance (of the
# nominal simulation or of the band) and whether the policy rankings agree (a pair only
# disagrees if no simulation of the band orders it as the live run does). See
# docs/CROSSCHECK.md.
#
# Time scale: the live replicas run at --time-scale S (S wall seconds per engine second)
# so that a 2-core machine keeps up. Everything the load generator controls is converted
# so that both runs see the same traffic in engine time: rate / S (stage durations,
# --duration, think time x S), router scrape interval = scenario scrape_interval_s x S, SLOs
# x S; live latencies are divided by S and live rates multiplied by S before comparing.
#
# Usage: scripts/crosscheck.sh [options]
#   --bin PATH          kvroute binary (default: build/kvroute)
#   --scenario FILE     scenario YAML (default: examples/scenarios/crosscheck.yaml)
#   --policies LIST     comma-separated (default: round-robin,least-request,kvroute,gie-default)
#   --time-scale S      live slow-down factor (default 4)
#   --tolerance PP      hit-rate agreement tolerance, percentage points (default 5)
#   --out DIR           output directory (default: out/crosscheck)
#   --skip-live         only re-print the table from DIR's existing live reports
# Exit: 0 = ran and agrees, 3 = ran and disagrees, 1 = a run failed, 2 = bad usage.
set -euo pipefail

COMMAND="scripts/crosscheck.sh $*"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$REPO/build/kvroute"
SCENARIO="$REPO/examples/scenarios/crosscheck.yaml"
POLICIES="round-robin,least-request,kvroute,gie-default"
TIME_SCALE=4
TOLERANCE=5
OUT="$REPO/out/crosscheck"
SKIP_LIVE=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --scenario) SCENARIO="$2"; shift 2 ;;
    --policies) POLICIES="$2"; shift 2 ;;
    --time-scale) TIME_SCALE="$2"; shift 2 ;;
    --tolerance) TOLERANCE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --skip-live) SKIP_LIVE=1; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "crosscheck: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x "$BIN" ]] || { echo "crosscheck: no binary at $BIN (build it or pass --bin)" >&2; exit 2; }
[[ -f "$SCENARIO" ]] || { echo "crosscheck: no scenario $SCENARIO" >&2; exit 2; }
command -v python3 >/dev/null || { echo "crosscheck: needs python3 (with PyYAML)" >&2; exit 2; }
command -v curl >/dev/null || { echo "crosscheck: needs curl" >&2; exit 2; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

log() { printf '[crosscheck %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# --- processes we start, and their cleanup -------------------------------------------
PIDS=()
stop_pid() {  # SIGTERM, up to 5 s, then SIGKILL; only our own children.
  local pid="$1"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do [[ -n "$pid" ]] && stop_pid "$pid"; done
  PIDS=()
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# --- what the live run needs from the scenario, converted by the time scale -----------
# Prints shell assignments: fleet flags for `kvroute sim`, bench overrides, router scrape
# interval, request count and expected engine duration.
read_scenario() {
  python3 - "$SCENARIO" "$TIME_SCALE" <<'PY'
import shlex, sys, yaml
path, s = sys.argv[1], float(sys.argv[2])
sc = yaml.safe_load(open(path))
fl = sc.get("fleet", {}) or {}
wl = sc.get("workload", {}) or {}
ar = sc.get("arrivals", {}) or {}
slo = sc.get("slo", {}) or {}
sim = ["--replicas", str(fl.get("replicas", 8)), "--preset", fl.get("engine_preset", "llama3-8b-h100"),
       "--time-scale", repr(s)]
for key, flag in (("kv_blocks", "--kv-blocks"), ("max_num_seqs", "--max-num-seqs"),
                  ("max_num_batched_tokens", "--max-batched-tokens"),
                  ("max_model_len", "--max-model-len")):
    if fl.get(key):
        sim += [flag, str(fl[key])]
bench = []
engine_span = 0.0
if "stages" in ar:
    st = ar["stages"]
    bench += ["--stages", ",".join(
        f"{x['rate'] / s:g}:{(x['duration_s'] * s) if x.get('duration_s') not in (None, '.inf') else 'inf'}"
        for x in st)]
    engine_span = sum(x.get("duration_s", 0) or 0 for x in st)
else:
    bench += ["--rate", f"{float(ar.get('rate', 10)) / s:g}"]
    if ar.get("num_requests"):
        engine_span = float(ar["num_requests"]) / float(ar.get("rate", 10))
if ar.get("duration_s"):
    bench += ["--duration", f"{float(ar['duration_s']) * s:g}"]
    engine_span = min(engine_span, float(ar["duration_s"])) if engine_span else float(ar["duration_s"])
if wl.get("think_time_s"):
    bench += ["--think-time", f"{float(wl['think_time_s']) * s:g}"]
if wl.get("type") == "trace":
    bench += ["--trace-time-scale", f"{float(wl.get('time_scale', 1.0)) / s:g}"]
slo_items = []
for key, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e")):
    if slo.get(key):
        slo_items.append(f"{name}={float(slo[key]) * s:g}")
if slo_items:
    bench += ["--slo", ",".join(slo_items)]
scrape_ms = float(fl.get("scrape_interval_s", 0.05)) * s * 1000
print("SIM_FLAGS=(" + " ".join(shlex.quote(x) for x in sim) + ")")
print("BENCH_FLAGS=(" + " ".join(shlex.quote(x) for x in bench) + ")")
print(f"SCRAPE_MS={max(1, round(scrape_ms))}")
print(f"REPLICAS={int(fl.get('replicas', 8))}")
print(f"ENGINE_SPAN_S={engine_span:g}")
PY
}
eval "$(read_scenario)"
IFS=',' read -r -a POLICY_LIST <<< "$POLICIES"
# Per-policy wall budget: the arrivals, a drain of 10 engine seconds or 30 wall seconds,
# whichever is longer, plus start-up.
DRAIN_S=$(python3 -c "print(max(30, 10 * $TIME_SCALE))")
BENCH_BUDGET_S=$(python3 -c "import math; print(math.ceil($ENGINE_SPAN_S * $TIME_SCALE + $DRAIN_S + 30))")

# --- one live run ----------------------------------------------------------------------
wait_for() {  # wait_for SECONDS PID CMD... : polls CMD every 0.1 s until it succeeds;
              # fails at the deadline or as soon as process PID has exited.
  local deadline=$((SECONDS + $1)) pid="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
}
http_ok() { curl -sf --max-time 1 -o /dev/null "$1"; }
sim_ports_listed() { [[ $(grep -c 'http://' "$1") -ge $REPLICAS ]]; }
router_listening() { grep -q 'listening on port' "$1"; }

run_live() {
  local policy="$1" dir="$OUT/live/$1"
  rm -rf "$dir"; mkdir -p "$dir"
  log "[$policy] starting $REPLICAS simulated replicas (time scale $TIME_SCALE)"
  "$BIN" sim "${SIM_FLAGS[@]}" --enable-prompt-tokens-details --port 0 --threads 1 >"$dir/sim.log" 2>&1 &
  local sim_pid=$!
  PIDS+=("$sim_pid")
  wait_for 20 "$sim_pid" sim_ports_listed "$dir/sim.log" || { log "[$policy] sim did not start"; cat "$dir/sim.log" >&2; return 1; }
  local ports
  ports=$(grep -o 'http://[0-9.]*:[0-9]*' "$dir/sim.log" | sed 's#http://##' | head -n "$REPLICAS")
  local addr
  for addr in $ports; do
    wait_for 10 "$sim_pid" http_ok "http://$addr/health" || { log "[$policy] replica $addr not healthy"; return 1; }
  done
  # The config needs a concrete port: take one the kernel hands out now (a tiny race with
  # other programs; a clash shows as "router did not start").
  local rport
  rport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  {
    echo "# generated by scripts/crosscheck.sh for policy $policy"
    echo "listen: 127.0.0.1:$rport"
    echo "threads: 1"
    echo "pool:"
    echo "  engine_type: vllm"
    echo "  scrape_interval: ${SCRAPE_MS}ms"
    echo "  staleness: 2s"
    echo "  endpoints:"
    for addr in $ports; do echo "    - $addr"; done
    echo "scheduling:"
    echo "  policy: $policy"
  } >"$dir/router.yaml"
  "$BIN" serve --config "$dir/router.yaml" >"$dir/serve.log" 2>&1 &
  local serve_pid=$!
  PIDS+=("$serve_pid")
  wait_for 20 "$serve_pid" router_listening "$dir/serve.log" || { log "[$policy] router did not start"; cat "$dir/serve.log" >&2; return 1; }
  wait_for 20 "$serve_pid" http_ok "http://127.0.0.1:$rport/readyz" || { log "[$policy] router not ready"; return 1; }
  sleep 0.3  # a few scrapes of every replica
  local fleet
  fleet=$(echo $ports | tr ' ' ',')
  log "[$policy] router on :$rport; bench ${BENCH_FLAGS[*]} (budget ${BENCH_BUDGET_S}s)"
  local rc=0
  # In the background and waited for, so that a signal to this script runs its trap at
  # once instead of after the bench (bash defers traps while a foreground child runs).
  timeout --signal=TERM --kill-after=10 "$BENCH_BUDGET_S" \
    "$BIN" bench --url "http://127.0.0.1:$rport" --scenario "$SCENARIO" "${BENCH_FLAGS[@]}" \
      --fleet "$fleet" --label "$policy" --drain "$DRAIN_S" --quiet --out "$dir" \
      >"$dir/bench.txt" 2>"$dir/bench.err" &
  local bench_pid=$!
  PIDS+=("$bench_pid")
  wait "$bench_pid" || rc=$?
  stop_pid "$serve_pid"
  stop_pid "$sim_pid"
  PIDS=()
  if [[ $rc -ne 0 || ! -f "$dir/report.json" ]]; then
    log "[$policy] bench failed (exit $rc)"; cat "$dir/bench.err" >&2; return 1
  fi
  grep -E '^(requests|ttft|fleet|errors)' "$dir/bench.txt" | sed "s/^/[$policy] /" >&2 || true
}

# --- the runs --------------------------------------------------------------------------
log "scenario $SCENARIO, policies $POLICIES, time scale $TIME_SCALE, binary $BIN"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
[[ $SKIP_LIVE -eq 1 ]] && LOAD_START="(live runs of an earlier invocation)"
log "simulate (virtual time)"
mkdir -p "$OUT/simulate"
"$BIN" simulate --scenario "$SCENARIO" --policies "$POLICIES" --out "$OUT/simulate" --quiet \
  >"$OUT/simulate/report.txt" 2>"$OUT/simulate.err" || {
  log "simulate failed"; cat "$OUT/simulate.err" >&2; exit 1; }
# Timing sensitivity of the simulation itself: the same scenario with the network delay
# x 1/3, 1, 3 and the scrape interval x 0.8, 1, 1.2 (sub-millisecond changes, smaller than
# what separates a live run from a simulated one). A hit rate within the tolerance of
# the band these variants span agrees; a ranking some variant reproduces agrees.
rm -rf "$OUT/perturb"; mkdir -p "$OUT/perturb"
python3 - "$SCENARIO" "$OUT/perturb" <<'PY'
import os, sys, yaml
src, dst = sys.argv[1], sys.argv[2]
sc = yaml.safe_load(open(src))
wl = sc.get("workload", {}) or {}
if wl.get("path") and not os.path.isabs(wl["path"]):  # trace paths are relative to the file
    wl["path"] = os.path.join(os.path.dirname(os.path.abspath(src)), wl["path"])
fl = sc.setdefault("fleet", {})
nd0, si0 = float(fl.get("network_delay_s", 0.0005)), float(fl.get("scrape_interval_s", 0.05))
i = 0
for nd in (1 / 3, 1.0, 3.0):
    for si in (0.8, 1.0, 1.2):
        if nd == 1.0 and si == 1.0:
            continue  # the nominal run
        fl["network_delay_s"], fl["scrape_interval_s"] = nd0 * nd, si0 * si
        yaml.safe_dump(sc, open(os.path.join(dst, f"v{i}.yaml"), "w"), sort_keys=False)
        i += 1
PY
for f in "$OUT"/perturb/v*.yaml; do
  "$BIN" simulate --scenario "$f" --policies "$POLICIES" --out "${f%.yaml}" --quiet \
    >/dev/null 2>>"$OUT/simulate.err" || { log "simulate $f failed"; exit 1; }
done
if [[ $SKIP_LIVE -eq 0 ]]; then
  for p in "${POLICY_LIST[@]}"; do
    run_live "$p" || exit 1
  done
fi

# --- the comparison --------------------------------------------------------------------
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
[[ $SKIP_LIVE -eq 1 ]] && LOAD_END="-"
python3 - "$OUT" "$TIME_SCALE" "$TOLERANCE" "$POLICIES" "$SCENARIO" "$LOAD_START" "$LOAD_END" "$COMMAND" <<'PY'
import json, os, sys
out, s, tol, policies, scenario = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(","), sys.argv[5]
load_start, load_end, command = sys.argv[6], sys.argv[7], sys.argv[8]
sim = {p["policy"]: p for p in json.load(open(os.path.join(out, "simulate", "report.json")))["policies"]}
variants = []  # perturbed simulations, nominal first
pdir = os.path.join(out, "perturb")
for name in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
    path = os.path.join(pdir, name, "report.json")
    if os.path.exists(path):
        variants.append({p["policy"]: p for p in json.load(open(path))["policies"]})
live = {}
for p in policies:
    path = os.path.join(out, "live", p, "report.json")
    if os.path.exists(path):
        live[p] = json.load(open(path))["policies"][0]

def engine_live(p):
    """Live figures converted to engine time."""
    r = live[p]
    return {
        "hit": r["prefix_hit_rate"], "cached": r["request_cached_fraction"],
        "ttft50": r["ttft_p50_s"] / s, "ttft99": r["ttft_p99_s"] / s,
        "tpot50": r["tpot_p50_s"] / s, "otps": r["output_tokens_per_s"] * s,
        "good": r["goodput_requests_per_s"] * s, "rps": r["requests_per_s"] * s,
        "ok": r["succeeded"], "n": r["requests"], "preempt": r["preemptions"],
    }

def engine_sim(p, run=None):
    r = (run or sim)[p]
    return {
        "hit": r["prefix_hit_rate"], "cached": r["request_cached_fraction"],
        "ttft50": r["ttft_p50_s"], "ttft99": r["ttft_p99_s"], "tpot50": r["tpot_p50_s"],
        "otps": r["output_tokens_per_s"], "good": r["goodput_requests_per_s"],
        "rps": r["requests_per_s"], "ok": r["succeeded"], "n": r["requests"],
        "preempt": r["preemptions"],
    }

pols = [p for p in policies if p in sim and p in live]
S = {p: engine_sim(p) for p in pols}
V = [S] + [{p: engine_sim(p, v) for p in pols} for v in variants if all(p in v for p in pols)]
band = lambda p, key: (min(v[p][key] for v in V), max(v[p][key] for v in V))
L = {p: engine_live(p) for p in pols}
ms = lambda v: f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
pct = lambda v: f"{100 * v:.1f}%"
lines = [f"`{command.strip()}`", ""]
lines.append(f"Scenario `{os.path.relpath(scenario)}`; live at time scale {s:g} (figures below converted to engine time); hit-rate tolerance ±{tol:g} pp; machine load average {load_start} before, {load_end} after.")
lines.append("")
lines.append(f"Simulate band: min-max over {len(V)} simulations of the scenario with the network delay x 1/3, 1, 3 and the scrape interval x 0.8, 1, 1.2.")
lines.append("")
lines.append("| policy | hit sim | hit sim band | hit live | Δ pp | TTFT p50 sim / live | TTFT p99 sim (band) / live | TPOT p50 sim / live | out tok/s sim / live | goodput/s sim / live | ok live | preempt sim / live |")
lines.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
hit_ok = True
hit_notes = []
for p in pols:
    a, b = S[p], L[p]
    d = 100 * (b["hit"] - a["hit"])
    lo, hi = band(p, "hit")
    in_tol = abs(d) <= tol
    off_band = 100 * max(0.0, lo - b["hit"], b["hit"] - hi)  # pp from the nearest simulation
    in_band = off_band <= tol
    hit_ok &= in_band
    mark = "" if in_tol else (" (band ok)" if in_band else " ✗")
    if not in_tol:
        hit_notes.append(f"{p} {d:+.1f} pp from the nominal simulation, {off_band:.1f} pp from the band")
    t_lo, t_hi = band(p, "ttft99")
    lines.append(f"| {p} | {pct(a['hit'])} | {pct(lo)}-{pct(hi)} | {pct(b['hit'])} | {d:+.1f}{mark} | "
                 f"{ms(a['ttft50'])} / {ms(b['ttft50'])} | "
                 f"{ms(a['ttft99'])} ({ms(t_lo)}-{ms(t_hi)}) / {ms(b['ttft99'])} | "
                 f"{a['tpot50'] * 1000:.1f} / {b['tpot50'] * 1000:.1f} ms | {a['otps']:.0f} / {b['otps']:.0f} | "
                 f"{a['good']:.1f} / {b['good']:.1f} | {b['ok']}/{b['n']} | {a['preempt']} / {b['preempt']} |")
lines.append("")

# Rankings. A pair of policies is a disagreement only when the live run separates it (by
# more than the tie margin: hit rate tolerance / 2 in pp; latency and goodput 10%
# relative) and every simulation of the band orders it the other way, also separated.
# A pair some simulation of the band orders like the live run is timing-sensitive, not
# a disagreement.
def ranking(D, key, higher_better):
    return sorted(pols, key=lambda p: -D[p][key] if higher_better else D[p][key])

def separated(D, a, b, key, rel):
    x, y = D[a][key], D[b][key]
    if rel is None:
        return abs(x - y) * 100 > tol / 2
    return abs(x - y) > rel * max(abs(x), abs(y), 1e-12)

verdict = True
for key, name, hb, rel in (("hit", "prefix hit rate (higher first)", True, None),
                           ("ttft99", "TTFT p99 (lower first)", False, 0.10),
                           ("good", "goodput (higher first)", True, 0.10)):
    rs, rl = ranking(S, key, hb), ranking(L, key, hb)
    conflicts, sensitive = [], []
    for i, a in enumerate(pols):
        for b in pols[i + 1:]:
            dl = L[a][key] - L[b][key]
            if not separated(L, a, b, key, rel):
                continue
            opposite = [(v[a][key] - v[b][key]) * dl < 0 and separated(v, a, b, key, rel) for v in V]
            if all(opposite):
                conflicts.append(f"{a} vs {b}")
            elif opposite[0]:
                sensitive.append(f"{a} vs {b}")
    agree = not conflicts
    verdict &= agree
    if rs == rl:
        how = "identical"
    elif conflicts:
        how = "**differs**: " + ", ".join(conflicts)
    elif sensitive:
        how = "same within the simulate band (" + ", ".join(sensitive) + " swap inside it)"
    else:
        how = "same up to ties"
    lines.append(f"- Ranking by {name}: simulate `{' > '.join(rs)}`; live `{' > '.join(rl)}` — {how}")
lines.append(f"- Hit rates within ±{tol:g} pp of the nominal simulation, or of the simulate band, for every policy: "
             + ("yes" if hit_ok else "**no**") + (" (" + "; ".join(hit_notes) + ")" if hit_notes else "") + ".")
verdict &= hit_ok
lines.append(f"- Verdict: {'AGREE' if verdict else 'DISAGREE'}.")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "crosscheck.md"), "w").write(text)
json.dump({"time_scale": s, "tolerance_pp": tol, "simulate": S, "live": L, "agree": verdict,
           "simulate_band": {p: {k: band(p, k) for k in S[p]} for p in pols}},
          open(os.path.join(out, "crosscheck.json"), "w"), indent=1)
print(text, end="")
sys.exit(0 if verdict else 3)
PY
