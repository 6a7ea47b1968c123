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
    return closed, state


def test_equations_map_to_the_extracted_layers():
    model = TinyResNet(nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((4, 16, 16, 3), jnp.float32)
    closed, state = _traced(model, x)
    found = equation_layers(model, closed, state, 4)
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


def test_equations_follow_positions_the_root_module_owns():
    """A ViT written as users write one adds learned positions the root
    module owns (``x + self.pos_embedding[...]``): the walk of a traced step
    finds that layer as the extraction does, so runs can be cut around it."""
    import user_models

    model, x = user_models.vit(4)
    closed, state = _traced(model, x)
    found = equation_layers(model, closed, state, 4)
    assert found.names == planner.extract(model, x).names
    assert "pos_embedding" in found.layers


@pytest.mark.parametrize("build", ["nanogpt", "llama"])
def test_an_attentions_scores_and_softmax_are_its_equations(build):
    """A hand-written attention (nanoGPT's ``q @ k^T``, mask and softmax;
    the Llama's ``jax.nn.dot_product_attention``) is one layer from its
    per-head queries, keys and values on: every equation that makes a
    ``tokens x tokens`` array from an activation (the scores, the mask
    applied, the softmax, the probabilities) is the attention layer's, so
    recomputing it recomputes them; the projections' equations stay theirs."""
    import user_models

    model, x = getattr(user_models, build)(4, 48)  # 48 tokens: no head is 48 channels wide
    closed, state = _traced(model, x)
    found = equation_layers(model, closed, state, 4)
    squares = [name for e, name in zip(closed.jaxpr.eqns, found.layers, strict=True)  # (the mask reads none)
               if name is not None and any(tuple(v.aval.shape[-2:]) == (48, 48) for v in e.outvars)]
    assert squares and all(name.endswith("attention") for name in squares), squares
    attentions = [n for n in found.names if n.endswith("attention")]
    assert sorted(set(squares)) == sorted(attentions)
    dots = [name for e, name in zip(closed.jaxpr.eqns, found.layers, strict=True)
            if e.primitive.name == "dot_general" and name is not None and name.endswith("attention")]
    assert len(dots) == 2 * len(attentions)  # q k^T and p v


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


@pytest.mark.slow
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


@pytest.mark.slow
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
        closed, state = _traced(nnx.merge(graphdef, p, other, copy=True), x)
        found = equation_layers(model, closed, state, 8)
        leaves = jax.tree.leaves(nnx.state(nnx.merge(graphdef, p, other, copy=True)))
        (out,) = recomputing_forward(closed, run_members(found.layers, runs))(*leaves, x)
        return jnp.sum(out ** 2)

    kept = jax.grad(loss)(params, [])
    runs = jax.grad(loss)(params, [run])
    # f32 rounding: XLA may group the recomputing backward pass's operations into other computations than the
    # kept one's and sum in another order. Against the float64 gradient each of the two is off by up to 5e-6 of
    # its leaf's largest element (measured), so an element that cancels to near zero may differ by that much
    # in absolute terms, far beyond its own rtol; the bound scales with the leaf. A recomputation that lost a
    # term or read a stale residual would be off by a sizable fraction of the leaf.
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(runs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


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


def _run_options(names, runs):
    """Every layer on data, each run's first layer recomputing and the rest joining."""
    options = {n: "data" for n in names}
    for run in runs:
        options[run[0]] = "data+remat"
        options.update({n: "data+remat+join" for n in run[1:]})
    return options


@pytest.mark.slow
def test_shard_applies_a_plans_runs_with_the_kept_losses(devices):
    """A plan's runs (LayerCost.remat / joins, in layer order: Plan.recompute_runs)
    go to the export as recompute_runs; planner.shard trains the run plan with
    the losses of the plan that keeps everything."""
    from planner.runtime.sharding import export_options
    from planner.runtime.validation import fixed_plan

    model = TinyResNet(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (32, 16, 16, 3))
    y = jnp.arange(32) % 10
    graph = planner.extract(model, x)
    runs = _block_runs(graph.names)
    kept = fixed_plan(model, x, (4, 2), strategy="data", batch=32)
    plan = fixed_plan(model, x, (4, 2), strategies=_run_options(graph.names, runs), batch=32)
    assert plan.recompute_runs == tuple(tuple(r) for r in runs) and kept.recompute_runs == ()
    options = export_options(graph, plan)
    assert options["recompute_runs"] == plan.recompute_runs and options["remat_layers"] == ()
    losses = {}
    for label, p in (("kept", kept), ("runs", plan)):
        step, state = planner.shard(model, p, optax.adam(1e-3))
        out = []
        for _ in range(3):
            state, loss = step(state, x, y)
            out.append(float(loss))
        losses[label] = out
    np.testing.assert_allclose(losses["runs"], losses["kept"], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vgg16-cifar10", "resnet-2222-64px"])
def test_run_plans_fit_their_prediction_on_xla_cpu(devices, name):
    """Plans that recompute runs of CNN layers (VGG16-CIFAR-10:
    each conv with its ReLU and pool; a ResNet-18-sized bottleneck ResNet,
    (2, 2, 2, 2) blocks at 64x64: each residual block) on 8x1 at 64 and 32
    samples per device, where activations dominate: XLA's compiled total
    (the oracle) is within 10% of the prediction for the plan that keeps
    everything, and for the runs at most 10% above it and 12% below (XLA:CPU's
    schedule, costmodels.xla_cpu_schedule, counts the ResNet's kernel copies,
    which its recomputed blocks do without: 0.900 measured, VGG16 0.965), the
    parameters and optimizer state exact, and the runs free what XLA holds
    against the plan that keeps everything."""
    from planner.models.flax_zoo import ResNet
    from planner.runtime.validation import fixed_plan

    if name == "vgg16-cifar10":
        model, x = planner.flax_model(name, batch=512)
    else:
        model = nnx.eval_shape(lambda: ResNet((2, 2, 2, 2), 10, rngs=nnx.Rngs(0)))
        x = jax.ShapeDtypeStruct((256, 64, 64, 3), jnp.float32)
    graph = planner.extract(model, x)
    names = graph.names
    if name == "vgg16-cifar10":
        starts = [i for i, n in enumerate(names) if n.startswith("features/")] + [names.index("flatten")]
        runs = [list(names[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    else:
        blocks = sorted({n.rsplit("/", 1)[0] for n in names if n.startswith("layer")})
        runs = [[n for n in names if n.startswith(b + "/")] for b in blocks]
    compiled = {}
    for label, options in (("kept", {n: "data" for n in names}), ("runs", _run_options(names, runs))):
        plan = fixed_plan(model, x, (8, 1), strategies=options, batch=int(x.shape[0]))
        rows = {r.part: r for r in planner.validate(model, plan, memory_rtol=1.0, activation_rtol=1.0).memory}
        for part in ("parameters", "optimizer state"):
            assert rows[part].compiled_bytes == rows[part].predicted_bytes, (label, part)
        total = rows["total"]
        low = 0.88 if label == "runs" else 0.90
        assert low <= total.compiled_bytes / total.predicted_bytes <= 1.10, (label, total)
        compiled[label] = total.compiled_bytes
    assert compiled["runs"] < 0.9 * compiled["kept"]


def test_a_walk_that_finds_other_layers_than_the_plan_is_an_error(devices, monkeypatch):
    """Should the walk of the traced step find a layer the plan does not name
    (an operation of the export's it cannot map), recomputing stops with a
    message instead of cutting runs at layers that may have moved."""
    import planner.runtime.export as export

    def walk(*args, **kwargs):
        found = equation_layers(*args, **kwargs)
        return found._replace(names=(*found.names, "sharding_constraint"))

    monkeypatch.setattr(export, "equation_layers", walk)
    model = TinyResNet(nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((8, 16, 16, 3), jnp.float32)
    names = planner.extract(model, x).names
    with pytest.raises(ValueError, match=r"finds layers the plan does not name \(\['sharding_constraint'\]\)"):
        lower_training(model, {n: "data" for n in names}, make_mesh(8, 1), optax.sgd(0.1), x,
                       recompute_runs=_block_runs(names))
