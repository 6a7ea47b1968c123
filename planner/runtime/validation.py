"""``planner.validate`` (module ``planner.runtime.validation``): compile a plan's sharded training step on the local
devices and compare, per device, what the cost model predicts with what XLA
compiled: memory (``memory_analysis()``) and communication (the collectives
of the compiled HLO, :mod:`planner.runtime.hlo`), by kind and mesh axes, in bytes.
Defaults: ``memory_rtol`` 0.30 (total), ``activation_rtol`` 0.50,
``comm_rtol`` 0.05; docs/validation.md has the measured errors.

Memory rows (jax-notes.md §3):

* ``parameters``, ``optimizer state``, ``batch statistics`` and ``inputs``:
  predicted from the layer graph and the strategies (the layouts of
  :mod:`planner.runtime.export`), compiled from the shardings XLA gave the step's
  arguments; both exact (no tolerance).
* ``arguments``: their sum against XLA's ``argument_size_in_bytes``, exact.
* ``activations and temporaries``: the plan's predicted memory per device
  (:func:`costmodels.memory_per_device`, which counts gradients, the
  optimizer's update, saved activations and the largest workspace; for a
  ``cpu`` plan XLA:CPU's schedule,
  :func:`costmodels.scheduled_memory_per_device`) less its weights, optimizer state
  and buffers, against ``output - alias + temp`` with the state donated.
  Within ``activation_rtol``.
* ``total``: ``argument + output - alias + temp`` (on CPU ``peak`` leaves out
  temporaries), within ``memory_rtol``.
* ``limit``: the plan's memory limit (``plan.memory_limit_bytes``, what the
  plan was made for) against the compiled total; fails when the compiled
  program needs more, and its note names the part that grew most beyond its
  prediction. :attr:`ValidationReport.over_limit` is that row when it fails.

Collective rows: the plan's collectives (:func:`costmodels.plan_collectives`)
plus the small ones the time model neglects
(:func:`costmodels.collective_list.auxiliary_collectives`: batch-norm
statistics, the loss mean, the input and labels' conversions), summed by ``(kind, axes)``, against the compiled program's, within
``comm_rtol``. Axes of size 1 are dropped on both sides (on an 8x1 mesh
``("data",)`` and ``("data", "model")`` are the same devices). On CPU,
XLA lowers a reduce-scatter as an all-reduce of the whole buffer followed by
a slice (it has no reduce-scatter pass there), so on the ``cpu`` platform a
predicted reduce-scatter of ``b`` bytes over ``n`` devices is expected as an
all-reduce of ``n * b`` bytes; the row says so. A two-axis all-reduce that
XLA splits into one over ``model`` and one over ``data``, or computes split
over ``model`` (over ``data``, then gathered), is matched too.

The step is compiled with every module input pinned first to its producer's
planned layout (:func:`planner.runtime.export.producer_layouts`) and every module
output read by functional layers pinned to their planned layout
(:func:`planner.runtime.export.consumer_layouts`), and every block of layers (a
residual block) with its input and output pinned
(:func:`planner.runtime.layouts.block_layouts`), so that the functional layers
between modules keep the plan's layouts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from costmodels import (
    AXIS_NAMES,
    OPTIMIZER_SLOTS,
    CostSettings,
    Lever,
    Strategy,
    auxiliary_collectives,
    load_hardware,
    parse_strategy,
    schedule_note,
    plan_collectives,
    sharded_parameters,
)
from planner.models.extraction import extract
from planner.plans.record import Plan
from planner.plans.specs import zero_group_axes
from planner.runtime.export import lower_training
from planner.runtime.layouts import local_gradient_layers, pinned_outputs, scatter_layouts
from planner.runtime.collective_rows import CollectiveRow, close_to, compare_collectives
from planner.runtime.linen import as_nnx
from planner.runtime.report import MemoryRow, ValidationReport, cpu_scheduler, default_optimizer, limit_row
from planner.runtime.sharding import (
    example_input,
    export_options,
    plan_mesh,
    planned_graph,
)

__all__ = ["CollectiveRow", "MemoryRow", "ValidationReport", "collective_rows", "cpu_scheduler", "default_optimizer",
           "fixed_plan", "validate"]

_COUNTER_BYTES = {"sgd": 0, "momentum": 0, "adam": 4}  # optax's int32 step count (ScaleByAdamState.count)


def _shard_bytes(leaf: Any, sharding: Any) -> float:
    itemsize = leaf.dtype.itemsize  # numpy dtypes and typed PRNG keys (a bridged linen model's RNG state) alike
    return float(math.prod(sharding.shard_shape(tuple(leaf.shape))) * itemsize)


def validate(
    model: Any,
    plan: Plan,
    *,
    mesh: Mesh | None = None,
    optimizer: optax.GradientTransformation | None = None,
    memory_rtol: float = 0.30,
    activation_rtol: float = 0.50,
    comm_rtol: float = 0.05,
) -> ValidationReport:
    """Compile ``plan``'s training step for ``model`` (an abstract or concrete
    nnx module, or a linen module through Flax's bridge,
    :mod:`planner.runtime.linen`; nothing runs) in the plan's precision (not
    for low precision on XLA:CPU, which computes it in float32) at the plan's global batch on ``mesh`` (default: the
    plan's ``d x m`` mesh over the local devices) and compare predicted with
    compiled memory and communication per device. ``optimizer`` defaults to
    :func:`default_optimizer` of ``plan.optimizer``. A pipelined plan: its
    step's stage memory and transfers (:mod:`planner.runtime.pipeline_validation`)."""
    if not (memory_rtol >= 0 and activation_rtol >= 0 and comm_rtol >= 0):
        raise ValueError("memory_rtol, activation_rtol and comm_rtol must be non-negative fractions, e.g. 0.1")
    if plan.pipeline is not None:  # the pipelined step and its stage-to-stage transfers
        from planner.runtime.pipeline_validation import validate_pipelined

        return validate_pipelined(model, plan, mesh=mesh, optimizer=optimizer, memory_rtol=memory_rtol,
                                  activation_rtol=activation_rtol, comm_rtol=comm_rtol)
    if not plan.input_shape:
        raise ValueError("the plan does not record its model's input shape; plan the model again with this "
                         "version of shardplan to validate it")
    d, m = plan.mesh
    if plan.batch % (d * m):
        raise ValueError(f"validate splits the batch over all {d * m} devices; the plan's batch {plan.batch} "
                         f"is not a multiple of {d * m}")
    graph = planned_graph(model, plan)
    mesh = plan_mesh(plan, mesh)
    if plan.dtype != "float32" and mesh.devices.flat[0].platform == "cpu":
        raise ValueError(
            f"validate compiles a {plan.dtype} plan in its precision, but XLA:CPU computes {plan.dtype} in float32 "
            "(its collectives move twice the bytes the plan's do: measured on a bfloat16 plan), so a CPU compile "
            "cannot check it; validate on the GPUs it is for (or compiled for them here: shardplan validate "
            "--gpu-target, planner.runtime.gpu_target, the gpu-aot extra), or plan with dtype float32 to validate "
            "on CPU")
    tx = default_optimizer(plan.optimizer) if optimizer is None else optimizer

    x = example_input(plan, plan.batch)
    linen = isinstance(model, nn.Module)
    model = as_nnx(model, x, abstract=True)  # a linen module through Flax's bridge
    lowered, abstract = lower_training(model, plan.strategies, mesh, tx, x, **export_options(graph, plan),
                                       dtype=plan.dtype)
    compiled = lowered.compile()
    memory = _memory_rows(graph, plan, compiled, abstract, x, memory_rtol, activation_rtol)
    platform = mesh.devices.flat[0].platform
    colls = _collective_rows(graph, plan, compiled.as_text(), mesh, platform, comm_rtol, linen, _module_names(model))
    notes = tuple(n for n in (schedule_note(),) if n and platform == "cpu")
    return ValidationReport(plan.model, (d, m), plan.batch, plan.optimizer, platform, memory_rtol, activation_rtol,
                            comm_rtol, memory, colls, cpu_scheduler() if platform == "cpu" else "", notes)


def _choice(graph: Any, plan: Plan) -> np.ndarray:
    strategies = plan.strategies
    return np.array([int(parse_strategy(strategies[n])) for n in graph.names])


def _levers(graph: Any, plan: Plan) -> list[Lever]:
    by_name = {r.name: r.lever for r in plan.layers}
    return [by_name[n] for n in graph.names]


def _zero_divisors(graph: Any, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Per layer ``[L]``: what ZeRO divides its weights (stage 3) and its
    optimizer state (stages 1-3) by, the devices of its data-parallel group
    (:func:`planner.plans.specs.zero_group_axes`); 1 where not sharded."""
    sizes = dict(zip(AXIS_NAMES, plan.mesh, strict=True))
    stage = np.array([x.zero_stage for x in _levers(graph, plan)])
    group = np.array([math.prod(sizes[a] for a in zero_group_axes(plan.strategies[n])) for n in graph.names],
                     dtype=np.float64)
    return np.where(stage >= 3, group, 1.0), np.where(stage >= 1, group, 1.0)


def _memory_rows(graph: Any, plan: Plan, compiled: Any, abstract: Any, x: Any, rtol: float, act_rtol: float
                 ) -> tuple[MemoryRow, ...]:
    d, m = plan.mesh
    choice = _choice(graph, plan)
    a = graph.unpadded()
    # -- predicted (float32 parameters and state; the layouts of planner.runtime.export)
    local = sharded_parameters(graph, choice, m) * 4.0  # [L] float32 bytes per device, before ZeRO
    weights_by, optim_by = _zero_divisors(graph, plan)
    params = float(np.sum(local / weights_by))
    optim = OPTIMIZER_SLOTS[plan.optimizer] * float(np.sum(local / optim_by)) + _COUNTER_BYTES[plan.optimizer]
    buffers = float(np.sum(np.asarray(a.buffers) / np.where(choice == Strategy.FILTER, m, 1))) * 4.0
    inputs = graph.input_bytes_per_sample * plan.batch / (d * m)  # x float32 or int32 ids, labels int32
    arguments = params + optim + buffers + inputs
    total = float(plan.memory_bytes_per_device) + inputs + _COUNTER_BYTES[plan.optimizer]
    # -- compiled: the shardings XLA chose for the arguments, and memory_analysis
    (state_sh, x_sh, y_sh), _ = compiled.input_shardings

    def part(tree: Any, shs: Any) -> float:
        return float(sum(_shard_bytes(leaf, sh) for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shs),
                                                                    strict=True)))

    got_params = part(abstract.params, state_sh.params)
    got_optim = part(abstract.opt_state, state_sh.opt_state)
    got_buffers = part(abstract.other, state_sh.other)
    labels = x.shape if graph.reads_token_ids else (plan.batch,)
    got_inputs = _shard_bytes(x, x_sh) + _shard_bytes(jax.ShapeDtypeStruct(labels, jnp.int32), y_sh)
    ma = compiled.memory_analysis()
    arg = float(ma.argument_size_in_bytes)
    got_total = arg + float(ma.output_size_in_bytes) - float(ma.alias_size_in_bytes) + float(ma.temp_size_in_bytes)

    def row(name: str, p: float, g: float, tol: float, note: str = "") -> MemoryRow:
        return MemoryRow(name, p, g, tol, close_to(p, g, tol), note)

    rows = (
        row("parameters", params, got_params, 0.0),
        row("optimizer state", optim, got_optim, 0.0,
            f"{OPTIMIZER_SLOTS[plan.optimizer]} slot(s) per parameter + {_COUNTER_BYTES[plan.optimizer]} B step count"),
        row("batch statistics", buffers, got_buffers, 0.0),
        row("inputs", inputs, got_inputs, 0.0,
            "token ids and labels int32" if graph.reads_token_ids else "images float32, labels int32"
            ", batch over every device"),
        row("arguments", arguments, arg, 0.0, "XLA argument_size_in_bytes"),
        row("activations and temporaries", total - arguments, got_total - arg, act_rtol,
            "gradients (or kernel copies), update, saved activations, workspace; XLA output - alias + temp"),
        row("total", total, got_total, rtol, "XLA argument + output - alias + temp"),
    )
    return (*rows, limit_row(plan, rows, got_total))


def collective_rows(model: nnx.Module, plan: Plan, hlo_text: str, *, mesh: Mesh | None = None,
                    comm_rtol: float = 0.05) -> tuple[CollectiveRow, ...]:
    """The collective rows of :func:`validate` for a program compiled some
    other way: ``hlo_text`` (``compiled.as_text()``) of a training step on
    ``mesh`` (default: the plan's mesh over the local devices) against the
    collectives ``plan`` predicts for ``model``; e.g. a step lowered with
    layouts other than the plan's, which these rows then flag. The rows
    expect the reduce-scatters the export issues itself (a ``channel``
    layer's partial sums, a ZeRO layer's gradients) as it issues them: lower
    with ``**planner.runtime.sharding.export_options(graph, plan)``."""
    if not comm_rtol >= 0:
        raise ValueError("comm_rtol must be a non-negative fraction, e.g. 0.05")
    graph = planned_graph(model, plan)
    mesh = plan_mesh(plan, mesh)
    linen = isinstance(model, nn.Module)
    return _collective_rows(graph, plan, hlo_text, mesh, mesh.devices.flat[0].platform, comm_rtol, linen,
                            frozenset() if linen else _module_names(model))


def _module_names(model: nnx.Module) -> frozenset[str]:
    """The paths of an nnx model's modules: the layers that are module calls."""
    return frozenset("/".join(map(str, path)) for path, _ in nnx.iter_modules(model))


def _collective_rows(graph: Any, plan: Plan, hlo: str, mesh: Mesh, platform: str, rtol: float, linen: bool = False,
                     modules: frozenset[str] = frozenset()) -> tuple[CollectiveRow, ...]:
    """:func:`compare_collectives` of what ``plan`` predicts for ``graph`` and
    what ``hlo`` holds; ``linen``: the model is a linen module, whose channel
    layers' partial sums XLA reduces as it chooses and whose outputs it
    converts once for all readers (:mod:`planner.runtime.linen`); else
    ``modules``, an nnx model's module paths, whose outputs read by
    functional ops alone the export converts once (:func:`pinned_outputs`)."""
    d, m = plan.mesh
    choice = _choice(graph, plan)
    settings = CostSettings(dtype=plan.dtype, optimizer=plan.optimizer)
    # a linen model's readers are fed from one conversion of each output: no block input is pinned apart
    once = True if linen else pinned_outputs(graph, plan.strategies, modules)
    records = plan_collectives(graph, choice, plan.batch, d, m, settings, _levers(graph, plan),
                               one_conversion_per_output=once) + auxiliary_collectives(
        graph, choice, plan.batch, d, m, settings)
    # the export reduce-scatters these channel layers' outputs (of an nnx model) and these ZeRO layers' weight
    # gradients itself (a reduce-scatter on every platform)
    exported = (frozenset() if linen else frozenset(scatter_layouts(graph, plan.strategies, m, plan.zero_stages)),
                frozenset(local_gradient_layers(graph, plan.strategies, plan.zero_stages)))
    return compare_collectives(records, hlo, mesh, platform, rtol, exported)


def fixed_plan(
    model: nnx.Module | Any,
    example_input: Any,
    mesh: tuple[int, int],
    *,
    strategy: str | None = None,
    strategies: Mapping[str, str] | None = None,
    batch: int,
    optimizer: str = "adam",
    hardware: str = "dgx-a100",
    on_unsupported: str = "error",
    platform: str | None = None,
) -> Plan:
    """A :class:`Plan` for chosen strategies instead of searched ones: one
    ``strategy`` for every layer that can run it (``replicated`` elsewhere), or
    ``strategies`` for the layers named (``data`` for the rest), evaluated by
    the cost model on a ``d x m`` mesh; for validating single strategies.
    A strategy may carry memory levers (``data+zero2``, :mod:`costmodels.levers`).
    ``on_unsupported`` is :func:`planner.extract`'s (and recorded in the plan).
    ``platform``: the XLA platform whose memory the plan predicts, default
    that of JAX's first device (where the plan is validated)."""
    from planner._version import __version__
    from planner.evaluation import evaluate, plan_levers
    from planner.plans.specs import layer_specs

    graph = extract(model, example_input, on_unsupported=on_unsupported)
    hw = load_hardware(hardware)
    d, m = mesh
    if strategies is not None:
        unknown = sorted(set(strategies) - set(graph.names))
        if unknown:
            raise ValueError(f"strategies name layers the model does not have, e.g. {unknown[:3]}; "
                             f"its layers are {', '.join(graph.names[:6])}, ...")
        mapping = {n: strategies.get(n, "data") for n in graph.names}
    platform = jax.devices()[0].platform if platform is None else platform
    if strategies is not None:
        ev = evaluate(graph, hw, d * m, mesh=(d, m), plan=mapping, batch=batch, optimizer=optimizer, platform=platform)
    else:
        ev = evaluate(graph, hw, d * m, mesh=(d, m), strategy=strategy or "data", batch=batch, optimizer=optimizer,
                      platform=platform)
    return Plan(
        evaluation=ev, axis_names=AXIS_NAMES, memory_limit_bytes=ev.memory_capacity_bytes,
        data_parallel_iteration_s=None, data_parallel_memory_bytes=None, speedup_over_data_parallel=None,
        method="fixed", seed=0, seconds=0.0, optimality_gap=None, meshes=(),
        graph_fingerprint=graph.fingerprint, input_shape=tuple(graph.input_shape),
        layer_specs=layer_specs(graph, [r.strategy for r in ev.layers], ev.zero_stages), hardware_spec=hw,
        package_version=__version__, on_unsupported=graph.on_unsupported,
        levers=plan_levers(mapping) if strategies is not None else "none", platform=platform,
    )
