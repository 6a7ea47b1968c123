"""Train a zoo model under a shardplan plan on one process or many.

One process (all local devices)::

    JAX_NUM_CPU_DEVICES=8 python examples/train_distributed.py --steps 3

Two processes of four CPU devices each, the same plan::

    python -m planner.launch --processes 2 --devices-per-process 4 -- \\
        examples/train_distributed.py --steps 3

Each process joins the run through ``jax.distributed`` (from the launcher's
or a SLURM job's environment), builds the plan's mesh with the model axis
inside a process, and feeds only its own rows of every global batch. The
synthetic data depends only on (seed, step, row), so any process count sees
the same global batches. Process 0 prints what the run is (model, devices,
processes, mesh), one line per step (loss, seconds) and a summary.
``--save`` / ``--restore`` write and read the
sharded state with Orbax; ``--out`` (process 0) writes the losses, the plan's
mesh and the compiled step's collectives, with which processes each crosses,
as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from planner.runtime import distributed


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", help="plan JSON file (default: plan here with --model/--hardware/--batch)")
    p.add_argument("--model", default="vgg16-cifar10")
    p.add_argument("--hardware", default="cpu-local")
    p.add_argument("--memory-limit", default=None)
    p.add_argument("--batch", type=int, default=8, help="global batch (when planning here)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--start-step", type=int, default=0, help="index of the first step (selects its data)")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--init-seed", type=int, default=0, help="weight seed")
    p.add_argument("--lr", type=float, default=1e-4, help="adam learning rate")
    p.add_argument("--save", help="write the state after the last step to this directory (Orbax)")
    p.add_argument("--restore", help="start from the state in this directory instead of fresh weights")
    p.add_argument("--out", help="process 0 writes losses and collectives here (JSON)")
    p.add_argument("--validate", action="store_true",
                   help="also compare the plan with XLA's compiled step (planner.validate), per collective "
                        "with whether it crossed processes")
    return p.parse_args(argv)


def _batch(seed: int, step: int, rows: slice, shape: tuple[int, ...], classes: int):
    """This process's rows of global batch ``step``: row r depends only on (seed, step, r)."""
    import numpy as np

    xs, ys = [], []
    for r in range(rows.start, rows.stop):
        rng = np.random.default_rng([seed, step, r])
        xs.append(rng.standard_normal(shape, dtype=np.float32))
        ys.append(rng.integers(0, classes))
    return np.stack(xs), np.asarray(ys, dtype=np.int32)


def _host_init(abstract, spec, seed: int):
    """The abstract zoo model with weights drawn on the host: He-normal kernels
    (std sqrt(2 / fan_in), He et al. 2015), zero biases. Every process draws
    the same weights, with no device program to compile (eager Flax init
    dispatches hundreds of small ones: seconds per run)."""
    import math

    import jax
    import numpy as np
    from flax import nnx

    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(seed)

    def draw(leaf):
        shape = tuple(leaf.shape)
        if len(shape) < 2:
            return np.zeros(shape, leaf.dtype)
        fan_in = math.prod(shape[:-1])
        return (rng.standard_normal(shape, dtype=np.float32) * math.sqrt(2.0 / fan_in)).astype(leaf.dtype)

    return nnx.merge(graphdef, jax.tree.map(draw, state)), spec


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.steps < 1:
        raise SystemExit("train_distributed: error: --steps must be at least 1")
    config = distributed.initialize()  # None on one process

    import jax
    import optax

    import planner
    from planner.models.flax_zoo import flax_model
    from planner.runtime.hlo import parse_collectives

    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def mark(what: str) -> None:
        timings[what] = round(time.perf_counter() - t0 - sum(timings.values()), 3)

    if args.plan:
        plan = planner.Plan.read(args.plan)
    else:
        plan = planner.plan(args.model, devices=jax.device_count(), hardware=args.hardware,
                            memory_limit=args.memory_limit, batch=args.batch)
    if plan.devices != jax.device_count():
        raise SystemExit(f"train_distributed: error: the plan is for {plan.devices} devices, "
                         f"this run has {jax.device_count()}")
    mesh = distributed.process_mesh(*plan.mesh)
    mark("plan")
    model, spec = _host_init(*flax_model(plan.model, batch=plan.batch), seed=args.init_seed)
    mark("model")
    # shard's default mesh on several processes is process_mesh's (model axis inside a process)
    step, state = planner.shard(model, plan, optax.adam(args.lr))
    if jax.tree.leaves(state)[0].sharding.mesh != mesh:
        raise SystemExit("train_distributed: error: planner.shard's default mesh is not the process mesh")
    mark("shard")
    if args.restore:
        state = distributed.restore_state(args.restore, state)
        mark("restore")

    rows = distributed.process_rows(plan.batch, mesh)
    lead = jax.process_index() == 0  # one line per step and a summary, from process 0 only

    def say(line: str) -> None:
        if lead:
            print(line, flush=True)

    off_data = sum(1 for s in plan.strategies.values() if s != "data")
    say(f"{plan.model} on {jax.device_count()} devices in {jax.process_count()} process(es), mesh "
        f"{plan.mesh[0]}x{plan.mesh[1]} (data x model), batch {plan.batch}, {off_data} of "
        f"{len(plan.strategies)} layers off data parallelism; this process feeds rows {rows.start}-{rows.stop - 1}")
    sample, classes = tuple(spec.shape[1:]), 10
    losses, step_seconds, compiled = [], [], None
    last = args.start_step + args.steps - 1
    for i in range(args.start_step, args.start_step + args.steps):
        x, y = _batch(args.seed, i, rows, sample, classes)
        x, y = distributed.global_batch(x, mesh), distributed.global_batch(y, mesh)
        if compiled is None:
            compiled = step.lower(state, x, y).compile()
            mark("compile")
        t = time.perf_counter()
        state, loss = compiled(state, x, y)
        losses.append(float(loss.addressable_data(0)))
        step_seconds.append(round(time.perf_counter() - t, 3))
        say(f"step {i}/{last}  loss {losses[-1]:.6f}  {step_seconds[-1]:.3f} s")
    mark("steps")
    if args.save:
        distributed.save_state(args.save, state)
        mark("save")

    try:
        hlo, hlo_error = parse_collectives(compiled.as_text(), plan.mesh, plan.axis_names), None
    except ValueError as e:  # an HLO format the parser does not know yet
        hlo, hlo_error = (), str(e)
    validation = None
    if args.validate:
        from planner.runtime.validation import validate

        report = validate(model, plan, mesh=mesh, optimizer=optax.adam(args.lr))
        validation = [{"kind": r.kind, "axes": list(r.axes), "ok": r.ok, "crosses_processes": r.crosses_processes,
                       "predicted_bytes": r.predicted_bytes, "compiled_bytes": r.compiled_bytes}
                      for r in report.collectives]
        mark("validate")
    if jax.process_index() == 0 and args.out:
        Path(args.out).write_text(json.dumps({
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "mesh": list(plan.mesh),
            "rows_of_process_0": [rows.start, rows.stop],
            "losses": losses,
            "collectives": [
                {"kind": c.kind, "axes": None if c.axes is None else list(c.axes), "bytes": c.bytes_per_device,
                 "crosses_processes": distributed.crosses_processes(c.groups, mesh)}
                for c in hlo
            ],
            "collectives_error": hlo_error,
            "validation": validation,
            "seconds": time.perf_counter() - t0,
            "timings_s": timings,
            "step_seconds": step_seconds,
            "launched_by": None if config is None else config.source,
        }, indent=1))
    steady = sorted(step_seconds[1:]) or step_seconds  # the first step also waits for the devices to warm up
    say(f"done: {args.steps} step(s), loss {losses[0]:.6f} -> {losses[-1]:.6f}, median step "
        f"{steady[len(steady) // 2]:.3f} s, compile {timings['compile']:.1f} s, {time.perf_counter() - t0:.1f} s in all"
        + (f"; {sum(r['ok'] for r in validation)}/{len(validation)} collectives as planned" if validation else "")
        + (f"; saved to {args.save}" if args.save else "") + (f"; wrote {args.out}" if args.out and lead else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
