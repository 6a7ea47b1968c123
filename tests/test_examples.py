"""The examples in examples/ run, and what they print is right."""

import importlib.util
import math
import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_train_vgg16_cifar10_example(capsys, tmp_path):
    """Plans for the 8 test devices, trains 2 sharded steps; the first loss is
    the unsharded model's loss on the same weights and batch."""
    import jax
    import optax

    import planner

    out = tmp_path / "plan.json"
    assert _load("train_vgg16_cifar10").main(["--steps", "2", "--batch", "32", "--plan-out", str(out)]) == 0
    text = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"step \d+: loss ([-0-9.e]+)", text)]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    plan = planner.Plan.read(out)
    assert plan.devices == 8 and len(set(plan.strategies.values())) > 1  # a mixed, SplitBrain-like plan
    d, m = plan.mesh
    assert f"mesh {d}x{m}" in text and plan.layers[0].name in text  # the summary table was printed

    model, _ = planner.flax_model("vgg16-cifar10", abstract=False)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (32, 32, 32, 3))
    y = jax.random.randint(ky, (32,), 0, 10)
    reference = float(optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean())
    assert losses[0] == pytest.approx(reference, rel=1e-4)


@pytest.mark.slow
def test_gpu_steps_script_smoke_runs(capsys):
    """benchmarks/gpu_steps.py (for a session with an accelerator) runs end to end
    on CPU: both parts print, part 2 has a row for each of the plan's first
    three profiled layers (--smoke times no more)."""
    import planner
    from planner.calibrate.profile import PROFILED_KINDS
    from planner.models.zoo import get_model

    spec = importlib.util.spec_from_file_location("gpu_steps", EXAMPLES.parent / "benchmarks" / "gpu_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "1. whole training steps at P = 1" in out and "2. per-layer shard shapes of the 8-device plan" in out
    plan = planner.plan("vgg16-cifar10", devices=8, hardware="h200", batch_per_device=2)
    g = get_model("vgg16-cifar10")
    kinds = dict(zip(g.names, g.unpadded().kind, strict=True))
    profiled = [r.name for r in plan.layers if int(kinds[r.name]) in PROFILED_KINDS]
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()[0] in plan.strategies]
    assert rows == profiled[:3]
