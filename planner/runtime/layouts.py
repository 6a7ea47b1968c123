"""What the export pins and where it runs a layer's collectives itself,
read off a layer graph and a plan's strategies (plain data, host-side): the
layouts :func:`planner.runtime.export.shard_training` pins module inputs,
module outputs and residual blocks to, the ``channel`` layers whose partial
sums it reduce-scatters and the ZeRO layers whose gradients it
reduce-scatters. ``planner.shard`` and ``validate`` both read them here, so
the program compiled and the collectives expected follow one rule."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from planner.plans.specs import (
    CHANNELWISE_LAYOUTS,
    PARAM_LAYOUTS,
    check_strategy,
    head_projection,
)
from planner.runtime.calls import LOCAL_GRADIENT_STRATEGIES, SCATTER_DIMS

__all__ = [
    "block_layouts",
    "consumer_layouts",
    "local_gradient_layers",
    "pinned_outputs",
    "producer_layouts",
    "scatter_layouts",
]


def producer_layouts(graph: Any, strategies: Mapping[str, str]) -> dict[str, str]:
    """For each layer of ``graph`` (a :class:`~planner.LayerGraph`) fed by
    another, the layout its first producer leaves its output in under
    ``strategies``: what :func:`shard_training` pins module inputs to, so that
    the functional layers between modules (ReLU, pooling, flatten, which no
    module call constrains) keep their planned layouts and XLA converts where
    the cost model does."""
    out: dict[str, str] = {}
    for u, v in graph.edges:
        name = graph.names[v]
        if name not in out:
            out[name] = _output_layout(graph, strategies, u)
    return out


def _io_layouts(graph: Any, strategies: Mapping[str, str], i: int) -> tuple[str, str]:
    """(input, output) layouts of layer ``i`` under ``strategies`` (``replicated`` if unnamed)."""
    param = graph.kind_names[i] in ("dense", "embed") or graph.kind_names[i].startswith("conv")
    table = PARAM_LAYOUTS if param else CHANNELWISE_LAYOUTS
    return table[check_strategy(strategies.get(graph.names[i], "replicated"))]


def _output_layout(graph: Any, strategies: Mapping[str, str], u: int) -> str:
    """The layout layer ``u`` leaves its output in under ``strategies``."""
    return _io_layouts(graph, strategies, u)[1]


def block_layouts(graph: Any, strategies: Mapping[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """For each block of ``graph`` (a module path above layers that is not a
    layer itself, such as a residual block ``layer2/1``): the ``(input,
    output)`` layouts :func:`shard_training` pins the block's input and output
    to, each ``None`` where the layers concerned disagree. The input's is the
    layout every layer feeding the block from outside leaves its output in,
    so that every use of the input inside (the first conv and the shortcut's
    add) reads that one value; the output's is the layout the block's layers
    that feed outside leave theirs in, so that the functional ops at the
    block's end (the add, its ReLU) run in their planned layout. Unpinned,
    XLA may feed the add from the first conv's converted copy and convert it
    back, or convert the add's other operand and then its output: all-to-alls
    the plan does not have (measured on the ResNet, docs/validation.md)."""
    layers = set(graph.names)
    entering: dict[str, set[str]] = {}
    leaving: dict[str, set[str]] = {}
    for u, v in graph.edges:
        src, dst = graph.names[u].split("/"), graph.names[v].split("/")
        layout = _output_layout(graph, strategies, u)
        for k in range(1, max(len(src), len(dst))):
            if src[:k] == dst[:k]:
                continue  # the edge runs inside this block
            if k < len(dst) and "/".join(dst[:k]) not in layers:
                entering.setdefault("/".join(dst[:k]), set()).add(layout)
            if k < len(src) and "/".join(src[:k]) not in layers:
                leaving.setdefault("/".join(src[:k]), set()).add(layout)

    def agreed(found: set[str] | None) -> str | None:
        return next(iter(found)) if found is not None and len(found) == 1 else None

    return {b: (agreed(entering.get(b)), agreed(leaving.get(b))) for b in sorted(set(entering) | set(leaving))}


def consumer_layouts(graph: Any, strategies: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """For each layer of ``graph`` that feeds others: consumer name -> the
    layout that consumer takes its input in under ``strategies``. Where a
    module's consumers are all functional ops (no module call of their own)
    and agree, :func:`shard_training` pins the module's output to that
    layout, so that the conversion the cost model puts on the edge happens
    there and the functional ops run in their planned layout."""
    return {graph.names[u]: {graph.names[v]: layout for v, layout in readers.items()}
            for u, readers in _reader_layouts(graph, strategies).items()}


def _reader_layouts(graph: Any, strategies: Mapping[str, str]) -> dict[int, dict[int, str]]:
    """For each layer of ``graph`` that feeds others: reader index -> the
    layout that reader takes its input in under ``strategies``."""
    out: dict[int, dict[int, str]] = {}
    for u, v in graph.edges:
        out.setdefault(u, {})[v] = _io_layouts(graph, strategies, v)[0]
    return out


def pinned_outputs(graph: Any, strategies: Mapping[str, str], modules: Collection[str]) -> frozenset[int]:
    """The layers of ``graph`` that are module calls (their names in
    ``modules``) whose consumers are all functional ops taking their output
    in one layout: :func:`shard_training` pins such an output to that layout
    (:func:`consumer_layouts`), so that it is converted once for all of them
    and the sum of their input gradients once back."""
    return frozenset(u for u, readers in _reader_layouts(graph, strategies).items()
                     if graph.names[u] in modules and len(set(readers.values())) == 1
                     and not any(graph.names[v] in modules for v in readers))


def scatter_layouts(graph: Any, strategies: Mapping[str, str], m: int,
                    zero_stages: Mapping[str, int] | None = None) -> dict[str, str]:
    """For each ``channel`` conv or dense layer of ``graph`` whose consumers
    all take its output in one split layout (``batch``, ``channel`` or
    ``spatial``) on a model axis of ``m`` devices: that layout, into which
    :func:`~planner.runtime.export.shard_training` (``scatters``) reduce-scatters the layer's partial
    sums, the reduce-scatter the cost model puts on those edges. Left out
    (converted by XLA's partitioner as before): a model output, consumers in
    different layouts or replicated ones (an all-reduce), a multi-head
    attention's projections, splits ``m`` does not divide (channels or
    rows; XLA pads those), and layers at ZeRO stage 3 in ``zero_stages``
    (their weights are gathered and gathered again by the ZeRO call)."""
    if m <= 1:
        return {}
    a = graph.unpadded()
    out: dict[str, str] = {}
    for u, readers in _reader_layouts(graph, strategies).items():
        layouts = set(readers.values())
        name, kind = graph.names[u], graph.kind_names[u]
        if strategies.get(name) != "channel" or not (kind == "dense" or kind.startswith("conv")):
            continue
        if zero_stages is not None and zero_stages.get(name, 0) >= 3:
            continue
        if head_projection(name, strategies) is not None or len(layouts) != 1:
            continue
        layout = next(iter(layouts))
        if layout not in SCATTER_DIMS:
            continue
        if layout == "channel" and int(a.out_channels[u]) % m:
            continue
        if layout == "spatial" and int(a.out_spatial[u, 0]) % m:
            continue
        out[name] = layout
    return out


def local_gradient_layers(graph: Any, strategies: Mapping[str, str], zero_stages: Mapping[str, int]) -> frozenset[str]:
    """The layers of ``graph`` whose weight gradients ``shard_training``
    reduce-scatters itself (``psum_scatter`` in ``jax.shard_map``, a
    reduce-scatter on every platform): convs and dense layers (``nnx.Conv``,
    ``nnx.Linear``) at ZeRO stage 2 or 3 under ``data``, ``filter`` or
    ``replicated``. The other ZeRO layers' gradients are reduce-scattered by
    XLA's partitioner (on CPU an all-reduce and a slice)."""
    return frozenset(
        n for n, k in zip(graph.names, graph.kind_names, strict=True)
        if zero_stages.get(n, 0) >= 2 and (k == "dense" or k.startswith("conv"))
        and strategies.get(n) in LOCAL_GRADIENT_STRATEGIES
    )
