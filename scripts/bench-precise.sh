#!/usr/bin/env bash
# Cost of precise picking in `kvroute serve` (issue 23): the same requests through a router
# that picks with the KV-event index (tokenize on a replica, then the precise lookup), through
# one that picks with the approximate model, and straight to a replica (the reference), all
# in one run against one sim fleet.
#
#   scripts/bench-precise.sh [BINARY]      # default build/kvroute
#
# Environment: N_SMALL (requests per target at 4 KB, default 2000), N_LARGE (at 220 KB,
# default 500), REPLICAS (default 4), PORT (base port, default 18400; uses PORT..PORT+39).
# Requests are sequential (one connection per target, keep-alive), interleaved
# request by request across the three targets in a rotating order, so drift on the shared
# machine hits all three alike. Prints a markdown table.
set -euo pipefail
KV=$(realpath "${1:-build/kvroute}")
REPLICAS=${REPLICAS:-4}
PORT=${PORT:-18400}
SIM_PORT=$PORT                 # replica i: SIM_PORT+i
KV_PORT=$((PORT + 10))         # replica i publishes KV events on KV_PORT+i
APPROX_PORT=$((PORT + 30))
PRECISE_PORT=$((PORT + 31))
WORK=$(mktemp -d /tmp/bench-precise.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_http() {  # port path
  for _ in $(seq 200); do
    curl -fs "http://127.0.0.1:$1$2" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "port $1 did not answer $2" >&2
  exit 1
}

# The fleet: no engine waiting (time scale 0), one output token, KV events published.
"$KV" sim --replicas "$REPLICAS" --port "$SIM_PORT" --time-scale 0 --fixed-output-tokens 1 \
  --kv-events-port "$KV_PORT" --threads 1 >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
for i in $(seq 0 $((REPLICAS - 1))); do wait_http $((SIM_PORT + i)) /health; done

# Two routers on the same fleet: one without kv_events (approximate), one with (precise).
config() {  # listen_port with_events
  echo "listen: 127.0.0.1:$1"
  echo "threads: 1"
  echo "pool:"
  echo "  scrape_interval: 50ms"
  echo "  endpoints:"
  for i in $(seq 0 $((REPLICAS - 1))); do
    if [ "$2" = 1 ]; then
      echo "    - {address: 127.0.0.1:$((SIM_PORT + i)), name: r$i, kv_events: \"tcp://127.0.0.1:$((KV_PORT + i))\"}"
    else
      echo "    - {address: 127.0.0.1:$((SIM_PORT + i)), name: r$i}"
    fi
  done
  echo "scheduling:"
  echo "  policy: kvroute"
}
config "$APPROX_PORT" 0 >"$WORK/approx.yaml"
config "$PRECISE_PORT" 1 >"$WORK/precise.yaml"
"$KV" serve --config "$WORK/approx.yaml" >"$WORK/approx.log" 2>&1 &
PIDS+=($!)
"$KV" serve --config "$WORK/precise.yaml" >"$WORK/precise.log" 2>&1 &
PIDS+=($!)
wait_http "$APPROX_PORT" /readyz
wait_http "$PRECISE_PORT" /readyz

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$REPLICAS" "$SIM_PORT" "$APPROX_PORT" "$PRECISE_PORT" "${N_SMALL:-2000}" "${N_LARGE:-500}" <<'PY'
import re, socket, statistics, sys, time, urllib.request

replicas, sim_port, approx_port, precise_port, n_small, n_large = map(int, sys.argv[1:])


def body(prompt_bytes):  # as scripts/proxy_load.py and scripts/bench-proxy.sh
    prompt = ("The quick brown fox jumps over the lazy dog. " * (prompt_bytes // 45 + 1))[:prompt_bytes]
    return ('{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"%s","max_tokens":1}' % prompt).encode()


class Conn:
    """One keep-alive connection; request() returns the seconds to a complete response."""
    def __init__(self, port):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, b):
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (self.port, len(b))) + b
        t0 = time.perf_counter()
        self.sock.sendall(req)
        buf = b""
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise SystemExit("port %d closed the connection" % self.port)
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            head = buf[:end].decode("latin-1").lower()
            m = re.search(r"content-length:\s*(\d+)", head)
            if not m:
                raise SystemExit("response without content-length from %d: %r" % (self.port, head))
            if len(buf) - end - 4 >= int(m.group(1)):
                break
        t = time.perf_counter() - t0
        status = int(head.split()[1])
        if status != 200:
            raise SystemExit("port %d answered %d: %r" % (self.port, status, buf[:300]))
        return t


def metrics(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()


def sample(text, name):
    m = re.search(r"^%s(?:\{\})? ([0-9.eE+-]+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else 0.0


def hist(port):  # (sum, count) of the two histograms
    t = metrics(port)
    return {h: (sample(t, h + "_sum"), sample(t, h + "_count"))
            for h in ("kvroute_tokenize_duration_seconds", "kvroute_scheduling_duration_seconds")}


# Warm-up until the precise router hears every replica's events (kvroute_kv_events_state
# live for every endpoint): requests straight to each replica make it store blocks.
warm = [Conn(sim_port + i) for i in range(replicas)]
deadline = time.time() + 30
while True:
    t = metrics(precise_port)
    live = re.findall(r'^kvroute_kv_events_state\{endpoint="([^"]+)",state="live"\} 1(?:\.0*)?$', t, re.M)
    if len(set(live)) == replicas:
        break
    if time.time() > deadline:
        raise SystemExit("KV events not live on every endpoint:\n" +
                         "\n".join(l for l in t.splitlines() if l.startswith("kvroute_kv_events_state")))
    for c in warm:
        c.request(body(4096))
    time.sleep(0.1)
print("precise router: KV events live on all %d endpoints" % replicas, file=sys.stderr)

targets = {"direct": sim_port, "approximate": approx_port, "precise": precise_port}
conns = {k: Conn(p) for k, p in targets.items()}
names = list(targets)
rows = []
for size, n in ((4096, n_small), (220 * 1024, n_large)):
    b = body(size)
    for k in names:  # warm each path at this size
        for _ in range(20):
            conns[k].request(b)
    h0 = {k: hist(targets[k]) for k in ("approximate", "precise")}
    lat = {k: [] for k in names}
    for i in range(n):
        for j in range(len(names)):
            k = names[(i + j) % len(names)]
            lat[k].append(conns[k].request(b))
    h1 = {k: hist(targets[k]) for k in ("approximate", "precise")}

    def pct(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1e6

    def mean_us(k, h):
        s = h1[k][h][0] - h0[k][h][0]
        c = h1[k][h][1] - h0[k][h][1]
        return (s / c * 1e6, int(c)) if c else (float("nan"), 0)

    r = {"size": size, "n": n}
    for k in names:
        r[k] = (pct(lat[k], 0.5), pct(lat[k], 0.99))
    r["tok"] = mean_us("precise", "kvroute_tokenize_duration_seconds")
    r["sched_a"] = mean_us("approximate", "kvroute_scheduling_duration_seconds")
    r["sched_p"] = mean_us("precise", "kvroute_scheduling_duration_seconds")
    rows.append(r)
    print("%d bytes: %d requests per target done" % (size, n), file=sys.stderr)

f = lambda us: "%.0f" % us
print("| prompt | requests/target | direct p50 / p99 us | approximate p50 / p99 us | approximate added p50 / p99 | "
      "precise p50 / p99 us | precise added p50 / p99 | precise - approximate p50 / p99 | "
      "tokenize mean us (precise) | scheduling mean us (approximate / precise) |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in rows:
    d, a, p = r["direct"], r["approximate"], r["precise"]
    print("| %s | %d | %s / %s | %s / %s | %+.0f / %+.0f | %s / %s | %+.0f / %+.0f | %+.0f / %+.0f | %.0f (%d calls) | %.1f / %.1f |"
          % ("4 KB" if r["size"] == 4096 else "220 KB", r["n"], f(d[0]), f(d[1]), f(a[0]), f(a[1]),
             a[0] - d[0], a[1] - d[1], f(p[0]), f(p[1]), p[0] - d[0], p[1] - d[1],
             p[0] - a[0], p[1] - a[1], r["tok"][0], r["tok"][1], r["sched_a"][0], r["sched_p"][0]))
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# The precise router must have tokenized without failures (else its requests fell back to the
# approximate model and the comparison says nothing).
curl -s "http://127.0.0.1:$PRECISE_PORT/metrics" | grep -E '^kvroute_tokenize_(requests_total|failures_total)' | \
  awk '$NF != 0' >&2
echo "logs in $WORK" >&2
