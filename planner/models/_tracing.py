"""How :func:`planner.extract` traces a model: an nnx model's module calls
marked in the jaxpr by patched ``__call__`` methods (:func:`_trace_nnx`,
the markers name module paths), a linen model's through
``flax.linen.intercept_methods`` (:func:`_trace_linen`), and what each
module is (:func:`_nnx_infos`, :func:`_linen_info`). Shared with
:mod:`planner.models.layer_equations`, which traces the training step the
same way."""

from __future__ import annotations

import dataclasses
import inspect
import math
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import flax.linen as nn
import jax
import jax.extend.core as jex
import numpy as np
from flax import nnx

from planner.ir.graph import layer_path
from planner.models._jaxpr_walk import _MARK
from planner.models._regions import _ModuleInfo
from planner.models._parameters import leaf_parameters

_PATH_ATTR = "_shardplan_path"  # set on the traced (private) copy of an nnx model


def _type_name(cls: type) -> str:
    mod = cls.__module__
    if mod.startswith("flax.nnx"):
        return f"nnx.{cls.__name__}"
    if mod.startswith("flax.linen"):
        return f"nn.{cls.__name__}"
    return cls.__qualname__


def _classify(module: Any, direct: int, subtree: int) -> str | None:
    """Layer kind of a module call, ``"opaque"`` for an unmodelled module with
    parameters, ``None`` for a transparent container."""
    if isinstance(module, (nnx.Conv, nn.Conv)):
        return "conv"
    if isinstance(module, (nnx.Linear, nn.Dense)):
        return "dense"
    if isinstance(module, (nnx.BatchNorm, nn.BatchNorm)):
        return "batch_norm"
    if isinstance(module, (nnx.Embed, nn.Embed)):
        return "embed"
    if isinstance(module, (nnx.MultiHeadAttention, nn.MultiHeadDotProductAttention)):
        # self-attention without a decoding cache, query-key norms or dropout: projections + attention
        plain = not module.decode and not module.normalize_qk and not module.dropout_rate
        default = nnx.dot_product_attention if isinstance(module, nnx.Module) else nn.dot_product_attention
        return "mha" if plain and module.attention_fn is default else "opaque"
    if isinstance(module, (nnx.LayerNorm, nn.LayerNorm, nnx.RMSNorm, nn.RMSNorm)):
        last = all(tuple(np.atleast_1d(getattr(module, a, -1)).tolist()) == (-1,)
                   for a in ("reduction_axes", "feature_axes"))
        if last:  # over each position's channels (the default): the planner's norm layer
            return "rms_norm" if isinstance(module, (nnx.RMSNorm, nn.RMSNorm)) else "layer_norm"
        return "opaque"
    if isinstance(module, (nnx.Sequential, nnx.List, nnx.Dict, nn.Sequential)):
        return None
    if direct > 0:
        # beside submodules (a root module's learned positions): transparent, its own parameters followed
        # as values by the walk (planner.models._transformer_walk._Positions); alone: a layer or opaque
        return "owner" if subtree > direct else "opaque"
    # A Flax-provided composite with parameters (attention, ...): one opaque layer.
    if subtree > 0 and type(module).__module__.startswith("flax."):
        return "opaque"
    return None


def _nnx_infos(model: nnx.Module) -> dict[str, _ModuleInfo]:
    mods = {tuple(p): m for p, m in nnx.iter_modules(model)}
    direct = dict.fromkeys(mods, 0)
    subtree = dict.fromkeys(mods, 0)
    names: dict[tuple, set[str]] = {p: set() for p in mods}
    transparent = {p for p, m in mods.items() if isinstance(m, (nnx.List, nnx.Dict))}
    for ppath, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        size = math.prod(var.shape)
        owner = None
        for k in range(len(ppath) - 1, -1, -1):
            pre = tuple(ppath[:k])
            if pre in mods:
                subtree[pre] += size
                if owner is None and pre not in transparent:
                    owner = pre
                    direct[pre] += size
                    names[pre].add("/".join(map(str, ppath[k:])))
    infos = {}
    for p, m in mods.items():
        path = "/".join(map(str, p))
        attributes = tuple((a, getattr(m, a)) for a in ("num_heads", "qkv_features", "out_features", "use_bias")
                           ) if isinstance(m, nnx.MultiHeadAttention) else ()
        infos[path] = _ModuleInfo(
            path, _type_name(type(m)), _classify(m, direct[p], subtree[p]),
            "bias" in names[p], "scale" in names[p], subtree[p], direct[p], attributes,
        )
        if isinstance(m, nnx.Embed):
            infos[_attend_path(path)] = _attend_info(path, _type_name(type(m)))
    return infos


def _attend_path(path: str) -> str:
    """The pseudo-module path of an embedding's ``attend`` (its table as an output layer)."""
    return layer_path(path, "attend")


def _attend_info(path: str, type_name: str) -> _ModuleInfo:
    return _ModuleInfo(_attend_path(path), f"{type_name}.attend", "attend", False, False, 0, 0)


def _linen_info(module: nn.Module, path: str) -> _ModuleInfo:
    params = module.variables.get("params", {}) if module.scope is not None else {}
    own = {k: v for k, v in params.items() if not isinstance(v, Mapping)}
    direct = sum(math.prod(np.shape(v)) for v in own.values())
    subtree = sum(math.prod(np.shape(v)) for v in jax.tree.leaves(params))
    kind = _classify(module, direct, subtree)
    attributes: tuple[tuple[str, Any], ...] = ()
    if kind == "mha":  # its projections' sizes from their kernels: query (C, heads, head_dim), out (heads, head_dim, F)
        heads, head_dim = np.shape(params["query"]["kernel"])[1:]
        attributes = (("num_heads", int(heads)), ("qkv_features", int(heads * head_dim)),
                      ("out_features", int(np.shape(params["out"]["kernel"])[-1])), ("use_bias", bool(module.use_bias)))
    return _ModuleInfo(path, _type_name(type(module)), kind, "bias" in own, "scale" in own, subtree, direct,
                       attributes)


# -- tracing ---------------------------------------------------------------------------
def _marker(path: str, ordinal: int) -> str:
    return f"{_MARK}{ordinal}:{urllib.parse.quote(path, safe='')}"


@dataclasses.dataclass
class _CallTracker:
    """Per-trace state of the patched module calls."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # calls so far per path
    stack: list[str] = dataclasses.field(default_factory=list)

    @contextmanager
    def call(self, path: str) -> Iterator[None]:
        if self.stack and self.stack[-1] == path:  # super().__call__ or a helper method
            yield
            return
        k = self.counts.get(path, 0)
        self.counts[path] = k + 1
        self.stack.append(path)
        try:
            with jax.named_scope(_marker(path, k)):
                yield
        finally:
            self.stack.pop()


def _nnx_call_wrapper(orig: Callable, tracker: _CallTracker, attend: bool = False) -> Callable:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = getattr(self, _PATH_ATTR, None)
        if path is None:
            return orig(self, *args, **kwargs)
        with tracker.call(_attend_path(path) if attend else path):
            return orig(self, *args, **kwargs)

    __call__.__wrapped__ = orig  # type: ignore[attr-defined]
    __call__.__doc__ = orig.__doc__
    return __call__


@contextmanager
def _patched_nnx_calls(classes: set[type], tracker: _CallTracker) -> Iterator[None]:
    owners = []
    for cls in classes:
        owner = next((c for c in cls.__mro__ if "__call__" in c.__dict__), None)
        if owner is not None and owner is not object and owner not in owners:
            owners.append(owner)
    originals = [(c, "__call__", c.__dict__["__call__"]) for c in owners]
    # an embedding's attend (x @ table.T, tied output layers) is a call of its own
    originals += [(c, "attend", c.__dict__["attend"]) for c in {
        next(k for k in cls.__mro__ if "attend" in k.__dict__) for cls in classes if issubclass(cls, nnx.Embed)}]
    try:
        for c, attr, orig in originals:
            setattr(c, attr, _nnx_call_wrapper(orig, tracker, attend=attr == "attend"))
        yield
    finally:
        for c, attr, orig in originals:
            setattr(c, attr, orig)


def _trace_nnx(model: nnx.Module, x: jax.ShapeDtypeStruct
               ) -> tuple[jex.ClosedJaxpr, dict[str, _ModuleInfo], list[Any]]:
    infos = _nnx_infos(model)
    classes = {type(m) for _, m in nnx.iter_modules(model)}
    graphdef, state = nnx.split(model)
    tracker = _CallTracker()

    def forward(st: Any, inp: Any) -> Any:
        m = nnx.merge(graphdef, st)  # a private copy: tag each module with its path
        for p, mm in nnx.iter_modules(m):
            # A static attribute survives the split/merge of nnx transforms
            # (nnx.jit, nnx.remat) inside the model, unlike object identity.
            object.__setattr__(mm, _PATH_ATTR, "/".join(map(str, p)))
            if isinstance(mm, nnx.BatchNorm):
                # Running-statistics updates cost O(trace size) each inside a
                # trace (flax's Variable.set_value probes ``.sharding``), which
                # makes deep nets quadratic; the layer is the same either way.
                mm.use_running_average = True
        return m(inp)

    with _patched_nnx_calls(classes, tracker):
        closed = jax.make_jaxpr(forward)(state, x)
    params = {tuple(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    return closed, infos, leaf_parameters(state, lambda keys: keys if keys in params else None)


_LINEN_TRAIN_FLAGS = {
    "train": True, "training": True, "is_training": True,
    "deterministic": False, "use_running_average": False,
}


def linen_train_kwargs(model: nn.Module) -> dict[str, bool]:
    """The training flags extraction (and the export) call a linen module
    with: those of ``train=True``, ``deterministic=False``, ... its ``__call__`` takes."""
    try:
        params = inspect.signature(type(model).__call__).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in _LINEN_TRAIN_FLAGS.items() if k in params}


def _trace_linen(model: nn.Module, x: jax.ShapeDtypeStruct
                 ) -> tuple[jex.ClosedJaxpr, dict[str, _ModuleInfo], Any, list[Any]]:
    variables = None
    if model.scope is not None:  # bound: use its variables (abstractly)
        model, variables = model.unbind()
    kwargs = linen_train_kwargs(model)

    def rngs() -> dict[str, Any]:
        return {"params": jax.random.key(0), "dropout": jax.random.key(1)}

    if variables is None:
        variables = jax.eval_shape(lambda inp: model.init(rngs(), inp, **kwargs), x)
    infos: dict[str, _ModuleInfo] = {}
    tracker = _CallTracker()

    def interceptor(next_fun: Callable, args: Any, kwargs_: Any, context: Any) -> Any:
        if context.method_name == "setup":
            return next_fun(*args, **kwargs_)
        mod = context.module
        path = "/".join(map(str, mod.path))
        if path not in infos:
            infos[path] = _linen_info(mod, path)
        if context.method_name == "attend" and isinstance(mod, nn.Embed):
            path = _attend_path(path)
            infos.setdefault(path, _attend_info(path[: -len("/attend")] if "/" in path else "", _type_name(type(mod))))
        with tracker.call(path):
            return next_fun(*args, **kwargs_)

    def forward(v: Any, inp: Any) -> Any:
        out, _ = model.apply(v, inp, rngs=rngs(), mutable=True, **kwargs)
        return out

    with nn.intercept_methods(interceptor):
        closed = jax.make_jaxpr(forward)(variables, x)
    leaves = leaf_parameters(variables, lambda keys: keys[1:] if keys[0] == "params" else None)
    return closed, infos, variables.get("params", {}), leaves


# -- FLOPs of primitives (for replicated layers) ----------------------------------------
def _graph_input_shape(x: Any) -> tuple[int, ...]:
    """The graph's per-sample input shape, channels first, of a batch-first,
    channels-last input ``x``; ``(1, tokens)`` for token ids."""
    if len(x.shape) == 2 and np.issubdtype(x.dtype, np.integer):  # token ids (B, tokens): one channel of ids
        return (1, int(x.shape[1]))
    return (int(x.shape[-1]), *(int(d) for d in x.shape[1:-1]))
