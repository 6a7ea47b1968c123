"""Memory per pipeline stage on one device: the model state its layers keep
(weights, gradients, optimizer state), and the activations of the
micro-batches in flight.

Model state per parameter, as a mixed-precision optimizer keeps it
(:class:`StateBytes`): 16-bit weights the passes read (2 B), fp32 main
gradients they accumulate into (4 B), fp32 master weights (4 B) and Adam's
two fp32 moments (8 B): 18 B per parameter (Megatron-LM's distributed
optimizer guide: "bf16 param, fp32 grads: 18"; ZeRO, Rajbhandari et al.
2020, §3.1, counts 2 + 2 + 12 = 16 with 16-bit gradients). ZeRO stage 1 /
Megatron's distributed optimizer shards the master weights and moments over
the ``d`` data-parallel replicas: ``6 + 12 / d`` (same guide; ZeRO §5.1).
fp32 training keeps ``4 + 4 + 8`` (no master copy).

The optimizer step is memory-bound: it reads and writes each parameter's
state once per step. Per parameter of its shard (Megatron-LM's
mixed-precision optimizer step): the gradients unscaled and checked (read
and write the fp32 main gradient, 8 B), their norm for clipping (read, 4 B),
Adam (read gradient, master weight and two moments, write the weight and
the moments: 28 B), the master weights copied to the 16-bit weights (6 B)
and the gradient buffer zeroed (4 B): :attr:`StateBytes.step_bytes`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

__all__ = ["StateBytes", "state_bytes", "stage_memory_bytes"]


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes of model state per parameter (module docstring)."""

    weight: float  # the weights the passes read (16-bit, or fp32)
    gradient: float  # the main gradients (fp32)
    master: float  # fp32 master weights (mixed precision only)
    optimizer: float  # the optimizer's slots (Adam: two fp32 moments)
    step_bytes: float  # bytes the optimizer step reads and writes per parameter of its shard

    @property
    def total(self) -> float:
        return self.weight + self.gradient + self.master + self.optimizer

    @property
    def sharded(self) -> float:
        """What ZeRO stage 1 / the distributed optimizer splits over data: master weights and slots."""
        return self.master + self.optimizer


_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}  # fp32 slots per parameter


def state_bytes(dtype: str = "float16", optimizer: str = "adam") -> StateBytes:
    """The :class:`StateBytes` of mixed-precision (``float16``, ``bfloat16``)
    or fp32 training with ``optimizer``."""
    if optimizer not in _SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {', '.join(_SLOTS)}")
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"unknown dtype {dtype!r}; choose from float16, bfloat16, float32")
    slots = 4.0 * _SLOTS[optimizer]
    mixed = dtype != "float32"
    weight = 2.0 if mixed else 4.0
    master = 4.0 if mixed else 0.0
    # unscale (r+w 8) and norm (r 4) of the main gradients, the update (read g, w, slots; write w, slots),
    # the 16-bit copy of the master weights (r 4 + w 2), zeroing the gradients (w 4)
    update = 4.0 + 2.0 * 4.0 + 2.0 * slots
    step = 8.0 + 4.0 + update + (6.0 if mixed else 0.0) + 4.0
    return StateBytes(weight=weight, gradient=4.0, master=master, optimizer=slots, step_bytes=step)


def stage_memory_bytes(params, activation_bytes, in_flight, extra_activation_bytes, data, state: StateBytes,
                       distributed_optimizer=False, transient_bytes=0.0):
    """``(state, activations)`` bytes per device of each stage ``[S]``.

    ``params`` [S] parameters one device of the stage holds; ``activation_bytes``
    [S] what one micro-batch leaves kept over all the stage's layers;
    ``in_flight`` [S] how many micro-batches it holds at its peak
    (:func:`costmodels.pipeline.in_flight_microbatches`);
    ``extra_activation_bytes`` [S] what a micro-batch keeps beyond the layers
    (the embedding's on the first stage, the output layer's on the last: one
    micro-batch's, held as the layers' are); ``transient_bytes`` [S] what the
    backward step of one layer adds (a recomputed block's activations);
    ``data`` the data-parallel replicas the distributed optimizer shards over."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    d = jnp.maximum(f32(data), 1.0)
    sharded = jnp.where(jnp.asarray(distributed_optimizer), state.sharded / d, state.sharded)
    per_param = state.weight + state.gradient + sharded
    state_total = f32(params) * per_param
    activations = (f32(activation_bytes) + f32(extra_activation_bytes)) * f32(in_flight) + f32(transient_bytes)
    return state_total, activations
