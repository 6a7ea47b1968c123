"""Parametric graphs of the usual families (:mod:`planner.automl.parametric`
turns any template into one): torchvision-style bottleneck ResNets with a
width group per stage, and decoders (:class:`planner.TransformerConfig`)
with a residual-width and an MLP-width group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.automl.parametric import ParametricGraph, parametric_graph
from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerGraph

__all__ = ["resnet_parametric", "resnet_template", "transformer_parametric"]

_PAD1 = ((1, 1), (1, 1))


def resnet_template(depths: Sequence[int] = (3, 4, 6, 3), widths: Sequence[int] = (64, 128, 256, 512), *,
                    resolution: int = 224, num_classes: int = 1000, stem: int = 64, name: str | None = None
                    ) -> LayerGraph:
    """A torchvision-style bottleneck ResNet (the zoo's ``resnet50`` at the
    defaults, layer for layer) with any stage depths, stage widths,
    resolution and class count, built with :class:`GraphBuilder`."""
    from planner.models.zoo import _bottleneck

    if len(depths) != len(widths) or not depths:
        raise ValueError(f"give one width per stage: {len(depths)} depths, {len(widths)} widths")
    if min(depths) < 1 or min(widths) < 1 or resolution < 1 or num_classes < 1 or stem < 1:
        raise ValueError("depths, widths, resolution, num_classes and stem must be positive")
    b = GraphBuilder(name or f"resnet{'-'.join(str(d) for d in depths)}", (3, int(resolution), int(resolution)))
    x = b.conv("conv1", b.input, int(stem), 7, stride=2, padding=((3, 3), (3, 3)), bias=False)
    x = b.batch_norm("bn1", x)
    x = b.relu(b.auto_name("", "relu"), x)
    x = b.max_pool(b.auto_name("", "max_pool"), x, 3, stride=2, padding=_PAD1)
    for stage, (depth, width) in enumerate(zip(depths, widths, strict=True)):
        for k in range(depth):
            stride = 2 if stage > 0 and k == 0 else 1
            x = _bottleneck(b, f"layer{stage + 1}/{k}", x, int(width), stride, downsample=k == 0)
    x = b.global_avg_pool(b.auto_name("", "global_avg_pool"), x)
    x = b.dense("fc", x, int(num_classes))
    return b.build()


def resnet_parametric(depths: Sequence[int] = (3, 4, 6, 3), widths: Sequence[int] = (64, 128, 256, 512), *,
                      resolution: int = 224, num_classes: int = 1000, channel_multiple: int = 8) -> ParametricGraph:
    """:func:`resnet_template` with one width group per stage (``layer1`` ..
    ``layerN``); the stem and the classifier keep their widths."""
    t = resnet_template(depths, widths, resolution=resolution, num_classes=num_classes)
    return parametric_graph(t, {f"layer{i + 1}/": i for i in range(len(depths))}, channel_multiple=channel_multiple)


def transformer_parametric(config: Any, *, channel_multiple: int = 64) -> ParametricGraph:
    """A transformer (:class:`planner.TransformerConfig`'s graph) with two
    width groups: 0, the residual width (the token embedding, the fused
    query-key-value and output projections, the MLP's last layer; the heads
    keep their number, so the head dim scales), and 1, the MLP's hidden
    width; ``resolution`` scales the sequence (the learned positions with
    it). The output layer keeps the vocabulary. ``rounded=True`` rounds each
    width to multiples of ``channel_multiple``."""
    from planner.models.transformer import TransformerConfig, build_transformer

    if not isinstance(config, TransformerConfig):
        raise ValueError(f"config must be a planner.TransformerConfig, got {type(config).__name__}")  # noqa: TRY004
    if config.image:
        raise ValueError("transformer_parametric takes decoders; a ViT's patches to tokens have no width rule yet")

    def group(name: str) -> int | None:
        tail = name.rpartition("/")[2]
        if tail in ("fc1", "gate", "up"):
            return 1
        return 0 if name == "embed" or tail in ("qkv", "out", "fc2", "down") else None

    return parametric_graph(build_transformer(config, "transformer"), group, channel_multiple=channel_multiple)
