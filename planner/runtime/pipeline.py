"""Pipelined training on JAX's own runtime: a model written as a chain (a
first part, a stack of identical blocks, a head with its loss) trained with
its blocks cut into contiguous stages along a ``"stage"`` mesh axis.

The first part and the optimizer run outside the pipeline, sharded by
JAX's partitioner like any jitted code (the first part on every stage).
The blocks and the head run inside ``jax.shard_map``, manual over the stage
axis and the data axis: each stage holds its contiguous share of the
stacked block parameters (sharded on ``"stage"``), each device its rows of
every micro-batch; a stage walks the schedule's ticks in a ``lax.scan``
(:mod:`planner.runtime._pipeline_ticks`) and passes activations forward and
cotangents backward with ``jax.lax.ppermute``. The model axis stays
automatic inside a stage, so the block parameters' shardings over it
(``block_specs``) and the sharding constraints a block applies keep their
effect there (tensor parallelism). Micro-batch gradients accumulate in the
scan's carry and are averaged over the data axis once, after the last tick;
the last stage's head gradients and the first stage's input cotangents
leave the pipeline by a ``psum`` over the stage axis, and the first part's
gradients come from its ``jax.vjp`` at those cotangents.

Memory: a stage keeps the inputs of the micro-batches in flight
(``executor_tables(schedule).act_slots`` of them: all ``m`` under GPipe, at
most ``S`` under 1F1B) and recomputes its layers' forward in each backward
tick; every stage holds the head's parameters, the last one uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from planner.runtime._pipeline_schedule import executor_tables, pipeline_schedule
from planner.runtime._pipeline_ticks import StageResult, stage_ticks, tick_table

__all__ = [
    "PIPELINE_AXES",
    "Chain",
    "ChainParams",
    "param_name",
    "pipeline_loss_and_grads",
    "pipeline_mesh",
    "pipeline_shardings",
    "pipeline_step",
    "pipeline_training",
]

PIPELINE_AXES = ("stage", "data", "model")


class Chain(NamedTuple):
    """A model as three pure functions.

    ``first(params, x)`` maps a batch ``x`` (batch first) to the blocks'
    input; ``block(params, h)`` is one block (``params``: one block's, no
    layer axis) and keeps ``h``'s shape; ``head_loss(params, h, y)`` is the
    mean loss of a batch of the last block's outputs against labels ``y``.
    """

    first: Callable[[Any, jax.Array], jax.Array]
    block: Callable[[Any, jax.Array], jax.Array]
    head_loss: Callable[[Any, jax.Array, jax.Array], jax.Array]


class ChainParams(NamedTuple):
    """The parameters of a :class:`Chain`; every leaf of ``blocks`` has a
    leading layer axis (the blocks' parameters stacked in order)."""

    first: Any
    blocks: Any
    head: Any


def pipeline_mesh(stages: int, data: int, model: int, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``stages x data x model`` mesh with Auto axes :data:`PIPELINE_AXES`
    over ``devices`` (default: all), consecutive devices in one model group."""
    devices = list(jax.devices() if devices is None else devices)
    if stages * data * model != len(devices):
        raise ValueError(f"a {stages}x{data}x{model} pipeline mesh needs {stages * data * model} devices, "
                         f"got {len(devices)}")
    grid = np.array(devices, dtype=object).reshape(stages, data, model)
    return Mesh(grid, PIPELINE_AXES, axis_types=(AxisType.Auto,) * 3)


def param_name(path: tuple[Any, ...]) -> str:
    """A parameter's ``/``-joined name from its pytree path
    (``attn/query/kernel``; a Variable's own ``value`` attribute left out)."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
            parts.append(key.name)
    return "/".join(parts)


def _layers(blocks: Any) -> int:
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(blocks)}
    if len(sizes) != 1:
        raise ValueError(f"every block parameter needs the same leading layer axis, got sizes {sorted(sizes)}")
    return sizes.pop()


def pipeline_shardings(mesh: Mesh, params: ChainParams, block_specs: Any = None, *, first_specs: Any = None,
                       head_specs: Any = None, axis: str = "stage") -> ChainParams:
    """``NamedSharding``s for ``params``: the blocks split on ``axis`` along
    their layer axis, the rest of each block parameter laid out by
    ``block_specs(name, leaf)`` (one block's ``PartitionSpec`` over the other
    mesh axes, by the parameter's ``/``-joined name, :func:`param_name`;
    ``None`` or no function: replicated); the first part and the head by
    ``first_specs`` / ``head_specs`` (the same kind of function)."""
    def named(spec_of, tree, prefix=()):
        def one(path, leaf):
            spec = None if spec_of is None else spec_of(param_name(path), leaf)
            return NamedSharding(mesh, P(*prefix, *(spec or ())))

        return jax.tree_util.tree_map_with_path(one, tree)

    return ChainParams(named(first_specs, params.first), named(block_specs, params.blocks, (axis,)),
                       named(head_specs, params.head))


def _micro_batches(x: jax.Array, m: int) -> jax.Array:
    """``x [B, ...]`` as ``[m, B / m, ...]``, micro-batch ``i`` holding rows
    ``i, i + m, ...`` (so a batch split over the data axis stays split)."""
    if x.shape[0] % m:
        raise ValueError(f"a batch of {x.shape[0]} does not split into {m} equal micro-batches")
    return x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)


def pipeline_loss_and_grads(chain: Chain, mesh: Mesh, *, micro_batches: int, schedule: str = "1f1b",
                            stages: int | None = None, axis: str = "stage",
                            data_axis: str | None = "data") -> Callable[[ChainParams, jax.Array, jax.Array],
                                                                          tuple[jax.Array, ChainParams]]:
    """``(params, x, y) -> (loss, grads)`` of ``chain`` pipelined over
    ``mesh``'s ``axis`` (``stages`` of them, if given, must equal its size)
    under ``schedule`` ('gpipe' or '1f1b') with ``micro_batches``
    micro-batches: the mean of the micro-batches' losses and its gradient.
    Not jitted (compose it; :func:`pipeline_training` jits a whole step).

    ``data_axis``: the mesh axis the micro-batches' rows are split over,
    manual inside the pipeline like the stage axis: each device runs its
    rows, and the gradients are averaged over the data axis once per step.
    A block parameter stored split over the data axis is gathered whole as
    the step enters the pipeline. With ``data_axis=None`` every axis but the
    stage axis stays automatic (then JAX's partitioner reduces a stage's
    gradients over a data axis in every backward tick)."""
    size = mesh.shape[axis]
    if stages is not None and stages != size:
        raise ValueError(f"{stages} stages asked for, but the mesh's {axis!r} axis has {size} devices; "
                         f"build the mesh with pipeline_mesh({stages}, ...)")
    if data_axis is not None and data_axis not in mesh.axis_names:
        raise ValueError(f"data axis {data_axis!r} is not an axis of the mesh {mesh.axis_names}; "
                         "pass data_axis=None for a mesh without one")
    plan = pipeline_schedule(schedule, size, micro_batches)
    tables = executor_tables(plan)
    body = stage_ticks(chain.block, chain.head_loss, tick_table(plan, tables), tables, stages=size, axis=axis,
                       data_axis=data_axis)
    rows = P(None, data_axis)
    run = jax.shard_map(body, mesh=mesh, in_specs=(P(axis), P(), rows, rows),
                        out_specs=StageResult(P(), P(axis), P(), rows),
                        axis_names=frozenset({axis} if data_axis is None else {axis, data_axis}))

    def loss_and_grads(params: ChainParams, x: jax.Array, y: jax.Array):
        layers = _layers(params.blocks)
        if layers % size:
            raise ValueError(f"{layers} blocks do not cut into {size} equal stages")

        def first(p):
            h = _micro_batches(chain.first(p, x), micro_batches)
            return h if data_axis is None else jax.lax.with_sharding_constraint(h, NamedSharding(mesh, rows))

        inputs, first_pull = jax.vjp(first, params.first)
        loss, block_grads, head_grads, cotangents = run(params.blocks, params.head, inputs,
                                                        _micro_batches(y, micro_batches))
        return loss, ChainParams(first_pull(cotangents)[0], block_grads, head_grads)

    return loss_and_grads


def pipeline_step(chain: Chain, params: Any, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                  micro_batches: int, schedule: str = "1f1b", stages: int | None = None, block_specs: Any = None,
                  first_specs: Any = None, head_specs: Any = None, axis: str = "stage",
                  data_axis: str | None = "data"):
    """``(train_step, param_shardings, opt_shardings, batch_sharding)``: the
    jitted step of :func:`pipeline_training` and the layouts of its
    arguments, nothing placed (``params`` may be abstract:
    ``jax.ShapeDtypeStruct`` leaves), e.g. to lower and compile it."""
    param_sh = pipeline_shardings(mesh, params, block_specs, first_specs=first_specs, head_specs=head_specs,
                                  axis=axis)
    # optimizer state laid out like the parameters it belongs to (jax-notes.md §2, item 3)
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params), param_sh,
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    batch_sh = NamedSharding(mesh, P(data_axis))
    loss_and_grads = pipeline_loss_and_grads(chain, mesh, micro_batches=micro_batches, schedule=schedule,
                                             stages=stages, axis=axis, data_axis=data_axis)

    def step(p, opt_state, batch):
        loss, grads = loss_and_grads(p, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    train_step = jax.jit(step, in_shardings=(param_sh, opt_sh, (batch_sh, batch_sh)),
                         out_shardings=(param_sh, opt_sh, NamedSharding(mesh, P())), donate_argnums=(0, 1))
    return train_step, param_sh, opt_sh, batch_sh


def pipeline_training(chain: Chain, params: ChainParams, optimizer: optax.GradientTransformation, mesh: Mesh, *,
                      micro_batches: int, schedule: str = "1f1b", stages: int | None = None,
                      block_specs: Any = None, first_specs: Any = None, head_specs: Any = None,
                      axis: str = "stage", data_axis: str | None = "data"):
    """``(train_step, params, opt_state)``: ``params`` and the optimizer's
    state placed on ``mesh`` (:func:`pipeline_shardings`) and the jitted
    ``train_step(params, opt_state, (x, y)) -> (params, opt_state, loss)``
    of :func:`pipeline_loss_and_grads`, the optimizer applied once per step
    to the gradient accumulated over the micro-batches. The step donates
    ``params`` and ``opt_state``; the ones returned here are copies, so the
    caller's ``params`` stay valid."""
    train_step, param_sh, opt_sh, _ = pipeline_step(
        chain, params, optimizer, mesh, micro_batches=micro_batches, schedule=schedule, stages=stages,
        block_specs=block_specs, first_specs=first_specs, head_specs=head_specs, axis=axis, data_axis=data_axis)
    placed = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)(params)  # the step donates its own
    opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(placed)
    return train_step, placed, opt_state
