"""Small transformers' plans under a memory limit, predicted against what
XLA:CPU compiles (8 CPU devices, jaxlib 0.10.2's default schedule).

Each case is planned as a user plans it (``planner.plan(...,
verify=False, pipeline="never")``: the search and the schedule check, no
compile in the loop) and compiled by :func:`planner.validate`; printed per
case: the mesh, the predicted and compiled totals and their ratio, and the
``activations and temporaries`` part (everything but the step's arguments).
Cases are split in two halves: ``dev`` (the cases the mechanisms were
looked for in: the zoo's ``decoder-tiny`` at batch 16 and the user-written
nanoGPT of tests/user_models.py) and ``held-out`` (``llama-tiny`` at batch
16, the user-written Llama and the linen GPT), reported side by side.

    PYTHONPATH=. python benchmarks/transformer_memory.py [--cases dev,held-out] [--json PATH]

Run it once on a checkout to compare against another (``--json`` to keep
both): the plans are each checkout's own, as ``planner.plan`` makes them.
The rows and a summary per half go to ``--json PATH`` (default
``benchmarks/results/transformer_memory.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (half, name, model source, limit): a limit in bytes, a fraction of the unlimited plan's memory, or None
CASES = (
    ("dev", "decoder-tiny", "zoo", 4e6),
    ("dev", "decoder-tiny", "zoo", 5e6),
    ("dev", "decoder-tiny", "zoo", 6e6),
    ("dev", "decoder-tiny", "zoo", None),
    ("dev", "nanogpt", "user", 0.8),
    ("dev", "nanogpt", "user", 0.6),
    ("held-out", "llama-tiny", "zoo", 6e6),
    ("held-out", "llama-tiny", "zoo", None),
    ("held-out", "llama", "user", 0.6),
    ("held-out", "linen_gpt", "user", 0.6),
)
ZOO_BATCH, USER_BATCH = 16, 8


def case_plan(name: str, source: str, limit):
    """(Flax model, Plan) of one case."""
    import planner

    if source == "zoo":
        from planner.models.flax_zoo import flax_model

        graph, model, kw = planner.get_model(name), flax_model(name)[0], dict(batch=ZOO_BATCH, hardware="cpu-local")
    else:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import user_models

        model, spec = getattr(user_models, name)(batch=USER_BATCH)
        graph = planner.extract(model, spec)
        kw = dict(batch=USER_BATCH, hardware="dgx-a100", platform="cpu")
    common = dict(devices=8, verify=False, pipeline="never", levers="none", **kw)
    if limit is not None and limit < 1:  # a fraction of the unlimited plan's memory
        free = planner.plan(graph, **common)
        limit = int(limit * free.evaluation.memory_bytes_per_device)
    return model, planner.plan(graph, memory_limit=limit, **common)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="dev,held-out", help="the halves to run")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    import planner

    halves = args.cases.split(",")
    print(f"{'half':8} {'model':13} {'limit':>9} {'mesh':5} {'predicted':>11} {'compiled':>11} {'ratio':>6} "
          f"{'rest pred':>11} {'rest xla':>11} {'ratio':>6}")
    rows, start = [], time.perf_counter()
    for half, name, source, limit in CASES:
        if half not in halves:
            continue
        lim = "none" if limit is None else (f"{limit:.1f}x" if limit < 1 else f"{limit / 1e6:.0f}MB")
        try:
            model, plan = case_plan(name, source, limit)
        except planner.InfeasibleMemoryError as e:  # the model says no plan fits: nothing to compile
            print(f"{half:8} {name:13} {lim:>9} no plan fits: {str(e).split(':')[1].strip()}", flush=True)
            rows.append({"half": half, "model": name, "source": source, "limit": limit, "fits": None})
            continue
        report = planner.validate(model, plan)
        mem = {r.part: r for r in report.memory}
        tot, rest = mem["total"], mem["activations and temporaries"]
        row = {"half": half, "model": name, "source": source, "limit": limit, "mesh": list(plan.mesh),
               "predicted_bytes": tot.predicted_bytes, "compiled_bytes": tot.compiled_bytes,
               "ratio": tot.compiled_bytes / tot.predicted_bytes, "rest_predicted_bytes": rest.predicted_bytes,
               "rest_compiled_bytes": rest.compiled_bytes, "rest_ratio": rest.compiled_bytes / rest.predicted_bytes,
               "fits": bool(mem["limit"].ok), "strategies": dict(plan.strategies)}
        rows.append(row)
        print(f"{half:8} {name:13} {lim:>9} {plan.mesh[0]}x{plan.mesh[1]:<3} {row['predicted_bytes']:>11,.0f} "
              f"{row['compiled_bytes']:>11,.0f} {row['ratio']:>6.3f} {row['rest_predicted_bytes']:>11,.0f} "
              f"{row['rest_compiled_bytes']:>11,.0f} {row['rest_ratio']:>6.3f}", flush=True)
    summary = {}
    for half in halves:
        r = [x["ratio"] for x in rows if x["half"] == half and x["fits"] is not None]
        if r:
            summary[half] = {"cases": sum(x["half"] == half for x in rows), "compiled": len(r),
                             "fit_their_limit": sum(bool(x["fits"]) for x in rows if x["half"] == half),
                             "smallest_ratio": min(r), "largest_ratio": max(r),
                             "within_10_percent": sum(abs(v - 1) <= 0.10 for v in r)}
    summary["seconds"] = time.perf_counter() - start
    print(summary, file=sys.stderr)
    write_results(args.json, __file__, "all cases" if halves == ["dev", "held-out"] else args.cases, summary, rows,
                  argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
