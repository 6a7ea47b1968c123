"""``plan``: the fastest per-layer sharding of a model on ``P`` devices
within a memory limit, over every mesh shape ``d x m = P``.

For each factorisation (the model axis within one node unless allowed
otherwise, the data axis dividing the global batch) the cost model builds a
:class:`~costmodels.CostTable` (one compilation serves every mesh: ``d`` and
``m`` are traced), and :func:`search.solve_many` plans all meshes together
(the gradient search vmapped over them). The fastest plan that fits wins
(ties: the smaller model axis). A :class:`Plan` is plain data: the mesh, the
per-layer strategies and predicted costs (from :func:`planner.evaluate`,
so ``shardplan evaluate --plan`` on the written file reproduces them), the
speed-up over pure data parallelism, and how the search went.

What it is asked for is checked in :mod:`planner.plan_inputs` (the memory
limit, the margin kept free, the mesh shapes); the record it returns is
:mod:`planner.plans.record`'s (its file format: :mod:`planner.plans.file`).
"""

from __future__ import annotations

import functools
import time as _time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from costmodels import (
    AXIS_NAMES,
    Calibration,
    CostSettings,
    Hardware,
    Strategy,
    calibration_arrays,
    check_calibration,
    cost_table,
    hardware_arrays,
    lever_menu,
    load_hardware,
    schedule_note,
)
from planner._format import format_bytes_up
from planner._table_cache import cached_cost_table, cost_model_fingerprint
from planner._version import __version__
from planner.evaluation import evaluate, evaluation_of, remat_runs_offered
from planner.infeasible import FLOAT32_ROUNDING, InfeasibleMemoryError, infeasible_message
from planner.ir.graph import LayerGraph
from planner.models.transformer import TransformerConfig
from planner.pipelining import PIPELINE_CHOICES, decoder_config, pipelined_plan
from planner.preferred_plan import preferred_plan_fields
from planner.plan_inputs import (
    MEMORY_MARGIN,
    check_seed,
    device_count,
    memory_limit_bytes,
    memory_margin_bytes,
    mesh_shapes,
    parse_memory_limit,
    platform_of,
    resolve_batch,
)
from planner.plans.file import PLAN_SCHEMA, PLAN_VERSION  # the file format
from planner.plans.record import MeshResult, Plan
from planner.schedule_fit import fit_schedule
from planner.verification import verified_plan
from search import TIME_BUDGET_S, GradientConfig, PipelineSpace, SearchEvent, Solution, solve_many

__all__ = [
    "PLAN_SCHEMA",
    "PLAN_VERSION",
    "AXIS_NAMES",
    "InfeasibleMemoryError",
    "MeshResult",
    "Plan",
    "MEMORY_MARGIN",
    "memory_margin_bytes",
    "mesh_shapes",
    "parse_memory_limit",
    "plan",
]


MILP_TIME_LIMIT_S = 120.0  # per mesh shape: the MILP stops there with its best plan and its gap




def plan(
    model: str | LayerGraph | TransformerConfig,
    *,
    devices: int,
    hardware: str | Path | Hardware = "abci-v100",
    memory_limit: float | int | str | None = None,
    batch: int | None = None,
    batch_per_device: int | None = None,
    method: str = "auto",
    seed: int = 0,
    dtype: str = "float32",
    optimizer: str = "adam",
    allow_cross_node_model_axis: bool = False,
    calibration: Calibration | None = None,
    allow_other_hardware: bool = False,
    callback: Callable[[SearchEvent], None] | None = None,
    config: GradientConfig = GradientConfig(),
    platform: str | None = None,
    simplicity_tolerance: float = 0.01,
    milp_time_limit_s: float | None = MILP_TIME_LIMIT_S,
    levers: str = "auto",
    time_budget_s: float | None = TIME_BUDGET_S,
    cache_dir: str | Path | None = None,
    pipeline: str | PipelineSpace = "auto",
    name: str | None = None,
    verify: bool | None = None,
    flax_model: Any = None,
) -> Plan:
    """The fastest plan of ``model`` (a zoo name or a :class:`LayerGraph`) on
    ``devices`` devices of ``hardware`` within ``memory_limit`` per device
    (default: the device's memory), searching every mesh shape. Raises
    :class:`InfeasibleMemoryError` (a ``ValueError``) when nothing fits, and
    ``ValueError`` for what it cannot be asked: ``devices`` above
    :data:`costmodels.MAX_DEVICES` (2^20), a ``seed`` outside
    ``0 <= seed < 2**32`` (:func:`planner.plan_inputs.check_seed`).

    The search plans against the limit less the share :data:`MEMORY_MARGIN`
    keeps free for ``platform``, the XLA platform the plan will be compiled
    for (``cpu``, ``gpu``, ``tpu``; default: the hardware's, ``cpu`` for
    ``cpu-local``, else ``gpu``); the plan records both.

    The MILP (``method="milp"``) stops after ``milp_time_limit_s`` per mesh
    (default :data:`MILP_TIME_LIMIT_S`; None: no limit) with the best plan it
    found; ``optimality_gap`` says how far from its lower bound that plan may
    be (None without a bound). ``method="auto"`` answers within about
    ``time_budget_s`` (default :data:`search.TIME_BUDGET_S`; None: no
    budget), the searches again against XLA:CPU's schedule included: where
    its exact solvers prove nothing in their share, the gradient search's
    local search stops when the budget is spent, with a plan that fits
    (:func:`search.solve_many`).

    ``levers`` puts memory levers on each layer's menu beside its strategy
    (:mod:`costmodels.levers`): ``zero`` (ZeRO stages 1-3 over the layer's
    data-parallel group), ``remat`` (recompute its activations in the
    backward pass; on a model without attention, in runs of layers:
    :func:`planner.evaluation.remat_runs_offered`), ``all`` or ``none``;
    ``auto`` (the default, as on the command line) searches without levers
    and, only when no such plan fits, with ``all`` (the callback hears a
    ``levers`` event): a plan that fits without levers needs nothing the
    export applies to nnx modules only (ZeRO stages 2-3, recomputation,
    ``docs/levers.md``), and the lever-free search is the faster. The plan
    records each layer's levers (``LayerCost.zero_stage``, ``LayerCost.remat``,
    ``LayerCost.joins``); a lever that buys nothing is not kept
    (:func:`search.drop_idle_levers`).

    Of the plans found (the best on each mesh, and pure data parallelism
    where it fits), the simplest whose predicted time is within
    ``simplicity_tolerance`` (default 1%) of the fastest is returned: fewest
    layers off data parallelism, then the smallest model axis. A plan that
    was preferred that way records the fastest one's time and mesh
    (``fastest_iteration_s``, ``fastest_mesh``); the prediction is a model, and
    sharding more layers for a gain smaller than its error is no gain.

    ``calibration``: measured times, checked first
    (:func:`costmodels.check_calibration`: refused if measured on other
    hardware, unless ``allow_other_hardware``, in another ``dtype``, or on
    none of the model's layers; the callback hears a ``calibration`` event
    where it measures only some of them).

    ``cache_dir``: a folder to keep the cost tables in between calls (the
    command line's cache, :func:`planner.cli.cache_dir`); a second call with
    the same inputs reads them instead of computing them. The answer is the
    same with or without it.

    ``pipeline``: for a decoder (a zoo decoder's name or a
    :class:`TransformerConfig`, named ``name``), ``auto`` (the default)
    searches the one-stage plans above and, when none fits the memory, the
    pipelined configurations (:mod:`planner.pipelining`: stages,
    micro-batches, schedule, recomputation; the callback hears a
    ``pipeline`` event), returning the fastest that fits (a plan with a
    ``pipeline``); ``always`` searches only the pipelined ones, ``never``
    only the one-stage ones; a :class:`search.PipelineSpace` (``planner.PipelineSpace``)
    searches only the pipelined configurations within it (fixed stage, tensor
    or micro-batch sizes, the schedule: ``schedule=("gpipe",)``, the
    recomputation). When neither fits, the
    :class:`InfeasibleMemoryError` names the smallest pipelined
    configuration's memory too.

    ``verify``: the compiler in the loop (:mod:`planner.verification`; the
    default ``None``: where the plan's compiler is at hand); ``flax_model``:
    the Flax model it compiles where ``model`` is a layer graph."""
    if verify is not False:  # first: the call's arguments are all locals() holds
        return verified_plan(plan, dict(locals()))
    if levers == LEVERS_AUTO:  # first, so that the call's arguments are all locals() holds
        return _plan_with_levers_when_needed(dict(locals()))
    pipeline, space = _checked_options(milp_time_limit_s, simplicity_tolerance, pipeline)
    start = _time.perf_counter()
    decoder = decoder_config(model, name)
    if pipeline == "always" and decoder is None:
        raise ValueError(f"pipelined plans are made for decoders (a zoo decoder such as gpt2-small or a "
                         f"TransformerConfig with tokens and vocab); {_model_label(model)} is not one: plan it with "
                         "pipeline='never' or 'auto'")
    graph = _graph_of(model, name)
    hw = load_hardware(hardware)
    P = device_count(devices)
    seed = check_seed(seed)
    B = resolve_batch(P, batch, batch_per_device)
    limit = memory_limit_bytes(memory_limit, hw)
    platform = platform_of(platform, hw)
    if calibration is not None:  # before any work, the pipelined search's included
        _note(callback, "calibration", check_calibration(calibration, graph, hw.name, dtype,
                                                         allow_other_hardware=allow_other_hardware))
    # Kept free: the platform's share of the limit, and the input batch as planner.runtime.export feeds it,
    # which the cost table does not count (validate's "inputs" row: exact, the same on every mesh)
    inputs = graph.input_bytes_per_sample * B / P
    margin = memory_margin_bytes(limit, platform) + inputs
    staged = functools.partial(pipelined_plan, *(decoder or (None, None)), graph, hw, P, B, limit, margin,
                               dtype=dtype, optimizer=optimizer, platform=platform, seed=seed, started_s=start,
                               callback=callback, space=space)
    if pipeline == "always":
        return staged()
    meshes = mesh_shapes(P, B, hw.devices_per_node, allow_cross_node_model_axis)
    settings = CostSettings(dtype=dtype, optimizer=optimizer, levers=levers, platform=platform,
                            remat_runs=remat_runs_offered(graph, levers))
    _note(callback, "tables", f"{graph.model_name}: {len(meshes)} mesh shape(s) on {P} devices, batch {B}")
    _note(callback, "schedule", platform == "cpu" and schedule_note())  # the XLA:CPU schedule of another jaxlib
    tables = _cost_tables(graph, hw, B, meshes, settings, calibration, cache_dir)
    # (at least 1 byte: a limit the margin eats whole fits nothing, and says so below). The
    # search sums memory in float32 in its own order; the plan's reported memory is another
    # float32 sum: FLOAT32_ROUNDING keeps the two on the same side of the limit.
    budget = max((limit - margin) * (1.0 - FLOAT32_ROUNDING), 1.0)
    def search(ts: list, limit_bytes: float) -> list[Solution]:  # the tables ts within limit_bytes, in the time left
        # (never 0, which solve_many refuses: a search past the budget still runs each stage's minimum)
        left = None if time_budget_s is None else max(time_budget_s - (_time.perf_counter() - start), 1e-3)
        return solve_many(ts, limit_bytes, method, seed, callback, config=config,
                          milp_time_limit_s=milp_time_limit_s, time_budget_s=left)

    # on cpu, what XLA:CPU's schedule holds must fit too (planner/schedule_fit.py)
    solutions = fit_schedule(tables, search(tables, budget), budget, lambda t, b: search([t], b)[0], callback)
    results = tuple(MeshResult(mesh, s.feasible, s.time_s if s.feasible else None, s.memory_bytes,
                               s.min_memory_bytes, s.method, s.optimality_gap)
                    for mesh, s in zip(meshes, solutions, strict=True))
    fitting = [i for i, s in enumerate(solutions) if s.feasible]
    if not fitting:
        error = InfeasibleMemoryError(*infeasible_message(
            graph, P, limit, tables, meshes, solutions, MEMORY_MARGIN[platform], inputs, batch=B,
            batch_is_global=batch is not None,
            devices_per_node=None if allow_cross_node_model_axis else hw.devices_per_node))
        if decoder is None or pipeline == "never":
            raise error
        return _pipelined_instead(staged, error, results, callback)
    base = _data_parallel(graph, hw, P, B, meshes, tables, settings, calibration, allow_other_hardware)
    return Plan(
        **preferred_plan_fields(graph, hw, P, B, settings, meshes, tables, solutions, fitting, base, budget, simplicity_tolerance),
        axis_names=AXIS_NAMES, memory_limit_bytes=limit, seed=seed, seconds=_time.perf_counter() - start,
        meshes=results, graph_fingerprint=graph.fingerprint, input_shape=tuple(graph.input_shape), hardware_spec=hw,
        package_version=__version__, memory_margin_bytes=margin, platform=platform,
        on_unsupported=graph.on_unsupported, levers=levers,
    )


def _note(callback: Callable[[SearchEvent], None] | None, stage: str, message: str | None | bool) -> None:
    if message and callback is not None:
        callback(SearchEvent(stage, message))


def _checked_options(milp_time_limit_s, simplicity_tolerance, pipeline) -> tuple[str, PipelineSpace | None]:
    """``plan``'s search options checked: ``(pipeline choice, the space a
    PipelineSpace gives, else None)``."""
    if milp_time_limit_s is not None and not (isinstance(milp_time_limit_s, (int, float)) and milp_time_limit_s > 0):
        raise ValueError(f"milp_time_limit_s must be a positive number of seconds or None, got {milp_time_limit_s!r}")
    if not (isinstance(simplicity_tolerance, (int, float)) and 0 <= simplicity_tolerance < 1):
        raise ValueError(f"simplicity_tolerance must be a fraction in [0, 1), e.g. 0.01, got {simplicity_tolerance!r}")
    if isinstance(pipeline, PipelineSpace):
        return "always", pipeline
    if pipeline not in PIPELINE_CHOICES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINE_CHOICES)} or a PipelineSpace, got {pipeline!r}")
    return pipeline, None


def _graph_of(model: str | LayerGraph | TransformerConfig, name: str | None) -> LayerGraph:
    """The layer graph of a zoo name, a :class:`LayerGraph` or a
    :class:`TransformerConfig` (named ``name``)."""
    if isinstance(model, str):
        from planner.models.zoo import get_model

        return get_model(model)
    if isinstance(model, LayerGraph):
        return model
    if isinstance(model, TransformerConfig):
        from planner.models.transformer import build_transformer

        return build_transformer(model, name or "transformer")
    raise ValueError(f"model must be a built-in model name, a LayerGraph or a TransformerConfig, got "
                     f"{type(model).__name__}")


def _model_label(model: str | LayerGraph | TransformerConfig) -> str:
    return model if isinstance(model, str) else getattr(model, "model_name", type(model).__name__)


def _pipelined_instead(staged: Callable[..., Plan], error: InfeasibleMemoryError, results: tuple,
                       callback: Callable[[SearchEvent], None] | None) -> Plan:
    """The pipelined plan of a decoder no one-stage plan fits (``error``
    says why); when none fits either, one error naming both smallest
    memories (``required_bytes``: the smaller)."""
    _note(callback, "pipeline", "no one-stage plan fits the memory limit: searching pipelined plans")
    try:
        return staged(meshes=results)
    except InfeasibleMemoryError as e:
        raise InfeasibleMemoryError(f"{e}; without stages: {error}", min(e.required_bytes, error.required_bytes)) \
            from None
    except ValueError as e:  # no pipelined configuration divides
        raise InfeasibleMemoryError(f"{error}; no pipelined plan either: {e}", error.required_bytes) from None


LEVERS_AUTO = "auto"  # planner.plan's default: no levers unless nothing fits without them


def _plan_with_levers_when_needed(args: dict) -> Plan:
    """:func:`plan` of the call's ``args`` under ``levers="auto"``: without
    memory levers (and, under ``pipeline="auto"``, without stages), and only
    when nothing fits that way, with every lever and the call's own pipeline
    choice."""
    callback = args["callback"]
    if args["pipeline"] == "always" or isinstance(args["pipeline"], PipelineSpace):  # its own levers (ZeRO-1, ...)
        return plan(**{**args, "levers": "none"})
    try:  # stages only after the levers: the inner call checks any other pipeline value
        return plan(**{**args, "levers": "none", "pipeline": "never" if args["pipeline"] == "auto" else args["pipeline"]})
    except InfeasibleMemoryError:
        _note(callback, "levers", "no plan without memory levers fits: searching with ZeRO and recomputation")
        return plan(**{**args, "levers": "all"})


def _cost_tables(graph: LayerGraph, hw: Hardware, batch: int, meshes: list[tuple[int, int]], settings: CostSettings,
                 calibration: Calibration | None, cache_dir: Path | None) -> list:
    """One cost table per mesh shape (kept in ``cache_dir`` between calls,
    :mod:`planner._table_cache`), with ``calibration``'s measured times
    (:func:`plan` has checked that it belongs: ``costmodels.check_calibration``); data
    parallelism (under every lever) ruled out where the batch does not split
    into whole samples per device."""
    cal = calibration_arrays(calibration, graph) if calibration is not None else None
    hwa = hardware_arrays(hw, settings.dtype)
    menu_size = len(lever_menu(settings.levers))
    fingerprint = cost_model_fingerprint() if cache_dir is not None else None
    tables = []
    for d, m in meshes:
        inputs = (graph.arrays, hwa, float(batch), float(d), float(m), cal)
        t = cached_cost_table(functools.partial(cost_table, *inputs[:5], settings, cal), inputs, settings, cache_dir,
                              fingerprint)
        if batch % (d * m):
            data = slice(int(Strategy.DATA) * menu_size, (int(Strategy.DATA) + 1) * menu_size)
            t = t._replace(feasible=t.feasible.at[:, data].set(t.feasible[:, data] & (t.layer_mask[:, None] <= 0)))
        tables.append(t)
    return tables


def _data_parallel(graph: LayerGraph, hw: Hardware, P: int, batch: int, meshes, tables, settings: CostSettings,
                   calibration: Calibration | None, allow_other_hardware: bool):
    """Pure data parallelism's :class:`Evaluation` (the baseline every plan is
    compared with), on its mesh's table where it was built; None where the
    batch does not split over the ``P`` devices."""
    if batch % P:
        return None
    if (P, 1) in meshes:  # its table is built: evaluate on it
        return evaluation_of(graph, hw, P, (P, 1), batch, settings, tables[meshes.index((P, 1))],
                             strategy=Strategy.DATA)
    return evaluate(graph, hw, P, mesh=(P, 1), strategy="data", batch=batch, dtype=settings.dtype,
                    optimizer=settings.optimizer, calibration=calibration, allow_other_hardware=allow_other_hardware,
                    platform=settings.platform)
