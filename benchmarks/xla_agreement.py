"""Does what the planner promises hold in the program XLA compiles? The memory-promise
grid, per device, on the local devices (8 fake CPU devices by default).

For every case of models x batches x meshes x memory limits it plans with
``planner.plan`` on that one mesh (dgx-a100 preset, adam, float32, for the
``cpu`` platform it is compiled on, whose memory margin the search keeps
free), compiles
the plan's sharded training step with :func:`planner.validate` (nothing
runs) and prints side by side: the plan (layers not ``data``, by strategy),
the limit it was made for, total memory per device predicted and compiled
(``argument + output - alias + temp``, state donated) and the error,
whether parameters + optimizer state (+ batch statistics, inputs, XLA's
argument bytes) are exact, the worst collective (kind, axes) error (XLA:CPU's
all-reduce + slice for a reduce-scatter counted as docs/validation.md says;
``unpred.``: XLA issued a kind or axes the plan does not have), ``fits``:
compiled total <= the plan's limit, and the seconds of the plan's search and
of its compile. ``--verify`` plans each case again with
``planner.plan(..., verify=True)`` (the compiler in the loop: one compile
per round) and prints its seconds and rounds beside the plan's search time.

* models: vgg16-cifar10, vgg16-cifar10-splitbrain, resnet-2222-64px (the
  zoo's bottleneck ResNet with 2-2-2-2 blocks, ResNet-18's block counts, at
  64x64, 10 classes) and cnn3d-32px (a small CosmoFlow-style 3-D CNN);
* batches 64 and 256 (global); meshes 8x1, 4x2, 2x4, 1x8;
* limits: ``none`` (the device's memory), ``tight`` = the smallest limit the
  planner reports feasible on that mesh (``InfeasibleMemoryError.required_bytes``:
  the smallest plan, the input batch and the platform's margin) + ``--slack``
  (2%), ``mid`` = halfway between tight and the limit the unlimited plan
  would need.

A plan met before (same model, batch, mesh and strategies: 'mid' and 'none'
often agree) is compiled once. Progress goes to stderr; rows and the
summary to stdout.

    PYTHONPATH=. python benchmarks/xla_agreement.py [--quick] [--verify] [--models a,b] [--batches 64,256]
        [--meshes 8x1,4x2] [--limits none,mid,tight] [--json PATH]

``--quick``: vgg16-cifar10, batch 64, meshes 4x2 and 2x4, limits none and
tight (the selection options override it). The header names the XLA:CPU
scheduler the programs were compiled with
(:func:`planner.runtime.validation.cpu_scheduler`); XLA
reads it from ``XLA_FLAGS`` once per process, so the other one is a second
run:

    XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false PYTHONPATH=. python benchmarks/xla_agreement.py

Every row (with its validation report) and the summary go to ``--json PATH``
(default ``benchmarks/results/xla_agreement.json``), which
``benchmarks/memory_models.py`` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import sys
import time
from collections import Counter

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

MODELS = ("vgg16-cifar10", "vgg16-cifar10-splitbrain", "resnet-2222-64px", "cnn3d-32px")
BATCHES = (64, 256)
MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))
LIMITS = ("none", "mid", "tight")
HARDWARE = "dgx-a100"
OPTIMIZER = "adam"
DEVICES = 8
PLATFORM = "cpu"  # the programs are compiled on CPU: plans keep the cpu platform's margin (planning.MEMORY_MARGIN)
TOTAL_RTOL = 0.10  # the memory promise: total memory within 10%
COMM_RTOL = 0.05
SHORT = {"filter": "f", "channel": "c", "spatial": "s", "replicated": "r"}
MEMORY_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"  # XLA:CPU's depth-first schedule


def build(name: str, batch: int):
    """``(abstract nnx module, input spec)`` for one of :data:`MODELS` (the
    ResNet at any ``resnet-2222-<N>px`` image size)."""
    from planner.models.flax_zoo import CosmoFlow, ResNet, flax_model

    if name in ("vgg16-cifar10", "vgg16-cifar10-splitbrain"):
        return flax_model(name, batch=batch)
    if name.startswith("resnet-2222-") and name.endswith("px") and name[12:-2].isdigit():  # e.g. resnet-2222-64px
        size = int(name[12:-2])
        model = nnx.eval_shape(lambda: ResNet((2, 2, 2, 2), 10, rngs=nnx.Rngs(0)))
        return model, jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)
    if name == "cnn3d-32px":
        convs = ((16, 3, 1, "SAME"), (32, 3, 1, "SAME"), (64, 3, 2, "SAME"), (64, 2, 1, "VALID"))
        model = nnx.eval_shape(lambda: CosmoFlow(convs, (256, 4), image_size=32, rngs=nnx.Rngs(0)))
        return model, jax.ShapeDtypeStruct((batch, 32, 32, 32, 4), jnp.float32)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


@contextlib.contextmanager
def _only_mesh(mesh):
    """Make ``planner.plan`` search ``mesh`` alone (for a ``plan`` without a
    ``mesh`` argument): its list of mesh shapes is ``[mesh]``."""
    from planner import planning

    original = planning.mesh_shapes
    planning.mesh_shapes = lambda *a, **k: [tuple(mesh)]
    try:
        yield
    finally:
        planning.mesh_shapes = original


def plan_on(graph, mesh, batch, limit, **extra):
    """``planner.plan`` on one mesh; ``limit`` None = the device's memory;
    ``extra``: further arguments of ``planner.plan`` (``verify``, ``flax_model``)."""
    import planner

    kw = {"devices": DEVICES, "hardware": HARDWARE, "batch": batch, "memory_limit": limit, "optimizer": OPTIMIZER,
          "platform": PLATFORM, **extra}
    if "mesh" in inspect.signature(planner.plan).parameters:
        return planner.plan(graph, mesh=tuple(mesh), **kw)
    with _only_mesh(mesh):
        return planner.plan(graph, **kw)


def tight_plan(graph, mesh, batch, minimum, slack):
    """The plan at ``minimum * (1 + slack)``; if the search finds nothing
    there, the slack is doubled (up to three times). ``(plan, slack used)``."""
    from planner.planning import InfeasibleMemoryError

    for _ in range(4):
        try:
            return plan_on(graph, mesh, batch, minimum * (1 + slack)), slack
        except InfeasibleMemoryError as e:
            minimum = max(minimum, e.required_bytes)
            slack *= 2
    return plan_on(graph, mesh, batch, minimum * (1 + slack)), slack


def summarise_plan(plan) -> tuple[int, int, str]:
    """(layers not data, layers, e.g. ``f12 r3``)."""
    counts = Counter(r.strategy for r in plan.layers)
    other = sum(v for k, v in counts.items() if k != "data")
    text = " ".join(f"{SHORT.get(k, k)}{counts[k]}" for k in ("filter", "channel", "spatial", "replicated")
                    if counts.get(k))
    return other, len(plan.layers), text or "-"


def worst_collective(report):
    """The collective row with the largest relative error: ``(error, row)``;
    error inf when XLA issued bytes the prediction lacks; ``(0, None)`` when
    there are no collectives."""
    worst, where = 0.0, None
    for r in report.collectives:
        if r.predicted_bytes > 0:
            err = abs(r.compiled_bytes - r.predicted_bytes) / r.predicted_bytes
        elif r.compiled_bytes > 0:
            err = math.inf
        else:
            continue
        if where is None or err > worst:
            worst, where = err, r
    return worst, where


def _fmt_err(e: float) -> str:
    return "unpred." if e == math.inf else f"{e:.1%}"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="vgg16-cifar10, batch 64, meshes 4x2 and 2x4, limits none, tight")
    ap.add_argument("--models", help=f"comma-separated, from {','.join(MODELS)}")
    ap.add_argument("--batches", help="comma-separated global batches (default 64,256)")
    ap.add_argument("--meshes", help="comma-separated DxM (default 8x1,4x2,2x4,1x8)")
    ap.add_argument("--limits", help="comma-separated, from none,mid,tight")
    ap.add_argument("--slack", type=float, default=0.02, help="tight = the smallest feasible limit x (1 + slack)")
    ap.add_argument("--verify", action="store_true",
                    help="also plan each case with planner.plan(..., verify=True) and print its compile time")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)

    models = args.models.split(",") if args.models else (["vgg16-cifar10"] if args.quick else list(MODELS))
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([64] if args.quick else list(BATCHES))
    meshes = ([tuple(int(v) for v in s.lower().split("x")) for s in args.meshes.split(",")] if args.meshes
              else ([(4, 2), (2, 4)] if args.quick else list(MESHES)))
    limits = args.limits.split(",") if args.limits else (["none", "tight"] if args.quick else list(LIMITS))
    for name in models:
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    for lim in limits:
        if lim not in LIMITS:
            ap.error(f"unknown limit {lim!r}; choose from {', '.join(LIMITS)}")
    for d, m in meshes:
        if d * m != DEVICES:
            ap.error(f"mesh {d}x{m} is not {DEVICES} devices")
    if jax.device_count() != DEVICES:
        ap.error(f"needs {DEVICES} devices, jax has {jax.device_count()}")

    import planner
    from costmodels import load_hardware
    from planner.planning import (
        MEMORY_MARGIN,
        InfeasibleMemoryError,
        memory_margin_bytes,
    )
    from planner.runtime.validation import cpu_scheduler, validate

    device_memory = load_hardware(HARDWARE).device.memory_bytes
    scheduler = cpu_scheduler()
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform} ({scheduler} scheduler); plans: "
          f"planner.plan on one mesh, {HARDWARE} (device memory {device_memory:,.0f} B), {OPTIMIZER}, float32")
    print(f"memory per device in MB (1e6 B); limits: none = device memory, tight = smallest feasible x "
          f"{1 + args.slack:g}, mid = halfway from tight to the unlimited plan's memory; "
          f"total = argument + output - alias + temp; fits = compiled total <= limit")
    header = (f"{'model':25} {'batch':>5} {'mesh':4} {'limit':5} {'limit MB':>9} {'not data':>8} {'strategies':14} "
              f"{'predicted':>10} {'compiled':>10} {'err':>7} {'act err':>8} {'state':5} "
              f"{'worst coll':>10} {'at (MB predicted/compiled)':40} {'fits':4} {'search s':>8} {'compile s':>9}"
              + (f" {'verify s':>8} {'rounds':>6}" if args.verify else ""))
    print(header, flush=True)

    rows: list[dict] = []
    compiled_cache: dict = {}
    start = time.perf_counter()
    for name in models:
        for batch in batches:
            model, x = build(name, batch)
            graph = planner.extract(model, x)
            for mesh in meshes:
                d, m = mesh
                t0 = time.perf_counter()
                print(f"# planning {name} batch {batch} mesh {d}x{m}", file=sys.stderr, flush=True)
                free = plan_on(graph, mesh, batch, None)
                try:  # the smallest limit that works, the platform's margin and the inputs included
                    plan_on(graph, mesh, batch, 1.0)
                    minimum = 1.0
                except InfeasibleMemoryError as e:
                    minimum = e.required_bytes
                # the unlimited plan's memory as a limit: with what the search keeps free
                free_limit = (free.memory_bytes_per_device + free.memory_margin_bytes
                              - memory_margin_bytes(free.memory_limit_bytes, PLATFORM)) / (1 - MEMORY_MARGIN[PLATFORM])
                plans = {}
                slack = args.slack
                if "tight" in limits or "mid" in limits:
                    plans["tight"], slack = tight_plan(graph, mesh, batch, minimum, args.slack)
                tight = plans["tight"].memory_limit_bytes if "tight" in plans else None
                if "mid" in limits:
                    mid = (tight + free_limit) / 2
                    plans["mid"] = plan_on(graph, mesh, batch, mid) if mid > tight else plans["tight"]
                plans["none"] = free
                parts = [f"smallest feasible {minimum:,.0f} B"]
                if tight is not None:
                    parts.append(f"tight {tight:,.0f} B (+{slack:.0%})")
                if "mid" in plans:
                    parts.append(f"mid {plans['mid'].memory_limit_bytes:,.0f} B")
                parts.append(f"unlimited plan {free.memory_bytes_per_device:,.0f} B")
                print(f"limits {name} batch {batch} mesh {d}x{m}: " + "; ".join(parts)
                      + f" ({time.perf_counter() - t0:.0f} s planning)", flush=True)
                for label in limits:
                    p = plans[label]
                    key = (name, batch, mesh, tuple((r.name, r.option) for r in p.layers))  # levers too
                    reused = key in compiled_cache
                    if not reused:
                        print(f"# compiling {name} batch {batch} mesh {d}x{m} limit {label}", file=sys.stderr,
                              flush=True)
                        t1 = time.perf_counter()
                        try:
                            compiled_cache[key] = (label, validate(model, p), time.perf_counter() - t1)
                        except Exception as e:  # noqa: BLE001 (a failure is a row, not the end of the grid)
                            compiled_cache[key] = (label, e, time.perf_counter() - t1)
                    first, report, secs = compiled_cache[key]
                    rows.append(_row(name, batch, mesh, label, p, minimum, report, secs, first if reused else None))
                    if args.verify:
                        rows[-1].update(_verified(graph, model, mesh, batch, None if label == "none" else
                                                  p.memory_limit_bytes))
                    _print_row(rows[-1])
    seconds = time.perf_counter() - start
    _summary(rows, len(compiled_cache), seconds)
    default = (models, batches, meshes, limits) == (list(MODELS), list(BATCHES), list(MESHES), list(LIMITS))
    quick = (models, batches, meshes, limits) == (["vgg16-cifar10"], [64], [(4, 2), (2, 4)], ["none", "tight"])
    write_results(args.json, __file__, "full grid" if default else "quick" if quick else "selected cases",
                  summary_of(rows, len(compiled_cache), seconds), rows, argv,
                  env={"XLA_FLAGS": MEMORY_SCHEDULER_FLAG} if scheduler == "memory" else None, cpu_scheduler=scheduler,
                  hardware=HARDWARE, optimizer=OPTIMIZER, slack=args.slack, device_memory_bytes=device_memory)
    return 0


def _verified(graph, model, mesh, batch, limit) -> dict:
    """The case planned again with the compiler in the loop: its rounds, its
    seconds (compiles and searches) and XLA's bytes of the plan it returned."""
    try:
        p = plan_on(graph, mesh, batch, limit, verify=True, flax_model=model)
    except ValueError as e:  # refused (InfeasibleMemoryError) or not compiled: a row, not the end of the grid
        return {"verify_error": f"{type(e).__name__}: {e}"}
    return {"verify_seconds": p.verify_seconds, "verify_rounds": p.verify_rounds,
            "verified_compiled_bytes": p.compiled_memory_bytes, "verified_search_seconds": p.seconds}


def _row(name, batch, mesh, label, plan, minimum, report, seconds, reused_from) -> dict:
    other, n, text = summarise_plan(plan)
    row = {
        "model": name, "batch": batch, "mesh": list(mesh), "limit": label,
        "limit_bytes": plan.memory_limit_bytes, "min_feasible_bytes": minimum,
        "plan_memory_bytes": plan.memory_bytes_per_device, "layers": n, "layers_not_data": other,
        "strategies": text, "reused_from": reused_from, "compile_seconds": seconds, "search_seconds": plan.seconds,
    }
    if isinstance(report, Exception):
        row["error"] = f"{type(report).__name__}: {report}"
        return row
    mem = {r.part: r for r in report.memory}
    tot, act = mem["total"], mem["activations and temporaries"]
    worst, where = worst_collective(report)
    row.update({
        "predicted_total_bytes": tot.predicted_bytes,
        "compiled_total_bytes": tot.compiled_bytes,
        "total_error": (tot.compiled_bytes - tot.predicted_bytes) / tot.predicted_bytes,
        "activations_error": ((act.compiled_bytes - act.predicted_bytes) / act.predicted_bytes
                              if act.predicted_bytes else None),
        "state_exact": all(mem[k].ok for k in ("parameters", "optimizer state", "batch statistics", "inputs",
                                               "arguments")),
        "worst_collective_error": None if worst == math.inf else worst,
        "worst_collective_unpredicted": worst == math.inf,
        "worst_collective": None if where is None else {
            "kind": where.kind, "axes": list(where.axes), "predicted_bytes": where.predicted_bytes,
            "compiled_bytes": where.compiled_bytes},
        "collectives_within": worst <= COMM_RTOL,
        "fits": tot.compiled_bytes <= plan.memory_limit_bytes,
        "report": report.to_dict(),
    })
    return row


def _print_row(r: dict) -> None:
    d, m = r["mesh"]
    lead = (f"{r['model']:25} {r['batch']:>5} {d}x{m:<2} {r['limit']:5} {_mb(r['limit_bytes']):>9} "
            f"{str(r['layers_not_data']) + '/' + str(r['layers']):>8} {r['strategies']:14}")
    if "error" in r:
        print(f"{lead} failed: {r['error'][:200]}", flush=True)
        return
    w = r["worst_collective"]
    err = math.inf if r["worst_collective_unpredicted"] else (r["worst_collective_error"] or 0.0)
    at = "-" if w is None or err == 0 else (f"{w['kind']}@{','.join(w['axes'])} "
                                            f"{_mb(w['predicted_bytes'])}/{_mb(w['compiled_bytes'])}")
    act = "-" if r["activations_error"] is None else f"{r['activations_error']:+.1%}"
    same = f"  (= {r['reused_from']})" if r["reused_from"] else ""
    times = f" {r['search_seconds']:>8.1f} {r['compile_seconds']:>9.1f}"
    if "verify_seconds" in r:
        times += f" {r['verify_seconds']:>8.1f} {r['verify_rounds']:>6}"
    elif "verify_error" in r:
        times += f" verify: {r['verify_error'][:120]}"
    print(f"{lead} {_mb(r['predicted_total_bytes']):>10} {_mb(r['compiled_total_bytes']):>10} "
          f"{r['total_error']:>+7.1%} {act:>8} {'exact' if r['state_exact'] else 'NO':5} {_fmt_err(err):>10} "
          f"{at:40} {'yes' if r['fits'] else 'NO':4}{times}{same}", flush=True)


def summary_of(rows: list[dict], compiled: int, seconds: float) -> dict:
    """The counts :func:`_summary` prints, and the range of the total memory's error."""
    ok = [r for r in rows if "error" not in r]
    errs = [r["total_error"] for r in ok]
    return {"cases": len(rows), "compiled": compiled, "failed": len(rows) - len(ok), "seconds": seconds,
            "fits": sum(r["fits"] for r in ok),
            "predicted_within_limit": sum(r["predicted_total_bytes"] <= r["limit_bytes"] for r in ok),
            "total_within": sum(abs(e) <= TOTAL_RTOL for e in errs),
            "collectives_within": sum(r["collectives_within"] for r in ok),
            "state_exact": sum(r["state_exact"] for r in ok),
            "smallest_total_error": min(errs, default=None), "largest_total_error": max(errs, default=None),
            "total_rtol": TOTAL_RTOL, "comm_rtol": COMM_RTOL}


def _summary(rows: list[dict], compiled: int, seconds: float) -> None:
    ok = [r for r in rows if "error" not in r]
    n = len(rows)
    print(f"summary: {n} cases, {compiled} compiled programs, {len(rows) - len(ok)} failed to compile, {seconds:.0f} s")
    print(f"fits the limit: {sum(r['fits'] for r in ok)} of {n}")
    print(f"predicted total (plan + inputs) within the limit: "
          f"{sum(r['predicted_total_bytes'] <= r['limit_bytes'] for r in ok)} of {n}")
    print(f"total memory within {TOTAL_RTOL:.0%}: {sum(abs(r['total_error']) <= TOTAL_RTOL for r in ok)} of {n}")
    print(f"every collective within {COMM_RTOL:.0%}: {sum(r['collectives_within'] for r in ok)} of {n}")
    print(f"parameters + optimizer state exact: {sum(r['state_exact'] for r in ok)} of {n}")
    over = [r for r in ok if not r["fits"]]
    for r in over:
        d, m = r["mesh"]
        print(f"  over the limit: {r['model']} batch {r['batch']} {d}x{m} {r['limit']}: compiled "
              f"{r['compiled_total_bytes']:,.0f} B > limit {r['limit_bytes']:,.0f} B "
              f"(+{r['compiled_total_bytes'] / r['limit_bytes'] - 1:.1%})")


if __name__ == "__main__":
    raise SystemExit(main())
