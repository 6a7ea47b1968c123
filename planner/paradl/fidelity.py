"""How well the ParaDL oracle predicts ParaDL's own measurements
(``shared/reference/measurements/paradl-abci-fig2.json``).

:func:`paradl_fidelity` runs every series of that file through the oracle in
default mode (on an environment preset, ``abci-v100-chainermn`` by default)
and in compat mode (``abci-v100``, the original's masks), next to the
original oracle's own plotted predictions, and scores each with the mean of
min(P/E, E/P) over the series' points (ParaDL §10 "Validation metrics";
the symmetric form, since the TR's P/E rewards under-prediction).

    >>> report = paradl_fidelity("../shared/reference/measurements/paradl-abci-fig2.json")
    >>> round(report.mean("default", model="resnet50"), 2) >= 0.85
    True

Batches follow the file's ``batch_rule`` in ParaDL's ``--cBon`` convention
(:mod:`costmodels.oracle`): ``per_unit`` samples per device for data, the
fixed batch for filter / channel, per node for the hybrids — in every case
``batch_per_device=per_unit``. Masks: compat mode uses the original's
``.lc`` files (ParaDL §5, §7.2); default mode splits filter / channel at
its default masks (every conv) and splits spatially every layer from the
first to the last one the ``.lc`` marks (the span the run split).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from costmodels import Hardware, oracle_layers, parse_lc, read_json
from planner.models.netfile import load_net
from planner.paradl.report import oracle

__all__ = ["MODES", "SeriesFidelity", "FidelityReport", "accuracy", "default_predictions", "paradl_fidelity"]

MODES = ("default", "compat", "original")
# The original's .lc masks per .net family (ParaDL §5 ".lc masks used").
_LC = {
    "RESNET50": {"filter": "filter_resnet.lc", "channel": "channel_resnet.lc", "spatial": "spatial_resnet.lc"},
    "VGG": {"filter": "filter_vgg.lc", "channel": "filter_vgg.lc", "spatial": "spatial_vgg.lc"},
    "ALEXNET": {"filter": "filter_alexnet.lc", "channel": "filter_alexnet.lc", "spatial": "spatial_alexnet.lc"},
    "COSMOFLOW": {"spatial": "spatial_cosmolow.lc"},
}


def accuracy(predicted_s: Sequence[float] | np.ndarray, measured_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """min(P/E, E/P) per point (1 = exact; ParaDL §10)."""
    p = np.asarray(predicted_s, dtype=np.float64)
    e = np.asarray(measured_s, dtype=np.float64)
    if p.shape != e.shape:
        raise ValueError(f"{p.size} predictions for {e.size} measurements; give one per point")
    if np.any(p <= 0) or np.any(e <= 0):
        raise ValueError("accuracy needs positive times; a prediction or measurement is zero or negative")
    return np.minimum(p / e, e / p)


@dataclasses.dataclass(frozen=True)
class SeriesFidelity:
    """One series of the measurements file, per point: measured and
    predicted seconds per iteration, and the accuracies."""

    model: str
    net: str
    strategy: str
    batch_per_device: float
    devices: tuple[int, ...]
    measured_s: tuple[float, ...]
    default_s: tuple[float, ...]  # default mode on the environment preset
    compat_s: tuple[float, ...]  # compat mode ("paradl") on the compat preset
    original_s: tuple[float, ...]  # the original oracle's plotted predictions (original_oracle_pred)

    def predicted_s(self, mode: str) -> tuple[float, ...]:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        return getattr(self, f"{mode}_s")

    def accuracies(self, mode: str) -> np.ndarray:
        """min(P/E, E/P) per point of ``mode``."""
        return accuracy(self.predicted_s(mode), self.measured_s)

    def accuracy(self, mode: str) -> float:
        """Mean min(P/E, E/P) over the series' points."""
        return float(self.accuracies(mode).mean())

    def to_dict(self) -> dict[str, Any]:
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}
        d["accuracy"] = {m: self.accuracy(m) for m in MODES}
        return d


@dataclasses.dataclass(frozen=True)
class FidelityReport:
    hardware: str  # the default mode's preset
    compat_hardware: str
    series: tuple[SeriesFidelity, ...]

    def select(self, model: str | None = None, strategy: str | None = None) -> tuple[SeriesFidelity, ...]:
        return tuple(s for s in self.series if (model is None or s.model == model)
                     and (strategy is None or s.strategy == strategy))

    def mean(self, mode: str, model: str | None = None, strategy: str | None = None) -> float:
        """Mean min(P/E, E/P) over every point of the selected series (not a
        mean of series means: a 7-point series weighs 7)."""
        chosen = self.select(model, strategy)
        if not chosen:
            raise ValueError(f"no series for model {model!r} and strategy {strategy!r}")
        return float(np.concatenate([s.accuracies(mode) for s in chosen]).mean())

    def to_dict(self) -> dict[str, Any]:
        models = sorted({s.model for s in self.series})
        return {
            "hardware": self.hardware,
            "compat_hardware": self.compat_hardware,
            "series": [s.to_dict() for s in self.series],
            "mean": {m: {mode: self.mean(mode, m) for mode in MODES} for m in models},
        }


def _family(net: str) -> str:
    up = net.upper()
    for fam in _LC:
        if up.startswith(fam):
            return fam
    raise ValueError(f"no .lc masks known for network {net!r}; expected a ParaDL .net of {', '.join(_LC)}")


def _spatial_span(mask: np.ndarray) -> np.ndarray:
    """Every row from the first to the last one ``mask`` marks."""
    out = np.zeros_like(mask)
    idx = np.flatnonzero(mask)
    if idx.size:
        out[idx[0]: idx[-1] + 1] = True
    return out


def _read(measurements, models_dir) -> tuple[Mapping[str, Any], Path]:
    """The parsed measurements and the folder of ParaDL's .net / .lc files."""
    if isinstance(measurements, Mapping):
        data = measurements
        if models_dir is None:
            raise ValueError("give models_dir (the ParaDL .net/.lc folder) when the measurements are not a file")
    else:
        path = Path(os.fspath(measurements))
        data = read_json(path, "measurements file (paradl-abci-fig2.json)")
        if models_dir is None:
            models_dir = path.resolve().parent.parent / "paradl" / "models"
    if not isinstance(data.get("series"), list) or not data["series"]:
        raise ValueError("the measurements have no 'series' list; expected paradl-abci-fig2.json's layout")
    return data, Path(os.fspath(models_dir))


def _series(data: Mapping[str, Any], models: Path):
    """Per series: (the series, its .net path, its .lc paths, the spatial mask, devices, b)."""
    for i, s in enumerate(data["series"]):
        missing = [k for k in ("model", "net", "strategy", "per_unit", "devices", "emp", "original_oracle_pred")
                   if k not in s]
        if missing:
            raise ValueError(f"series {i} lacks {', '.join(missing)}; expected paradl-abci-fig2.json's fields")
        net = models / s["net"]
        if not net.is_file():
            raise ValueError(f"network file {net} not found; give models_dir, the folder of ParaDL's .net files")
        lc = {fam: models / name for fam, name in _LC[_family(s["net"])].items()}
        layers = oracle_layers(load_net(net))
        spatial = parse_lc(lc["spatial"].read_text(encoding="utf-8"), layers, source=str(lc["spatial"]))
        yield s, net, lc, spatial, [int(p) for p in s["devices"]], float(s["per_unit"])


def default_predictions(
    measurements: str | os.PathLike[str] | Mapping[str, Any],
    hardware: Hardware | str | os.PathLike[str] = "abci-v100-chainermn",
    *,
    models_dir: str | os.PathLike[str] | None = None,
) -> tuple[tuple[float, ...], ...]:
    """Default mode's seconds per iteration of every point, series by series,
    on ``hardware`` (what :func:`paradl_fidelity` reports as ``default_s``)."""
    data, models = _read(measurements, models_dir)
    return tuple(_default_s(net, hardware, devices, s["strategy"], b, spatial)
                 for s, net, _, spatial, devices, b in _series(data, models))


def _default_s(net, hardware, devices, st, b, spatial) -> tuple[float, ...]:
    dflt = oracle(net, hardware, devices, [st], batch_per_device=b, lc={"spatial": _spatial_span(spatial)})
    return tuple(dflt.row(st, p).total_s for p in devices)


def paradl_fidelity(
    measurements: str | os.PathLike[str] | Mapping[str, Any],
    *,
    hardware: Hardware | str | os.PathLike[str] = "abci-v100-chainermn",
    compat_hardware: Hardware | str | os.PathLike[str] = "abci-v100",
    models_dir: str | os.PathLike[str] | None = None,
) -> FidelityReport:
    """Predict every series of ParaDL's measurements file (path, or its parsed
    JSON) in default mode on ``hardware`` and compat mode on
    ``compat_hardware``, beside the original's plotted predictions.
    ``models_dir``: the ParaDL ``.net`` / ``.lc`` files (default
    ``<measurements>/../../paradl/models``, as laid out in shared/reference)."""
    data, models = _read(measurements, models_dir)
    out = []
    for s, net, lc, spatial, devices, b in _series(data, models):
        st = s["strategy"]
        comp = oracle(net, compat_hardware, devices, [st], batch_per_device=b, compat="paradl", lc=lc)
        out.append(SeriesFidelity(
            model=str(s["model"]), net=str(s["net"]), strategy=st, batch_per_device=b, devices=tuple(devices),
            measured_s=tuple(float(x) for x in s["emp"]),
            default_s=_default_s(net, hardware, devices, st, b, spatial),
            compat_s=tuple(comp.row(st, p).total_s for p in devices),
            original_s=tuple(float(x) for x in s["original_oracle_pred"]),
        ))
    name = lambda h: h.name if isinstance(h, Hardware) else str(h)  # noqa: E731
    return FidelityReport(hardware=name(hardware), compat_hardware=name(compat_hardware), series=tuple(out))
