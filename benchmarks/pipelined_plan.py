"""How long ``shardplan plan`` takes to return a pipelined plan of a large decoder.

    python benchmarks/pipelined_plan.py [--json OUT] [--model gpt3-175b] [--devices 1024] [--batch 1536]
                                        [--hardware dgx-a100] [--dtype float32]

Runs the command line in a fresh process (imports, cost tables, the one-stage
search that finds nothing fits, the pipelined search) with the cost-table
cache off, as a first run sees it, and records (through
``benchmarks/_results.py``, default ``benchmarks/results/pipelined_plan.json``)
the wall time in ``summary`` and, in its one row, the command planned, the
plan's mesh, schedule, predicted step and peak memory per device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the machine recorded is the one the planner ran on

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import add_json_option, write_results  # noqa: E402

TARGET_S = 60.0  # the command's wall time, at most
DEFAULTS = ("gpt3-175b", 1024, 1536, "dgx-a100", "float32")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_json_option(ap, __file__)
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1536)
    ap.add_argument("--hardware", default="dgx-a100")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    command = [sys.executable, "-m", "planner", "plan", args.model, "--devices", str(args.devices), "--batch",
               str(args.batch), "--hardware", args.hardware, "--dtype", args.dtype, "--json"]
    env = {**os.environ, "SHARDPLAN_CACHE_DIR": "off", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"shardplan plan exited {done.returncode}: {done.stderr.strip()}")
    plan = json.loads(done.stdout)
    p = plan["pipeline"]
    planned = " ".join(["shardplan", *command[3:]])
    row = {"planned": planned, "mesh": plan["mesh"], "axis_names": plan["axis_names"],
           "pipeline": None if p is None else {k: v for k, v in p.items() if k != "stage_blocks"},
           "iteration_s": plan["iteration_s"], "memory_bytes_per_device": plan["memory_bytes_per_device"],
           "memory_limit_bytes": plan["memory_limit_bytes"]}
    print(f"{planned}: {wall_s:.1f} s wall ({plan['seconds']:.1f} s planning) on {os.cpu_count()} CPUs; "
          f"mesh {'x'.join(map(str, plan['mesh']))} ({', '.join(plan['axis_names'])}), "
          f"step {plan['iteration_s']:.3f} s, {plan['memory_bytes_per_device'] / 1e9:.1f} GB per device")
    mode = "default" if (args.model, args.devices, args.batch, args.hardware, args.dtype) == DEFAULTS else "custom"
    write_results(args.json, __file__, mode, {"wall_s": wall_s, "search_s": plan["seconds"], "target_s": TARGET_S},
                  [row], argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
