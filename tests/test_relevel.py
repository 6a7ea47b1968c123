"""search.local.relevel: a plan's levers and runs re-planned exactly with its
strategies fixed, against brute force over every plan with those
strategies."""

from __future__ import annotations

import numpy as np
import pytest
from builders import dag_table, every_plan, rich_table

from search import discrete_problem
from search.local.relevel import relevel
from search.options import restricted
from search.problem import has_runs, plan_memory, plan_time


def _cases():
    for seed in range(3):
        yield f"chain{seed}", discrete_problem(rich_table(seed, 5))
    for seed in range(2):
        yield f"dag{seed}", discrete_problem(dag_table(seed, skip_reshard=True))  # skip edges reshard


@pytest.mark.slow
@pytest.mark.parametrize("name,p", list(_cases()))
def test_relevel_is_the_fastest_plan_with_the_same_strategies(name, p):
    """From random plans at limits from below the smallest memory to above
    the fastest plan's: relevel's plan keeps every layer's strategy, fits
    where any such plan (or the given one) does, and is as fast as the
    fastest such plan that fits, or the given plan where none is faster;
    where those strategies allow no runs, the given plan."""
    assert has_runs(p)
    plans, times, memories, _ = every_plan(p)
    strategies = p.option_strategy[plans]  # [plans, n]
    rng = np.random.default_rng(0)
    improved = exact = 0
    for limit in np.linspace(memories.min() * 0.99, memories[np.argmin(times)] * 1.01, 4):
        zero = np.flatnonzero(np.all(strategies == 0, axis=1))  # (option 0 runs everywhere: these exist)
        for k in np.r_[rng.choice(len(plans), 6, replace=False), rng.choice(zero, 3, replace=False)]:
            c = plans[k]
            same = np.all(strategies == strategies[k], axis=1) & (memories <= limit)
            want = min(times[same].min() if same.any() else np.inf, times[k] if memories[k] <= limit else np.inf)
            got = relevel(p, c, limit)
            assert np.array_equal(p.option_strategy[got], p.option_strategy[c])
            allowed = (p.option_strategy[None, :] == strategies[k][:, None]) & p.feasible
            if not np.isfinite(want) or not has_runs(restricted(p, allowed)):  # (no runs: the local moves' part)
                assert np.array_equal(got, c)
                continue
            assert plan_memory(p, got) <= limit
            assert plan_time(p, got) == pytest.approx(want, rel=1e-9)
            exact += 1
            improved += plan_time(p, got) < plan_time(p, c) * (1 - 1e-9) or memories[k] > limit
    assert improved > 0 and exact >= 5, (improved, exact)


def test_relevel_leaves_problems_without_runs_alone():
    p = discrete_problem(rich_table(0, 5))
    p = p._replace(option_joins=np.zeros_like(p.option_joins))
    assert not has_runs(p)
    c = np.argmax(p.feasible, axis=1)
    assert np.array_equal(relevel(p, c, np.inf), c)


def test_relevel_takes_the_strategies_of_other_plans_too():
    """With other plans, each layer may take any strategy one of the plans
    gives it: brute force over those plans, from plans whose strategies
    differ on some layers."""
    p = discrete_problem(rich_table(1, 5))
    plans, times, memories, _ = every_plan(p)
    strategies = p.option_strategy[plans]
    rng = np.random.default_rng(1)
    limit = (memories.min() + memories[np.argmin(times)]) / 2
    widened = 0
    for k, j in rng.choice(len(plans), (8, 2), replace=False):
        ok = np.all((strategies == strategies[k]) | (strategies == strategies[j]), axis=1) & (memories <= limit)
        got = relevel(p, plans[k], limit, others=plans[j][None])
        assert np.all((p.option_strategy[got] == strategies[k]) | (p.option_strategy[got] == strategies[j]))
        both = (p.option_strategy[None, None, :] == strategies[[k, j]][:, :, None]).any(axis=0)  # [n, O]
        if ok.any() and has_runs(restricted(p, both & p.feasible)):
            assert plan_memory(p, got) <= limit
            assert plan_time(p, got) == pytest.approx(min(times[ok].min(), times[k] if memories[k] <= limit
                                                          else np.inf), rel=1e-9)
            widened += not np.array_equal(p.option_strategy[got], strategies[k])
    assert widened > 0
