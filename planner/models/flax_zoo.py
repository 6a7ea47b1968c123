"""The built-in zoo (:mod:`planner.models.zoo`) as ``flax.nnx`` modules.

Each model here executes exactly the layers of its :class:`LayerGraph` twin
(``planner.models.zoo.get_model(name)``), in the same order and with identical
padding, so that

* XLA can count its FLOPs (``jax.jit(...).lower(...).compile().cost_analysis()``)
  to validate the graph's analytic counts (:mod:`planner.ir.flops`);
* the Flax extractor (:mod:`planner.models.extraction`) can be checked to reproduce the
  zoo graph exactly: module paths are the graph's layer names
  (``features/0``, ``layer1/0/conv1``), functional ops run in the ``__call__``
  whose scope the graph's auto-names use (ReLU / pooling / flatten at the root
  of VGG, AlexNet and CosmoFlow; ReLU and the residual add inside a
  ``Bottleneck``);
* later stages can train them sharded.

Layout is NHWC / NDHWC (batch first, channels last), float32. Architectures
follow torchvision (AlexNet single tower, VGG16 ``cfgs["D"]``, ResNet v1.5
``Bottleneck``) and ParaDL's CosmoFlow ``.net`` files (ParaDL §5); see
:mod:`planner.models.zoo` for the model table. torchvision paddings that differ from
Flax's "SAME" are given as explicit ``(lo, hi)`` pairs.

**No dropout** anywhere (as in :mod:`planner.models.zoo`). BatchNorm is
``nnx.BatchNorm`` with ``use_running_average=False`` (training mode, batch
statistics), affine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from planner.models.flax_transformers import transformer
from planner.models.zoo import (  # the one CosmoFlow table (re-exported)
    COSMOFLOW_CONVS,
    TRANSFORMERS,
)

__all__ = [
    "VGG",
    "AlexNet",
    "Bottleneck",
    "ResNet",
    "CosmoFlow",
    "flax_model",
    "VGG16_CFG",
    "VGG16_3POOL_CFG",
    "COSMOFLOW_CONVS",
]

Padding = str | Sequence[tuple[int, int]]

_PAD1 = ((1, 1), (1, 1))

# torchvision ``vgg.cfgs["D"]``; "M" = 2x2 stride-2 max pool.
VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)
# SplitBrain §1.4 "3 pools, 4x4x512": VGG16 without its last two pools.
VGG16_3POOL_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, 512, 512, 512,
)


def _out_size(n: int, k: int, s: int, padding: Padding) -> int:
    """Output length of a window op along one dim, with Flax's padding rules."""
    if isinstance(padding, str):
        if padding.upper() == "SAME":
            return -(-n // s)
        if padding.upper() == "VALID":
            return (n - k) // s + 1
        raise ValueError(f"padding must be 'SAME', 'VALID' or (lo, hi) pairs, got {padding!r}")
    lo, hi = padding[0]
    return (n + lo + hi - k) // s + 1


class VGG(nnx.Module):
    """torchvision VGG: ``features`` = 3x3 pad-1 convs with bias (ReLU after
    each, 2x2/2 max pool at each "M" of ``cfg``); flatten; ``classifier`` =
    Linear layers of widths ``classifier`` with ReLU between them."""

    def __init__(
        self,
        cfg: Sequence[int | str] = VGG16_CFG,
        classifier: Sequence[int] = (4096, 4096, 1000),
        *,
        image_size: int = 224,
        in_channels: int = 3,
        rngs: nnx.Rngs,
    ) -> None:
        self.cfg = tuple(cfg)
        convs, c, size = [], in_channels, image_size
        for v in self.cfg:
            if v == "M":
                size = _out_size(size, 2, 2, "VALID")
            else:
                convs.append(nnx.Conv(c, int(v), (3, 3), padding=_PAD1, rngs=rngs))
                c = int(v)
        self.features = nnx.List(convs)
        widths = (c * size * size, *classifier)
        self.classifier = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:], strict=True)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        i = 0
        for v in self.cfg:
            if v == "M":
                x = nnx.max_pool(x, (2, 2), strides=(2, 2))
            else:
                x = jax.nn.relu(self.features[i](x))
                i += 1
        return _classify(self.classifier, x.reshape(x.shape[0], -1))


def _classify(classifier: nnx.List, x: jax.Array) -> jax.Array:
    """The fully-connected head: each Linear followed by a ReLU but the last."""
    for j, fc in enumerate(classifier):
        x = fc(x)
        if j < len(classifier) - 1:
            x = jax.nn.relu(x)
    return x


class AlexNet(nnx.Module):
    """torchvision ``AlexNet`` (single tower) for 224x224 inputs, without
    dropout and without the adaptive average pool (an identity at 224)."""

    # (features, kernel, stride, padding) of torchvision alexnet.features
    CONVS = ((64, 11, 4, 2), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1))
    POOL_AFTER = (0, 1, 4)

    def __init__(self, num_classes: int = 1000, *, in_channels: int = 3, rngs: nnx.Rngs) -> None:
        convs, c = [], in_channels
        for f, k, s, p in self.CONVS:
            convs.append(nnx.Conv(c, f, (k, k), (s, s), padding=((p, p), (p, p)), rngs=rngs))
            c = f
        self.features = nnx.List(convs)
        widths = (c * 6 * 6, 4096, 4096, num_classes)
        self.classifier = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:], strict=True)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, conv in enumerate(self.features):
            x = jax.nn.relu(conv(x))
            if i in self.POOL_AFTER:
                x = nnx.max_pool(x, (3, 3), strides=(2, 2))
        return _classify(self.classifier, x.reshape(x.shape[0], -1))


class Bottleneck(nnx.Module):
    """torchvision ``Bottleneck`` (ResNet v1.5: the stride is on ``conv2``).
    Convs have no bias; the first block of a stage has a projection shortcut
    ``downsample_conv`` (1x1, stride) + ``downsample_bn``."""

    expansion = 4

    def __init__(self, in_features: int, width: int, stride: int = 1, *, downsample: bool, rngs: nnx.Rngs) -> None:
        out = width * self.expansion

        def bn(c: int) -> nnx.BatchNorm:
            return nnx.BatchNorm(c, use_running_average=False, rngs=rngs)

        self.conv1 = nnx.Conv(in_features, width, (1, 1), padding="VALID", use_bias=False, rngs=rngs)
        self.bn1 = bn(width)
        self.conv2 = nnx.Conv(width, width, (3, 3), (stride, stride), padding=_PAD1, use_bias=False, rngs=rngs)
        self.bn2 = bn(width)
        self.conv3 = nnx.Conv(width, out, (1, 1), padding="VALID", use_bias=False, rngs=rngs)
        self.bn3 = bn(out)
        if downsample:
            self.downsample_conv = nnx.Conv(
                in_features, out, (1, 1), (stride, stride), padding="VALID", use_bias=False, rngs=rngs
            )
            self.downsample_bn = bn(out)
        else:
            self.downsample_conv = None
            self.downsample_bn = None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = jax.nn.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        shortcut = x
        if self.downsample_conv is not None:
            shortcut = self.downsample_bn(self.downsample_conv(x))
        return jax.nn.relu(h + shortcut)


class ResNet(nnx.Module):
    """torchvision ``ResNet`` with ``Bottleneck`` blocks: stem ``conv1``
    (7x7/2 pad 3) + ``bn1`` + ReLU + 3x3/2 pad-1 max pool; stages
    ``layer1``..``layer4`` (widths 64..512, stride 2 from stage 2);
    global average pool; ``fc``."""

    def __init__(
        self, depths: Sequence[int] = (3, 4, 6, 3), num_classes: int = 1000, *, in_channels: int = 3, rngs: nnx.Rngs
    ) -> None:
        if len(depths) != 4 or any(d < 1 for d in depths):
            raise ValueError(f"depths must be 4 positive block counts, got {tuple(depths)}")
        self.conv1 = nnx.Conv(in_channels, 64, (7, 7), (2, 2), padding=((3, 3), (3, 3)), use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(64, use_running_average=False, rngs=rngs)
        c = 64
        stages = []
        for stage, (depth, width) in enumerate(zip(depths, (64, 128, 256, 512), strict=True)):
            blocks = []
            for k in range(depth):
                stride = 2 if stage > 0 and k == 0 else 1
                blocks.append(Bottleneck(c, width, stride, downsample=k == 0, rngs=rngs))
                c = width * Bottleneck.expansion
            stages.append(nnx.List(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nnx.Linear(c, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=_PAD1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                x = block(x)
        x = x.mean(axis=(1, 2))
        return self.fc(x)


class CosmoFlow(nnx.Module):
    """The 3-D CosmoFlow CNN of ParaDL (ParaDL §5): ``convs`` = conv3d with
    bias, each followed by ReLU and, except the last, a 2x2x2 average pool;
    flatten; ``fcs`` = Linear layers with ReLU between them."""

    def __init__(
        self,
        convs: Sequence[tuple[int, int, int, str]] = COSMOFLOW_CONVS[256],
        fcs: Sequence[int] = (2048, 256, 4),
        *,
        image_size: int = 256,
        in_channels: int = 4,
        rngs: nnx.Rngs,
    ) -> None:
        layers, c, size = [], in_channels, image_size
        for i, (f, k, s, p) in enumerate(convs):
            layers.append(nnx.Conv(c, f, (k, k, k), (s, s, s), padding=p, rngs=rngs))
            c, size = f, _out_size(size, k, s, p)
            if i < len(convs) - 1:
                size = _out_size(size, 2, 2, "VALID")
            if size < 1:
                raise ValueError(f"CosmoFlow: input size {image_size} is too small for conv {i}")
        self.convs = nnx.List(layers)
        widths = (c * size**3, *fcs)
        self.fcs = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:], strict=True)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, conv in enumerate(self.convs):
            x = jax.nn.relu(conv(x))
            if i < len(self.convs) - 1:
                x = nnx.avg_pool(x, (2, 2, 2), strides=(2, 2, 2))
        return _classify(self.fcs, x.reshape(x.shape[0], -1))


# name -> (constructor taking rngs, per-sample input shape channels last)
_MODELS: dict[str, tuple[Callable[[nnx.Rngs], nnx.Module], tuple[int, ...]]] = {
    "alexnet": (lambda rngs: AlexNet(1000, rngs=rngs), (224, 224, 3)),
    "vgg16": (lambda rngs: VGG(VGG16_CFG, (4096, 4096, 1000), image_size=224, rngs=rngs), (224, 224, 3)),
    "vgg16-cifar10": (lambda rngs: VGG(VGG16_CFG, (10,), image_size=32, rngs=rngs), (32, 32, 3)),
    "vgg16-cifar10-splitbrain": (
        lambda rngs: VGG(VGG16_3POOL_CFG, (4096, 4096, 10), image_size=32, rngs=rngs),
        (32, 32, 3),
    ),
    "resnet50": (lambda rngs: ResNet((3, 4, 6, 3), 1000, rngs=rngs), (224, 224, 3)),
    "resnet152": (lambda rngs: ResNet((3, 8, 36, 3), 1000, rngs=rngs), (224, 224, 3)),
    "cosmoflow-256": (
        lambda rngs: CosmoFlow(COSMOFLOW_CONVS[256], image_size=256, rngs=rngs),
        (256, 256, 256, 4),
    ),
    "cosmoflow-512": (
        lambda rngs: CosmoFlow(COSMOFLOW_CONVS[512], image_size=512, rngs=rngs),
        (512, 512, 512, 4),
    ),
}


for _name, _cfg in TRANSFORMERS.items():  # planner.models.flax_transformers
    _MODELS[_name] = (lambda rngs, n=_name: transformer(n, rngs),
                      (_cfg.image, _cfg.image, 3) if _cfg.image else (_cfg.tokens,))


def flax_model(name: str, *, batch: int = 2, abstract: bool = True) -> tuple[nnx.Module, jax.ShapeDtypeStruct]:
    """The zoo model ``name`` as an nnx module, plus an example input spec
    ``(batch, *spatial, channels)`` float32.

    With ``abstract=True`` (default) the module is built under
    ``nnx.eval_shape``: its parameters are ``ShapeDtypeStruct`` s and no
    weights are materialised (fast; enough for shapes, FLOPs and planning).
    With ``abstract=False`` the weights are initialised from ``nnx.Rngs(0)``.
    A language model's input is ``(batch, tokens)`` int32 token ids.
    """
    if not isinstance(name, str) or name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; built-in models: {', '.join(_MODELS)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    ctor, shape = _MODELS[name]
    if abstract:
        model = nnx.eval_shape(lambda: ctor(nnx.Rngs(0)))
    else:
        model = ctor(nnx.Rngs(0))
    ids = name in TRANSFORMERS and not TRANSFORMERS[name].image  # a language model reads token ids
    return model, jax.ShapeDtypeStruct((batch, *shape), jnp.int32 if ids else jnp.float32)
