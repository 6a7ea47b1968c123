"""planner.plan(verify=...): the compiler in the loop. The loop's rules against
a stand-in compiler whose bytes are set by hand (fast), and against XLA:CPU
on the tiny CNN at batch 64, whose tight plans (8x1) compile above their
prediction (slow): a plan the prediction alone returns over its limit is
planned again under it; a limit nothing meets fails with the smallest
compiled figure."""

from __future__ import annotations

import pytest

import planner
from costmodels import load_hardware
from planner import verification
from planner.infeasible import InfeasibleMemoryError
from planner.plan_inputs import MEMORY_MARGIN
from builders import tiny_cnn

LIMIT = 1_000_000.0  # the tiny CNN's plan at batch 64 on 8: 2x4, predicted 735,232 B


@pytest.fixture(scope="module")
def graph():
    model, x = tiny_cnn()
    return planner.extract(model, x)


def _args(graph, **kw):
    return dict(devices=8, batch=64, hardware="cpu-local", memory_limit=LIMIT, flax_model=object(), **kw)


def _stand_in(monkeypatch, compiled_of):
    """Compile with ``compiled_of(plan)`` bytes; record the plans compiled."""
    seen = []

    def compiled_memory_bytes(flax_model, plan):
        seen.append(plan)
        return compiled_of(plan)

    monkeypatch.setattr(verification, "compiled_memory_bytes", compiled_memory_bytes)
    return seen


def test_a_plan_over_its_limit_is_planned_again_below_the_excess(graph, monkeypatch):
    over = 40_000.0  # the first plan compiles this much over the limit, the next as predicted (some plan fits
    # 0.96 MB: the smallest limit any plan fits is 0.95 MB)
    seen = _stand_in(monkeypatch, lambda p: LIMIT + over if not seen[1:] else p.memory_bytes_per_device)
    events = []
    plan = planner.plan(graph, **_args(graph), callback=events.append)
    first, second = seen
    assert first.memory_limit_bytes == LIMIT
    # searched again below the limit less the measured excess: compiled - limit
    assert second.memory_limit_bytes == LIMIT - over
    assert plan.verify_rounds == 2 and plan.compiled_memory_bytes == second.memory_bytes_per_device <= LIMIT
    assert plan.memory_limit_bytes == LIMIT  # the promise is the caller's limit
    assert [e.message.split(":")[0] for e in events if e.stage == "verify"] == ["round 1", "round 2"]
    again = planner.Plan.from_dict(plan.to_dict())  # the plan file keeps what was compiled
    assert (again.compiled_memory_bytes, again.verify_rounds) == (plan.compiled_memory_bytes, 2)


def test_a_plan_that_fits_compiles_once(graph, monkeypatch):
    seen = _stand_in(monkeypatch, lambda p: p.memory_bytes_per_device)
    plan = planner.plan(graph, **_args(graph))
    assert len(seen) == 1 and plan.verify_rounds == 1
    assert plan.compiled_memory_bytes == plan.memory_bytes_per_device


def test_nothing_verifies_names_the_smallest_compiled_figure(graph, monkeypatch):
    # the stand-in's bytes per compile, each over the limit: the limit searched falls by each excess (0.96 MB,
    # 0.93 MB, ...) until no plan fits it (below 0.95 MB) or the rounds are spent
    figures = [1.04e6, 1.03e6, 1.06e6, 1.02e6]
    seen = _stand_in(monkeypatch, lambda p: figures[len(seen) - 1])
    with pytest.raises(InfeasibleMemoryError) as e:
        planner.plan(graph, **_args(graph))
    assert 2 <= len(seen) <= verification.VERIFY_ROUNDS
    assert [p.memory_limit_bytes for p in seen[:2]] == [LIMIT, LIMIT - 0.04e6]
    best = min(figures[:len(seen)])
    assert f"of the {len(seen)} plan(s) compiled, the smallest needs {best:,.0f} B" in str(e.value)
    assert e.value.required_bytes == best


def test_verify_says_why_it_cannot_compile_here(graph, monkeypatch):
    seen = _stand_in(monkeypatch, lambda p: 0.0)
    gpu = {**_args(graph), "hardware": "dgx-a100"}
    if verification.gpu_compiler_missing(load_hardware("dgx-a100")):  # without the gpu-aot extra
        with pytest.raises(ValueError, match="gpu, whose compiler is not on this machine"):
            planner.plan(graph, **gpu, verify=True)
    with pytest.raises(ValueError, match="'cpu-local', whose GPU has no target description"):
        planner.plan(graph, **_args(graph), platform="gpu", verify=True)
    with pytest.raises(ValueError, match="no Flax model to compile"):
        planner.plan(graph, **{**_args(graph), "flax_model": None}, verify=True)
    events = []
    plan = planner.plan(graph, **_args(graph), platform="gpu", callback=events.append)  # the default: says why not
    assert plan.compiled_memory_bytes is None and not seen
    assert any(e.stage == "verify" and e.message.startswith("not verified: the plan is for gpu on 'cpu-local'")
               for e in events)
    assert planner.plan(graph, **_args(graph), verify=False).verify_rounds == 0 and not seen


def _xla_case(monkeypatch):
    """The tiny CNN at batch 64 for dgx-a100 on the cpu platform, the cpu
    margin set aside so that the prediction alone decides: ``(model, graph,
    plan arguments, the smallest limit the search predicts any plan fits)``."""
    import jax

    monkeypatch.setitem(MEMORY_MARGIN, "cpu", 0.0)
    model, x = tiny_cnn()
    x = jax.ShapeDtypeStruct((64, *x.shape[1:]), x.dtype)
    graph = planner.extract(model, x)
    args = dict(devices=8, batch=64, hardware="dgx-a100", optimizer="adam", platform="cpu")
    with pytest.raises(InfeasibleMemoryError) as e:
        planner.plan(graph, **args, memory_limit=1.0, verify=False)
    return model, graph, args, e.value.required_bytes


@pytest.mark.slow
def test_xla_replans_a_plan_the_prediction_puts_under_its_limit(monkeypatch):
    """12% above the smallest predicted limit, the plan is predicted under
    the limit and compiles over it on XLA:CPU (measured 789 kB for 738 kB);
    verified, the plan returned compiles within it."""
    model, graph, args, least = _xla_case(monkeypatch)
    limit = 1.12 * least
    unverified = planner.plan(graph, **args, memory_limit=limit, verify=False)
    assert unverified.memory_bytes_per_device <= unverified.memory_limit_bytes
    assert verification.compiled_memory_bytes(model, unverified) > unverified.memory_limit_bytes
    verified = planner.plan(graph, **args, memory_limit=limit, verify=True, flax_model=model)
    assert verified.verify_rounds >= 2 and verified.memory_limit_bytes == limit
    assert verification.compiled_memory_bytes(model, verified) == verified.compiled_memory_bytes <= limit


@pytest.mark.slow
def test_xla_a_limit_nothing_meets_fails_with_the_best_compiled_figure(monkeypatch):
    """0.1% above the smallest predicted limit: the plan compiles over it,
    and below the limit less that excess no plan fits; the error gives the
    smallest figure compiled, the first plan's or less."""
    model, graph, args, least = _xla_case(monkeypatch)
    limit = 1.001 * least
    first = planner.plan(graph, **args, memory_limit=limit, verify=False)
    compiled = verification.compiled_memory_bytes(model, first)
    assert compiled > limit
    with pytest.raises(InfeasibleMemoryError, match=r"of the \d plan\(s\) compiled, the smallest needs") as e:
        planner.plan(graph, **args, memory_limit=limit, verify=True, flax_model=model)
    assert limit < e.value.required_bytes <= compiled
    assert f"the smallest needs {e.value.required_bytes:,.0f} B" in str(e.value)
