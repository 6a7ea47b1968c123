"""Would another memory model agree with XLA? The cost model's per-device
memory and simple alternatives to it, scored against the compiled programs
of the memory-promise grid.

It reads the grid that ``benchmarks/xla_agreement.py --json OUT`` wrote
(every case's plan summary, limit and compiled total), plans each case again
on its mesh (the planner is deterministic: the strategies are checked to be
the grid's), builds that mesh's cost table and sums, per case, in bytes per
device: ``args`` (parameters, optimizer state, batch statistics, inputs:
XLA's argument size, exact), ``G`` (the gradients, one fp32 word per
parameter held; the optimizer's update is as large), ``A`` (the saved
activations), ``W`` (the largest workspace), and, for XLA:CPU's
select-and-scatter expansion of each max pool (docs/validation.md, "The
memory promise"), ``I`` (int32 iotas of the pool input's shape, one per
dimension) and ``X`` (the index matrix, one int32 per output element and
dimension), ``K`` (the conv kernels, one fp32 word per conv parameter
held) and ``Y`` (a convolution's output gradient in the layout its backward
step needs: XLA:CPU's transposed copy of it). The models, each a formula of
those sums:

* ``today``: the cost table's memory (what the search uses; on the ``cpu``
  platform, the grid's, ``phases+expansion`` below);
* ``sum``: the cost table's memory before its two phases and the CPU's max-pool
  expansion, ``args + 2G + A + W``;
* ``phases+expansion``: the backward pass (gradients, saved activations and
  each max pool's index matrix, the largest transient with a pool's iotas or
  a convolution's transposed output gradient ``Y`` at its own step) or the
  optimizer step (gradients and update), ``args + G + max(A + X + max_l (W_l
  + I_l + Y_l), G)``;
* ``phases``: the update not live with the activations, ``args + G + max(A + W, G)``;
* ``liveness``: activations freed and gradients made in reverse layer order,
  ``args + max(max_l (sum_{j>=l} G_j + sum_{j<=l} A_j + W_l), 2G)``;
* ``phases+pools``: ``args + G + max(A + W + I + X, G)``;
* ``forward+pools``: a forward phase with every pool's expansion,
  ``args + max(G + A + W + X, I + X + A, 2G)``;
* ``forward+copies``: the same with the forward phase also holding a copy
  of every conv kernel (``K``, one fp32 word per conv parameter held: the
  parameter-only values XLA:CPU's breadth-first schedule computes at the
  step's start, docs/levers.md), ``args + max(G + A + W + X, K + I + X + A, 2G)``;
* ``fused``: each layer's optimizer update run as soon as its gradient is
  made (the step has no global dependency between them: adam, no clipping),
  so a gradient and its update live only at their layer's backward step,
  ``args + max_l (sum_{j<=l} A_j + W_l + 2 G_l)``;
* ``fused+pools``: the same with each pool's index matrix kept from its forward
  step and its iotas at its own step, ``args + max_l (sum_{j<=l} (A_j + X_j) + W_l + 2 G_l + I_l)``.

* ``xla-cpu-rules``: what XLA:CPU's default schedule holds, rule by rule
  (:func:`costmodels.scheduled_memory_per_device`: kernel copies, reversed
  kernels, every max pool's iotas and zero broadcast, the combined gradient
  all-reduce; docs/validation.md "The memory promise"), with the inputs and
  the step count. Since it became the cost model's memory on the ``cpu``
  platform (plans without levers), ``today`` is the same on a grid written
  at that revision or later.

``--cases MODEL`` also prints every case's error under one model, the
largest first. XLA:CPU's scheduler changes which model is closest (run the
grid with either; docs/benchmarks.md has both).

Printed per model: the cases within 10% of the compiled total, and the
smallest and largest ``compiled / predicted - 1`` (positive: XLA needed more
than predicted).

    PYTHONPATH=. python benchmarks/xla_agreement.py --json grid.json
    PYTHONPATH=. python benchmarks/memory_models.py grid.json

Without a grid it scores ``benchmarks/results/xla_agreement.json`` (the
grid's recorded run) and writes its numbers to ``--json PATH`` (default
``benchmarks/results/memory_models.json``); for another grid it writes
them only where ``--json`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import xla_agreement as grid  # the grid's models, hardware and planning
from _results import RESULTS_DIR, add_json_option, write_results

TOTAL_RTOL = grid.TOTAL_RTOL


def parts(row: dict, graphs: dict) -> dict[str, np.ndarray | float]:
    """The per-layer sums of one grid case (see the module docstring)."""
    import planner
    from costmodels import load_hardware, one_hot, scheduled_memory_per_device
    from costmodels.compute import hardware_arrays
    from costmodels.layers import LayerKind
    from costmodels.strategies import Layout, Strategy, strategy_layouts
    from costmodels.table import CostSettings, cost_table

    name, batch, (d, m) = row["model"], row["batch"], row["mesh"]
    if (name, batch) not in graphs:
        graphs[(name, batch)] = planner.extract(*grid.build(name, batch))
    g = graphs[(name, batch)]
    plan = grid.plan_on(g, (d, m), batch, None if row["limit"] == "none" else row["limit_bytes"])
    if grid.summarise_plan(plan)[2] != row["strategies"]:
        raise SystemExit(f"{name} batch {batch} {d}x{m} {row['limit']}: planned {grid.summarise_plan(plan)[2]}, "
                         f"the grid has {row['strategies']}; rerun xla_agreement.py at this revision")
    settings = CostSettings(optimizer=grid.OPTIMIZER)
    t = cost_table(g.arrays, hardware_arrays(load_hardware(grid.HARDWARE), "float32"), float(batch), float(d),
                   float(m), settings)
    rows = np.arange(g.num_layers)
    c = np.array([Strategy[plan.strategies[n].upper()] for n in g.names])
    a = g.unpadded()
    report = {p["part"]: p for p in row["report"]["memory"]}
    act = np.asarray(t.activation_bytes, np.float64)[rows, c]  # [n] saved activations
    buffers = 4.0 * np.asarray(a.buffers, np.float64)
    per_param = settings.state_bytes_per_param + settings.update_bytes_per_param
    held = (np.asarray(t.state_bytes, np.float64)[rows, c] - buffers) / per_param  # parameters held (filter splits
    # the buffers too; they are small beside the weights)
    max_pool = (np.asarray(a.kind) == LayerKind.POOL) & (np.asarray(a.saved_elements) > 0)  # avg pools save nothing
    dims = np.asarray(a.spatial_rank) + 2.0  # batch, spatial dims, channels
    in_el = np.asarray(a.in_channels) * np.prod(np.asarray(a.in_spatial), axis=-1)
    out_el = np.asarray(a.out_channels) * np.prod(np.asarray(a.out_spatial), axis=-1)
    pool_in = np.where(max_pool, act, 0.0)  # a max pool saves its input: its bytes per device
    gout = np.asarray(strategy_layouts(np.asarray(a.kind)))[rows, c, 3]  # the output gradient's layout
    by_model = np.where((gout == Layout.REPLICATED) | (gout == Layout.PARTIAL), 1.0, m)
    conv = np.array([k.startswith("conv") for k in g.kind_names])
    cpu = cost_table(g.arrays, hardware_arrays(load_hardware(grid.HARDWARE), "float32"), float(batch), float(d),
                     float(m), CostSettings(optimizer=grid.OPTIMIZER, platform="cpu"))
    padded = np.pad(c, (0, cpu.feasible.shape[0] - c.size))
    peak = scheduled_memory_per_device(cpu, one_hot(padded, cpu.feasible.shape[1]))
    return {
        # XLA:CPU's schedule (costmodels/xla_cpu.py), with what validate adds to a plan's memory
        # (the inputs and the optimizer's step count: the grid row's predicted total less the plan's)
        "scheduled": float(peak) + row["predicted_total_bytes"] - row["plan_memory_bytes"],
        "args": float(report["arguments"]["compiled_bytes"]),
        "G": settings.gradient_bytes_per_param * np.maximum(held, 0.0),
        "A": act,
        "W": np.asarray(t.workspace_bytes, np.float64)[rows, c],
        "I": pool_in * dims,
        "X": pool_in * dims * np.where(in_el > 0, out_el / np.maximum(in_el, 1.0), 0.0),
        "K": settings.gradient_bytes_per_param * np.maximum(held, 0.0)
        * np.array([k.startswith("conv") for k in g.kind_names]),
        "Y": np.where(conv, settings.gradient_bytes_per_param * out_el * batch / d / by_model, 0.0),
        "today": float(row["predicted_total_bytes"]),
    }


def _liveness(A: np.ndarray, W: np.ndarray, G: np.ndarray) -> float:
    grads_after = np.cumsum(G[::-1])[::-1]  # gradients made by layer l's backward step and after it
    return float(np.max(grads_after + np.cumsum(A) + W)) if A.size else 0.0


def _fused(A, W, G, I=None, X=None):
    """``fused`` and ``fused+pools`` of the module docstring (I, X: zero if not given)."""
    I = np.zeros_like(A) if I is None else I
    X = np.zeros_like(A) if X is None else X
    return float(np.max(np.cumsum(A + X) + W + 2 * G + I)) if A.size else 0.0


MODELS = {
    "today": lambda p: p["today"],
    "sum": lambda p: p["args"] + 2 * p["G"].sum() + p["A"].sum() + p["W"].max(),
    "phases+expansion": lambda p: p["args"] + p["G"].sum() + max(
        p["A"].sum() + p["X"].sum() + (p["W"] + p["I"] + p["Y"]).max(), p["G"].sum()),
    "phases": lambda p: p["args"] + p["G"].sum() + max(p["A"].sum() + p["W"].max(), p["G"].sum()),
    "liveness": lambda p: p["args"] + max(_liveness(p["A"], p["W"], p["G"]), 2 * p["G"].sum()),
    "phases+pools": lambda p: p["args"] + p["G"].sum() + max(p["A"].sum() + p["W"].max() + p["I"].sum()
                                                             + p["X"].sum(), p["G"].sum()),
    "fused": lambda p: p["args"] + _fused(p["A"], p["W"], p["G"]),
    "fused+pools": lambda p: p["args"] + _fused(p["A"], p["W"], p["G"], p["I"], p["X"]),
    "forward+pools": lambda p: p["args"] + max(p["G"].sum() + p["A"].sum() + p["W"].max() + p["X"].sum(),
                                               p["I"].sum() + p["X"].sum() + p["A"].sum(), 2 * p["G"].sum()),
    "forward+copies": lambda p: p["args"] + max(p["G"].sum() + p["A"].sum() + p["W"].max() + p["X"].sum(),
                                                p["K"].sum() + p["I"].sum() + p["X"].sum() + p["A"].sum(),
                                                2 * p["G"].sum()),
    "xla-cpu-rules": lambda p: p["scheduled"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", nargs="?", default=str(RESULTS_DIR / "xla_agreement.json"),
                    help="the JSON benchmarks/xla_agreement.py --json wrote (default: its results file)")
    ap.add_argument("--cases", metavar="MODEL", choices=sorted(MODELS),
                    help="also print every case's error under MODEL, the largest first")
    add_json_option(ap, __file__, note="; for another grid none unless given")
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    recorded = os.path.abspath(args.grid) == str(RESULTS_DIR / "xla_agreement.json")
    if not recorded and not any(a == "--json" or a.startswith("--json=") for a in given):
        args.json = None
    with open(args.grid) as f:
        scored = json.load(f)
    rows = scored["rows"]
    graphs: dict = {}
    errors = {k: [] for k in MODELS}
    for row in rows:
        p = parts(row, graphs)
        for k, model in MODELS.items():
            errors[k].append(row["compiled_total_bytes"] / model(p) - 1.0)
    print(f"{len(rows)} cases from {args.grid}; error = compiled / predicted - 1")
    print(f"{'model':17} {'within 10%':>10} {'smallest':>9} {'largest':>9}")
    table = []
    for k, e in errors.items():
        e = np.asarray(e)
        print(f"{k:17} {int(np.sum(np.abs(e) <= TOTAL_RTOL)):>6} / {e.size:<3} {e.min():>+8.1%} {e.max():>+8.1%}")
        table.append({"model": k, "within_10_percent": int(np.sum(np.abs(e) <= TOTAL_RTOL)), "cases": int(e.size),
                      "smallest_error": float(e.min()), "largest_error": float(e.max())})
    if args.cases:
        print(f"per case under {args.cases}:")
        for i in np.argsort(-np.abs(np.asarray(errors[args.cases]))):
            r = rows[i]
            print(f"  {r['model']:25} {r['batch']:>4} {r['mesh'][0]}x{r['mesh'][1]} {r['limit']:6} "
                  f"{r['strategies']:18} {errors[args.cases][i]:>+7.1%}")
    summary = {"grid": os.path.relpath(args.grid, grid_root()), "cases": len(rows),
               "cpu_scheduler": scored.get("cpu_scheduler"),
               "closest": max(table, key=lambda r: r["within_10_percent"])["model"]}
    write_results(args.json, __file__, "recorded grid" if recorded else "given grid", summary, table, argv,
                  errors={k: [float(x) for x in e] for k, e in errors.items()})
    return 0


def grid_root() -> str:
    """The repository root (where ``grid``'s path is shown from)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    raise SystemExit(main())
