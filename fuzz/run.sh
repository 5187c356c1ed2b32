#!/usr/bin/env bash
# Runs each fuzz target for FUZZ_SECONDS and prints, per target, executions, exec/s,
# coverage and findings. Used by `make fuzz`; exits 1 when any target found something.
#
#   fuzz/run.sh BUILD_DIR [TARGET...]      (default: every target)
#   FUZZ_SECONDS=60  seconds per target
#   FUZZ_JOBS=1      targets run at once (each is one process)
#   FUZZ_ARGS=...    extra libFuzzer flags, e.g. "-max_len=65536"
#
# Seeds come from fuzz/corpus/<target> (committed); what a run adds goes to
# BUILD_DIR/fuzz-corpus/<target> (kept between runs, not committed). Crash, timeout and
# OOM inputs land in BUILD_DIR/fuzz-findings/<target>/: fix the bug, add a regression test
# and copy the input into fuzz/corpus/<target>/ (see docs/RELIABILITY.md, "Fuzzing").
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: fuzz/run.sh BUILD_DIR [TARGET...]}"
shift
build="$(cd "$build" && pwd)"
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(prom_parser openai_request router_config scenario_config fleet_config endpoints_file
           http_server extproc_exchange k8s_watch_event doctor_scrape kv_event_decode tokenize pd_legs
           session_token lora_adapter api_keys tls_key_pair trace)
fi

dict_for() {
  case "$1" in
    prom_parser | doctor_scrape) echo prometheus.dict ;;
    openai_request | tokenize | pd_legs | lora_adapter) echo openai.dict ;;
    *_config | endpoints_file) echo yaml.dict ;;
    http_server) echo http.dict ;;
    extproc_exchange) echo extproc.dict ;;
    k8s_watch_event) echo k8s.dict ;;
    kv_event_decode) echo kvevents.dict ;;
    trace) echo trace.dict ;;
  esac
}

run_one() {
  local t="$1"
  local corpus="$build/fuzz-corpus/$t" findings="$build/fuzz-findings/$t" log="$build/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  local before
  before=$(find "$findings" -type f | wc -l)
  # -timeout: an input taking 10 s is a hang; -rss_limit_mb: the default 2 GB, stated.
  # ASan leak checks stay on (a leak is a finding). UBSan aborts on the first report.
  set +e
  # A target without a dictionary gets no -dict (libFuzzer cannot read a directory).
  local dict=()
  [ -n "$(dict_for "$t")" ] && dict=(-dict="$here/dict/$(dict_for "$t")")
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/fuzz/${t}_fuzz" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 "${dict[@]}" -artifact_prefix="$findings/" \
    ${FUZZ_ARGS:-} "$corpus" "$here/corpus/$t" >"$log" 2>&1
  local rc=$?
  set -e
  local after
  after=$(find "$findings" -type f | wc -l)
  local execs rate cov ft corp
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  local found=$((after - before))
  if [ "$rc" -ne 0 ] && [ "$found" -eq 0 ]; then found=1; fi  # died without an artifact
  printf '%-16s %10s execs %7s exec/s  cov %5s  ft %6s  corpus %5s  findings %d%s\n' \
    "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$found" \
    "$([ "$found" -gt 0 ] && echo "  (see $log, $findings)")"
  [ "$found" -eq 0 ]
}

echo "fuzz: ${#targets[@]} targets, ${seconds}s each, ${jobs} at a time"
failed=0
pids=()
for t in "${targets[@]}"; do
  [ -x "$build/fuzz/${t}_fuzz" ] || { echo "fuzz: $build/fuzz/${t}_fuzz not built" >&2; exit 2; }
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$failed" -ne 0 ]; then
  echo "fuzz: findings above; fix them (with a regression test) before committing" >&2
  exit 1
fi
