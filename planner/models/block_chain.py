"""A decoder as a chain of identical blocks, for the pipelined cost
(:func:`costmodels.chain_cost`) and its search (:func:`search.search_pipeline`):
the layer graph of one block with the layers only the first stage runs (the
embeddings) and those only the last runs (the final norm, the output layer),
each layer's segment id, and the chain's sizes.

The output layer is built untied, so that it can split the vocabulary over
the tensor group as Megatron-LM's does (Shoeybi et al. 2019, §3); a tied
table's single copy (one stage) or its copy on the last stage (several) is
the chain's to count (``TransformerChain.tied``). The vocabulary is padded
to a multiple of ``vocab_multiple`` so that any tensor size up to a node's
splits it (Megatron-LM pads it to a multiple of 128 times the tensor size,
``--make-vocab-size-divisible-by``: 50,257 becomes 51,200 at 8)."""

from __future__ import annotations

import dataclasses

import numpy as np

from costmodels import Segment
from planner.ir.graph import LayerGraph
from planner.models.transformer import TransformerConfig, build_transformer
from search import TransformerChain

__all__ = ["BlockChain", "block_chain"]

_BLOCKS = "blocks/"


@dataclasses.dataclass(frozen=True)
class BlockChain:
    graph: LayerGraph  # one block, the embeddings before it, the final norm and output layer after it
    segment: np.ndarray  # [L] (padded) Segment id of each layer
    chain: TransformerChain


def block_chain(config: TransformerConfig, *, dtype: str = "float16", optimizer: str = "adam",
                dropout: bool = True, name: str = "block", vocab_multiple: int = 1024) -> BlockChain:
    """The :class:`BlockChain` of a decoder ``config`` (module docstring);
    ``dropout``: the blocks drop out (Megatron-LM's GPT), so their masks are
    kept for the backward pass."""
    if config.image:
        raise ValueError("a block chain is built for decoders (tokens and vocab), not ViTs")
    vocab = -(-config.vocab // vocab_multiple) * vocab_multiple
    graph = build_transformer(dataclasses.replace(config, depth=1, tied=False, vocab=vocab), name)
    names = graph.names
    first_block = next(i for i, n in enumerate(names) if n.startswith(_BLOCKS))
    segment = np.full(graph.arrays.kind.shape[0], Segment.BLOCK, np.int32)
    for i, n in enumerate(names):
        if not n.startswith(_BLOCKS):
            segment[i] = Segment.FIRST if i < first_block else Segment.LAST
    chain = TransformerChain(layers=config.depth, seq=config.tokens, hidden=config.width, heads=config.heads,
                             ffn=config.hidden, vocab=vocab, tied=config.tied, dropout=dropout, dtype=dtype,
                             optimizer=optimizer)
    return BlockChain(graph=graph, segment=segment, chain=chain)
