"""The zoo's full-size transformers on 8 CPU devices: plan, validate against
the compiled program, and train one sharded step.

For ViT-B/16 (224x224 images) and GPT-2 small (1,024 tokens), one sample per
device: the plan ``planner.plan`` finds for 8 (or 4) x dgx-a100 under a memory
limit that forces model parallelism (for the ``cpu`` platform it is compiled
on, whose margin the search keeps free), ``planner.validate`` of that plan
(XLA's compiled program against the plan's parameters, optimizer state,
inputs and collectives; nothing runs), and, with ``--train``, one step of
``planner.shard`` from the Flax twin's weights, its loss beside the
unsharded model's.

    PYTHONPATH=. .venv/bin/python benchmarks/transformer_validation.py [--train] [--models vit-b16,gpt2-small]
        [--devices P] [--json PATH]

The CPU devices share the host's memory: on 8, GPT-2 small's step needs 8 x
its ~4 GB per device (32 GB), ViT-B/16's about 5 GB in all; ``--devices 4``
(a batch of 4) halves GPT-2's. The numbers go to ``--json PATH`` (default
``benchmarks/results/transformer_validation.json``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

def _devices(argv: list[str]) -> int:
    """--devices before jax starts (the CPU device count is fixed then)."""
    for i, a in enumerate(argv):
        if a == "--devices" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--devices=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    return 8


os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_devices(sys.argv)}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import planner  # noqa: E402
from planner.models.flax_zoo import flax_model  # noqa: E402
from planner.runtime.validation import validate  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

# below pure data parallelism's memory at one sample per device (on 8 and on 4 devices alike), with
# the cpu platform's margin (planner.plan_inputs.MEMORY_MARGIN) kept free: the plans are compiled on CPU
LIMITS = {"vit-b16": "1GiB", "gpt2-small": "3.75GiB"}
PLATFORM = "cpu"
DEVICES = (4, 8)


def run(name: str, train: bool, devices: int) -> dict:
    batch = devices  # one sample per device
    t0 = time.perf_counter()
    plan = planner.plan(name, devices=devices, hardware="dgx-a100", batch=batch, memory_limit=LIMITS[name],
                        platform=PLATFORM)
    counts = collections.Counter(plan.strategies.values())
    print(f"{name}: mesh {plan.mesh[0]}x{plan.mesh[1]}, strategies {dict(counts)}, "
          f"predicted {plan.iteration_s * 1e3:.2f} ms, {plan.memory_bytes_per_device / 1e9:.3f} GB "
          f"(planned in {time.perf_counter() - t0:.1f} s)")
    model, spec = flax_model(name, batch=batch)
    t0 = time.perf_counter()
    report = validate(model, plan, memory_rtol=0.5, activation_rtol=0.5)
    print(f"  validate ({time.perf_counter() - t0:.1f} s incl. compilation):")
    for r in report.memory:
        print(f"    {r.part:28s} predicted {r.predicted_bytes:15,.0f} B  compiled {r.compiled_bytes:15,.0f} B  "
              f"{'ok' if r.ok else 'DIFFERS'}")
    for r in report.collectives:
        print(f"    {r.kind:15s} {'+'.join(r.axes):12s} x{r.count:<3d} predicted {r.predicted_bytes:15,.0f} B  "
              f"compiled {r.compiled_bytes:15,.0f} B  {'ok' if r.ok else 'DIFFERS'}")
    mem = {r.part: r for r in report.memory}
    out = {"model": name, "devices": devices, "mesh": list(plan.mesh), "strategies": dict(counts),
           "iteration_s": plan.iteration_s, "memory_limit": LIMITS[name],
           "predicted_total_bytes": mem["total"].predicted_bytes, "compiled_total_bytes": mem["total"].compiled_bytes,
           "total_error": mem["total"].compiled_bytes / mem["total"].predicted_bytes - 1.0,
           "fits": bool(mem["limit"].ok),
           "state_exact": all(mem[k].ok for k in ("parameters", "optimizer state", "inputs", "arguments")),
           "collectives_ok": sum(r.ok for r in report.collectives), "collectives": len(report.collectives),
           "collectives_differ": [f"{r.kind} {'+'.join(r.axes)}" for r in report.collectives if not r.ok],
           "report": report.to_dict()}
    if not train:
        return out
    concrete, _ = flax_model(name, batch=batch, abstract=False)
    key = jax.random.key(0)
    if spec.dtype == jnp.int32:
        x = jax.random.randint(key, spec.shape, 0, 50257)
        y = jax.random.randint(jax.random.key(1), spec.shape, 0, 50257)
    else:
        x = jax.random.normal(key, spec.shape)
        y = jnp.arange(batch) % 1000
    want = float(optax.softmax_cross_entropy_with_integer_labels(concrete(x), y).mean())
    t0 = time.perf_counter()
    step, state = planner.shard(concrete, plan, optax.adam(1e-4))
    _, loss = step(state, x, y)
    loss = float(loss)
    print(f"  one sharded step ({time.perf_counter() - t0:.1f} s incl. compilation): loss {loss:.6f}, "
          f"unsharded {want:.6f}, relative difference {abs(loss / want - 1):.1e}")
    return {**out, "loss": loss, "unsharded_loss": want}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", action="store_true", help="also run one sharded training step from real weights")
    ap.add_argument("--models", default="vit-b16,gpt2-small")
    ap.add_argument("--devices", type=int, default=8, choices=DEVICES, help="CPU devices (default 8)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices, {os.cpu_count()} cpu(s)")
    rows = []
    for name in args.models.split(","):
        if name not in LIMITS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(LIMITS)}")
        rows.append(run(name, args.train, args.devices))
    summary = {"devices": args.devices, "train": args.train, "fits": sum(r["fits"] for r in rows),
               "state_exact": sum(r["state_exact"] for r in rows), "models": len(rows),
               "total_error": {r["model"]: r["total_error"] for r in rows}}
    mode = ("validate" if not args.train else "validate and train") + ("" if args.devices == 8 else f", {args.devices} devices")
    write_results(args.json, __file__, mode, summary, rows, argv)


if __name__ == "__main__":
    main()
