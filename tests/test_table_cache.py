"""The command line's cost-table cache (planner._table_cache): a table read
back is the table computed, any changed input is a miss, a damaged file is
computed again, and a plan is the same with and without the cache."""

from __future__ import annotations

import numpy as np
import pytest

import planner
from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
from planner._table_cache import cached_cost_table
from planner import get_model


def _inputs(batch=64.0, d=4.0, m=2.0):
    g = get_model("vgg16-cifar10")
    return (g.arrays, hardware_arrays(load_hardware("dgx-a100")), batch, d, m, None)


def _computed(inputs, settings, calls):
    def compute():
        calls.append(1)
        return cost_table(*inputs[:5], settings, inputs[5])
    return compute


@pytest.mark.parametrize("platform", ["gpu", "cpu"])  # cpu: the table carries XLA:CPU's buffers too
def test_a_table_read_back_is_the_table_computed(tmp_path, platform):
    settings, inputs, calls = CostSettings(platform=platform, levers="all"), _inputs(), []
    first = cached_cost_table(_computed(inputs, settings, calls), inputs, settings, tmp_path)
    again = cached_cost_table(_computed(inputs, settings, calls), inputs, settings, tmp_path)
    assert len(calls) == 1 and len(list(tmp_path.glob("*.npz"))) == 1
    fresh = cost_table(*inputs[:5], settings, None)
    for a, b, c in zip(_leaves(first), _leaves(again), _leaves(fresh), strict=True):
        assert a.dtype == c.dtype and np.array_equal(a, c) and np.array_equal(b, c)
    assert (again.xla_cpu is None) == (platform != "cpu")


def _leaves(table):
    import jax

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(table)]


def test_any_changed_input_is_a_miss_and_a_damaged_file_is_computed_again(tmp_path):
    settings, calls = CostSettings(), []
    for inputs, s in ((_inputs(), settings), (_inputs(batch=128.0), settings), (_inputs(d=8.0, m=1.0), settings),
                      (_inputs(), CostSettings(dtype="bfloat16"))):
        cached_cost_table(_computed(inputs, s, calls), inputs, s, tmp_path)
    assert len(calls) == 4 and len(list(tmp_path.glob("*.npz"))) == 4
    for f in tmp_path.glob("*.npz"):
        f.write_bytes(b"not a table")
    inputs = _inputs()
    table = cached_cost_table(_computed(inputs, settings, calls), inputs, settings, tmp_path)
    assert len(calls) == 5 and np.array_equal(np.asarray(table.compute_s),
                                              np.asarray(cost_table(*inputs[:5], settings, None).compute_s))


def test_a_plan_is_the_same_with_the_cache(tmp_path):
    kw = dict(devices=8, hardware="dgx-a100", batch=64, levers="zero")
    plain = planner.plan("vgg16-cifar10", **kw)
    for _ in range(2):  # fills, then reads
        cached = planner.plan("vgg16-cifar10", cache_dir=tmp_path, **kw)
        assert cached.to_dict() | {"seconds": 0} == plain.to_dict() | {"seconds": 0}
    assert list(tmp_path.glob("*.npz"))
