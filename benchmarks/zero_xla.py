"""ZeRO in the program XLA compiles: the cost model's ZeRO lever
(``costmodels/levers.py``) against XLA, per device, on the local devices
(8 fake CPU devices by default).

For one model, batch and mesh, every layer runs ``data``; for each ZeRO
stage 0-3, every layer the cost model lets shard its state at that stage
does (``planner.runtime.export``'s ``zero_stages``), the sharded training step
is compiled (nothing runs), and side by side it prints, predicted and
compiled: parameter and optimizer-state bytes (from the shardings XLA gave
the step's arguments), total memory (``argument + output - alias + temp``,
state donated), and the collectives by kind and mesh axes (bytes per
device, as :mod:`planner.runtime.hlo` reads them). The prediction counts
the gradient all-reduce of lever-free layers, and for ZeRO layers their
gradient all-reduce (stage 1: the gradients stay whole) or reduce-scatter
(stages 2-3) and weight all-gathers (one for stages 1-2, two for stage 3).
On CPU, XLA lowers a reduce-scatter as an all-reduce of the whole buffer
plus a slice, and the prediction counts it so (as ``validate`` does).

With ``--train N`` it also trains the model (weights from ``nnx.Rngs(0)``,
random images and labels) ``N`` Adam steps under each stage and prints the
losses beside stage 0's (every layer data, no ZeRO) and their largest
relative difference.

    PYTHONPATH=. .venv/bin/python benchmarks/zero_xla.py [--model vgg16-cifar10] [--batch 64] [--mesh 4x2]
        [--train 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from xla_agreement import MODELS, build  # noqa: E402

from costmodels import (  # noqa: E402
    CostSettings,
    Strategy,
    cost_table,
    hardware_arrays,
    load_hardware,
    memory_per_device,
    one_hot,
)
from costmodels.levers import Lever, lever_menu, option_index  # noqa: E402
from planner.models.extraction import extract  # noqa: E402
from planner.runtime.export import (  # noqa: E402
    block_layouts,
    consumer_layouts,
    lower_training,
    make_mesh,
    producer_layouts,
    shard_training,
)
from planner.runtime.hlo import parse_collectives  # noqa: E402

COUNTER_BYTES = 4  # adam's step count


def predicted(graph, batch, d, m, stage):
    """(zero_stages per layer, params B, optimizer B, total B, collectives {(kind, axes): B}) per device."""
    a = graph.unpadded()
    n = graph.num_layers
    t = cost_table(graph.arrays, hardware_arrays(load_hardware("dgx-a100")), float(batch), float(d), float(m),
                   CostSettings(levers="zero", optimizer="adam"))
    menu = lever_menu("zero")
    feas = np.asarray(t.feasible)[:n]
    plain = option_index(Strategy.DATA, Lever(0, False), menu)
    want = option_index(Strategy.DATA, Lever(stage, False), menu)
    choice = np.where(feas[:, want], want, plain) if stage else np.full(n, plain)
    zero = {name: stage for name, c in zip(graph.names, choice, strict=True) if c == want and stage}
    P = d * m
    params = np.asarray(a.params, np.float64)
    div = lambda k: np.where(choice == want, P, 1.0) if stage >= k else 1.0  # noqa: E731
    p_bytes = float(np.sum(4.0 * params / div(3)))
    o_bytes = float(np.sum(2 * 4.0 * params / div(1))) + COUNTER_BYTES
    probs = one_hot(np.r_[choice, np.zeros(t.feasible.shape[0] - n, int)], t.feasible.shape[1])
    inputs = graph.input_bytes_per_sample * batch / P
    total = float(memory_per_device(t, probs)) + inputs + COUNTER_BYTES
    axes = ("data", "model") if m > 1 else ("data",)
    colls = defaultdict(float)
    levered = choice == want
    sharded_grads = levered if stage >= 2 else np.zeros(n, bool)  # stage 1: the gradients stay whole
    if stage >= 2:  # on CPU, XLA lowers it as an all-reduce of the whole buffer and a slice
        kind = "all-reduce" if jax.devices()[0].platform == "cpu" else "reduce-scatter"
        colls[(kind, axes)] += float(np.sum(4.0 * params[sharded_grads])) / (1 if kind == "all-reduce" else P)
    if stage:
        colls[("all-gather", axes)] += float(np.sum(4.0 * params[levered])) * (2 if stage == 3 else 1)
    colls[("all-reduce", axes)] += float(np.sum(4.0 * params[~sharded_grads]))
    return zero, p_bytes, o_bytes, total, dict(colls)


def compiled_costs(model, x, graph, mesh, zero):
    strategies = {name: "data" for name in graph.names}
    lowered, abstract = lower_training(model, strategies, mesh, optax.adam(1e-3), x,
                                       input_layouts=producer_layouts(graph, strategies),
                                       output_layouts=consumer_layouts(graph, strategies),
                                       blocks=block_layouts(graph, strategies), zero_stages=zero)
    compiled = lowered.compile()
    (state_sh, _, _), _ = compiled.input_shardings

    def part(tree, shs):
        return float(sum(np.prod(sh.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                         for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shs), strict=True)))

    ma = compiled.memory_analysis()
    total = float(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                  + ma.temp_size_in_bytes)
    colls = defaultdict(float)
    for c in parse_collectives(compiled.as_text(), tuple(mesh.devices.shape), mesh.axis_names):
        axes = tuple(a for a in (c.axes or ("?",)) if mesh.shape.get(a, 2) > 1)
        colls[(c.kind, axes)] += c.bytes_per_device
    return part(abstract.params, state_sh.params), part(abstract.opt_state, state_sh.opt_state), total, dict(colls)


def concrete(name: str):
    """The model of :func:`xla_agreement.build` with its weights (``nnx.Rngs(0)``)."""
    from flax import nnx

    from planner.models.flax_zoo import ResNet, flax_model

    if name.startswith("resnet-2222-"):
        return ResNet((2, 2, 2, 2), 10, rngs=nnx.Rngs(0))
    if name in ("vgg16-cifar10", "vgg16-cifar10-splitbrain"):
        return flax_model(name, abstract=False)[0]
    raise ValueError(f"--train supports the VGG16s and the ResNet, not {name!r}")


def train_losses(model, x, y, graph, mesh, zero, steps):
    """``steps`` Adam steps of the sharded training step; the losses."""
    strategies = {name: "data" for name in graph.names}
    step, state = shard_training(model, strategies, mesh, optax.adam(1e-4),
                                 input_layouts=producer_layouts(graph, strategies),
                                 output_layouts=consumer_layouts(graph, strategies),
                                 blocks=block_layouts(graph, strategies), zero_stages=zero)
    losses = []
    for _ in range(steps):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    return losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vgg16-cifar10", choices=MODELS)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mesh", default="4x2", help="d x m, e.g. 8x1")
    ap.add_argument("--train", type=int, default=0, help="also train this many steps under each stage")
    args = ap.parse_args(argv)
    d, m = (int(v) for v in args.mesh.split("x"))
    model, x = build(args.model, args.batch)
    graph = extract(model, x)
    mesh = make_mesh(d, m)
    print(f"{args.model}, batch {args.batch}, mesh {d}x{m}, every layer data, adam, float32; "
          f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices")
    mb = lambda v: f"{v / 1e6:9.3f}"  # noqa: E731
    for stage in range(4):
        zero, p_p, p_o, p_t, p_c = predicted(graph, args.batch, d, m, stage)
        c_p, c_o, c_t, c_c = compiled_costs(model, x, graph, mesh, zero)
        print(f"\nZeRO stage {stage}: {len(zero)} layers sharded")
        print(f"  {'MB per device':32s} {'predicted':>9s} {'compiled':>9s} {'ratio':>7s}")
        for label, p, c in (("parameters", p_p, c_p), ("optimizer state", p_o, c_o), ("total", p_t, c_t)):
            print(f"  {label:32s} {mb(p)} {mb(c)} {c / p if p else float('nan'):7.3f}")
        for key in sorted(set(p_c) | set(c_c)):
            p, c = p_c.get(key, 0.0), c_c.get(key, 0.0)
            label = f"{key[0]} over {'+'.join(key[1]) or '-'}"
            print(f"  {label:32s} {mb(p)} {mb(c)} {c / p if p else float('inf'):7.3f}")
    if args.train:
        weights = concrete(args.model)
        images = jax.random.normal(jax.random.key(1), x.shape, x.dtype)
        labels = jax.random.randint(jax.random.key(2), (x.shape[0],), 0, 10)
        print(f"\ntraining {args.train} Adam step(s) under each stage (random images and labels)")
        base = None
        for stage in range(4):
            zero = predicted(graph, args.batch, d, m, stage)[0]
            losses = train_losses(weights, images, labels, graph, mesh, zero, args.train)
            base = losses if base is None else base
            worst = max(abs(a / b - 1) for a, b in zip(losses, base, strict=True))
            print(f"  stage {stage}: losses {' '.join(f'{v:.6f}' for v in losses)}; "
                  f"largest relative difference from stage 0 {worst:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
