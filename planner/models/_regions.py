"""What the jaxpr walk behind :func:`planner.extract` knows of a module
(:class:`_ModuleInfo`, from the model's structure) and of one call of it in
progress (:class:`_Region`). Private."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple


class _ModuleInfo(NamedTuple):
    path: str
    type_name: str  # e.g. "nnx.Embed" or "MyBlock"
    kind: str | None  # "conv" | "dense" | "batch_norm" | "layer_norm" | "rms_norm" | "embed" | "attend" | "mha"
    #                   | "opaque" | None (transparent)
    bias: bool  # has a bias parameter (conv / dense / batch norm / layer norm)
    scale: bool  # has a scale parameter (batch norm / layer and RMS norm)
    params: int  # trainable parameters of the module and its submodules
    direct_params: int  # trainable parameters owned by the module itself
    attributes: tuple[tuple[str, Any], ...] = ()  # what a composite layer needs (mha: heads, features, bias)


@dataclasses.dataclass(eq=False)
class _Region:
    """An in-progress call of a module that becomes one layer."""

    key: tuple[str, int]
    info: _ModuleInfo
    inputs: list[int] = dataclasses.field(default_factory=list)
    key_eqn: Any = None  # the conv_general_dilated / dot_general of a Conv / Linear
    repeated: bool = False  # more than one of them
    out_aval: Any = None
    flops: float = 0.0
    node: int | None = None
    prims: set[str] = dataclasses.field(default_factory=set)  # primitives applied to activations
