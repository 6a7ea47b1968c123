"""The export's runs of recomputed layers (planner.runtime.runs): the
forward pass cut by layer as planner.extract cuts it, each run recomputed in
the backward pass. Oracles: extract's layers, the step without runs (same
losses, same gradients), what XLA compiles (the recomputed convolutions, the
temporaries)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import planner
from builders import TinyCNN, TinyResNet
from planner.models.layer_equations import equation_layers, marked_module_calls
from planner.runtime.export import (
    block_layouts,
    consumer_layouts,
    lower_training,
    make_mesh,
    producer_layouts,
    shard_training,
)
from planner.runtime.runs import run_members


def _traced(model, x):
    graphdef, state = nnx.split(model)

    def forward(st, v, tag):
        m = nnx.merge(graphdef, st)
        tag(m)
        return m(v)

    with marked_module_calls(model) as tag:
        closed = jax.make_jaxpr(lambda st, v: forward(st, v, tag))(state, x)
    return closed, len(jax.tree.leaves(state))


def test_equations_map_to_the_extracted_layers():
    model = TinyResNet(nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((4, 16, 16, 3), jnp.float32)
    closed, index = _traced(model, x)
    found = equation_layers(model, closed, index, 4)
    graph = planner.extract(model, x)
    assert found.names == graph.names
    assert len(found.layers) == len(closed.jaxpr.eqns)
    # every layer owns an equation; each convolution is its conv layer's, in order
    assert set(graph.names) <= {name for name in found.layers if name is not None}
    convs = [name for e, name in zip(closed.jaxpr.eqns, found.layers, strict=True)
             if e.primitive.name == "conv_general_dilated"]
    assert convs == [n for n in graph.names if n.rsplit("/", 1)[-1] in ("stem", "conv1", "conv2", "proj")]
    adds = [name for e, name in zip(closed.jaxpr.eqns, found.layers, strict=True)
            if e.primitive.name == "add" and name is not None and name.endswith("add")]
    assert adds == ["blocks/0/add", "blocks/1/add"]


def test_run_members_refuses_bad_runs():
    layers = ["a", None, "b", "b", "c"]
    assert run_members(layers, [["a", "b"], ["c"]]) == [[0, 2, 3], [4]]
    with pytest.raises(ValueError, match="in two runs"):
        run_members(layers, [["a", "b"], ["b", "c"]])
    with pytest.raises(ValueError, match="no equation"):
        run_members(layers, [["a", "d"]])
    with pytest.raises(ValueError, match="names no layer"):
        run_members(layers, [[]])


def _block_runs(names):
    blocks = ("blocks/0/", "blocks/1/")
    return [[n for n in names if n.startswith(b)] for b in blocks]


@pytest.mark.parametrize("strategy", ["data", "filter"])
def test_runs_train_as_kept_and_xla_recomputes_them(devices, strategy):
    batch = 32
    model = TinyResNet(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (batch, 16, 16, 3))
    y = jnp.arange(batch) % 10
    graph = planner.extract(model, x)
    strategies = {n: strategy if n != "head" else "data" for n in graph.names}
    kw = dict(input_layouts=producer_layouts(graph, strategies), output_layouts=consumer_layouts(graph, strategies),
              blocks=block_layouts(graph, strategies))
    runs = _block_runs(graph.names)
    mesh = make_mesh(4, 2)
    losses, convs, temp = {}, {}, {}
    for label, rr in (("kept", None), ("runs", runs)):
        before = {c: c.__dict__.get("__call__") for c in (TinyResNet, nnx.Conv, nnx.BatchNorm, nnx.List)}
        step, state = shard_training(model, strategies, mesh, optax.adam(1e-3), recompute_runs=rr, **kw)
        out = []
        for _ in range(3):
            state, loss = step(state, x, y)
            out.append(float(loss))
        losses[label] = out
        compiled = lower_training(model, strategies, mesh, optax.adam(1e-3), x, recompute_runs=rr,
                                  **kw)[0].compile()
        convs[label] = compiled.as_text().count("convolution(")
        temp[label] = compiled.memory_analysis().temp_size_in_bytes
        assert {c: c.__dict__.get("__call__") for c in before} == before  # the patches are undone
    np.testing.assert_allclose(losses["runs"], losses["kept"], rtol=1e-5)
    # the backward pass runs each recomputed convolution's forward again
    recomputed = sum(1 for run in runs for n in run if n.rsplit("/", 1)[-1] in ("conv1", "conv2", "proj"))
    assert convs["runs"] == convs["kept"] + recomputed
    assert temp["runs"] < temp["kept"]


def test_run_gradients_equal_the_kept_gradients():
    model = TinyCNN(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(2), (8, 16, 16, 3))
    graph = planner.extract(model, x)
    graphdef, params, other = nnx.split(model, nnx.Param, ...)
    run = [n for n in graph.names if not n.startswith("fcs/1")][:6]  # convs/0 .. max_pool_1
    from planner.runtime.runs import recomputing_forward

    def loss(p, runs):
        if not runs:
            return jnp.sum(nnx.merge(graphdef, p, other, copy=True)(x) ** 2)
        closed, index = _traced(nnx.merge(graphdef, p, other, copy=True), x)
        found = equation_layers(model, closed, index, 8)
        leaves = jax.tree.leaves(nnx.state(nnx.merge(graphdef, p, other, copy=True)))
        (out,) = recomputing_forward(closed, run_members(found.layers, runs))(*leaves, x)
        return jnp.sum(out ** 2)

    kept = jax.grad(loss)(params, [])
    runs = jax.grad(loss)(params, [run])
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(runs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_export_refuses_runs_the_plan_does_not_name(devices):
    model = TinyResNet(nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((8, 16, 16, 3), jnp.float32)
    strategies = {n: "data" for n in planner.extract(model, x).names}
    mesh = make_mesh(8, 1)
    with pytest.raises(ValueError, match="does not name"):
        lower_training(model, strategies, mesh, optax.sgd(0.1), x, recompute_runs=[["stem", "nope"]])
    with pytest.raises(ValueError, match="remat_layers and in recompute_runs"):
        lower_training(model, strategies, mesh, optax.sgd(0.1), x, remat_layers=["stem"],
                       recompute_runs=[["stem"]])
