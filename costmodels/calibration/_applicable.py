"""Whether a calibration belongs to a cost question, checked in one place
(:func:`check_calibration`, which ``plan``, ``evaluate`` and the oracle call
before they use one): the hardware it was measured on, the dtype it was
measured in, and how many of the model's layers it measures. A calibration
that measures none of them is refused (profiled on another model, it would
change nothing and say nothing); one that measures some is used, and the
caller is told how many."""

from __future__ import annotations

from costmodels.calibration._file import Calibration, check_hardware
from costmodels.calibration._keys import LayerDims, OpKey, graph_op_keys
from costmodels.layers import LayerTable

__all__ = ["check_calibration"]


def _describe(op: OpKey, dims: LayerDims) -> str:
    """``conv 3x3 3->64 on [32, 32]``: an operation and its layer's size, for messages."""
    window = "x".join(map(str, op.kernel)) + " " if op.kernel else ""
    kind = f"{op.pool} pool" if op.pool else op.kind
    spatial = f" on {[int(x) for x in dims.in_spatial]}" if dims.in_spatial else ""
    return f"{kind} {window}{int(dims.in_channels)}->{int(dims.out_channels)}{spatial}"


def _coverage_named(calibration: Calibration, graph: LayerTable) -> tuple[int, int]:
    """Versions 1/2: layers measured, of the model's layers; a name the model
    does not have is an error."""
    named = [*calibration.layers, *(n for n in calibration.strategies if n not in calibration.layers)]
    known = set(graph.names)
    unknown = [n for n in named if n not in known]
    if unknown or not named:
        what = f"names {len(unknown)} layer(s) that model {graph.model_name!r} does not have, e.g. {unknown[:3]}" \
            if unknown else "names no layer"
        raise ValueError(
            f"{calibration.source} {what}; was it measured on another model? Model {graph.model_name!r} has "
            f"{graph.num_layers} layers, e.g. {list(graph.names[:3])}; profile it (shardplan profile MODEL)")
    return len(named), graph.num_layers


def _coverage_shapes(calibration: Calibration, graph: LayerTable) -> tuple[int, int]:
    """Version 3: layers whose operation and size have points, of the layers
    of a kind ``shardplan profile`` measures; none is an error."""
    keys = [k for k in graph_op_keys(graph, calibration.dtype) if k is not None]
    measured = {(p.op, p.layer) for p in calibration.points}
    covered = sum(k in measured for k in keys)
    if covered == 0:
        theirs = list(dict.fromkeys(_describe(p.op, p.layer) for p in calibration.points))
        ours = list(dict.fromkeys(_describe(op, dims) for op, dims in keys))
        raise ValueError(
            f"{calibration.source} measures no layer of model {graph.model_name!r}: its {len(calibration.points)} "
            f"point(s) are of {len(theirs)} layer shape(s), e.g. {theirs[:3]}, and the model's "
            f"{len(ours)} layer shape(s) are e.g. {ours[:3]}; was it profiled on another model? "
            f"Profile this one (shardplan profile MODEL)")
    return covered, len(keys)


def check_calibration(calibration: Calibration, graph: LayerTable, hardware_name: str, dtype: str | None, *,
                      allow_other_hardware: bool = False) -> str:
    """Refuse ``calibration`` for a cost of ``graph`` on hardware
    ``hardware_name`` in ``dtype`` (None: any) where it does not belong: measured
    on other hardware (unless ``allow_other_hardware``,
    :func:`check_hardware`), in another dtype, or measuring none of the
    model's layers (versions 1/2: naming a layer the model does not have).
    Returns a note for the caller to show where it measures only some of
    them (how many), else ``""``."""
    check_hardware(calibration, hardware_name, allow_other_hardware=allow_other_hardware)
    if dtype is not None and calibration.dtype != dtype:
        raise ValueError(
            f"{calibration.source}: the calibration was measured in {calibration.dtype}, but the plan computes in "
            f"{dtype}; profile in {dtype} or plan and evaluate with dtype {calibration.dtype}")
    covered, total = (_coverage_shapes if calibration.points else _coverage_named)(calibration, graph)
    if covered >= total:
        return ""
    kinds = " (of the kinds shardplan profile times)" if calibration.points else ""
    return (f"{calibration.source} measures {covered} of the {total} layers of model {graph.model_name!r}{kinds}; "
            f"the other {total - covered} are timed by the compute model")
