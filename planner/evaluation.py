"""Evaluate one discrete plan of a model on a mesh: per-layer compute,
communication, resharding and memory, the totals, and the collectives it
issues. Backs ``shardplan evaluate``.

A plan is one strategy per layer, given as a single strategy name for every
layer (:func:`uniform_choice`: the strategy where the layer can run it,
``replicated`` where it cannot, as ParaDL replicates the layers a strategy
does not apply to, ParaDL §2) or as a mapping from layer names to
strategy names (every layer named). A mapping's strategy may carry memory
levers (:mod:`costmodels.levers`): ``data+zero2``, ``filter+zero3+remat``;
the table is then built with the lever menu that holds them.

Nothing is substituted silently: a layer costed under another strategy
than the one asked for (``uniform_choice``'s ``replicated``) keeps the
strategy asked for in :attr:`LayerCost.requested_strategy` and why it
could not run in :attr:`LayerCost.substitution_reason`
(:func:`unavailable_reason`, the rules of
:func:`costmodels.strategy_mask` in words).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from costmodels import (
    ATTENTION_KINDS,
    LEVER_CHOICES,
    STRATEGY_NAMES,
    Calibration,
    CollectiveRecord,
    CostSettings,
    Hardware,
    Lever,
    Strategy,
    calibration_arrays,
    check_calibration,
    cost_table,
    hardware_arrays,
    iteration_time,
    lever_menu,
    levers_per_strategy,
    memory_per_device,
    menu_covering,
    menu_of,
    one_hot,
    option_index,
    parse_option,
    parse_strategy,
    plan_collectives,
    reshard_per_edge,
    with_lever,
)
from planner.ir.graph import LayerGraph
from planner.plan_inputs import platform_of, resolve_batch, resolve_mesh
from planner.schedule_fit import choice_peak
from planner.unavailable import lever_unavailable_reason, unavailable_reason
from search import SearchEvent

__all__ = [
    "evaluation_of", "LayerCost", "Evaluation", "option_label", "plan_levers", "remat_runs_offered", "uniform_choice",
    "evaluate",
]


@dataclasses.dataclass(frozen=True)
class LayerCost:
    name: str
    kind: str
    strategy: str  # the strategy costed
    compute_s: float  # forward + backward compute per iteration on one device
    comm_s: float  # gradient sync + halo exchange + output gathering
    reshard_s: float  # converting the layer's inputs into its layout (incoming edges), fwd + bwd
    memory_bytes: float  # weights, gradients, optimizer state and saved activations on one device
    requested_strategy: str = ""  # the strategy asked for ("" on construction: the one costed)
    substitution_reason: str | None = None  # why the requested strategy cannot run here; None: not substituted
    zero_stage: int = 0  # ZeRO stage of the layer's state, 0-3 (costmodels.levers)
    remat: bool = False  # activations recomputed in the backward pass instead of kept
    joins: bool = False  # recomputed in the run of the layer before (remat+join; costmodels.levers)

    def __post_init__(self) -> None:
        if not self.requested_strategy:
            object.__setattr__(self, "requested_strategy", self.strategy)

    @property
    def lever(self) -> Lever:
        return Lever(self.zero_stage, self.remat, self.joins)

    @property
    def option(self) -> str:
        """The strategy with its levers, e.g. ``data+zero2`` (``data``: none)."""
        return with_lever(self.strategy, self.lever)

    @property
    def substituted(self) -> bool:
        """True when the layer is costed under another strategy than requested."""
        return self.requested_strategy != self.strategy


@dataclasses.dataclass(frozen=True)
class Evaluation:
    model: str
    hardware: str
    devices: int
    mesh: tuple[int, int]  # (d, m): data x model
    batch: int  # global
    dtype: str
    optimizer: str
    iteration_s: float
    memory_bytes_per_device: float
    memory_capacity_bytes: float
    layers: tuple[LayerCost, ...]
    collectives: tuple[CollectiveRecord, ...]

    @property
    def fits_memory(self) -> bool:
        return self.memory_bytes_per_device <= self.memory_capacity_bytes

    @property
    def zero_stages(self) -> dict[str, int]:
        """Layer name -> ZeRO stage (1-3), for the layers that shard their state."""
        return {r.name: r.zero_stage for r in self.layers if r.zero_stage}

    @property
    def substituted(self) -> tuple[LayerCost, ...]:
        """The layers costed under another strategy than requested."""
        return tuple(r for r in self.layers if r.substituted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "devices": self.devices,
            "mesh": list(self.mesh),
            "batch": self.batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "iteration_s": self.iteration_s,
            "memory_bytes_per_device": self.memory_bytes_per_device,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_memory": self.fits_memory,
            "layers": [dataclasses.asdict(r) for r in self.layers],
            "collectives": [
                {**dataclasses.asdict(c), "axes": list(c.axes)} for c in self.collectives
            ],
        }


def option_label(row: LayerCost | Mapping[str, Any]) -> str:
    """A layer's strategy with its memory levers, ``data+zero2`` (``data``: none),
    from a :class:`LayerCost` or its JSON row (rows before levers have none)."""
    if isinstance(row, LayerCost):
        return row.option
    return with_lever(row["strategy"], Lever(int(row.get("zero_stage", 0) or 0), bool(row.get("remat", False)),
                                             bool(row.get("joins", False))))


def uniform_choice(feasible: np.ndarray, strategy: str | Strategy) -> np.ndarray:
    """Every layer on ``strategy`` where it can run it, else ``replicated``
    (:func:`evaluate` marks those layers: ``LayerCost.requested_strategy``),
    as option codes of ``feasible``'s table ``[L, O]``, no lever."""
    s = parse_strategy(strategy) if isinstance(strategy, str) else Strategy(strategy)
    feasible = np.asarray(feasible)
    K = levers_per_strategy(feasible.shape[1])
    return np.where(feasible[:, int(s) * K], int(s) * K, int(Strategy.REPLICATED) * K)


def _strategy(strategy: Any) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str):
        raise ValueError(f"strategy must be a strategy name ({', '.join(STRATEGY_NAMES)}), got {strategy!r}")
    return parse_strategy(strategy)


def _check_plan_names(graph: LayerGraph, plan: Mapping[str, str]) -> None:
    """Before any cost is computed: the plan names exactly the graph's layers,
    each with a known strategy name (a plan for another model fails here)."""
    if not isinstance(plan, Mapping):
        raise ValueError(f"plan must map layer names to strategy names, got {type(plan).__name__}")
    missing = [n for n in graph.names if n not in plan]
    unknown = sorted(str(n) for n in set(plan) - set(graph.names))
    if unknown:
        raise ValueError(
            f"plan names layers the model {graph.model_name!r} does not have, e.g. {unknown[:3]}; "
            "was it made for another model?"
        )
    if missing:
        raise ValueError(f"plan gives no strategy for {len(missing)} layer(s), e.g. {missing[:3]}")
    for name in graph.names:
        if not isinstance(plan[name], str):
            raise ValueError(f"plan gives layer {name!r} the strategy {plan[name]!r}; expected a strategy name")
        parse_option(plan[name])


def plan_levers(plan: Mapping[str, str]) -> str:
    """The lever choice (``none``, ``zero``, ``remat``, ``all``) whose menu
    holds every lever a ``plan`` mapping's options carry."""
    return menu_covering(parse_option(v)[1] for v in plan.values())


def _choice_from_mapping(
    graph: LayerGraph, feasible: np.ndarray, plan: Mapping[str, str],
    batch: float | None = None, d: int = 1, m: int = 1,
) -> np.ndarray:
    _check_plan_names(graph, plan)
    menu = menu_of(feasible.shape[1])
    choice = np.full(feasible.shape[0], int(Strategy.REPLICATED) * len(menu))
    for i, name in enumerate(graph.names):
        code, lever = parse_option(plan[name])
        s = Strategy(code)
        if lever not in menu:
            raise ValueError(f"layer {name!r} asks for {plan[name]!r}, but the cost table has no {lever.name} "
                             f"(its levers: {', '.join(x.name for x in menu)}); build it with levers "
                             f"{menu_covering([lever])!r} or more")
        o = option_index(s, lever, menu)
        if not feasible[i, o]:
            if feasible[i, option_index(s, Lever(0, False), menu)]:
                why = lever_unavailable_reason(lever)
            else:
                why = (unavailable_reason(graph, i, s, batch, d, m) if batch is not None else "") or \
                    "the cost model excludes it on this mesh and batch"
            raise ValueError(f"layer {name!r} cannot run strategy {plan[name]} here: {why}; choose another")
        choice[i] = o
    return choice


def remat_runs_offered(graph: LayerGraph, levers: str) -> bool:
    """Whether ``levers``' menu recomputes runs of layers on ``graph``
    (``CostSettings.remat_runs``): where it holds ``remat``, on a model
    without attention. The export recomputes a run by cutting the forward
    pass at layers (:mod:`planner.runtime.runs`); the projections and the
    attention of an ``nnx.MultiHeadAttention`` are one module call, so on a
    transformer only the attention alone recomputes (its own export)."""
    kinds = np.asarray(graph.arrays.kind)[: graph.num_layers]
    return any(lever.remat for lever in lever_menu(levers)) and not np.isin(kinds, ATTENTION_KINDS).any()


def evaluate(
    graph: LayerGraph,
    hardware: Hardware,
    devices: int,
    *,
    mesh: tuple[int, int] | None = None,
    strategy: str | Strategy | None = None,
    plan: Mapping[str, str] | None = None,
    batch: int | None = None,
    batch_per_device: int | None = None,
    dtype: str = "float32",
    optimizer: str = "adam",
    calibration: Calibration | None = None,
    allow_other_hardware: bool = False,
    levers: str | None = None,
    platform: str | None = None,
    callback: Callable[[SearchEvent], None] | None = None,
) -> Evaluation:
    """Cost of one plan: ``strategy`` for every layer that can run it, or
    ``plan`` (layer name -> strategy name, with its levers: ``data+zero2``).
    ``levers`` is the lever menu the cost table is built with
    (:data:`costmodels.LEVER_CHOICES`; default: the smallest that holds the
    plan's levers); a plan costs the same under every menu that holds its
    options, up to float32 rounding (``evaluate --plan`` passes the menu the
    plan was searched on, and reproduces its numbers exactly). ``platform``
    is the XLA platform whose memory is predicted (:data:`costmodels.PLATFORMS`;
    default the hardware's, :func:`planner.plan_inputs.platform_of`).
    ``calibration``: measured times, refused where it does not belong
    (:func:`costmodels.check_calibration`: other hardware unless
    ``allow_other_hardware``, another dtype, none of the model's layers);
    ``callback`` hears a ``calibration`` event where it measures only some
    of the layers."""
    if (strategy is None) == (plan is None):
        raise ValueError("give exactly one of strategy (a name) or plan (layer -> strategy)")
    d, m = resolve_mesh(devices, mesh, hardware)
    B = resolve_batch(devices, batch, batch_per_device)
    if B < d:
        raise ValueError(
            f"batch {B} has fewer samples than the {d} data-parallel groups of mesh {d}x{m}; "
            f"use a batch of at least {d} (a multiple of {d}) or a smaller data axis"
        )
    if B % d:
        raise ValueError(f"batch {B} is not divisible by the data-parallel degree {d}; use a multiple of {d}")
    if strategy is not None:
        strategy = _strategy(strategy)
    if strategy is Strategy.DATA and B % (d * m):
        raise ValueError(f"batch {B} is not divisible by {d * m} devices, which data parallelism needs")
    if plan is not None:
        _check_plan_names(graph, plan)
    needed = "none" if plan is None else plan_levers(plan)
    if levers is None:
        levers = needed
    elif levers not in LEVER_CHOICES:
        raise ValueError(f"unknown levers {levers!r}; choose from {', '.join(LEVER_CHOICES)}")
    elif not set(lever_menu(needed)) <= set(lever_menu(levers)):
        raise ValueError(f"the plan's levers need the menu {needed!r}, which levers={levers!r} does not hold")
    settings = CostSettings(dtype=dtype, optimizer=optimizer, levers=levers, platform=platform_of(platform, hardware),
                            remat_runs=remat_runs_offered(graph, levers))
    if calibration is not None:
        note = check_calibration(calibration, graph, hardware.name, dtype, allow_other_hardware=allow_other_hardware)
        if note and callback is not None:
            callback(SearchEvent("calibration", note))
    cal = calibration_arrays(calibration, graph) if calibration is not None else None
    table = cost_table(graph.arrays, hardware_arrays(hardware, dtype), float(B), float(d), float(m), settings, cal)
    return evaluation_of(graph, hardware, devices, (d, m), B, settings, table, strategy=strategy, plan=plan)


def _planned_memory(table, probs, choice) -> float:
    """The plan's peak memory per device: XLA:CPU's schedule where it applies
    (a ``cpu`` table: :func:`planner.schedule_fit.choice_peak`),
    else the solvers' two phases (:func:`costmodels.memory_per_device`)."""
    peak = choice_peak(table, choice)
    return float(memory_per_device(table, probs)) if peak is None else peak


def evaluation_of(graph: LayerGraph, hardware: Hardware, devices: int, mesh: tuple[int, int], batch: int,
                  settings: CostSettings, table, *, strategy: Strategy | None = None,
                  plan: Mapping[str, str] | None = None) -> Evaluation:
    """:func:`evaluate` on a cost table already built for ``graph`` on
    ``mesh`` at ``batch`` with ``settings`` (:func:`planner.plan` passes the
    tables it searched, so no mesh's table is built twice); the arguments are
    those :func:`evaluate` has checked."""
    (d, m), B = mesh, batch
    dtype, optimizer = settings.dtype, settings.optimizer
    feasible = np.asarray(table.feasible)
    menu = menu_of(feasible.shape[1])
    if strategy is not None:
        options = uniform_choice(feasible, strategy)
    else:
        options = _choice_from_mapping(graph, feasible, plan, B, d, m)
    choice, lever_of = options // len(menu), [menu[k] for k in options[: graph.num_layers] % len(menu)]
    if B % (d * m) and np.any(choice[: graph.num_layers] == Strategy.DATA):
        raise ValueError(f"batch {B} is not divisible by {d * m} devices, which data-parallel layers need")
    probs = one_hot(options, feasible.shape[1])
    rows = np.arange(graph.num_layers)
    c, o = choice[: graph.num_layers], options[: graph.num_layers]
    compute = np.asarray(table.compute_s)[rows, o]
    comm = np.asarray(table.grad_sync_s + table.weight_gather_s + table.halo_s + table.output_s)[rows, o]
    memory = np.asarray(table.state_bytes + table.activation_bytes)[rows, o]
    per_edge = np.asarray(reshard_per_edge(table, probs))
    reshard = np.zeros(feasible.shape[0])
    np.add.at(reshard, np.asarray(table.edge_dst), per_edge)
    asked = [strategy.name.lower() if strategy is not None else STRATEGY_NAMES[parse_option(plan[n])[0]]
             for n in graph.names]

    def reason(i: int) -> str | None:  # why layer i runs another strategy than asked (None: it does not)
        if STRATEGY_NAMES[int(c[i])] == asked[i]:
            return None
        return unavailable_reason(graph, i, asked[i], B, d, m) or "the cost model excludes it on this mesh and batch"

    layers = tuple(
        LayerCost(
            name=n, kind=k, strategy=STRATEGY_NAMES[int(c[i])], compute_s=float(compute[i]),
            comm_s=float(comm[i]), reshard_s=float(reshard[i]), memory_bytes=float(memory[i]),
            requested_strategy=asked[i], substitution_reason=reason(i),
            zero_stage=lever_of[i].zero_stage, remat=lever_of[i].remat, joins=lever_of[i].joins,
        )
        for i, (n, k) in enumerate(zip(graph.names, graph.kind_names, strict=True))
    )
    return Evaluation(
        model=graph.model_name,
        hardware=hardware.name,
        devices=devices,
        mesh=(d, m),
        batch=B,
        dtype=dtype,
        optimizer=optimizer,
        iteration_s=float(iteration_time(table, probs)),
        memory_bytes_per_device=_planned_memory(table, probs, o),
        memory_capacity_bytes=hardware.device.memory_bytes,
        layers=layers,
        collectives=plan_collectives(graph, choice, B, d, m, settings, lever_of),
    )
