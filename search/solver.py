"""``solve``: the fastest plan of a cost table within a memory limit.

Methods:

* ``"gradient"``: the relaxed gradient search (:mod:`search.gradient`),
  whose rounded restarts, together with three simple plans (data parallel
  where possible, each layer's fastest strategy, the smallest-memory plan),
  are repaired and improved by local search (:mod:`search.local.refinement`);
* ``"dp"``: the exact dynamic programme, chain graphs only (:mod:`search.exact.dp`);
* ``"milp"``: the exact MILP, any DAG (:mod:`search.exact.milp`);
* ``"auto"``: the fastest method that certifies the optimum: ``dp`` on
  chains; otherwise the MILP, stopped after :data:`AUTO_MILP_TIME_LIMIT_S`
  per table (or the caller's shorter limit). A table it does not solve to
  optimality in that time goes to ``gradient`` too, and the better of the
  two plans is kept, with the MILP's bound; likewise where the DP does not
  prove its plan. On a table with runs of recomputed layers, ``auto`` (and
  ``dp``) first take the fastest plan without runs where it fits, which is
  then the fastest of all (:func:`search.options.recomputing_saves_no_time`);
  else ``auto`` runs the DP over runs on chains in layer order, its
  completion within the same time limit, and the MILP elsewhere. (The MILP certifies ResNet-50
  and ResNet-152 on 1,024 GPUs in well under a second per mesh, faster than
  the gradient search compiles: ``docs/benchmarks.md``, CLI latency.)

:func:`solve_many` does the same for a batch of same-shaped tables (e.g. one
model on every mesh shape), running the gradient search for all of them in
one vmapped call.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import Strategy
from search.exact import MinimumMemory, dp_solves, lagrangian_plans, smallest_memory, solve_dp, solve_milp
from search.gradient import GradientConfig, relaxed_search
from search.local import drop_idle_levers, refine
from search.options import compact_options, plain_options, recomputing_saves_no_time, without_recomputing
from search.problem import DiscreteProblem, discrete_problem, has_runs, plan_memory, plan_time
from search.solution import HistoryEntry, SearchEvent, Solution

__all__ = ["AUTO_MILP_TIME_LIMIT_S", "METHODS", "SMALLEST_RETRY_TIME_LIMIT_S", "TIME_BUDGET_S", "solve", "solve_many",
           "heuristic_plans", "retry_smallest"]

METHODS = ("auto", "gradient", "dp", "milp")
AUTO_MILP_TIME_LIMIT_S = 5.0  # seconds per table the "auto" MILP may take before the gradient search joins in
# seconds per table the smallest memory may take where, within AUTO_MILP_TIME_LIMIT_S, it found no plan that fits
# and proved none: repair needs a plan that fits as its target (ResNet-152 with runs on 64x4 V100s: 21 s)
SMALLEST_RETRY_TIME_LIMIT_S = 60.0
# The default paths' time budget ("auto" and "gradient", all tables together): its exact stages (the smallest
# memory, the MILP or the DP over runs) take at most EXACT_SHARE of what is left each time, split among the
# tables still to solve, the local search the rest; every stage gets at least MIN_STAGE_S per table, so a
# large model may overrun the budget by those minimums. ResNet-152 with every lever on 64 V100s (three mesh
# shapes, 514 layers): its local search alone took about 190 s unbounded.
TIME_BUDGET_S = 40.0
EXACT_SHARE = 0.1
MIN_STAGE_S = 1.0

Callback = Callable[[SearchEvent], None] | None


def retry_smallest(p: DiscreteProblem, found: MinimumMemory, limit_bytes: float,
                   time_limit_s: float = SMALLEST_RETRY_TIME_LIMIT_S) -> MinimumMemory | None:
    """Where ``found`` (:func:`search.exact.milp.smallest_memory` within a shorter
    time) neither fits ``limit_bytes`` nor is proven smallest, the better of
    it and the same search within ``time_limit_s``: a plan that fits, or the
    proof that none does, with more time. None where ``found`` settles it."""
    if found.exact or found.memory_bytes <= limit_bytes:
        return None
    return min(found, smallest_memory(p, time_limit_s), key=lambda m: (m.memory_bytes, not m.exact))


def _limit(memory_limit, p: DiscreteProblem) -> float:
    if memory_limit is None:
        return p.memory_capacity_bytes
    limit = float(memory_limit)
    if not limit > 0:
        raise ValueError(f"memory limit must be a positive number of bytes, got {memory_limit!r}")
    return limit


def heuristic_plans(p: DiscreteProblem, smallest: MinimumMemory | None = None) -> np.ndarray:
    """Three plans ``[3, n]``: data parallel wherever possible (else
    replicated, else the fastest), without levers, each layer's fastest
    option, and the smallest-memory plan (``smallest``, where the caller has it)."""
    fastest = np.argmin(p.layer_time_s, axis=1)
    plain = plain_options(p)
    dp, rep = plain[Strategy.DATA], plain[Strategy.REPLICATED]
    can = lambda o: p.feasible[:, o] if o >= 0 else np.zeros(p.num_layers, bool)  # noqa: E731
    data = np.where(can(dp), dp, np.where(can(rep), rep, fastest))
    return np.stack([data, fastest, (smallest_memory(p) if smallest is None else smallest).choice])


def _finite(seconds: float) -> float | None:
    """A history time, None where no candidate fitted (infinite)."""
    return float(seconds) if np.isfinite(seconds) else None


def _gap(time_s: float, bound: float | None) -> float | None:
    if bound is None or not np.isfinite(bound) or bound <= 0:
        return None
    gap = time_s / bound - 1.0
    return 0.0 if gap < 1e-9 else gap  # time and bound are the same sum, rounded in another order


def _stack(tables: Sequence) -> object:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *tables)


def _emit(callback: Callback, stage: str, message: str, table: int | None = None, time_s: float | None = None):
    if callback is not None:
        callback(SearchEvent(stage, message, table, time_s))


def _fastest_without_runs(p: DiscreteProblem, limit: float, chain: bool, time_limit_s: float,
                          option_ids: np.ndarray, seed: int, num_options: int) -> Solution | None:
    """``auto`` on a problem with runs of recomputing layers: recomputing
    (alone or in runs) lowers memory and never time
    (:func:`search.options.recomputing_saves_no_time`), so the fastest plan
    without it, found exactly by the DP (chains) or the MILP, is the fastest
    of all where it fits: no MILP over runs is needed, nor the smallest
    memory, which only such an MILP gives (``min_memory_bytes`` is then
    None). None where it does not fit (or is not proven fastest)."""
    start = _time.perf_counter()
    if not recomputing_saves_no_time(p):
        return None
    free = without_recomputing(p)
    r = solve_dp(free) if chain else solve_milp(free, time_limit_s=time_limit_s)
    if not (r.feasible and r.exact and plan_memory(p, r.choice) <= limit):
        return None
    method = "dp" if chain else "milp"
    choice = drop_idle_levers(p, r.choice, limit)
    time_s, mem = plan_time(p, choice), plan_memory(p, choice)
    return Solution(
        choice=tuple(int(s) for s in option_ids[choice]), time_s=time_s, memory_bytes=mem, memory_limit_bytes=limit,
        feasible=True, min_memory_bytes=None, method=method, seed=seed, lower_bound_s=r.lower_bound_s,
        optimality_gap=_gap(time_s, r.lower_bound_s), seconds=_time.perf_counter() - start,
        history=(HistoryEntry(method, r.time_s, r.memory_bytes, True),), num_options=num_options,
    )


def _proven(mm: MinimumMemory) -> float | None:
    """The smallest memory where it is proven (else None: ``Solution.min_memory_bytes``)."""
    return mm.memory_bytes if mm.exact else None


def solve(table, memory_limit=None, method: str = "auto", seed: int = 0, callback: Callback = None, *,
          config: GradientConfig = GradientConfig(), milp_time_limit_s: float | None = None,
          time_budget_s: float | None = TIME_BUDGET_S) -> Solution:
    """The fastest plan of one ``CostTable`` within ``memory_limit`` bytes per
    device (default: the device's capacity). If no plan fits, the returned
    :class:`Solution` has ``feasible=False`` and is the smallest-memory plan."""
    return solve_many([table], memory_limit, method, seed, callback, config=config,
                      milp_time_limit_s=milp_time_limit_s, time_budget_s=time_budget_s)[0]


def solve_many(tables: Sequence, memory_limit=None, method: str = "auto", seed: int = 0, callback: Callback = None,
               *, config: GradientConfig = GradientConfig(), milp_time_limit_s: float | None = None,
               time_budget_s: float | None = TIME_BUDGET_S) -> list[Solution]:
    """:func:`solve` for several cost tables of the same shapes (one model on
    several meshes); the gradient search runs for all of them in one call.

    ``time_budget_s`` bounds the default paths, ``auto`` and ``gradient``,
    over all tables (:data:`TIME_BUDGET_S`; None: unbounded): the exact
    stages get shares of it and the local search stops where it is when its
    share is spent (the plan it returns fits; a stage reached with the
    budget spent still gets :data:`MIN_STAGE_S` per table). ``dp`` and
    ``milp``, the exact references, ignore it."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0):
        raise ValueError(f"time_budget_s must be a positive number of seconds or None, got {time_budget_s!r}")
    tables = list(tables)
    if not tables:
        return []
    start = _time.perf_counter()
    # the solvers search each problem without the options no layer can run, and map back
    compact = [compact_options(discrete_problem(t)) for t in tables]
    problems = [c.problem for c in compact]
    runs = [has_runs(p) for p in problems]
    option_ids = [c.option_ids for c in compact]
    limits = [_limit(memory_limit, p) for p in problems]
    chains = [dp_solves(p) for p in problems]
    if method == "dp" and not all(chains):
        raise ValueError("method 'dp' needs a chain graph (every layer feeds only the next; in layer order where "
                         "plans may recompute layers in runs); use 'milp', 'gradient' or 'auto' for other graphs")
    _emit(callback, "start", f"{len(tables)} table(s), {problems[0].num_layers} layers, method {method}")
    out: list[Solution | None] = [None] * len(tables)
    seconds = [0.0] * len(tables)
    auto_limit = AUTO_MILP_TIME_LIMIT_S if milp_time_limit_s is None else min(milp_time_limit_s,
                                                                               AUTO_MILP_TIME_LIMIT_S)
    deadline = None if time_budget_s is None or method != "auto" else start + time_budget_s

    def stage_s(parts: int, ceiling: float = auto_limit, share: float = EXACT_SHARE) -> float:
        """An exact stage's time limit per table: ``ceiling``, within its share of the budget left."""
        if deadline is None:
            return ceiling
        return min(ceiling, max(MIN_STAGE_S, share * (deadline - _time.perf_counter()) / max(parts, 1)))

    if method in ("auto", "dp"):
        for i in [i for i in range(len(tables)) if runs[i]]:
            out[i] = _fastest_without_runs(problems[i], limits[i], chains[i], stage_s(len(tables)), option_ids[i],
                                           seed, tables[i].feasible.shape[-1])
            if out[i] is not None:
                seconds[i] = out[i].seconds
                _emit(callback, out[i].method, f"table {i}: the fastest plan without runs fits "
                      f"({out[i].method}, {seconds[i]:.3f} s)", i, out[i].time_s)
    # the smallest memory of every table left: the MILP's where plans may hold runs, within the
    # MILP's time limit (auto and gradient: auto's; not proven then, MinimumMemory.exact)
    smallest_limit = milp_time_limit_s if method == "milp" else stage_s(len(tables))
    mins: list[MinimumMemory | None] = []
    slow = set()  # tables whose smallest memory took its whole time limit unproven (the MILP is slow there)
    for i, p in enumerate(problems):
        t = _time.perf_counter()
        mins.append(None if out[i] is not None else smallest_memory(p, smallest_limit))
        if mins[i] is not None and not mins[i].exact and smallest_limit is not None \
                and _time.perf_counter() - t >= smallest_limit:
            slow.add(i)
    # a plan that fits, or the proof that none does, with more time where neither came
    retry = SMALLEST_RETRY_TIME_LIMIT_S if milp_time_limit_s is None else min(milp_time_limit_s,
                                                                              SMALLEST_RETRY_TIME_LIMIT_S)
    retry = stage_s(1, retry, 0.5)
    if method != "milp" and retry > smallest_limit:
        for i, (p, mm) in enumerate(zip(problems, mins, strict=True)):
            again = None if mm is None else retry_smallest(p, mm, limits[i], retry)
            if again is not None:
                mins[i] = again
                _emit(callback, "minimum_memory", f"table {i}: no plan found within {smallest_limit:g} s fits; "
                      f"searched {retry:g} s for the smallest memory", i)
    for i, (p, lim, mm) in enumerate(zip(problems, limits, mins, strict=True)):
        if mm is not None and mm.exact and mm.memory_bytes > lim:
            out[i] = Solution(
                choice=tuple(int(s) for s in option_ids[i][mm.choice]), time_s=plan_time(p, mm.choice),
                memory_bytes=mm.memory_bytes,
                memory_limit_bytes=lim, feasible=False, min_memory_bytes=mm.memory_bytes, method=method, seed=seed,
                lower_bound_s=None, optimality_gap=None, seconds=0.0,
                history=(HistoryEntry("minimum_memory", plan_time(p, mm.choice), mm.memory_bytes, False),),
                num_options=tables[i].feasible.shape[-1],
            )
    todo = [i for i in range(len(tables)) if out[i] is None]
    plan_of = {i: ("dp" if chains[i] else "milp") if method == "auto" else method for i in todo}
    unproven = {}  # auto: (method, result) of the exact solver where it did not prove its plan optimal in time
    if deadline is not None:
        # under the budget, a table whose smallest memory the MILP did not settle in its whole time goes to
        # the gradient search at once: the fastest plan is a larger MILP still, and the time is the local search's
        for i in [i for i in todo if plan_of[i] == "milp" and i in slow]:
            plan_of[i] = "gradient"
            _emit(callback, "milp", f"table {i}: the MILP did not settle the smallest memory in {smallest_limit:g} s; "
                  "the gradient search plans it within the time budget", i)

    ctx = _Search(tables, compact, limits, mins, out, seconds, seed, callback)
    _exact_stage(ctx, [i for i in todo if plan_of[i] in ("dp", "milp")], plan_of, unproven, runs, method,
                 milp_time_limit_s, stage_s)
    grad_idx = [i for i in todo if plan_of[i] == "gradient"]
    if grad_idx:
        _gradient_stage(ctx, grad_idx, unproven, config, deadline, stage_s)
    if deadline is not None and grad_idx and _time.perf_counter() > deadline:
        _emit(callback, "budget", f"time budget of {time_budget_s:g} s spent: the local search stopped where it was "
              "(time_budget_s=None, CLI --time-budget 0: search to the end)")
    _emit(callback, "done", f"searched in {_time.perf_counter() - start:.3f} s")
    return [s for s in out if s is not None]


class _Search(NamedTuple):
    """One :func:`solve_many` call's tables and what its stages fill in, per table."""

    tables: Sequence  # the cost tables
    compact: list  # [k] CompactProblem: each table without the options no layer runs
    limits: list[float]  # [k] bytes per device
    mins: list[MinimumMemory | None]  # [k] the smallest memory found (None: not needed)
    out: list[Solution | None]  # [k] filled by the stages
    seconds: list[float]  # [k] time spent per table
    seed: int
    callback: Callback

    @property
    def problems(self) -> list[DiscreteProblem]:  # [k] the compact problems the solvers search
        return [c.problem for c in self.compact]

    @property
    def option_ids(self) -> list[np.ndarray]:  # [k] compact column -> table option
        return [c.option_ids for c in self.compact]


def _exact_stage(ctx: _Search, exact: list[int], plan_of: dict[int, str], unproven: dict, runs: list[bool],
                 method: str, milp_time_limit_s: float | None, stage_s: Callable[[int], float]) -> None:
    """The exact solvers (``dp`` or ``milp``) on the tables ``exact``; under
    ``auto`` a table they do not prove goes to the gradient search
    (``plan_of``), its incumbent and bound kept in ``unproven``."""
    for n_done, i in enumerate(exact):
        t = _time.perf_counter()
        p = ctx.problems[i]
        auto_limit = stage_s(len(exact) - n_done)
        if plan_of[i] == "dp":
            # auto: the completion over runs within the MILP's time limit (runs need it most)
            r = solve_dp(p, ctx.limits[i], time_limit_s=auto_limit if method == "auto" and runs[i] else None,
                         smallest=ctx.mins[i])
            # (not feasible: proven where its bound is infinite; else the smallest memory was not proven)
            if method == "auto" and not r.exact and (r.feasible or np.isfinite(r.lower_bound_s)):
                unproven[i], plan_of[i], ctx.seconds[i] = (plan_of[i], r), "gradient", _time.perf_counter() - t
                _emit(ctx.callback, "dp", f"table {i}: the DP did not prove an optimum within its label budget or "
                      f"{auto_limit:g} s; the gradient search joins in", i)
                continue
        else:
            r = solve_milp(p, ctx.limits[i], time_limit_s=auto_limit if method == "auto" else milp_time_limit_s,
                           smallest=ctx.mins[i])
            if method == "auto" and not r.exact:
                unproven[i], plan_of[i], ctx.seconds[i] = (plan_of[i], r), "gradient", _time.perf_counter() - t
                _emit(ctx.callback, "milp", f"table {i}: the MILP did not prove an optimum in {auto_limit:g} s; "
                      "the gradient search joins in", i)
                continue
        choice, time_s, mem = r.choice, r.time_s, r.memory_bytes
        if r.feasible:
            choice = drop_idle_levers(p, r.choice, ctx.limits[i])
            time_s, mem = plan_time(p, choice), plan_memory(p, choice)
        ctx.seconds[i] = _time.perf_counter() - t
        ctx.out[i] = Solution(
            choice=tuple(int(s) for s in ctx.option_ids[i][choice]), time_s=time_s, memory_bytes=mem,
            memory_limit_bytes=ctx.limits[i], feasible=bool(r.feasible), min_memory_bytes=_proven(ctx.mins[i]),
            method=plan_of[i], seed=ctx.seed, lower_bound_s=r.lower_bound_s, optimality_gap=_gap(time_s, r.lower_bound_s),
            seconds=ctx.seconds[i], history=(HistoryEntry(plan_of[i], r.time_s, r.memory_bytes, bool(r.feasible)),),
            num_options=ctx.tables[i].feasible.shape[-1],
        )
        _emit(ctx.callback, plan_of[i], f"{plan_of[i]} done in {ctx.seconds[i]:.3f} s", i, time_s)


def _gradient_stage(ctx: _Search, grad_idx: list[int], unproven: dict, config: GradientConfig,
                    deadline: float | None, stage_s: Callable[[int], float]) -> None:
    """The gradient search on the tables ``grad_idx``, all in one vmapped
    call, then each rounded plan refined (within its share of the budget
    left before ``deadline``), beside the exact solver's incumbent where
    ``auto`` tried one (``unproven``)."""
    t = _time.perf_counter()
    K = len(grad_idx)
    # All tables go in (those that need no gradient search inactive), padded to a
    # power of two: the compiled shape depends only on the batch, not on which fit.
    Kp = 1 << (len(ctx.tables) - 1).bit_length()
    order = grad_idx + [i for i in range(len(ctx.tables)) if i not in grad_idx]
    order += [grad_idx[0]] * (Kp - len(order))
    lims = jnp.asarray([ctx.limits[i] if np.isfinite(ctx.limits[i]) else np.inf for i in order], jnp.float32)
    active = jnp.asarray([k < K for k in range(Kp)])
    key = jax.random.key(ctx.seed)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.asarray(order))
    res = relaxed_search(_stack([ctx.tables[i] for i in order]), lims, keys, config, active)
    res = jax.tree.map(np.asarray, res)
    share = (_time.perf_counter() - t) / K
    _emit(ctx.callback, "gradient", f"gradient search on {K} table(s) in {share * K:.3f} s")
    for k, i in enumerate(grad_idx):
        t = _time.perf_counter()
        p, lim = ctx.problems[i], ctx.limits[i]
        n = p.num_layers
        column = np.full(ctx.tables[i].feasible.shape[-1], -1, dtype=np.int64)  # table option -> compact column
        column[ctx.option_ids[i]] = np.arange(ctx.option_ids[i].size)
        # the rounding picks options the table can run; a duplicate maps to the option kept for it
        rounded = column[np.take_along_axis(ctx.compact[i].representative, res.choice[k][:, :n].T, axis=1).T]
        if (rounded < 0).any():
            raise RuntimeError("the gradient search rounded a layer to an option it cannot run")
        cands = np.concatenate([rounded, heuristic_plans(p, ctx.mins[i])], axis=0)
        mine = None if deadline is None else t + max(MIN_STAGE_S, (deadline - t) / (K - k))  # its share
        ref = refine(p, cands, lim, smallest=ctx.mins[i], relevel_time_limit_s=stage_s(1),
                     starts=lagrangian_plans(p, lim, deadline_s=mine), deadline_s=mine)
        fits_relaxed = res.memory_bytes[k] <= lim
        r_best = int(np.argmin(np.where(fits_relaxed, res.time_s[k], np.inf))) if fits_relaxed.any() else \
            int(np.argmin(res.memory_bytes[k]))
        history = [HistoryEntry("relaxed", float(a), float(b), bool(b <= lim))
                   for a, b in zip(res.trace_time_s[k][:, r_best], res.trace_memory_bytes[k][:, r_best], strict=True)]
        history += [
            HistoryEntry("rounded", _finite(ref.rounded_time_s), None, bool(np.isfinite(ref.rounded_time_s))),
            HistoryEntry("repaired", _finite(ref.repaired_time_s), None, bool(np.isfinite(ref.repaired_time_s))),
            HistoryEntry("local_search", ref.time_s, ref.memory_bytes, ref.feasible),
        ]
        choice, time_s, mem, bound, used = ref.choice, ref.time_s, ref.memory_bytes, None, "gradient"
        if i in unproven:  # auto: the MILP's incumbent and bound beside the gradient search's plan
            exact_method, m = unproven[i]
            history.append(HistoryEntry(exact_method, m.time_s, m.memory_bytes, m.feasible))
            bound = m.lower_bound_s
            if m.feasible and (mem > lim or m.time_s < time_s):  # it fits; the gradient's plan is slower or not
                choice, time_s, mem, used = m.choice, m.time_s, m.memory_bytes, exact_method
        if mem <= lim:
            choice = drop_idle_levers(p, choice, lim)
            time_s, mem = plan_time(p, choice), plan_memory(p, choice)
        ctx.seconds[i] += share + _time.perf_counter() - t  # (+ the auto MILP's time)
        ctx.out[i] = Solution(
            choice=tuple(int(s) for s in ctx.option_ids[i][choice]), time_s=float(time_s), memory_bytes=float(mem),
            memory_limit_bytes=lim, feasible=bool(mem <= lim), min_memory_bytes=_proven(ctx.mins[i]),
            method=used, seed=ctx.seed, lower_bound_s=bound, optimality_gap=_gap(time_s, bound),
            seconds=ctx.seconds[i], history=tuple(history), num_options=ctx.tables[i].feasible.shape[-1],
        )
        _emit(ctx.callback, "refine", f"table {i}: {time_s * 1e3:.3f} ms/iteration", i, float(time_s))
