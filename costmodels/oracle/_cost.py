"""The oracle's result record and the helpers every strategy formula shares:
network tiers (ParaDL §3.2), the all-reduce with its hierarchical variant
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
from costmodels.oracle._layers import OracleLayers
from costmodels.transport import (
    IDEAL,
    Environment,
    Transport,
    contended_bandwidth,
    host_staged_allgather_s,
    host_staged_allreduce_s,
    host_staged_p2p_s,
    leader_allreduce_s,
)

__all__ = [
    "COMM_KINDS",
    "COMM_LABELS",
    "OracleContext",
    "StrategyCost",
    "Tier",
    "allreduce",
    "cost_row",
    "env_allgather",
    "env_allreduce",
    "env_p2p",
    "env_ring",
    "environment",
    "f",
    "tier",
]

# Communication split by collective kind (ParaDL §10 "per-iteration outputs").
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


# -- collectives in the hardware's environment (costmodels/transport.py) -----------------------


def environment(hw: Hardware) -> Environment:
    """The hardware's environment section, ParaDL's ideal network without one."""
    return hw.environment if hw.environment is not None else IDEAL


def _link(hw: Hardware, transport: Transport, span: int, crosses: bool, flows_per_node: float = 1.0):
    """(α, per-flow bandwidth, label) of a collective spanning ``span``
    devices on ``transport``: the tier by rank count (§3.2), its
    over-subscription and the node's links shared by ``flows_per_node``
    concurrent flows when it crosses nodes; the transport's message latency
    added. Host staging inside a node uses no network (None bandwidth)."""
    env = environment(hw)
    t = hw.tier_for(max(int(span), 1), crosses_nodes=crosses)
    host = transport.staging == "host"
    label = t.name if not host else (f"{transport.name} ({t.name})" if crosses else transport.name)
    if host and not crosses:
        return 0.0, None, label
    c = env.contention
    bw = f(contended_bandwidth(t.bandwidth_bytes_per_s, c.divisor(t.name), flows_per_node if crosses else 0.0,
                               c.inter_node_links_per_node if crosses else None))
    return t.latency_s + (0.0 if host else transport.message_latency_s), bw, label


def env_p2p(hw: Hardware, kind: str, crosses: bool, nbytes) -> tuple[np.ndarray, str]:
    """Seconds of point-to-point messages of ``nbytes`` (array) on the
    transport of ``kind``: α + m/bw on the device network (§3.1), or staged
    through the host (:func:`costmodels.transport.host_staged_p2p_s`)."""
    tr, _ = environment(hw).route(kind)
    a, bw, label = _link(hw, tr, 2, crosses)
    m = np.asarray(nbytes, dtype=np.float64)
    if tr.staging == "host":
        return host_staged_p2p_s(m, tr.message_latency_s, tr.copy_bandwidth_bytes_per_s, a, bw), label
    return np.where(m > 0, a + m / bw, 0.0), label


def env_allgather(hw: Hardware, kind: str, n: int, per_rank_bytes, flows_per_node: float = 1.0
                  ) -> tuple[np.ndarray, str]:
    """Seconds of ring all-gathers over ``n`` consecutive ranks, each rank
    contributing ``per_rank_bytes`` (array), on the transport of ``kind``
    (§3.1: (n-1)(α + mβ); host staged: :func:`costmodels.transport.host_staged_allgather_s`)."""
    tr, _ = environment(hw).route(kind)
    crosses = n > hw.devices_per_node
    a, bw, label = _link(hw, tr, n, crosses, flows_per_node)
    m = np.asarray(per_rank_bytes, dtype=np.float64)
    if n <= 1:
        return np.zeros_like(m), label
    if tr.staging == "host":
        return host_staged_allgather_s(n, m, tr.message_latency_s, tr.copy_bandwidth_bytes_per_s, a, bw), label
    return (n - 1.0) * (a + m / bw), label


def env_ring(hw: Hardware, kind: str, n: int, nbytes) -> tuple[np.ndarray, str]:
    """Seconds of flat ring all-reduces of ``nbytes`` (array) over ``n``
    consecutive ranks on the transport of ``kind`` (§3.1: 2(n-1)(α + m/n β))."""
    tr, _ = environment(hw).route(kind)
    return _ring(hw, tr, n, n, n > hw.devices_per_node, np.asarray(nbytes, dtype=np.float64))


def _ring(hw: Hardware, tr: Transport, n: int, span: int, crosses: bool, m, flows: float = 1.0):
    a, bw, label = _link(hw, tr, span, crosses, flows)
    if n <= 1:
        return np.zeros_like(m), label
    if tr.staging == "host":
        return host_staged_allreduce_s(n, m, tr.message_latency_s, tr.copy_bandwidth_bytes_per_s, a, bw), label
    return 2.0 * (n - 1.0) * (a + m / n / bw), label  # §3.1 ring


def env_allreduce(hw: Hardware, kind: str, n: int, ranks_per_node: int, nbytes, *, concurrent: int = 1
                  ) -> tuple[float, str]:
    """Seconds and tier label of an all-reduce of ``nbytes`` over ``n`` ranks,
    ``ranks_per_node`` of them in each node, ``concurrent`` such all-reduces
    leaving every node at once, on the transport and scheme of ``kind``:

    * ring: the flat ring over every rank (§3.1);
    * cheapest: the cheaper of the ring and reduce-scatter in the node, ring
      across the nodes on 1/g of the buffer (g flows per node), all-gather in
      the node (§4.8, §10) — without an environment exactly
      :func:`allreduce`;
    * leader: reduce to one leader per node and broadcast back on the
      intra-node tier, the leaders' ring on the transport (§4.8, ChainerMN's
      hierarchical communicator)."""
    if n <= 1 or nbytes <= 0:
        return 0.0, ""
    env = environment(hw)
    tr, scheme = env.route(kind)
    g = max(1, min(int(ranks_per_node), n))
    if hw.environment is None and scheme == "cheapest" and concurrent == 1:
        return allreduce(hw, n, g, nbytes)  # ParaDL's ideal network: the legacy path, bit for bit
    m = float(nbytes)
    crosses = n > g
    flat, flat_label = _ring(hw, tr, n, n, crosses, m, float(concurrent))
    flat = f(flat)
    intra = hw.tier_for(g, crosses_nodes=False)
    if scheme == "leader" and not crosses:  # one node: reduce to the leader, broadcast back
        return f(leader_allreduce_s(g, m, intra.latency_s, intra.bandwidth_bytes_per_s, 0.0)), intra.name
    if not crosses or g <= 1 or scheme == "ring":
        return flat, flat_label
    k = max(n // g, 1)
    if scheme == "leader":
        leaders, label = _ring(hw, tr, k, n, True, m, float(concurrent))
        return f(leader_allreduce_s(g, m, intra.latency_s, intra.bandwidth_bytes_per_s, leaders)), label
    # cheapest: RS in the node, ring across nodes on m/g with g flows per node, AG in the node (§4.8, §10)
    inter, label = _ring(hw, tr, k, k, True, m / g, float(g * concurrent))
    a, bw = intra.latency_s, intra.bandwidth_bytes_per_s
    hier = f((g - 1.0) * (a + m / g / bw) + inter + (g - 1.0) * (a + m / g / bw))
    return (hier, label) if hier < flat * (1 - 1e-6) else (flat, flat_label)
