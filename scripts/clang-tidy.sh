#!/usr/bin/env bash
# The curated clang-tidy run (.clang-tidy: bugprone-*, performance-*, no function over 150
# lines) over the project's sources, TIDY_JOBS files at a time (default: one per core), with
# the compile commands of a configured build.
#   scripts/clang-tidy.sh BUILD [DIR_OR_FILE...]   default: all of src/
# Prints one progress line per file, every finding, and a summary; exits 1 when any file
# has a finding (or clang-tidy failed on it).
set -euo pipefail
build=${1:?usage: clang-tidy.sh BUILD [DIR_OR_FILE...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
if [ -z "$tidy" ]; then
  echo "clang-tidy: not installed (scripts/install-deps.sh installs Debian's clang-tidy-14)" >&2
  exit 1
fi
if [ ! -f "$build/compile_commands.json" ]; then
  echo "clang-tidy: $build/compile_commands.json is missing (configure the build first)" >&2
  exit 1
fi
[ $# -gt 0 ] || set -- "$root/src"
files=()
for p in "$@"; do
  if [ -d "$p" ]; then
    while IFS= read -r f; do files+=("$f"); done < <(find "$p" -name '*.cc' | sort)
  else
    files+=("$p")
  fi
done
jobs=${TIDY_JOBS:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
echo "clang-tidy: ${#files[@]} files, $jobs at a time"
check() {  # $1: index, $2: file
  local log="$out/$1.log"
  if "$tidy" -p "$build" --quiet "$2" >"$log" 2>&1; then echo ok >"$out/$1.rc"; else echo fail >"$out/$1.rc"; fi
  echo "[$1/${#files[@]}] ${2#"$root"/} ($(grep -c 'warning:\|error:' "$log" || true) findings)"
}
i=0
for f in "${files[@]}"; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  check "$i" "$f" &
done
wait
bad=0
for ((k = 1; k <= ${#files[@]}; k++)); do
  if [ "$(cat "$out/$k.rc")" != ok ]; then
    bad=$((bad + 1))
    grep -E 'warning:|error:' -A3 "$out/$k.log" | grep -v '^--$' || cat "$out/$k.log"
  fi
done
echo "clang-tidy: $bad of ${#files[@]} files with findings ($(($(date +%s) - start)) s)"
[ "$bad" -eq 0 ]
