"""What :func:`planner.extract` does with an operation it cannot map to a
layer kind: an error, or a replicated ``OTHER`` layer costed from its FLOPs
(``LayerGraph.on_unsupported`` records the second). Without heavy imports:
the command line's options read it."""

from __future__ import annotations

from typing import Any

__all__ = ["ON_UNSUPPORTED", "check_on_unsupported"]

ON_UNSUPPORTED = ("error", "replicate")


def check_on_unsupported(value: Any, where: str = "on_unsupported") -> str:
    """``value`` if it is one of :data:`ON_UNSUPPORTED`, else a ValueError naming ``where``."""
    if value not in ON_UNSUPPORTED:
        raise ValueError(f'{where} must be "error" or "replicate", got {value!r}')
    return value
