"""``planner.shard`` of a pipelined plan: a Flax nnx decoder trained with
its blocks cut into the plan's stages on its ``(stage, data, model)`` mesh
(:mod:`planner.runtime.pipeline`), under the plan's schedule and
micro-batch count, each block's parameters laid out by the plan's
per-layer plan (tensor parallelism over ``model``).

What runs: GPipe and 1F1B (no interleaving, ``chunks`` 1), float32,
``recompute`` ``full`` (the runtime keeps each micro-batch's stage input
and recomputes the stage's forward in its backward tick), no sequence
parallelism and no distributed optimizer (the optimizer state is laid out
like the parameters). Anything else is refused with what to plan instead
(:func:`check_runnable`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from planner.ir.graph import LayerGraph
from planner.plans.record import Plan
from planner.plans.specs import partition_specs
from planner.runtime._model_chain import model_chain
from planner.runtime.inputs import example_input
from planner.runtime._pipeline_chain import nnx_chain
from planner.runtime.pipeline import Chain, ChainParams, pipeline_mesh, pipeline_training

__all__ = ["PipelinedState", "chain_and_graph", "check_runnable", "model_parameters", "pipelined_chain", "plan_mesh", "shard_pipelined",
           "stage_specs"]

BLOCK_PREFIX = "blocks/0/"  # the plan's layers of one block (planner.models.block_chain) are named blocks/0/...


class PipelinedState(NamedTuple):
    params: ChainParams  # first / head: model parameter name -> array; blocks: block parameter name -> [L, ...]
    opt_state: Any  # optax state, laid out like the parameters


def check_runnable(plan: Plan, what: str = "planner.shard") -> None:
    """``ValueError`` naming what the pipelined runtime cannot run in ``plan``
    and what to plan instead (module docstring)."""
    p = plan.pipeline
    if p is None:
        raise ValueError(f"{what}: this plan has no pipeline")
    ask = ("plan with planner.plan(..., pipeline=planner.PipelineSpace(schedule=('gpipe',) or ('1f1b',), "
           "recompute=('full',), sequence_parallel=(False,)), dtype='float32')")
    if p.schedule == "interleaved" or p.chunks > 1:
        raise ValueError(f"{what} runs GPipe and 1F1B pipelines; this plan's schedule is {p.schedule} with "
                         f"{p.chunks} model chunks per device, which the runtime does not execute: {ask}")
    if p.recompute != "full":
        raise ValueError(f"{what}: this plan's recomputation is {p.recompute!r}, but the pipelined runtime "
                         "honours 'full' only (each stage keeps its micro-batches' inputs and recomputes its "
                         f"forward in the backward pass): {ask}")
    if p.sequence_parallel:
        raise ValueError(f"{what}: the pipelined runtime has no sequence parallelism; {ask}")
    if p.distributed_optimizer:
        raise ValueError(f"{what}: the pipelined runtime lays the optimizer state out like the parameters "
                         f"(no distributed optimizer, ZeRO-1); {ask} and distributed_optimizer=(False,)")
    if plan.dtype != "float32":
        raise ValueError(f"{what}: the pipelined runtime trains in float32; this plan is {plan.dtype}: {ask}")


def _spec_of(strategies: dict[str, str], name: str, leaf: Any) -> P:
    """The plan's PartitionSpec of the parameter ``name`` (``layer/param``)."""
    tree: Any = leaf
    for key in reversed(name.split("/")):
        tree = {key: tree}
    return jax.tree.leaves(partition_specs(tree, strategies), is_leaf=lambda s: isinstance(s, P))[0]


def stage_specs(plan: Plan) -> dict[str, Callable[[str, Any], P]]:
    """``block_specs``, ``first_specs`` and ``head_specs`` of
    :func:`planner.runtime.pipeline_training` from the plan's per-layer plan:
    one block's parameters by the plan's ``blocks/0/...`` layers, the first
    part's and the head's by their own layer names."""
    strategies = dict(plan.strategies)

    def one_block(name: str, leaf: Any) -> P:  # the stacked leaf without its layer axis
        return _spec_of(strategies, BLOCK_PREFIX + name, jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype))

    return {"block_specs": one_block,
            "first_specs": lambda name, leaf: _spec_of(strategies, name, leaf),
            "head_specs": lambda name, leaf: _spec_of(strategies, name, leaf)}


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def pipelined_chain(model: Any, plan: Plan, loss_fn: Callable | None = None) -> tuple[Chain, ChainParams]:
    """The :class:`Chain` of ``model`` for ``plan``: a whole nnx model whose
    ``__call__`` calls a list ``blocks`` one by one (checked to extract to
    the plan's layer graph), or its parts ``(first, blocks, head)`` (the
    blocks a list of identical modules or an ``nnx.vmap`` stack)."""
    chain, params, _ = chain_and_graph(model, plan, loss_fn)
    return chain, params


def chain_and_graph(model: Any, plan: Plan, loss_fn: Callable | None = None
                    ) -> tuple[Chain, ChainParams, LayerGraph | None]:
    """:func:`pipelined_chain` and the layer graph the whole model extracts
    to (None for a model given in parts)."""
    from planner.models.extraction import extract
    loss_fn = _cross_entropy if loss_fn is None else loss_fn
    blocks = plan.pipeline.blocks
    if isinstance(model, (tuple, list)):
        if len(model) != 3 or not all(isinstance(m, (nnx.Module, list, tuple)) for m in model):
            raise ValueError("a pipelined model given in parts is (first, blocks, head): nnx modules, the blocks a "
                             "list of identical modules or one nnx.vmap stack")
        chain, params = nnx_chain(*model, loss_fn)
        layers = {leaf.shape[0] for leaf in jax.tree.leaves(params.blocks)}
        if layers != {blocks}:
            raise ValueError(f"the plan cuts {blocks} blocks into stages; the blocks given hold {sorted(layers)}")
        return chain, params, None
    if not isinstance(model, nnx.Module):
        raise ValueError(f"a pipelined plan runs a Flax nnx model (or its parts); got {type(model).__name__}")
    x = example_input(plan, max(2, plan.batch))
    graph = extract(model, x, on_unsupported=plan.on_unsupported)
    if graph.fingerprint != plan.graph_fingerprint:
        raise ValueError(f"this plan was made for another model (plan {plan.model!r}, fingerprint "
                         f"{plan.graph_fingerprint}; the model given extracts to {graph.fingerprint}); plan this "
                         "model with planner.plan first")
    return (*model_chain(model, x, loss_fn, blocks=blocks), graph)


def shard_pipelined(model: Any, plan: Plan, optimizer: optax.GradientTransformation, mesh: Any = None, *,
                    loss_fn: Callable | None = None) -> tuple[Callable, PipelinedState]:
    """``(train_step, state)`` of a pipelined ``plan``:
    ``state, loss = train_step(state, x, y)``, ``x`` the global batch
    (token ids), ``y`` its labels; the step donates ``state``. ``mesh``
    defaults to the plan's ``stages x data x model`` mesh over all devices
    (:func:`planner.runtime.pipeline_mesh`)."""
    check_runnable(plan)
    p = plan.pipeline
    mesh = _plan_mesh(plan, mesh)
    chain, params = pipelined_chain(model, plan, loss_fn)
    step, placed, opt_state = pipeline_training(chain, params, optimizer, mesh, micro_batches=p.microbatches,
                                                schedule=p.schedule, stages=p.stages, **stage_specs(plan))

    def train_step(state: PipelinedState, x: jax.Array, y: jax.Array) -> tuple[PipelinedState, jax.Array]:
        _check_batch(plan, x)
        new_params, new_opt, loss = step(state.params, state.opt_state, (x, y))
        return PipelinedState(new_params, new_opt), loss

    return train_step, PipelinedState(placed, opt_state)


def plan_mesh(plan: Plan, mesh: Any = None) -> Any:
    """``mesh`` checked against the pipelined plan's ``(stage, data, model)``
    mesh, or by default that mesh over all devices."""
    return _plan_mesh(plan, mesh)


def _check_batch(plan: Plan, x: Any) -> None:
    if x.shape[0] != plan.batch:
        raise ValueError(f"the pipelined plan runs a global batch of {plan.batch} ({plan.pipeline.microbatches} "
                         f"micro-batches of {plan.pipeline.micro_batch} per data replica); got {x.shape[0]}")


def _plan_mesh(plan: Plan, mesh: Any) -> Any:
    shape = plan.pipeline.mesh
    if mesh is None:
        if len(jax.devices()) != plan.pipeline.devices:
            raise ValueError(f"the pipelined plan runs on {plan.pipeline.devices} devices ({shape[0]} stages x "
                             f"{shape[1]} data x {shape[2]} model); {len(jax.devices())} are available")
        return pipeline_mesh(*shape)
    if tuple(mesh.devices.shape) != shape or tuple(mesh.axis_names) != ("stage", "data", "model"):
        raise ValueError(f"mesh {dict(mesh.shape)} does not match the plan's {shape[0]}x{shape[1]}x{shape[2]} mesh "
                         "over ('stage', 'data', 'model'); build it with planner.runtime.pipeline_mesh")
    return mesh


def model_parameters(params: ChainParams, blocks_prefix: str = "blocks/") -> dict[str, jax.Array]:
    """A whole model's parameters by name (``blocks/3/attn/qkv/kernel``) from
    the chain's (:class:`PipelinedState`), e.g. to compare or save them."""
    out = {**params.first, **params.head}
    for name, stacked in params.blocks.items():
        for i in range(stacked.shape[0]):
            out[f"{blocks_prefix}{i}/{name}"] = stacked[i]
    return out
