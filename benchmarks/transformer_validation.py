"""The zoo's full-size transformers on 8 CPU devices: plan, validate against
the compiled program, and train one sharded step.

For ViT-B/16 (batch 8 at 224x224) and GPT-2 small (batch 8 of 1,024
tokens): the plan ``planner.plan`` finds for 8 x dgx-a100 under a memory
limit that forces model parallelism, ``planner.validate`` of that plan
(XLA's compiled program against the plan's parameters, optimizer state,
inputs and collectives; nothing runs), and, with ``--train``, one step of
``planner.shard`` from the Flax twin's weights, its loss beside the
unsharded model's.

    PYTHONPATH=. .venv/bin/python benchmarks/transformer_validation.py [--train] [--models vit-b16,gpt2-small]

The 8 CPU devices share the host's memory: GPT-2 small's step needs 8 x
its ~4 GB per device (32 GB); ViT-B/16's about 5 GB in all.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import planner  # noqa: E402
from planner.models.flax_zoo import flax_model  # noqa: E402
from planner.runtime.validation import validate  # noqa: E402

LIMITS = {"vit-b16": "0.8GiB", "gpt2-small": "3GiB"}  # below pure data parallelism's memory on 8 devices
BATCH = 8


def run(name: str, train: bool) -> None:
    t0 = time.perf_counter()
    plan = planner.plan(name, devices=8, hardware="dgx-a100", batch=BATCH, memory_limit=LIMITS[name])
    counts = collections.Counter(plan.strategies.values())
    print(f"{name}: mesh {plan.mesh[0]}x{plan.mesh[1]}, strategies {dict(counts)}, "
          f"predicted {plan.iteration_s * 1e3:.2f} ms, {plan.memory_bytes_per_device / 1e9:.3f} GB "
          f"(planned in {time.perf_counter() - t0:.1f} s)")
    model, spec = flax_model(name, batch=BATCH)
    t0 = time.perf_counter()
    report = validate(model, plan, memory_rtol=0.5, activation_rtol=0.5)
    print(f"  validate ({time.perf_counter() - t0:.1f} s incl. compilation):")
    for r in report.memory:
        print(f"    {r.part:28s} predicted {r.predicted_bytes:15,.0f} B  compiled {r.compiled_bytes:15,.0f} B  "
              f"{'ok' if r.ok else 'DIFFERS'}")
    for r in report.collectives:
        print(f"    {r.kind:15s} {'+'.join(r.axes):12s} x{r.count:<3d} predicted {r.predicted_bytes:15,.0f} B  "
              f"compiled {r.compiled_bytes:15,.0f} B  {'ok' if r.ok else 'DIFFERS'}")
    if not train:
        return
    concrete, _ = flax_model(name, batch=BATCH, abstract=False)
    key = jax.random.key(0)
    if spec.dtype == jnp.int32:
        x = jax.random.randint(key, spec.shape, 0, 50257)
        y = jax.random.randint(jax.random.key(1), spec.shape, 0, 50257)
    else:
        x = jax.random.normal(key, spec.shape)
        y = jnp.arange(BATCH) % 1000
    want = float(optax.softmax_cross_entropy_with_integer_labels(concrete(x), y).mean())
    t0 = time.perf_counter()
    step, state = planner.shard(concrete, plan, optax.adam(1e-4))
    _, loss = step(state, x, y)
    loss = float(loss)
    print(f"  one sharded step ({time.perf_counter() - t0:.1f} s incl. compilation): loss {loss:.6f}, "
          f"unsharded {want:.6f}, relative difference {abs(loss / want - 1):.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", action="store_true", help="also run one sharded training step from real weights")
    ap.add_argument("--models", default="vit-b16,gpt2-small")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices, {os.cpu_count()} cpu(s)")
    for name in args.models.split(","):
        if name not in LIMITS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(LIMITS)}")
        run(name, args.train)


if __name__ == "__main__":
    main()
