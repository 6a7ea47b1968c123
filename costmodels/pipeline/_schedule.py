"""Pipeline schedules: how many micro-batch slots a training step takes, and
how many micro-batches' activations a stage holds at its peak.

``S`` stages, ``m`` micro-batches per step, ``v`` model chunks per device
(interleaving; ``v = 1`` otherwise). A *slot* is the forward and backward
pass of one micro-batch through one stage (all ``v`` of its chunks).

=============  =========================  ==================================
schedule       slots per step             micro-batches stage i holds
=============  =========================  ==================================
GPipe          m + S - 1                  m
1F1B           m + S - 1                  min(S - i, m)
interleaved    m + (S - 1) / v            min((2 (S-1-i) + (v-1) S + 1) / v, m)
=============  =========================  ==================================

* GPipe (Huang et al. 2019, §2.2) runs every micro-batch forward, then every
  one backward: the bubble is ``(S - 1)`` slots and every stage keeps all
  ``m`` micro-batches' activations until their backward pass.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM", §2.2.1) has
  the same bubble, ``(S - 1) / m`` of the ideal time, but stage ``i``
  (0-based) starts at most ``S - i`` micro-batches before it runs the first
  backward pass, so it holds ``S - i`` of them (``S`` on the first stage).
* Interleaved 1F1B (§2.2.2) gives each device ``v`` chunks of ``1/v`` of its
  layers: the bubble shrinks to ``(S - 1) / (v m)`` of the ideal time,
  ``m + (S - 1) / v`` slots of the slowest stage; the warm-up runs
  ``2 (S - 1 - i) + (v - 1) S`` chunk passes ahead of the first backward
  (Megatron-LM's interleaved schedule), so stage ``i`` holds
  ``(2 (S - 1 - i) + (v - 1) S + 1) / v`` micro-batches' worth of its
  layers: ``S + (S - 1) / v`` on the first, which is Korthikanti et al.
  2022 ("Reducing Activation Recomputation in Large Transformer Models",
  §4.2.3): the first stage's activations grow by ``1 + (S - 1) / (S v)``
  over 1F1B. With ``v = 1`` the interleaved schedule is 1F1B (its warm-up
  formula is used for ``v > 1`` only).

Everything is jnp and broadcasts over its arguments (vmappable): ``S``,
``m``, ``v`` and the stage index are float arrays.
"""

from __future__ import annotations

import enum

import jax.numpy as jnp

__all__ = ["Schedule", "SCHEDULE_NAMES", "bubble_fraction", "in_flight_microbatches", "parse_schedule", "step_slots"]


class Schedule(enum.IntEnum):
    GPIPE = 0
    ONE_F_ONE_B = 1
    INTERLEAVED = 2


SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved")


def parse_schedule(name: str | int | Schedule) -> Schedule:
    """A schedule by name (``gpipe``, ``1f1b``, ``interleaved``) or code."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key not in SCHEDULE_NAMES:
            raise ValueError(f"unknown pipeline schedule {name!r}; choose from {', '.join(SCHEDULE_NAMES)}")
        return Schedule(SCHEDULE_NAMES.index(key))
    return Schedule(int(name))


def _chunks(schedule, v):
    """The model chunks per device: ``v`` under the interleaved schedule, else 1."""
    return jnp.where(jnp.asarray(schedule) == Schedule.INTERLEAVED, jnp.maximum(jnp.asarray(v, jnp.float32), 1.0), 1.0)


def step_slots(schedule, stages, microbatches, v=1.0):
    """Micro-batch slots of the slowest stage one step takes: ``m + (S - 1)``
    (GPipe, 1F1B), ``m + (S - 1) / v`` (interleaved; Narayanan et al. 2021,
    §2.2.2)."""
    S = jnp.asarray(stages, jnp.float32)
    m = jnp.asarray(microbatches, jnp.float32)
    return m + (S - 1.0) / _chunks(schedule, v)


def bubble_fraction(schedule, stages, microbatches, v=1.0):
    """Idle time over ideal time, ``(S - 1) / (v m)`` (Narayanan et al. 2021,
    §2.2.1 and §2.2.2; ``v = 1`` but for the interleaved schedule)."""
    m = jnp.asarray(microbatches, jnp.float32)
    return step_slots(schedule, stages, microbatches, v) / m - 1.0


def in_flight_microbatches(schedule, stages, microbatches, v=1.0, stage=0.0):
    """How many micro-batches' activations (of all the stage's layers) stage
    ``stage`` (0-based) holds at its peak (module docstring): ``m`` (GPipe),
    ``min(S - i, m)`` (1F1B), ``min((2 (S - 1 - i) + (v - 1) S + 1) / v, m)``
    (interleaved)."""
    S = jnp.asarray(stages, jnp.float32)
    m = jnp.asarray(microbatches, jnp.float32)
    i = jnp.asarray(stage, jnp.float32)
    schedule = jnp.asarray(schedule)
    vv = _chunks(schedule, v)
    one_f_one_b = S - i
    interleaved = (2.0 * (S - 1.0 - i) + (vv - 1.0) * S + 1.0) / vv
    held = jnp.where(schedule == Schedule.GPIPE, m, jnp.where(vv > 1.0, interleaved, one_f_one_b))
    return jnp.minimum(held, m)
