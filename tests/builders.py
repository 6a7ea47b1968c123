"""Small layer graphs and Flax models that several test modules build the same way."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from planner.ir.builder import GraphBuilder

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
