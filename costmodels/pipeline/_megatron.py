"""Megatron-LM's tensor-parallel layout of a transformer as per-layer
strategies (host-side, NumPy): what :func:`costmodels.pipeline.segment_costs`
costs a block under.

Shoeybi et al. 2019 (§3): the first projection of the attention (QKV) and
of the MLP (fc1, or gate and up) splits its outputs (``filter``, column
parallel), what follows it splits the same features (the attention by heads,
the GELU) and the second projection (out, fc2) splits its inputs
(``channel``, row parallel); the output layer splits the vocabulary
(``filter``). The norms, adds and the embedding path are replicated, or,
under sequence parallelism (Korthikanti et al. 2022, §4.2.2), split along
the tokens (``spatial``).
"""

from __future__ import annotations

import numpy as np

from costmodels.layers import ATTENTION_KINDS, LayerKind, LayerTable
from costmodels.strategies import Strategy

__all__ = ["megatron_options"]

_FEATURE_KINDS = (*ATTENTION_KINDS, LayerKind.ELEMENTWISE, LayerKind.MULTIPLY)


def megatron_options(table: LayerTable, sequence_parallel: bool = False) -> np.ndarray:
    """Strategy codes ``[L]`` (the table's padded rows: ``replicated``) of
    Megatron-LM's layout of ``table``'s layers (module docstring), in layer
    order (a topological one)."""
    a = table.arrays
    kind = np.asarray(a.kind)
    real = np.asarray(a.mask) > 0
    src, dst = np.asarray(a.edge_src).astype(np.int64), np.asarray(a.edge_dst).astype(np.int64)
    emask = np.asarray(a.edge_mask) > 0
    src, dst = src[emask], dst[emask]
    consumers = np.zeros(len(kind), bool)
    consumers[src] = True
    residual = Strategy.SPATIAL if sequence_parallel else Strategy.REPLICATED
    out = np.full(len(kind), int(Strategy.REPLICATED), np.int32)
    for layer in np.flatnonzero(real):
        producers = src[dst == layer]
        split_inputs = producers.size > 0 and np.all(np.isin(out[producers], (Strategy.FILTER,)))
        k = kind[layer]
        if k == LayerKind.DENSE:
            row_parallel = split_inputs and consumers[layer]
            out[layer] = Strategy.CHANNEL if row_parallel else Strategy.FILTER
        elif k in _FEATURE_KINDS and split_inputs:
            out[layer] = Strategy.FILTER
        elif k == LayerKind.EMBED:
            out[layer] = Strategy.REPLICATED  # vocabulary-parallel: segment_costs splits its rows
        else:
            out[layer] = residual
    return out
