"""What a user waits for at the command line, this tree beside another
revision in one run.

    python benchmarks/cli_latency.py [--baseline REV] [--runs 2] [--cases help,import,resnet50,resnet152]

Each case runs as a fresh process (``python -m planner ...``) with JAX's
persistent compilation cache in a new, empty folder per case and revision
(``SHARDPLAN_CACHE_DIR``): run 1 compiles and fills it, later runs read it,
as a user's second command does. ``--baseline REV`` checks REV out into a
temporary git worktree and runs the same cases there with the same Python
(``PYTHONPATH`` pointing at it), so both columns share the machine and its
load. The cases and their targets:

* ``help``: ``shardplan --help`` (target under 0.5 s);
* ``import``: ``python -c "import planner"`` (under 0.5 s);
* ``resnet50``: ``shardplan plan resnet50 --devices 256 --hardware dgx-a100
  --json``, its second run (under 2 s);
* ``resnet152``: ``shardplan plan resnet152 --devices 64 --hardware
  abci-v100 --batch-per-device 32 --memory-limit 6GB --json`` with the
  command line's default levers (``auto``: none, then all where nothing fits; the
  baseline's default, ``all``), its second run (under 60 s).

For the plan cases it prints the plan's predicted time per iteration
beside the wall time: a faster answer must not be a worse plan unnoticed.
Wall-clock seconds; the machine's load average before and after. Writes
the numbers to ``--json PATH`` (default ``benchmarks/results/cli_latency.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name -> (arguments after `python`, target seconds of the run compared, which run)
    "help": (["-m", "planner", "--help"], 0.5, 1),
    "import": (["-c", "import planner"], 0.5, 1),
    "resnet50": (["-m", "planner", "plan", "resnet50", "--devices", "256", "--hardware", "dgx-a100", "--json"], 2.0, 2),
    "resnet152": (["-m", "planner", "plan", "resnet152", "--devices", "64", "--hardware", "abci-v100",
                   "--batch-per-device", "32", "--memory-limit", "6GB", "--json"], 60.0, 2),
}


def timed(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[float | str, float | None]:
    """(wall seconds of one run or the one-line reason it failed, the plan's iteration_s where it printed one)."""
    start = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(),
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"over {timeout_s:.0f} s", None
    seconds = time.perf_counter() - start
    if r.returncode:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:80], None
    try:
        return seconds, float(json.loads(r.stdout)["iteration_s"])
    except (ValueError, KeyError, TypeError):
        return seconds, None


def run_cases(root: Path, cases: list[str], runs: int, timeout_s: float) -> dict[str, dict]:
    """Each case's run times and plan time, with the packages of ``root``."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["PYTHONPATH"] = str(root)
    out = {}
    for name in cases:
        args, _, _ = CASES[name]
        with tempfile.TemporaryDirectory() as cache:
            times, plan_s = [], None
            for _ in range(runs if args[0] == "-m" and args[2:3] == ["plan"] else 1):
                t, plan_s = timed([sys.executable, *args], dict(env, SHARDPLAN_CACHE_DIR=cache), timeout_s)
                times.append(t)
                if isinstance(t, str):
                    break
        out[name] = {"seconds": times, "iteration_s": plan_s}
    return out


def _cell(result: dict, which: int) -> str:
    times = result["seconds"]
    t = times[min(which, len(times)) - 1]
    return f"{t:8.2f} s" if isinstance(t, float) else f"{t[:24]:>24s}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", metavar="REV", help="a git revision to time beside this tree")
    ap.add_argument("--runs", type=int, default=2, help="runs of each plan case, the first with an empty cache")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--timeout", type=float, default=900.0, metavar="S", help="per run (default 900)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    load = os.getloadavg()
    columns = {"this tree": run_cases(ROOT, cases, args.runs, args.timeout)}
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), args.baseline], cwd=ROOT,
                           check=True)
            try:
                columns[args.baseline] = run_cases(tree, cases, args.runs, args.timeout)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"load average before {' '.join(f'{x:.2f}' for x in load)}, "
          f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'case':10s} {'run':>4s} {'target':>8s}" + "".join(f"{c[:24]:>26s}" for c in columns)
          + "".join(f"{'ms/it ' + c[:12]:>20s}" for c in columns))
    for name in cases:
        _, target, which = CASES[name]
        row = f"{name:10s} {which:4d} {target:7.1f}s" + "".join(f"{_cell(col[name], which):>26s}"
                                                                 for col in columns.values())
        row += "".join(f"{col[name]['iteration_s'] * 1e3:20.3f}" if col[name]["iteration_s"] else f"{'':20s}"
                       for col in columns.values())
        print(row)
    after = os.getloadavg()
    rows = []
    for name in cases:
        _, target, which = CASES[name]
        row = {"case": name, "run": which, "target_s": target}
        for label, col in columns.items():
            t = col[name]["seconds"][min(which, len(col[name]["seconds"])) - 1]
            key = "this_tree" if label == "this tree" else "baseline"
            row[f"{key}_s"] = t if isinstance(t, float) else None
            row[f"{key}_failed"] = None if isinstance(t, float) else t
            row[f"{key}_iteration_s"] = col[name]["iteration_s"]
        row["met"] = row["this_tree_s"] is not None and row["this_tree_s"] <= target
        rows.append(row)
    summary = {"cases": len(rows), "met": sum(r["met"] for r in rows), "baseline": args.baseline,
               "load_average_before": list(load), "load_average_after": list(after)}
    mode = "default" if cases == list(CASES) and args.runs == 2 else "selected cases"
    write_results(args.json, __file__, mode, summary, rows, argv, columns=columns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
