"""ZeRO in the program XLA compiles: the cost model's ZeRO lever
(``costmodels/levers.py``) against XLA, per device, on the local devices
(8 fake CPU devices by default).

For one model, batch and mesh, every layer runs ``data``; for each ZeRO
stage 0-3, every layer the cost model lets shard its state at that stage
does (``planner.runtime.export``'s ``zero_stages``), the sharded training step
is compiled (nothing runs), and side by side it prints, predicted and
compiled, what ``planner.validate`` reports for that plan
(``planner.runtime.validation.fixed_plan`` with ``data+zeroN`` options):
parameter and optimizer-state bytes (from the shardings XLA gave the
step's arguments), total memory (``argument + output - alias + temp``,
state donated), and the collectives by kind and mesh axes (bytes per
device). The prediction (``costmodels.plan_collectives``) counts the
gradient all-reduce of lever-free layers, and for ZeRO layers their
gradient all-reduce (stage 1: the gradients stay whole) or reduce-scatter
(stages 2-3) and weight all-gathers (one for stages 1-2, two for stage 3).
On CPU, XLA lowers a reduce-scatter as an all-reduce of the whole buffer
plus a slice, and ``validate`` counts it so.

With ``--train N`` it also trains the model (weights from ``nnx.Rngs(0)``,
random images and labels) ``N`` Adam steps under each stage and prints the
losses beside stage 0's (every layer data, no ZeRO) and their largest
relative difference.

    PYTHONPATH=. .venv/bin/python benchmarks/zero_xla.py [--model vgg16-cifar10] [--batch 64] [--mesh 4x2]
        [--train 2] [--json PATH]

The rows go to ``--json PATH`` (default ``benchmarks/results/zero_xla.json``).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _results import add_json_option, write_results  # noqa: E402
from xla_agreement import MODELS, build  # noqa: E402

from costmodels import (  # noqa: E402
    CostSettings,
    Strategy,
    cost_table,
    hardware_arrays,
    load_hardware,
)
from costmodels.levers import Lever, lever_menu, option_index  # noqa: E402
from planner.models.extraction import extract  # noqa: E402
from planner.runtime.export import (  # noqa: E402
    block_layouts,
    consumer_layouts,
    make_mesh,
    producer_layouts,
    shard_training,
)
from planner.runtime.validation import fixed_plan, validate  # noqa: E402

HARDWARE = "dgx-a100"  # the preset the plans are costed on (its times do not enter the comparison)


def zero_layers(graph, batch, d, m, stage):
    """Layer -> ``stage`` for every layer the cost model lets shard its state at
    that stage with every layer on ``data`` (none for stage 0)."""
    n = graph.num_layers
    t = cost_table(graph.arrays, hardware_arrays(load_hardware(HARDWARE)), float(batch), float(d), float(m),
                   CostSettings(levers="zero", optimizer="adam"))
    feasible = np.asarray(t.feasible)[:n, option_index(Strategy.DATA, Lever(stage, False), lever_menu("zero"))]
    return {name: stage for name, ok in zip(graph.names, feasible, strict=True) if ok and stage}


def stage_plan(model, x, graph, batch, d, m, stage):
    """The plan of every layer on ``data``, ZeRO ``stage`` where it can run (planner.fixed_plan)."""
    zero = zero_layers(graph, batch, d, m, stage)
    options = {name: f"data+zero{zero[name]}" if name in zero else "data" for name in graph.names}
    return fixed_plan(model, x, (d, m), strategies=options, batch=batch, optimizer="adam", hardware=HARDWARE)


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
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    d, m = (int(v) for v in args.mesh.split("x"))
    model, x = build(args.model, args.batch)
    graph = extract(model, x)
    mesh = make_mesh(d, m)
    print(f"{args.model}, batch {args.batch}, mesh {d}x{m}, every layer data, adam, float32; "
          f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices")
    mb = lambda v: f"{v / 1e6:9.3f}"  # noqa: E731
    stages = []
    for stage in range(4):
        plan = stage_plan(model, x, graph, args.batch, d, m, stage)
        report = validate(model, plan, mesh=mesh)
        print(f"\nZeRO stage {stage}: {len(plan.zero_stages)} layers sharded")
        print(f"  {'MB per device':32s} {'predicted':>9s} {'compiled':>9s} {'ratio':>7s}")
        rows = {r.part: r for r in report.memory}
        row = {"stage": stage, "layers_sharded": len(plan.zero_stages)}
        for label in ("parameters", "optimizer state", "total"):
            p, c = rows[label].predicted_bytes, rows[label].compiled_bytes
            print(f"  {label:32s} {mb(p)} {mb(c)} {c / p if p else float('nan'):7.3f}")
            key = label.replace(" ", "_")
            row.update({f"{key}_predicted_bytes": p, f"{key}_compiled_bytes": c})
        row["collectives"] = []
        for r in report.collectives:
            label = f"{r.kind} over {'+'.join(r.axes) or '-'}"
            p, c = r.predicted_bytes, r.compiled_bytes
            print(f"  {label:32s} {mb(p)} {mb(c)} {c / p if p else float('inf'):7.3f}")
            row["collectives"].append({"collective": label, "predicted_bytes": p, "compiled_bytes": c, "ok": r.ok})
        row["collectives_ok"] = all(x["ok"] for x in row["collectives"])  # validate's tolerance
        stages.append(row)
    if args.train:
        weights = concrete(args.model)
        images = jax.random.normal(jax.random.key(1), x.shape, x.dtype)
        labels = jax.random.randint(jax.random.key(2), (x.shape[0],), 0, 10)
        print(f"\ntraining {args.train} Adam step(s) under each stage (random images and labels)")
        base = None
        for stage in range(4):
            zero = zero_layers(graph, args.batch, d, m, stage)
            losses = train_losses(weights, images, labels, graph, mesh, zero, args.train)
            base = losses if base is None else base
            worst = max(abs(a / b - 1) for a, b in zip(losses, base, strict=True))
            print(f"  stage {stage}: losses {' '.join(f'{v:.6f}' for v in losses)}; "
                  f"largest relative difference from stage 0 {worst:.1e}")
            stages[stage].update({"losses": losses, "loss_difference_from_stage_0": worst})
    summary = {"model": args.model, "batch": args.batch, "mesh": [d, m], "train_steps": args.train,
               "total_compiled_over_predicted": {r["stage"]: r["total_compiled_bytes"] / r["total_predicted_bytes"]
                                                 for r in stages}}
    mode = "default" if (args.model, args.batch, args.mesh, args.train) == ("vgg16-cifar10", 64, "4x2", 0) else "custom"
    write_results(args.json, __file__, mode, summary, stages, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
