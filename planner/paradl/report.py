"""``planner.oracle`` (this module: ``planner.paradl.report``): the ParaDL oracle for a model and a machine.

For each strategy (data, spatial, filter, channel, pipeline, data+filter,
data+spatial) and each device count: per-iteration compute, communication
split by collective kind, weight update, total, memory per device, epoch
time, feasibility and a one-line bottleneck. The formulas live in
:mod:`costmodels.oracle`; this module resolves the user's inputs (model,
hardware, ``.lc`` masks, data-set size) and packages the rows.

    >>> report = oracle("resnet50", "abci-v100", devices=[32, 64, 128, 256])
    >>> report.ranking(64)[0].strategy
    'data'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from costmodels import (
    MASK_FAMILIES,
    Calibration,
    Hardware,
    OracleLayers,
    StrategyCost,
    calibration_arrays,
    check_calibration,
    lc_family,
    load_calibration,
    load_hardware,
    load_lc,
    oracle_calibration,
    oracle_context,
    oracle_layers,
    oracle_table,
    parse_strategies,
    read_input,
)
from planner.ir.graph import LayerGraph
from planner.models.netfile import NET_SUFFIXES

__all__ = ["COMPAT_MODES", "OracleReport", "net_dataset_size", "oracle"]

COMPAT_MODES = ("paradl",)

LcSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Any] | None


@dataclasses.dataclass(frozen=True)
class OracleReport:
    """The oracle's rows for one model on one machine, strategy-major."""

    model: str
    hardware: str
    mode: str  # "default" or "paradl"
    dataset_size: int | None
    optimizer: str
    rows: tuple[StrategyCost, ...]

    def row(self, strategy: str, devices: int) -> StrategyCost:
        (s,) = parse_strategies([strategy])
        for r in self.rows:
            if r.strategy == s and r.devices == devices:
                return r
        raise KeyError(f"no row for {s} on {devices} devices")

    def ranking(self, devices: int) -> tuple[StrategyCost, ...]:
        """The strategies at ``devices``: feasible ones first, by time per
        sample (the strategies run different global batches, so per-iteration
        times do not compare; time per sample is epoch time / D), then the
        infeasible ones."""
        rows = [r for r in self.rows if r.devices == devices]
        if not rows:
            raise KeyError(f"no rows for {devices} devices")
        return tuple(sorted(rows, key=lambda r: (not r.feasible, r.time_per_sample_s if r.feasible else 0.0)))

    def row_dicts(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per row (the CLI's JSON output)."""
        head = {"model": self.model, "hardware": self.hardware, "mode": self.mode}
        return [{**head, **r.to_dict()} for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "mode": self.mode,
            "dataset_size": self.dataset_size,
            "optimizer": self.optimizer,
            "rows": [r.to_dict() for r in self.rows],
        }


def net_dataset_size(path: str | os.PathLike[str]) -> int | None:
    """D from a ParaDL ``.net`` file's ``Input|DxCxWxH`` header (§5), or
    ``None`` if the file has none."""
    text = read_input(path, "ParaDL .net network description").decode("utf-8-sig", errors="replace")
    for line in text.splitlines():
        fields = line.split("#", 1)[0].strip().split("|")
        if fields[0].strip() == "Input" and len(fields) >= 2:
            head = fields[1].strip().split("x")[0]
            return int(head) if head.isdigit() and int(head) > 0 else None
    return None


def _is_net(path: Path) -> bool:
    if path.suffix in NET_SUFFIXES:
        return True
    return read_input(path, "model file").removeprefix(b"\xef\xbb\xbf").startswith(b"Dataset|")


def _resolve_model(model: LayerGraph | str | os.PathLike[str],
                   on_unsupported: str) -> tuple[LayerGraph, int | None]:
    if isinstance(model, LayerGraph):
        return model, None
    from planner.models.loading import (
        load_model,  # zoo names, .net, .json, module:factory
    )

    graph = load_model(os.fspath(model), on_unsupported)
    path = Path(os.fspath(model))
    size = net_dataset_size(path) if path.is_file() and _is_net(path) else None
    return graph, size


def _resolve_masks(layers: OracleLayers, lc: LcSpec) -> dict[str, np.ndarray]:
    """``lc``: a path, a list of paths or ``FAMILY=PATH`` strings (family from
    the file name's prefix otherwise), or a mapping family -> path or mask."""
    if lc is None:
        return {}
    items: list[tuple[str, Any]] = []
    if isinstance(lc, Mapping):
        items = list(lc.items())
    else:
        for spec in [lc] if isinstance(lc, (str, os.PathLike)) else list(lc):
            text = os.fspath(spec)
            fam, sep, rest = text.partition("=")
            if sep and fam in MASK_FAMILIES:
                items.append((fam, rest))
            else:
                items.append((lc_family(text), text))
    masks: dict[str, np.ndarray] = {}
    for fam, value in items:
        if fam not in MASK_FAMILIES:
            raise ValueError(f"unknown mask family {fam!r}; expected one of {', '.join(MASK_FAMILIES)}")
        if fam in masks:
            raise ValueError(f"two {fam} masks given; give one per family ({', '.join(MASK_FAMILIES)})")
        if isinstance(value, (str, os.PathLike)):
            try:
                masks[fam] = load_lc(value, layers)
            except OSError as e:
                raise ValueError(
                    f"cannot read {fam} mask {os.fspath(value)}: {e.strerror}; expected a ParaDL .lc file"
                ) from None
        else:
            masks[fam] = np.asarray(value, dtype=bool)
    return masks


def oracle(
    model: LayerGraph | str | os.PathLike[str],
    hardware: Hardware | str | os.PathLike[str],
    devices: Sequence[int],
    strategies: Sequence[str] | None = None,
    *,
    batch_per_device: float | None = None,
    batch: float | None = None,
    segments: int | None = None,
    compat: str | None = None,
    dataset_size: int | None = None,
    lc: LcSpec = None,
    optimizer: str = "sgd",
    calibration: Calibration | str | os.PathLike[str] | None = None,
    allow_other_hardware: bool = False,
    on_unsupported: str = "error",
) -> OracleReport:
    """Evaluate ``strategies`` (default: all seven) of ``model`` on
    ``devices`` devices of ``hardware``.

    ``model``: a :class:`LayerGraph`, or anything ``shardplan`` accepts as
    MODEL (a zoo name, a ParaDL ``.net`` file — whose header gives the
    data-set size —, a layer-graph ``.json``, ``module:factory``).
    ``batch_per_device`` b (default: ParaDL's b_max of data parallelism, a
    power of two) or the global ``batch`` B: see :mod:`costmodels.oracle`
    for what each strategy does with them. ``segments``: pipeline
    micro-batches S (default min(p, B)). ``compat="paradl"`` reproduces the
    original oracle code (ParaDL §7.2); default: its bugs fixed
    (docs/oracle.md). ``lc``: ParaDL ``.lc`` masks saying which layers a
    strategy splits. ``dataset_size`` D gives ``epoch_s``. ``optimizer``
    (sgd, momentum, adam; default mode only) sizes the weight update and
    its state. ``calibration``: measured per-layer times (a
    :class:`~costmodels.Calibration` or a file ``shardplan profile`` wrote)
    replacing the compute time of the layers it measured (default mode
    only); one measured on other hardware than ``hardware`` is refused
    unless ``allow_other_hardware``, and so is one measuring none of the
    model's layers (:func:`costmodels.check_calibration`). ``on_unsupported``: :func:`planner.extract`'s,
    for a ``module:factory`` model.
    """
    if compat not in (None, *COMPAT_MODES):
        raise ValueError(f"unknown compat mode {compat!r}; expected None (the default mode) or 'paradl'")
    hw = load_hardware(hardware)
    graph, size = _resolve_model(model, on_unsupported)
    layers = oracle_layers(graph)
    cal = None
    if calibration is not None:
        if not isinstance(calibration, Calibration):
            calibration = load_calibration(calibration)
        check_calibration(calibration, graph, hw.name, None, allow_other_hardware=allow_other_hardware)
        cal = oracle_calibration(calibration_arrays(calibration, graph, by_layer=True), graph, layers)
    ctx = oracle_context(
        layers, hw, compat=compat == "paradl", masks=_resolve_masks(layers, lc),
        dataset_size=dataset_size if dataset_size is not None else size, optimizer=optimizer, calibration=cal,
    )
    rows = oracle_table(
        ctx, list(devices), parse_strategies(strategies),
        batch_per_device=batch_per_device, batch=batch, segments=segments,
    )
    return OracleReport(
        model=graph.model_name,
        hardware=hw.name,
        mode=compat or "default",
        dataset_size=ctx.dataset_size,
        optimizer="sgd" if compat else optimizer,
        rows=rows,
    )
