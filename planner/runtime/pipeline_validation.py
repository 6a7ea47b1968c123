"""``planner.validate`` of a pipelined plan: compile the pipelined training
step (:mod:`planner.runtime.pipelined`; nothing runs) and compare, per
device, the plan's predicted stage memory and point-to-point transfers with
the compiled program.

The step is one SPMD program: every device runs the same buffers (each
stage's ``lax.switch`` branches are all compiled, the activation slots are
the most any stage holds), so the compiled memory is per device of any
stage, against the plan's largest stage (``Pipeline.peak_bytes``).

Memory rows:

* ``weights and optimizer state``: the plan's state bytes at its peak stage
  less the gradients' share (fp32: 4 B weights and 8 B Adam moments of the
  16 B per parameter, :func:`costmodels.state_bytes`), against the shards
  XLA gave the step's parameter and optimizer-state arguments. Reported,
  not judged: the cost model puts the embedding on the first stage and the
  output layer on the last (its vocabulary padded to a multiple of 1,024,
  :func:`planner.models.block_chain.block_chain`), while the runtime keeps
  both on every stage.
* ``plan (Megatron-LM's accounting)``: ``Pipeline.peak_bytes`` plus the
  input batch against the compiled total, reported with its ratio: the
  plan's memory is what Megatron-LM keeps on a stage, which is not what
  this runtime holds.
* ``total``: what the runtime holds (:mod:`planner.runtime._pipeline_memory`:
  its state with the embedding and output layer on every stage, the
  schedule's buffers, a backward tick's working set) plus the input batch
  against ``argument + output - alias + temp``, within ``memory_rtol``.
* ``limit``: the plan's limit against the compiled total.

Transfer rows (``collective-permute`` over ``stage``): the runtime sends an
activation forward and a cotangent back in every tick of the schedule
(``2 (m + S - 1)`` ticks), each one micro-batch's rows of one device
(``micro_batch`` rows of the blocks' input, tokens x width x 4 B each); that count and size are the
prediction the rows judge, within ``comm_rtol``. The cost model's own count
is ``2 m`` messages per boundary (only the micro-batches, each device
sending ``1/t`` of the activation before the tensor group's all-gather,
Narayanan et al. 2021 §4.1); the row's note gives it beside, with the
ratio: the runtime's empty ticks send zeros, and it sends the activation
whole on every device of a model group.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import optax

from costmodels import state_bytes
from planner.plans.record import Plan
from planner.runtime.collective_rows import CollectiveRow, close_to
from planner.runtime.hlo import parse_collectives
from planner.runtime.inputs import example_input
from planner.runtime.pipeline import pipeline_step
from planner.runtime._pipeline_memory import RuntimeMemory, decoder_dims, runtime_memory
from planner.runtime._pipeline_schedule import executor_tables, pipeline_schedule
from planner.runtime.pipelined import chain_and_graph, check_runnable, plan_mesh, stage_specs
from planner.runtime.report import MemoryRow, ValidationReport, cpu_scheduler, default_optimizer, limit_row

__all__ = ["validate_pipelined"]


def _sds(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _bytes(tree: Any) -> float:
    """Bytes per device of abstract arrays with shardings."""
    return float(sum(jnp.dtype(a.dtype).itemsize * math.prod(a.sharding.shard_shape(a.shape))
                     for a in jax.tree.leaves(tree)))


def validate_pipelined(model: Any, plan: Plan, *, mesh: Any = None, optimizer: optax.GradientTransformation | None
                       = None, memory_rtol: float = 0.30, activation_rtol: float = 0.50,
                       comm_rtol: float = 0.05) -> ValidationReport:
    """:func:`planner.validate` of a pipelined ``plan`` (module docstring)."""
    check_runnable(plan, "validate")
    p = plan.pipeline
    mesh = plan_mesh(plan, mesh)
    tx = default_optimizer(plan.optimizer) if optimizer is None else optimizer
    chain, params, graph = chain_and_graph(model, plan)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    step, param_sh, opt_sh, batch_sh = pipeline_step(chain, abstract, tx, mesh, micro_batches=p.microbatches,
                                                     schedule=p.schedule, stages=p.stages, **stage_specs(plan))
    x = example_input(plan, plan.batch)
    xs = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sh)
    ys = jax.ShapeDtypeStruct(x.shape, jnp.int32, sharding=batch_sh)
    args = (_sds(abstract, param_sh), _sds(jax.eval_shape(tx.init, abstract), opt_sh))
    compiled = step.lower(*args, (xs, ys)).compile()
    tables = executor_tables(pipeline_schedule(p.schedule, p.stages, p.microbatches))
    held = None if graph is None else runtime_memory(
        plan, decoder_dims(graph), {part: _bytes(getattr(args[0], part)) for part in ("first", "blocks", "head")},
        tables.act_slots, tables.cot_slots)
    memory = _memory_rows(plan, compiled, args, float(_bytes((xs, ys))), held, memory_rtol)
    platform = mesh.devices.flat[0].platform
    h = jax.eval_shape(chain.first, abstract.first, jax.ShapeDtypeStruct(x.shape, x.dtype))  # the blocks' input
    sample_bytes = math.prod(h.shape[1:]) * jnp.dtype(h.dtype).itemsize
    transfers = _transfer_rows(plan, compiled.as_text(), mesh, sample_bytes, comm_rtol)
    return ValidationReport(plan.model, tuple(p.mesh), plan.batch, plan.optimizer, platform, memory_rtol,
                            activation_rtol, comm_rtol, memory, transfers,
                            cpu_scheduler() if platform == "cpu" else "")


def _memory_rows(plan: Plan, compiled: Any, args: tuple, inputs: float, held: RuntimeMemory | None,
                 rtol: float) -> tuple[MemoryRow, ...]:
    p = plan.pipeline
    sb = state_bytes(plan.dtype, plan.optimizer)
    per_param = sb.weight + sb.gradient + sb.master + sb.optimizer
    kept = p.state_bytes * (sb.weight + sb.master + sb.optimizer) / per_param  # less the gradients
    got_kept = _bytes(args)
    ma = compiled.memory_analysis()
    got_total = float(ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                      + ma.temp_size_in_bytes)
    plan_total = p.peak_bytes + inputs
    rows = [
        MemoryRow("weights and optimizer state", kept, got_kept, 0.0, True,
                  "reported, not judged: the plan's largest stage (Megatron-LM's accounting: the embedding on the "
                  "first stage, the output layer on the last, its vocabulary padded) against the step's parameter "
                  "and optimizer-state arguments, the embedding and the output layer on every stage"),
        MemoryRow("plan (Megatron-LM's accounting)", plan_total, got_total, 0.0, True,
                  f"reported, not judged: the plan's largest stage (peak_bytes, {p.microbatches} micro-batches "
                  f"under {p.schedule}) + the input batch, {got_total / plan_total:.2f}x compiled/predicted; the "
                  "runtime holds what the next rows count"),
    ]
    if held is None:
        rows.append(MemoryRow("total", plan_total, got_total, rtol, True,
                              "not judged: a model given in parts has no layer graph to count the runtime's "
                              "buffers from"))
    else:
        total = held.total + inputs
        rows.append(MemoryRow(
            "total", total, got_total, rtol, close_to(total, got_total, rtol),
            f"what the runtime holds: state {held.state_bytes:,.0f} B (every part it keeps, the embedding and the "
            f"output layer on every stage), buffers {held.buffer_bytes:,.0f} B (stage inputs in flight, slots, the "
            f"first part's micro-batches), backward working set {held.backward_bytes:,.0f} B (the stage recomputed "
            "at once, the head's logits and their gradient), + the input batch; XLA argument + output - alias + "
            "temp"))
    return (*rows, limit_row(plan, tuple(rows), got_total))


def _transfer_rows(plan: Plan, hlo: str, mesh: Any, sample_bytes: float, rtol: float
                   ) -> tuple[CollectiveRow, ...]:
    """The stage-to-stage collective-permutes: what the runtime's schedule sends against the compiled program's
    (each permute in the tick loop counted once per tick)."""
    from planner.runtime._pipeline_schedule import pipeline_schedule

    p = plan.pipeline
    ticks = pipeline_schedule(p.schedule, p.stages, p.microbatches).ticks
    message = p.micro_batch * sample_bytes  # one micro-batch's rows on one device
    permutes = [c for c in parse_collectives(hlo, tuple(mesh.devices.shape), mesh.axis_names)
                if c.kind == "collective-permute"]
    trips = _loop_trips(hlo)
    compiled = sum(c.bytes_per_device * trips for c in permutes)
    count = len(permutes) * trips
    predicted = 2.0 * ticks * message
    cost_model = 2.0 * p.microbatches * message / p.tensor
    note = (f"runtime: 2 sends x {ticks} ticks (2(m+S-1), m={p.microbatches}, S={p.stages}) of {message:,.0f} B; "
            f"compiled {len(permutes)} permute(s) x {trips} loop trips. The cost model counts 2m = "
            f"{2 * p.microbatches} messages of {message / p.tensor:,.0f} B ({cost_model:,.0f} B, "
            f"{predicted / cost_model:.1f}x less): no empty ticks, and each device sends 1/t of the activation")
    axes = tuple(sorted({a for c in permutes for a in c.axes})) or ("stage",)
    return (CollectiveRow("collective-permute", axes, predicted, float(compiled), count,
                          close_to(predicted, compiled, rtol), False, note),)


def _loop_trips(hlo: str) -> int:
    """The known trip count of the while loop whose body holds the collective-permutes (the tick loop)."""
    bodies = re.findall(r'body=%?([\w.\-]+).*?known_trip_count":\{"n":"(\d+)"', hlo)
    for name, n in bodies:
        block = re.search(rf"^%?{re.escape(name)}\s.*?\n\}}", hlo, re.S | re.M)
        if block and "collective-permute(" in block.group(0):
            return int(n)
    return 1
