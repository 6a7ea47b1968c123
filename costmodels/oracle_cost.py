"""The oracle's result record and the helpers every strategy formula shares:
network tiers (paradl.md §3.2), the all-reduce with its hierarchical variant
(§4.8), and the evaluation context.

A :class:`StrategyCost` is one strategy at one device count, per iteration:
compute, communication split by collective kind, weight update, memory per
device, and the first parallelism limit it breaks (§4.1), if any.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from costmodels.calibration import CalibrationArrays
from costmodels.collectives import allreduce_s, network_arrays, ring_allreduce_s
from costmodels.hardware import Hardware
from costmodels.oracle_layers import OracleLayers

__all__ = [
    "COMM_KINDS",
    "COMM_LABELS",
    "OracleContext",
    "StrategyCost",
    "Tier",
    "allreduce",
    "cost_row",
    "f",
    "tier",
]

# Communication split by collective kind (paradl.md §10 "per-iteration outputs").
COMM_KINDS = ("grad_allreduce", "act_allgather", "act_allreduce", "halo", "pipeline_p2p")
COMM_LABELS = {
    "grad_allreduce": "gradient all-reduce",
    "act_allgather": "activation all-gather",
    "act_allreduce": "activation all-reduce",
    "halo": "halo exchange",
    "pipeline_p2p": "pipeline send/recv",
}


def f(x: Any) -> float:
    """A plain Python float of a scalar (numpy or jax)."""
    return float(np.asarray(x, dtype=np.float64))


@dataclasses.dataclass(frozen=True)
class StrategyCost:
    """One strategy on ``devices`` devices, per training iteration."""

    strategy: str
    devices: int
    batch: float  # global mini-batch B
    batch_per_device: float  # samples each device works on per iteration (on its share of the model or image)
    data_parallel: int  # p1: replicas that split the batch
    model_parallel: int  # p2: devices that share one replica (filter / channel / spatial / pipeline stages)
    segments: int | None  # pipeline micro-batches S
    compute_s: float
    grad_allreduce_s: float
    act_allgather_s: float
    act_allreduce_s: float
    halo_s: float
    pipeline_p2p_s: float
    weight_update_s: float
    memory_bytes_per_device: float
    memory_capacity_bytes: float
    memory_checked: bool  # False where the original never checks memory (compat ds, §9.6)
    tiers: tuple[tuple[str, str], ...]  # (comm kind, network tier it runs on)
    limit: str | None  # the first parallelism limit (§4.1) the configuration breaks
    iterations_per_epoch: int | None = None
    bottleneck: str = ""

    @property
    def comm_s(self) -> float:
        return sum(getattr(self, f"{k}_s") for k in COMM_KINDS)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s + self.weight_update_s

    @property
    def time_per_sample_s(self) -> float:
        """Seconds per training sample: strategies run different global
        batches at the same device count, so this (not total_s) ranks them."""
        return self.total_s / self.batch if self.batch > 0 else float("inf")

    @property
    def fits_memory(self) -> bool:
        return not self.memory_checked or self.memory_bytes_per_device <= self.memory_capacity_bytes

    @property
    def feasible(self) -> bool:
        return self.limit is None and self.fits_memory

    @property
    def epoch_s(self) -> float | None:
        return None if self.iterations_per_epoch is None else self.total_s * self.iterations_per_epoch

    def tier_of(self, kind: str) -> str:
        return dict(self.tiers).get(kind, "")

    def to_dict(self) -> dict[str, Any]:
        d = {
            "strategy": self.strategy,
            "devices": self.devices,
            "batch": _num(self.batch),
            "batch_per_device": _num(self.batch_per_device),
            "data_parallel": self.data_parallel,
            "model_parallel": self.model_parallel,
            "segments": self.segments,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "total_s": self.total_s,
            "samples_per_s": 1.0 / self.time_per_sample_s if self.total_s > 0 else None,
        }
        d.update({f"{k}_s": getattr(self, f"{k}_s") for k in COMM_KINDS})
        d.update({
            "weight_update_s": self.weight_update_s,
            "memory_bytes_per_device": self.memory_bytes_per_device,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_memory": self.fits_memory,
            "feasible": self.feasible,
            "limit": self.limit,
            "bottleneck": self.bottleneck,
            "iterations_per_epoch": self.iterations_per_epoch,
            "epoch_s": self.epoch_s,
            "tiers": dict(self.tiers),
        })
        return d


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


@dataclasses.dataclass(frozen=True)
class OracleContext:
    """Everything but the device count and batch that a strategy formula needs."""

    layers: OracleLayers
    hardware: Hardware
    compat: bool
    masks: dict[str, np.ndarray]  # family (filter, channel, spatial) -> bool per layer
    per_sample_s: np.ndarray | None  # per-layer FW+BW seconds per sample; None = roofline
    dataset_size: int | None
    optimizer_slots: int = 0  # default mode only: fp32 optimizer state tensors per parameter
    bytes_per_item: float = 4.0  # δ (fp32, as ParaDL)
    calibration: CalibrationArrays | None = None  # measured per-layer times, rows aligned with layers

    @property
    def capacity_bytes(self) -> float:
        return self.hardware.device.memory_bytes

    @property
    def devices_per_node(self) -> int:
        return self.hardware.devices_per_node

    def iterations(self, batch: float) -> int | None:
        """ceil(D/B) iterations per epoch (§4)."""
        return None if not self.dataset_size else math.ceil(self.dataset_size / batch)


def cost_row(
    ctx: OracleContext, strategy: str, p: int, B: float, b: float, p1: int, p2: int, **kw: Any
) -> StrategyCost:
    """A :class:`StrategyCost` with every time zero and memory checked,
    overridden by ``kw``."""
    base = dict(
        strategy=strategy, devices=p, batch=B, batch_per_device=b, data_parallel=p1, model_parallel=p2,
        segments=None, compute_s=0.0, grad_allreduce_s=0.0, act_allgather_s=0.0, act_allreduce_s=0.0,
        halo_s=0.0, pipeline_p2p_s=0.0, weight_update_s=0.0, memory_bytes_per_device=0.0,
        memory_capacity_bytes=ctx.capacity_bytes, memory_checked=True, tiers=(), limit=None,
        iterations_per_epoch=ctx.iterations(B),
    )
    base.update(kw)
    return StrategyCost(**base)


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str
    latency_s: float
    bandwidth_bytes_per_s: float


def tier(hw: Hardware, ranks: int) -> Tier:
    """The network tier of a collective over ``ranks`` consecutive devices
    (ParaDL's step function by rank count, §3.2; crossing nodes when the ranks
    outnumber a node)."""
    t = hw.tier_for(max(int(ranks), 1), crosses_nodes=ranks > hw.devices_per_node)
    return Tier(t.name, t.latency_s, t.bandwidth_bytes_per_s)


def allreduce(hw: Hardware, n: int, ranks_per_node: int, nbytes: float) -> tuple[float, str]:
    """Seconds and tier name of an all-reduce of ``nbytes`` over ``n`` ranks,
    ``ranks_per_node`` of them in each node: the cheaper of the flat ring
    (§3.1) and, across nodes, the hierarchical scheme (reduce-scatter in the
    node, ring across nodes on 1/g of the buffer, all-gather in the node;
    §4.8, §10) — :func:`costmodels.collectives.allreduce_s`, ring only."""
    if n <= 1 or nbytes <= 0:
        return 0.0, ""
    g = max(1, min(int(ranks_per_node), n))
    net = network_arrays(hw)
    t = f(allreduce_s(net, float(n), float(g), float(nbytes), tree=False))
    flat_tier = hw.tier_for(n, crosses_nodes=n > g)
    flat = f(ring_allreduce_s(float(n), float(nbytes), flat_tier.latency_s, flat_tier.bandwidth_bytes_per_s))
    if n > g > 1 and t < flat * (1 - 1e-6):
        return t, hw.tier_for(max(n // g, 1), crosses_nodes=True).name
    return t, flat_tier.name
