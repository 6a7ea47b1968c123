"""The constants of a hardware preset that Megatron-LM's published runs
choose, chosen by leave-one-out and reported in-sample and left-out side by
side.

    python benchmarks/megatron_fit.py [--measurements DIR] [--hardware dgx-a100] [--json OUT] [--memory]

The constant is the attained fraction of peak of 16-bit tensor-core GEMMs
(``efficiency.matmul`` and ``efficiency.conv`` for ``float16`` and
``bfloat16``; with ``--memory`` also ``efficiency.memory``, the attained
fraction of HBM bandwidth), on a grid. For each value every row is predicted
as ``benchmarks/megatron.py`` predicts it under the published execution
(:func:`megatron.published_plan`); the in-sample value minimises the mean
absolute error over all rows, and each row's left-out error is its error at
the value that minimises the mean over the *other* rows. No constant is per
row. Default ``--json`` (through ``benchmarks/_results.py``):
``benchmarks/results/megatron_fit.json``, with ``--memory``
``benchmarks/results/megatron_fit_memory.json``; ``rows``: per row its
in-sample and left-out error and the value chosen without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron  # noqa: E402  (the benchmark's own reading and prediction)
from _results import RESULTS_DIR, add_json_option, write_results  # noqa: E402

MEMORY_JSON = RESULTS_DIR / "megatron_fit_memory.json"
MATMUL_GRID = tuple(round(x, 2) for x in np.arange(0.50, 0.951, 0.01))
MEMORY_GRID = tuple(round(x, 2) for x in np.arange(0.60, 1.001, 0.05))


def with_efficiency(hardware, matmul: float, memory: float | None):
    """``hardware`` with its 16-bit GEMM efficiency (and memory efficiency) replaced."""
    eff = dict(hardware.device.efficiency)
    for op in ("matmul", "conv"):
        per = dict(eff[op]) if isinstance(eff[op], dict) else {"float32": eff[op]}
        eff[op] = {**per, "float16": matmul, "bfloat16": matmul}
    if memory is not None:
        eff["memory"] = memory
    return dataclasses.replace(hardware, device=dataclasses.replace(hardware.device, efficiency=eff))


def error_grid(rows: list[dict], hardware, grid: list[tuple[float, float | None]], memory_limit: float,
               peak: float) -> np.ndarray:
    """Signed headline error ``[len(grid), len(rows)]``."""
    out = np.zeros((len(grid), len(rows)))
    for g, (matmul, memory) in enumerate(grid):
        hw = with_efficiency(hardware, matmul, memory)
        for r, row in enumerate(rows):
            plan = megatron.published_plan(row, hw, memory_limit)
            pred = megatron.predicted_values(row, plan, peak)
            err = megatron.errors(row["measured"], pred)
            out[g, r] = err[next(k for k in megatron.TIME_KEYS if k in err)]
    return out


def leave_one_out(err: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """The in-sample grid index, and per row its left-out grid index and error."""
    mean_abs = np.abs(err).mean(axis=1)
    best = int(np.argmin(mean_abs))
    n = err.shape[1]
    held = np.array([int(np.argmin((np.abs(err).sum(axis=1) - np.abs(err[:, r])) / (n - 1))) for r in range(n)])
    return best, held, err[held, np.arange(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=megatron.DEFAULT_MEASUREMENTS)
    ap.add_argument("--hardware", default="dgx-a100")
    add_json_option(ap, __file__, note=f"; with --memory {MEMORY_JSON.relative_to(megatron.ROOT)}")
    ap.add_argument("--memory", action="store_true", help="also choose efficiency.memory")
    ap.add_argument("--memory-limit", type=float, default=80e9)
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    if args.memory and not any(a == "--json" or a.startswith("--json=") for a in given):
        args.json = MEMORY_JSON
    from costmodels import load_hardware

    hardware = load_hardware(args.hardware)
    rows = [row for _, data in megatron.read_files(args.measurements) for row in data.get("rows", [])]
    peak = hardware.device.peak_flops_per_s["float16"]
    grid = list(itertools.product(MATMUL_GRID, MEMORY_GRID if args.memory else (None,)))
    err = error_grid(rows, hardware, grid, args.memory_limit, peak)
    best, held, left_out = leave_one_out(err)
    def name(g: int) -> str:
        return f"matmul {grid[g][0]:.2f}" + (f" memory {grid[g][1]:.2f}" if grid[g][1] is not None else "")

    print(f"In-sample: {name(best)} (mean |error| {100 * np.abs(err[best]).mean():.1f}%, "
          f"largest {100 * np.abs(err[best]).max():.1f}%); left-out mean |error| {100 * np.abs(left_out).mean():.1f}%, "
          f"largest {100 * np.abs(left_out).max():.1f}%")
    print(f"{'id':<14} {'in-sample':>10} {'left-out':>10}  value chosen without the row")
    for r, row in enumerate(rows):
        print(f"{row['id']:<14} {100 * err[best, r]:>+9.1f}% {100 * left_out[r]:>+9.1f}%  {name(held[r])}")
    numbers = {"hardware": hardware.name, "memory_limit_bytes": args.memory_limit, "value": grid[best],
               "in_sample_mean_abs_error": float(np.abs(err[best]).mean()),
               "in_sample_largest_abs_error": float(np.abs(err[best]).max()),
               "left_out_mean_abs_error": float(np.abs(left_out).mean()),
               "left_out_largest_abs_error": float(np.abs(left_out).max())}
    table = [{"id": row["id"], "in_sample_error": err[best, r], "left_out_error": left_out[r],
              "left_out_value": grid[held[r]]} for r, row in enumerate(rows)]
    mode = "matmul and memory" if args.memory else "matmul"
    write_results(args.json, __file__, mode, numbers, table, argv, grid=grid,
                  in_sample={"value": grid[best], "errors": err[best].tolist()},
                  left_out={"values": [grid[h] for h in held], "errors": left_out.tolist()},
                  ids=[row["id"] for row in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
