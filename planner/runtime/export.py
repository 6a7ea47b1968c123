"""From per-layer strategies to ``jax.sharding``: PartitionSpecs for a Flax
model's parameters, optimizer state and activations, and a jitted, sharded
training step. JAX's own SPMD partitioner (GSPMD/Shardy) and runtime do the
distributed work; this module only states layouts.

Layouts are :mod:`planner.plans.specs`'s (the cost model's own tables, and
what the plan file records) on a ``("data", "model")`` mesh with
``AxisType.Auto`` axes (jax-notes.md §2: explicit axes would turn sharding
constraints into assertions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from costmodels import AXIS_NAMES
from planner.models.layer_equations import equation_layers, marked_module_calls
from planner.plans.specs import (
    BATCH_AXES,
    activation_spec,
    check_strategy,
    param_spec,
    partition_specs,
    shardings,
)
from planner.runtime.calls import SCATTER_DIMS, constrain
from planner.runtime.layouts import (
    block_layouts,
    consumer_layouts,
    local_gradient_layers,
    producer_layouts,
    scatter_layouts,
)
from planner.runtime.linen import LinenModel, constrained_linen_calls
from planner.runtime.module_calls import constrained_calls
from planner.runtime.runs import recomputing_forward, run_members

__all__ = [
    "AXIS_NAMES",
    "TrainState",
    "activation_spec",
    "block_layouts",
    "consumer_layouts",
    "lower_training",
    "local_gradient_layers",
    "make_mesh",
    "param_spec",
    "partition_specs",
    "process_device_grid",
    "producer_layouts",
    "scatter_layouts",
    "shard_training",
    "shardings",
]


def make_mesh(d: int, m: int, devices: Any = None, *, by_process: bool | None = None) -> Mesh:
    """The one mesh builder: a ``d x m`` ``("data", "model")`` mesh with Auto
    axes over ``devices`` (default: all). ``by_process`` (default: when the
    devices belong to several processes) orders them by (process, id) with
    each model group inside one process
    (:func:`process_device_grid`); otherwise
    ``jax.make_mesh`` lays them out."""
    devices = jax.devices() if devices is None else list(devices)
    if d < 1 or m < 1 or d * m != len(devices):
        hint = ""
        if devices and all(getattr(x, "platform", "") == "cpu" for x in devices):
            hint = (f"; on a CPU, run with JAX_NUM_CPU_DEVICES={d * m} in the environment for {d * m} "
                    "XLA CPU devices (set before JAX starts)")
        raise ValueError(f"a {d}x{m} mesh needs {d * m} devices, but {len(devices)} are available{hint}")
    if by_process is None:
        by_process = len({getattr(x, "process_index", 0) for x in devices}) > 1
    axis_types = (AxisType.Auto, AxisType.Auto)
    if by_process:
        return Mesh(process_device_grid(d, m, devices), AXIS_NAMES, axis_types=axis_types)
    return jax.make_mesh((d, m), AXIS_NAMES, axis_types=axis_types, devices=devices)


def process_device_grid(d: int, m: int, devices: Sequence[Any]) -> np.ndarray:
    """``devices`` as a ``[d, m]`` grid ordered by (process, id), each row
    inside one process (the layout of :func:`planner.runtime.distributed.process_mesh`); ``ValueError`` if a
    row would span processes."""
    devs = sorted(devices, key=lambda x: (x.process_index, x.id))
    grid = np.array(devs, dtype=object).reshape(d, m)
    for row in grid:
        procs = {x.process_index for x in row}
        if len(procs) > 1:
            per = [sum(1 for x in devs if x.process_index == p) for p in sorted({x.process_index for x in devs})]
            raise ValueError(
                f"a model axis of {m} devices would span processes {sorted(procs)} (devices per process: {per}); "
                f"plan with a model axis that divides the devices of one process (hardware devices_per_node)"
            )
    return grid


class TrainState(NamedTuple):
    params: Any  # nnx.State of nnx.Param
    other: Any  # nnx.State of everything else (batch statistics)
    opt_state: Any  # optax state, sharded like the parameters


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _build(model: nnx.Module, strategies: Mapping[str, str], mesh: Mesh, optimizer: optax.GradientTransformation,
           loss_fn: Callable[[jax.Array, jax.Array], jax.Array], donate: bool,
           input_layouts: Mapping[str, str] | None = None,
           output_layouts: Mapping[str, Mapping[str, str]] | None = None,
           blocks: Mapping[str, tuple[str | None, str | None]] | None = None,
           zero_stages: Mapping[str, int] | None = None,
           remat_layers: Sequence[str] | None = None,
           scatters: Mapping[str, str] | None = None,
           recompute_runs: Sequence[Sequence[str]] | None = None,
           dtype: str = "float32") -> tuple[Any, Any, Any, Any, Any]:
    """(jitted step, state shardings, params, other, batch sharding)."""
    low = precision(dtype)
    zero = _zero_layers(strategies, zero_stages)
    remat, runs = _checked_options(model, strategies, zero, scatters, remat_layers, recompute_runs)
    graphdef, params, other = nnx.split(model, nnx.Param, ...)
    p_sh = shardings(params, strategies, mesh, zero[3])  # ZeRO-3: the weights themselves sharded (FSDP)
    g_sh = shardings(params, strategies, mesh, zero[2])  # ZeRO-2: the gradients reduce-scattered
    o_sh = shardings(other, strategies, mesh)
    opt_abs = jax.eval_shape(optimizer.init, params)
    opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, opt_abs, shardings(params, strategies, mesh, zero[1]),
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    state_sh = TrainState(p_sh, o_sh, opt_sh)
    batch_sh = NamedSharding(mesh, P(BATCH_AXES))

    def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
        last: list[str] = []

        def forward(params: Any, other: Any, x: jax.Array, tag: Callable[[Any], None] | None = None) -> Any:
            m = nnx.merge(graphdef, params, other, copy=True)
            if tag is not None:
                tag(m)
            recomputed: set[str] = set()
            if isinstance(m, LinenModel):  # a linen model: its module calls through Flax's interceptor
                calls = constrained_linen_calls(m, strategies, mesh, last, input_layouts, output_layouts,
                                                zero[2] | zero[3] | remat, int(x.shape[0]))
            else:
                calls = constrained_calls(m, strategies, mesh, last, input_layouts, output_layouts, blocks, remat,
                                           recomputed, zero[3], scatters, zero[2], int(x.shape[0]))
            with calls:
                logits = m(x)
            if remat - recomputed:  # (checked above: an attention module that was not called)
                raise ValueError(f"cannot recompute {sorted(remat - recomputed)[:3]}: their attention module "
                                 "was not called")
            _, _, new_other = nnx.split(m, nnx.Param, ...)
            return logits, new_other

        def loss_of(params: Any) -> tuple[jax.Array, Any]:
            if runs:  # traced with the extraction's markers, cut by layer, each run recomputed
                with marked_module_calls(model) as tag:
                    closed, shape = jax.make_jaxpr(lambda p, o, v: forward(p, o, v, tag),
                                                   return_shape=True)(params, state.other, to_precision(x, low))
                leaves = [*jax.tree.leaves(params), *jax.tree.leaves(state.other)]
                # ("replicate": what the extraction cannot map becomes a layer of its own, which the
                # comparison below reports, instead of an error about the export's own operations)
                found = equation_layers(model, closed, (params, state.other), int(x.shape[0]), "replicate")
                if set(found.names) != set(strategies):
                    extra = sorted(set(found.names) - set(strategies))
                    missing = sorted(set(strategies) - set(found.names))
                    raise ValueError(
                        f"cannot cut the traced training step into the plan's layers to recompute runs: it finds "
                        f"layers the plan does not name ({extra[:3]}) and misses some it names ({missing[:3]}); "
                        "recompute fewer layers (levers without remat) or report this model")
                run = recomputing_forward(closed, run_members(found.layers, runs))
                logits, new_other = jax.tree.unflatten(jax.tree.structure(shape), run(*leaves, to_precision(x, low)))
            else:
                logits, new_other = forward(params, state.other, to_precision(x, low))
            logits = to_precision(logits, jnp.float32)  # the loss in fp32
            # The loss runs on the output as the cost model assumes: batch-split
            # where the last layer leaves it so, else gathered over the model axis
            # (costmodels.collective_list, "-> loss" records).
            labels = y
            if last and last[-1] != "batch":
                logits = constrain(logits, "replicated", mesh)
                labels = constrain(y, "replicated", mesh)
            return loss_fn(logits, labels), new_other

        # jax.nn.softmax under its custom JVP, which keeps the probabilities only; JAX's default
        # (0.10) differentiates through exp and the division and keeps the exponentials too,
        # one more (heads x tokens^2) buffer per attention (docs/transformers.md). Around the
        # whole differentiation: a recomputed attention's forward is traced in the backward pass.
        # Mixed precision (costmodels.CostSettings): the forward and backward passes run on a low-precision
        # copy of the fp32 master weights, whose gradients are reduced in that precision, then widened.
        with jax.softmax_custom_jvp(True):
            (loss, new_other), grads = jax.value_and_grad(loss_of, has_aux=True)(to_precision(state.params, low))
        # Gradients in their parameters' layouts before the optimizer, as the plan reduces them
        # (sharded over the data-parallel group where ZeRO stage 2 or 3 shards them).
        grads = to_precision(jax.lax.with_sharding_constraint(grads, g_sh), jnp.float32)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, new_other, opt_state), loss

    # A fresh jit per call: the patched __call__ is not part of jit's cache key
    # (jax-notes.md §2, step 4).
    step = jax.jit(train_step, in_shardings=(state_sh, batch_sh, batch_sh), out_shardings=(state_sh, None),
                   donate_argnums=(0,) if donate else ())
    return step, state_sh, params, other, batch_sh


def _checked_options(model: nnx.Module, strategies: Mapping[str, str], zero: Mapping[int, frozenset[str]],
                     scatters: Mapping[str, str] | None, remat_layers: Sequence[str] | None,
                     recompute_runs: Sequence[Sequence[str]] | None) -> tuple[frozenset[str], list[list[str]]]:
    """The export's options checked against the plan's strategies (a
    ``ValueError`` naming what is wrong): the layers recomputed alone and the
    runs recomputed together."""
    for s in strategies.values():
        check_strategy(s)
    for name, layout in ({} if scatters is None else scatters).items():
        if strategies.get(name) != "channel" or layout not in SCATTER_DIMS:
            raise ValueError(f"scatters maps {name!r} to {layout!r}: only channel layers' outputs are "
                             f"reduce-scattered, into one of {', '.join(SCATTER_DIMS)}")
        if name in zero[3]:
            raise ValueError(f"scatters names {name!r}, which ZeRO stage 3 shards: its call gathers its weights "
                             "itself (scatter_layouts(..., zero_stages) leaves such layers out)")
    remat = frozenset(() if remat_layers is None else remat_layers)
    unknown = sorted(remat - set(strategies))
    if unknown:
        raise ValueError(f"remat_layers names {unknown[:3]}, which the plan does not name")
    runs = [list(run) for run in (recompute_runs or ())]
    unknown = sorted({name for run in runs for name in run} - set(strategies))
    if unknown:
        raise ValueError(f"recompute_runs names {unknown[:3]}, which the plan does not name")
    both = sorted(remat.intersection(name for run in runs for name in run))
    if both:
        raise ValueError(f"{both[:3]} are in remat_layers and in recompute_runs: give each layer one of them")
    attention = {"/".join(map(str, p)) for p, mod in nnx.iter_modules(model)
                 if isinstance(mod, nnx.MultiHeadAttention)}
    # a layer recomputed alone outside an nnx.MultiHeadAttention (a hand-written attention): a run of one layer,
    # cut from the traced step as every run is
    elsewhere = sorted(r for r in remat if r.rpartition("/")[0] not in attention)
    return remat.difference(elsewhere), runs + [[name] for name in elsewhere]


def precision(dtype: str) -> Any:
    """The JAX dtype a plan's ``dtype`` computes in: ``float32``, or under
    mixed precision ``bfloat16`` / ``float16``."""
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {dtype!r}; choose from float32, bfloat16, float16")
    return jnp.dtype(dtype)


def to_precision(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating-point arrays in ``dtype`` (integers, such as
    token ids, and arrays already in it unchanged)."""
    def cast(v: Any) -> Any:
        floating = hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.floating)
        return v.astype(dtype) if floating and v.dtype != dtype else v

    return jax.tree.map(cast, tree)


def _zero_layers(strategies: Mapping[str, str], zero_stages: Mapping[str, int] | None) -> dict[int, frozenset[str]]:
    """For ZeRO stages 1, 2, 3: the layers whose optimizer state (1), also
    gradients (2) and also weights (3) are sharded over their data-parallel
    group (``costmodels.levers``)."""
    zero_stages = {} if zero_stages is None else dict(zero_stages)
    for layer, z in zero_stages.items():
        if z not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage of layer {layer!r} must be 0, 1, 2 or 3, got {z!r}")
        if layer not in strategies:
            raise ValueError(f"ZeRO stage given for {layer!r}, which the plan does not name")
    return {k: frozenset(n for n, z in zero_stages.items() if z >= k) for k in (1, 2, 3)}


def shard_training(
    model: nnx.Module,
    strategies: Mapping[str, str],
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = _cross_entropy,
    input_layouts: Mapping[str, str] | None = None,
    output_layouts: Mapping[str, Mapping[str, str]] | None = None,
    blocks: Mapping[str, tuple[str | None, str | None]] | None = None,
    zero_stages: Mapping[str, int] | None = None,
    remat_layers: Sequence[str] | None = None,
    scatters: Mapping[str, str] | None = None,
    recompute_runs: Sequence[Sequence[str]] | None = None,
    dtype: str = "float32",
) -> tuple[Callable[[TrainState, jax.Array, jax.Array], tuple[TrainState, jax.Array]], TrainState]:
    """A jitted training step ``step(state, x, y) -> (state, loss)`` for ``model``
    with parameters, optimizer state and each planned layer's activations laid
    out by ``strategies`` on ``mesh``, and the initial state placed accordingly.

    ``model`` is a concrete nnx module (its current weights are used). Inputs
    are split over ``("data", "model")`` on the batch dim; the step donates
    nothing, so callers may keep old states. ``input_layouts`` (module path ->
    layout, from :func:`producer_layouts`) pins module inputs to their
    producers' planned layouts first; ``output_layouts`` (from
    :func:`consumer_layouts`) pins module outputs read by functional ops to
    those ops' planned layouts; ``blocks`` (from :func:`block_layouts`) pins
    the inputs and outputs of blocks of layers (residual blocks). ``zero_stages``
    (layer -> 0..3) shards a layer's optimizer state (stage 1), also its
    gradients (2) and also its weights (3) over its data-parallel group
    (:func:`planner.plans.specs.zero_spec_entries`); XLA inserts the
    reduce-scatters and all-gathers. ``remat_layers`` (attention layers
    ``<path>/attention`` of ``nnx.MultiHeadAttention`` modules) recompute
    their attention in the backward pass (:func:`planner.runtime.calls.recomputing_attention`). ``scatters``
    (from :func:`scatter_layouts`) reduce-scatters the partial sums of the
    ``channel`` layers it names into their consumers' layout inside
    ``jax.shard_map``. ``recompute_runs`` (runs of layers, each its layer
    names) recomputes each run in the backward pass from what enters it
    (:mod:`planner.runtime.runs`). ``dtype`` is the plan's precision: under
    ``bfloat16`` or ``float16`` (mixed precision, the policy the cost model
    prices: :class:`costmodels.CostSettings`) the state keeps fp32 master
    weights and optimizer state, and each step runs the forward and backward
    passes on a copy of the weights and of the float inputs in that
    precision, reduces the gradients in it, widens them to fp32 for the
    optimizer and takes the loss of fp32 logits."""
    step, state_sh, params, other, _ = _build(model, strategies, mesh, optimizer, loss_fn, False, input_layouts,
                                              output_layouts, blocks, zero_stages, remat_layers, scatters,
                                              recompute_runs, dtype)
    init = jax.jit(lambda p, o: TrainState(p, o, optimizer.init(p)), out_shardings=state_sh)
    return step, init(params, other)


def lower_training(
    model: nnx.Module,
    strategies: Mapping[str, str],
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    x: Any,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = _cross_entropy,
    donate: bool = True,
    input_layouts: Mapping[str, str] | None = None,
    output_layouts: Mapping[str, Mapping[str, str]] | None = None,
    blocks: Mapping[str, tuple[str | None, str | None]] | None = None,
    zero_stages: Mapping[str, int] | None = None,
    remat_layers: Sequence[str] | None = None,
    scatters: Mapping[str, str] | None = None,
    recompute_runs: Sequence[Sequence[str]] | None = None,
    dtype: str = "float32",
) -> tuple[jax.stages.Lowered, TrainState]:
    """The training step of :func:`shard_training`, lowered for inputs shaped
    like ``x`` (batch first, channels last; integer labels, one per token
    where ``x`` holds token ids), without running
    anything: ``model`` may be abstract (``nnx.eval_shape``). Returns the
    lowered step and the state's abstract leaves (``ShapeDtypeStruct`` with
    their planned shardings). ``donate`` (default) lets the new state reuse
    the old one's buffers, as an in-place training loop would; ``dtype`` as
    for :func:`shard_training`."""
    step, state_sh, params, other, batch_sh = _build(model, strategies, mesh, optimizer, loss_fn, donate,
                                                     input_layouts, output_layouts, blocks, zero_stages,
                                                     remat_layers, scatters, recompute_runs, dtype)
    opt_abs = jax.eval_shape(optimizer.init, params)

    def spec(leaf: Any, sh: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sh)

    abstract = jax.tree.map(spec, TrainState(jax.eval_shape(lambda p: p, params), jax.eval_shape(lambda o: o, other),
                                             opt_abs), state_sh)
    x_spec = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=batch_sh)
    # integer labels: one per sample, or one per token where the inputs are token ids (a language model)
    ids = jax.numpy.issubdtype(x.dtype, jax.numpy.integer)
    y_spec = jax.ShapeDtypeStruct(tuple(x.shape) if ids else (x.shape[0],), jax.numpy.int32, sharding=batch_sh)
    return step.lower(abstract, x_spec, y_spec), abstract
