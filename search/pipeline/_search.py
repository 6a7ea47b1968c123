"""The fastest pipelined configuration of a chain of identical transformer
blocks that fits the memory: every configuration of a
:class:`~search.pipeline.PipelineSpace` costed at once.

1. one micro-batch's segment costs (:func:`costmodels.segment_costs`) for
   every (tensor size, micro-batch size, sequence parallelism) the
   candidates use, in one vmapped call over Megatron-LM's layout
   (:func:`costmodels.megatron_options`);
2. every candidate's step time and memory (:func:`costmodels.chain_cost`),
   vmapped over the candidates;
3. the fastest candidate under the memory limit.

Candidate and grid counts are padded to buckets (:func:`costmodels.bucket_size`)
and so is the stage count, so searches of models in the same buckets reuse
one compilation.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import (
    RECOMPUTE_NAMES,
    SCHEDULE_NAMES,
    ChainConfig,
    ChainShape,
    CostSettings,
    Hardware,
    LayerTable,
    StateBytes,
    bucket_size,
    chain_cost,
    hardware_arrays,
    megatron_options,
    segment_costs,
    state_bytes,
)
from search.pipeline._space import Candidates, PipelineSpace, candidates

__all__ = ["PipelinePlan", "PipelineSearch", "TransformerChain", "evaluate_candidates", "search_pipeline"]


@dataclasses.dataclass(frozen=True)
class TransformerChain:
    """A transformer as a chain of identical blocks, in numbers."""

    layers: int  # blocks
    seq: int  # tokens per sample
    hidden: int
    heads: int
    ffn: int  # MLP width
    vocab: int
    tied: bool = True  # the output layer is the embedding's table
    dropout: bool = True  # the blocks keep dropout masks
    dtype: str = "float16"  # compute and activation dtype
    optimizer: str = "adam"

    def shape(self) -> ChainShape:
        f = lambda x: jnp.asarray(float(x), jnp.float32)  # noqa: E731
        element = 4.0 if self.dtype == "float32" else 2.0
        return ChainShape(f(self.layers), f(self.seq), f(self.hidden), f(self.heads), f(self.ffn), f(self.vocab),
                          f(self.tied), f(self.dropout), f(element))


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """One configuration and its predicted cost."""

    tensor: int
    stages: int
    data: int
    micro_batch: int
    microbatches: int
    chunks: int  # interleave v
    schedule: str  # gpipe | 1f1b | interleaved
    recompute: str  # none | selective | full
    sequence_parallel: bool
    distributed_optimizer: bool
    step_s: float
    pipeline_s: float
    bubble_s: float
    transfer_s: float
    gradient_sync_s: float
    optimizer_s: float
    state_bytes: float  # at the stage of the peak: weights, gradients, optimizer state per device
    activation_bytes: float  # ... its activations per device
    peak_bytes: float
    fits: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PipelineSearch:
    best: PipelinePlan | None  # the fastest that fits; None: none fits
    smallest: PipelinePlan  # the one needing the least memory (of those whose layout runs)
    candidates: int
    fitting: int


@functools.partial(jax.jit, static_argnames=("settings", "vocab_parallel", "dropout"))
def _grid_costs(arrays, hw, micro_batch, tensor, options, segment, settings: CostSettings, vocab_parallel: bool,
                dropout: bool):
    """Segment costs ``[G, K]`` for every grid row (vmapped)."""
    one = lambda b, t, o: segment_costs(arrays, hw, b, t, o, segment, settings, vocab_parallel, dropout)  # noqa: E731
    return jax.vmap(one)(micro_batch, tensor, options)


@functools.partial(jax.jit, static_argnames=("state", "max_stages"))
def _chain_costs(shape, grid, index, configs, hw, state: StateBytes, max_stages: int):
    """Every candidate's :class:`costmodels.ChainCost` (vmapped)."""
    def one(i, cfg):
        seg = jax.tree.map(lambda x: x[i], grid)
        return chain_cost(shape, seg, cfg, hw, state, max_stages)
    return jax.vmap(one)(index, configs)


def _pad(x: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([x, np.repeat(x[:1], n - len(x), axis=0)]) if n > len(x) else x


def evaluate_candidates(table: LayerTable, segment, chain: TransformerChain, hardware: Hardware,
                        cands: Candidates):
    """The :class:`costmodels.ChainCost` of every candidate ``[C]`` (as NumPy
    arrays), on ``table``, one block's layer graph with the first and last
    stage's layers, ``segment`` [L] their segment ids."""
    hw = hardware_arrays(hardware, chain.dtype)
    settings = CostSettings(dtype=chain.dtype, optimizer=chain.optimizer)
    options = np.stack([megatron_options(table, False), megatron_options(table, True)])  # [2, L]
    G = bucket_size(len(cands.grid))
    t_g, b_g, sp_g = (_pad(np.asarray(c), G) for c in zip(*cands.grid))
    grid = _grid_costs(table.arrays, hw, jnp.asarray(b_g, jnp.float32), jnp.asarray(t_g, jnp.float32),
                       jnp.asarray(options[sp_g.astype(int)]), jnp.asarray(segment, jnp.int32), settings, True,
                       chain.dropout)
    C = bucket_size(len(cands))
    configs = ChainConfig(*(jnp.asarray(_pad(getattr(cands, f), C)) for f in ChainConfig._fields))
    max_stages = bucket_size(int(cands.stages.max()))
    out = _chain_costs(chain.shape(), grid, jnp.asarray(_pad(cands.segment, C)), configs, hw,
                       state_bytes(chain.dtype, chain.optimizer), max_stages)
    return jax.tree.map(lambda x: np.asarray(x)[: len(cands)], out)


def _plan(cands: Candidates, cost, k: int, limit: float) -> PipelinePlan:
    stage = int(np.argmax(cost.state_bytes[k] + cost.activation_bytes[k]))
    s = cost.step
    return PipelinePlan(
        tensor=int(cands.tensor[k]), stages=int(cands.stages[k]), data=int(cands.data[k]),
        micro_batch=int(cands.micro_batch[k]), microbatches=int(cands.microbatches[k]), chunks=int(cands.chunks[k]),
        schedule=SCHEDULE_NAMES[int(cands.schedule[k])], recompute=RECOMPUTE_NAMES[int(cands.recompute[k])],
        sequence_parallel=bool(cands.sequence_parallel[k]), distributed_optimizer=bool(cands.distributed_optimizer[k]),
        step_s=float(s.step_s[k]), pipeline_s=float(s.pipeline_s[k]), bubble_s=float(s.bubble_s[k]),
        transfer_s=float(s.transfer_s[k]), gradient_sync_s=float(s.gradient_sync_s[k]),
        optimizer_s=float(s.optimizer_s[k]), state_bytes=float(cost.state_bytes[k][stage]),
        activation_bytes=float(cost.activation_bytes[k][stage]), peak_bytes=float(cost.peak_bytes[k]),
        fits=bool(cost.peak_bytes[k] <= limit and cost.feasible[k]),
    )


def search_pipeline(table: LayerTable, segment, chain: TransformerChain, hardware: Hardware, devices: int,
                    batch: int, memory_limit_bytes: float | None = None,
                    space: PipelineSpace = PipelineSpace()) -> PipelineSearch:
    """The fastest configuration of ``space`` for ``chain`` on ``devices``
    devices at a global ``batch`` that fits ``memory_limit_bytes`` per device
    (default: the device's memory); ``table`` and ``segment`` as for
    :func:`evaluate_candidates`."""
    limit = hardware.device.memory_bytes if memory_limit_bytes is None else float(memory_limit_bytes)
    cands = candidates(chain.layers, chain.heads, devices, batch, hardware.devices_per_node, space)
    cost = evaluate_candidates(table, segment, chain, hardware, cands)
    if not cost.feasible.any():
        raise ValueError(f"no configuration of {chain} on {devices} devices can run Megatron-LM's layout (a tensor "
                         "size must divide the heads, key-value heads and MLP width, and under sequence "
                         "parallelism leave every device two tokens); allow other tensor sizes")
    fits = (cost.peak_bytes <= limit) & cost.feasible
    step = np.where(fits, cost.step.step_s, np.inf)
    best = _plan(cands, cost, int(np.argmin(step)), limit) if fits.any() else None
    smallest = int(np.argmin(np.where(cost.feasible, cost.peak_bytes, np.inf)))
    return PipelineSearch(best=best, smallest=_plan(cands, cost, smallest, limit), candidates=len(cands),
                          fitting=int(fits.sum()))
