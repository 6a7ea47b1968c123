"""Memory levers per layer: sharding a layer's training state over its
data-parallel group (ZeRO stages 1-3, FSDP) and rematerialising its
activations (``jax.checkpoint``).

A lever changes neither the layouts a strategy consumes and produces nor
the layer's resharding, only its own time and memory, so the menu of a
layer is the product of the strategies (:mod:`costmodels.strategies`) and
the levers a :class:`~costmodels.CostSettings` allows (``levers``):

=========  ==========================================================
``none``   every strategy as is (today's menu, ``K = 1``)
``zero``   each strategy with ZeRO stage 0, 1, 2 or 3 (``K = 4``)
``remat``  each strategy with activations kept, recomputed, or recomputed
           in the run of the layer before (``K = 3``)
``all``    both (``K = 12``)
=========  ==========================================================

An *option* is one (strategy, lever) pair; a :class:`~costmodels.CostTable`
built with ``K`` levers has ``S K`` options per layer, option ``o`` being
strategy ``o // K`` under lever ``menu[o % K]``, and lever 0 always the
plain strategy. Its per-layer fields are ``[L, S K]``; its resharding stays
``[E, S, S]``, by strategy (:func:`strategy_probs` folds a relaxed plan's
option probabilities onto strategies for it).

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", §5 and Figure 1 for memory, §7 for
communication) partitions a layer's training state over the ``D`` devices
that hold replicas of its weights (its data-parallel group: both mesh axes
for ``data`` and ``spatial``, the data axis for the others, as for the
gradient all-reduce):

* stage 1 shards the optimizer state (with mixed precision the fp32
  master weights, which ZeRO counts as optimizer state, and here the
  optimizer's update buffer); stage 2 also the gradients; stage 3 (FSDP,
  Zhao et al. 2023) also the weights;
* stage 2 replaces the gradient all-reduce by a reduce-scatter (issued in
  the backward pass: it overlaps like the all-reduce) and an all-gather of
  the updated weights after the optimizer step (exposed): ``2 Psi`` in
  all, the all-reduce's volume (ZeRO §7.2.1);
* stage 1 keeps the gradients whole, so on JAX's runtime they are
  all-reduced as without ZeRO (XLA holds no full-size gradient buffer
  that a reduce-scatter could fill, which is how ZeRO's stage 1 moves only
  ``2 Psi``), and the updated weights are all-gathered: ``3 Psi``
  (``planner.runtime.export``; measured, docs/levers.md);
* stage 3 gathers the weights before the forward and again before the
  backward use (both exposed) and reduce-scatters the gradients: ``3 Psi``
  (ZeRO §7.2.2). Its gathered weights, and under stages 2 and 3 the
  layer's whole gradient before the reduce-scatter, are transients of the
  layer's backward step.

Rematerialisation (``jax.checkpoint`` around the layer: its residuals are
its inputs, and its forward runs again inside the backward pass) keeps only
the layer's input instead of what the layer saves, recomputes the forward
(compute, and a spatial layer's forward exchange) and holds the recomputed
activations at its backward step as a transient. A recomputing layer may
instead *join* the run of the layer before it (``remat+join``): where that
layer recomputes too, the two are checkpointed as one (Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost", section 3), so the
joining layer keeps no input and its activations are recomputed with the
run's (:func:`costmodels.recomputed_runs`); after a layer that keeps its
activations it is plain ``remat``.

Masks rule out what cannot run or does nothing: ZeRO needs parameters, a
group of more than one device and ``D`` dividing the output channels each
device holds (the dimension it shards); it is not offered on attention
layers, tied output layers nor the embeddings that share their table.
Recomputing is offered only where the layer saves more than its input
(with ``CostSettings(remat_runs=True)``, on every layer: a run frees what
its layers save beyond what enters it, and crosses the layers that save
nothing, an add or a flatten), and joining a run only
where a producer of the layer can recompute.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from costmodels.strategies import NUM_STRATEGIES, STRATEGY_NAMES

__all__ = [
    "LEVER_CHOICES",
    "Lever",
    "LeverInputs",
    "LeverCosts",
    "lever_menu",
    "menu_of",
    "levers_per_strategy",
    "option_strategy",
    "option_recomputing",
    "option_index",
    "option_name",
    "parse_option",
    "menu_covering",
    "with_lever",
    "strategy_probs",
    "lever_costs",
]

LEVER_CHOICES = ("none", "zero", "remat", "all")
ZERO_STAGES = (0, 1, 2, 3)


class Lever(NamedTuple):
    """One lever setting of a layer."""

    zero_stage: int  # 0: none; 1: optimizer state sharded; 2: and gradients; 3: and weights (FSDP)
    remat: bool  # activations recomputed in the backward pass instead of kept
    joins: bool = False  # recomputed in the run of the layer before where that layer recomputes (needs remat)

    @property
    def name(self) -> str:
        parts = ([f"zero{self.zero_stage}"] if self.zero_stage else []) + (["remat"] if self.remat else []) \
            + (["join"] if self.joins else [])
        return "+".join(parts) or "none"


def lever_menu(levers: str) -> tuple[Lever, ...]:
    """The levers ``levers`` (one of :data:`LEVER_CHOICES`) allows, the plain
    setting first."""
    if levers not in LEVER_CHOICES:
        raise ValueError(f"unknown levers {levers!r}; choose from {', '.join(LEVER_CHOICES)}")
    stages = ZERO_STAGES if levers in ("zero", "all") else (0,)
    remat = ((False, False), (True, False), (True, True)) if levers in ("remat", "all") else ((False, False),)
    return tuple(Lever(z, r, j) for r, j in remat for z in stages)


_MENU_BY_SIZE = {len(lever_menu(c)): lever_menu(c) for c in LEVER_CHOICES}


def levers_per_strategy(num_options: int) -> int:
    """``K``, the levers per strategy of a menu of ``num_options`` options."""
    K, rest = divmod(int(num_options), NUM_STRATEGIES)
    if rest or K not in _MENU_BY_SIZE:
        raise ValueError(f"{num_options} options is not {NUM_STRATEGIES} strategies times a lever menu "
                         f"({', '.join(str(k) for k in sorted(_MENU_BY_SIZE))} levers)")
    return K


def menu_of(num_options: int) -> tuple[Lever, ...]:
    """The lever menu of a table with ``num_options`` options per layer."""
    return _MENU_BY_SIZE[levers_per_strategy(num_options)]


def option_strategy(num_options: int) -> np.ndarray:
    """The strategy code of each option ``[O]``."""
    return np.arange(num_options) // levers_per_strategy(num_options)


def option_recomputing(num_options: int) -> tuple[np.ndarray, np.ndarray]:
    """Whether each option recomputes, and whether it joins the run before it: ``([O], [O])`` bool."""
    menu = menu_of(num_options)
    reps = int(num_options) // len(menu)
    return (np.asarray([lv.remat for lv in menu] * reps, dtype=bool),
            np.asarray([lv.joins for lv in menu] * reps, dtype=bool))


def option_index(strategy: int, lever: Lever, menu: tuple[Lever, ...]) -> int:
    """The option of ``strategy`` under ``lever`` in ``menu``."""
    if lever not in menu:
        raise ValueError(f"lever {lever.name!r} is not in this menu ({', '.join(x.name for x in menu)})")
    return int(strategy) * len(menu) + menu.index(lever)


def option_name(option: int, menu: tuple[Lever, ...]) -> str:
    """``strategy`` or ``strategy+lever``, e.g. ``data+zero3+remat``."""
    s, k = divmod(int(option), len(menu))
    return with_lever(STRATEGY_NAMES[s], menu[k])


def with_lever(strategy: str, lever: Lever) -> str:
    """The option name of ``strategy`` (a name) under ``lever``: the strategy
    alone without a lever, else ``strategy+lever`` (:func:`parse_option` reads it)."""
    return strategy if lever == Lever(0, False) else f"{strategy}+{lever.name}"


def parse_option(name: str) -> tuple[int, Lever]:
    """The strategy code and lever of an option name (:func:`option_name`'s
    form: ``data``, ``data+zero2``, ``filter+zero3+remat``, ``spatial+remat``,
    ``data+remat+join``)."""
    if not isinstance(name, str):
        raise ValueError(f"an option must be a name such as 'data' or 'data+zero2', got {name!r}")
    head, *parts = name.strip().lower().split("+")
    if head not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {head!r} in {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
    zero, remat, joins = 0, False, False
    for part in parts:
        if part == "remat" and not remat:
            remat = True
        elif part == "join" and remat and not joins:
            joins = True
        elif part in ("zero1", "zero2", "zero3") and not zero:
            zero = int(part[-1])
        else:
            raise ValueError(f"unknown or repeated lever {part!r} in {name!r}; a strategy may carry one of "
                             "zero1, zero2, zero3 and remat, and join after remat, e.g. 'data+zero3+remat'")
    return STRATEGY_NAMES.index(head), Lever(zero, remat, joins)


def menu_covering(levers: Iterable[Lever]) -> str:
    """The smallest lever choice (:data:`LEVER_CHOICES`, smallest first) whose
    menu (:func:`lever_menu`) holds every lever in ``levers``."""
    wanted = set(levers)
    return next(c for c in LEVER_CHOICES if wanted <= set(lever_menu(c)))


def strategy_probs(probs):
    """Option probabilities ``[..., L, S K]`` summed per strategy ``[..., L, S]``."""
    K = levers_per_strategy(probs.shape[-1])
    if K == 1:
        return probs
    return jnp.sum(jnp.reshape(probs, probs.shape[:-1] + (NUM_STRATEGIES, K)), axis=-1)


class LeverInputs(NamedTuple):
    """A layer's costs per plain strategy and what the levers change (:mod:`costmodels.table`)."""

    feasible: jnp.ndarray  # [L, S] bool
    compute_s: jnp.ndarray  # [L, S] forward + backward compute, seconds
    backward_s: jnp.ndarray  # [L, S] its backward part
    grad_sync_s: jnp.ndarray  # [L, S] the gradient all-reduce, seconds
    halo_s: jnp.ndarray  # [L, S] exchanges inside the layer, forward + backward, seconds
    forward_halo_s: jnp.ndarray  # [L, S] their forward part (run again when recomputed)
    output_s: jnp.ndarray  # [L, S] gathering a sink's output for the loss, seconds
    params: jnp.ndarray  # [L, S] parameters one device holds
    buffer_bytes: jnp.ndarray  # [L, S] fp32 statistics (batch norm), bytes per device
    activation_bytes: jnp.ndarray  # [L, S] activations the layer saves, bytes per device
    input_bytes: jnp.ndarray  # [L, S] the layer's input, bytes per device (what recomputing keeps)
    workspace_bytes: jnp.ndarray  # [L, S] transient at the layer's backward step, bytes per device
    group: jnp.ndarray  # [S] devices holding replicas of the weights (ZeRO's data-parallel group)
    reduce_scatter_bucket_s: jnp.ndarray  # [S] reduce-scatter of one gradient bucket over the group, seconds
    all_gather_bucket_s: jnp.ndarray  # [S] all-gather of one bucket of weights over the group, seconds
    zero_ok: jnp.ndarray  # [L, S] bool, ZeRO can shard this layer's state under the strategy
    recomputable: jnp.ndarray  # [L, S] bool, recomputing is offered (it frees memory, alone or in a run)
    joinable: jnp.ndarray  # [L] bool, a producer of the layer can recompute (a run can reach it)


class LeverCosts(NamedTuple):
    """The fields of a :class:`~costmodels.CostTable` per option ``[L, S K]``."""

    feasible: jnp.ndarray
    compute_s: jnp.ndarray
    backward_compute_s: jnp.ndarray
    grad_sync_s: jnp.ndarray
    weight_gather_s: jnp.ndarray  # ZeRO's exposed weight all-gathers, seconds
    halo_s: jnp.ndarray
    output_s: jnp.ndarray
    state_bytes: jnp.ndarray
    update_bytes: jnp.ndarray  # the optimizer's update buffer (part of state_bytes)
    activation_bytes: jnp.ndarray
    workspace_bytes: jnp.ndarray
    recompute_bytes: jnp.ndarray  # what a recomputing option runs again: its activations kept without the lever
    checkpoint_bytes: jnp.ndarray  # what a recomputing option keeps instead: its input


def lever_costs(x: LeverInputs, menu: tuple[Lever, ...], *, weight_bytes: float, gradient_bytes: float,
                optimizer_bytes: float, update_bytes: float, bucket_bytes: float) -> LeverCosts:
    """Every option's costs, ``[L, S K]`` with option ``s K + k`` strategy ``s``
    under ``menu[k]``. Per parameter: ``weight_bytes`` (the weights the
    forward reads), ``gradient_bytes``, ``optimizer_bytes`` (master weights,
    slots and the update: the part stage 1 shards), ``update_bytes`` (the
    update alone, live at the optimizer step only)."""
    group = x.group[None, :]  # [1, S]
    plain_state = (weight_bytes + gradient_bytes + optimizer_bytes) * x.params + x.buffer_bytes
    fields = []
    for lever in menu:
        z = lever.zero_stage
        if z == 0:
            feasible, grad_sync, gather = x.feasible, x.grad_sync_s, jnp.zeros_like(x.grad_sync_s)
            state, extra = plain_state, jnp.zeros_like(plain_state)
            update = update_bytes * x.params
        else:
            feasible = x.feasible & x.zero_ok
            # ZeRO §7.2: reduce-scatter the gradients (stage 1 on JAX: all-reduce them, they
            # stay whole); gather the weights once after the update (stages 1, 2) or before
            # each use, forward and backward (stage 3).
            grad_sync = x.grad_sync_s if z == 1 else \
                x.reduce_scatter_bucket_s[None, :] * gradient_bytes * x.params / bucket_bytes
            gather = (1.0 if z < 3 else 2.0) * x.all_gather_bucket_s[None, :] * weight_bytes * x.params / bucket_bytes
            # ZeRO §5, Figure 1: stage 1 partitions the optimizer state, 2 also the gradients, 3 also the weights.
            sharded = optimizer_bytes + (gradient_bytes if z >= 2 else 0.0) + (weight_bytes if z >= 3 else 0.0)
            kept = weight_bytes + gradient_bytes + optimizer_bytes - sharded
            # Stage 1 (whole gradients, sharded update) holds a weight-sized buffer at the
            # optimizer step beside the sharded update, the update gathered to the whole
            # weights it is added to (compiled memory of VGG16-CIFAR-10, every layer data at
            # stage 1: 193.4 MB, 166.4 predicted without it, 198.8 with; docs/levers.md).
            # Stage 2's step holds no such buffer (124.4 MB compiled, 147.3 predicted with it).
            gathered = (weight_bytes if z == 1 else 0.0) * x.params
            state = (kept + sharded / group) * x.params + x.buffer_bytes + gathered
            update = update_bytes / group * x.params + gathered  # stage 1 shards the update with the slots
            # transients of the backward step: the whole gradient before its reduce-scatter
            # (stages 2, 3) and the gathered weights (stage 3)
            extra = ((gradient_bytes if z >= 2 else 0.0) + (weight_bytes if z >= 3 else 0.0)) * x.params
        compute, backward, halo, activation = x.compute_s, x.backward_s, x.halo_s, x.activation_bytes
        recompute = checkpoint = jnp.zeros_like(x.activation_bytes)
        if lever.remat:
            # jax.checkpoint: keep the input, run the forward again inside the backward pass
            feasible = feasible & x.recomputable
            if lever.joins:
                feasible = feasible & x.joinable[:, None]
            compute = compute + (x.compute_s - x.backward_s)
            backward = backward + (x.compute_s - x.backward_s)
            halo = halo + x.forward_halo_s
            activation = checkpoint = x.input_bytes
            recompute = x.activation_bytes
            extra = extra + x.activation_bytes
        fields.append((feasible, compute, backward, grad_sync, gather, halo, x.output_s, state, update, activation,
                       x.workspace_bytes + extra, recompute, checkpoint))
    K = len(menu)

    def interleave(arrays):  # K arrays [L, S] -> [L, S K], option s K + k
        stacked = jnp.stack([jnp.broadcast_to(a, x.compute_s.shape) for a in arrays], axis=-1)
        return jnp.reshape(stacked, stacked.shape[:-2] + (stacked.shape[-2] * K,))

    return LeverCosts(*(interleave(col) for col in zip(*fields, strict=True)))
