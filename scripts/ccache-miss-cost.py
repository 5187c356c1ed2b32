#!/usr/bin/env python3
"""What a compiler-cache miss costs per compile (docs/BENCHMARKS.md, "CI").

    scripts/ccache-miss-cost.py CLONE [STEP] [BUILD_DIR...]

For every STEP-th compile command (default 6) of each build folder under CLONE (default:
build build-asan build-tsan build-fuzz, each already built, e.g. by .ci/run), compiles the
source twice, once with the compiler alone and once through ccache with the settings
CMakeLists.txt gives it and an empty cache of its own (so every call is a miss), with the
-MD flags ninja adds. Which of the two goes first alternates. Prints, per folder and in all,
the summed wall times and their ratio. Sources whose object the folder did not build (a
configuration that builds only some targets) are left out.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    step = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    folders = sys.argv[3:] or ["build", "build-asan", "build-tsan", "build-fuzz"]
    work = tempfile.mkdtemp(prefix="ccache-miss-cost-")
    env = dict(os.environ, CCACHE_DIR=os.path.join(work, "cache"), CCACHE_BASEDIR=root,
               CCACHE_NOHASHDIR="true", CCACHE_DEPEND="true", CCACHE_MAXSIZE="5G")
    obj = os.path.join(work, "x.o")
    total_plain = total_cached = 0.0
    for folder in folders:
        build = os.path.join(root, folder)
        with open(os.path.join(build, "compile_commands.json")) as f:
            entries = json.load(f)
        def output(e):
            args = shlex.split(e["command"])
            return os.path.join(e["directory"], args[args.index("-o") + 1])

        built = [e for e in entries if os.path.exists(output(e))]
        plain = cached = 0.0
        sample = built[::step]
        for i, e in enumerate(sample):
            args = shlex.split(e["command"])
            args[args.index("-o") + 1] = obj
            args += ["-MD", "-MT", obj, "-MF", obj + ".d"]

            def timed(cmd, run_env=None):
                t0 = time.monotonic()
                subprocess.run(cmd, cwd=e["directory"], env=run_env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                return time.monotonic() - t0

            if i % 2 == 0:
                p = timed(args)
                c = timed(["ccache"] + args, env)
            else:
                c = timed(["ccache"] + args, env)
                p = timed(args)
            plain += p
            cached += c
            print(f"  {folder} {i + 1}/{len(sample)} {os.path.relpath(e['file'], root)}: "
                  f"{p:.2f} s alone, {c:.2f} s through ccache", file=sys.stderr, flush=True)
        print(f"{folder:11s} {len(sample):3d} compiles  alone {plain:7.1f} s  "
              f"ccache miss {cached:7.1f} s  ratio {cached / plain:.3f}", flush=True)
        total_plain += plain
        total_cached += cached
    print(f"{'all':11s}      alone {total_plain:7.1f} s  ccache miss {total_cached:7.1f} s  "
          f"ratio {total_cached / total_plain:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
