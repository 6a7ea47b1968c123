"""Activation bytes a transformer keeps for its backward pass, per layer and
per micro-batch on one device, as Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", §4) count them.

``s`` tokens, micro-batch ``b``, width ``h``, ``a`` heads, MLP width ``f``
(``4 h`` in GPT), tensor-parallel size ``t``; activations of ``δ`` bytes
(16-bit: 2) and dropout masks of one byte per element. One pre-norm block
keeps (Korthikanti §4.1):

* attention: its input to the QKV projection ``δ sbh``, the queries and keys
  ``2 δ sbh``, the values ``δ sbh``, the softmax output ``δ a s² b``, its
  dropout mask ``a s² b`` and the dropped probabilities ``δ a s² b``, the
  output projection's input ``δ sbh`` and the dropout mask after it
  ``sbh``;
* MLP: its input ``δ sbh``, the GELU's input ``δ sbf``, the second
  projection's input ``δ sbf`` and the dropout mask ``sbh``;
* the two layer norms' inputs ``2 δ sbh``.

With ``δ = 2`` and ``f = 4 h`` that is ``sbh (34 + 5 a s / h)`` (Korthikanti
Eq. 1). Tensor parallelism splits what lies between the column- and the
row-parallel projections (queries, keys, values, scores, the output
projection's input, the MLP's hidden activations); the norms, the two
projection inputs and the two dropout masks stay whole on every device:
``sbh (10 + 24 / t + 5 a s / (h t))`` (Eq. 2). Sequence parallelism splits
the rest along the tokens: ``sbh / t (34 + 5 a s / h)`` (Eq. 3), each
column-parallel projection keeping its shard of the input and gathering it
again in the backward pass (§4.2.2). Selective recomputation recomputes the
attention's softmax, dropout and score products and keeps none of the
``5 a s² b`` terms (§5, Table 2); full recomputation keeps only each
block's input, ``2 sbh`` (``2 sbh / t`` under sequence parallelism, which
keeps the input's shard; Table 2).

Outside the blocks (§4.3): the embedding's dropout mask ``sbh`` (``/ t``
under sequence parallelism) on the first stage; on the last, the final
norm's and the output projection's inputs ``2 δ sbh`` (``/ t`` under
sequence parallelism) and the logits the cross entropy keeps in fp32,
``4 s b V / t`` with the output layer split along the vocabulary.
Without dropout the masks and the dropped probabilities are not kept.

All functions are jnp over float arrays and broadcast (vmappable).
"""

from __future__ import annotations

import enum

import jax.numpy as jnp

__all__ = [
    "RECOMPUTE_NAMES",
    "Recompute",
    "first_stage_activation_bytes",
    "last_stage_activation_bytes",
    "layer_activation_bytes",
    "parse_recompute",
]


class Recompute(enum.IntEnum):
    NONE = 0
    SELECTIVE = 1  # the attention's softmax, dropout and score products (Korthikanti §5)
    FULL = 2  # the whole block from its input (Chen et al. 2016; Korthikanti Table 2)


RECOMPUTE_NAMES = ("none", "selective", "full")
MASK_BYTES = 1.0  # a dropout mask: one byte per element (Korthikanti §4.1)


def parse_recompute(name: str | int | Recompute | None) -> Recompute:
    """A recomputation by name (``none``, ``selective``, ``full``; ``None`` is
    ``none``) or code."""
    if name is None:
        return Recompute.NONE
    if isinstance(name, str):
        key = name.strip().lower()
        if key not in RECOMPUTE_NAMES:
            raise ValueError(f"unknown recomputation {name!r}; choose from {', '.join(RECOMPUTE_NAMES)}")
        return Recompute(RECOMPUTE_NAMES.index(key))
    return Recompute(int(name))


def layer_activation_bytes(seq, micro_batch, hidden, heads, ffn, tensor, sequence_parallel, recompute,
                           element_bytes=2.0, dropout=True):
    """Bytes one transformer block keeps per micro-batch on one device
    (module docstring; Korthikanti et al. 2022, Eqs. 1-3 and Table 2).
    ``sequence_parallel`` is 0/1, ``recompute`` a :class:`Recompute` code."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    s, b, h, a, f, t = (f32(x) for x in (seq, micro_batch, hidden, heads, ffn, tensor))
    sp = f32(sequence_parallel) > 0
    recompute = jnp.asarray(recompute)
    delta, mask = f32(element_bytes), jnp.where(jnp.asarray(dropout), MASK_BYTES, 0.0)
    keep_dropped = jnp.where(jnp.asarray(dropout), 1.0, 0.0)
    sbh = s * b * h
    # kept whole under tensor parallelism: the two norms' inputs, the QKV and fc1 inputs, two masks
    whole = sbh * (4.0 * delta + 2.0 * mask)
    # split by tensor parallelism: queries, keys, values, the output projection's input, fc1's and fc2's inputs
    split = sbh * 4.0 * delta + 2.0 * s * b * f * delta
    scores = a * s * s * b * (delta * (1.0 + keep_dropped) + mask)  # softmax output, its mask, the dropped output
    scores = jnp.where(recompute == Recompute.SELECTIVE, 0.0, scores)
    kept = jnp.where(sp, (whole + split + scores) / t, whole + (split + scores) / t)
    checkpoint = delta * sbh / jnp.where(sp, t, 1.0)  # the block's input (Korthikanti Table 2: 2 sbh)
    return jnp.where(recompute == Recompute.FULL, checkpoint, kept)


def first_stage_activation_bytes(seq, micro_batch, hidden, tensor, sequence_parallel, dropout=True):
    """The embedding's dropout mask per micro-batch on one device,
    ``sbh`` (``/ t`` under sequence parallelism; Korthikanti §4.3)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    sbh = f32(seq) * f32(micro_batch) * f32(hidden)
    mask = jnp.where(jnp.asarray(dropout), MASK_BYTES, 0.0)
    return mask * sbh / jnp.where(f32(sequence_parallel) > 0, f32(tensor), 1.0)


def last_stage_activation_bytes(seq, micro_batch, hidden, vocab, tensor, sequence_parallel, element_bytes=2.0):
    """The final norm's and the output projection's inputs, ``2 δ sbh``
    (``/ t`` under sequence parallelism), and the fp32 logits of the
    vocabulary-parallel cross entropy, ``4 s b V / t`` (Korthikanti §4.3),
    per micro-batch on one device."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    s, b, h, t = f32(seq), f32(micro_batch), f32(hidden), f32(tensor)
    inputs = 2.0 * f32(element_bytes) * s * b * h / jnp.where(f32(sequence_parallel) > 0, t, 1.0)
    return inputs + 4.0 * s * b * f32(vocab) / t
