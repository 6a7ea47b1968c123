"""Choose ResNet stage widths that maximise a FLOP-based capacity proxy under
an iteration-time budget on 64 GPUs, with gradients through
``planner.cost_fn`` (the best plan's iteration time, smoothed over the
strategy menu and the mesh shapes).

    python examples/automl_width_search.py                 # ResNet-50 stages, 64 x A100
    python examples/automl_width_search.py --steps 3 --tiny  # a seconds-long smoke run

The variables are the log width multipliers of the four stages; the loss is
``-log(forward FLOPs) + weight * relu(time / budget - 1)**2`` (Adam). The
budget defaults to the predicted iteration time of the standard ResNet-50
(all multipliers 1), so the search trades width between stages at equal
speed. At the end the widths are rounded to multiples of 8 channels and the
rounded network is planned exactly (``planner.plan_many``).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from planner.automl import PlanConfig, cost_fn, plan_many
from planner.automl.parametric import ArchParams, total_forward_flops
from planner.automl.templates import resnet_parametric, resnet_template


def _fmt(x) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in np.asarray(x)) + "]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--hardware", default="dgx-a100")
    ap.add_argument("--batch-per-device", type=int, default=32)
    ap.add_argument("--budget-ms", type=float, default=None, help="iteration-time budget (default: ResNet-50's)")
    ap.add_argument("--start", type=float, default=0.5, help="initial width multiplier of every stage")
    ap.add_argument("--learning-rate", type=float, default=0.05)
    ap.add_argument("--tiny", action="store_true", help="a small ResNet on 8 devices (for tests)")
    args = ap.parse_args(argv)
    depths, base, res, classes, devices = (3, 4, 6, 3), (64, 128, 256, 512), 224, 1000, args.devices
    if args.tiny:
        depths, base, res, classes, devices = (1, 1, 1, 1), (8, 16, 32, 64), 32, 10, 8
    graph = resnet_parametric(depths, base, resolution=res, num_classes=classes, channel_multiple=8)
    cf = cost_fn(graph, args.hardware, devices, temperature=0.01)
    batch = jnp.float32(args.batch_per_device * devices)
    params = lambda u: ArchParams(jnp.exp(u), jnp.float32(1.0), batch)
    base_cost = cf(params(jnp.zeros(len(depths))))
    budget = float(base_cost.exact_time_s) if args.budget_ms is None else args.budget_ms / 1e3
    print(f"{len(depths)}-stage ResNet {depths}, base widths {base}, {devices} x {args.hardware}, "
          f"batch {int(batch)}; budget {budget * 1e3:.3f} ms/iteration")

    def loss(u):
        c = cf(params(u))
        flops = total_forward_flops(graph(params(u)))
        return -jnp.log(flops) + 100.0 * jnp.square(jax.nn.relu(c.time_s / budget - 1.0)), (c, flops)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    opt = optax.adam(args.learning_rate)
    u = jnp.full(len(depths), float(np.log(args.start)))
    state = opt.init(u)
    for i in range(args.steps):
        (_, (c, flops)), g = step(u)
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"step {i:4d}  widths {_fmt(np.exp(np.asarray(u)))}  "
                  f"time {float(c.time_s) * 1e3:.3f} ms (exact {float(c.exact_time_s) * 1e3:.3f})  "
                  f"GFLOPs/sample {float(flops) / 1e9:.3f}")
        updates, state = opt.update(g, state, u)
        u = optax.apply_updates(u, updates)

    mult = np.exp(np.asarray(u))
    channels = [max(8, round(b * w / 8) * 8) for b, w in zip(base, mult, strict=True)]
    print(f"chosen width multipliers {_fmt(mult)} -> stage widths {channels} (multipliers of {list(base)})")
    model = resnet_template(depths, channels, resolution=res, num_classes=classes, name="resnet-searched")
    out = plan_many([PlanConfig(model, devices, args.hardware, batch=int(batch))])
    if not out.feasible[0]:
        print("no plan of the chosen network fits the device memory")
        return 1
    d, m = out.mesh[0]
    kinds = {}
    for s in out.strategies(0).values():
        kinds[s] = kinds.get(s, 0) + 1
    print(f"plan: mesh {d}x{m} (data x model), {out.iteration_s[0] * 1e3:.3f} ms/iteration "
          f"(budget {budget * 1e3:.3f}), {out.memory_bytes_per_device[0] / 1e9:.2f} GB/device, "
          f"{'exact optimum' if out.certified[0] else 'planner.plan'}; strategies {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
