"""One resolver for every way a model is named (the CLI's MODEL argument,
``planner.oracle``'s model): a built-in model name
(:data:`planner.models.zoo.MODEL_NAMES`); a ParaDL network file (``.net``,
``.net_sc``, ``.net_256``, or any file whose first line starts with
``Dataset|``; ParaDL §5); a layer-graph ``.json`` file
(:meth:`LayerGraph.to_json`); a transformer config ``.json`` file
(:class:`planner.models.transformer.TransformerConfig`, schema
``shardplan/transformer``); or ``package.module:factory``, a function that
returns ``(flax_module, example_input)``, extracted with
:func:`planner.extract`. Mistakes are :class:`planner.usage.UsageError`s."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

from costmodels import read_input, read_json
from planner.ir.graph import LayerGraph
from planner.models.netfile import NET_SUFFIXES, load_net
from planner.models.transformer import TRANSFORMER_SCHEMA, TransformerConfig, build_transformer, is_transformer_file
from planner.usage import UsageError
from planner.user_code import UserCodeError, user_code

__all__ = ["FACTORY_PATTERN", "accepted_models", "call_factory", "flax_model_of", "load_model", "zoo_names"]

FACTORY_PATTERN = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_NET_MAGIC = b"Dataset|"


def zoo_names() -> tuple[str, ...]:
    try:
        from planner.models.zoo import MODEL_NAMES
    except ImportError:
        return ()
    return tuple(MODEL_NAMES)


def accepted_models() -> str:
    names = zoo_names()
    listed = f" ({', '.join(names)})" if names else ""
    return (
        f"expected a built-in model name{listed}, a ParaDL .net file, "
        "a layer-graph or transformer-config .json file, or package.module:factory"
    )


def load_model(spec: str, on_unsupported: str = "error") -> LayerGraph:
    """The :class:`LayerGraph` a command-line MODEL argument names (see the
    module docstring); ``on_unsupported`` is :func:`planner.extract`'s, for a
    ``package.module:factory`` (the other kinds are not extracted). Raises
    :class:`UsageError` for names and paths that resolve to nothing,
    ``ValueError`` for malformed files and ``OSError`` for unreadable ones."""
    if spec in zoo_names():
        from planner.models.zoo import get_model

        return get_model(spec)
    path = Path(spec)
    if path.is_file():
        return _load_file(path)
    if path.exists():
        raise UsageError(f"{spec} is not a file", accepted_models())
    if FACTORY_PATTERN.fullmatch(spec):
        return _load_factory(spec, on_unsupported)
    if os.sep in spec or "/" in spec or path.suffix in (*NET_SUFFIXES, ".json"):
        raise UsageError(f"no such file: {spec}", accepted_models())
    close = difflib.get_close_matches(spec, zoo_names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(f"unknown model {spec!r}{hint}", accepted_models())


def transformer_of(spec: str) -> tuple[TransformerConfig, str] | None:
    """The transformer config and name a command-line MODEL argument names (a
    zoo transformer, or a transformer-config ``.json`` file); None for any
    other model. Call after :func:`load_model` has accepted ``spec``."""
    from planner.models.zoo import TRANSFORMERS

    if spec in TRANSFORMERS:
        return TRANSFORMERS[spec], spec
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        data = read_json(path, "layer-graph or transformer-config JSON file")
        if is_transformer_file(data):
            config, name = TransformerConfig.from_dict(data)
            return config, name or path.stem
    return None


def _load_file(path: Path) -> LayerGraph:
    head = read_input(path, "model file (.net or layer-graph .json)")[:len(_NET_MAGIC) + 3]
    if path.suffix in NET_SUFFIXES or head.removeprefix(b"\xef\xbb\xbf").startswith(_NET_MAGIC):
        return load_net(path)
    if path.suffix == ".json":
        data = read_json(path, "layer-graph or transformer-config JSON file")  # its errors name the file
        if is_transformer_file(data):
            try:
                config, name = TransformerConfig.from_dict(data)
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
            return build_transformer(config, name or path.stem)
        try:
            return LayerGraph.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}; expected a layer-graph JSON file written by LayerGraph.to_json, "
                             f'or a transformer config ("schema": "{TRANSFORMER_SCHEMA}")') from None
    raise UsageError(
        f"{path} is neither a ParaDL .net file (first line Dataset|...) nor a .json layer graph", accepted_models()
    )


def flax_model_of(spec: str) -> Any:
    """The Flax model a command-line MODEL names: a built-in model's twin
    (abstract: nothing initialised) or a ``package.module:factory``'s module
    (the factory runs); None for a layer-graph or ``.net`` file, which has
    none."""
    if spec in zoo_names():
        from planner.models.flax_zoo import flax_model

        return flax_model(spec)[0]
    if FACTORY_PATTERN.fullmatch(spec):
        return call_factory(spec)[0]
    return None


def call_factory(spec: str) -> tuple[Any, Any]:
    """``(flax_module, example_input)`` from a ``package.module:factory``
    argument: imported, checked to take no arguments, called and its result
    checked; every mistake is a :class:`UsageError`. The import and the call
    are the user's code (:func:`planner.user_code.user_code`): what they
    print goes to stderr, what they raise is a :class:`UserCodeError`."""
    module_name, _, attr = spec.partition(":")
    accepted = "expected package.module:factory, a function taking no arguments that returns (flax_module, example_input)"
    with user_code(f"importing {module_name!r}", accepted=accepted):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UsageError(f"cannot import {module_name!r} ({e})", accepted) from None
        except SyntaxError as e:
            raise UsageError(f"cannot import {module_name!r} (syntax error: {e})", accepted) from None
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}", accepted)
    if not callable(factory):
        raise UsageError(f"{spec} is not callable", accepted)
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise UsageError(f"{spec} needs arguments", accepted) from None
    except ValueError:  # no signature (a builtin): just call it
        pass
    with user_code(f"{spec}()", accepted=accepted):
        result = factory()
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise UsageError(f"{spec}() returned {type(result).__name__}, not a (module, example_input) pair", accepted)
    return result[0], result[1]


def _load_factory(spec: str, on_unsupported: str) -> LayerGraph:
    result = call_factory(spec)
    try:
        from planner.models.extraction import extract
    except ImportError as e:
        raise UsageError(f"Flax model extraction is unavailable ({e})", accepted_models()) from None
    try:
        return extract(*result, on_unsupported=on_unsupported)
    except UserCodeError as e:  # the forward pass raised: name the factory the user gave, not the model's class
        raise e.named(spec) from None
