"""How well the compute model predicts real hardware: the measurements in
``shared/reference/measurements`` (read its README), side by side in one run.

    python benchmarks/fidelity.py [--measurements DIR] [--previous REV] [--json PATH]

Prints, per dtype and strategy, the median and 90th-percentile relative error
|predicted - measured| / measured of

* ``model``: this checkout's compute model with the measured device's preset
  (``h200``), uncalibrated;
* ``previous``: the same prediction made by the code at git revision ``REV``
  (default ``HEAD~1``'s parent chain is not guessed: pass it; omitted when not
  given), run in a temporary git worktree;
* ``roofline``: a plain roofline, ``max(FLOPs / (peak * e), bytes / bandwidth)``
  at the dtype's datasheet peak in the math mode JAX uses (TF32 for float32),
  with one efficiency ``e`` for every layer (the median ratio over all rows:
  the best single constant);

then the kernel constants chosen from the rows with their error in-sample,
leaving each layer out and each layer kind out (``_fidelity_fit.py``), the
calibrated errors, and the mean accuracy min(P/E, E/P) of the ParaDL oracle
on ParaDL's ABCI series (``paradl-abci-fig2.json``) in default mode (on the
``abci-v100-chainermn`` environment preset), compat mode and the original
oracle's predictions, then default mode with the environment's constants
chosen in-sample, leaving each series and each network out (``_paradl_loo.py``;
see ``docs/fidelity.md``).

What is predicted for each row is exactly what was timed: one layer's shard
(``shard`` in the row: a SAME 3x3 convolution over ``h`` rows, or ``x @ w``)
forward and backward, both gradients, plus its ReLU, plus one jitted call's
dispatch (``kernel.dispatch_s`` of the hardware). It is built as a graph
``input -> layer -> relu`` whose layer computes its input gradient too (as
the measurement does), costed on one device under ``data``. Numbers: ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MEASUREMENTS = next(
    (p for p in (ROOT / "shared/reference/measurements", ROOT.parent / "shared/reference/measurements") if p.is_dir()),
    ROOT.parent / "shared/reference/measurements",
)
STRATEGY_ORDER = ("data", "filter", "channel", "spatial")


def read_rows(folder: Path) -> list[dict]:
    path = folder / "h200-vgg16-layers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shard_graph(row: dict):
    """The timed op of one measurement row as a LayerGraph (module docstring)."""
    from planner.ir.builder import GraphBuilder

    s = row["shard"]
    shape = (s["c"], s["h"], s["w"]) if row["kind"] == "conv" else (s["i"],)
    try:
        g = GraphBuilder(f"{row['layer']}-shard", shape, input_gradient=True)
        x = g.input
    except TypeError:  # code from before input_gradient (--previous): an identity in front does it
        g = GraphBuilder(f"{row['layer']}-shard", shape)
        x = g.elementwise("identity", g.input)
    if row["kind"] == "conv":
        y = g.conv("layer", x, s["f"], row["K"], padding="SAME", bias=False)
    else:
        y = g.dense("layer", x, s["o"], bias=False)
    g.relu("relu", y)
    return g.build()


def predict_rows(rows: list[dict], hardware="h200") -> list[float]:
    """Predicted seconds of every row with the importable cost model (this
    checkout's, or another revision's when run from its worktree)."""
    import jax

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware

    hw = load_hardware(hardware)
    kernel = getattr(hw.device, "kernel", None)
    dispatch = float(getattr(kernel, "dispatch_s", 0.0)) if kernel is not None else 0.0
    out = []
    for r in rows:
        g = shard_graph(r)
        b = r["shard"]["b"]
        table = cost_table(g.arrays, hardware_arrays(hw, r["dtype"]), float(b), 1.0, 1.0,
                           CostSettings(dtype=r["dtype"]))
        c = np.asarray(jax.device_get(table.compute_s))[:, 0]
        names = list(g.names)
        out.append(float(c[names.index("layer")] + c[names.index("relu")]) + dispatch)
    return out


def roofline_rows(rows: list[dict], hardware: str = "h200") -> list[float]:
    """A plain roofline with one efficiency (module docstring); its efficiency
    is chosen as the median of its unit-efficiency ratios, the best constant."""
    from costmodels import load_hardware

    dev = load_hardware(hardware).device
    peaks = dev.peak_flops_per_s
    raw = []
    for r in rows:
        g = shard_graph(r)
        a = g.arrays
        names = list(g.names)
        i = [names.index("layer"), names.index("relu")]
        b = r["shard"]["b"]
        flops = float(np.sum(np.asarray(a.flops_total)[i])) * b
        el = np.asarray(a.in_channels) * np.prod(np.asarray(a.in_spatial), -1) + \
            np.asarray(a.out_channels) * np.prod(np.asarray(a.out_spatial), -1)
        delta = 4.0 if r["dtype"] == "float32" else 2.0
        nbytes = 3.0 * delta * b * float(np.sum(el[i])) + 4.0 * delta * float(np.asarray(a.params)[i].sum())
        mode = "tf32" if r["dtype"] == "float32" and "tf32" in peaks else r["dtype"]
        raw.append((flops / peaks[mode], nbytes / dev.memory_bandwidth_bytes_per_s))
    measured = np.array([r["fwd_bwd_s"] for r in rows])
    e = float(np.median(np.array([c for c, _ in raw]) / measured))  # t = max(c / e, m): c/e = measured at the median
    return [max(c / e, m) for c, m in raw]


def previous_rows(rev: str, folder: Path) -> list[float]:
    """This script's predictions as made by the code at ``rev`` (a temporary worktree)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            out = Path(tmp) / "pred.json"
            env = dict(os.environ, PYTHONPATH=str(tree))
            subprocess.run([sys.executable, __file__, "--measurements", str(folder), "--predict-only", str(out)],
                           check=True, env=env, cwd=str(tree))
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def errors(pred, rows) -> np.ndarray:
    measured = np.array([r["fwd_bwd_s"] for r in rows])
    return np.abs(np.asarray(pred) - measured) / measured


def groups(rows: list[dict]):
    """(label, row mask) per dtype, and per dtype and strategy."""
    dt = np.array([r["dtype"] for r in rows])
    st = np.array([r["strategy"] for r in rows])
    for d in ("float32", "bfloat16"):
        yield f"{d} all", dt == d
        for s in STRATEGY_ORDER:
            if np.any((dt == d) & (st == s)):
                yield f"{d} {s}", (dt == d) & (st == s)


def table(columns: dict[str, np.ndarray], rows: list[dict]) -> list[str]:
    head = f"{'rows':<20}{'n':>4}" + "".join(f"{name + ' med':>15}{name + ' p90':>15}" for name in columns)
    lines = [head]
    for label, mask in groups(rows):
        cells = "".join(f"{np.median(e[mask]) * 100:>14.1f}%{np.percentile(e[mask], 90) * 100:>14.1f}%"
                        for e in columns.values())
        lines.append(f"{label:<20}{int(mask.sum()):>4}{cells}")
    return lines


def layer_graph(row: dict):
    """The whole (unsharded) layer of a row, ``input -> layer -> relu``, computing
    its input gradient as the measurement does: what a user's model holds, which a
    calibration is looked up against under the row's strategy and mesh."""
    from planner.ir.builder import GraphBuilder

    if row["kind"] == "conv":
        g = GraphBuilder(row["layer"], (row["C"], row["H"], row["W"]), input_gradient=True)
        y = g.conv("layer", g.input, row["F"], row["K"], padding="SAME", bias=False)
    else:
        g = GraphBuilder(row["layer"], (row["I"],), input_gradient=True)
        y = g.dense("layer", g.input, row["O"], bias=False)
    g.relu("relu", y)
    return g.build()


def mesh_of(row: dict) -> tuple[int, int]:
    """data splits the batch over p devices; the others split the model axis."""
    return (row["p"], 1) if row["strategy"] == "data" else (1, row["p"])


def calibrated_rows(train: list[dict], test: list[dict], hardware: str = "h200") -> list[float]:
    """Predicted seconds of ``test`` with a calibration made from ``train``
    (``Calibration.from_records``), looked up as the cost table does
    (``costmodels.calibration.calibrate_compute``) for each test row's layer
    and strategy, at the shard the row timed (its ``h`` input rows, of which
    ``h - (K - 1)`` are output rows under spatial; the planner's own spatial
    shards own ``ceil(H / p)`` rows, which differs where ``p`` does not divide
    ``H``). The points are the whole measured op (layer, ReLU and dispatch);
    the regressor is the model's time of the layer's shard."""
    import jax.numpy as jnp

    from costmodels import hardware_arrays, load_hardware
    from costmodels.calibration import (
        Calibration,
        calibrate_compute,
        calibration_arrays,
    )
    from costmodels.compute import DTYPE_BYTES, shard_compute_s
    from costmodels.shards import shard_shapes
    from costmodels.strategies import parse_strategy

    hw = load_hardware(hardware)
    out = []
    cals = {}
    for r in test:
        dt = r["dtype"]
        if dt not in cals:
            cals[dt] = Calibration.from_records([t for t in train if t["dtype"] == dt], hardware=hardware, dtype=dt)
        g = layer_graph(r)
        i, j = list(g.names).index("layer"), int(parse_strategy(r["strategy"]))
        d, m = mesh_of(r)
        a, hwa, delta = g.arrays, hardware_arrays(hw, dt), DTYPE_BYTES[dt]
        sh = shard_shapes(a, float(r["B"]), float(d), float(m))
        x = r["shard"]
        if r["kind"] == "conv":
            sh = sh._replace(batch=sh.batch.at[i, j].set(x["b"]), in_channels=sh.in_channels.at[i, j].set(x["c"]),
                             out_channels=sh.out_channels.at[i, j].set(x["f"]),
                             in_spatial=sh.in_spatial.at[i, j, :2].set(jnp.asarray([x["h"], x["w"]], jnp.float32)),
                             out_spatial=sh.out_spatial.at[i, j, :2].set(jnp.asarray(
                                 [x["h"] - (r["K"] - 1) if r["strategy"] == "spatial" else x["h"], x["w"]], jnp.float32)))
        model = lambda arrays, shapes: shard_compute_s(hwa, arrays, shapes, delta).total_s  # noqa: E731
        _, seconds = calibrate_compute(calibration_arrays(cals[dt], g), a, None, sh, model(a, sh), model)
        out.append(float(seconds[i, j]))
    return out


def fitted_rows(train: list[dict], test: list[dict], hardware: str = "h200", steps: int = 300) -> list[float]:
    """Predicted seconds of ``test`` by the kernel model with the hardware
    that ``planner.fit_hardware`` fits (efficiency and kernel groups) to the
    ``train`` rows, one dtype at a time (each row: its shard on one device, one call)."""
    import dataclasses

    from costmodels import load_hardware
    from planner.calibrate.fit import StepTime, fit_hardware

    hw = load_hardware(hardware)
    pred = {}
    for dt in sorted({r["dtype"] for r in test}):
        rows = [r for r in train if r["dtype"] == dt]
        graphs = [dataclasses.replace(shard_graph(r), model_name=f"row{k}") for k, r in enumerate(rows)]
        times = [StepTime(r["fwd_bwd_s"], r["shard"]["b"], (1, 1), "data", model=f"row{k}") for k, r in enumerate(rows)]
        fitted = fit_hardware(graphs, times, hw, dtype=dt, fit=("efficiency", "kernel"), steps=steps).hardware
        want = [r for r in test if r["dtype"] == dt]
        for r, t in zip(want, predict_rows(want, fitted), strict=True):
            pred[id(r)] = t
    return [pred[id(r)] for r in test]


def table_rows(columns: dict[str, np.ndarray], rows: list[dict]) -> list[dict]:
    """The rows of :func:`table` as numbers: per group, each column's median and 90th percentile."""
    out = []
    for label, mask in groups(rows):
        row = {"rows": label, "n": int(mask.sum())}
        for name, e in columns.items():
            row[f"{name}_median"] = float(np.median(e[mask]))
            row[f"{name}_p90"] = float(np.percentile(e[mask], 90))
        out.append(row)
    return out


def calibrated_lines(rows: list[dict]) -> tuple[list[str], dict]:
    """(a) calibrate on p in {1, 2, 8}, predict p = 4; (b) same shapes: each layer
    that has same-shaped twins predicted from a calibration of every other row;
    unseen shapes: each layer shape predicted by the hardware fitted to the
    other shapes' rows."""
    shape = lambda r: (r["kind"], r.get("C", r.get("I")), r.get("F", r.get("O")), r.get("H"), r.get("W"))  # noqa: E731
    results: dict[str, dict[str, np.ndarray]] = {}
    test = [r for r in rows if r["p"] == 4]
    results["(a) p=4 from p in {1,2,8}"] = {"rows": test, "pred": calibrated_rows([r for r in rows if r["p"] != 4], test)}
    twins = {}
    for r in rows:
        twins.setdefault(shape(r), set()).add(r["layer"])
    same_test, same_pred = [], []
    for layers in twins.values():
        if len(layers) < 2:
            continue
        for layer in sorted(layers):
            t = [r for r in rows if r["layer"] == layer]
            same_test += t
            same_pred += calibrated_rows([r for r in rows if r["layer"] != layer], t)
    results["(b) same shapes"] = {"rows": same_test, "pred": same_pred}
    unseen_test, unseen_pred = [], []
    for key in sorted(twins):
        t = [r for r in rows if shape(r) == key]
        unseen_test += t
        unseen_pred += fitted_rows([r for r in rows if shape(r) != key], t)
    results["(b) unseen shapes"] = {"rows": unseen_test, "pred": unseen_pred}
    lines = [f"{'calibrated':<28}{'dtype':<10}{'n':>4}{'median':>9}{'p90':>9}"]
    report = {}
    for name, res in results.items():
        e = errors(res["pred"], res["rows"])
        dts = np.array([r["dtype"] for r in res["rows"]])
        for dt in ("float32", "bfloat16"):
            mask = dts == dt
            if mask.any():
                lines.append(f"{name:<28}{dt:<10}{int(mask.sum()):>4}{np.median(e[mask]) * 100:>8.1f}%"
                             f"{np.percentile(e[mask], 90) * 100:>8.1f}%")
        report[name] = {"layer": [r["layer"] for r in res["rows"]], "strategy": [r["strategy"] for r in res["rows"]],
                        "p": [r["p"] for r in res["rows"]], "dtype": dts.tolist(), "error": e.tolist()}
    return lines, report


def paradl_lines(folder: Path):
    """Mean min(P/E, E/P) per ParaDL series: default mode on the environment
    preset, compat mode, and the original oracle's own predictions."""
    from planner.paradl.fidelity import MODES, paradl_fidelity

    report = paradl_fidelity(folder / "paradl-abci-fig2.json")
    lines = [f"{'series':<30}{'points':>7}" + "".join(f"{m:>10}" for m in MODES)]
    for s in report.series:
        lines.append(f"{s.model + ' ' + s.strategy:<30}{len(s.devices):>7}"
                     + "".join(f"{s.accuracy(m):>10.3f}" for m in MODES))
    for model in sorted({s.model for s in report.series}):
        n = sum(len(s.devices) for s in report.series if s.model == model)
        lines.append(f"{model + ', all points':<30}{n:>7}" + "".join(f"{report.mean(m, model=model):>10.3f}" for m in MODES))
    return lines, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=DEFAULT_MEASUREMENTS)
    ap.add_argument("--previous", metavar="REV", help="git revision whose model is shown beside this one")
    add_json_option(ap, __file__)
    ap.add_argument("--predict-only", type=Path, help=argparse.SUPPRESS)  # used by --previous
    args = ap.parse_args(argv)
    rows = read_rows(args.measurements)
    if args.predict_only:
        args.predict_only.write_text(json.dumps(predict_rows(rows)))
        return 0

    columns = {"model": errors(predict_rows(rows), rows)}
    if args.previous:
        columns["previous"] = errors(previous_rows(args.previous, args.measurements), rows)
    columns["roofline"] = errors(roofline_rows(rows), rows)
    print(f"Per-layer error, uncalibrated, {len(rows)} rows of {args.measurements / 'h200-vgg16-layers.jsonl'}"
          + (f"; previous = {args.previous}" if args.previous else ""))
    for line in table(columns, rows):
        print(line)
    import _fidelity_fit

    rowset = _fidelity_fit.RowSet(rows, shard_graph)
    chosen = _fidelity_fit.choose(rowset)
    held_lines, held_table = _fidelity_fit.report_lines(chosen, rowset)
    print("\n" + "\n".join(held_lines))
    calibrated, calibrated_report = calibrated_lines(rows)
    print()
    for line in calibrated:
        print(line)
    paradl_text, paradl = paradl_lines(args.measurements)
    print()
    print("ParaDL on ABCI (paradl-abci-fig2.json): mean min(P/E, E/P); default = default mode on "
          "abci-v100-chainermn, compat = compat mode on abci-v100, original = the original oracle's predictions")
    for line in paradl_text:
        print(line)
    import _paradl_loo
    paradl_path = args.measurements / "paradl-abci-fig2.json"
    pdata, ppred = json.loads(paradl_path.read_text()), _paradl_loo.predictions(paradl_path)
    env = _paradl_loo.choose(pdata, ppred)
    env_lines, env_table = _paradl_loo.report_lines(env, _paradl_loo.choose(pdata, ppred, 3.0))
    print("\n" + "\n".join(env_lines))
    report = {"per_layer": {name: e.tolist() for name, e in columns.items()}, "calibrated": calibrated_report,
              "paradl": paradl.to_dict(),
              "held_out": {c: chosen[c].tolist() for c in ("in_sample", "leave_layer_out", "leave_kind_out")},
              "paradl_held_out": {c: np.asarray(env[c]).tolist() for c in _paradl_loo.COLUMNS}}
    calibrated_summary = []
    for name, res in calibrated_report.items():
        e, dts = np.asarray(res["error"]), np.asarray(res["dtype"])
        calibrated_summary += [{"calibrated": name, "dtype": dt, "n": int((dts == dt).sum()),
                                "median": float(np.median(e[dts == dt])), "p90": float(np.percentile(e[dts == dt], 90))}
                               for dt in ("float32", "bfloat16") if (dts == dt).any()]
    from planner.paradl.fidelity import MODES
    summary = {"rows": len(rows), "previous": args.previous, "calibrated": calibrated_summary,
               "paradl_mean": {model: {m: paradl.mean(m, model=model) for m in MODES}
                               for model in sorted({s.model for s in paradl.series})},
               "kernel_constants": chosen["constants"], "held_out": held_table,
               "environment_constants": env["constants"], "paradl_held_out": env_table}
    write_results(args.json, __file__, "default" if args.previous is None else "with previous", summary,
                  table_rows(columns, rows), argv, measurements=os.path.relpath(args.measurements, ROOT), report=report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
