"""Search quality and speed: the gradient method (relaxed search + discrete
refinement) against the exact optimum (DP on chains, MILP on DAGs), and the
wall time of each method side by side.

Instances: VGG16, ResNet-50, ResNet-152, AlexNet, CosmoFlow-256, a
1,000-layer synthetic chain, ViT-B/16 and GPT-2 small; P in {8, 64, 256,
1024}; two hardware presets;
three memory limits each: loose (the device's memory, or twice the smallest
feasible limit if that is larger), tight (0.1 % above the smallest limit
any plan needs, exact) and infeasible (1 % below it). Every instance
searches every mesh shape d x m = P with the model axis inside a node, at
32 samples per device (CosmoFlow: 1, as one 256^3 volume already needs ~6 GB;
GPT-2 small: 1 sequence of 1,024 tokens). Times are after compilation (each model's shapes are
compiled once before the timed runs; the first, compiling, runs are
reported separately).

With ``--levers zero|remat|all`` every layer's menu also holds the memory
levers (ZeRO stages, rematerialisation: ``costmodels/levers.py``), and each
instance where levers lower the smallest memory any plan needs gains a
fourth limit, ``levers-only``: halfway between that smallest memory and the
smallest of the lever-free plans, so that only plans using levers fit. Beside
each loose, tight and infeasible instance it times the lever-free menu's own
instance of that kind (its limits from its own smallest memory), and the
summary gives the ratios of search times. ``--limits`` runs only the
instances of the kinds it names (``tight,levers-only``, say). With ``--remat-runs`` (and
``--levers remat|all``) every layer that saves activations may recompute,
alone or in a run with the layers before it (``remat+join``,
``CostSettings.remat_runs``); the DP then searches the runs on chains
(``search.exact.dp_runs``) beside the MILP. On graphs with branches the smallest
memory comes from the same labels over the layer-order problem
(``search.smallest_memory``: within ``--milp-time-limit``, then the MILP
within its own), but only the MILP searches the fastest plan with runs. Where
the smallest memory is not proven, the limits come from the smallest
memory found (a plan fits the tight limit, but no infeasible instance can
be claimed, so there is none), the exact solvers take that answer instead
of searching it again, and rows the MILP did not prove say so. There, on a
graph with branches and runs, the DP also searches the graph in layer order
(``search.solve_dp``, its labels paying each skip edge's resharding; where
``search.exact.runs`` declines the graph, the layer-order problem with the
skip edges' resharding at its least, ``search.layer_order_chain(p,
"lower")``), within ``--dp-time-limit`` per mesh (default: the MILP's), below
the fastest plan known on any mesh: its lower bound holds
on the graph and its plan fits there, so each mesh's reference is the
better plan and the higher bound of the two; the summary gives the
gradient method's time against that bound.

    PYTHONPATH=. .venv/bin/python benchmarks/search_quality.py [--quick] [--models a,b] [--levers all]
        [--remat-runs] [--hardware abci-v100] [--devices 8,256] [--limits tight,levers-only]
        [--milp-time-limit 60] [--dp-time-limit 300] [--json PATH]

Every row, the summary and the planner timings go to ``--json PATH``
(default ``benchmarks/results/search_quality.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from costmodels import (  # noqa: E402
    CostSettings,
    Strategy,
    cost_table,
    hardware_arrays,
    load_hardware,
)
from costmodels.levers import LEVER_CHOICES, option_strategy  # noqa: E402
from planner import GraphBuilder  # noqa: E402
from planner.models.zoo import get_model  # noqa: E402
from planner.planning import mesh_shapes, plan  # noqa: E402
from search import (  # noqa: E402
    chain_order,
    compact_options,
    discrete_problem,
    layer_order_chain,
    minimum_memory,
    plan_memory,
    plan_time,
    smallest_memory,
    solve_dp,
    solve_many,
    solve_milp,
)
from search.exact import dp_solves, run_chain  # noqa: E402
from search.problem import has_runs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

MODELS = ("vgg16", "resnet50", "resnet152", "alexnet", "cosmoflow-256", "chain1000", "vit-b16", "gpt2-small")
DEVICES = (8, 64, 256, 1024)
HARDWARE = ("abci-v100", "dgx-a100")
# samples per device; 32 for the others (a 256^3 volume needs ~6 GB; a 1,024-token sequence ~1 GB)
PER_DEVICE = {"cosmoflow-256": 1, "gpt2-small": 1}
MILP_TIME_LIMIT_S = 300.0
# the DP references' label budget over runs (search.solve_dp's max_labels, 2 M by default, which can stop it
# on a ResNet before its time limit): bounded by the time limit instead; at most about 2 GB of labels
REFERENCE_MAX_LABELS = 30_000_000
LIMIT_KINDS = ("loose", "tight", "infeasible", "levers-only")  # the instances of each model, P and hardware


def synthetic_chain(layers: int = 1000):
    """A 1,000-layer sequential CNN: four stages of conv3x3-BN-ReLU blocks
    (64/128/256/512 channels on 32/16/8/4 pixels) with max pools between,
    then flatten, dense 1024, ReLU, dense 10."""
    b = GraphBuilder(f"chain{layers}", (3, 32, 32))
    blocks = [83, 83, 83, 82]
    x = b.input
    for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
        for i in range(n):
            x = b.conv(f"s{stage}/b{i}/conv", x, width, 3, padding="SAME")
            x = b.batch_norm(f"s{stage}/b{i}/bn", x)
            x = b.relu(f"s{stage}/b{i}/relu", x)
        if stage < 3:
            x = b.max_pool(f"s{stage}/pool", x, 2)
    x = b.flatten("flatten", x)
    x = b.relu("fc/relu", b.dense("fc/0", x, 1024))
    b.dense("fc/1", x, 10)
    g = b.build()
    assert g.num_layers == layers, g.num_layers
    return g


def tables_for(graph, hw, P, levers: str = "none", remat_runs: bool = False):
    B = PER_DEVICE.get(graph.model_name, 32) * P
    meshes = mesh_shapes(P, B, hw.devices_per_node)
    hwa = hardware_arrays(hw)
    tables = []
    for d, m in meshes:
        t = cost_table(graph.arrays, hwa, float(B), float(d), float(m),
                       CostSettings(levers=levers, remat_runs=remat_runs))
        if B % (d * m):
            data = option_strategy(t.feasible.shape[1]) == int(Strategy.DATA)  # [O] data's options
            t = t._replace(feasible=t.feasible & (~data[None, :] | (t.layer_mask <= 0)[:, None]))
        tables.append(t)
    jax.block_until_ready(tables)
    return meshes, tables


def exact_per_mesh(problems, limit, chain: bool, milp_time_limit_s: float = MILP_TIME_LIMIT_S, smallest=None,
                   upper_s: float = np.inf, dp_time_limit_s: float | None = None):
    """Best exact plan over the meshes with DP (chains; with runs of
    recomputed layers, chains in layer order) and MILP; times of each.
    ``smallest``: per problem, a smallest memory the solvers take instead of
    searching it themselves (None: they search it); ``upper_s``: the time
    of a plan found elsewhere (the gradient method's best), which the DP
    over the layer order only searches below (with_layer_order_bounds),
    within ``dp_time_limit_s`` per mesh (None: ``milp_time_limit_s``)."""
    smallest = [None] * len(problems) if smallest is None else smallest
    out = {"dp_s": None, "milp_s": 0.0, "dp": None, "milp": None, "order_dp_s": None}
    if chain and all(dp_solves(p) for p in problems):
        t0 = time.perf_counter()
        res = [solve_dp(p, limit, smallest=mm) for p, mm in zip(problems, smallest, strict=True)]
        out["dp_s"] = time.perf_counter() - t0
        out["dp"] = res
    t0 = time.perf_counter()
    out["milp"] = [solve_milp(p, limit, time_limit_s=milp_time_limit_s, smallest=mm)
                   for p, mm in zip(problems, smallest, strict=True)]
    out["milp_s"] = time.perf_counter() - t0
    if not chain and not all(r.exact or not r.feasible for r in out["milp"]):
        dp_s = milp_time_limit_s if dp_time_limit_s is None else dp_time_limit_s
        out["milp"], out["order_dp_s"] = with_layer_order_bounds(problems, out["milp"], limit, dp_s, smallest, upper_s)
    return out


class _Ref:
    """An exact solver's answer on one mesh: the plan, whether it fits and
    is proven fastest, and the lower bound on the fastest plan's time."""

    def __init__(self, time_s, feasible, exact, lower_bound_s):
        self.time_s, self.feasible, self.exact, self.lower_bound_s = time_s, feasible, exact, lower_bound_s


def with_layer_order_bounds(problems, milp, limit, time_limit_s, smallest, upper_s: float = np.inf):
    """On a graph with branches whose plans hold runs, where the MILP
    proved no optimum on some mesh: per mesh, the DP over the graph in
    layer order (``search.solve_dp``: exact where it completes), or, where
    ``search.exact.runs`` declines the graph, over the layer-order problem
    with skip edges' resharding at its least (``search.layer_order_chain(p,
    "lower")``, no slower than the graph and exactly as large), within
    ``time_limit_s``, with the MILP's plan to beat (``incumbent``). Its
    lower bound bounds the graph's fastest plan, and its plan, timed on the
    graph, fits there; each mesh's answer is the better plan and the higher
    bound of the two solvers. The DP searches only below the fastest plan
    known on any mesh (the MILP's, the DP's on the meshes before, and
    ``upper_s``: a plan is proven fastest once no mesh's bound is below
    it), so where it finds none, its bound is that time and its mesh's
    answer the MILP's plan. Returns the answers and the DP's seconds."""
    t0 = time.perf_counter()
    upper_s = min([upper_s] + [m.time_s for m in milp if m.feasible])
    out = []
    for p, m, mm in zip(problems, milp, smallest, strict=True):
        if m.exact or not has_runs(p) or np.any(p.edge_src >= p.edge_dst):
            out.append(m)
            continue
        q = p if run_chain(p) is not None else layer_order_chain(p, "lower")
        if q is not p and run_chain(q) is None:
            out.append(m)
            continue
        # from the MILP's plan (the labels search each interval up to the best plan found)
        r = solve_dp(q, limit, time_limit_s=time_limit_s, smallest=mm, incumbent=m.choice if m.feasible else None,
                     max_labels=REFERENCE_MAX_LABELS, upper_s=upper_s * (1 + 1e-9))
        t_dp = plan_time(p, r.choice) if r.feasible else np.inf  # its plan, timed on the graph
        t_milp = m.time_s if m.feasible else np.inf
        bound = max(r.lower_bound_s, m.lower_bound_s if m.feasible else -np.inf)
        t = min(t_dp, t_milp)
        upper_s = min(upper_s, t_dp)  # the next meshes search below this mesh's plan too
        out.append(_Ref(t, bool(np.isfinite(t)), bool(np.isfinite(t) and bound >= t * (1 - 1e-9)),
                        bound if np.isfinite(t) else np.inf))
    return out, time.perf_counter() - t0


def without_levers(p):
    """The problem ``p`` with every option but the lever-free ones ruled out."""
    plain = (p.option_lever == 0)[None, :]
    inf = lambda x: np.where(plain, x, np.inf)  # noqa: E731
    return p._replace(feasible=p.feasible & plain, layer_time_s=inf(p.layer_time_s),
                      persistent_bytes=inf(p.persistent_bytes), workspace_bytes=inf(p.workspace_bytes),
                      optimizer_bytes=inf(p.optimizer_bytes))


def best(results):
    """(time, index, exact) of the fastest feasible result, or None."""
    fits = [(r.time_s, i) for i, r in enumerate(results) if r.feasible]
    if not fits:
        return None
    t, i = min(fits)
    return t, i, bool(results[i].exact)


def run(models, devices, hardware, levers: str = "none", milp_time_limit_s: float = MILP_TIME_LIMIT_S,
        remat_runs: bool = False, dp_time_limit_s: float | None = None, kinds=LIMIT_KINDS):
    rows = []
    header = (f"{'model':14s} {'hardware':9s} {'P':>5s} {'limit':>11s} {'GB':>8s} {'exact':>9s} {'mesh':>6s} "
              f"{'gradient':>9s} {'mesh':>6s} {'ratio':>8s} {'grad s':>7s} {'dp s':>7s} {'milp s':>8s}")
    if levers != "none":
        header += f" | {'grad s':>7s} {'dp s':>7s} {'milp s':>8s} (lever-free menu, its own limit of the kind)"
    print(header)
    print("-" * len(header))
    for name in models:
        graph = synthetic_chain() if name == "chain1000" else get_model(name)
        for hw_name in hardware:
            hw = load_hardware(hw_name)
            for P in devices:
                meshes, tables = tables_for(graph, hw, P, levers, remat_runs)
                problems = [discrete_problem(t) for t in tables]
                exact_problems = [compact_options(p).problem for p in problems]  # what solve gives its exact solvers
                if levers != "none":  # the lever-free menu beside it, timed on the same limits
                    _, plain_tables = tables_for(graph, hw, P)
                    plain_problems = [discrete_problem(t) for t in plain_tables]
                chain = chain_order(problems[0]) is not None
                t0 = time.perf_counter()
                mins = [smallest_memory(p, milp_time_limit_s) for p in exact_problems]
                need = min(mm.memory_bytes for mm in mins)
                limits = {"loose": max(hw.device.memory_bytes, 2.0 * need), "tight": need * 1.001}
                given = None  # the solvers search the smallest memory themselves where it is proven
                if all(mm.exact for mm in mins):
                    limits["infeasible"] = need * 0.99
                else:
                    given = mins
                    print(f"  {name} {hw_name} P={P}: smallest memory not proven within {milp_time_limit_s:g} s "
                          f"per mesh ({time.perf_counter() - t0:.0f} s): {need / 1e9:.3f} GB found, limits from it, "
                          "no infeasible instance", flush=True)
                plain_limits = {}
                if levers != "none":
                    need_plain = min(minimum_memory(without_levers(p)).memory_bytes for p in problems)
                    # the lever-free menu's own instance of each kind, for its search times beside
                    plain_limits = {"loose": max(hw.device.memory_bytes, 2.0 * need_plain),
                                    "tight": need_plain * 1.001, "infeasible": need_plain * 0.99}
                    if need < 0.98 * need_plain:
                        limits["levers-only"] = (need + need_plain) / 2
                solve_many(tables, limits["loose"], "gradient")  # compile (cached after the first)
                if levers != "none":
                    solve_many(plain_tables, limits["loose"], "gradient")
                for kind, limit in limits.items():
                    if kind not in kinds:
                        continue
                    t0 = time.perf_counter()
                    grad = solve_many(tables, limit, "gradient")
                    grad_s = time.perf_counter() - t0
                    ex = exact_per_mesh(exact_problems, limit, chain, milp_time_limit_s, given,
                                        min([s.time_s for s in grad if s.feasible], default=np.inf), dp_time_limit_s)
                    plain = {}
                    if kind in plain_limits:
                        t0 = time.perf_counter()
                        solve_many(plain_tables, plain_limits[kind], "gradient")
                        plain = dict(grad_s=time.perf_counter() - t0,
                                     **exact_per_mesh(plain_problems, plain_limits[kind], chain, milp_time_limit_s))
                    # the DP's plans where it proved them all (over runs its label search may stop), else the MILP's
                    dp_proven = ex["dp"] is not None and all(r.exact or not r.feasible for r in ex["dp"])
                    ref = ex["dp"] if dp_proven else ex["milp"]
                    b_ex, b_gr = best(ref), best([_R(s) for s in grad])
                    milp_b = best(ex["milp"])
                    milp_proven = all(r.exact or not r.feasible for r in ex["milp"])  # on every mesh
                    if b_ex and milp_b and dp_proven and milp_proven and abs(milp_b[0] / b_ex[0] - 1) > 1e-5:
                        print(f"  ! DP and MILP disagree: {b_ex[0]} vs {milp_b[0]}")
                    ratio = b_gr[0] / b_ex[0] if (b_ex and b_gr) else None
                    # no plan is faster than the least of the meshes' lower bounds, where every mesh
                    # without a plan is proven to have none (its smallest memory is above the limit)
                    unsure = any(not r.feasible and not (mm.exact and mm.memory_bytes > limit)
                                 for r, mm in zip(ref, mins, strict=True))
                    bound = None if unsure else min((r.lower_bound_s for r in ref if r.feasible), default=None)
                    row = dict(model=name, hardware=hw_name, P=P, kind=kind, limit=limit,
                               exact_feasible=b_ex is not None, grad_feasible=b_gr is not None,
                               exact_time=b_ex[0] if b_ex else None,
                               # proven where no mesh's bound is below it (a mesh's own proof is not enough)
                               exact_proven=(bound is not None and bound >= b_ex[0] * (1 - 1e-9)) if b_ex else None,
                               exact_bound=bound,
                               exact_mesh=meshes[b_ex[1]] if b_ex else None,
                               grad_time=b_gr[0] if b_gr else None, grad_mesh=meshes[b_gr[1]] if b_gr else None,
                               ratio=ratio, grad_s=grad_s, dp_s=ex["dp_s"], milp_s=ex["milp_s"], dag=not chain,
                               plain_grad_s=plain.get("grad_s"), plain_dp_s=plain.get("dp_s"),
                               plain_milp_s=plain.get("milp_s"))
                    # every gradient plan must really fit
                    for s, p in zip(grad, problems, strict=True):
                        if s.feasible:
                            assert plan_memory(p, s.choice) <= limit and abs(plan_time(p, s.choice) - s.time_s) < 1e-12
                    if kind == "levers-only":  # every plan that fits uses a lever
                        for s, p in zip(grad, problems, strict=True):
                            assert not s.feasible or any(p.option_lever[list(s.choice)])
                    rows.append(row)
                    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
                    mesh_txt = lambda m: "-" if m is None else f"{m[0]}x{m[1]}"  # noqa: E731
                    print(f"{name:14s} {hw_name:9s} {P:5d} {kind:>11s} {limit / 1e9:8.3f} "
                          f"{fmt(row['exact_time'] and row['exact_time'] * 1e3, '9.3f')} {mesh_txt(row['exact_mesh']):>6s} "
                          f"{fmt(row['grad_time'] and row['grad_time'] * 1e3, '9.3f')} {mesh_txt(row['grad_mesh']):>6s} "
                          f"{fmt(ratio, '8.5f')} {grad_s:7.3f} {fmt(ex['dp_s'], '7.3f')} {ex['milp_s']:8.3f}"
                          + (f" | {plain['grad_s']:7.3f} {fmt(plain['dp_s'], '7.3f')} {plain['milp_s']:8.3f}"
                             if plain else "")
                          + _notes(row["exact_proven"] in (None, True), bound, ex["order_dp_s"]),
                          flush=True)
    return rows


def _notes(proven: bool, bound, order_dp_s) -> str:
    """A row's remarks: an unproven reference and its bound; the DP over the
    layer order's seconds where it ran (with_layer_order_bounds)."""
    notes = [] if proven else [f"exact solvers not proven optimal; their bound "
                               f"{'-' if bound is None else format(bound * 1e3, '.3f')} ms"]
    if order_dp_s is not None:
        notes.append(f"DP over the layer order {order_dp_s:.1f} s")
    return f"  ({'; '.join(notes)})" if notes else ""


class _R:
    """A Solution seen as the exact results are (time_s, feasible, exact)."""

    def __init__(self, s):
        self.time_s, self.feasible, self.exact = s.time_s, s.feasible, False


def summary(rows, timings) -> dict:
    """Print the run's summary; return its numbers."""
    feas = [r for r in rows if r["exact_feasible"]]
    infeas = [r for r in rows if not r["exact_feasible"]]
    ratios = np.array([r["ratio"] for r in feas if r["ratio"] is not None])
    solved = sum(r["grad_feasible"] for r in feas)
    reported = sum(not r["grad_feasible"] for r in infeas)
    dag = [r for r in feas if r["dag"] or r["dp_s"] is None]  # the MILP is the exact reference
    speed = np.array([r["milp_s"] / r["grad_s"] for r in dag])
    agg = sum(r["milp_s"] for r in dag) / max(sum(r["grad_s"] for r in dag), 1e-12)
    by_kind = {k: np.array([r["milp_s"] / r["grad_s"] for r in dag if r["kind"] == k])
               for k in ("loose", "tight", "levers-only") if any(r["kind"] == k for r in dag)}
    out = {"instances": len(rows), "feasible": len(feas), "infeasible": len(infeas),
           "median_ratio": float(np.median(ratios)), "mean_ratio": float(ratios.mean()),
           "worst_ratio": float(ratios.max()), "within_0_5_percent": int(sum(ratios <= 1.005)),
           "within_2_percent": int(sum(ratios <= 1.02)), "rated": int(ratios.size),
           "feasible_solved": int(solved), "infeasible_reported": int(reported), "timings": timings}
    print()
    print(f"instances {len(rows)} ({len(feas)} feasible, {len(infeas)} infeasible)")
    print(f"gradient / exact time: median {np.median(ratios):.5f}, mean {ratios.mean():.5f}, worst {ratios.max():.5f} "
          f"({sum(ratios <= 1.005)} of {ratios.size} within 0.5 %, {sum(ratios <= 1.02)} within 2 %)")
    unproven = [r for r in feas if r["exact_proven"] is False]
    if unproven:
        gaps = [r["grad_time"] / r["exact_bound"] for r in unproven
                if r["grad_time"] is not None and r["exact_bound"]]
        print(f"  of which {len(unproven)} against the exact solvers' best plan within their time limits, not proven "
              f"optimal; gradient / their lower bound there: "
              + (f"median {np.median(gaps):.5f}, worst {max(gaps):.5f} over {len(gaps)}" if gaps else "no bound"))
        # the gradient method's time over the optimum is at most its time over the lower bound: proven limits
        most = np.array([r["ratio"] if r["exact_proven"] is not False else r["grad_time"] / r["exact_bound"]
                         for r in feas if r["grad_time"] is not None
                         and (r["exact_proven"] is not False or r["exact_bound"])])
        out.update(unproven=len(unproven), gradient_over_bound_median=float(np.median(gaps)) if gaps else None,
                   gradient_over_bound_worst=float(max(gaps)) if gaps else None)
        if most.size:
            out.update(at_most_median=float(np.median(most)), at_most_worst=float(most.max()))
            print(f"gradient / optimum, proven at most (gradient / lower bound where no optimum is proven): median "
                  f"{np.median(most):.5f}, worst {most.max():.5f} over {most.size} of {len(feas)} feasible instances")
    rated = [r for r in feas if r["ratio"] is not None]
    worst = rated[int(np.argmax([r["ratio"] for r in rated]))]
    print(f"worst instance: {worst['model']} {worst['hardware']} P={worst['P']} {worst['kind']}")
    out["worst_instance"] = f"{worst['model']} {worst['hardware']} P={worst['P']} {worst['kind']}"
    print(f"feasible instances solved feasibly by the gradient method: {solved} of {len(feas)}")
    print(f"infeasible instances reported infeasible: {reported} of {len(infeas)}")
    if dag:
        out.update(milp_over_gradient_median=float(np.median(speed)), milp_over_gradient_min=float(speed.min()),
                   milp_over_gradient_max=float(speed.max()), milp_over_gradient_aggregate=float(agg),
                   dag_instances=len(dag),
                   milp_over_gradient_median_by_limit={k: float(np.median(v)) for k, v in by_kind.items()})
        print(f"DAG models and chains the DP does not take (feasible instances), MILP time / gradient time: "
              f"median {np.median(speed):.1f}x, "
              f"min {speed.min():.1f}x, max {speed.max():.1f}x, aggregate {agg:.1f}x over {len(dag)} instances; "
              + ", ".join(f"{k}: median {np.median(v):.1f}x (min {v.min():.1f}x)" for k, v in by_kind.items()))
    else:
        print("DAG models: none among these instances (the chains are solved by the DP)")
    both = [r for r in rows if r["dp_s"] is not None]
    if both:
        x = np.array([r["dp_s"] / r["milp_s"] for r in both])
        out.update(dp_over_milp_median=float(np.median(x)), dp_over_milp_max=float(x.max()), chain_instances=len(both))
        print(f"DP time / MILP time on chains: median {np.median(x):.2f}x, max {x.max():.2f}x, aggregate "
              f"{sum(r['dp_s'] for r in both) / sum(r['milp_s'] for r in both):.2f}x over {len(both)} instances")
    timed = [r for r in rows if r.get("plain_grad_s")]
    if timed:
        ratio_of = lambda a, b: np.array([r[a] / r[b] for r in timed if r[a] is not None and r[b]])  # noqa: E731
        for label, a, b in (("gradient", "grad_s", "plain_grad_s"), ("DP", "dp_s", "plain_dp_s"),
                            ("MILP", "milp_s", "plain_milp_s")):
            x = ratio_of(a, b)
            if x.size:
                out[f"with_levers_over_lever_free_{label.lower()}_median"] = float(np.median(x))
                print(f"search time with levers / lever-free menu, {label}: median {np.median(x):.1f}x, "
                      f"max {x.max():.1f}x over {x.size} instances")
    for k, v in timings.items():
        print(f"{k}: {v}")
    milp_txt = (f"milp_over_gradient_median={np.median(speed):.1f}x aggregate={agg:.1f}x" if dag
                else "milp_over_gradient_median=n/a (no DAG instances)")
    print(f"SUMMARY median_ratio={np.median(ratios):.5f} worst_ratio={ratios.max():.5f} "
          f"feasible_solved={solved}/{len(feas)} infeasible_reported={reported}/{len(infeas)} {milp_txt}")
    return out


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two models, two device counts")
    ap.add_argument("--models", help=f"comma-separated subset of {','.join(MODELS)} (the timings first as always)")
    ap.add_argument("--levers", default="none", choices=LEVER_CHOICES,
                    help="memory levers on the menu (and the levers-only limit)")
    ap.add_argument("--remat-runs", action="store_true",
                    help="offer recomputing in runs on every layer that saves activations "
                         "(CostSettings.remat_runs; needs --levers remat or all)")
    ap.add_argument("--skip-timings", action="store_true", help="skip the planner timings printed first")
    ap.add_argument("--milp-time-limit", type=float, default=MILP_TIME_LIMIT_S,
                    help=f"seconds per mesh for the exact MILP (default {MILP_TIME_LIMIT_S:g}); "
                    "rows it does not prove optimal say so")
    ap.add_argument("--dp-time-limit", type=float,
                    help="seconds per mesh for the DP over the layer order, the reference on graphs with branches "
                    "whose plans hold runs where the MILP proves no optimum (default: --milp-time-limit)")
    ap.add_argument("--limits", help=f"comma-separated subset of the limits {','.join(LIMIT_KINDS)} (default: all)")
    ap.add_argument("--hardware", help=f"comma-separated subset of {','.join(HARDWARE)}")
    ap.add_argument("--devices", help="comma-separated device counts (default: 8,64,256,1024; --quick: 8,256)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    if args.hardware and set(args.hardware.split(",")) - set(HARDWARE):
        ap.error(f"unknown hardware {args.hardware!r}; choose from {', '.join(HARDWARE)}")
    if args.devices and not all(x.isdigit() and int(x) > 0 for x in args.devices.split(",")):
        ap.error(f"--devices takes positive integers separated by commas, not {args.devices!r}")
    if args.limits and set(args.limits.split(",")) - set(LIMIT_KINDS):
        ap.error(f"unknown limit(s) in {args.limits!r}; choose from {', '.join(LIMIT_KINDS)}")
    if args.remat_runs and args.levers not in ("remat", "all"):
        ap.error("--remat-runs needs --levers remat or all")
    if args.models:
        unknown = sorted(set(args.models.split(",")) - set(MODELS))
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} device(s), "
          f"{os.cpu_count()} cpu(s)")
    print(f"levers: {args.levers}" + (", recomputing in runs on every layer" if args.remat_runs else ""))
    timings = {} if args.skip_timings else planner_timings()
    models = tuple(args.models.split(",")) if args.models else ("vgg16", "resnet50") if args.quick else MODELS
    devices = (8, 256) if args.quick else DEVICES
    hardware = tuple(args.hardware.split(",")) if args.hardware else HARDWARE
    if args.devices:
        devices = tuple(int(x) for x in args.devices.split(","))
    if args.dp_time_limit is not None and not args.dp_time_limit > 0:
        ap.error(f"--dp-time-limit must be positive, not {args.dp_time_limit:g}")
    kinds = tuple(args.limits.split(",")) if args.limits else LIMIT_KINDS
    rows = run(models, devices, hardware, args.levers, args.milp_time_limit, args.remat_runs, args.dp_time_limit,
               kinds)
    numbers = summary(rows, timings)
    selected = any((args.models, args.hardware, args.devices, args.limits, args.skip_timings))
    mode = ("quick" if args.quick else "full") + (", selected" if selected else "")
    write_results(args.json, __file__, mode, {**numbers, "levers": args.levers, "remat_runs": args.remat_runs},
                  rows, argv)


def planner_timings() -> dict:
    """``planner.plan``'s wall time on the 1,000-layer chain and ResNet-50."""
    timings = {}
    # the 1,000-layer chain first, in a fresh process: compilation included
    t0 = time.perf_counter()
    chain = synthetic_chain()
    p = plan(chain, devices=64, hardware="dgx-a100", method="gradient")
    timings["chain1000 on 64 x dgx-a100, gradient, incl. compilation"] = f"{time.perf_counter() - t0:.2f} s (mesh {p.mesh[0]}x{p.mesh[1]})"
    t0 = time.perf_counter()
    plan(chain, devices=64, hardware="dgx-a100", method="gradient")
    timings["chain1000 on 64 x dgx-a100, gradient, compiled"] = f"{time.perf_counter() - t0:.2f} s"
    t0 = time.perf_counter()
    plan(chain, devices=64, hardware="dgx-a100", method="dp")
    timings["chain1000 on 64 x dgx-a100, dp"] = f"{time.perf_counter() - t0:.2f} s"
    t0 = time.perf_counter()
    plan("resnet50", devices=256, hardware="dgx-a100")
    timings["resnet50 on 256 x dgx-a100, auto (gradient), incl. compilation"] = f"{time.perf_counter() - t0:.2f} s"
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        plan("resnet50", devices=256, hardware="dgx-a100")
        runs.append(time.perf_counter() - t0)
    timings["resnet50 on 256 x dgx-a100, auto (gradient), compiled, best of 3"] = f"{min(runs):.3f} s"
    return timings


if __name__ == "__main__":
    main()
