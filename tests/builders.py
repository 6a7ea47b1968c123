"""Small layer graphs, Flax models, cost tables and brute-force oracles that
several test modules build the same way. Test modules share helpers only
through this module (tests/test_imports.py checks that none imports
another test module)."""

from __future__ import annotations

import itertools
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from costmodels import CostTable
from costmodels.strategies import NUM_STRATEGIES as S
from planner.ir.builder import GraphBuilder
from search import solve_dp
from search.exact import minimum_memory, solve_brute_limits
from search.problem import plan_memories, plan_memory, plan_times, run_terms

# --- Flax models: the tiny CNN, the tiny ResNet -------------------------------------------------

TINY_CNN_BATCH = 16  # the tiny CNN's global batch; input 16x16x3


class TinyCNN(nnx.Module):
    """conv 3->8, relu, 2x2 pool, conv 8->16, relu, 2x2 pool, batch norm, flatten, dense 256->32, relu, dense 32->16."""

    def __init__(self, rngs):
        self.convs = nnx.List([nnx.Conv(3, 8, (3, 3), rngs=rngs), nnx.Conv(8, 16, (3, 3), rngs=rngs)])
        self.bn = nnx.BatchNorm(16, use_running_average=False, rngs=rngs)
        self.fcs = nnx.List([nnx.Linear(16 * 4 * 4, 32, rngs=rngs), nnx.Linear(32, 16, rngs=rngs)])

    def __call__(self, x):
        for c in self.convs:
            x = nnx.max_pool(nnx.relu(c(x)), (2, 2), (2, 2))
        x = self.bn(x)
        x = x.reshape(x.shape[0], -1)
        return self.fcs[1](nnx.relu(self.fcs[0](x)))


def tiny_cnn():
    """The abstract tiny CNN and its input spec at :data:`TINY_CNN_BATCH`."""
    return (nnx.eval_shape(lambda: TinyCNN(nnx.Rngs(0))),
            jax.ShapeDtypeStruct((TINY_CNN_BATCH, 16, 16, 3), jnp.float32))


class Block(nnx.Module):
    """A basic residual block: conv/bn/relu, conv/bn, shortcut (1x1 conv/bn projection where the shape
    changes), add, relu."""

    def __init__(self, cin, cout, stride, rngs):
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(cout, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(cout, rngs=rngs)
        if stride != 1 or cin != cout:
            self.proj = nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
            self.proj_bn = nnx.BatchNorm(cout, rngs=rngs)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x):
        h = nnx.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = x if self.proj is None else self.proj_bn(self.proj(x))
        return nnx.relu(h + s)


class TinyResNet(nnx.Module):
    """(16, 16, 3) -> stem conv/bn/relu, identity block, stride-2 projection
    block, global mean, fc10."""

    def __init__(self, rngs):
        self.stem = nnx.Conv(3, 8, (3, 3), use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.blocks = nnx.List([Block(8, 8, 1, rngs), Block(8, 16, 2, rngs)])
        self.head = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.stem(x)))
        for blk in self.blocks:
            x = blk(x)
        return self.head(x.mean(axis=(1, 2)))


# A model factory module's source for ``shardplan validate <module>:make`` (the tiny CNN); the
# tests write it to a file and put that file's folder and tests/ on sys.path.
TINY_CNN_FACTORY = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from flax import nnx
    import builders as t
    def make():
        return t.tiny_cnn()
""")


# --- layer graphs built by hand -----------------------------------------------------------------

def tiny_oracle_graph(t_sample: float | None = 1e-3):
    """conv 3x3 2->4, relu, conv 3x3 4->4, max pool 2x2/2, flatten, dense 64->10 on 2x8x8.
    Per sample: conv1 x 128 y 256 w 72; relu 256/256; conv2 256/256 w 144;
    pool 256/64; dense 64/10 w 640. Σ|x| (no ReLU) 704, Σ|y| 586, Σ|w| 856."""
    b = GraphBuilder("tiny", (2, 8, 8))
    x = b.conv("conv1", b.input, 4, 3, bias=False)
    x = b.relu("relu", x)
    x = b.conv("conv2", x, 4, 3, bias=False)
    x = b.max_pool("pool", x, 2)
    x = b.flatten("flatten", x)
    b.dense("fc", x, 10, bias=False)
    return b.build(measured_time_per_sample_s=t_sample)


# --- random cost tables over the five strategies, and their edges and limits -------------------

L_PAD, E_PAD = 8, 16  # synthetic_table's default padding


def synthetic_table(seed: int, n: int, edges, *, overlap: float = 0.0, p_feasible: float = 0.7,
                    layers: int = L_PAD, edge_rows: int = E_PAD, levers: int = 1,
                    activation_scale: float = 1.0) -> CostTable:
    """A random cost table of ``n`` layers with the given edges, padded to
    ``layers`` rows and ``edge_rows`` edges, with ``levers`` lever settings
    per strategy (``S * levers`` options per layer, resharding by strategy:
    costmodels/levers.py). Times are positive floats; bytes are integers;
    the optimizer's update is half to all of the state, and
    ``activation_scale`` (< 1) shrinks activations and workspaces so that
    the optimizer phase of memory binds in some plans and not in others.
    Solvers are checked on it against brute force and each other
    (tests/test_search.py, tests/test_automl.py)."""
    rng = np.random.default_rng(seed)
    O = S * levers
    feas = rng.random((n, O)) < p_feasible
    feas[np.arange(n), rng.integers(0, O, n)] = True
    compute = rng.uniform(1e-3, 1e-2, (n, O))
    grad = rng.uniform(0, 5e-3, (n, O)) if overlap else np.zeros((n, O))
    gather = rng.uniform(0, 2e-3, (n, O)) if levers > 1 else np.zeros((n, O))
    state = rng.integers(0, 300, (n, O)).astype(float)
    act = rng.integers(0, 300, (n, O)).astype(float)
    work = rng.integers(1, 400, (n, O)).astype(float)
    e = len(edges)
    reshard = rng.uniform(0, 4e-3, (e, S, S)) * (rng.random((e, S, S)) < 0.8)
    update = np.floor(state * rng.uniform(0.5, 1.0, (n, O)))
    act, work = np.floor(act * activation_scale), np.maximum(np.floor(work * activation_scale), 1.0)

    def pad(x, rows, fill=0.0):
        x = np.asarray(x)
        return np.concatenate([x, np.full((rows - x.shape[0],) + x.shape[1:], fill, dtype=x.dtype)])

    src = np.array([u for u, _ in edges], dtype=np.int32).reshape(-1)
    dst = np.array([v for _, v in edges], dtype=np.int32).reshape(-1)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return CostTable(
        feasible=jnp.asarray(pad(feas, layers, True)),
        compute_s=f32(pad(compute, layers)),
        backward_compute_s=f32(pad(compute * 0.6, layers)),
        grad_sync_s=f32(pad(grad, layers)),
        weight_gather_s=f32(pad(gather, layers)),
        halo_s=f32(np.zeros((layers, O))),
        output_s=f32(np.zeros((layers, O))),
        state_bytes=f32(pad(state, layers)),
        update_bytes=f32(pad(update, layers)),
        activation_bytes=f32(pad(act, layers)),
        workspace_bytes=f32(pad(work, layers)),
        recompute_bytes=f32(np.zeros((layers, O))),  # recomputing options keep what they would (no runs)
        checkpoint_bytes=f32(np.zeros((layers, O))),
        reshard_s=f32(pad(reshard, edge_rows)),
        layer_mask=f32(pad(np.ones(n), layers)),
        edge_src=jnp.asarray(pad(src, edge_rows, 0), jnp.int32),
        edge_dst=jnp.asarray(pad(dst, edge_rows, 0), jnp.int32),
        edge_mask=f32(pad(np.ones(e), edge_rows)),
        edge_input_share=f32(pad(np.ones(e), edge_rows)),
        gradient_overlap=f32(overlap),
        memory_capacity_bytes=f32(1e12),
    )


def chain_edges(n: int, seed: int, shuffle: bool):
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    return [(int(order[i]), int(order[i + 1])) for i in range(n - 1)]


def dag_edges(n: int, seed: int):
    rng = np.random.default_rng(seed + 1)
    pairs = [(i, j) for i, j in itertools.combinations(range(n), 2) if rng.random() < 0.5]
    rng.shuffle(pairs)
    return pairs[:E_PAD]


def limit_between(p, seed: int) -> float:
    """A limit between 0.9 x the smallest memory and the largest, half a byte off any integer."""
    lo = minimum_memory(p).memory_bytes
    hi = max(float(np.sum(np.max(np.where(p.feasible, p.persistent_bytes, 0), axis=1)) + np.max(
        np.where(p.feasible, p.workspace_bytes, 0))), float(np.sum(np.max(np.where(p.feasible, p.optimizer_bytes, 0),
                                                                          axis=1))))
    frac = np.random.default_rng(seed + 2).uniform(-0.1, 1.0)
    return float(np.floor(max(lo + frac * (hi - lo), 0.9 * lo))) + 0.5  # never below 0.9 x the smallest


# --- runs of recomputing layers: tables by hand (menu "remat": K = 3, O = 15) -------------------
# option 0 keeps its activations, 1 recomputes them (remat), 2 recomputes them in the run of the layer
# before (remat+join)

HAND_ACT = np.array([100.0, 200.0, 300.0])  # saved activations without the lever
HAND_INPUT = np.array([50.0, 100.0, 200.0])  # each layer's input: what recomputing keeps
HAND_WORK = np.array([10.0, 20.0, 30.0])  # backward-step transient without the lever


def hand_table(edges, shares, act=HAND_ACT, inputs=HAND_INPUT, work=HAND_WORK) -> CostTable:
    """Layers with the activation, input and workspace bytes given (by
    default the three above); only options 0 (data), 1 (data+remat) and 2
    (data+remat+join) can run. A recomputing option keeps its input and
    holds its activations at its backward step (costmodels/levers.py)."""
    ACT, INPUT, WORK = (np.asarray(v, float) for v in (act, inputs, work))
    n, O = ACT.size, 15
    feasible = np.zeros((n, O), bool)
    feasible[:, :3] = True
    act, work, rec, ckpt = (np.zeros((n, O)) for _ in range(4))
    act[:, 0], work[:, 0] = ACT, WORK
    for o in (1, 2):
        act[:, o], work[:, o], rec[:, o], ckpt[:, o] = INPUT, WORK + ACT, ACT, INPUT
    z = jnp.zeros((n, O))
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    e = len(edges)
    return CostTable(
        feasible=jnp.asarray(feasible), compute_s=f(np.ones((n, O)) * 1e-3), backward_compute_s=z, grad_sync_s=z,
        weight_gather_s=z, halo_s=z, output_s=z, state_bytes=z, update_bytes=z, activation_bytes=f(act),
        workspace_bytes=f(work), recompute_bytes=f(rec), checkpoint_bytes=f(ckpt),
        reshard_s=jnp.zeros((e, 5, 5)), layer_mask=jnp.ones(n),
        edge_src=jnp.asarray([u for u, _ in edges], jnp.int32), edge_dst=jnp.asarray([v for _, v in edges], jnp.int32),
        edge_mask=jnp.ones(e), edge_input_share=f(shares), gradient_overlap=f(0.0), memory_capacity_bytes=f(1e9),
    )


HAND_CHAIN = hand_table([(0, 1), (1, 2)], [1.0, 1.0])  # three layers in a chain, the bytes above


# --- runs of recomputing layers: random tables --------------------------------------------------

def random_run_table(seed: int, n: int) -> CostTable:
    """Random bytes on a chain with a skip edge; recomputing costs more compute
    (its forward again), joining the same."""
    rng = np.random.default_rng(seed)
    act, inputs, work = (rng.integers(1, 100, n).astype(float) for _ in range(3))
    edges = [(i, i + 1) for i in range(n - 1)] + ([(0, n - 1)] if n > 2 else [])
    shares = [0.5 if v == n - 1 and n > 2 else 1.0 for _, v in edges]
    t = hand_table(edges, shares, act, inputs, work)
    compute = np.zeros((n, 15))
    compute[:, 0] = rng.uniform(1, 2, n)
    compute[:, 1] = compute[:, 2] = compute[:, 0] * rng.uniform(1.2, 1.5, n)
    return t._replace(compute_s=jnp.asarray(compute, jnp.float32))


def rich_table(seed: int, n: int, edges=None, state_most: int = 100, workspace_most: int = 100,
               update_share: float = 0.0):
    """A chain of ``n`` layers (or ``edges``) with five strategies under the
    "remat" menu (keep, remat, remat+join), about 60 % of the options
    runnable, random costs (state and workspace bytes below ``state_most``
    and ``workspace_most``; up to ``update_share`` of the state is the
    optimizer's update, which the backward phase does not hold, so that
    the optimizer phase can be the larger)."""
    rng = np.random.default_rng(seed)
    edges = [(i, i + 1) for i in range(n - 1)] if edges is None else edges
    t = hand_table(edges, [1.0] * len(edges), *(rng.integers(1, 100, n).astype(float) for _ in range(3)))
    O = 15
    feasible = rng.random((n, O)) < 0.6
    feasible[:, 0] = True
    recomputes = np.arange(O) % 3 > 0
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    compute = rng.uniform(1, 2, (n, O))
    state = rng.integers(0, state_most, (n, O))
    update = np.floor(state * np.random.default_rng([seed, 1]).uniform(0, update_share, (n, O)))
    return t._replace(
        feasible=jnp.asarray(feasible), compute_s=f(compute), state_bytes=f(state), update_bytes=f(update),
        activation_bytes=f(rng.integers(1, 200, (n, O))), workspace_bytes=f(rng.integers(1, workspace_most, (n, O))),
        recompute_bytes=f(np.where(recomputes, rng.integers(1, 150, (n, O)), 0)),
        checkpoint_bytes=f(np.where(recomputes, rng.integers(1, 80, (n, O)), 0)),
        reshard_s=f(rng.uniform(0, 0.5, (len(edges), 5, 5))),
    )


DAG_TABLE_EDGES = [(0, 1), (1, 2), (2, 3), (1, 4), (3, 5), (4, 5), (0, 5)]  # dag_table's six layers


def dag_table(seed: int, skip_reshard: bool):
    """rich_table on DAG_TABLE_EDGES (skip edges 1 -> 4, 3 -> 5, 0 -> 5), every
    layer able to keep, recompute or join under strategy 0, large
    checkpoints, random input shares; the skip edges reshard for free unless
    ``skip_reshard``."""
    t = rich_table(seed, 6, edges=DAG_TABLE_EDGES)
    skip = np.array([v != u + 1 for u, v in DAG_TABLE_EDGES])
    rng = np.random.default_rng(100 + seed)
    # every layer may keep, recompute or join (strategy 0), and checkpoints are large: skip credits matter
    feasible = np.asarray(t.feasible).copy()
    feasible[:, :3] = True
    ckpt = np.where(np.arange(15) % 3 > 0, rng.integers(50, 300, (6, 15)), 0)
    t = t._replace(feasible=jnp.asarray(feasible), checkpoint_bytes=jnp.asarray(ckpt, jnp.float32),
                   edge_input_share=jnp.asarray(rng.uniform(0.3, 1.0, len(DAG_TABLE_EDGES)), jnp.float32))
    if not skip_reshard:
        t = t._replace(reshard_s=jnp.where(jnp.asarray(skip)[:, None, None], 0.0, t.reshard_s))
    return t


# --- brute-force oracles on small problems ------------------------------------------------------

def every_plan(p):
    """Every plan of a small problem, with its time, memory and largest transient."""
    n = p.num_layers
    plans = np.array(list(itertools.product(*[np.flatnonzero(p.feasible[i]) for i in range(n)])))
    _, transient = run_terms(p, plans)
    peak = (p.workspace_bytes[np.arange(n), plans] + transient).max(axis=1)
    return plans, plan_times(p, plans), plan_memories(p, plans), peak


def assert_dp_matches_brute_force(p, full, count: int):
    """solve_dp at ``count`` limits from below brute force's smallest memory
    (``full``: its result without a limit) to above its fastest plan's: the
    same feasibility and time, proven, within the limit; without a plan,
    the smallest memory."""
    limits = np.linspace(full.min_memory_bytes * 0.99, full.memory_bytes * 1.02, count)
    for limit, brute in zip(limits, solve_brute_limits(p, limits), strict=True):
        dp = solve_dp(p, limit)
        assert dp.feasible == brute.feasible
        if brute.feasible:
            assert dp.exact and dp.time_s == pytest.approx(brute.time_s, rel=1e-9)
            assert plan_memory(p, dp.choice) == dp.memory_bytes <= limit
        else:
            assert dp.memory_bytes == pytest.approx(full.min_memory_bytes, rel=1e-12)
