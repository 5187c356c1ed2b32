#!/usr/bin/env python3
"""The curated clang-tidy run over the project's sources, with a result cache.

Usage: clang_tidy_run.py BUILD [DIR_OR_FILE...]   (default: all of src/)

Each translation unit is checked with the compile command the build recorded
(BUILD/compile_commands.json), TIDY_JOBS at a time (default: one per core). A unit that
came out clean is remembered in TIDY_CACHE (default ~/.cache/kvroute-tidy) under a key of
everything its verdict depends on: the clang-tidy version, .clang-tidy, the compile flags
and the unit's preprocessed text (every header it includes) with the checkout's path taken
out, so a fresh clone elsewhere reuses the verdicts of an earlier one, and a change to a
header re-checks exactly the units that include it. Units with findings are never cached.

Prints a progress line per unit (cached or checked, with its time), every finding and a
summary; exits 1 when any unit has a finding or clang-tidy failed on it.
"""

import concurrent.futures
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time


def find_tidy():
    for name in ("clang-tidy-14", "clang-tidy"):
        path = shutil.which(name)
        if path:
            return path
    return None


def preprocess(entry, root):
    """The unit's preprocessed text without line markers, the checkout's path removed."""
    args = shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c":
            continue
        out.append(a)
    out += ["-E", "-P"]
    res = subprocess.run(out, cwd=entry["directory"], capture_output=True)
    if res.returncode != 0:
        return None
    return res.stdout.replace(root.encode(), b"")


def flags_without_paths(entry, root):
    """The compile flags in the cache key: paths and -Werror (CI's builds set it; see
    EXTRA_ARGS) left out, so a CI clone and a developer's build share verdicts."""
    args = shlex.split(entry["command"])
    return " ".join(a.replace(root, "") for a in args
                    if not a.endswith(".o") and a != "-Werror")


# The compile commands are GCC's: clang does not know some of its warning flags, and under
# -Werror (KVROUTE_WERROR, CI) that unknown flag would be an error in every unit. The
# compiler's own warnings are the GCC build's business; clang-tidy reports its checks.
EXTRA_ARGS = ["--extra-arg=-Wno-unknown-warning-option", "--extra-arg=-Wno-error"]


def main():
    if len(sys.argv) < 2:
        print("usage: clang_tidy_run.py BUILD [DIR_OR_FILE...]", file=sys.stderr)
        return 2
    build = pathlib.Path(sys.argv[1]).resolve()
    root = pathlib.Path(__file__).resolve().parent.parent
    tidy = find_tidy()
    if tidy is None:
        print("clang-tidy: not installed (scripts/install-deps.sh installs Debian's clang-tidy-14)",
              file=sys.stderr)
        return 1
    db_path = build / "compile_commands.json"
    if not db_path.exists():
        print(f"clang-tidy: {db_path} is missing (configure the build first)", file=sys.stderr)
        return 1
    db = {str(pathlib.Path(e["file"]).resolve()): e for e in json.loads(db_path.read_text())}

    targets = [pathlib.Path(p).resolve() for p in sys.argv[2:]] or [root / "src"]
    files = []
    for t in targets:
        if t.is_dir():
            files += sorted(str(f) for f in t.rglob("*.cc"))
        else:
            files.append(str(t))
    missing = [f for f in files if f not in db]
    files = [f for f in files if f in db]

    version = subprocess.run([tidy, "--version"], capture_output=True, text=True).stdout
    config = (root / ".clang-tidy").read_text()
    cache = pathlib.Path(os.environ.get("TIDY_CACHE") or
                         pathlib.Path(os.environ.get("XDG_CACHE_HOME") or
                                      pathlib.Path.home() / ".cache") / "kvroute-tidy")
    cache.mkdir(parents=True, exist_ok=True)
    jobs = int(os.environ.get("TIDY_JOBS") or os.cpu_count() or 1)
    rootstr = str(root)

    def check(path):
        start = time.monotonic()
        entry = db[path]
        text = preprocess(entry, rootstr)
        key = None
        if text is not None:
            h = hashlib.sha256()
            for part in (version, config, flags_without_paths(entry, rootstr)):
                h.update(part.encode())
                h.update(b"\0")
            h.update(text)
            key = h.hexdigest()
            if (cache / key).exists():
                return path, True, "", "cached", time.monotonic() - start
        res = subprocess.run([tidy, "-p", str(build), "--quiet", *EXTRA_ARGS, path],
                             capture_output=True,
                             text=True)
        log = res.stdout + res.stderr
        ok = res.returncode == 0 and "warning:" not in log and "error:" not in log
        if ok and key is not None:
            (cache / key).write_text(path.replace(rootstr + "/", "") + "\n")
        return path, ok, log, "checked", time.monotonic() - start

    t0 = time.monotonic()
    print(f"clang-tidy: {len(files)} files, {jobs} at a time, cache {cache}", flush=True)
    for f in missing:
        print(f"clang-tidy: {os.path.relpath(f, rootstr)} is not in {db_path} (not built here): skipped")
    results = []
    cached = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(check, f) for f in files]
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            path, ok, log, how, secs = fut.result()
            cached += how == "cached"
            findings = sum(1 for line in log.splitlines() if "warning:" in line or "error:" in line)
            print(f"[{i}/{len(files)}] {os.path.relpath(path, rootstr)}: {how}, "
                  f"{findings} findings, {secs:.1f} s", flush=True)
            results.append((path, ok, log))
    bad = [r for r in results if not r[1]]
    for path, _, log in sorted(bad):
        lines = log.splitlines()
        shown = [l for l in lines if "warning:" in l or "error:" in l]
        print("\n".join(shown) if shown else log)
    print(f"clang-tidy: {len(bad)} of {len(files)} files with findings, {cached} verdicts from "
          f"the cache ({time.monotonic() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
