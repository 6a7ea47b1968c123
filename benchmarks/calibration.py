"""Per-layer time prediction error of the default roofline against a
calibration, side by side, for one model on the local JAX device.

    python benchmarks/calibration.py [--model vgg16-cifar10] [--batch 16] [--max-devices 4]
        [--hardware cpu-local] [--repeats 5] [--dtype float32]

Two independent profiling runs (``planner.profile_layers``) time every
layer's forward + backward at every shard shape of the strategy menu on
meshes of up to ``--max-devices`` devices. The first run becomes the
calibration; the second is the measurement both predictions are judged
against, so the calibration's error includes run-to-run noise. Each shard
(layer, strategy, mesh) is predicted by ``cost_table(...).compute_s`` with
the roofline of ``--hardware`` and with the calibration. A third column
calibrates with the shard shapes of meshes of up to ``--max-devices / 2``
devices only and predicts the rest from them (the "unseen" rows: shards the
calibration never saw).

Relative error = |predicted - measured| / measured, per shard; the script
prints the median and the worst over all shards, and per layer kind, and
writes them to ``--json PATH`` (default ``benchmarks/results/calibration.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from costmodels import (
    CostSettings,
    calibration_arrays,
    cost_table,
    hardware_arrays,
    load_hardware,
)
from costmodels.calibration import Calibration
from costmodels.strategies import STRATEGY_NAMES
from planner.calibrate.profile import profile_layers
from planner.cli import load_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402


def predictions(graph, hw, dtype, batch, timings, calibration):
    """Predicted compute seconds of each timing's (layer, strategy, mesh)."""
    settings = CostSettings(dtype=dtype)
    hwa = hardware_arrays(hw, dtype)
    cal = calibration_arrays(calibration, graph) if calibration is not None else None
    index = {n: i for i, n in enumerate(graph.names)}
    tables = {}
    out = []
    for t in timings:
        if t.mesh not in tables:
            d, m = t.mesh
            tables[t.mesh] = np.asarray(cost_table(graph.arrays, hwa, float(batch), float(d), float(m), settings,
                                                   cal).compute_s)
        out.append(float(tables[t.mesh][index[t.layer], STRATEGY_NAMES.index(t.strategy)]))
    return np.asarray(out)


def restricted(profile, max_devices: int) -> Calibration:
    """The calibration from the shards of meshes of at most ``max_devices`` only
    (per strategy and per layer, as ``Profile.calibration`` builds it)."""
    kept = tuple(t for t in profile.timings if t.mesh[0] * t.mesh[1] <= max_devices)
    return dataclasses.replace(profile, timings=kept).calibration()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vgg16-cifar10")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-devices", type=int, default=4)
    ap.add_argument("--hardware", default="cpu-local")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)

    graph = load_model(args.model)
    hw = load_hardware(args.hardware)
    kw = {"max_devices": args.max_devices, "dtype": args.dtype, "repeats": args.repeats, "warmup": 2}
    start = time.perf_counter()
    first = profile_layers(graph, args.batch, **kw)
    mid = time.perf_counter()
    second = profile_layers(graph, args.batch, **kw)
    end = time.perf_counter()
    timings = second.timings
    measured = np.asarray([t.seconds for t in timings])
    cal = first.calibration()
    columns = {
        f"roofline ({hw.name})": predictions(graph, hw, args.dtype, args.batch, timings, None),
        "calibrated": predictions(graph, hw, args.dtype, args.batch, timings, cal),
    }
    if args.max_devices >= 2:
        half = restricted(first, args.max_devices // 2)
        seen = {(q.op, q.layer, q.strategy, q.shard) for q in half.points}  # the shards it was calibrated on
        unseen = [i for i, t in enumerate(timings) if (t.op, t.layer_dims, t.strategy, t.shard) not in seen]
        columns[f"calibrated at P <= {args.max_devices // 2} (unseen work)"] = predictions(
            graph, hw, args.dtype, args.batch, timings, half)
    else:
        unseen = []
    err = {k: np.abs(v - measured) / measured for k, v in columns.items()}

    kinds = dict(zip(graph.names, graph.kind_names, strict=True))
    print(f"{graph.model_name}, batch {args.batch}, {args.dtype}, meshes of up to {args.max_devices} devices, "
          f"on {jax.devices()[0].device_kind} ({jax.default_backend()}); {len(timings)} shards of "
          f"{len({t.layer for t in timings})} layers, {len({(t.layer, t.shape) for t in timings})} distinct shapes; "
          f"profiling took {mid - start:.1f} s (with compilation) and {end - mid:.1f} s (second run)")
    head = f"{'relative error of per-layer time':<38}" + "".join(f"{k:>36}" for k in columns)
    print(head)
    print(f"{'median over all shards':<38}" + "".join(f"{np.median(e):>36.1%}" for e in err.values()))
    print(f"{'worst over all shards':<38}" + "".join(f"{np.max(e):>36.1%}" for e in err.values()))
    if unseen:
        print(f"{f'median over {len(unseen)} unseen-work shards':<38}"
              + "".join(f"{np.median(e[unseen]):>36.1%}" for e in err.values()))
    table = [("median over all shards", np.arange(len(timings)), np.median),
             ("worst over all shards", np.arange(len(timings)), np.max)]
    if unseen:
        table.append((f"median over {len(unseen)} unseen-work shards", np.asarray(unseen), np.median))
    for kind in sorted({kinds[t.layer] for t in timings}):
        rows = [i for i, t in enumerate(timings) if kinds[t.layer] == kind]
        table.append((f"median, {kind} ({len(rows)} shards)", np.asarray(rows), np.median))
        print(f"{f'median, {kind} ({len(rows)} shards)':<38}" + "".join(f"{np.median(e[rows]):>36.1%}"
                                                                         for e in err.values()))
    for strategy in STRATEGY_NAMES:
        rows = [i for i, t in enumerate(timings) if t.strategy == strategy]
        if rows:
            table.append((f"median, {strategy} ({len(rows)} shards)", np.asarray(rows), np.median))
            print(f"{f'median, {strategy} ({len(rows)} shards)':<38}"
                  + "".join(f"{np.median(e[rows]):>36.1%}" for e in err.values()))
    again = {(t.layer, t.strategy, t.mesh): t.seconds for t in first.timings}
    noise = np.abs(measured - np.asarray([again[t.layer, t.strategy, t.mesh] for t in timings])) / measured
    print(f"run-to-run difference of the measurements themselves: median {np.median(noise):.1%}, "
          f"worst {np.max(noise):.1%} (the floor under the calibrated columns)")
    r = {k: float(np.median(e)) for k, e in err.items()}
    base, calib = list(r.values())[:2]
    print(f"median error ratio roofline / calibrated: {base / calib:.1f}x")
    summary = {"model": graph.model_name, "batch": args.batch, "dtype": args.dtype, "max_devices": args.max_devices,
               "hardware": hw.name, "device": jax.devices()[0].device_kind, "shards": len(timings),
               "columns": list(columns), "median_error": r, "noise_median": float(np.median(noise)),
               "noise_worst": float(np.max(noise)), "roofline_over_calibrated": base / calib,
               "profiling_s": [mid - start, end - mid]}
    rows = [{"rows": label, **{k: float(how(e[idx])) for k, e in err.items()}} for label, idx, how in table]
    defaults = ("vgg16-cifar10", 16, 4, "cpu-local", 5, "float32")
    mode = "default" if (args.model, args.batch, args.max_devices, args.hardware, args.repeats,
                         args.dtype) == defaults else "custom"
    write_results(args.json, __file__, mode, summary, rows, argv)


if __name__ == "__main__":
    main()
