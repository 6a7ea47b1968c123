"""What the pipelined runtime (:mod:`planner.runtime.pipeline`) holds on one
device at its peak: the prediction ``validate`` judges a pipelined plan's
compiled step by, from the plan, the model's layer graph, the shapes and
layouts of the step's parameters and the schedule's buffer tables (nothing
compiled).

The plan's own memory (``Pipeline.peak_bytes``, :func:`costmodels.chain_cost`)
is Megatron-LM's accounting of a stage; the runtime is one SPMD program in
which every device runs every stage's branch, and it differs from that
accounting in these mechanisms, each counted here with the cost model's
formulas:

* **state**: the embedding and the output layer are on every stage (the
  program is the same on all of them), beside the stage's share of the
  blocks; each parameter keeps its weight, gradient accumulator and
  optimizer slots (:func:`costmodels.state_bytes`), and a backward tick
  produces one more gradient of the stage's blocks and of the head before
  adding it to the accumulators (``jax.vjp``'s output);
* **buffers**: one stage input per micro-batch in flight (the schedule's
  activation slots), the cotangent slots, the activation and cotangent
  arriving from the neighbours, and, outside the pipeline, the first part's
  output and its input cotangents for all ``m`` micro-batches of the
  device's rows (:mod:`planner.runtime._pipeline_ticks`);
* **backward working set**: a backward tick recomputes the stage's blocks
  as a whole (``jax.vjp`` of the stage), so it holds all its blocks'
  activations at once, each as Korthikanti et al. 2022 count them without
  recomputation (:func:`costmodels.layer_activation_bytes`); the last stage
  also runs the head there: its inputs and fp32 logits
  (:func:`costmodels.last_stage_activation_bytes`) and the logits' gradient,
  ``4 s b V / t`` more.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from costmodels import (
    LayerKind,
    Recompute,
    last_stage_activation_bytes,
    layer_activation_bytes,
    state_bytes,
)
from planner.ir.graph import LayerGraph
from planner.plans.record import Plan

__all__ = ["DecoderDims", "RuntimeMemory", "decoder_dims", "runtime_memory"]

_ELEMENT_BYTES = 4.0  # the pipelined runtime trains in float32


class DecoderDims(NamedTuple):
    tokens: int  # s
    width: int  # h
    heads: int  # a
    ffn: int  # f: the MLP's hidden width
    vocab: int  # V: the output layer's width


class RuntimeMemory(NamedTuple):
    """Bytes on one device (module docstring)."""

    state_bytes: float  # weights, gradient accumulators, optimizer slots, a backward tick's fresh gradients
    buffer_bytes: float  # stage inputs in flight, cotangent and arrival slots, the first part's m micro-batches
    backward_bytes: float  # the largest backward tick's recomputed stage (and head)

    @property
    def total(self) -> float:
        return self.state_bytes + self.buffer_bytes + self.backward_bytes


def decoder_dims(graph: LayerGraph) -> DecoderDims:
    """A decoder's tokens, width and heads from its first attention layer,
    its MLP width from the widest input of a dense layer after that
    attention, its vocabulary from the output layer (the graph's last dense
    layer). ``ValueError`` for a graph without attention."""
    a = graph.unpadded()
    kind = np.asarray(a.kind).astype(int)
    attention = np.flatnonzero((kind == LayerKind.ATTENTION) | (kind == LayerKind.CAUSAL_ATTENTION))
    dense = np.flatnonzero(kind == LayerKind.DENSE)
    if attention.size == 0 or dense.size == 0:
        raise ValueError(f"{graph.model_name!r} is not a decoder: its layer graph has no attention layer")
    i, out = int(attention[0]), int(dense[-1])
    mlp = [int(a.in_channels[j]) for j in dense if i < j < out]
    return DecoderDims(tokens=int(a.out_spatial[i][0]), width=int(a.out_channels[i]), heads=int(a.groups[i]),
                       ffn=max(mlp, default=int(a.out_channels[i])), vocab=int(a.out_channels[out]))


def runtime_memory(plan: Plan, dims: DecoderDims, param_bytes: dict[str, float], act_slots: int,
                   cot_slots: int) -> RuntimeMemory:
    """What the runtime holds per device for ``plan`` (module docstring).
    ``param_bytes``: the parameters' bytes on one device by part (``first``,
    ``blocks``, ``head``) under the step's layouts; ``act_slots`` and
    ``cot_slots``: the schedule's buffer slots
    (:func:`planner.runtime._pipeline_schedule.executor_tables`)."""
    p = plan.pipeline
    sb = state_bytes("float32", plan.optimizer)
    params = sum(param_bytes.values()) / sb.weight
    fresh = (param_bytes["blocks"] + param_bytes["head"]) / sb.weight * sb.gradient
    state = params * (sb.weight + sb.gradient + sb.optimizer) + fresh
    s, b, h, t = dims.tokens, p.micro_batch, dims.width, p.tensor
    one = s * b * h * _ELEMENT_BYTES  # one micro-batch's stage input on one device
    buffers = (act_slots + cot_slots + 2) * one + 2 * p.microbatches * one
    blocks = max(last - first + 1 for first, last in p.stage_blocks)
    block = float(layer_activation_bytes(s, b, h, dims.heads, dims.ffn, t, 0, Recompute.NONE,
                                         element_bytes=_ELEMENT_BYTES, dropout=False))
    head = float(last_stage_activation_bytes(s, b, h, dims.vocab, t, 0, element_bytes=_ELEMENT_BYTES))
    logits_gradient = 4.0 * s * b * dims.vocab / t
    backward = blocks * block + head + logits_gradient
    return RuntimeMemory(float(state), float(buffers), float(backward))

