"""Small layer graphs, Flax models and random cost tables that several test
modules build the same way."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from costmodels import CostTable
from costmodels.strategies import NUM_STRATEGIES as S
from planner.ir.builder import GraphBuilder
from search.exact import minimum_memory

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
    return float(np.floor(lo + frac * (hi - lo))) + 0.5
