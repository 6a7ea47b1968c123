"""Does a plan made for a memory limit fit that limit once XLA compiles it,
on the models users bring? Per-device memory predicted by the cost model
against what XLA compiled, over a grid of models, batches, meshes and memory
limits, on the local devices (8 fake CPU devices by default).

Models: four CNNs (VGG16-CIFAR-10, its SplitBrain variant, a ResNet with
bottleneck blocks 2-2-2-2 at 32x32, a small 3-D CNN; batches 32 and 128)
and six transformers (batches 16 and 64): the zoo's ``vit-tiny`` and
``decoder-tiny`` and the models of ``tests/user_models.py``, written as users
write them (``nanogpt``, ``llama``, ``linen-gpt``, and ``vit-mha`` with
Flax's own ``nnx.MultiHeadAttention``). Meshes 4x2 and 2x4.

Each case is planned with :func:`planner.plan` on that one mesh for the
``cpu`` platform (dgx-a100 preset, adam, float32; the search keeps the cpu
margin ``planner.planning.MEMORY_MARGIN`` and the input batch free;
``--no-margin`` sets the margin to 0, to measure the model) under one of the
limits: ``none`` (the device's memory), ``tight`` (the smallest limit the
planner accepts, ``InfeasibleMemoryError.required_bytes``, + 2%), ``mid``
(halfway from tight to the limit the unlimited plan needs), ``0.8x`` and
``0.6x`` (of the limit the unlimited plan needs; below tight the planner
refuses, and the case is recorded as refused). The linen model is planned
with ``levers='none'`` (the export applies ZeRO and recomputation to nnx
modules only). Each plan's predicted memory must equal
:func:`planner.runtime.validation.fixed_plan`'s for its layer options; the
plan is compiled with :func:`planner.validate` (nothing runs; once per
distinct plan of a group). Printed per case: the limit, predicted and
compiled total (XLA ``argument + output - alias + temp``), compiled /
predicted, whether it fits, the seconds of the search and of the compile.

``--verify`` plans with ``planner.plan(..., verify=True)`` instead (the
compiler in the loop, :mod:`planner.verification`): every returned plan
fits by construction (compiled ``<=`` its limit, else the planner refuses);
printed beside the plan's search time are the verify rounds and seconds.

Halves: a case (id ``model/batch/DxM/limit``) is in the development half when
the first byte of the SHA-256 of its id is even, else held out. Per half and
model family (CNN / transformer) the summary gives the fraction compiled
``<=`` limit, the fraction within 10% of the prediction, and the median and
worst (farthest from 1) compiled / predicted ratio.

Memory is ordered right: where the search replaced the unlimited plan by a
lighter one (predicted) to meet a limit, same model, batch and mesh, the
lighter one must compile lighter; violations are listed.

    PYTHONPATH=. python benchmarks/memory_grid.py [--quick] [--verify] [--models a,b] [--batches 16,64]
        [--meshes 4x2,2x4] [--limits none,mid,tight,0.8x,0.6x] [--breakdown DIR] [--json PATH]

``--quick``: decoder-tiny and vgg16-cifar10 at their smaller batch, mesh
2x4, limits none and tight. ``--breakdown DIR``: XLA's buffer assignment
dumped under DIR, the live set at XLA's peak printed by the op that made it.
Rows and summary go to ``--json PATH`` (default
``benchmarks/results/memory_grid.json``, with ``--verify`` ``memory_grid_verify.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _results import add_json_option, default_path, write_results  # noqa: E402

CNNS = ("vgg16-cifar10", "vgg16-cifar10-splitbrain", "resnet-2222-32px", "cnn3d-32px")
TRANSFORMERS = ("vit-tiny", "decoder-tiny", "nanogpt", "llama", "linen-gpt", "vit-mha")
USER_MODELS = {"nanogpt": "nanogpt", "llama": "llama", "linen-gpt": "linen_gpt", "vit-mha": "vit"}
BATCHES = {"cnn": (32, 128), "transformer": (16, 64)}
MESHES = ((4, 2), (2, 4))
LIMITS = ("none", "mid", "tight", "0.8x", "0.6x")
QUICK = (("decoder-tiny", "vgg16-cifar10"), (2, 4), ("none", "tight"))
HARDWARE, OPTIMIZER, PLATFORM, DEVICES = "dgx-a100", "adam", "cpu", 8
SLACK = 0.02  # tight = the smallest accepted limit x (1 + SLACK)
TOTAL_RTOL = 0.10  # the memory promise: total memory within 10%


def _set_flags(dump: str | None) -> None:
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
    if dump:
        flags += f" --xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*"
    os.environ["XLA_FLAGS"] = flags.strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def family(name: str) -> str:
    return "transformer" if name in TRANSFORMERS else "cnn"


def half(case_id: str) -> str:
    """``development`` when the first byte of SHA-256(case id) is even, else ``held-out``."""
    return "development" if hashlib.sha256(case_id.encode()).digest()[0] % 2 == 0 else "held-out"


def build(name: str, batch: int):
    """``(Flax model, input spec)``: CNNs as benchmarks/xla_agreement.py builds
    them, the zoo's transformers, tests/user_models.py's models."""
    if name in USER_MODELS:
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
        import user_models

        return getattr(user_models, USER_MODELS[name])(batch=batch)
    if name in TRANSFORMERS:
        from planner.models.flax_zoo import flax_model

        return flax_model(name, batch=batch)
    from xla_agreement import build as build_model

    return build_model(name, batch)


@contextlib.contextmanager
def no_margin(on: bool):
    """The cpu margin 0 while planning (``--no-margin``)."""
    from planner.plan_inputs import MEMORY_MARGIN

    kept = MEMORY_MARGIN[PLATFORM]
    MEMORY_MARGIN[PLATFORM] = 0.0 if on else kept
    try:
        yield
    finally:
        MEMORY_MARGIN[PLATFORM] = kept


def plan_case(graph, model, mesh, batch, limit, verify: bool, levers: str):
    """``planner.plan`` on ``mesh`` alone; ``(plan, wall seconds)``."""
    import planner
    from xla_agreement import _only_mesh
    t = time.perf_counter()
    with _only_mesh(mesh):
        p = planner.plan(graph, devices=DEVICES, hardware=HARDWARE, batch=batch, memory_limit=limit,
                         optimizer=OPTIMIZER, platform=PLATFORM, levers=levers, verify=verify,
                         flax_model=model if verify else None)
    return p, time.perf_counter() - t


def group_limits(graph, model, mesh, batch, limits, levers):
    """The unlimited plan, the smallest accepted limit and ``{label: user limit}``."""
    from planner.planning import MEMORY_MARGIN, InfeasibleMemoryError, memory_margin_bytes

    free, _ = plan_case(graph, model, mesh, batch, None, False, levers)
    try:
        plan_case(graph, model, mesh, batch, 1.0, False, levers)
        minimum = 1.0
    except InfeasibleMemoryError as e:
        minimum = e.required_bytes
    # the limit the unlimited plan needs: its memory with what the search keeps free
    needs = (free.memory_bytes_per_device + free.memory_margin_bytes
             - memory_margin_bytes(free.memory_limit_bytes, PLATFORM)) / (1 - MEMORY_MARGIN[PLATFORM])
    tight = minimum * (1 + SLACK)
    values = {"none": None, "tight": tight, "mid": max(tight, (tight + needs) / 2), "0.8x": 0.8 * needs,
              "0.6x": 0.6 * needs}
    return free, minimum, {k: values[k] for k in limits}


def checked(model, x, plan) -> None:
    """The plan's predicted memory is the cost model's for its layer options
    (those compiled): :func:`fixed_plan` on the plan's mesh."""
    import numpy as np
    from planner.runtime.validation import fixed_plan

    options = {r.name: r.option for r in plan.layers}
    again = fixed_plan(model, x, plan.mesh, strategies=options, batch=plan.batch, optimizer=OPTIMIZER,
                       hardware=HARDWARE, platform=PLATFORM)
    if not np.isclose(again.memory_bytes_per_device, plan.memory_bytes_per_device, rtol=1e-5):
        raise AssertionError(f"plan predicts {plan.memory_bytes_per_device:,.0f} B, its options cost "
                             f"{again.memory_bytes_per_device:,.0f} B")


def predicted_total(graph, plan) -> float:
    """validate's predicted total: the plan's memory, the inputs and optax's step count."""
    from planner.runtime.validation import _COUNTER_BYTES

    d, m = plan.mesh
    return float(plan.memory_bytes_per_device) + graph.input_bytes_per_sample * plan.batch / (d * m) + \
        _COUNTER_BYTES[OPTIMIZER]


def group_rows(name, batch, mesh, limits, verify, margin, breakdown):
    """The rows of one (model, batch, mesh): one per limit label."""
    import planner
    from planner.planning import InfeasibleMemoryError
    from planner.runtime.validation import validate

    model, x = build(name, batch)
    graph = planner.extract(model, x)
    levers = "none" if name == "linen-gpt" else "auto"
    with no_margin(not margin):
        free, minimum, user_limits = group_limits(graph, model, mesh, batch, limits, levers)
        rows, compiled = [], {}
        for label, limit in user_limits.items():
            case = f"{name}/{batch}/{mesh[0]}x{mesh[1]}/{label}"
            row = {"case": case, "half": half(case), "family": family(name), "model": name, "batch": batch,
                   "mesh": list(mesh), "limit": label, "user_limit_bytes": limit, "min_accepted_bytes": minimum}
            try:
                p, secs = plan_case(graph, model, mesh, batch, limit, verify, levers)
            except InfeasibleMemoryError as e:
                rows.append({**row, "refused": True, "required_bytes": e.required_bytes})
                continue
            except ValueError as e:  # verify: the plan's step does not compile
                rows.append({**row, "refused": False, "error": f"{type(e).__name__}: {e}"})
                continue
            checked(model, x, p)
            key = tuple(sorted((r.name, r.option) for r in p.layers))
            row.update(refused=False, limit_bytes=p.memory_limit_bytes, plan_memory_bytes=p.memory_bytes_per_device,
                       predicted_total_bytes=predicted_total(graph, p), plan_seconds=secs, search_seconds=p.seconds,
                       plan_mesh=list(p.mesh), options=key, not_data=sum(r.option != "data" for r in p.layers), layers=len(p.layers))
            if verify:
                row.update(compiled_total_bytes=p.compiled_memory_bytes, verify_rounds=p.verify_rounds,
                           verify_seconds=p.verify_seconds, compile_seconds=None)
            else:
                if key not in compiled:
                    t = time.perf_counter()
                    try:
                        report = validate(model, p)
                    except ValueError as e:  # a plan the export cannot compile is a row, not the end of the grid
                        rows.append({**row, "error": f"{type(e).__name__}: {e}"})
                        continue
                    tot = next(r for r in report.memory if r.part == "total")
                    compiled[key] = (tot.compiled_bytes, time.perf_counter() - t, label)
                    if breakdown:
                        row["peak"] = peak_breakdown(breakdown)
                row.update(compiled_total_bytes=compiled[key][0], compile_seconds=compiled[key][1],
                           same_program_as=None if compiled[key][2] == label else compiled[key][2])
            row["ratio"] = row["compiled_total_bytes"] / row["predicted_total_bytes"]
            row["fits"] = bool(row["compiled_total_bytes"] <= row["limit_bytes"])
            rows.append(row)
    return rows


def ordering_violations(rows: list[dict]) -> list[dict]:
    """Limited plans lighter than their group's unlimited plan (predicted, other
    options) that do not compile lighter."""
    done = [r for r in rows if not r["refused"] and "error" not in r]
    free = {(r["model"], r["batch"], tuple(r["mesh"])): r for r in done if r["limit"] == "none"}
    out = []
    for r in done:
        f = free.get((r["model"], r["batch"], tuple(r["mesh"])))
        if r["limit"] == "none" or f is None or r["options"] == f["options"]:
            continue
        if r["plan_memory_bytes"] < f["plan_memory_bytes"] and r["compiled_total_bytes"] >= f["compiled_total_bytes"]:
            out.append({"case": r["case"], "predicted_bytes": r["plan_memory_bytes"],
                        "unlimited_predicted_bytes": f["plan_memory_bytes"], "compiled_bytes": r["compiled_total_bytes"],
                        "unlimited_compiled_bytes": f["compiled_total_bytes"]})
    return out


def scores(rows: list[dict]) -> dict:
    """Fractions fitting and within 10%, the median and worst ratio of ``rows``."""
    import numpy as np
    done = [r for r in rows if not r["refused"] and "error" not in r]
    ratios = np.array([r["ratio"] for r in done])
    refused = sum(r["refused"] for r in rows)
    return {"cases": len(rows), "refused": refused, "failed": len(rows) - refused - len(done), "compiled": len(done),
            "fits_fraction": float(np.mean([r["fits"] for r in done])) if done else None,
            "within_10_percent_fraction": float(np.mean(np.abs(ratios - 1) <= TOTAL_RTOL)) if done else None,
            "median_ratio": float(np.median(ratios)) if done else None,
            "worst_ratio": float(ratios[np.argmax(np.abs(ratios - 1))]) if done else None}


def summary_of(rows: list[dict], seconds: float, verify: bool) -> dict:
    out = {"cases": len(rows), "seconds": seconds, "verify": verify, "total_rtol": TOTAL_RTOL,
           "ordering_checked": sum(1 for r in rows if not r["refused"] and "error" not in r and r["limit"] != "none"),
           "ordering_violations": ordering_violations(rows)}
    for h in ("development", "held-out"):
        mine = [r for r in rows if r["half"] == h]
        out[h] = {"all": scores(mine), **{f: scores([r for r in mine if r["family"] == f])
                                          for f in ("cnn", "transformer")}}
    return out


def print_summary(s: dict) -> None:
    def _fmt(x, f) -> str:
        return format("-", f[:3].rstrip(".")) if x is None else format(x, f)

    print(f"summary: {s['cases']} cases, {s['seconds']:.0f} s{', verified' if s['verify'] else ''}")
    print(f"{'half':12} {'family':12} {'cases':>5} {'refused':>7} {'failed':>6} {'fits':>6} {'within 10%':>10} {'median':>7} "
          f"{'worst':>7}")
    for h in ("development", "held-out"):
        for f in ("cnn", "transformer", "all"):
            c = s[h][f]
            print(f"{h:12} {f:12} {c['cases']:>5} {c['refused']:>7} {c['failed']:>6} {_fmt(c['fits_fraction'], '>6.1%')} "
                  f"{_fmt(c['within_10_percent_fraction'], '>10.1%')} {_fmt(c['median_ratio'], '>7.3f')} "
                  f"{_fmt(c['worst_ratio'], '>7.3f')}")
    v = s["ordering_violations"]
    print(f"memory ordered right: {s['ordering_checked'] - len(v)} of {s['ordering_checked']} limited plans "
          f"(lighter than the unlimited plan predicted, lighter compiled); violations: {len(v)}")
    for x in v:
        print(f"  {x['case']}: predicted {x['predicted_bytes']:,.0f} < {x['unlimited_predicted_bytes']:,.0f} B, "
              f"compiled {x['compiled_bytes']:,.0f} >= {x['unlimited_compiled_bytes']:,.0f} B")


def print_row(r: dict) -> None:
    d, m = r["mesh"]
    head = f"{r['model']:25} {r['batch']:>5} {d}x{m:<3} {r['limit']:5} {r['half'][:4]:4}"
    if r["refused"]:
        print(f"{head} refused: the planner needs {r['required_bytes']:,.0f} B", flush=True)
        return
    if "error" in r:
        print(f"{head} failed: {r['error'][:200]}", flush=True)
        return
    tail = (f"{r['verify_seconds']:>8.1f} {r['verify_rounds']:>6}" if r.get("verify_rounds") is not None else
            f"{r['compile_seconds']:>8.1f}" + (f"  (= {r['same_program_as']})" if r.get("same_program_as") else ""))
    print(f"{head} {r['limit_bytes']:>13,.0f} {r['predicted_total_bytes']:>13,.0f} {r['compiled_total_bytes']:>13,.0f} "
          f"{r['ratio']:>6.3f} {'yes' if r['fits'] else 'NO':>4} {r['not_data']:>3}/{r['layers']:<3} "
          f"{r['plan_seconds']:>7.1f} {tail}", flush=True)
    if r.get("peak"):
        print(f"    peak: {r['peak']}", flush=True)


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


def groups(args) -> list[tuple[str, int, tuple[int, int]]]:
    """(model, batch, mesh) of the selection: ``--quick`` or the options (default the full grid)."""
    models = args.models.split(",") if args.models else list(QUICK[0] if args.quick else CNNS + TRANSFORMERS)
    meshes = ([tuple(int(v) for v in s.split("x")) for s in args.meshes.split(",")] if args.meshes
              else [QUICK[1]] if args.quick else list(MESHES))
    out = []
    for name in models:
        batches = ([int(b) for b in args.batches.split(",")] if args.batches
                   else BATCHES[family(name)][:1] if args.quick else BATCHES[family(name)])
        out += [(name, b, mesh) for b in batches for mesh in meshes if b % mesh[0] == 0]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="decoder-tiny and vgg16-cifar10, one batch, 2x4, none+tight")
    ap.add_argument("--verify", action="store_true", help="plan with planner.plan(..., verify=True)")
    ap.add_argument("--models", help=f"comma-separated, from {','.join(CNNS + TRANSFORMERS)}")
    ap.add_argument("--batches", help="comma-separated global batches (default per family: CNN 32,128, "
                                      "transformer 16,64)")
    ap.add_argument("--meshes", help="comma-separated DxM (default 4x2,2x4)")
    ap.add_argument("--limits", help=f"comma-separated, from {','.join(LIMITS)}")
    ap.add_argument("--breakdown", metavar="DIR", default=None)
    ap.add_argument("--no-margin", action="store_true", help="plan without the CPU margin (to measure the model)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    if args.verify and args.json == default_path(__file__):
        args.json = args.json.with_name("memory_grid_verify.json")
    limits = args.limits.split(",") if args.limits else list(QUICK[2] if args.quick else LIMITS)
    for name in (args.models.split(",") if args.models else []):
        if name not in CNNS + TRANSFORMERS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(CNNS + TRANSFORMERS)}")
    if set(limits) - set(LIMITS):
        ap.error(f"unknown limits {sorted(set(limits) - set(LIMITS))}; choose from {', '.join(LIMITS)}")
    if args.verify and args.breakdown:
        ap.error("--breakdown reads validate's compiles, which --verify does not make")
    _set_flags(args.breakdown)
    sys.path.insert(0, os.path.dirname(HERE))
    import jax

    if jax.device_count() != DEVICES:
        ap.error(f"needs {DEVICES} devices, jax has {jax.device_count()}")
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform}, {OPTIMIZER}, {HARDWARE}; bytes "
          f"per device; ratio = compiled / predicted total (argument + output - alias + temp)")
    print(f"{'model':25} {'batch':>5} {'mesh':5} {'limit':5} {'half':4} {'limit B':>13} {'predicted':>13} "
          f"{'compiled':>13} {'ratio':>6} {'fits':>4} {'not data':>7} {'plan s':>7} "
          + (f"{'verify s':>8} {'rounds':>6}" if args.verify else f"{'compile s':>8}"), flush=True)
    start, rows = time.perf_counter(), []
    for name, batch, mesh in groups(args):
        print(f"# {name} batch {batch} mesh {mesh[0]}x{mesh[1]}", file=sys.stderr, flush=True)
        for r in group_rows(name, batch, mesh, limits, args.verify, not args.no_margin, args.breakdown):
            rows.append(r)
            print_row(r)
    summary = summary_of(rows, time.perf_counter() - start, args.verify)
    print_summary(summary)
    selected = any((args.models, args.batches, args.meshes, args.limits))
    mode = "selected cases" if selected else "quick" if args.quick else "full grid"
    write_results(args.json, __file__, mode + (", verified" if args.verify else ""), summary,
                  [{k: v for k, v in r.items() if k != "options"} for r in rows], argv,
                  hardware=HARDWARE, optimizer=OPTIMIZER, margin=not args.no_margin, slack=SLACK)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
