"""Small layer graphs that several test modules build the same way."""

from __future__ import annotations

from planner.builder import GraphBuilder


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
