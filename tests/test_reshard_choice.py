"""A replicated layer after a filter-split layer: what XLA compiles, and that
the cost model, the reference evaluator and the collective list predict it.

Oracles: hand-computed bytes and alpha-beta seconds, and the collectives of
programs XLA compiles on the 8 fake CPU devices (docs/validation.md, "A
replicated layer after a filter layer")."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from costmodels import (
    Strategy,
    cost_table,
    hardware_arrays,
    load_hardware,
    plan_collectives,
)
from costmodels.reference import reference_iteration_time
from planner.ir.builder import GraphBuilder
from planner.runtime.hlo import parse_collectives

ABCI = load_hardware("abci-v100")  # m = 2 inside a node: NVLink, 9 us, 50 GB/s


def _fc_pair():
    b = GraphBuilder("fc-pair", (64,))
    h = b.dense("fc0", b.input, 64)
    b.dense("fc1", h, 4)
    return b.build()


@pytest.mark.slow
def test_filter_then_replicated_gathers_the_activation_by_hand():
    # fc0 filter (output split by features), fc1 replicated: the group's 8 samples x 64
    # features are all-gathered forward, 1 x (alpha + 8*64*4/2 B / bw) over m = 2; fc1's
    # input gradient is replicated, and slicing it to fc0's split costs nothing.
    g = _fc_pair()
    batch, d, m = 8, 1, 2
    t = cost_table(g.arrays, hardware_arrays(ABCI), float(batch), float(d), float(m))
    nbytes = 8 * 64 * 4
    expect_s = (m - 1) * (9e-6 + nbytes / m / 50e9)
    e = int(np.flatnonzero(np.asarray(t.edge_mask))[0])
    assert float(t.reshard_s[e, Strategy.FILTER, Strategy.REPLICATED]) == pytest.approx(expect_s, rel=1e-6)
    choice = [Strategy.FILTER, Strategy.REPLICATED]
    recs = [r for r in plan_collectives(g, choice, batch, d, m) if r.where == "fc0 -> fc1"]
    assert [(r.kind, r.phase, r.bytes_per_device) for r in recs] == [("all-gather", "forward", nbytes)]
    # the reference evaluator charges the same edge: its time with and without the edge
    with_edge = reference_iteration_time(g, choice, ABCI, batch, d, m)
    both_replicated = reference_iteration_time(g, [Strategy.REPLICATED] * 2, ABCI, batch, d, m)
    fc0_filter_alone = with_edge - both_replicated
    lt = np.asarray(t.layer_time_s)
    assert fc0_filter_alone == pytest.approx(lt[0, Strategy.FILTER] - lt[0, Strategy.REPLICATED] + expect_s, rel=1e-5)


def _collectives(pin_input: bool, B: int = 16, F: int = 64, O: int = 4):
    """The collectives of grad(loss) of relu(x @ w1) @ w2 on a 1x8 mesh: w1 split by
    columns (filter), w2 replicated, the hidden activation constrained split by
    features and, with ``pin_input``, constrained replicated before w2 (what
    planner.runtime.export does at a replicated module's input)."""
    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "model"))

    def sh(*spec):
        return NamedSharding(mesh, P(*spec))

    def loss(params, x):
        w1, w2 = params
        h = jax.nn.relu(jax.lax.with_sharding_constraint(x @ w1, sh("data", "model")))
        h = jax.lax.with_sharding_constraint(h, sh("data", "model"))
        if pin_input:
            h = jax.lax.with_sharding_constraint(h, sh("data"))
        return jnp.sum(jax.lax.with_sharding_constraint(h @ w2, sh("data")) ** 2)

    step = jax.jit(jax.grad(loss), in_shardings=((sh(None, "model"), sh()), sh(("data", "model"))),
                   out_shardings=(sh(None, "model"), sh()))
    params = (jax.ShapeDtypeStruct((32, F), jnp.float32), jax.ShapeDtypeStruct((F, O), jnp.float32))
    hlo = step.lower(params, jax.ShapeDtypeStruct((B, 32), jnp.float32)).compile().as_text()
    return sorted((c.kind, c.bytes_per_device) for c in parse_collectives(hlo, (1, 8), ("data", "model")))


def test_what_xla_compiles_for_a_replicated_consumer_of_split_features(devices):
    # Both: the batch-split input gathered for the filter layer (16 x 32 x 4 B).
    x_gather = ("all-gather", 16 * 32 * 4)
    # Input pinned replicated (planner.runtime.export): XLA gathers the activation, 16 x 64 x 4 B,
    # and computes the weight gradient from it; nothing else. The cost model's choice.
    assert _collectives(pin_input=True) == sorted([x_gather, ("all-gather", 16 * 64 * 4)])
    # Not pinned: XLA contracts the split features locally, all-reduces the partial
    # outputs (16 x 4 x 4 B) and all-gathers the split weight gradient (64 x 4 x 4 B).
    assert _collectives(pin_input=False) == sorted([x_gather, ("all-reduce", 16 * 4 * 4), ("all-gather", 64 * 4 * 4)])
    # ... and keeps that choice where the weight gradient is the larger: 64 x 256 x 4 B
    # gathered against 16 x 64 x 4 B of activations (not the cheaper: hence the pin).
    assert ("all-gather", 64 * 256 * 4) in _collectives(pin_input=False, O=256)


class Head(nnx.Module):
    def __init__(self, rngs):
        self.fcs = nnx.List([nnx.Linear(32, 64, rngs=rngs), nnx.Linear(64, 8, rngs=rngs)])

    def __call__(self, x):
        return self.fcs[1](nnx.relu(self.fcs[0](x.reshape(x.shape[0], -1))))


@pytest.mark.slow
def test_validate_agrees_on_filter_then_replicated(devices):
    from planner.runtime.validation import fixed_plan, validate

    model = nnx.eval_shape(lambda: Head(nnx.Rngs(0)))
    x = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    plan = fixed_plan(model, x, (1, 8), strategies={"fcs/0": "filter", "relu": "filter", "fcs/1": "replicated"},
                      batch=16)
    report = validate(model, plan)
    assert all(r.ok for r in report.collectives), report.collectives
    by = {(r.kind, r.axes): r for r in report.collectives}
    # the input (16 x 32), fcs/0's split output (16 x 64) and the labels (16 int32)
    assert by[("all-gather", ("model",))].compiled_bytes == (16 * 32 + 16 * 64 + 16) * 4


@pytest.mark.slow
def test_splitbrain_plan_at_1x8_validates(devices):
    """SplitBrain's scheme on its VGG16 (splitbrain.md §1.2-1.4) at mesh 1x8: convs
    data-parallel, the FC layers and their ReLUs filter-split, the 10-way head (10 % 8
    != 0) replicated after a filter-split ReLU. Every collective within 5%."""
    from planner.models.flax_zoo import flax_model
    from planner.runtime.validation import fixed_plan, validate

    batch = 8
    model, x = flax_model("vgg16-cifar10-splitbrain", batch=batch)
    fc = {"classifier/0": "filter", "relu_13": "filter", "classifier/1": "filter", "relu_14": "filter",
          "classifier/2": "replicated"}
    plan = fixed_plan(model, x, (1, 8), strategies=fc, batch=batch, hardware="abci-v100")
    report = validate(model, plan)
    assert all(r.ok for r in report.collectives), report.collectives
    by = {(r.kind, r.axes): r for r in report.collectives}
    # L_M (8 samples x 8192), L_S twice (8 x 4096: before classifier/1 and the head), labels
    gathers = (8 * 8192 + 8 * 4096 + 8 * 4096) * 4 + 8 * 4
    assert by[("all-gather", ("model",))].compiled_bytes == gathers == by[("all-gather", ("model",))].predicted_bytes


def test_a_residual_adds_gradient_is_gathered_once_for_both_its_producers():
    # fc0 -> fc1, and add(fc0, fc1): the add runs batch-split (data), both producers replicated. Its
    # gradient is the gradient of each input, one tensor: gathered once for both (XLA computes it once),
    # 8 samples x 64 features x 4 B over m = 2; fc1 -> add's gather would be the same collective.
    b = GraphBuilder("residual", (64,))
    h0 = b.dense("fc0", b.input, 64)
    h1 = b.dense("fc1", h0, 64)
    b.dense("fc2", b.add("add", [h0, h1]), 4)
    g = b.build()
    choice = [Strategy.REPLICATED, Strategy.REPLICATED, Strategy.DATA, Strategy.DATA]
    recs = [r for r in plan_collectives(g, choice, 8, 1, 2) if r.phase == "backward"]
    assert [(r.kind, r.where, r.bytes_per_device) for r in recs] == [("all-gather", "fc0 -> add", 8 * 64 * 4)]
    # producers that take it in different layouts convert it each: gathered for fc0, all-to-all to fc1's
    # channels (a 1/m shard of the same bytes)
    split = [Strategy.REPLICATED, Strategy.FILTER, Strategy.DATA, Strategy.DATA]
    recs = [r for r in plan_collectives(g, split, 8, 1, 2) if r.phase == "backward" and r.where.endswith("-> add")]
    assert [(r.kind, r.where, r.bytes_per_device) for r in recs] == [
        ("all-gather", "fc0 -> add", 8 * 64 * 4), ("all-to-all", "fc1 -> add", 8 * 64 * 4 / 2)]
