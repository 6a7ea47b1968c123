"""``planner.shard``: apply a :class:`~planner.planning.Plan` to a Flax model
(nnx or linen) and get a jitted, sharded training step on JAX's own runtime."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from planner.ir.graph import LayerGraph
from planner.models.extraction import extract
from planner.plans.record import Plan
from planner.runtime.export import (
    AXIS_NAMES,
    TrainState,
    make_mesh,
    shard_training,
)
from planner.runtime.inputs import example_input
from planner.runtime.linen import as_nnx
from planner.runtime.layouts import (
    block_layouts,
    consumer_layouts,
    producer_layouts,
    scatter_layouts,
)

__all__ = ["example_input", "export_options", "plan_mesh", "planned_graph", "recomputed_layers", "shard"]


def shard(
    model: nnx.Module | nn.Module,
    plan: Plan | str | os.PathLike[str],
    optimizer: optax.GradientTransformation,
    mesh: Mesh | None = None,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> tuple[Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, jax.Array]], TrainState]:
    """``(train_step, state)`` for ``model`` laid out by ``plan`` (a
    :class:`Plan`, or the path of a plan file, read by :meth:`Plan.read`;
    anything else is a ``TypeError``):
    ``state, loss = train_step(state, x, y)`` with ``x`` batch-first,
    channels-last and ``y`` integer labels (softmax cross-entropy unless
    ``loss_fn(logits, y)`` is given).

    It trains in the plan's precision: under ``bfloat16`` / ``float16``
    plans, fp32 master weights and optimizer state, the passes and the
    gradients' reductions in the low precision
    (:func:`planner.runtime.export.shard_training`'s ``dtype``), as costed.

    ``model`` is an nnx module, which holds its weights, or a linen module
    with its ``variables`` (``model.init(key, x)``; without them, weights
    initialised from key 0), trained through Flax's bridge
    (:mod:`planner.runtime.linen`).

    The model must be the one the plan was made for: its extracted layer
    graph must have the plan's fingerprint. ``mesh`` defaults to the plan's
    ``d x m`` mesh over all devices, with axes ``("data", "model")``; across
    several processes, :func:`planner.runtime.distributed.process_mesh` (the model
    axis inside a process). Layers the plan puts on ZeRO shard their
    optimizer state, gradients and weights as their stage says, and the
    layers it recomputes run again in the backward pass
    (:func:`planner.runtime.export.shard_training`'s ``zero_stages``,
    ``remat_layers`` and ``recompute_runs``).

    A pipelined plan (``plan.pipeline``) trains on its ``(stage, data,
    model)`` mesh under its schedule (:func:`planner.runtime.pipelined.shard_pipelined`):
    ``model`` is an nnx decoder calling a list of blocks one by one, or its
    parts ``(first, blocks, head)``; the state is a
    :class:`~planner.runtime.pipelined.PipelinedState` and the step donates it."""
    plan = _as_plan(plan)
    if plan.pipeline is not None:
        from planner.runtime.pipelined import shard_pipelined

        return shard_pipelined(model, plan, optimizer, mesh, loss_fn=loss_fn)
    graph = planned_graph(model, plan)
    model = as_nnx(model, example_input(plan, 2), variables)
    mesh = plan_mesh(plan, mesh)
    kwargs: dict[str, Any] = {} if loss_fn is None else {"loss_fn": loss_fn}
    # each module's input pinned to its producer's planned layout and each module output read by functional
    # ops to theirs, and each residual block's input and output to its layers', so the functional ops between
    # modules (activations, pooling, flatten, the shortcut's add) run where the plan costs them
    # (docs/validation.md, items 2 and 12)
    return shard_training(model, plan.strategies, mesh, optimizer, **export_options(graph, plan), dtype=plan.dtype,
                          **kwargs)


def _as_plan(plan: Any) -> Plan:
    """``plan`` itself, or the plan file it names, read strictly."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return Plan.read(plan)
    hint = "; for a dict, use Plan.from_dict(d)" if isinstance(plan, dict) else ""
    raise TypeError(f"shard takes a Plan (planner.plan's result) or the path of a plan file, "
                    f"got {type(plan).__name__}{hint}")


def export_options(graph: LayerGraph, plan: Plan) -> dict[str, Any]:
    """The keyword arguments of :func:`~planner.runtime.export.shard_training`
    (and ``lower_training``) that apply ``plan`` to ``graph``'s model beyond
    its strategies: the pins of module inputs, module outputs and residual
    blocks, the ``channel`` layers the export reduce-scatters itself, the
    ZeRO stages and the recomputed layers (:func:`recomputed_layers`). ``shard`` and ``validate`` both
    compile with these, so what validate checks is what shard trains."""
    return {
        "input_layouts": producer_layouts(graph, plan.strategies),
        "output_layouts": consumer_layouts(graph, plan.strategies),
        "blocks": block_layouts(graph, plan.strategies),
        "scatters": scatter_layouts(graph, plan.strategies, plan.mesh[1], plan.zero_stages),
        "zero_stages": plan.zero_stages,
        **recomputed_layers(plan),
    }


def recomputed_layers(plan: Plan) -> dict[str, tuple]:
    """How the export recomputes ``plan``'s runs of recomputed layers: an
    attention alone (``remat_layers``: its own ``custom_vjp``, which keeps the
    queries, keys and values), any other run cut from the traced forward
    pass (``recompute_runs``, :mod:`planner.runtime.runs`)."""
    kinds = {r.name: r.kind for r in plan.layers}
    alone = tuple(run[0] for run in plan.recompute_runs
                  if len(run) == 1 and kinds[run[0]] in ("attention", "causal_attention"))
    return {"remat_layers": alone,
            "recompute_runs": tuple(run for run in plan.recompute_runs if run[0] not in alone)}


def planned_graph(model: nnx.Module, plan: Plan) -> LayerGraph:
    """The layer graph of ``model``, checked to be the one ``plan`` was made
    for (same fingerprint); a ``ValueError`` saying so otherwise. The model is
    traced at the plan's global batch (at least 2: at a batch of one, every
    size-one axis would look like the batch)."""
    example = example_input(plan, max(2, plan.batch))
    try:
        graph = extract(model, example, on_unsupported=plan.on_unsupported)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"this plan was made for another model (plan {plan.model!r} takes inputs of {plan.input_shape}, "
            f"channels first, which the model given cannot run: {e}); plan this model with planner.plan first"
        ) from None
    if graph.fingerprint != plan.graph_fingerprint:
        raise ValueError(
            f"this plan was made for another model (plan {plan.model!r}, fingerprint {plan.graph_fingerprint}; "
            f"the model given extracts to {graph.fingerprint}); plan this model with planner.plan first"
        )
    missing = [n for n in graph.names if n not in plan.strategies]
    extra = sorted(set(plan.strategies) - set(graph.names))
    if missing or extra:  # the fingerprint matches but the layer list was edited
        what = (f"no strategy for {len(missing)} layer(s), e.g. {missing[:3]}" if missing
                else f"strategies for {len(extra)} layer(s) the model does not have, e.g. {extra[:3]}")
        raise ValueError(f"the plan gives {what}: its file was edited or truncated; plan the model again")
    return graph


def plan_mesh(plan: Plan, mesh: Mesh | None = None) -> Mesh:
    """``mesh`` checked against the plan's ``d x m`` mesh over ``("data",
    "model")``, or by default that mesh over all devices; across several
    processes, :func:`planner.runtime.distributed.process_mesh` (the model axis
    inside a process)."""
    if mesh is None:  # several processes: each model group inside one (make_mesh; docs/multi-host.md)
        mesh = make_mesh(*plan.mesh)
    elif tuple(mesh.axis_names) != AXIS_NAMES or tuple(mesh.devices.shape) != tuple(plan.mesh):
        raise ValueError(
            f"mesh {dict(mesh.shape)} does not match the plan's {plan.mesh[0]}x{plan.mesh[1]} mesh over {AXIS_NAMES}"
        )
    return mesh
