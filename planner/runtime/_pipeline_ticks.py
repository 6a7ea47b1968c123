"""One stage's side of a pipelined step, run inside ``jax.shard_map`` over
the stage (and data) axes: a ``lax.scan`` over the schedule's ticks in
which the stage runs its tick's forward or backward pass (a ``lax.switch``
on the schedule's table, each device taking its own stage's branch), then
sends its output activation to the next stage and its input cotangent to
the previous one with ``jax.lax.ppermute``. Both sends run every tick, as a
collective must on every device; in a tick without work they carry zeros.

A backward pass recomputes the stage's forward from the stage input it
kept (``jax.vjp`` of the stage's layers in the backward tick): a stage
holds one input per micro-batch in flight, not the layers' residuals,
and every backward costs one more forward. The last stage's forward tick
only keeps the input; its backward tick runs the layers, the head and
the loss, and their ``jax.vjp``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from planner.runtime._pipeline_schedule import BACKWARD, FORWARD, IDLE, ExecutorTables, PipelineSchedule

__all__ = ["StageResult", "stage_ticks", "tick_table"]

# lax.switch branches, by the tick's work on a stage
_IDLE, _FORWARD, _KEEP, _BACKWARD, _BACKWARD_LAST = range(5)


class StageResult(NamedTuple):
    """What one device returns from a step (the shard_map body's output).
    In the scan's carry the same fields accumulate the device's own share:
    the loss and the head's gradients on the last stage, the input
    cotangents on the first, zeros elsewhere."""

    loss: jax.Array  # [] the step's loss, the mean over micro-batches (and data rows)
    block_grads: Any  # the stage's layers' gradients, shaped like its layers' parameters
    head_grads: Any  # the head's gradients
    input_cotangents: jax.Array  # [m, rows, ...] d loss / d the blocks' input, the device's rows


class _Carry(NamedTuple):
    kept: jax.Array  # [act_slots, micro-batch, ...] stage inputs held for their backward
    cots: jax.Array  # [cot_slots, micro-batch, ...] cotangents waiting for their backward
    arrived_act: jax.Array  # [micro-batch, ...] the activation the previous stage sent last tick
    arrived_cot: jax.Array  # [micro-batch, ...] the cotangent the next stage sent last tick
    result: StageResult


def tick_table(schedule: PipelineSchedule, tables: ExecutorTables) -> np.ndarray:
    """``[ticks, stages, 6]`` int32: per tick and stage, the switch branch,
    the micro-batch, the slot the arriving activation and cotangent go to
    (-1: none) and the activation and cotangent slots the work reads."""
    last = np.arange(schedule.stages) == schedule.stages - 1
    branch = np.select([schedule.op == IDLE, (schedule.op == FORWARD) & ~last, schedule.op == FORWARD,
                        (schedule.op == BACKWARD) & ~last],
                       [_IDLE, _FORWARD, _KEEP, _BACKWARD], _BACKWARD_LAST)
    mb = np.maximum(schedule.micro_batch, 0)
    return np.stack([branch, mb, tables.act_in, tables.act_use, tables.cot_in, tables.cot_use],
                    axis=-1).astype(np.int32)


def _stage_forward(block: Callable, stage_params: Any, x: jax.Array) -> jax.Array:
    """The stage's layers (params with a leading layer axis) applied in order."""
    def layer(h, p):
        return block(p, h), None

    return lax.scan(layer, x, stage_params)[0]


def _branches(block: Callable, head_loss: Callable, micro_batches: int) -> list[Callable]:
    """The ``lax.switch`` branches: ``(params, head, x, g, y, result) ->
    (activation out, cotangent out, result)``."""
    def idle(params, head, x, g, y, res):
        return jnp.zeros_like(x), jnp.zeros_like(x), res

    def forward(params, head, x, g, y, res):
        return _stage_forward(block, params, x), jnp.zeros_like(x), res

    def backward(params, head, x, g, y, res):
        _, pull = jax.vjp(lambda p, h: _stage_forward(block, p, h), params, x)
        d_params, dx = pull(g)
        grads = jax.tree.map(jnp.add, res.block_grads, d_params)
        return jnp.zeros_like(x), dx, res._replace(block_grads=grads)

    def backward_last(params, head, x, g, y, res):
        def loss_of(p, hp, h):
            return head_loss(hp, _stage_forward(block, p, h), y)

        loss, pull = jax.vjp(loss_of, params, head, x)
        d_params, d_head, dx = pull(jnp.ones_like(loss) / micro_batches)
        return jnp.zeros_like(x), dx, res._replace(
            loss=res.loss + loss / micro_batches,
            block_grads=jax.tree.map(jnp.add, res.block_grads, d_params),
            head_grads=jax.tree.map(jnp.add, res.head_grads, d_head))

    # the last stage's forward keeps its input only (its backward recomputes the layers with the head)
    return [idle, forward, idle, backward, backward_last]


def _put(buffer: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    """``buffer`` with ``value`` in ``slot``, unchanged where ``slot < 0``."""
    at = jnp.maximum(slot, 0)
    return buffer.at[at].set(jnp.where(slot >= 0, value, buffer[at]))


def _varying(tree: Any, axes: tuple[str, ...]) -> Any:
    """``tree`` (values equal across ``axes``) typed as varying over them,
    the type the scan's carry has once a ppermute or a stage's own data
    have written it."""
    return jax.tree.map(lambda a: lax.pcast(a, axes, to="varying"), tree) if axes else tree


def stage_ticks(block: Callable, head_loss: Callable, table: np.ndarray, tables: ExecutorTables, *,
                stages: int, axis: str, data_axis: str | None) -> Callable:
    """The shard_map body ``(stage params, head params, inputs [m, mb, ...],
    labels [m, mb, ...]) -> StageResult`` running ``table``
    (:func:`tick_table`) on the stage this device belongs to. With a manual
    ``data_axis``, ``inputs`` and ``labels`` are the device's rows of each
    micro-batch, its gradients accumulate over its rows only and are
    averaged over the data axis once, after the last tick."""
    forward_pairs = [(s, s + 1) for s in range(stages - 1)]
    backward_pairs = [(s + 1, s) for s in range(stages - 1)]
    data = () if data_axis is None else (data_axis,)

    def run(params, head, inputs, labels):
        branches = _branches(block, head_loss, inputs.shape[0])
        stage = lax.axis_index(axis)
        first = stage == 0
        # every operand of the branches typed as varying over the manual axes: a gradient taken inside a
        # branch is then the device's own, with no reduction across stages or data rows inside the branch
        # (only some stages run it)
        params, head = _varying(params, data), _varying(head, (axis,) + data)
        act = inputs.shape[1:]
        kept, cots, none, loss, input_cots = _varying(
            (jnp.zeros((tables.act_slots,) + act, inputs.dtype), jnp.zeros((tables.cot_slots,) + act, inputs.dtype),
             jnp.zeros(act, inputs.dtype), jnp.zeros((), jnp.float32), jnp.zeros(inputs.shape, inputs.dtype)),
            (axis,) + data)
        result = StageResult(loss, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, head),
                             input_cots)

        def tick(c: _Carry, rows: jax.Array):
            branch, mb, act_in, act_use, cot_in, cot_use = (rows[stage, k] for k in range(6))
            kept = _put(c.kept, act_in, jnp.where(first, inputs[mb], c.arrived_act))
            cots = _put(c.cots, cot_in, c.arrived_cot)
            out_act, out_cot, res = lax.switch(branch, branches, params, head, kept[act_use], cots[cot_use],
                                               labels[mb], c.result)
            to_input = first & (branch >= _BACKWARD)
            res = res._replace(input_cotangents=_put(res.input_cotangents, jnp.where(to_input, mb, -1), out_cot))
            if stages > 1:
                out_act = lax.ppermute(out_act, axis, forward_pairs)
                out_cot = lax.ppermute(out_cot, axis, backward_pairs)
            return _Carry(kept, cots, out_act, out_cot, res), None

        final = lax.scan(tick, _Carry(kept, cots, none, none, result), jnp.asarray(table))[0].result
        rows = lax.psum(1, data) if data else 1
        return StageResult(
            _data_mean(lax.psum(final.loss, axis), data),
            jax.tree.map(lambda a: _data_mean(a, data), final.block_grads),
            jax.tree.map(lambda a: _data_mean(lax.psum(a, axis), data), final.head_grads),
            # d (mean over the data axis of the devices' losses) / d (this device's rows)
            lax.psum(final.input_cotangents, axis) / rows)

    return run


def _data_mean(a: jax.Array, data: tuple[str, ...]) -> jax.Array:
    return lax.pmean(a, data) if data else a
