"""How long ``shardplan plan`` takes to return a pipelined plan of a large decoder.

    python benchmarks/pipelined_plan.py [--json OUT] [--model gpt3-175b] [--devices 1024] [--batch 1536]
                                        [--hardware dgx-a100] [--dtype float32]

Runs the command line in a fresh process (imports, cost tables, the one-stage
search that finds nothing fits, the pipelined search) with the cost-table
cache off, as a first run sees it, and records the wall time, the plan's
mesh, schedule, predicted step and peak memory per device in
``benchmarks/results/pipelined_plan.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks/results/pipelined_plan.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
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
    record = {"command": " ".join(["shardplan", *command[3:]]), "wall_s": wall_s, "search_s": plan["seconds"],
              "cpus": os.cpu_count(), "mesh": plan["mesh"], "axis_names": plan["axis_names"],
              "pipeline": None if p is None else {k: v for k, v in p.items() if k != "stage_blocks"},
              "iteration_s": plan["iteration_s"], "memory_bytes_per_device": plan["memory_bytes_per_device"],
              "memory_limit_bytes": plan["memory_limit_bytes"]}
    print(f"{record['command']}: {wall_s:.1f} s wall ({plan['seconds']:.1f} s planning) on {os.cpu_count()} CPUs; "
          f"mesh {'x'.join(map(str, plan['mesh']))} ({', '.join(plan['axis_names'])}), "
          f"step {plan['iteration_s']:.3f} s, {plan['memory_bytes_per_device'] / 1e9:.1f} GB per device")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
