"""End-to-end latency of the command line, first run and second run.

    python benchmarks/cli_latency.py [--runs 2] [--methods auto,dp,milp] [-- MODEL ARGS...]

Runs ``shardplan plan resnet50 --devices 256 --hardware dgx-a100 --json``
(the target: under 3 s on a second run on two cores)
(or the command after ``--``) as a fresh process, with JAX's persistent
compilation cache in a new, empty folder (``SHARDPLAN_CACHE_DIR``): the
first run compiles and fills the cache, the later runs read it. Each
``--method`` is timed the same way, in its own cache folder, and the
Python start-up alone (``import planner.cli``) is printed beside them.
Wall-clock seconds per run; the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["plan", "resnet50", "--devices", "256", "--hardware", "dgx-a100", "--json"]


def timed(cmd: list[str], env: dict[str, str], timeout_s: float = 600.0) -> float | str:
    """Wall seconds of one run, or the one-line reason it failed."""
    start = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"over {timeout_s:.0f} s"
    if r.returncode:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rest = argv[argv.index("--") + 1:] if "--" in argv else DEFAULT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per method, the first with an empty cache")
    ap.add_argument("--methods", default="auto,gradient,milp", help="--method values to time (dp needs a chain model)")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    shardplan = [sys.executable, "-m", "planner"]
    print(f"command: shardplan {' '.join(rest)}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base_env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    startup = timed([sys.executable, "-c", "import planner.cli"], base_env)
    print(f"{'python start-up (import planner.cli)':40s} {startup:8.2f} s")
    print(f"{'method':10s}" + "".join(f"{'run ' + str(i + 1):>10s}" for i in range(args.runs)) + "   (run 1: empty cache)")
    for method in args.methods.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(base_env, SHARDPLAN_CACHE_DIR=cache)
            cmd = [*shardplan, *rest] + ([] if method == "auto" else ["--method", method])
            times = []
            for _ in range(args.runs):
                times.append(timed(cmd, env))
                if isinstance(times[-1], str):
                    break
        print(f"{method:10s}" + "".join(f"{t:9.2f}s" if isinstance(t, float) else f"  fails: {t}" for t in times))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
