"""Choosing the ``abci-v100-chainermn`` environment's fitted constants from
ParaDL's ABCI series, and scoring the choice on series left out
(benchmarks/fidelity.py, docs/fidelity.md).

The constants chosen from the measurements, each on a grid:

* the leaders' all-reduce message latency of ChainerMN's hierarchical
  communicator (``mpi-allreduce-host.message_latency_s``);
* Chainer's fixed cost per layer per pass (``shard_compute.kernel_fixed_s``);

and, for comparison, the same choice where the 1:3 over-subscription
between racks divides the bandwidth of the rings' rack-crossing steps
(``contention.tier_bandwidth_divisor`` of ``ib-spine``; the preset does not
apply it: a ring between consecutive ranks sends one flow each way through
a rack's uplinks, which the over-subscription does not bind).

A series' predicted seconds are linear in the first two (the first adds
``2(k - 1)`` ring steps to the hybrids' all-reduce, the second ``passes``
per layer to the compute), so each is found from three oracle runs per
divisor (at zero, and one step of each) and the grid is read off the lines;
a fourth run at both steps checks the linearity. Each fold chooses the grid
point with the best mean accuracy min(P/E, E/P) over its training points and
scores the points left out.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np

LEADER_LATENCY_S = (0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3)
KERNEL_FIXED_S = (0.0, 2e-5, 4e-5, 6e-5, 8e-5, 1e-4, 1.5e-4)
SPINE_DIVISORS = (1.0, 3.0)


def _with(hw, leader_latency_s: float, kernel_fixed_s: float, spine_divisor: float):
    """``hw`` with the three constants set."""
    env = hw.environment
    transports = tuple(dataclasses.replace(t, message_latency_s=leader_latency_s) if t.name == "mpi-allreduce-host"
                       else t for t in env.transports)
    div = tuple((k, v) for k, v in env.contention.tier_bandwidth_divisor if k != "ib-spine")
    if spine_divisor != 1.0:
        div = (*div, ("ib-spine", spine_divisor))
    env = dataclasses.replace(env, transports=transports,
                              contention=dataclasses.replace(env.contention, tier_bandwidth_divisor=div),
                              shard_compute=dataclasses.replace(env.shard_compute, kernel_fixed_s=kernel_fixed_s))
    return dataclasses.replace(hw, environment=env)


def predictions(path: Path, hardware: str = "abci-v100-chainermn") -> dict:
    """Every grid point's predicted seconds of every point: [divisors, latencies, fixed, points]."""
    from costmodels import load_hardware
    from planner.paradl.fidelity import default_predictions

    hw = load_hardware(hardware)
    run = lambda *c: np.concatenate([np.asarray(s) for s in default_predictions(path, _with(hw, *c))])  # noqa: E731
    lat1, fix1 = LEADER_LATENCY_S[0], KERNEL_FIXED_S[1]
    grid, worst = [], 0.0
    for d in SPINE_DIVISORS:
        base, a, b, both = run(0.0, 0.0, d), run(lat1, 0.0, d), run(0.0, fix1, d), run(lat1, fix1, d)
        slope_lat, slope_fix = (a - base) / lat1, (b - base) / fix1
        worst = max(worst, float(np.max(np.abs(base + slope_lat * lat1 + slope_fix * fix1 - both) / both)))
        grid.append([[base + slope_lat * lat + slope_fix * fix for fix in KERNEL_FIXED_S] for lat in LEADER_LATENCY_S])
    return {"seconds": np.asarray(grid), "linearity_error": worst}


def choose(data: dict, pred: dict, spine_divisor: float = 1.0) -> dict:
    """In-sample, leave-one-series-out and leave-one-network-out accuracy
    (module docstring), and the constants chosen on all series, with the
    rings' rack-crossing bandwidth divided by ``spine_divisor``."""
    from planner.paradl.fidelity import accuracy

    series, seconds = data["series"], pred["seconds"]
    measured = np.concatenate([np.asarray(s["emp"], float) for s in series])
    original = np.concatenate([np.asarray(s["original_oracle_pred"], float) for s in series])
    sid = np.concatenate([[i] * len(s["emp"]) for i, s in enumerate(series)])
    net = np.concatenate([[s["model"]] * len(s["emp"]) for s in series])
    points = list(itertools.product([SPINE_DIVISORS.index(spine_divisor)], range(len(LEADER_LATENCY_S)),
                                    range(len(KERNEL_FIXED_S))))
    acc = np.stack([accuracy(seconds[p], measured) for p in points])  # [grid, points]

    def fold(train: np.ndarray) -> int:
        return int(np.argmax(acc[:, train].mean(axis=1)))

    best = fold(np.ones(len(measured), bool))
    out = {"in_sample": acc[best].copy(), "leave_series_out": np.zeros(len(measured)),
           "leave_network_out": np.zeros(len(measured))}
    for key, labels in (("leave_series_out", sid), ("leave_network_out", net)):
        for v in np.unique(labels):
            held = labels == v
            out[key][held] = acc[fold(~held), held]
    d, lat, fix = points[best]
    out["original"] = accuracy(original, measured)
    out["constants"] = {"spine_divisor": SPINE_DIVISORS[d], "leader_latency_s": LEADER_LATENCY_S[lat],
                        "kernel_fixed_s": KERNEL_FIXED_S[fix]}
    out["linearity_error"] = pred["linearity_error"]
    out["series"] = [f"{s['model']} {s['strategy']}" for s in series]
    out["series_index"] = sid
    out["network"] = net
    return out


COLUMNS = ("in_sample", "leave_series_out", "leave_network_out", "original")


def report_lines(res: dict, other: dict) -> tuple[list[str], list[dict]]:
    """Mean accuracy per series and per network of each column, side by side;
    a last line for ``other`` (the choice with the spine divisor)."""
    lines = [f"Default mode with the environment's constants chosen from the series ({res['constants']}; linearity "
             f"check {res['linearity_error']:.1e}): mean accuracy in-sample and left out, beside the original's",
             f"{'series':<30}{'points':>7}" + "".join(f"{c:>19}" for c in COLUMNS)]
    table = []
    groups = [(s, res["series_index"] == i) for i, s in enumerate(res["series"])]
    groups += [(f"{n}, all points", res["network"] == n) for n in sorted(set(res["network"]))]
    groups.append(("all points", np.ones(len(res["network"]), bool)))
    for label, mask in groups:
        row = {"series": label, "points": int(mask.sum()), **{c: float(res[c][mask].mean()) for c in COLUMNS}}
        table.append(row)
        lines.append(f"{label:<30}{row['points']:>7}" + "".join(f"{row[c]:>19.3f}" for c in COLUMNS))
    row = {"series": "all points, rings divided 1:3", "points": len(res["network"]),
           **{c: float(np.mean(other[c])) for c in COLUMNS}}
    table.append(row)
    lines.append(f"{row['series']:<30}{row['points']:>7}" + "".join(f"{row[c]:>19.3f}" for c in COLUMNS))
    return lines, table
