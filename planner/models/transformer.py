"""Transformers described by their sizes: a :class:`TransformerConfig` (the
GPT family, the Llama family, ViTs), its layer graph
(:func:`build_transformer`) and its JSON file, which every command accepts
as MODEL.

A config names sizes and the few choices that tell the families apart:

============  ==========================  ==================================
field         GPT (``TransformerConfig.gpt``)  Llama (``TransformerConfig.llama``)
============  ==========================  ==================================
norm          ``layer`` (LayerNorm)       ``rms`` (RMSNorm)
mlp           ``gelu``, hidden 4 x width  ``swiglu`` (gate, up, down)
positions     ``learned`` (added)         ``rotary`` (on queries and keys)
kv_heads      = heads                     fewer: grouped-query attention
bias          yes                         no
tied          yes (GPT-2, GPT-3)          no
============  ==========================  ==================================

The graph is the pre-norm decoder of Radford et al. 2019 (GPT-2; GPT-3,
Brown et al. 2020, Table 2.1, is the same architecture at other sizes) and
of Touvron et al. 2023 (Llama, §2.2: RMSNorm, SwiGLU, rotary embeddings;
Llama 2 and 3 add grouped-query attention), or the ViT of Dosovitskiy et
al. 2021. Its layer names are the ones :mod:`planner.models.flax_transformers`
gives its modules (``blocks/0/attn/qkv``, ``blocks/0/mlp/fc1``).

The file is one JSON object: ``"schema": "shardplan/transformer"``,
``"version": 1``, an optional ``"name"`` and the fields of
:class:`TransformerConfig` (``kv_heads`` may be omitted or ``null``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerGraph, layer_path

__all__ = [
    "GELU_FLOPS_PER_ELEMENT",
    "SILU_FLOPS_PER_ELEMENT",
    "TRANSFORMER_SCHEMA",
    "TRANSFORMER_VERSION",
    "TransformerConfig",
    "build_transformer",
    "is_transformer_file",
]

TRANSFORMER_SCHEMA = "shardplan/transformer"
TRANSFORMER_VERSION = 1

GELU_FLOPS_PER_ELEMENT = 8.0  # jax.nn.gelu (tanh form): 8 element-wise primitives, as XLA counts them
SILU_FLOPS_PER_ELEMENT = 2.0  # jax.nn.silu: logistic and a product (the extractor's count of primitives)
# the transcendental values each one's derivative reads, kept beside its input (GraphBuilder.elementwise)
GELU_KEPT_VALUES = 1  # its tanh
SILU_KEPT_VALUES = 1  # its logistic

_CHOICES = {"norm": ("layer", "rms"), "mlp": ("gelu", "swiglu"), "positions": ("learned", "rotary")}
_SIZES = ("width", "depth", "heads", "hidden", "tokens", "vocab", "image", "patch", "classes")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A transformer's sizes and family choices (module docstring). A
    decoder reads ``tokens`` token ids from a ``vocab``; a ViT (``image`` >
    0) reads ``image x image`` RGB images cut into ``patch x patch`` patches
    and classifies them into ``classes``."""

    width: int  # channels of the residual stream (d_model)
    depth: int  # blocks
    heads: int  # query heads
    hidden: int  # MLP hidden width
    kv_heads: int | None = None  # key-value heads (None: as many as heads; fewer: grouped-query attention)
    tokens: int = 0  # decoder: sequence length
    vocab: int = 0  # decoder: vocabulary
    image: int = 0  # ViT: image side
    patch: int = 0  # ViT: patch side
    classes: int = 0  # ViT: classes
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    mlp: str = "gelu"  # "gelu" (fc1, gelu, fc2) or "swiglu" (down(silu(gate) * up))
    positions: str = "learned"  # "learned" (added to the tokens) or "rotary" (on queries and keys; decoders)
    bias: bool = True  # dense layers and LayerNorms have biases
    tied: bool = False  # decoder: the output layer is the token embedding's table

    def __post_init__(self) -> None:
        for f in _SIZES:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"transformer {f} must be a whole number >= 0, got {v!r}")
        for f in ("width", "depth", "heads", "hidden"):
            if getattr(self, f) < 1:
                raise ValueError(f"transformer {f} must be at least 1, got {getattr(self, f)}")
        kv = self.kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
            raise ValueError(f"transformer kv_heads must be a whole number >= 1 or null, got {kv!r}")
        for f, allowed in _CHOICES.items():
            if getattr(self, f) not in allowed:
                raise ValueError(f"transformer {f} must be one of {', '.join(allowed)}, got {getattr(self, f)!r}")
        for f in ("bias", "tied"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"transformer {f} must be true or false, got {getattr(self, f)!r}")
        if self.width % self.heads:
            raise ValueError(f"transformer heads ({self.heads}) must divide the width ({self.width})")
        if self.heads % self.key_value_heads:
            raise ValueError(f"transformer kv_heads ({self.key_value_heads}) must divide heads ({self.heads})")
        self._check_kind()

    def _check_kind(self) -> None:
        vit = self.image > 0
        need = ("image", "patch", "classes") if vit else ("tokens", "vocab")
        missing = [f for f in need if getattr(self, f) < 1]
        if missing:
            what = "a ViT" if vit else "a decoder (image 0)"
            raise ValueError(f"transformer {', '.join(missing)} must be at least 1 for {what}")
        extra = [f for f in (("tokens", "vocab") if vit else ("patch", "classes")) if getattr(self, f)]
        if extra:
            raise ValueError(f"transformer {', '.join(extra)} must be 0 for a {'ViT' if vit else 'decoder'}")
        if vit and self.image % self.patch:
            raise ValueError(f"transformer patch ({self.patch}) must divide the image side ({self.image})")
        if vit and (self.tied or self.positions != "learned"):
            raise ValueError("a ViT has learned positions and no tied output layer")
        if self.rotary and self.head_dim % 2:
            raise ValueError(f"rotary positions rotate pairs of channels: the head dim ({self.head_dim}) must be even")

    # -- families -------------------------------------------------------------------
    @classmethod
    def gpt(cls, width: int, depth: int, heads: int, *, tokens: int, vocab: int, hidden: int | None = None,
            tied: bool = True) -> TransformerConfig:
        """The GPT family: LayerNorm, GELU MLP of ``4 x width`` (default),
        learned positions, biases, the output tied to the token table."""
        return cls(width, depth, heads, 4 * width if hidden is None else hidden, tokens=tokens, vocab=vocab,
                   tied=tied)

    @classmethod
    def llama(cls, width: int, depth: int, heads: int, *, hidden: int, tokens: int, vocab: int,
              kv_heads: int | None = None, tied: bool = False) -> TransformerConfig:
        """The Llama family: RMSNorm, SwiGLU MLP, rotary positions, no
        biases, grouped-query attention over ``kv_heads``, an untied output."""
        return cls(width, depth, heads, hidden, kv_heads=kv_heads, tokens=tokens, vocab=vocab, norm="rms",
                   mlp="swiglu", positions="rotary", bias=False, tied=tied)

    # -- derived --------------------------------------------------------------------
    @property
    def key_value_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def qkv_features(self) -> int:
        """Channels of the fused query-key-value projection."""
        return (self.heads + 2 * self.key_value_heads) * self.head_dim

    # -- file -----------------------------------------------------------------------
    def to_dict(self, name: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": TRANSFORMER_SCHEMA, "version": TRANSFORMER_VERSION}
        if name is not None:
            out["name"] = name
        out.update(dataclasses.asdict(self))
        return out

    def to_json(self, name: str | None = None) -> str:
        return json.dumps(self.to_dict(name), indent=1)

    @classmethod
    def from_dict(cls, data: Any) -> tuple[TransformerConfig, str | None]:
        """The config and name of a transformer file's JSON object;
        ``ValueError`` naming the field where it is not one (no coercion:
        sizes are JSON integers, switches ``true`` / ``false``)."""
        if not is_transformer_file(data):
            raise ValueError(f'not a transformer config: "schema" must be {TRANSFORMER_SCHEMA!r}')
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f'transformer config "version" must be a whole number >= 1, got {version!r}')
        if version > TRANSFORMER_VERSION:
            raise ValueError(f"transformer config version {version} is newer than this shardplan understands "
                             f"({TRANSFORMER_VERSION}); upgrade shardplan")
        name = data.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f'transformer config "name" must be a non-empty string, got {name!r}')
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields - {"schema", "version", "name"})
        if unknown:
            raise ValueError(f"transformer config has unknown fields {unknown}; known: {', '.join(sorted(fields))}")
        missing = [f for f in ("width", "depth", "heads", "hidden") if f not in data]
        if missing:
            raise ValueError(f"transformer config is missing {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in fields}), name


def is_transformer_file(data: Any) -> bool:
    """Whether a JSON object is a transformer config (its ``schema``)."""
    return isinstance(data, dict) and data.get("schema") == TRANSFORMER_SCHEMA


# -- the graph ---------------------------------------------------------------------------
def _attention_block(b: GraphBuilder, scope: str, x: int, cfg: TransformerConfig, *, causal: bool) -> int:
    """Self-attention: one dense layer for the queries, keys and values
    (GPT-2's ``c_attn``, ViT's ``qkv``; Llama's ``wq``, ``wk``, ``wv`` side by
    side, grouped by key-value head), rotary positions on the queries and
    keys, the attention, the output projection; no residual add."""
    c, _ = b.shape(x)
    qkv = b.dense(layer_path(scope, "qkv"), x, cfg.qkv_features, bias=cfg.bias)
    if cfg.rotary:
        qkv = b.rotary_embedding(layer_path(scope, "rope"), qkv,
                                 rotated_channels=(cfg.heads + cfg.key_value_heads) * cfg.head_dim)
    h = b.attention(b.auto_name(scope, "attention"), qkv, heads=cfg.heads, kv_heads=cfg.key_value_heads,
                    causal=causal)
    return b.dense(layer_path(scope, "out"), h, c, bias=cfg.bias)


def _transformer_block(b: GraphBuilder, scope: str, x: int, cfg: TransformerConfig, *, causal: bool) -> int:
    """A pre-norm block: ``x + attn(norm1(x))``, then ``h + mlp(norm2(h))``;
    the MLP ``fc2(gelu(fc1(h)))`` or ``down(silu(gate(h)) * up(h))`` (SwiGLU,
    Shazeer 2020)."""
    c, _ = b.shape(x)
    rms = cfg.norm == "rms"
    h = b.norm(layer_path(scope, "norm1"), x, rms=rms, bias=cfg.bias)
    h = _attention_block(b, layer_path(scope, "attn"), h, cfg, causal=causal)
    x = b.add(b.auto_name(scope, "add"), [x, h])
    h = b.norm(layer_path(scope, "norm2"), x, rms=rms, bias=cfg.bias)
    mlp = layer_path(scope, "mlp")
    if cfg.mlp == "swiglu":
        gate = b.dense(layer_path(mlp, "gate"), h, cfg.hidden, bias=cfg.bias)
        up = b.dense(layer_path(mlp, "up"), h, cfg.hidden, bias=cfg.bias)
        gate = b.elementwise(b.auto_name(mlp, "silu"), gate, flops_per_element=SILU_FLOPS_PER_ELEMENT,
                             kept_values=SILU_KEPT_VALUES)
        h = b.multiply(b.auto_name(mlp, "multiply"), [gate, up])
        h = b.dense(layer_path(mlp, "down"), h, c, bias=cfg.bias)
    else:
        h = b.dense(layer_path(mlp, "fc1"), h, cfg.hidden, bias=cfg.bias)
        h = b.elementwise(b.auto_name(mlp, "gelu"), h, flops_per_element=GELU_FLOPS_PER_ELEMENT,
                          kept_values=GELU_KEPT_VALUES)
        h = b.dense(layer_path(mlp, "fc2"), h, c, bias=cfg.bias)
    return b.add(b.auto_name(scope, "add"), [x, h])


def _vit(b: GraphBuilder, cfg: TransformerConfig) -> None:
    """A ``patch x patch`` stride-``patch`` conv embeds the patches, which
    become tokens; a class token is put in front and position embeddings
    added; ``depth`` pre-norm blocks; a final LayerNorm; the class token's
    features feed the head (Dosovitskiy et al. 2021, §3.1)."""
    x = b.conv("patch_embed", b.input, cfg.width, cfg.patch, stride=cfg.patch, padding="VALID", bias=cfg.bias)
    x = b.tokens(b.auto_name("", "reshape"), x)
    x = b.position_embedding("pos_embed", x, class_token=True)
    for i in range(cfg.depth):
        x = _transformer_block(b, f"blocks/{i}", x, cfg, causal=False)
    x = b.norm("norm", x, rms=cfg.norm == "rms", bias=cfg.bias)
    x = b.first_token(b.auto_name("", "first_token"), x)
    b.dense("head", x, cfg.classes, bias=cfg.bias)


def _decoder(b: GraphBuilder, cfg: TransformerConfig) -> None:
    """Token embedding (and learned positions), ``depth`` pre-norm causal
    blocks, a final norm and the output layer over the vocabulary (tied: the
    token embedding's table, transposed)."""
    x = b.embed("embed", b.input, cfg.vocab, cfg.width)
    if not cfg.rotary:
        x = b.position_embedding("pos_embed", x)
    for i in range(cfg.depth):
        x = _transformer_block(b, f"blocks/{i}", x, cfg, causal=True)
    x = b.norm("norm", x, rms=cfg.norm == "rms", bias=cfg.bias)
    if cfg.tied:  # the table as the output layer: the extractor names the embedding's attend call
        b.dense("embed/attend", x, cfg.vocab, bias=False, tied=True)
    else:
        b.dense("lm_head", x, cfg.vocab, bias=False)


def build_transformer(config: TransformerConfig, name: str = "transformer") -> LayerGraph:
    """The :class:`LayerGraph` of a transformer config (module docstring)."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"build_transformer takes a TransformerConfig, got {type(config).__name__}")
    if config.image:
        b = GraphBuilder(name, (3, config.image, config.image))
        _vit(b, config)
    else:
        b = GraphBuilder(name, (1, config.tokens))
        _decoder(b, config)
    return b.build()
