# Shared by the live scripts (scripts/live-two-tenant.sh, scripts/live-regions.sh): source
# it after setting NAME (the script's name, for messages). Provides:
#   ports_free PORT...   exits 2 naming the first port something already listens on
#   tmp, out             a scratch directory (removed on exit) and where bench output goes
#                        ($KEEP when set, else $tmp)
#   pids, stop_all       background processes started by the script, and their shutdown
#                        (also run on exit and on INT/TERM)
#   WORKLOAD             the bench workload both stories send: shared 2,048-token system
#                        prompts in 16 groups, 200-token questions, 64-token outputs
#   serve_ready LOG      waits up to 10 s for $SERVE/readyz, else prints LOG and exits 1
ports_free() {
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$NAME: port $p is in use" >&2
      exit 2
    fi
  done
}

tmp=$(mktemp -d)
out=${KEEP:-$tmp}
mkdir -p "$out"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() { stop_all; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

WORKLOAD=(--workload shared-prefix --num-groups 16 --prompts-per-group 32 --system-len 2048
          --question-len 200:50:100:300 --output-len 64:16:32:96 --arrival poisson
          --slo ttft=1s,tpot=50ms --timeout 120 --quiet)

serve_ready() {
  for _ in $(seq 100); do
    curl -sf "$SERVE/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "$NAME: serve not ready" >&2
  cat "$1" >&2
  exit 1
}
