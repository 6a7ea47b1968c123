"""The software environment a machine's collectives run in, as data: which
transport each collective uses (NCCL-style on the device network, or MPI
staged through host memory), how many flows share a node's inter-node links
and which tiers are over-subscribed (contention), which all-reduce scheme the
framework uses, and the framework's fixed cost per kernel and narrow-shard
efficiency (the oracle's shard compute).

This is the optional ``environment`` section of a hardware file
(:mod:`costmodels.hardware`, docs/hardware-format.md). Without it a machine
is ParaDL's ideal one: every collective NCCL-style on the tiers, no
contention, the cheaper of the flat ring and the hierarchical all-reduce,
compute divided by the split (:data:`IDEAL`).

The formulas here are plain alpha-beta arithmetic on floats (numpy
broadcasts through them); the oracle (:mod:`costmodels.oracle._cost`) picks
the tier and passes its latency and bandwidth. Sources: ParaDL §3.1 (ring
formulas), §3.2 (host staging without GPUDirect, ABCI's 1:3 spine
over-subscription), §4.8 (ChainerMN's hierarchical all-reduce: reduce to a
leader, all-reduce between leaders), §8 (congestion, MPI halo exchange).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from costmodels.files import check_float32

__all__ = [
    "ALLREDUCE_SCHEMES",
    "COLLECTIVE_KINDS",
    "IDEAL",
    "STAGINGS",
    "Contention",
    "Environment",
    "Route",
    "ShardCompute",
    "Transport",
    "contended_bandwidth",
    "default_scheme",
    "environment_from_dict",
    "host_staged_allgather_s",
    "host_staged_allreduce_s",
    "host_staged_p2p_s",
    "leader_allreduce_s",
    "pipelined_chain_s",
]

STAGINGS = ("device", "host")
# What a collective of the oracle can be routed by (the oracle's comm kinds, the spatial
# all-gather split from the filter / channel one, the hybrids' inter-node gradient exchange
# split from data parallelism's).
COLLECTIVE_KINDS = (
    "grad_allreduce",  # data (and pure spatial) parallelism's gradient all-reduce
    "hybrid_grad_allreduce",  # data+filter / data+spatial: gradients across the nodes
    "act_allgather",  # filter / channel activation all-gather
    "act_allreduce",  # filter / channel activation all-reduce
    "halo",  # spatial halo exchange (point to point)
    "spatial_allgather",  # the spatial split layer's output gathered for the replicated rest
    "pipeline_p2p",  # pipeline boundary send / receive
)
ALLREDUCE_KINDS = ("grad_allreduce", "hybrid_grad_allreduce", "act_allreduce")
# ring: a flat ring over every rank (NCCL's ring, ParaDL §3.1); cheapest: the cheaper of the
# flat ring and reduce-scatter / all-reduce across nodes / all-gather (ParaDL §4.8, §10);
# leader: reduce to one leader per node, all-reduce between the leaders, broadcast in the node
# (ChainerMN's hierarchical communicator, ParaDL §4.8).
ALLREDUCE_SCHEMES = ("ring", "cheapest", "leader")


@dataclasses.dataclass(frozen=True)
class Transport:
    """How a collective moves bytes: on the device network (``device``,
    NCCL-style, GPUDirect) or through host memory (``host``: MPI on host
    buffers, each message copied device -> host and host -> device)."""

    name: str
    staging: str  # "device" or "host"
    message_latency_s: float = 0.0  # software cost of one message or ring step, on top of the tier's latency
    copy_bandwidth_bytes_per_s: float | None = None  # device <-> host copies (host staging only)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "staging": self.staging, "message_latency_s": self.message_latency_s}
        if self.copy_bandwidth_bytes_per_s is not None:
            d["copy_bandwidth_bytes_per_s"] = self.copy_bandwidth_bytes_per_s
        return d


def default_scheme(kind: str) -> str:
    """The all-reduce scheme of a kind the file does not route: filter /
    channel activations ring over their group (ParaDL §4.6); gradients the
    cheaper of ring and hierarchical (§4.8)."""
    return "ring" if kind == "act_allreduce" else "cheapest"


@dataclasses.dataclass(frozen=True)
class Route:
    """The transport (and, for an all-reduce, the scheme) of one collective kind."""

    transport: str
    scheme: str = "cheapest"


@dataclasses.dataclass(frozen=True)
class Contention:
    """Bandwidth lost to sharing. ``inter_node_links_per_node``: the node's
    NICs; k flows leaving one node at once get links/k of a tier's bandwidth
    each (None: no limit). ``tier_bandwidth_divisor``: per tier name, the
    over-subscription of that level of the fabric (ABCI's spine is 1:3,
    ParaDL §3.2)."""

    inter_node_links_per_node: int | None = None
    tier_bandwidth_divisor: tuple[tuple[str, float], ...] = ()

    def divisor(self, tier_name: str) -> float:
        return dict(self.tier_bandwidth_divisor).get(tier_name, 1.0)


@dataclasses.dataclass(frozen=True)
class ShardCompute:
    """The framework's cost around a layer's kernels in the oracle's shard
    compute: a fixed ``kernel_fixed_s`` per layer per pass (forward,
    backward-data, backward-weight) that no split divides (Chainer's
    define-by-run cost per function call). How the shard's kernels
    themselves scale is the device's kernel model (``device.kernel``,
    :mod:`costmodels.compute`)."""

    kernel_fixed_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Environment:
    """The ``environment`` section of a hardware file (module docstring)."""

    description: str = ""
    transports: tuple[Transport, ...] = (Transport("nccl", "device"),)
    routes: tuple[tuple[str, Route], ...] = ()  # collective kind -> route; missing kinds: the first transport
    contention: Contention = Contention()
    shard_compute: ShardCompute = ShardCompute()

    def route(self, kind: str) -> tuple[Transport, str]:
        """(transport, all-reduce scheme) of collective ``kind``."""
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}")
        r = dict(self.routes).get(kind)
        if r is None:
            return self.transports[0], default_scheme(kind)
        return next(t for t in self.transports if t.name == r.transport), r.scheme

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"description": self.description,
                             "transports": [t.to_dict() for t in self.transports]}
        collectives = {}
        for kind, r in self.routes:
            collectives[kind] = {"transport": r.transport, **({"scheme": r.scheme} if kind in ALLREDUCE_KINDS else {})}
        d["collectives"] = collectives
        c = self.contention
        d["contention"] = {"inter_node_links_per_node": c.inter_node_links_per_node,
                           "tier_bandwidth_divisor": dict(c.tier_bandwidth_divisor)}
        d["shard_compute"] = dataclasses.asdict(self.shard_compute)
        return d


IDEAL = Environment(description="ParaDL's ideal network: NCCL-style collectives on the tiers, no contention")


# -- formulas ---------------------------------------------------------------------------------


def contended_bandwidth(bandwidth_bytes_per_s, tier_divisor, flows_per_node, links_per_node):
    """Per-flow bandwidth of a tier under contention: bw / over-subscription
    × min(1, links / flows leaving the node at once); links None = no limit
    (ParaDL §3.2: the 1:3 spine; the node's NICs shared by its ranks)."""
    share = 1.0 if links_per_node is None else np.minimum(1.0, links_per_node / np.maximum(flows_per_node, 1.0))
    return bandwidth_bytes_per_s / tier_divisor * share


def host_staged_p2p_s(nbytes, message_latency_s, copy_bandwidth_bytes_per_s, alpha_s=0.0, bandwidth_bytes_per_s=None):
    """One message staged through host memory: the software latency, the
    device -> host copy at the sender and host -> device at the receiver, and,
    between nodes, the network's α + m/bw (no network term inside a node):
    msg + 2m/copy [+ α + m/bw]. Empty messages cost nothing (ParaDL §3.2
    GPUDIRECT=False; §8: halo over MPI)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    net = 0.0 if bandwidth_bytes_per_s is None else alpha_s + nbytes / bandwidth_bytes_per_s
    t = message_latency_s + 2.0 * nbytes / copy_bandwidth_bytes_per_s + net
    return np.where(nbytes > 0, t, 0.0)


def host_staged_allgather_s(n, per_rank_bytes, message_latency_s, copy_bandwidth_bytes_per_s, alpha_s=0.0,
                            bandwidth_bytes_per_s=None):
    """Ring all-gather on host buffers: copy the rank's m to the host, n-1
    ring steps of msg [+ α + m/bw between nodes], copy the n·m result back:
    m/copy + (n-1)(msg [+ α + m/bw]) + n·m/copy (ParaDL §3.1 ring, §4.9
    host-staged spatial all-gather)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    m = np.asarray(per_rank_bytes, dtype=np.float64)
    step = message_latency_s + (0.0 if bandwidth_bytes_per_s is None else alpha_s + m / bandwidth_bytes_per_s)
    t = m / copy_bandwidth_bytes_per_s + (n - 1.0) * step + n * m / copy_bandwidth_bytes_per_s
    return np.where(n > 1.0, t, 0.0)


def host_staged_allreduce_s(n, nbytes, message_latency_s, copy_bandwidth_bytes_per_s, alpha_s=0.0,
                            bandwidth_bytes_per_s=None):
    """Ring all-reduce on host buffers: copy the m-byte buffer to the host,
    2(n-1) ring steps of msg [+ α + (m/n)/bw between nodes], copy it back:
    2m/copy + 2(n-1)(msg [+ α + m/(n·bw)]) (ParaDL §3.1; §4.8 the
    leaders' all-reduce over MPI)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    m = np.asarray(nbytes, dtype=np.float64)
    step = message_latency_s + (0.0 if bandwidth_bytes_per_s is None else alpha_s + m / n / bandwidth_bytes_per_s)
    t = 2.0 * m / copy_bandwidth_bytes_per_s + 2.0 * (n - 1.0) * step
    return np.where(n > 1.0, t, 0.0)


def pipelined_chain_s(n, nbytes, alpha_s, bandwidth_bytes_per_s):
    """Reduce to (or broadcast from) one rank along a pipelined chain of n
    ranks: (n-1)α + m/bw (NCCL's ring reduce / broadcast move each byte once
    per link, NCCL performance notes: algorithm bandwidth = bus bandwidth)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    t = (n - 1.0) * alpha_s + np.asarray(nbytes, dtype=np.float64) / bandwidth_bytes_per_s
    return np.where(n > 1.0, t, 0.0)


def leader_allreduce_s(g, nbytes, intra_alpha_s, intra_bandwidth_bytes_per_s, leaders_s):
    """ChainerMN's hierarchical all-reduce (ParaDL §4.8: "a reduce inside
    each node to a leader GPU first, then a global Allreduce between the
    leaders"), then a broadcast in the node: 2·chain(g, m) + the leaders'
    all-reduce ``leaders_s`` (computed by the caller on its transport)."""
    return 2.0 * pipelined_chain_s(g, nbytes, intra_alpha_s, intra_bandwidth_bytes_per_s) + leaders_s


# -- parsing ------------------------------------------------------------------------------------


def _number(v: Any, where: str, *, low: float = 0.0, high: float = math.inf, example: str = "") -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    if v < low or v > high:
        hint = f"; {example}" if example else ""
        raise ValueError(f"{where} = {v!r} is outside [{low:g}, {high:g}]{hint}")
    return float(check_float32(v, where))


def _fields(d: Any, where: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object with {', '.join([*required, *optional])}")
    missing = [k for k in required if k not in d]
    unknown = sorted(set(d) - set(required) - set(optional))
    if missing or unknown:
        what = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unknown field(s) {', '.join(unknown)}" if unknown else "") if x)
        raise ValueError(f"{where}: {what}; expected {', '.join([*required, *optional])} "
                         "(quantities are SI, with the unit in the name)")
    return d


def environment_from_dict(data: Any, tier_names: Sequence[str], *, source: str = "hardware") -> Environment:
    """Validate and build the ``environment`` section (docs/hardware-format.md);
    ``tier_names``: the hardware's tiers, which contention may name."""
    where = f"{source}: environment"
    top = _fields(data, where, ("transports",), ("description", "collectives", "contention", "shard_compute"))
    if not isinstance(top["transports"], list) or not top["transports"]:
        raise ValueError(f"{where}.transports must be a non-empty list of transports")
    transports: list[Transport] = []
    for i, t in enumerate(top["transports"]):
        w = f"{where}.transports[{i}]"
        t = _fields(t, w, ("name", "staging"), ("message_latency_s", "copy_bandwidth_bytes_per_s"))
        if not isinstance(t["name"], str) or not t["name"]:
            raise ValueError(f"{w}.name must be a non-empty string")
        if t["name"] in {x.name for x in transports}:
            raise ValueError(f"{w}.name {t['name']!r} is given twice; name each transport once")
        if t["staging"] not in STAGINGS:
            raise ValueError(f"{w}.staging must be one of {', '.join(STAGINGS)}, got {t['staging']!r}")
        lat = _number(t.get("message_latency_s", 0.0), f"{w}.message_latency_s", high=0.1,
                      example="give seconds, e.g. 3e-3 for 3 ms")
        copy = t.get("copy_bandwidth_bytes_per_s")
        if t["staging"] == "host":
            if copy is None:
                raise ValueError(f"{w}: a host-staged transport needs copy_bandwidth_bytes_per_s "
                                 "(device <-> host copies, e.g. 16e9 for PCIe Gen3 x16)")
            copy = _number(copy, f"{w}.copy_bandwidth_bytes_per_s", low=1e6, example="give bytes/s, e.g. 16e9")
        elif copy is not None:
            raise ValueError(f"{w}: copy_bandwidth_bytes_per_s is only for staging \"host\"; drop it")
        transports.append(Transport(t["name"], t["staging"], lat, copy))
    names = [t.name for t in transports]
    routes = []
    coll = top.get("collectives", {})
    if not isinstance(coll, dict):
        raise ValueError(f"{where}.collectives must be an object: collective kind -> {{transport, scheme}}")
    for kind, r in coll.items():
        w = f"{where}.collectives.{kind}"
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"{where}.collectives has unknown kind {kind!r}; expected {', '.join(COLLECTIVE_KINDS)}")
        r = _fields(r, w, ("transport",), ("scheme",) if kind in ALLREDUCE_KINDS else ())
        if r["transport"] not in names:
            raise ValueError(f"{w}.transport {r['transport']!r} is not a transport of this file; "
                             f"expected one of {', '.join(names)}")
        scheme = r.get("scheme", default_scheme(kind))
        if scheme not in ALLREDUCE_SCHEMES:
            raise ValueError(f"{w}.scheme must be one of {', '.join(ALLREDUCE_SCHEMES)}, got {scheme!r}")
        routes.append((kind, Route(r["transport"], scheme)))
    c = _fields(top.get("contention", {}), f"{where}.contention", (),
                ("inter_node_links_per_node", "tier_bandwidth_divisor"))
    links = c.get("inter_node_links_per_node")
    if links is not None and (isinstance(links, bool) or not isinstance(links, int) or links < 1):
        raise ValueError(f"{where}.contention.inter_node_links_per_node must be a positive integer or null, "
                         f"got {links!r}")
    div = c.get("tier_bandwidth_divisor", {})
    if not isinstance(div, dict):
        raise ValueError(f"{where}.contention.tier_bandwidth_divisor must be an object: tier name -> divisor ≥ 1")
    for name, v in div.items():
        if name not in tier_names:
            raise ValueError(f"{where}.contention.tier_bandwidth_divisor names tier {name!r}, which this file "
                             f"does not have; expected one of {', '.join(tier_names)}")
        _number(v, f"{where}.contention.tier_bandwidth_divisor.{name}", low=1.0,
                example="the over-subscription, e.g. 3 for 1:3")
    s = _fields(top.get("shard_compute", {}), f"{where}.shard_compute", (), ("kernel_fixed_s",))
    shard = ShardCompute(
        kernel_fixed_s=_number(s.get("kernel_fixed_s", 0.0), f"{where}.shard_compute.kernel_fixed_s", high=0.01,
                               example="give seconds, e.g. 6e-5 for 60 us"),
    )
    desc = top.get("description", "")
    if not isinstance(desc, str):
        raise ValueError(f"{where}.description must be a string")
    return Environment(
        description=desc,
        transports=tuple(transports),
        routes=tuple(routes),
        contention=Contention(links, tuple((k, float(v)) for k, v in div.items())),
        shard_compute=shard,
    )
