"""``Plan``: a per-layer sharding plan and its predicted costs, as plain
data (the record :func:`planner.plan` returns and plan files hold;
:mod:`planner.plans.file` reads the file), and ``MeshResult``, the best plan
found on one mesh shape."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from costmodels import CollectiveRecord, Hardware, parse_json, read_json, write_atomic
from planner.evaluation import Evaluation, LayerCost
from planner.plans.file import PLAN_SCHEMA, PLAN_VERSION, plan_fields  # the file format
from planner.plans.pipeline import STAGE_EVALUATION_KEYS, Pipeline
from planner.plans.specs import (
    LayerSpecs,
    fsdp_layers,
    partition_specs,
    shardings,
    to_partition_spec,
)
from planner.usage import json_text
from search import HistoryEntry

__all__ = ["MeshResult", "Plan"]


@dataclasses.dataclass(frozen=True)
class MeshResult:
    """The best plan found on one mesh shape."""

    mesh: tuple[int, int]
    feasible: bool
    iteration_s: float | None  # None when nothing fits on this mesh
    memory_bytes_per_device: float
    min_memory_bytes: float | None  # the smallest memory any plan needs on this mesh (None: not computed,
    #   search.Solution.min_memory_bytes)
    method: str
    optimality_gap: float | None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "mesh": list(self.mesh)}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A per-layer sharding plan (plain data): its predicted costs, the
    :class:`~planner.evaluation.Evaluation` of its strategies on its mesh
    (``model``, ``mesh``, ``layers``, ``iteration_s``, ... read through to
    it), and what the search knew and did.

    A pipelined plan (``pipeline`` set, :class:`~planner.plans.pipeline.Pipeline`)
    runs on a ``stage x data x model`` mesh: ``devices``, ``mesh``, ``batch``,
    ``iteration_s`` and ``memory_bytes_per_device`` are the pipelined step's
    (the pipeline's), and ``evaluation`` is the per-layer plan of one stage's
    layers (one block, the embedding, the output layer) for one micro-batch
    on the ``data x model`` sub-mesh (the Pipeline docstring says exactly
    what it costs)."""

    evaluation: Evaluation  # the plan's costs: model, mesh, batch, per-layer strategies and costs, collectives
    axis_names: tuple[str, ...]  # ("data", "model"); ("stage", "data", "model") for a pipelined plan
    memory_limit_bytes: float
    data_parallel_iteration_s: float | None  # pure data parallelism on all devices (None if the batch does not split)
    data_parallel_memory_bytes: float | None
    speedup_over_data_parallel: float | None
    method: str  # the method that produced the plan
    seed: int
    seconds: float  # search wall time
    optimality_gap: float | None  # relative, when an exact bound is known (0 = optimal)
    meshes: tuple[MeshResult, ...]  # every mesh shape searched
    graph_fingerprint: str = ""  # LayerGraph.fingerprint of the model the plan was made for
    input_shape: tuple[int, ...] = ()  # per sample, channels first
    layer_specs: tuple[LayerSpecs, ...] = ()  # PartitionSpecs of each layer's parameters and activations
    hardware_spec: Hardware | None = None  # the hardware description used (None: a version-1 file of a non-preset)
    package_version: str = ""  # shardplan's version that made the plan
    history: tuple[HistoryEntry, ...] = ()  # the winning mesh's search steps (shardplan plot --history)
    memory_margin_bytes: float = 0.0  # of memory_limit_bytes, kept free by the search (MEMORY_MARGIN + input batch)
    platform: str = ""  # the XLA platform the margin is for ("": planned before margins)
    # set when a simpler plan was preferred (SIMPLER_PLAN_TOLERANCE): the fastest plan found, which it is within
    fastest_iteration_s: float | None = None
    fastest_mesh: tuple[int, int] | None = None
    # "replicate": the model's graph keeps unsupported operations as replicated layers
    # (LayerGraph.on_unsupported), so shard and validate extract the model that way too
    on_unsupported: str = "error"
    levers: str = "none"  # the lever menu searched (costmodels.LEVER_CHOICES; "none" before version 3)
    pipeline: Pipeline | None = None  # stages and micro-batches (None: one stage, the whole batch in one pass)
    # verified (planner.verification): XLA's memory per device of the plan's compiled step, the compiles it took
    compiled_memory_bytes: float | None = None
    verify_rounds: int = 0
    verify_seconds: float | None = None  # the rounds' wall time, searches and compiles

    # -- the evaluation's fields, read through -------------------------------------------

    @property
    def model(self) -> str:
        return self.evaluation.model

    @property
    def hardware(self) -> str:
        return self.evaluation.hardware

    @property
    def devices(self) -> int:
        return self.evaluation.devices if self.pipeline is None else self.pipeline.devices

    @property
    def mesh(self) -> tuple[int, ...]:  # (d, m); (S, d, m) for a pipelined plan
        return self.evaluation.mesh if self.pipeline is None else self.pipeline.mesh

    @property
    def batch(self) -> int:  # global
        return self.evaluation.batch if self.pipeline is None else self.pipeline.batch

    @property
    def dtype(self) -> str:
        return self.evaluation.dtype

    @property
    def optimizer(self) -> str:
        return self.evaluation.optimizer

    @property
    def layers(self) -> tuple[LayerCost, ...]:  # name, kind, strategy and predicted costs per layer
        return self.evaluation.layers

    @property
    def collectives(self) -> tuple[CollectiveRecord, ...]:
        return self.evaluation.collectives

    @property
    def iteration_s(self) -> float:  # predicted seconds per iteration (a pipelined plan's: its step)
        return self.evaluation.iteration_s if self.pipeline is None else self.pipeline.step_s

    @property
    def memory_bytes_per_device(self) -> float:  # a pipelined plan's: its largest stage's peak
        return self.evaluation.memory_bytes_per_device if self.pipeline is None else self.pipeline.peak_bytes

    @property
    def memory_capacity_bytes(self) -> float:
        return self.evaluation.memory_capacity_bytes

    @property
    def strategies(self) -> dict[str, str]:
        """Layer name -> strategy name."""
        return {r.name: r.strategy for r in self.layers}

    @property
    def zero_stages(self) -> dict[str, int]:
        """Layer name -> ZeRO stage (1-3), for the layers that shard their state."""
        return self.evaluation.zero_stages

    @property
    def remat_layers(self) -> tuple[str, ...]:
        """The layers whose activations the backward pass recomputes."""
        return tuple(r.name for r in self.layers if r.remat)

    @property
    def recompute_runs(self) -> tuple[tuple[str, ...], ...]:
        """The runs of recomputed layers, in layer order: each a ``remat``
        layer and the ``remat+join`` layers right after it (a layer joining
        after one that keeps its activations, or first, starts a run:
        :mod:`costmodels.levers`)."""
        runs: list[list[str]] = []
        before = False  # the layer before recomputes
        for r in self.layers:
            if r.remat and r.joins and before:
                runs[-1].append(r.name)
            elif r.remat:
                runs.append([r.name])
            before = r.remat
        return tuple(tuple(run) for run in runs)

    def partition_specs(self, params: Any) -> Any:
        """PartitionSpecs for a Flax nnx ``State`` or linen params tree, from each
        parameter's layer strategy (:func:`planner.plans.specs.partition_specs`),
        split over the data-parallel group as well for the layers on ZeRO stage 3."""
        return partition_specs(params, self.strategies, fsdp_layers(self.zero_stages))

    def shardings(self, params: Any, mesh: Any) -> Any:
        """NamedShardings for ``params`` on ``mesh`` (a ``("data", "model")`` mesh)."""
        return shardings(params, self.strategies, mesh, fsdp_layers(self.zero_stages))

    def activation_specs(self) -> dict[str, tuple[Any, Any]]:
        """Layer name -> (input, output) ``PartitionSpec`` (None: XLA decides)."""
        return {s.name: (to_partition_spec(s.input_spec), to_partition_spec(s.output_spec)) for s in self.layer_specs}

    @property
    def fits_memory(self) -> bool:
        return self.memory_bytes_per_device <= self.memory_capacity_bytes

    def summary(self, full: bool = False) -> str:
        """The per-layer table as plain text: strategy, predicted seconds and
        bytes per device, and the layer's activation specs; over 40 layers
        runs of alike data-parallel layers are one row each unless ``full``
        (as ``shardplan plan`` prints them). A pipelined plan: its step, one
        row per stage, and one block's strategies
        (:func:`planner.plans.summary.pipeline_summary`)."""
        from planner.plans.summary import pipeline_summary, plan_summary

        return plan_summary(self, full) if self.pipeline is None else pipeline_summary(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the keys of ``shardplan evaluate --json`` plus the search's.
        A pipelined plan's ``devices``, ``mesh``, ``batch``, ``iteration_s`` and
        ``memory_bytes_per_device`` are the plan's; its stage evaluation's are
        under ``pipeline.stage_evaluation``."""
        ev = self.evaluation.to_dict()  # model, mesh, batch, costs, layers and collectives: the evaluate --json keys
        layers, collectives = ev.pop("layers"), ev.pop("collectives")
        pipeline = None
        if self.pipeline is not None:
            pipeline = {**self.pipeline.to_dict(), "stage_evaluation": {k: ev[k] for k in STAGE_EVALUATION_KEYS}}
            ev.update(devices=self.devices, mesh=list(self.mesh), batch=self.batch, iteration_s=self.iteration_s,
                      memory_bytes_per_device=self.memory_bytes_per_device)
        specs = self.layer_specs or (None,) * len(layers)
        return {
            "schema": PLAN_SCHEMA,
            "version": PLAN_VERSION,
            **ev,
            "axis_names": list(self.axis_names),
            "memory_limit_bytes": self.memory_limit_bytes,
            "memory_margin_bytes": self.memory_margin_bytes,
            "platform": self.platform,
            "fastest_iteration_s": self.fastest_iteration_s,
            "fastest_mesh": None if self.fastest_mesh is None else list(self.fastest_mesh),
            "on_unsupported": self.on_unsupported,
            "levers": self.levers,
            "data_parallel_iteration_s": self.data_parallel_iteration_s,
            "data_parallel_memory_bytes": self.data_parallel_memory_bytes,
            "speedup_over_data_parallel": self.speedup_over_data_parallel,
            "method": self.method,
            "seed": self.seed,
            "seconds": self.seconds,
            "optimality_gap": self.optimality_gap,
            "graph_fingerprint": self.graph_fingerprint,
            "input_shape": list(self.input_shape),
            "package_version": self.package_version,
            "hardware_spec": None if self.hardware_spec is None else self.hardware_spec.to_dict(),
            "layers": [{**row, **(s.to_dict() if s is not None else {})} for row, s in zip(layers, specs, strict=True)],
            "collectives": collectives,
            "meshes": [m.to_dict() for m in self.meshes],
            "history": [dataclasses.asdict(h) for h in self.history],
            "pipeline": pipeline,
            "compiled_memory_bytes": self.compiled_memory_bytes,
            "verify_rounds": self.verify_rounds,
            "verify_seconds": self.verify_seconds,
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json_text(self.to_dict(), indent=indent, what=f"the plan of {self.model!r}")

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """A plan from its ``to_dict`` form; rejects other schemas, newer versions
        and malformed fields with a message naming the problem."""
        fields = plan_fields(data)
        fields["meshes"] = tuple(MeshResult(**m) for m in fields["meshes"])
        costs = {f.name: fields.pop(f.name) for f in dataclasses.fields(Evaluation) if f.name in fields}
        fields["evaluation"] = Evaluation(**costs)
        if set(fields) != {f.name for f in dataclasses.fields(cls)}:  # the writer and the reader agree
            raise RuntimeError(f"internal error: plan file fields {sorted(fields)} are not Plan's")
        return cls(**fields)

    @classmethod
    def from_json(cls, text: str, source: str = "plan file") -> Plan:
        return cls.from_dict(parse_json(text, source))

    @classmethod
    def read(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_json(path, "plan file (shardplan plan -o)"))

    def write(self, path: str | Path) -> None:
        """Write the plan file atomically (costmodels/files.py): a kill or a
        full disk mid-write leaves the previous file whole."""
        write_atomic(path, self.to_json() + "\n")
