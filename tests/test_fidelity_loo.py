"""The leave-out choosers of benchmarks/fidelity.py (benchmarks/_paradl_loo.py):
each fold chooses on its training points only and scores the points left
out, checked on a made-up grid whose best points are known by hand."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _paradl_loo  # noqa: E402


def _grid(measured, good_a, good_b, split):
    """Seconds for every grid point: exact at ``good_a`` on the first
    ``split`` points and at ``good_b`` on the rest, twice the measurement
    everywhere else."""
    shape = (len(_paradl_loo.SPINE_DIVISORS), len(_paradl_loo.LEADER_LATENCY_S), len(_paradl_loo.KERNEL_FIXED_S))
    sec = np.broadcast_to(2.0 * measured, (*shape, len(measured))).copy()
    sec[good_a][:split] = measured[:split]
    sec[good_b][split:] = measured[split:]
    return sec


def test_each_network_left_out_is_scored_at_the_others_choice():
    data = {"series": [
        {"model": "a", "strategy": "data", "emp": [1.0, 2.0, 3.0], "original_oracle_pred": [1.0, 1.0, 1.0]},
        {"model": "b", "strategy": "data", "emp": [4.0], "original_oracle_pred": [4.0]},
    ]}
    measured = np.array([1.0, 2.0, 3.0, 4.0])
    good_a, good_b = (0, 1, 2), (0, 3, 4)  # divisor 1: a is exact at one point, b at another
    res = _paradl_loo.choose(data, {"seconds": _grid(measured, good_a, good_b, 3), "linearity_error": 0.0})
    # in-sample: a's three exact points outweigh b's one: a's point; b then scores 1/2
    assert res["in_sample"].tolist() == [1.0, 1.0, 1.0, 0.5]
    assert res["constants"] == {"spine_divisor": 1.0, "leader_latency_s": _paradl_loo.LEADER_LATENCY_S[1],
                                "kernel_fixed_s": _paradl_loo.KERNEL_FIXED_S[2]}
    # a left out: chosen on b alone (b's point), where a is off by 2x; b left out: a's point
    assert res["leave_network_out"].tolist() == [0.5, 0.5, 0.5, 0.5]
    assert res["leave_series_out"].tolist() == [0.5, 0.5, 0.5, 0.5]
    assert res["original"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 1.0])
