#!/usr/bin/env bash
# The curated clang-tidy run (.clang-tidy: bugprone-*, performance-*, no function over 150
# lines) over the project's sources, with the compile commands of a configured build and a
# cache of clean verdicts keyed by each unit's preprocessed text (scripts/clang_tidy_run.py).
#   scripts/clang-tidy.sh BUILD [DIR_OR_FILE...]   default: all of src/
# TIDY_JOBS files at a time (default: one per core); TIDY_CACHE (default
# ~/.cache/kvroute-tidy). Exits 1 when any file has a finding (or clang-tidy failed on it).
set -euo pipefail
exec python3 "$(dirname "$0")/clang_tidy_run.py" "$@"
