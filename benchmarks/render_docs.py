"""Write docs/benchmarks.md from the recorded runs in benchmarks/results/*.json.

    python benchmarks/render_docs.py            # rewrite docs/benchmarks.md
    python benchmarks/render_docs.py --check    # exit 1 if docs/benchmarks.md differs

Each section is one claim: what the benchmark measures and why (the text
here), then one short table of the numbers its script wrote, with the
command, mode, date, jax version and machine of that run; a section may
also render lines from other results files (its ``also``). A section whose
results file is missing says how to produce it. tests/test_benchmark_docs.py
checks that docs/benchmarks.md is what this script renders.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"

INTRO = """\
# Benchmarks

Every number on this page comes from a script in `benchmarks/` that writes its
results (command line, mode, date, jax version, machine, summary, rows) to
`benchmarks/results/<script>.json`; `benchmarks/render_docs.py` renders this
page from them and tests/test_benchmark_docs.py fails when the two drift apart.
To refresh a claim, rerun its command from the repository root (`PYTHONPATH=.`),
then `python benchmarks/render_docs.py`, and commit both. History: CHANGELOG.md.

Wall times are of a 2-core CPU shared with other jobs unless a section says
otherwise; a load average above 2 means other work slowed the run, so compare
ratios within one run. Plan qualities, bytes and errors do not depend on it.
"""


class Section(NamedTuple):
    title: str
    result: str  # benchmarks/results/<result>.json
    text: str  # what the benchmark measures and why
    table: Callable[..., list[str]]  # the claim's table from the results, then from each of ``also`` (None: missing)
    command: str  # how to produce the results file
    needs_gpu: bool = False
    also: tuple[str, ...] = ()  # further benchmarks/results/<name>.json the table reads


# -- formatting ------------------------------------------------------------------------------


def pct(x, sign: bool = True) -> str:
    return "-" if x is None else (f"{x:+.1%}" if sign else f"{x:.1%}")


def num(x, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def mb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:,.1f}"


def table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def provenance(r: dict) -> str:
    m = r["machine"]
    backend, kind = m.get("jax_backend", "cpu"), m.get("device_kind", "cpu")
    device = backend if kind == backend else f"{backend} ({kind})"
    load = f", load average {m['load_average'][0]:.1f} at the end" if "load_average" in m else ""
    return (f"Recorded: `{r['command']}` ({r['mode']} mode) on {r['date']}; jax {r['jax']} on {device}, "
            f"{m['cpu_count']} CPUs{load}.")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# -- the claims' tables ----------------------------------------------------------------------


def search_quality(r: dict) -> list[str]:
    s = r["summary"]
    t = {k.split(",")[0] + ("" if "compiled" not in k else " compiled") + (" incl" if "incl." in k else ""): v
         for k, v in s.get("timings", {}).items()}
    secs = lambda key: float(t[key].split()[0]) if key in t else None  # noqa: E731
    r50 = secs("resnet50 on 256 x dgx-a100 compiled")
    chain = secs("chain1000 on 64 x dgx-a100 incl")
    targets = [
        ["median gradient / exact ≤ 1.005", f"{s['median_ratio']:.5f}", yes(s["median_ratio"] <= 1.005)],
        ["worst ≤ 1.02", f"{s['worst_ratio']:.5f} ({s['worst_instance']})", yes(s["worst_ratio"] <= 1.02)],
        ["every feasible instance solved feasibly", f"{s['feasible_solved']} of {s['feasible']}",
         yes(s["feasible_solved"] == s["feasible"])],
        ["every infeasible instance reported", f"{s['infeasible_reported']} of {s['infeasible']}",
         yes(s["infeasible_reported"] == s["infeasible"])],
    ]
    if "milp_over_gradient_median" in s:
        targets.append(["gradient ≥ 10× faster than the MILP on DAG models",
                        f"median {s['milp_over_gradient_median']:.1f}×, aggregate "
                        f"{s['milp_over_gradient_aggregate']:.1f}× over {s['dag_instances']} instances",
                        yes(s["milp_over_gradient_median"] >= 10)])
    if r50 is not None:
        targets.append(["ResNet-50 on 256 devices < 1 s after compilation", f"{r50:.3f} s", yes(r50 < 1)])
    if chain is not None:
        targets.append(["1,000-layer chain < 10 s including compilation", f"{chain:.2f} s", yes(chain < 10)])
    return table(["target", "measured", "met"], targets)


def search_levers(r: dict) -> list[str]:
    s = r["summary"]
    rows = [["instances (feasible / infeasible)", f"{s['instances']} ({s['feasible']} / {s['infeasible']})"],
            ["gradient / exact: median, worst", f"{s['median_ratio']:.5f}, {s['worst_ratio']:.5f} "
             f"({s['worst_instance']})"],
            ["feasible solved, infeasible reported", f"{s['feasible_solved']} of {s['feasible']}, "
             f"{s['infeasible_reported']} of {s['infeasible']}"]]
    if s.get("unproven"):
        rows.append(["gradient / optimum, proven at most: median, worst",
                     f"{num(s.get('at_most_median'), '.5f')}, {num(s.get('at_most_worst'), '.5f')} "
                     f"({s['unproven']} instances against the exact solvers' bound, no optimum proven)"])
    times = [f"{label} {s[key]:.1f}×" for label, key in (("gradient", "with_levers_over_lever_free_gradient_median"),
                                                         ("DP", "with_levers_over_lever_free_dp_median"),
                                                         ("MILP", "with_levers_over_lever_free_milp_median"))
             if key in s]
    if times:
        rows.append(["search time with levers / lever-free menu (median)", ", ".join(times)])
    return table(["", "measured"], rows)


def costmodel_speed(r: dict) -> list[str]:
    return table(["method", "evaluations/s", "vs plain Python"],
                 [[x["method"], f"{x['evaluations_per_s']:,.0f}", f"{x['vs_python']:.1f}×"] for x in r["rows"]])


def automl_throughput(r: dict) -> list[str]:
    s = r["summary"]
    out = table(["method", "configs/s", "cost evaluations/s", "vs `plan()` loop"],
                [[x["method"], f"{x['configs_per_s']:,.1f}", f"{x['cost_evaluations_per_s']:,.0f}",
                  f"{x['vs_plan_loop']:.1f}×"] for x in r["rows"]])
    load = " ".join(f"{v:.2f}" for v in s["load_average_before"])
    rate = s["plan_many_evaluations_per_s"]
    return out + ["", f"Target ≥ 10,000 cost evaluations/s on 2 CPU cores: {rate:,.0f} with `plan_many` "
                  f"({yes(rate >= 10_000)}; load average {load} at the start); `plan_many` / `plan()` iteration time "
                  f"on {len(s['agreement_with_plan'])} configurations: "
                  + ", ".join(f"{x:.6f}" for x in s["agreement_with_plan"]) + "."]


def cli_latency(r: dict) -> list[str]:
    base = r["summary"].get("baseline")  # the revision timed beside this tree, if any
    ms = lambda s: num(s and s * 1e3, ".3f")  # noqa: E731
    head = ["case", "run timed", "target", "wall time", *([f"at {base}"] if base else []), "plan ms / iteration",
            *([f"at {base}"] if base else []), "met"]
    rows = [[f"`{x['case']}`", x["run"], f"{x['target_s']:g} s", num(x["this_tree_s"], ".2f") + " s",
             *([num(x["baseline_s"], ".2f") + " s"] if base else []), ms(x["this_tree_iteration_s"]),
             *([ms(x["baseline_iteration_s"])] if base else []), yes(x["met"])] for x in r["rows"]]
    return table(head, rows)


def calibration(r: dict) -> list[str]:
    s = r["summary"]
    cols = s["columns"]
    keep = [x for x in r["rows"] if not x["rows"].startswith("median, ")]  # per kind and strategy: in the JSON
    out = table(["relative error of per-layer time", *cols], [[x["rows"], *(pct(x[c], False) for c in cols)]
                                                               for x in keep])
    return out + ["", f"{s['shards']} shards of {s['model']} at batch {s['batch']}, meshes up to {s['max_devices']} "
                  f"devices; run-to-run difference of the measurements themselves: median {pct(s['noise_median'], False)} "
                  f"(the floor under the calibrated columns); roofline / calibrated median error "
                  f"{s['roofline_over_calibrated']:.1f}×."]


def fidelity(r: dict) -> list[str]:
    s = r["summary"]
    cols = [c for c in ("model", "previous", "roofline") if f"{c}_median" in r["rows"][0]]
    held = {x["rows"]: x for x in s.get("held_out", [])}  # constants chosen from the rows, scored left out
    left = [c for c in ("leave_layer_out", "leave_kind_out") if held]
    out = table(["rows", "n", *(f"{c} {q}" for c in cols for q in ("median", "p90")),
                 *(f"{c.replace('_', ' ')} median / p90" for c in left)],
                [[x["rows"], x["n"], *(pct(x[f"{c}_{q}"], False) for c in cols for q in ("median", "p90")),
                  *(f"{pct(held[x['rows']][c + '_median'], False)} / {pct(held[x['rows']][c + '_p90'], False)}"
                    for c in left)]
                 for x in r["rows"] if x["rows"].endswith(" all")])
    out += ["", *table(["calibrated", "dtype", "n", "median", "p90"],
                       [[x["calibrated"], x["dtype"], x["n"], pct(x["median"], False), pct(x["p90"], False)]
                        for x in s["calibrated"]])]
    modes = list(next(iter(s["paradl_mean"].values())))
    env = {x["series"].removesuffix(", all points"): x for x in s.get("paradl_held_out", [])}
    folds = [c for c in ("leave_series_out", "leave_network_out") if env]
    out += ["", *table(["ParaDL on ABCI, mean min(P/E, E/P)", *modes, *(f"default, {c.replace('_', ' ')}" for c in folds)],
                       [[m, *(f"{v[k]:.3f}" for k in modes), *(f"{env[m][c]:.3f}" for c in folds)]
                        for m, v in s["paradl_mean"].items()])]
    return out


def xla_agreement_totals(r: dict) -> list[str]:
    """:func:`xla_agreement`'s **all** row alone (a second run of the same grid)."""
    return xla_agreement(r, per_model=False)


def xla_agreement(r: dict, per_model: bool = True) -> list[str]:
    s, rows = r["summary"], r["rows"]
    body = []
    for name in dict.fromkeys(x["model"] for x in rows) if per_model else ():
        mine = [x for x in rows if x["model"] == name and "error" not in x]
        errs = [x["total_error"] for x in mine]
        body.append([name, len(mine), sum(x["fits"] for x in mine), sum(abs(e) <= s["total_rtol"] for e in errs),
                     f"{pct(min(errs))} … {pct(max(errs))}", sum(x["collectives_within"] for x in mine),
                     sum(x["state_exact"] for x in mine)])
    body.append(["**all**", s["cases"], s["fits"], s["total_within"],
                 f"{pct(s['smallest_total_error'])} … {pct(s['largest_total_error'])}", s["collectives_within"],
                 s["state_exact"]])
    return table(["model", "cases", "fits its limit", f"total within {s['total_rtol']:.0%}", "compiled / predicted − 1",
                  f"collectives within {s['comm_rtol']:.0%}", "state exact"], body) + [
        "", f"XLA:CPU scheduler: {r['cpu_scheduler']}; {s['compiled']} programs compiled, {s['failed']} failed."]


def memory_grid(r: dict, verified: dict | None) -> list[str]:
    """`benchmarks/memory_grid.py`: per half and family, the fractions, ratios and (where recorded) --verify's."""
    s, body = r["summary"], []
    v = verified["summary"] if verified else None
    for h in ("development", "held-out"):
        for f in ("cnn", "transformer"):
            c = s[h][f]
            w = v[h][f] if v else None
            body.append([h, f, f"{c['compiled']} ({c['refused']}, {c['failed']})", pct(c["fits_fraction"], False),
                         pct(c["within_10_percent_fraction"], False),
                         f"{num(c['median_ratio'])}, {num(c['worst_ratio'])}",
                         f"{w['compiled']}: {pct(w['fits_fraction'], False)}" if w and w["compiled"] else "-"])
    order = s["ordering_violations"]
    return table(["half", "family", "compiled (refused, failed)", "fits", "within 10%", "ratio: median, worst",
                  "--verify: plans, fit"], body) + [
        "", f"Lighter plans that compile lighter: {s['ordering_checked'] - len(order)} of {s['ordering_checked']}"
        + (_verify_times(verified) if v else ".")]


def _verify_times(r: dict) -> str:
    done = [x for x in r["rows"] if x.get("verify_seconds") is not None]
    rounds = [x["verify_rounds"] for x in done]
    meshes = ", ".join(sorted({"x".join(map(str, x["mesh"])) for x in r["rows"]}))
    search, verify = median([x["search_seconds"] for x in done]), median([x["verify_seconds"] for x in done])
    return (f"; --verify ({r['summary']['cases']} cases, mesh {meshes}): median search {search:.1f} s, median verify "
            f"(compiles, searches again) {verify:.1f} s; {sum(k > 1 for k in rounds)} of {len(rounds)} took 2+ rounds.")


MEMORY_MODELS_SHOWN = ("today", "xla-cpu-rules", "sum", "phases", "liveness")  # the rest: the results file


def memory_models(r: dict) -> list[str]:
    return table(["memory model", "within 10%", "smallest error", "largest error"],
                 [[x["model"], f"{x['within_10_percent']} of {x['cases']}", pct(x["smallest_error"]),
                   pct(x["largest_error"])] for x in r["rows"] if x["model"] in MEMORY_MODELS_SHOWN])


def remat_xla(r: dict) -> list[str]:
    kept = next(x for x in r["rows"] if x["runs"] == "kept")
    cell = lambda runs, how: next(f"{x['over_kept']:.3f} ({x['convs_compiled']} convs)"  # noqa: E731
                                  for x in r["rows"] if (x["runs"], x["recompute"]) == (runs, how))
    out = table([f"conv chain: temporaries / kept ({mb(kept['temp_bytes'])} MB, {kept['convs_compiled']} convs)",
                 "`jax.checkpoint`", "tied to the cotangent"],
                [[f"recomputed {runs}", cell(runs, "checkpoint"), cell(runs, "tied")]
                 for runs in dict.fromkeys(x["runs"] for x in r["rows"] if x["runs"] != "kept")])
    out += ["", *table(["plan", "predicted MB", "compiled MB", "compiled / predicted"],
                       [[f"attention {x['attention']}", mb(x["predicted_bytes"]), mb(x["compiled_bytes"]),
                         f"{x['compiled_over_predicted']:.3f}"] for x in r["attention"]]
                       + [[f"{x['model']}, {x['activations']} ({x['runs']} runs)", mb(x["predicted_bytes"]),
                           mb(x["compiled_bytes"]), f"{x['compiled_over_predicted']:.3f}"] for x in r["cnn_runs"]])]
    return out


def zero_xla(r: dict) -> list[str]:
    rows = [[x["stage"], x["layers_sharded"],
             f"{mb(x['parameters_predicted_bytes'])} / {mb(x['parameters_compiled_bytes'])}",
             f"{mb(x['optimizer_state_predicted_bytes'])} / {mb(x['optimizer_state_compiled_bytes'])}",
             f"{mb(x['total_predicted_bytes'])} / {mb(x['total_compiled_bytes'])}",
             pct(x["total_compiled_bytes"] / x["total_predicted_bytes"] - 1),
             pct(max((abs(c["compiled_bytes"] / c["predicted_bytes"] - 1) if c["predicted_bytes"] else float("inf")
                      for c in x["collectives"]), default=0.0), False)]
            for x in r["rows"]]
    return table(["ZeRO stage", "layers sharded", "parameters MB (predicted / compiled)", "optimizer state MB",
                  "total MB", "total error", "worst collective error"], rows)


def transformer_validation(r: dict) -> list[str]:
    rows = [[x["model"], "x".join(map(str, x["mesh"])), x["memory_limit"], mb(x["predicted_total_bytes"]),
             mb(x["compiled_total_bytes"]), pct(x["total_error"]), yes(x["fits"]), yes(x["state_exact"]),
             f"{x['collectives_ok']} of {x['collectives']}" + (f" ({', '.join(x['collectives_differ'])} differs)"
                                                              if x["collectives_differ"] else "")]
            for x in r["rows"]]
    return table(["model", "mesh", "limit", "predicted MB", "compiled MB", "error", "fits", "state exact",
                  "collectives exact"], rows)


def gpu_steps(r: dict) -> list[str]:
    kernels = {x["model"]: x for x in r["summary"]["shard_kernels"]}
    return table(["model", "P = 1 step: predicted ms", "measured ms", "measured / predicted",
                  "shard kernels of the plan: measured / predicted", "per layer: median (min … max)"],
                 [[x["model"], f"{x['predicted_s'] * 1e3:.3f}", f"{x['measured_s'] * 1e3:.3f}",
                   f"{x['measured_over_predicted']:.3f}", f"{kernels[x['model']]['measured_over_predicted']:.3f} "
                   f"({'x'.join(map(str, kernels[x['model']]['mesh']))})",
                   f"{kernels[x['model']]['layer_ratio_median']:.2f} ({kernels[x['model']]['layer_ratio_min']:.2f} … "
                   f"{kernels[x['model']]['layer_ratio_max']:.2f})"] for x in r["rows"]])


# -- the page --------------------------------------------------------------------------------

def megatron(r: dict, fit: dict | None, fit_memory: dict | None) -> list[str]:
    """`benchmarks/megatron.py`'s table; below it the leave-one-out choices of
    `benchmarks/megatron_fit.py` (plain and ``--memory``) where recorded."""
    s, rows = r["summary"], []
    for x in r["rows"]:
        e, p = x["execution"], x["plan"]
        published = f"t{e['tensor']} S{e['pipeline']} d{e['data']} b{e['microbatch']} v{e['interleave']}"
        own = (f"t{p['tensor']} S{p['stages']} d{p['data']} b{p['micro_batch']} v{p['chunks']} {p['recompute']}"
               + (" sp" if p["sequence_parallel"] else ""))
        rows.append([x["id"], published, num(x["measured"]["tflops_per_gpu"], ".0f"),
                     num(x["predicted"]["tflops_per_gpu"], ".1f"), pct(x["error"]["tflops_per_gpu"]),
                     num(x["published_step_s"], ".2f"), num(x["plan_step_s"], ".2f"), own])
    every_fits = all(x["plan"] is not None and x["plan_at_least_as_fast"] for x in r["rows"])
    return table(["run", "published (b, v: chosen)", "TFLOP/s measured", "predicted", "error", "step s",
                  "own plan step s", "own plan"], rows) + [
        "", f"Mean absolute error {pct(s['mean_abs_error'], False)}, largest {pct(s['largest_abs_error'], False)} "
        f"over {s['count']} runs on `{s['hardware']}`; {'every' if every_fits else '**not** every'} own plan fits "
        f"{s['memory_limit_bytes'] / 1e9:g} GB and is predicted at least as fast as the published configuration."] + (
        _megatron_fit(fit) if fit else []) + (_megatron_fit_memory(fit_memory) if fit_memory else [])


def _left_out_range(r: dict, i: int) -> str:
    values = [v[i] for v in r["left_out"]["values"]]
    return f"{min(values):g}-{max(values):g}"


def _megatron_fit(r: dict) -> list[str]:
    """`python benchmarks/megatron_fit.py`'s leave-one-out choice of the one constant."""
    s = r["summary"]
    return [f"The one constant, the 16-bit GEMM efficiency, chosen on a grid by `benchmarks/megatron_fit.py`: "
            f"in-sample {s['value'][0]:g} (mean |error| {pct(s['in_sample_mean_abs_error'], False)}, largest "
            f"{pct(s['in_sample_largest_abs_error'], False)}); each run left out, predicted at the value the others "
            f"choose ({_left_out_range(r, 0)}): mean |error| {pct(s['left_out_mean_abs_error'], False)}, largest "
            f"{pct(s['left_out_largest_abs_error'], False)}."]


def _megatron_fit_memory(r: dict) -> list[str]:
    """`python benchmarks/megatron_fit.py --memory`: the HBM efficiency chosen too."""
    s = r["summary"]
    return [f"With the HBM efficiency chosen too (`--memory`): in-sample matmul {s['value'][0]:g}, memory "
            f"{s['value'][1]:g} (mean |error| {pct(s['in_sample_mean_abs_error'], False)}); left out "
            f"({_left_out_range(r, 0)}, {_left_out_range(r, 1)}): mean |error| "
            f"{pct(s['left_out_mean_abs_error'], False)}, largest {pct(s['left_out_largest_abs_error'], False)}."]


def _stage_cuts(r: dict) -> list[str]:
    """`python benchmarks/stage_cuts.py`: the slowest case of each kind of chain."""
    slowest = {}
    for x in r["rows"]:
        if x["chain"] not in slowest or x["seconds"] > slowest[x["chain"]]["seconds"]:
            slowest[x["chain"]] = x
    return [f"The exact stage cuts (`search.solve_stage_cuts`, `benchmarks/stage_cuts.py`, {len(r['rows'])} cases): "
            + "; ".join(f"slowest on {c} layers, {x['layers']} in {x['stages']} stages ({x['schedule']}), "
                        f"{x['seconds']:.3f} s" for c, x in slowest.items()) + "."]


def pipelined_plan(r: dict, cuts: dict | None) -> list[str]:
    """`benchmarks/pipelined_plan.py`'s one plan; below it `benchmarks/stage_cuts.py`'s slowest cases."""
    s, (x,) = r["summary"], r["rows"]
    p = x["pipeline"]
    return [f"`{x['planned']}`: {s['wall_s']:.1f} s (target {s['target_s']:g} s); mesh "
            f"{'x'.join(map(str, x['mesh']))} ({', '.join(x['axis_names'])}), {p['schedule']} v={p['chunks']}, "
            f"{p['microbatches']} micro-batches of {p['micro_batch']}, predicted step {x['iteration_s']:.1f} s, "
            f"{x['memory_bytes_per_device'] / 1e9:.1f} of {x['memory_limit_bytes'] / 1e9:g} GB per device."] + (
        _stage_cuts(cuts) if cuts else [])


def _gpu_aot_line(r: dict) -> str:
    """One stack's run of `benchmarks/gpu_aot_probe.py`: what compiled, the plans' totals, what failed and how."""
    v = r["summary"]["versions"]
    wheels = "with" if v.get("nvidia-cuda-nvcc-cu12") else "without"
    plans = []
    for x in r["rows"]:
        total = next((m for m in x.get("memory", []) if m["part"] == "total"), None)
        if total:
            colls = "collectives within tolerance" if all(c["ok"] for c in x["collectives"]) else "**collectives out**"
            plans.append(f"{x['step']} {pct(total['compiled_bytes'] / total['predicted_bytes'] - 1)} total, {colls}")
    works = [x["step"] for x in r["rows"] if x["ok"] and not x.get("memory")]
    fails = [f"{x['step']} ({x['error'].split(':')[0] if ':' in x['error'] else x['error']})" for x in r["rows"]
             if not x["ok"]]
    return (f"- jax {v['jax']}, plugin {v.get('jax-cuda12-plugin') or '-'} {wheels} CUDA wheels, Python "
            f"{v['python']} (`{r['command']}`): compiled {', '.join(works + plans) or 'nothing'}; "
            f"failed {', '.join(fails) or 'nothing'}.")


def gpu_aot_probe(r: dict, *others: dict | None) -> list[str]:
    """`benchmarks/gpu_aot_probe.py` in the tested set, then in the other stacks (the plugin without its CUDA
    wheels, the newest JAX): one line each."""
    return [_gpu_aot_line(x) for x in (r, *others) if x]


def transformer_memory(r: dict, before: dict | None = None) -> list[str]:
    """`benchmarks/transformer_memory.py`: compiled over predicted memory per half of its cases, beside the same
    script's run before the loss step was modelled."""
    rows = ["| half | cases | fit their limit | within 10% | worst compiled / predicted | before |", "|---|---|---|---|---|---|"]
    for half in ("dev", "held-out"):
        a, b = r["summary"][half], (before or {}).get("summary", {}).get(half)
        rows.append(f"| {half} | {a['compiled']} | {a['fit_their_limit']} | {a['within_10_percent']} | "
                    f"{a['largest_ratio']:.3f} | {num(b and b['largest_ratio'])} |")
    return rows


SECTIONS = (
    Section("Search quality and speed", "search_quality", """\
The gradient search (relaxed, then refined) against the exact optimum (DP on chains, MILP on graphs) over zoo
models × P × `abci-v100`, `dgx-a100` × loose, tight (+0.1%) and infeasible (−1%) limits; `--quick`: VGG16 and
ResNet-50 on 8 and 256 devices. The MILP's LP relaxation is nearly integral here: the 10× target is missed.""", search_quality,
            "python benchmarks/search_quality.py --quick"),
    Section("Memory levers on the menu", "search_quality_levers", """\
The same with ZeRO stages 1–3 and recomputation on every layer's menu ([levers.md](levers.md)), and a
levers-only limit; beside each instance, the lever-free menu's search times.""", search_levers,
            "python benchmarks/search_quality.py --skip-timings --quick --models resnet152,cosmoflow-256 "
            "--levers all --milp-time-limit 120 --json benchmarks/results/search_quality_levers.json"),
    Section("Runs of recomputed layers", "search_quality_remat_runs", """\
With runs of recomputed layers (`--remat-runs`, [levers.md](levers.md#runs-of-recomputed-layers)): the DP
over runs is exact on chains; on graphs with branches rows compare with the exact solvers' best and bound.""", search_levers,
            "python benchmarks/search_quality.py --skip-timings --quick --models cosmoflow-256,vgg16 --levers all "
            "--remat-runs --milp-time-limit 120 --json benchmarks/results/search_quality_remat_runs.json"),
    Section("Cost model speed", "costmodel_speed", """\
Cost-table evaluations per second for ResNet-152, jitted and vmapped over 1,000 configurations, against the
same formulas in plain Python (`costmodels.reference`).""", costmodel_speed, "python benchmarks/costmodel_speed.py"),
    Section("AutoML throughput", "automl_throughput", """\
256 ResNet-50-shaped networks on 32–128 GPUs, 4 mesh shapes each ([automl.md](automl.md)): `plan_many` in
one compiled call; `cost_fn`, the differentiable cost of a parametric architecture.""", automl_throughput,
            "python benchmarks/automl_throughput.py"),
    Section("Command-line latency", "cli_latency", """\
A fresh process and cache per case (`SHARDPLAN_CACHE_DIR`): run 1 compiles, run 2 reads compiled programs
and cost tables, as a user's second command does; predicted plan times beside wall times.""", cli_latency, "python benchmarks/cli_latency.py"),
    Section("Calibration on the local device", "calibration", """\
Two `planner.profile_layers` runs on this CPU: the first calibrates, the second is measured; each shard by
the `cpu-local` roofline and by the calibration (the third column from meshes of ≤ 2 devices;
[calibration.md](calibration.md)).""", calibration,
            "python benchmarks/calibration.py --model vgg16-cifar10 --batch 8 --max-devices 4 --repeats 9"),
    Section("Fidelity against real hardware", "fidelity", """\
The compute model against one H200's per-layer VGG16 shard times, uncalibrated beside a roofline with its
best single efficiency, then calibrated, and the ParaDL oracle on ParaDL's ABCI series ([fidelity.md](fidelity.md)).""", fidelity, "python benchmarks/fidelity.py"),
    Section("Memory limits and collectives against XLA", "xla_agreement", """\
Four models × batches 64, 256 × meshes 8x1, 4x2, 2x4, 1x8 × limits none, mid, tight, planned for `cpu`
and compiled on 8 CPU devices ([validation.md](validation.md#the-memory-promise)). Targets: every program
fits; total memory within 10%; every collective within 5%; parameters and optimizer state exact.""", xla_agreement,
            "python benchmarks/xla_agreement.py"),
    Section("The grid under XLA:CPU's memory scheduler", "xla_agreement_memory_scheduler", """\
The same grid under XLA:CPU's depth-first `DFSMemoryScheduler` (a second run: XLA reads the flag at start-up).""",
            xla_agreement_totals,
            "XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false python benchmarks/xla_agreement.py "
            "--json benchmarks/results/xla_agreement_memory_scheduler.json"),
    Section("The memory promise on the models users bring", "memory_grid", """\
CNNs and transformers (zoo, `tests/user_models.py`) × 2 batches × meshes 4x2, 2x4 × limits none, mid, tight,
0.8×, 0.6× of the unlimited plan's; halves by SHA-256 of the case id; ratio: compiled / predicted.""",
            memory_grid, "python benchmarks/memory_grid.py", also=("memory_grid_verify",)),
    Section("Memory models scored on the grid", "memory_models", """\
The cost model's memory (`today`) and alternatives, each a formula of per-layer sums (the script's docstring),
against the recorded grid's compiled totals; `xla-cpu-rules`: the schedule; all but `today` drop the plans' levers.""", memory_models,
            "python benchmarks/memory_models.py"),
    Section("Recomputation on XLA:CPU", "remat_xla", """\
XLA:CPU merges `jax.checkpoint`'s recomputation back into the forward pass; the export's, tied to the
cotangent, frees the memory. Then recomputed attention and CNN runs against the prediction ([levers.md](levers.md)).""", remat_xla, "python benchmarks/remat_xla.py"),
    Section("ZeRO on XLA:CPU", "zero_xla", """\
At each ZeRO stage, every layer the cost model lets shard its state: bytes per device predicted and compiled,
and whether every collective matches (on CPU a reduce-scatter is an all-reduce and a slice).""", zero_xla,
            "python benchmarks/zero_xla.py"),
    Section("Transformers against XLA", "transformer_validation", """\
ViT-B/16 and GPT-2 small, one sample per device, planned for 8 × `dgx-a100` under limits that force model
parallelism, compiled on 8 CPU devices ([transformers.md](transformers.md)).""",
            transformer_validation, "python benchmarks/transformer_validation.py"),
    Section("Transformers' memory on XLA:CPU", "transformer_memory", """\
Zoo and user-written transformers planned for 8 CPU devices under limits that force model parallelism and
compiled ([validation.md](validation.md#the-loss-step)); rules chosen on the dev half.""", transformer_memory,
            "python benchmarks/transformer_memory.py", also=("transformer_memory_before",)),
    Section("Megatron-LM's published runs", "megatron", """\
Narayanan et al. 2021 (1.7 B–1 T parameters, 32–3,072 A100s) on `dgx-a100`: the published execution
(unpublished micro-batch and interleave chosen by the planner) and the own plan ([llm-scale.md](llm-scale.md)).""", megatron,
            "python benchmarks/megatron.py --measurements ../shared/reference/measurements",
            also=("megatron_fit", "megatron_fit_memory")),
    Section("Planning with stages", "pipelined_plan", "", pipelined_plan, "python benchmarks/pipelined_plan.py",
            also=("stage_cuts",)),
    Section("GPU targets without a GPU", "gpu_aot_probe", """\
VGG16-CIFAR-10's step (batch 64, 8 devices) compiled for an A100 and an H100 on this CPU-only machine through the \
CUDA PJRT plugin's compile-only devices; total memory compiled against predicted ([validation.md](validation.md#compiling-for-a-gpu-target-on-a-machine-without-one)).""",
            gpu_aot_probe, "python benchmarks/gpu_aot_probe.py", also=("gpu_aot_probe_no_cuda_wheels", "gpu_aot_probe_latest")),
    Section("On one accelerator", "gpu_steps", """\
The P = 1 plans of VGG16 and ResNet-50 as real training steps against their predicted `iteration_s`, and the
64-device plans' shard kernels timed on the one device (`--smoke` checks the script on a CPU).""", gpu_steps,
            "python benchmarks/gpu_steps.py", needs_gpu=True),
)


def _wrapped(text: str, width: int = 118) -> list[str]:
    """A section's text as lines of at most ``width`` characters (words kept whole)."""
    return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


def render(results: Path = RESULTS) -> str:
    """docs/benchmarks.md from the results files in ``results``; the
    sections without one are listed at the end with their commands."""
    lines, missing = INTRO.splitlines() + [""], []
    for s in SECTIONS:
        path = results / f"{s.result}.json"
        if not path.exists():
            missing.append(f"- {s.title}: `{s.command}`" + (" (needs a GPU)." if s.needs_gpu else "."))
            continue
        r = json.loads(path.read_text())
        also = [json.loads(p.read_text()) if p.exists() else None for p in (results / f"{a}.json" for a in s.also)]
        lines += [f"## {s.title}", ""] + ([*_wrapped(s.text), ""] if s.text else [])
        lines += ([provenance(r), ""] if "machine" in r else []) + [*s.table(r, *also), ""]
    if missing:
        lines += ["## Not recorded here", "", *missing, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is not what would be written")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if DOC.read_text() != text:
            print("docs/benchmarks.md differs from benchmarks/results/: run python benchmarks/render_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
