"""Plan VGG16 (CIFAR-10) for the local devices, then train a few steps with
``planner.shard`` on JAX's own runtime.

On a laptop or CI machine, 8 CPU devices stand in for 8 accelerators:

    python examples/train_vgg16_cifar10.py --cpu-devices 8 --steps 3

On a machine with accelerators, the same script runs unchanged on all of
them (leave out ``--cpu-devices``). The data are random CIFAR-10-shaped
batches: the point is the sharded step, not the accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-devices", type=int, default=0, metavar="N",
                    help="run on N CPU devices instead of the accelerators (set before JAX starts)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--hardware", default="dgx-a100", help="hardware preset or file the plan is made for")
    ap.add_argument("--memory-limit", default=None, help="per-device limit, e.g. 100MB (default: the device's memory)")
    ap.add_argument("--plan-out", default=None, metavar="FILE", help="also write the plan JSON here")
    args = ap.parse_args(argv)
    if args.cpu_devices:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["JAX_NUM_CPU_DEVICES"] = str(args.cpu_devices)

    import jax
    import optax

    import planner

    devices = len(jax.devices())
    plan = planner.plan("vgg16-cifar10", devices=devices, hardware=args.hardware, batch=args.batch,
                        memory_limit=args.memory_limit)
    print(plan.summary())
    if args.plan_out:
        plan.write(args.plan_out)

    model, _ = planner.flax_model("vgg16-cifar10", abstract=False)  # weights from nnx.Rngs(0)
    train_step, state = planner.shard(model, plan, optax.adam(1e-3))

    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (args.batch, 32, 32, 3))
    y = jax.random.randint(ky, (args.batch,), 0, 10)
    for step in range(args.steps):
        state, loss = train_step(state, x, y)
        print(f"step {step}: loss {float(loss):.6f}")
    d, m = plan.mesh
    print(f"trained {args.steps} steps on {devices} {jax.devices()[0].platform} devices, mesh {d}x{m} (data x model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
