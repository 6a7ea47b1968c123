"""Built-in model zoo: the planner's reference CNNs and transformers as :class:`LayerGraph` s.

Every model is built with :class:`~planner.ir.builder.GraphBuilder` (pure
Python, no jax), per sample and channels first. Each has a twin
``flax.nnx`` module in :mod:`planner.models.flax_zoo` that executes exactly the
same layers in the same order, so that

* layer names follow the extractor's convention: a Flax module call is
  named by its nnx module path joined with ``/`` (``features/0``,
  ``layer1/0/conv1``); a functional op (relu, pooling, add, flatten) is
  named ``GraphBuilder.auto_name(scope, op)`` where ``scope`` is the path of
  the module whose ``__call__`` runs it (``""`` at the root): ``relu``,
  ``relu_1``, ..., ``layer1/0/relu_2``;
* forward FLOPs agree with XLA's ``cost_analysis()`` of the Flax twin.

The models:

* ``alexnet``, ``vgg16``, ``resnet50``, ``resnet152``: torchvision's
  definitions at 224x224 (AlexNet single tower; ResNet v1.5, i.e. stride 2
  on the 3x3 conv of a bottleneck). Torchvision's explicit paddings are kept
  as explicit ``(lo, hi)`` pairs wherever they differ from Flax's "SAME".
  Parameter counts equal torchvision's: 61,100,840 / 138,357,544 /
  25,557,032 / 60,192,808.
* ``vgg16-cifar10``: VGG16's conv stack on 32x32, classifier 512 -> 10
  (14,719,818 parameters; SplitBrain §1.4 row 1).
* ``vgg16-cifar10-splitbrain``: VGG16's conv stack on 32x32 with the last
  two max pools removed, so the flatten is 4x4x512 = 8192, classifier
  8192 -> 4096 -> 4096 -> 10: the "3 pools, 4x4x512" row of splitbrain.md
  §1.4 (conv 14,714,688 + FC 50,380,810 = 65,095,498 parameters), the one
  whose FC share reproduces SplitBrain's 67% memory saving with g = 8.
* ``cosmoflow-256`` / ``cosmoflow-512``: the 3-D CosmoFlow CNN whose
  per-layer shapes equal ParaDL's ``COSMOFLOW.net_256`` / ``COSMOFLOW.net``
  (ParaDL §5): 7 conv3d + ReLU (+ 2x2x2 average pool after the first 6),
  then FC 128 -> 2048 -> 256 -> 4. The 256^3 variant uses SAME convs except
  a stride-2 conv4 and a VALID conv7; the 512^3 variant uses VALID convs
  with a stride-2 conv3.

* transformers (:data:`TRANSFORMERS`, built by
  :func:`planner.models.transformer.build_transformer`): ``vit-tiny`` and
  ``vit-b16`` (Dosovitskiy et al. 2021), ``gpt2-small`` and ``gpt3-175b``
  (124,439,808 and 174,604,259,328 parameters), ``llama2-7b`` and
  ``llama3-8b`` (6,738,415,616 and 8,030,261,248, their checkpoints'
  counts), and ``decoder-tiny`` and ``llama-tiny`` for tests.

Deliberate simplifications: **no dropout layers** anywhere (torchvision's
AlexNet/VGG classifiers have dropout; it has no parameters and negligible
FLOPs, and leaving it out keeps the Flax twins deterministic). BatchNorm is
affine and runs in training mode (batch statistics); its running mean and
variance are buffers, not parameters.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Sequence
from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerGraph
from planner.models.transformer import TransformerConfig, build_transformer

__all__ = ["COSMOFLOW_CONVS", "MODEL_NAMES", "TRANSFORMERS", "TransformerConfig", "get_model"]

MODEL_NAMES: tuple[str, ...] = (
    "alexnet",
    "vgg16",
    "vgg16-cifar10",
    "vgg16-cifar10-splitbrain",
    "resnet50",
    "resnet152",
    "cosmoflow-256",
    "cosmoflow-512",
    "vit-tiny",
    "vit-b16",
    "gpt2-small",
    "gpt3-175b",
    "llama2-7b",
    "llama3-8b",
    "decoder-tiny",
    "llama-tiny",
)

# torchvision ``vgg.cfgs["D"]``: conv widths, "M" = 2x2 stride-2 max pool.
_VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)
# SplitBrain §1.4, "3 pools, 4x4x512": the last two pools dropped.
_VGG16_3POOL_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, 512, 512, 512,
)

_PAD1 = ((1, 1), (1, 1))



def _dense_head(b: GraphBuilder, x, prefix: str, widths: tuple[int, ...]) -> LayerGraph:
    """Flatten, then dense layers ``prefix/0, prefix/1, ...`` of ``widths``
    with a ReLU between consecutive ones (none after the last); the graph."""
    x = b.flatten(b.auto_name("", "flatten"), x)
    for j, width in enumerate(widths):
        x = b.dense(f"{prefix}/{j}", x, width)
        if j < len(widths) - 1:
            x = b.relu(b.auto_name("", "relu"), x)
    return b.build()

def _vgg(name: str, size: int, cfg: Sequence[int | str], classifier: Sequence[int]) -> LayerGraph:
    """torchvision VGG: 3x3 pad-1 convs with bias, each followed by ReLU;
    2x2/2 max pool at "M"; flatten; Linear layers with ReLU between them."""
    b = GraphBuilder(name, (3, size, size))
    x = b.input
    i = 0
    for v in cfg:
        if v == "M":
            x = b.max_pool(b.auto_name("", "max_pool"), x, 2, stride=2)
        else:
            x = b.conv(f"features/{i}", x, int(v), 3, padding=_PAD1)
            x = b.relu(b.auto_name("", "relu"), x)
            i += 1
    return _dense_head(b, x, "classifier", classifier)


def _alexnet() -> LayerGraph:
    """torchvision ``AlexNet`` (single tower) at 224x224, without dropout and
    without its adaptive average pool (an identity at 224: the features are
    already 6x6)."""
    b = GraphBuilder("alexnet", (3, 224, 224))
    x = b.input
    convs = (  # (features, kernel, stride, padding), torchvision alexnet.features
        (64, 11, 4, 2), (192, 5, 1, 2), (384, 3, 1, 1), (256, 3, 1, 1), (256, 3, 1, 1),
    )
    pool_after = {0, 1, 4}
    for i, (f, k, s, p) in enumerate(convs):
        x = b.conv(f"features/{i}", x, f, k, stride=s, padding=((p, p), (p, p)))
        x = b.relu(b.auto_name("", "relu"), x)
        if i in pool_after:
            x = b.max_pool(b.auto_name("", "max_pool"), x, 3, stride=2)
    return _dense_head(b, x, "classifier", (4096, 4096, 1000))


def _bottleneck(b: GraphBuilder, scope: str, x: int, width: int, stride: int, downsample: bool) -> int:
    """torchvision ``Bottleneck`` (v1.5): 1x1 -> 3x3 (stride) -> 1x1 (x4), BN
    after each conv, projection shortcut (1x1 conv + BN) on a stage's first
    block, add, ReLU. Convs have no bias."""
    h = b.conv(f"{scope}/conv1", x, width, 1, padding="VALID", bias=False)
    h = b.batch_norm(f"{scope}/bn1", h)
    h = b.relu(b.auto_name(scope, "relu"), h)
    h = b.conv(f"{scope}/conv2", h, width, 3, stride=stride, padding=_PAD1, bias=False)
    h = b.batch_norm(f"{scope}/bn2", h)
    h = b.relu(b.auto_name(scope, "relu"), h)
    h = b.conv(f"{scope}/conv3", h, 4 * width, 1, padding="VALID", bias=False)
    h = b.batch_norm(f"{scope}/bn3", h)
    shortcut = x
    if downsample:
        shortcut = b.conv(f"{scope}/downsample_conv", x, 4 * width, 1, stride=stride, padding="VALID", bias=False)
        shortcut = b.batch_norm(f"{scope}/downsample_bn", shortcut)
    h = b.add(b.auto_name(scope, "add"), [h, shortcut])
    return b.relu(b.auto_name(scope, "relu"), h)


def _resnet(name: str, depths: Sequence[int]) -> LayerGraph:
    """torchvision ``ResNet`` with ``Bottleneck`` blocks at 224x224."""
    b = GraphBuilder(name, (3, 224, 224))
    x = b.conv("conv1", b.input, 64, 7, stride=2, padding=((3, 3), (3, 3)), bias=False)
    x = b.batch_norm("bn1", x)
    x = b.relu(b.auto_name("", "relu"), x)
    x = b.max_pool(b.auto_name("", "max_pool"), x, 3, stride=2, padding=_PAD1)
    for stage, (depth, width) in enumerate(zip(depths, (64, 128, 256, 512), strict=True)):
        for k in range(depth):
            stride = 2 if stage > 0 and k == 0 else 1
            x = _bottleneck(b, f"layer{stage + 1}/{k}", x, width, stride, downsample=k == 0)
    x = b.global_avg_pool(b.auto_name("", "global_avg_pool"), x)
    x = b.dense("fc", x, 1000)
    return b.build()


# (features, kernel, stride, padding) per conv3d; ParaDL §5, COSMOFLOW.net* (the zoo's graphs
# and planner.models.flax_zoo's CosmoFlow modules both read this one table).
COSMOFLOW_CONVS: dict[int, tuple[tuple[int, int, int, str], ...]] = {
    256: (
        (16, 3, 1, "SAME"), (32, 3, 1, "SAME"), (64, 3, 1, "SAME"), (128, 3, 2, "SAME"),
        (256, 2, 1, "SAME"), (256, 2, 1, "SAME"), (128, 2, 1, "VALID"),
    ),
    512: (
        (16, 3, 1, "VALID"), (32, 3, 1, "VALID"), (64, 3, 2, "VALID"), (128, 3, 1, "VALID"),
        (256, 2, 1, "VALID"), (256, 2, 1, "VALID"), (128, 2, 1, "VALID"),
    ),
}


def _cosmoflow(size: int) -> LayerGraph:
    """CosmoFlow 3-D CNN with ParaDL's layer shapes (ParaDL §5): conv3d +
    ReLU (+ 2x2x2 average pool after convs 1-6), flatten, FC 2048/256/4."""
    b = GraphBuilder(f"cosmoflow-{size}", (4, size, size, size))
    x = b.input
    convs = COSMOFLOW_CONVS[size]
    for i, (f, k, s, p) in enumerate(convs):
        x = b.conv(f"convs/{i}", x, f, k, stride=s, padding=p)
        x = b.relu(b.auto_name("", "relu"), x)
        if i < len(convs) - 1:
            x = b.avg_pool(b.auto_name("", "avg_pool"), x, 2, stride=2)
    return _dense_head(b, x, "fcs", (2048, 256, 4))


# -- transformers ------------------------------------------------------------------
TRANSFORMERS: dict[str, TransformerConfig] = {
    # 32x32 images, 8x8 patches: 16 tokens and a class token; for tests
    "vit-tiny": TransformerConfig(64, 2, 4, 256, image=32, patch=8, classes=10),
    # Dosovitskiy et al. 2021, Table 1: ViT-Base, 16x16 patches, at 224x224 (86,567,656 parameters)
    "vit-b16": TransformerConfig(768, 12, 12, 3072, image=224, patch=16, classes=1000),
    # Radford et al. 2019, the 124M GPT-2 (124,439,808 parameters with tied embeddings)
    "gpt2-small": TransformerConfig.gpt(768, 12, 12, tokens=1024, vocab=50257),
    # Brown et al. 2020, Table 2.1: GPT-3 175B (n_layers 96, d_model 12288, 96 heads, n_ctx 2048), GPT-2's
    # architecture and vocabulary (174,604,259,328 parameters with tied embeddings)
    "gpt3-175b": TransformerConfig.gpt(12288, 96, 96, tokens=2048, vocab=50257),
    # Touvron et al. 2023b, Llama 2 7B (dim 4096, 32 layers, 32 heads, FFN 11008, vocab 32000, context 4096;
    # its published params.json and the 6,738,415,616 parameters of its checkpoint)
    "llama2-7b": TransformerConfig.llama(4096, 32, 32, hidden=11008, tokens=4096, vocab=32000),
    # Meta Llama 3 8B (dim 4096, 32 layers, 32 heads, 8 kv heads, FFN 14336, vocab 128256, context 8192;
    # 8,030,261,248 parameters)
    "llama3-8b": TransformerConfig.llama(4096, 32, 32, hidden=14336, tokens=8192, vocab=128256, kv_heads=8),
    # a small LLaMA-style decoder for tests (learned positions, every head its own keys and values)
    "decoder-tiny": TransformerConfig(64, 2, 4, 176, tokens=64, vocab=512, norm="rms", mlp="swiglu", bias=False),
    # a small Llama for tests: rotary positions, grouped-query attention 4:1
    "llama-tiny": TransformerConfig.llama(64, 2, 8, hidden=176, tokens=64, vocab=512, kv_heads=2),
}


_BUILDERS: dict[str, Callable[[], LayerGraph]] = {
    "alexnet": _alexnet,
    "vgg16": lambda: _vgg("vgg16", 224, _VGG16_CFG, (4096, 4096, 1000)),
    "vgg16-cifar10": lambda: _vgg("vgg16-cifar10", 32, _VGG16_CFG, (10,)),
    "vgg16-cifar10-splitbrain": lambda: _vgg(
        "vgg16-cifar10-splitbrain", 32, _VGG16_3POOL_CFG, (4096, 4096, 10)
    ),
    "resnet50": lambda: _resnet("resnet50", (3, 4, 6, 3)),
    "resnet152": lambda: _resnet("resnet152", (3, 8, 36, 3)),
    "cosmoflow-256": lambda: _cosmoflow(256),
    "cosmoflow-512": lambda: _cosmoflow(512),
    **{n: (lambda n=n: build_transformer(TRANSFORMERS[n], n)) for n in TRANSFORMERS},
}


@functools.cache
def _cached(name: str) -> LayerGraph:
    return _BUILDERS[name]()


def get_model(name: str) -> LayerGraph:
    """The built-in model ``name`` (one of :data:`MODEL_NAMES`) as a
    :class:`LayerGraph`. Cached: graphs are immutable."""
    if not isinstance(name, str) or name not in _BUILDERS:
        close = difflib.get_close_matches(str(name), MODEL_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}; built-in models: {', '.join(MODEL_NAMES)}")
    return _cached(name)
