"""XLA:CPU's schedule (costmodels/xla_cpu.py) against hand-computed peaks, and
planner/schedule_fit.py's re-planning against a stub solver."""

import jax.numpy as jnp
import numpy as np
import pytest
from builders import synthetic_table

from costmodels import XlaCpuBuffers, one_hot, scheduled_memory_per_device
from costmodels.strategies import NUM_STRATEGIES as S
from planner.schedule_fit import SCHEDULE_RETRIES, fit_schedule
from search import Solution, discrete_problem, minimum_memory


def _table(out1: float = 4.0, swapped: float = 20.0, d_gt_1: bool = True):
    """Three layers in order, every strategy alike: conv0 (the first weighted
    layer: no copy), a max pool, conv2 (copied; reversed kernel ``swapped``).
    Bytes per device, small integers."""
    rows = lambda *v: jnp.asarray(np.repeat(np.asarray(v, np.float64)[:, None], S, axis=1), jnp.float32)  # noqa: E731
    G = (10.0, 0.0, 30.0)  # gradients; the update is as large
    # state = weights + gradients + two adam slots + update: 5 G
    state = rows(*(5 * g for g in G))
    table = builders_table(
        state_bytes=state, update_bytes=rows(*G),
        activation_bytes=rows(40.0, 20.0, 12.0),  # the pool's: its input 16 and index matrix 4
        workspace_bytes=rows(5.0, 7.0 + 8.0, 9.0),  # the pool's with its iotas (8)
    )
    x = XlaCpuBuffers(
        gradient_bytes=rows(*G), kernel_copy_bytes=rows(0.0, 0.0, 30.0), reversed_kernel_bytes=rows(0.0, 0.0, swapped),
        pool_input_bytes=rows(0.0, 16.0, 0.0), pool_iota_bytes=rows(0.0, 8.0, 0.0),
        pool_output_bytes=rows(0.0, out1, 0.0),
        max_pool=jnp.asarray([0.0, 1.0, 0.0]), reduces_gradients=jnp.asarray(1.0 if d_gt_1 else 0.0))
    return table._replace(xla_cpu=x)


def builders_table(**fields):
    t = synthetic_table(0, 3, [(0, 1), (1, 2)], layers=3, edge_rows=2)
    return t._replace(**fields)


def _peak(table, strategy: int = 0) -> float:
    return float(scheduled_memory_per_device(table, one_hot(np.full(3, strategy), S)))


def test_schedule_peaks_by_hand():
    # args (weights, slots) = 3 G = 30 + 0 + 90 = 120.
    # forward = C + S + at the pool: made 40 + 20, iotas from it on 8, other pools' Z 0, 2 x out 4
    #         = 30 + 20 + 76 = 126; backward = C + A + Z + max W = 30 + 72 + 16 + 9 = 127;
    # reduce: before each layer C + A + Z = 0, 40, 76; twice the gradients from it on 80, 60, 60:
    #         cuts 80, 100, 136; the optimizer step 2 G = 80.
    assert _peak(_table()) == 120 + 136
    assert _peak(_table(d_gt_1=False)) == 120 + 127  # one data group: no all-reduce
    assert _peak(_table(out1=20.0)) == 120 + 30 + 20 + 40 + 20 + 8 + 40  # the forward peak at the pool: 158
    # the same for every strategy here, and relaxed: a mix of equal rows is the same
    assert _peak(_table(), strategy=3) == 256
    assert float(scheduled_memory_per_device(_table(), jnp.full((3, S), 1.0 / S))) == pytest.approx(256, rel=1e-6)


def _sol(choice, memory, limit, feasible=True, time_s=1.0):
    return Solution(choice=tuple(choice), time_s=time_s, memory_bytes=memory, memory_limit_bytes=limit,
                    feasible=feasible, min_memory_bytes=0.0, method="stub", seed=0, lower_bound_s=None,
                    optimality_gap=None, seconds=0.0)


def test_fit_schedule_searches_again_below_the_excess():
    t = _table()  # every plan's schedule peaks at 256 here (strategies alike)
    asked = []

    def solve(table, budget):
        asked.append(budget)
        return _sol([0, 0, 0], 200.0, budget)

    ok = fit_schedule([t], [_sol([0, 0, 0], 200.0, 300.0)], 300.0, solve)[0]
    assert (ok.feasible, ok.memory_bytes, asked) == (True, 256.0, [])  # fits: reported at its schedule's peak
    events = []
    out = fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, solve, events.append)[0]
    # 6 bytes over: searched again 6 below the lower of the plan's solvers' memory and its budget
    assert asked == [194.0, 188.0, 182.0, 176.0][:SCHEDULE_RETRIES]
    assert [(e.stage, e.table) for e in events] == [("schedule", 0)] * SCHEDULE_RETRIES
    assert "256 B, 6 B over the budget; searching again within 194 B" in events[0].message
    # then the table's least-memory plan is tried: its schedule too needs 256
    assert (out.feasible, out.memory_bytes, out.memory_limit_bytes) == (False, 256.0, 250.0)
    # ... and is what the mesh reports, as every plan that does not fit: the least-memory plan and its memory
    smallest = minimum_memory(discrete_problem(t))
    assert out.choice == tuple(smallest.choice) and out.min_memory_bytes == smallest.memory_bytes < 256.0
    # a mesh the search found nothing on stays so, unsearched
    none = fit_schedule([t], [_sol([0, 0, 0], 400.0, 250.0, feasible=False)], 250.0, solve)[0]
    assert not none.feasible and len(asked) == SCHEDULE_RETRIES


def test_fit_schedule_leaves_other_tables_alone():
    t = _table()._replace(xla_cpu=None)  # a gpu table: the solvers' memory is the plan's
    sol = _sol([0, 0, 0], 200.0, 250.0)
    assert fit_schedule([t], [sol], 250.0, lambda *_: pytest.fail("searched again"))[0] == sol


def test_fit_schedules_smallest_plan_is_searched_longer_where_the_first_search_settles_nothing(monkeypatch):
    """Where the table's least-memory plan is taken and the first search
    (within AUTO_MILP_TIME_LIMIT_S) finds no plan within the budget and
    proves none, it searches again with SMALLEST_RETRY_TIME_LIMIT_S, as
    search.solve does; the longer search's plan is the one reported. The
    first search is a stub (a plan above the budget, unproven); the longer
    one is the real smallest memory (minimum_memory, the oracle)."""
    import planner.schedule_fit as fit_module
    import search.solver as solver_module

    t = _table()  # every plan's schedule peaks at 256 here
    smallest = minimum_memory(discrete_problem(t))
    asked = []

    def first(p, time_limit_s=None):
        asked.append(time_limit_s)
        return smallest._replace(memory_bytes=1e9, exact=False)

    def longer(p, time_limit_s=None):
        asked.append(time_limit_s)
        return minimum_memory(p)

    monkeypatch.setattr(fit_module, "smallest_memory", first)
    monkeypatch.setattr(solver_module, "smallest_memory", longer)
    out = fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, lambda table, budget: _sol([0, 0, 0], 200.0,
                                                                                                 budget))[0]
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S, solver_module.SMALLEST_RETRY_TIME_LIMIT_S]
    assert out.min_memory_bytes == smallest.memory_bytes and out.memory_bytes == 256.0 and not out.feasible
    # a first search whose plan fits the budget (or is proven) is not searched again
    asked.clear()
    monkeypatch.setattr(fit_module, "smallest_memory", lambda p, time_limit_s=None: asked.append(time_limit_s)
                        or smallest._replace(exact=False))
    fit_schedule([t], [_sol([0, 0, 0], 200.0, 250.0)], 250.0, lambda table, budget: _sol([0, 0, 0], 200.0, budget))
    assert asked == [solver_module.AUTO_MILP_TIME_LIMIT_S]
