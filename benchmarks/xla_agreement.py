"""How closely the cost model's memory and communication agree with what XLA
compiles, per device, on the local devices (8 fake CPU devices by default).

For VGG16-CIFAR-10, a small ResNet (bottleneck blocks 1-1-1-1 at 64x64) and a
small 3-D CNN (CosmoFlow-style), under pure data parallelism, each per-layer
strategy alone (every layer that can run it; replicated elsewhere) and the
planner's own plan, on meshes 8x1, 4x2, 2x4 and 1x8, it prints side by side:
parameter + optimizer bytes (predicted == compiled?), total memory per device
(predicted, compiled, error), and collective bytes (predicted and compiled
sums, and the worst per-(kind, axes) error), from one run of
:func:`planner.validate`.

    PYTHONPATH=. python benchmarks/xla_agreement.py [--quick] [--batch 32]

``--quick``: VGG16-CIFAR-10 only, meshes 4x2 and 2x4.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from flax import nnx

MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))
STRATEGIES = ("data", "filter", "channel", "spatial", "replicated")


def models(batch: int, quick: bool):
    from planner.flax_zoo import CosmoFlow, ResNet, flax_model

    vgg, x = flax_model("vgg16-cifar10", batch=batch)
    yield "vgg16-cifar10", vgg, x
    if quick:
        return
    resnet = nnx.eval_shape(lambda: ResNet((1, 1, 1, 1), 10, rngs=nnx.Rngs(0)))
    yield "resnet-1111-64px", resnet, jax.ShapeDtypeStruct((batch, 64, 64, 3), jnp.float32)
    convs = ((16, 3, 1, "SAME"), (32, 3, 1, "SAME"), (64, 3, 2, "SAME"), (64, 2, 1, "VALID"))
    cnn3d = nnx.eval_shape(lambda: CosmoFlow(convs, (256, 4), image_size=32, rngs=nnx.Rngs(0)))
    yield "cnn3d-32px", cnn3d, jax.ShapeDtypeStruct((batch, 32, 32, 32, 4), jnp.float32)


def comm_error(report) -> tuple[float, float, float]:
    """(predicted sum, compiled sum, worst relative error over the predicted
    rows; inf when XLA issued a kind or axes the prediction does not have)."""
    p = sum(r.predicted_bytes for r in report.collectives)
    c = sum(r.compiled_bytes for r in report.collectives)
    worst = 0.0
    for r in report.collectives:
        if r.predicted_bytes > 0:
            worst = max(worst, abs(r.compiled_bytes - r.predicted_bytes) / r.predicted_bytes)
        elif r.compiled_bytes > 0:
            worst = float("inf")
    return p, c, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)
    import planner
    from planner.validation import fixed_plan, validate

    meshes = ((4, 2), (2, 4)) if args.quick else MESHES
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform}, batch {args.batch}, adam; "
          "memory per device, bytes; comm = collective bytes per device summed over kinds and axes")
    header = (f"{'model':18} {'mesh':5} {'plan':10} {'state exact':>11} {'mem predicted':>14} {'mem compiled':>13} "
              f"{'mem err':>8} {'comm predicted':>15} {'comm compiled':>14} {'worst row':>10}  failing rows")
    print(header)
    start = time.perf_counter()
    for name, model, x in models(args.batch, args.quick):
        graph = planner.extract(model, x)
        cases = [((d, m), s, None) for (d, m) in meshes for s in STRATEGIES if m > 1 or s == "data"]
        own = planner.plan(graph, devices=8, hardware="dgx-a100", batch=args.batch, optimizer="adam")
        cases.append((own.mesh, "planner", own))
        for mesh, label, plan in cases:
            if plan is None:
                try:
                    plan = fixed_plan(model, x, mesh, strategy=label, batch=args.batch)
                except ValueError as e:
                    print(f"{name:18} {mesh[0]}x{mesh[1]:<3} {label:10} skipped: {e}")
                    continue
            r = validate(model, plan)
            mem = {row.part: row for row in r.memory}
            exact = all(mem[k].ok for k in ("parameters", "optimizer state", "batch statistics", "arguments"))
            tot = mem["total"]
            err = (tot.compiled_bytes - tot.predicted_bytes) / tot.predicted_bytes
            p, c, worst = comm_error(r)
            bad = "; ".join(f"{row.kind}@{','.join(row.axes)} {row.predicted_bytes:,.0f}/{row.compiled_bytes:,.0f}"
                            for row in r.collectives if not row.ok)
            print(f"{name:18} {mesh[0]}x{mesh[1]:<3} {label:10} {'yes' if exact else 'NO':>11} "
                  f"{tot.predicted_bytes:>14,.0f} {tot.compiled_bytes:>13,.0f} {err:>+8.1%} {p:>15,.0f} {c:>14,.0f} "
                  f"{'unpred.' if worst == float('inf') else f'{worst:.1%}':>10}  {bad}", flush=True)
    print(f"# {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
