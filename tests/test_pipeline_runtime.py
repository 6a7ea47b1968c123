"""Pipelined training on 8 CPU devices: the schedules as tables against
hand-written ones and their invariants; the executor's buffer slots
against a replay of the schedule; a small decoder on a 2 stages x 2 data x
2 model mesh trained three steps under GPipe and 1F1B against the unsharded
model; and what XLA compiles (the stage-to-stage collective-permutes)."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from planner.runtime import (
    SCHEDULE_NAMES,
    Chain,
    ChainParams,
    executor_tables,
    nnx_chain,
    pipeline_loss_and_grads,
    pipeline_mesh,
    pipeline_schedule,
    pipeline_training,
)
from planner.runtime._pipeline_schedule import BACKWARD, FORWARD, IDLE
from planner.runtime.hlo import parse_collectives

# -- schedules as tables -------------------------------------------------------------

# one row per stage, one column per tick: F<i> / B<i> the forward / backward of micro-batch i
HAND = {
    ("gpipe", 2, 3): ["F0 F1 F2 .  .  B2 B1 B0",
                      ".  F0 F1 F2 B2 B1 B0 . "],
    ("1f1b", 2, 3): ["F0 F1 .  B0 F2 B1 .  B2",
                     ".  F0 B0 F1 B1 F2 B2 . "],
    ("1f1b", 3, 4): ["F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3",
                     ".  F0 F1 .  B0 F2 B1 F3 B2 .  B3 . ",
                     ".  .  F0 B0 F1 B1 F2 B2 F3 B3 .  . "],
}


def _parse(rows: list[str]) -> tuple[np.ndarray, np.ndarray]:
    cells = [row.split() for row in rows]
    op = np.array([[{"F": FORWARD, "B": BACKWARD, ".": IDLE}[c[0]] for c in r] for r in cells]).T
    mb = np.array([[int(c[1:]) if c != "." else -1 for c in r] for r in cells]).T
    return op, mb


@pytest.mark.parametrize("key", sorted(HAND))
def test_schedule_tables_by_hand(key):
    schedule = pipeline_schedule(*key)
    op, mb = _parse(HAND[key])
    np.testing.assert_array_equal(schedule.op, op)
    np.testing.assert_array_equal(schedule.micro_batch, mb)


GRID = list(itertools.product(SCHEDULE_NAMES, [1, 2, 3, 4], [1, 2, 3, 5, 8]))


@pytest.mark.parametrize("name, stages, m", GRID)
def test_schedule_invariants(name, stages, m):
    s = pipeline_schedule(name, stages, m)
    when = {}
    for t, st in itertools.product(range(s.ticks), range(stages)):
        if s.op[t, st] != IDLE:
            key = (int(s.op[t, st]), st, int(s.micro_batch[t, st]))
            assert key not in when, f"{key} runs twice"
            when[key] = t
    assert set(when) == {(o, st, i) for o in (FORWARD, BACKWARD) for st in range(stages) for i in range(m)}
    for st, i in itertools.product(range(stages), range(m)):
        if st:
            assert when[(FORWARD, st, i)] > when[(FORWARD, st - 1, i)]
        if st + 1 < stages:
            assert when[(BACKWARD, st, i)] > when[(BACKWARD, st + 1, i)]
        assert when[(BACKWARD, st, i)] > when[(FORWARD, st, i)]
    assert s.ticks == 2 * (m + stages - 1)  # Narayanan et al. 2021 eq. 1: m + S - 1 slots each way
    expected = [m] * stages if name == "gpipe" else [min(stages - st, m) for st in range(stages)]
    np.testing.assert_array_equal(s.peak_stashed(), expected)


def _replay(s, tables):
    """Run the executor's buffer moves on labels: every arrival lands in a
    free slot, every forward and backward finds its micro-batch's
    activation (and cotangent) in the slot it reads."""
    held_act = [dict() for _ in range(s.stages)]  # slot -> micro-batch
    held_cot = [dict() for _ in range(s.stages)]
    for t in range(s.ticks):
        for st in range(s.stages):
            op, i = int(s.op[t, st]), int(s.micro_batch[t, st])
            arriving = (i if st == 0 and op == FORWARD else
                        int(s.micro_batch[t - 1, st - 1]) if st and t and s.op[t - 1, st - 1] == FORWARD else None)
            slot = int(tables.act_in[t, st])
            assert (slot >= 0) == (arriving is not None), (t, st)
            if arriving is not None:
                assert slot not in held_act[st] and slot < tables.act_slots
                held_act[st][slot] = arriving
            back = (int(s.micro_batch[t - 1, st + 1]) if st + 1 < s.stages and t and s.op[t - 1, st + 1] == BACKWARD
                    else None)
            slot = int(tables.cot_in[t, st])
            assert (slot >= 0) == (back is not None), (t, st)
            if back is not None:
                assert slot not in held_cot[st] and slot < tables.cot_slots
                held_cot[st][slot] = back
            if op != IDLE:
                assert held_act[st].get(int(tables.act_use[t, st])) == i
            if op == BACKWARD:
                del held_act[st][int(tables.act_use[t, st])]
                if st + 1 < s.stages:
                    assert held_cot[st].pop(int(tables.cot_use[t, st])) == i
    assert not any(held_act) and not any(held_cot)


@pytest.mark.parametrize("name, stages, m", GRID)
def test_executor_slots_hold_what_each_tick_reads(name, stages, m):
    s = pipeline_schedule(name, stages, m)
    tables = executor_tables(s)
    _replay(s, tables)
    # a stage holds its stashed activations plus at most the ones that arrived and wait for their forward
    assert s.peak_stashed().max() <= tables.act_slots <= s.peak_stashed().max() + 1


def test_unknown_schedule():
    with pytest.raises(ValueError, match="gpipe, 1f1b"):
        pipeline_schedule("interleaved", 2, 4)


# -- a chain of dense blocks, on 1, 2 and 4 stages ----------------------------------------

def _close(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-5)


def dense_chain(width=8, layers=4, key=0):
    """A chain of pure functions: a projection, residual tanh blocks, a linear head with a squared error."""
    k = jax.random.split(jax.random.key(key), 4)
    params = ChainParams({"w": jax.random.normal(k[0], (3, width)) / 2},
                         {"w": jax.random.normal(k[1], (layers, width, width)) / width ** 0.5,
                          "b": 0.1 * jax.random.normal(k[2], (layers, width))},
                         {"w": jax.random.normal(k[3], (width, 2)) / width ** 0.5})
    chain = Chain(lambda p, x: x @ p["w"], lambda p, h: h + jnp.tanh(h @ p["w"] + p["b"]),
                  lambda p, h, y: jnp.mean((h @ p["w"] - y) ** 2))
    return chain, params


@pytest.mark.parametrize("name, shape, data_axis", [
    *((n, shape, "data") for n in SCHEDULE_NAMES for shape in [(1, 4, 2), (2, 2, 2), (4, 2, 1)]),
    ("1f1b", (2, 2, 2), None)])  # the data axis automatic inside the stages
def test_pipelined_gradients_of_a_dense_chain(name, shape, data_axis):
    chain, params = dense_chain()
    x = jax.random.normal(jax.random.key(5), (24, 3))
    y = jax.random.normal(jax.random.key(6), (24, 2))

    def loss(p):
        h = jax.lax.scan(lambda h, bp: (chain.block(bp, h), None), chain.first(p.first, x), p.blocks)[0]
        return chain.head_loss(p.head, h, y)

    expected = jax.value_and_grad(loss)(params)
    got = jax.jit(pipeline_loss_and_grads(chain, pipeline_mesh(*shape), micro_batches=6, schedule=name,
                                          data_axis=data_axis))(params, x, y)
    _close(got, expected)


def test_1f1b_saves_the_compiled_memory_of_the_slots_it_does_not_hold():
    """XLA's temporary bytes under GPipe and 1F1B differ by exactly the
    activation slots the schedules' tables differ by, each one micro-batch's
    activation on one device."""
    chain, params = dense_chain(width=64)
    x, y = jnp.zeros((512, 3)), jnp.zeros((512, 2))
    mesh, m = pipeline_mesh(2, 2, 2), 8
    temp = {}
    for name in SCHEDULE_NAMES:
        step = jax.jit(pipeline_loss_and_grads(chain, mesh, micro_batches=m, schedule=name))
        temp[name] = step.lower(params, x, y).compile().memory_analysis().temp_size_in_bytes
    slots = {name: executor_tables(pipeline_schedule(name, 2, m)).act_slots for name in SCHEDULE_NAMES}
    assert (slots["gpipe"], slots["1f1b"]) == (8, 2)
    assert temp["gpipe"] - temp["1f1b"] == (slots["gpipe"] - slots["1f1b"]) * (512 // m // 2) * 64 * 4


# -- a small decoder ------------------------------------------------------------------

VOCAB, WIDTH, HEADS, SEQ, LAYERS, BATCH, MICRO = 32, 16, 4, 8, 4, 16, 4


class Embed(nnx.Module):
    def __init__(self, rngs):
        self.tok = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (SEQ, WIDTH)))

    def __call__(self, x):
        return self.tok(x) + self.pos[...]


class Block(nnx.Module):
    """Pre-LN: causal self-attention, then a 4x MLP, each with a residual."""

    def __init__(self, rngs):
        self.ln1, self.ln2 = nnx.LayerNorm(WIDTH, rngs=rngs), nnx.LayerNorm(WIDTH, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=HEADS, in_features=WIDTH, decode=False, rngs=rngs)
        self.up, self.down = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs), nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x), mask=nnx.make_causal_mask(jnp.ones(x.shape[:2])))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class Head(nnx.Module):
    def __init__(self, rngs):
        self.ln, self.out = nnx.LayerNorm(WIDTH, rngs=rngs), nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, x):
        return self.out(self.ln(x))


def cross_entropy(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def megatron(name, leaf):
    """Tensor parallel over 'model': heads split in attention, the MLP column- then row-parallel."""
    if name.endswith(("query/kernel", "key/kernel", "value/kernel")):
        return P(None, "model", None)
    if name.endswith(("query/bias", "key/bias", "value/bias")):
        return P("model", None)
    return {"attn/out/kernel": P("model", None, None), "up/kernel": P(None, "model"), "up/bias": P("model"),
            "down/kernel": P("model", None)}.get(name)


def recording_sgd(rate):
    """SGD whose state is the last gradient it applied (to compare gradients after a step)."""
    return optax.GradientTransformation(lambda p: jax.tree.map(jnp.zeros_like, p),
                                        lambda g, state, params=None: (jax.tree.map(lambda a: -rate * a, g), g))


@pytest.fixture(scope="module")
def decoder():
    rngs = nnx.Rngs(0)
    chain, params = nnx_chain(Embed(rngs), [Block(rngs) for _ in range(LAYERS)], Head(rngs), cross_entropy)
    x = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, VOCAB)
    y = jax.random.randint(jax.random.key(2), (BATCH, SEQ), 0, VOCAB)
    return chain, params, x, y


def unsharded_steps(chain, params, x, y, optimizer, steps):
    """The model's losses, gradients and parameters over ``steps`` steps on one device."""
    def loss(p):
        h = chain.first(p.first, x)
        h = jax.lax.scan(lambda h, bp: (chain.block(bp, h), None), h, p.blocks)[0]
        return chain.head_loss(p.head, h, y)

    @jax.jit
    def step(p, state):
        value, grads = jax.value_and_grad(loss)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state, out = optimizer.init(params), []
    for _ in range(steps):
        params, state, value = step(params, state)
        out.append((float(value), state, params))
    return out


@pytest.fixture(scope="module", params=SCHEDULE_NAMES)
def trained(request, decoder):
    """Three pipelined steps of ``decoder`` under one schedule, and the compiled step."""
    chain, params, x, y = decoder
    optimizer = recording_sgd(0.1)
    mesh = pipeline_mesh(2, 2, 2)
    step, p, state = pipeline_training(chain, params, optimizer, mesh, stages=2, micro_batches=MICRO,
                                       schedule=request.param, block_specs=megatron)
    compiled = step.lower(p, state, (x, y)).compile()
    out = []
    for _ in range(3):
        p, state, loss = compiled(p, state, (x, y))
        out.append((float(loss), jax.device_get(state), jax.device_get(p)))  # the next step donates them
    return request.param, mesh, compiled, out, p


@pytest.mark.slow
def test_pipelined_steps_equal_the_unsharded_model(trained, decoder):
    _, _, _, steps, _ = trained
    expected = unsharded_steps(*decoder, recording_sgd(0.1), 3)
    for (loss, grads, params), (loss_1, grads_1, params_1) in zip(steps, expected, strict=True):
        assert abs(loss - loss_1) <= 1e-5
        _close(grads, grads_1)
        _close(params, params_1)
    assert steps[2][0] < steps[0][0]


@pytest.mark.slow
def test_stage_parameters_keep_their_tensor_parallel_layout(trained):
    _, _, _, _, params = trained
    assert params.blocks["up"]["kernel"].sharding.spec == P("stage", None, "model")
    assert params.blocks["attn"]["query"]["kernel"].sharding.spec == P("stage", None, "model", None)
    assert params.blocks["ln1"]["scale"].sharding.spec == P("stage")


def _computations(hlo: str) -> dict[str, list[str]]:
    """The HLO module's computations: name -> instruction lines."""
    out, current = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif current is not None:
            current.append(line)
    return out


def _called(line: str) -> list[str]:
    names = re.findall(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)", line)
    for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
        names += [n.strip().lstrip("%") for n in group.split(",")]
    return names


def _reachable(comps: dict[str, list[str]], root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [c for line in comps.get(name, ()) for c in _called(line)]
    return seen


def _all_reduce_axes(comps, names, mesh) -> set:
    lines = [line for n in names for line in comps[n] if " all-reduce(" in line]
    return {c.axes for c in parse_collectives("\n".join(lines), tuple(mesh.devices.shape), mesh.axis_names)}


@pytest.mark.slow
def test_compiled_step_moves_activations_between_stages(trained):
    name, mesh, compiled, _, _ = trained
    hlo = compiled.as_text()
    permutes = [c for c in parse_collectives(hlo, tuple(mesh.devices.shape), mesh.axis_names)
                if c.kind == "collective-permute"]
    # one activation send forward and one cotangent send backward per tick, each stage s device -> the
    # device of stage s + 1 (s - 1) with the same data and model coordinates
    assert len(permutes) == 2
    ids = np.arange(8).reshape(2, 2, 2)
    forward = {(int(a), int(b)) for a, b in zip(ids[0].ravel(), ids[1].ravel())}
    assert {frozenset(c.groups) for c in permutes} == {frozenset(forward), frozenset((b, a) for a, b in forward)}
    assert all(c.axes == ("stage",) for c in permutes)
    # a micro-batch's activation on one device: (16 / 4 micro-batches / 2 data rows) x 8 x 16 float32
    assert all(c.bytes_per_device == BATCH // MICRO // 2 * SEQ * WIDTH * 4 for c in permutes)
    # both in the tick loop, which runs once per tick of the schedule
    comps = _computations(hlo)
    body = [n for n, lines in comps.items() if any(" collective-permute(" in line for line in lines)]
    assert len(body) == 1
    trips = [int(m.group(1)) for lines in comps.values() for line in lines if f"body=%{body[0]}" in line
             for m in [re.search(r'known_trip_count":\{"n":"(\d+)"', line)] if m]
    assert trips == [pipeline_schedule(name, 2, MICRO).ticks]
    # inside the loop only the model axis' all-reduces (the row-parallel layers' partial sums); the data
    # axis' gradient all-reduce runs once per step, after the loop, and nothing reduces over stages inside it
    inside = _reachable(comps, body[0])
    assert _all_reduce_axes(comps, inside, mesh) == {("model",)}
    assert ("data",) in _all_reduce_axes(comps, set(comps) - inside, mesh)


def test_blocks_made_by_nnx_vmap_stack_on_a_layer_axis():
    @nnx.split_rngs(splits=LAYERS)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def blocks(rngs):
        return Block(rngs)

    rngs = nnx.Rngs(0)
    chain, params = nnx_chain(Embed(rngs), blocks(nnx.Rngs(1)), Head(rngs), cross_entropy)
    one = nnx.split(nnx.eval_shape(lambda: Block(nnx.Rngs(0))), nnx.Param)[1]
    assert jax.tree.map(jnp.shape, params.blocks) == jax.tree.map(lambda a: (LAYERS,) + a.shape, one)
    x = jnp.zeros((BATCH, SEQ), jnp.int32)
    loss, grads = jax.eval_shape(pipeline_loss_and_grads(chain, pipeline_mesh(2, 2, 2), micro_batches=MICRO),
                                 params, x, x)
    assert loss.shape == () and jax.tree.map(jnp.shape, grads) == jax.tree.map(jnp.shape, params)


def test_bad_pipelines_say_what_to_change():
    chain, params = dense_chain(layers=3)
    x, y = jnp.zeros((24, 3)), jnp.zeros((24, 2))
    mesh = pipeline_mesh(2, 2, 2)
    with pytest.raises(ValueError, match="pipeline_mesh"):
        pipeline_loss_and_grads(chain, mesh, micro_batches=4, stages=4)
    with pytest.raises(ValueError, match="3 blocks do not cut into 2"):
        jax.eval_shape(pipeline_loss_and_grads(chain, mesh, micro_batches=4), params, x, y)
    chain, params = dense_chain(layers=4)
    with pytest.raises(ValueError, match="a batch of 24 does not split into 5"):
        jax.eval_shape(pipeline_loss_and_grads(chain, mesh, micro_batches=5), params, x, y)
    with pytest.raises(ValueError, match="data axis 'rows'"):
        pipeline_loss_and_grads(chain, mesh, micro_batches=4, data_axis="rows")
    rngs = nnx.Rngs(0)
    with pytest.raises(ValueError, match="identical"):
        nnx_chain(nnx.Linear(2, 2, rngs=rngs), [nnx.Linear(2, 2, rngs=rngs), nnx.Linear(2, 3, rngs=rngs)],
                  nnx.Linear(2, 2, rngs=rngs), cross_entropy)
    with pytest.raises(ValueError, match="only nnx.Param"):
        nnx_chain(nnx.Dropout(0.1, rngs=rngs), [nnx.Linear(2, 2, rngs=rngs)], nnx.Linear(2, 2, rngs=rngs),
                  cross_entropy)
    with pytest.raises(ValueError, match="needs 16 devices, got 8"):
        pipeline_mesh(2, 2, 4)
