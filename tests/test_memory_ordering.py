"""Memory is ordered right: where the search replaces the unlimited plan by a
lighter one to meet a tight limit (same model and batch), the lighter plan
compiles lighter, by XLA's own memory analysis of both programs (the oracle;
benchmarks/memory_grid.py checks the same over its grid)."""

import pytest

import planner
from planner.planning import InfeasibleMemoryError
from planner.runtime.validation import validate

KW = {"devices": 8, "hardware": "dgx-a100", "optimizer": "adam", "platform": "cpu", "verify": False}


def _build(name: str, batch: int):
    if name in ("nanogpt", "vit"):
        import user_models

        return getattr(user_models, name)(batch=batch)
    from planner.models.flax_zoo import flax_model

    return flax_model(name, batch=batch)


def _compiled_bytes(model, plan) -> float:
    return next(r.compiled_bytes for r in validate(model, plan).memory if r.part == "total")


@pytest.mark.slow
@pytest.mark.parametrize("name,batch", [
    ("vgg16-cifar10", 32), ("vit", 16),
    ("nanogpt", 16),  # its tight plan recomputes each attention as a run cut from the traced step
])
def test_the_lighter_plan_at_a_tight_limit_compiles_lighter(devices, name, batch):
    model, x = _build(name, batch)
    graph = planner.extract(model, x)
    free = planner.plan(graph, batch=batch, **KW)
    with pytest.raises(InfeasibleMemoryError) as e:
        planner.plan(graph, batch=batch, memory_limit=1.0, **KW)
    tight = planner.plan(graph, batch=batch, memory_limit=e.value.required_bytes * 1.02, **KW)
    # the search replaced the plan by a lighter one (predicted) ...
    assert tight.memory_bytes_per_device < free.memory_bytes_per_device
    options = lambda p: [layer.option for layer in p.layers]  # noqa: E731  strategies with their levers
    assert options(tight) != options(free) or tight.mesh != free.mesh
    # ... and XLA compiles it lighter
    assert _compiled_bytes(model, tight) < _compiled_bytes(model, free)
