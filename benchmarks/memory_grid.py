"""Does a plan made for a memory limit fit that limit once XLA compiles it?
Per-device memory predicted by the cost model against what XLA compiled,
per part, over a grid of models, batches, meshes and memory limits, on the
local devices (8 fake CPU devices by default).

For each model (VGG16-CIFAR-10, its SplitBrain variant, a ResNet with
bottleneck blocks 2-2-2-2 at 32x32, a small 3-D CNN), batch and mesh, it
plans three times on that mesh: without a limit, at ``mid`` (halfway between
the smallest memory any plan reaches and the unlimited plan's memory) and at
``tight`` (just above the smallest limit any plan fits, margin included),
each as :func:`planner.plan` would (the limit less the CPU margin
``planner.planning.MEMORY_MARGIN`` and the input batch; ``--no-margin``
leaves the margin out, to measure the model), and
compiles each plan with :func:`planner.validate`. Printed per case: the
limit the plan was made for, the predicted and compiled total (XLA
``argument + output - alias + temp``) and the error, whether the compiled
program fits the limit, and the parts: arguments (parameters, optimizer
state, buffers, inputs: exact) and the rest (gradients, the optimizer's
update, saved activations, the largest workspace and, on CPU, the max-pool
expansion; XLA ``output - alias + temp``).

    PYTHONPATH=. python benchmarks/memory_grid.py [--models vgg16-cifar10] [--batches 256] [--meshes 4x2,2x4]
        [--limits none,mid,tight] [--breakdown DIR] [--json PATH]

``--breakdown DIR`` also dumps each compiled program's buffer assignment
(XLA ``--xla_dump_to``) under DIR and prints the live set at XLA's peak by
the op that made each buffer (the ``Stack trace breakdown`` of XLA's
live-range dump), the top entries. The rows and a summary go to ``--json PATH``
(default ``benchmarks/results/memory_grid.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402


def _set_flags(dump: str | None) -> None:
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    if dump:
        flags += f" --xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*"
    os.environ["XLA_FLAGS"] = flags.strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


MODELS = ("vgg16-cifar10", "vgg16-cifar10-splitbrain", "resnet-2222-32px", "cnn3d-32px")
MESHES = ((8, 1), (4, 2), (2, 4), (1, 8))


def build(name: str, batch: int):
    """The grid's models, built as benchmarks/xla_agreement.py builds them."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from xla_agreement import build as build_model

    return build_model(name, batch)


def mesh_plans(graph, model, x, mesh, batch, limits, hardware="dgx-a100", margin=True):
    """(label, limit bytes or None, Plan) for each limit label on one mesh,
    searched as :func:`planner.plan` searches (margin included)."""
    import dataclasses
    import math

    import numpy as np

    from costmodels import CostSettings, cost_table, hardware_arrays, load_hardware
    from planner.planning import MEMORY_MARGIN, memory_margin_bytes
    from planner.runtime.validation import fixed_plan
    from search import discrete_problem, minimum_memory, solve

    hw = load_hardware(hardware)
    d, m = mesh
    table = cost_table(graph.arrays, hardware_arrays(hw, "float32"), float(batch), float(d), float(m),
                       CostSettings(optimizer="adam"))
    problem = discrete_problem(table)
    free = solve(table, None)
    low = minimum_memory(problem).memory_bytes
    inputs = (math.prod(graph.input_shape) * 4.0 + 4.0) * batch / (d * m)  # kept free by planner.plan too
    f = MEMORY_MARGIN["cpu"] if margin else 0.0
    out = []
    for label in limits:
        if label == "none":
            limit = None
        elif label == "tight":
            limit = low * 1.001
        else:
            limit = low + 0.5 * (free.memory_bytes - low)
        if limit is None:
            sol = free
            made_for = float(hw.device.memory_bytes)
            kept = f * made_for + inputs
        else:
            # what planner.plan does: the user's limit less the platform's margin and the inputs
            made_for = (limit + inputs) / (1.0 - f) * (1 + 1e-9) if label == "tight" else limit
            kept = (memory_margin_bytes(made_for, "cpu") if margin else 0.0) + inputs
            sol = solve(table, made_for - kept)
            if not sol.feasible:
                out.append((label, made_for, None))
                continue
        mapping = dict(zip(graph.names, sol.strategies, strict=True))
        p = fixed_plan(model, x, mesh, strategies=mapping, batch=batch, optimizer="adam", hardware=hardware)
        p = dataclasses.replace(p, memory_limit_bytes=made_for, memory_margin_bytes=kept, platform="cpu")
        assert np.isclose(p.memory_bytes_per_device, sol.memory_bytes, rtol=1e-5), (p.memory_bytes_per_device,
                                                                                     sol.memory_bytes)
        out.append((label, made_for, p))
    return out


def peak_breakdown(dump: str, top: int = 8) -> str:
    """The first-level entries of XLA's 'Stack trace breakdown for peak usage'."""
    import glob

    files = sorted(glob.glob(os.path.join(dump, "*train_step*live-range.txt")), key=os.path.getmtime)
    if not files:
        return ""
    lines = open(files[-1]).read().splitlines()
    try:
        k = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Stack trace breakdown"))
    except StopIteration:
        return ""
    entries = []
    for ln in lines[k + 2:]:
        if not ln.startswith("      ├── ") and not ln.startswith("      └── "):
            if entries:
                break
            continue
        name, _, rest = ln[10:].partition(" (")
        total = rest.split("total: ")[1].split(" bytes")[0].replace("\u202f", "").replace(" ", "")
        entries.append((int(total), name))
    return "; ".join(f"{n} {b / 1e6:.1f}MB" for b, n in entries[:top])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--meshes", default=",".join(f"{d}x{m}" for d, m in MESHES))
    ap.add_argument("--limits", default="none,mid,tight")
    ap.add_argument("--hardware", default="dgx-a100")
    ap.add_argument("--breakdown", metavar="DIR", default=None)
    ap.add_argument("--no-margin", action="store_true", help="plan without the CPU margin (to measure the model)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    _set_flags(args.breakdown)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax

    import planner
    from planner.runtime.validation import validate

    meshes = [tuple(int(v) for v in s.split("x")) for s in args.meshes.split(",")]
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform}, adam, {args.hardware}; "
          "bytes per device; rest = gradients, update, activations, workspace (predicted) vs output - alias + temp")
    print(f"{'model':25} {'batch':>5} {'mesh':5} {'limit':6} {'made for':>12} {'predicted':>12} {'compiled':>12} "
          f"{'error':>7} {'fits':>4} {'args pred':>12} {'args xla':>12} {'rest pred':>12} {'rest xla':>12} "
          f"{'rest err':>8}")
    start = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            model, x = build(name, batch)
            graph = planner.extract(model, x)
            for mesh in meshes:
                if batch % (mesh[0] * mesh[1]):
                    continue
                for label, made_for, plan in mesh_plans(graph, model, x, mesh, batch, args.limits.split(","),
                                                        args.hardware, margin=not args.no_margin):
                    head = f"{name:25} {batch:>5} {mesh[0]}x{mesh[1]:<3} {label:6} {made_for:>12,.0f}"
                    case = {"model": name, "batch": batch, "mesh": list(mesh), "limit": label, "made_for_bytes": made_for}
                    if plan is None:
                        print(f"{head} no plan fits", flush=True)
                        rows.append({**case, "fits": None})
                        continue
                    r = validate(model, plan)
                    mem = {row.part: row for row in r.memory}
                    tot, args_, rest = mem["total"], mem["arguments"], mem["activations and temporaries"]
                    err = tot.compiled_bytes / tot.predicted_bytes - 1.0
                    rest_err = rest.compiled_bytes / rest.predicted_bytes - 1.0
                    fits = "yes" if mem["limit"].ok else "NO"
                    print(f"{head} {tot.predicted_bytes:>12,.0f} {tot.compiled_bytes:>12,.0f} {err:>+7.1%} "
                          f"{fits:>4} {args_.predicted_bytes:>12,.0f} {args_.compiled_bytes:>12,.0f} "
                          f"{rest.predicted_bytes:>12,.0f} {rest.compiled_bytes:>12,.0f} {rest_err:>+8.1%}",
                          flush=True)
                    rows.append({**case, "predicted_bytes": tot.predicted_bytes, "compiled_bytes": tot.compiled_bytes,
                                 "error": err, "fits": bool(mem["limit"].ok),
                                 "arguments_predicted_bytes": args_.predicted_bytes,
                                 "arguments_compiled_bytes": args_.compiled_bytes,
                                 "rest_predicted_bytes": rest.predicted_bytes, "rest_compiled_bytes": rest.compiled_bytes,
                                 "rest_error": rest_err})
                    if args.breakdown:
                        rows[-1]["peak"] = peak_breakdown(args.breakdown)
                        print(f"    peak: {rows[-1]['peak']}", flush=True)
    seconds = time.perf_counter() - start
    print(f"# {seconds:.0f} s", file=sys.stderr)
    done = [r for r in rows if r["fits"] is not None]
    errs = [r["error"] for r in done]
    summary = {"cases": len(rows), "planned": len(done), "fits": sum(r["fits"] for r in done),
               "within_10_percent": sum(abs(e) <= 0.10 for e in errs), "smallest_error": min(errs, default=None),
               "largest_error": max(errs, default=None), "margin": not args.no_margin, "seconds": seconds}
    default = (args.models, args.batches, args.meshes, args.limits) == (
        ",".join(MODELS), "64,256", ",".join(f"{d}x{m}" for d, m in MESHES), "none,mid,tight")
    write_results(args.json, __file__, "full grid" if default else "selected cases", summary, rows, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
