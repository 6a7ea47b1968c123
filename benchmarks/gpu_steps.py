"""Predicted against measured step time on one real accelerator.

With one device, two comparisons are possible, printed side by side:

1. **Whole training steps at P = 1.** The planner's plan of the model for one
   device (data parallel, nothing to communicate) is applied with
   ``planner.shard`` to the model's Flax twin and run as real training steps
   (adam, random data); the median measured step time is printed beside the
   plan's predicted ``iteration_s``.
2. **Per-layer shard shapes of a larger plan.** The planner's plan for ``P``
   devices (default 64) gives each layer a strategy on a ``d x m`` mesh; every
   layer's forward + backward at that shard shape is timed as a
   single-device kernel (``planner.profile_layers`` on the plan's mesh) and
   printed beside the plan's predicted per-layer compute time. Communication
   cannot be measured on one device and is not compared.

On the accelerator (the preset describes it; ``h200`` by default)::

    python benchmarks/gpu_steps.py
    python benchmarks/gpu_steps.py --models vgg16 resnet50 --hardware h200 --devices 64

A CPU smoke run (small model, small batch; checks the script, not the numbers)::

    JAX_PLATFORMS=cpu python benchmarks/gpu_steps.py --smoke

The numbers go to ``--json PATH`` (default ``benchmarks/results/gpu_steps.json``;
a ``--smoke`` run writes none unless ``--json`` is given: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402


def _median_step_s(step, state, x, y, warmup: int, repeats: int) -> tuple[float, float]:
    import jax

    for _ in range(warmup):
        state, loss = step(state, x, y)
    jax.block_until_ready(loss)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, loss = step(state, x, y)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), float(loss)


def whole_steps(name: str, hardware: str, batch: int, warmup: int, repeats: int) -> dict:
    """Part 1: the P = 1 plan run as real training steps."""
    import jax
    import optax

    import planner
    from planner.runtime.export import make_mesh

    plan = planner.plan(name, devices=1, hardware=hardware, batch=batch)
    model, example = planner.flax_model(name, abstract=False)
    step, state = planner.shard(model, plan, optax.adam(1e-3), mesh=make_mesh(1, 1, jax.devices()[:1]))
    shape = (batch, *example.shape[1:])
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, shape, example.dtype)
    y = jax.random.randint(ky, (batch,), 0, _classes(plan))
    measured, loss = _median_step_s(step, state, x, y, warmup, repeats)
    return {"model": name, "batch": batch, "predicted_s": plan.iteration_s, "measured_s": measured, "loss": loss}


def _classes(plan) -> int:
    """Output classes of the model: the last layer's output channels (from the zoo graph)."""
    from planner.models.zoo import get_model

    g = get_model(plan.model)
    return int(g.unpadded().out_channels[g.num_layers - 1])


def shard_kernels(name: str, hardware: str, devices: int, batch_per_device: int, warmup: int, repeats: int,
                  max_layers: int | None = None) -> dict:
    """Part 2: each layer at its shard shape under the P-device plan, timed on one device
    (the first ``max_layers`` profiled layers only, where given)."""
    import planner
    from planner.models.zoo import get_model

    plan = planner.plan(name, devices=devices, hardware=hardware, batch_per_device=batch_per_device)
    graph = get_model(name)
    layers = None
    if max_layers is not None:
        from planner.calibrate.profile import PROFILED_KINDS

        kinds = dict(zip(graph.names, graph.unpadded().kind, strict=True))
        layers = [r.name for r in plan.layers if int(kinds[r.name]) in PROFILED_KINDS][:max_layers]
    prof = planner.profile_layers(graph, plan.batch, max_devices=devices, warmup=warmup, repeats=repeats,
                                  meshes=[plan.mesh], layers=layers)
    chosen = plan.strategies
    measured = {t.layer: t.seconds for t in prof.timings if t.strategy == chosen[t.layer] and t.mesh == plan.mesh}
    rows = [(r.name, r.kind, r.strategy, r.compute_s, measured[r.name]) for r in plan.layers if r.name in measured]
    return {"model": name, "devices": devices, "mesh": plan.mesh, "batch": plan.batch, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vgg16", "resnet50"])
    ap.add_argument("--hardware", default="h200", help="preset describing this accelerator")
    ap.add_argument("--batch", type=int, default=32, help="batch of the P = 1 steps")
    ap.add_argument("--devices", type=int, default=64, help="P of the plan whose shard shapes are timed")
    ap.add_argument("--batch-per-device", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--smoke", action="store_true",
                    help="vgg16-cifar10, batch 8, 8 devices, 1 repeat, part 2 on its first 3 layers (CPU check)")
    add_json_option(ap, __file__, note="; with --smoke none unless given")
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    if args.smoke and not any(a == "--json" or a.startswith("--json=") for a in given):
        args.json = None
    if args.smoke:
        args.models, args.batch, args.devices, args.batch_per_device = ["vgg16-cifar10"], 8, 8, 2
        args.warmup, args.repeats = 1, 1
    max_layers = 3 if args.smoke else None

    import jax

    dev = jax.devices()[0]
    print(f"jax {jax.__version__}, device {dev.platform} ({dev.device_kind}), hardware preset {args.hardware}")
    print("\n1. whole training steps at P = 1 (adam, random data), median of", args.repeats)
    print(f"{'model':16s} {'batch':>5s} {'predicted ms':>13s} {'measured ms':>12s} {'measured/predicted':>19s}")
    steps, layers = [], []
    for name in args.models:
        r = whole_steps(name, args.hardware, args.batch, args.warmup, args.repeats)
        steps.append({**r, "measured_over_predicted": r["measured_s"] / r["predicted_s"]})
        print(f"{name:16s} {r['batch']:5d} {r['predicted_s'] * 1e3:13.3f} {r['measured_s'] * 1e3:12.3f} "
              f"{r['measured_s'] / r['predicted_s']:19.3f}")
    print(f"\n2. per-layer shard shapes of the {args.devices}-device plan, timed on this one device "
          "(forward + backward compute only)")
    for name in args.models:
        r = shard_kernels(name, args.hardware, args.devices, args.batch_per_device, args.warmup, args.repeats,
                          max_layers)
        d, m = r["mesh"]
        print(f"{name}: mesh {d}x{m}, global batch {r['batch']}")
        print(f"  {'layer':24s} {'kind':12s} {'strategy':10s} {'predicted ms':>13s} {'measured ms':>12s} {'ratio':>7s}")
        ratios = []
        for layer, kind, strategy, pred, meas in r["rows"]:
            ratio = meas / pred if pred > 0 else float("nan")
            ratios.append(ratio)
            print(f"  {layer:24s} {kind:12s} {strategy:10s} {pred * 1e3:13.4f} {meas * 1e3:12.4f} {ratio:7.2f}")
        total_p = sum(row[3] for row in r["rows"])
        total_m = sum(row[4] for row in r["rows"])
        finite = [x for x in ratios if x == x]
        print(f"  total compute: predicted {total_p * 1e3:.3f} ms, measured {total_m * 1e3:.3f} ms, "
              f"ratio {total_m / total_p:.3f}; per-layer ratio median {statistics.median(finite):.2f}, "
              f"min {min(finite):.2f}, max {max(finite):.2f} over {len(finite)} layers")
        layers.append({"model": name, "mesh": [d, m], "batch": r["batch"], "predicted_s": total_p,
                       "measured_s": total_m, "measured_over_predicted": total_m / total_p,
                       "layer_ratio_median": statistics.median(finite), "layer_ratio_min": min(finite),
                       "layer_ratio_max": max(finite), "layers": len(finite),
                       "rows": [dict(zip(("layer", "kind", "strategy", "predicted_s", "measured_s"), row, strict=True))
                                for row in r["rows"]]})
    summary = {"device": f"{dev.platform} ({dev.device_kind})", "hardware": args.hardware, "devices": args.devices,
               "shard_kernels": [{k: v for k, v in x.items() if k != "rows"} for x in layers]}
    write_results(args.json, __file__, "smoke" if args.smoke else "default", summary, steps, argv, shard_kernels=layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
