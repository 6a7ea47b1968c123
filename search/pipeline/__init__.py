"""The pipelined configuration of a chain of identical transformer blocks:
tensor size, stages, micro-batch size, interleave, recomputation and
sequence parallelism, chosen for the fastest predicted step under the
memory limit (:func:`search_pipeline`), every candidate costed at once
(:func:`evaluate_candidates`, over :func:`candidates` of a
:class:`PipelineSpace`).

``__all__`` is the contract (``search``' face re-exports it); names load on
first use (``_LAZY``)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from search.pipeline._search import (
        PipelinePlan,
        PipelineSearch,
        TransformerChain,
        evaluate_candidates,
        search_pipeline,
    )
    from search.pipeline._space import Candidates, PipelineSpace, candidates

__all__ = [
    "Candidates",
    "PipelinePlan",
    "PipelineSearch",
    "PipelineSpace",
    "TransformerChain",
    "candidates",
    "evaluate_candidates",
    "search_pipeline",
]

_LAZY = {  # public name -> the module that defines it, imported on first use
    "PipelinePlan": "search.pipeline._search",
    "PipelineSearch": "search.pipeline._search",
    "TransformerChain": "search.pipeline._search",
    "evaluate_candidates": "search.pipeline._search",
    "search_pipeline": "search.pipeline._search",
    "Candidates": "search.pipeline._space",
    "PipelineSpace": "search.pipeline._space",
    "candidates": "search.pipeline._space",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'search.pipeline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
