"""One plan, several processes: JAX's own multi-process runtime
(``jax.distributed``) runs a plan made for ``P`` devices when those devices
live in several processes (hosts). shardplan adds no runtime of its own; this
module only

* reads the distributed settings from the environment that
  ``python -m planner.launch`` (or a SLURM / Open MPI job) sets, and calls
  :func:`jax.distributed.initialize` with them (:func:`config_from_env`,
  :func:`initialize`);
* builds a ``("data", "model")`` mesh whose model axis stays inside one
  process, a node, and whose data axis runs across processes
  (:func:`process_mesh`), the layout the cost model assumes when it puts
  a collective on the inter-node tier (:func:`collective_tiers`);
* assembles global batches from each process's own rows
  (:func:`process_rows`, :func:`global_batch`);
* writes and reads the sharded training state with Orbax, every process
  writing and reading its own shards (:func:`save_state`,
  :func:`restore_state`).

See docs/multi-host.md for the launcher, cluster settings and failure
handling.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from costmodels import AXIS_NAMES, DATA_AXIS, MODEL_AXIS, CollectiveRecord, Hardware

__all__ = [
    "ENV_COORDINATOR",
    "ENV_DEVICES_PER_PROCESS",
    "ENV_HEARTBEAT_SECONDS",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "CollectiveTier",
    "DistributedConfig",
    "collective_tiers",
    "config_from_env",
    "crosses_processes",
    "global_batch",
    "initialize",
    "process_mesh",
    "process_rows",
    "restore_state",
    "save_state",
]

# Set by ``python -m planner.launch`` in every process it starts.
ENV_COORDINATOR = "SHARDPLAN_COORDINATOR"  # host:port of process 0's coordination service
ENV_NUM_PROCESSES = "SHARDPLAN_NUM_PROCESSES"
ENV_PROCESS_ID = "SHARDPLAN_PROCESS_ID"
ENV_DEVICES_PER_PROCESS = "SHARDPLAN_DEVICES_PER_PROCESS"  # devices each process owns (also read in cluster jobs)
ENV_HEARTBEAT_SECONDS = "SHARDPLAN_HEARTBEAT_SECONDS"

_BATCH_SPEC = P(AXIS_NAMES)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """Arguments for :func:`jax.distributed.initialize`. ``None`` fields are
    left to JAX's cluster detection (SLURM, Open MPI, TPU)."""

    source: str  # "launcher" (planner.launch) or "cluster" (JAX detects SLURM / Open MPI / TPU)
    coordinator_address: str | None  # host:port of process 0
    num_processes: int | None
    process_id: int | None
    devices_per_process: int | None = None  # None: JAX's default (all visible; SLURM/Open MPI GPUs: one per task)
    heartbeat_timeout_seconds: int = 20  # a process silent this long is declared dead, and every other one exits
    initialization_timeout_seconds: int = 120  # how long to wait for every process to join


def _int(environ: Mapping[str, str], key: str, low: int) -> int:
    text = environ[key]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"environment variable {key}={text!r} is not an integer") from None
    if value < low:
        raise ValueError(f"environment variable {key}={text!r} must be at least {low}")
    return value


def config_from_env(environ: Mapping[str, str] | None = None) -> DistributedConfig | None:
    """The distributed settings of this process: from ``planner.launch``'s
    ``SHARDPLAN_*`` variables, else a cluster job JAX can detect itself
    (SLURM with more than one task, Open MPI; ``SHARDPLAN_DEVICES_PER_PROCESS``
    still applies there), else ``None`` (one process)."""
    env = os.environ if environ is None else environ
    heartbeat = _int(env, ENV_HEARTBEAT_SECONDS, 1) if ENV_HEARTBEAT_SECONDS in env else 20
    k = _int(env, ENV_DEVICES_PER_PROCESS, 1) if env.get(ENV_DEVICES_PER_PROCESS) else None
    if ENV_COORDINATOR in env:
        missing = [k for k in (ENV_NUM_PROCESSES, ENV_PROCESS_ID) if k not in env]
        if missing:
            raise ValueError(f"{ENV_COORDINATOR} is set but {', '.join(missing)} is not; start processes with "
                             "python -m planner.launch or set all three")
        n = _int(env, ENV_NUM_PROCESSES, 1)
        i = _int(env, ENV_PROCESS_ID, 0)
        if i >= n:
            raise ValueError(f"{ENV_PROCESS_ID}={i} must be below {ENV_NUM_PROCESSES}={n}")
        return DistributedConfig("launcher", env[ENV_COORDINATOR], n, i, k, heartbeat)
    slurm = "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1
    ompi = "OMPI_COMM_WORLD_SIZE" in env and int(env["OMPI_COMM_WORLD_SIZE"] or 1) > 1
    if slurm or ompi:
        return DistributedConfig("cluster", None, None, None, k, heartbeat)
    return None


def initialize(config: DistributedConfig | None = None) -> DistributedConfig | None:
    """Join the multi-process run described by ``config`` (default:
    :func:`config_from_env`); a no-op returning ``None`` for one process.
    Call before any other JAX operation. With ``devices_per_process = K``,
    each process owns its first ``K`` accelerators (``local_device_ids``; on
    SLURM, JAX would otherwise give each task one GPU) or, on CPU, ``K`` XLA
    CPU devices. CPU collectives across processes use gloo (jax-notes.md §5)."""
    if config is None:
        config = config_from_env()
    if config is None:
        return None
    local = None
    if config.devices_per_process is not None:
        jax.config.update("jax_num_cpu_devices", config.devices_per_process)  # the CPU backend only
        local = list(range(config.devices_per_process))  # accelerators: jax_cuda_visible_devices
    # Cross-process collectives between CPU devices go through gloo; other backends ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        local_device_ids=local,
        initialization_timeout=config.initialization_timeout_seconds,
        heartbeat_timeout_seconds=config.heartbeat_timeout_seconds,
    )
    return config


def process_mesh(d: int, m: int, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``d x m`` ``("data", "model")`` mesh with Auto axes over ``devices``
    (default: every process's devices) whose model axis stays inside one
    process: devices ordered by (process, id), ``m`` consecutive ones per row.
    Processes then hold whole rows, so the data axis is the one that crosses
    processes. Raises ``ValueError`` if a model group would span processes.
    (The one mesh builder, :func:`planner.runtime.export.make_mesh`, with
    ``by_process=True``.)"""
    from planner.runtime.export import make_mesh

    return make_mesh(d, m, devices, by_process=True)


def crosses_processes(groups: Sequence[Sequence[int]], mesh: Mesh) -> bool:
    """Whether a collective over ``groups`` of logical device ids (positions in
    ``mesh``'s flattened device order, as :func:`planner.runtime.hlo.parse_collectives`
    gives them) joins devices of different processes."""
    flat = mesh.devices.reshape(-1)
    return any(len({flat[i].process_index for i in g}) > 1 for g in groups)


@dataclasses.dataclass(frozen=True)
class CollectiveTier:
    """Where a planned collective runs on a process mesh (:func:`process_mesh`)."""

    collective: CollectiveRecord
    ranks: int  # devices taking part in one group
    crosses_processes: bool  # the group spans nodes (processes)
    tier: str  # the hardware's network tier that the cost model charges for it


def collective_tiers(plan: Any, hardware: Hardware) -> tuple[CollectiveTier, ...]:
    """Each collective of ``plan`` (a :class:`~planner.Plan`) with its group size,
    whether it crosses processes when the plan's mesh is a :func:`process_mesh`
    with ``hardware.devices_per_node`` devices per process, and the tier the
    network model puts it on (``Hardware.tier_for``, ParaDL §3.2)."""
    d, m = (int(x) for x in plan.mesh)
    dpn = hardware.devices_per_node
    rows_per_process = max(1, dpn // m)  # whole model groups per process (costmodels/table.py)
    out = []
    for c in plan.collectives:
        if c.axes == (MODEL_AXIS,):
            ranks, crosses = m, m > dpn
        elif c.axes == (DATA_AXIS,):
            ranks, crosses = d, d > rows_per_process or m > dpn
        elif set(c.axes) == set(AXIS_NAMES):
            ranks, crosses = d * m, d * m > dpn
        else:
            raise ValueError(f"collective over unknown mesh axes {c.axes}; expected 'data' and/or 'model'")
        out.append(CollectiveTier(c, ranks, crosses, hardware.tier_for(max(ranks, 1), crosses).name))
    return tuple(out)


def process_rows(global_rows: int, mesh: Mesh, spec: P = _BATCH_SPEC) -> slice:
    """The rows of a global batch of ``global_rows`` that this process feeds
    when the batch dim is laid out by ``spec`` (default: over both axes, as
    :func:`planner.shard`'s step expects). Contiguous on a
    :func:`process_mesh`."""
    sharding = NamedSharding(mesh, spec)
    index = sharding.addressable_devices_indices_map((global_rows,))
    starts = sorted({(ix[0].start or 0, global_rows if ix[0].stop is None else ix[0].stop) for ix in index.values()})
    lo, hi = starts[0][0], starts[-1][1]
    covered = sum(b - a for a, b in starts)
    if covered != hi - lo:
        raise ValueError(f"this process's rows of a batch of {global_rows} are not contiguous on this mesh; "
                         "build the mesh with planner.runtime.distributed.process_mesh")
    return slice(lo, hi)


def global_batch(local: Any, mesh: Mesh, spec: P = _BATCH_SPEC) -> jax.Array:
    """A global array from this process's rows ``local`` (a numpy or host
    array holding ``process_rows(...)`` of the batch), laid out by ``spec``
    (``jax.make_array_from_process_local_data``). Every process calls it with
    its own rows; the global batch is ``processes x`` the local one."""
    local = np.asarray(local)
    if local.ndim == 0:
        raise ValueError("a batch needs a leading batch dim; got a scalar")
    sharding = NamedSharding(mesh, spec)
    share = len(sharding.addressable_devices) / len(mesh.devices.reshape(-1))
    rows = round(local.shape[0] / share)
    return jax.make_array_from_process_local_data(sharding, local, (rows, *local.shape[1:]))


def _abstract(tree: Any) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree.map(one, tree)


def save_state(directory: str | Path, state: Any, *, overwrite: bool = False) -> Path:
    """Write a sharded training state (any pytree of ``jax.Array`` s, e.g.
    :class:`planner.runtime.export.TrainState`) to ``directory`` with Orbax; every
    process writes its own shards. All processes must call it with the same
    path on a file system they share. Returns the absolute path."""
    import orbax.checkpoint as ocp

    path = Path(directory).absolute()
    if path.exists() and not overwrite:
        raise ValueError(f"checkpoint directory {str(path)!r} exists; pass overwrite=True or choose a new path")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, state, force=overwrite)
        ckptr.wait_until_finished()
    return path


def restore_state(directory: str | Path, like: Any) -> Any:
    """Read a state written by :func:`save_state` into the structure, shapes,
    dtypes and shardings of ``like`` (a state of ``jax.Array`` s, e.g. the
    initial state from :func:`planner.shard`, or ``jax.ShapeDtypeStruct`` s with
    shardings); every process reads its own shards. The mesh may differ from
    the one that saved it."""
    import orbax.checkpoint as ocp

    path = Path(directory).absolute()
    if not path.is_dir():
        raise ValueError(f"no checkpoint at {str(path)!r}")
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, _abstract(like))
