"""Reading a plan file back: ``Plan.from_json`` / ``Plan.from_dict``, with a
message naming the first problem. The writer is ``Plan.to_dict``.

Schema ``"shardplan/plan"``, integer ``version``: version 5 is the current
one; it added ``pipeline`` (null, or the stages, micro-batches, schedule and
predicted step of a pipelined plan, :class:`planner.plans.pipeline.Pipeline`,
with ``stage_evaluation``: the devices, mesh, batch, time and memory of its
one-stage evaluation, whose layers are the file's ``layers``; a pipelined
plan's top-level ``mesh`` is ``[S, d, m]`` on axes ``stage, data, model``
and its ``devices``, ``batch``, ``iteration_s`` and
``memory_bytes_per_device`` are the pipelined step's); a file of versions
1-4 reads with no pipeline. Version 4 added ``joins`` to each layer
(recomputed in the run of the layer before, ``remat+join``); a version-3
file reads with no layer joining a run. Version 3 added each layer's memory levers (``zero_stage`` 0-3 and
``remat``, :mod:`costmodels.levers`) and the lever menu searched
(``levers``). A version-2 file reads with no levers (stage 0, activations
kept, menu ``none``). A version-1 file is upgraded on reading: its layers'
PartitionSpecs are derived from their kinds and strategies
(:func:`planner.plans.specs.layer_specs_from_kinds`), the hardware is embedded
from the preset of that name (left out when it names no preset), the
package version reads ``"unknown (plan file version 1)"`` and the search
history is empty. A newer version, another schema, a missing or mistyped
field, a non-finite number or an unknown strategy is rejected.
"""

from __future__ import annotations

import math
from typing import Any

from costmodels import (
    AXIS_NAMES,
    LEVER_CHOICES,
    STRATEGY_NAMES,
    CollectiveRecord,
    hardware_from_dict,
    load_hardware,
    preset_names,
)
from planner.evaluation import LayerCost
from planner.ir.graph import check_on_unsupported
from planner.plans.pipeline import PIPELINE_AXIS_NAMES, STAGE_EVALUATION_KEYS, Pipeline
from planner.plans.specs import LayerSpecs, layer_specs_from_kinds
from search import HistoryEntry

__all__ = ["PLAN_SCHEMA", "PLAN_VERSION", "evaluation_fields", "plan_fields"]

PLAN_SCHEMA = "shardplan/plan"
# 2 added layer specs, the embedded hardware, the package version, the search history;
# 3 the memory levers per layer; 4 a layer joining the run of recomputed layers before it;
# 5 the pipeline (stages, micro-batches, schedule)
PLAN_VERSION = 5


class _Reader:
    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object")
        self.data, self.where = data, where

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise ValueError(f'{self.where} is missing "{key}"')
        return self.data[key]

    def string(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise ValueError(f'{self.where}.{key} must be a string, got {v!r}')
        return v

    def boolean(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise ValueError(f"{self.where}.{key} must be true or false")
        return v

    def integer(self, key: str, minimum: int = 0) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{self.where}.{key} must be an integer >= {minimum}, got {v!r}")
        return v

    def number(self, key: str, optional: bool = False) -> float | None:
        v = self.get(key)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{self.where}.{key} must be a finite number, got {v!r}")
        return float(v) if isinstance(v, float) else v

    def ints(self, key: str, length: int | None = None) -> tuple[int, ...]:
        v = self.get(key)
        if not (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
                and (length is None or len(v) == length)):
            size = f"{length} " if length else ""
            raise ValueError(f"{self.where}.{key} must be a list of {size}positive integers, got {v!r}")
        return tuple(v)

    def items(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise ValueError(f"{self.where}.{key} must be a list")
        return v


def _spec(value: Any, where: str, nullable: bool) -> Any:
    if value is None and nullable:
        return None

    def entry(e: Any) -> Any:
        if e is None or e in AXIS_NAMES:
            return e
        if isinstance(e, list) and e and all(a in AXIS_NAMES for a in e):
            return tuple(e)
        raise ValueError(f'{where} entries must be null, "data", "model" or a list of those, got {e!r}')

    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list (a PartitionSpec){' or null' if nullable else ''}, got {value!r}")
    return tuple(entry(e) for e in value)


def _layer_specs(row: _Reader, i: int, name: str) -> LayerSpecs:
    where = f"plan.layers[{i}]"
    params = row.get("param_specs")
    if not isinstance(params, dict):
        raise ValueError(f"{where}.param_specs must be an object of parameter name -> PartitionSpec")
    return LayerSpecs(
        name=name,
        input_spec=_spec(row.get("input_spec"), f"{where}.input_spec", True),
        output_spec=_spec(row.get("output_spec"), f"{where}.output_spec", True),
        param_specs=tuple((k, _spec(v, f"{where}.param_specs.{k}", False)) for k, v in params.items()),
    )


def plan_fields(data: Any) -> dict[str, Any]:
    """The fields of a ``Plan`` read from a plan file's JSON object (``meshes``
    as dicts of ``MeshResult`` fields; ``Plan.from_dict`` builds the records);
    ``ValueError`` naming the first problem."""
    r = _Reader(data, "plan")
    if r.get("schema") != PLAN_SCHEMA:
        raise ValueError(f'not a plan file: "schema" is {data.get("schema")!r}, expected {PLAN_SCHEMA!r}')
    version = r.integer("version", 1)
    if version > PLAN_VERSION:
        raise ValueError(f"plan version {version} is newer than this shardplan understands ({PLAN_VERSION}); upgrade shardplan")

    layers, specs = _layer_rows(r, version)
    if not layers:
        raise ValueError("plan.layers must not be empty")
    collectives, meshes = _collective_rows(r), _mesh_rows(r, version)
    pipeline, stage = _pipeline(r, version)
    mesh = r.ints("mesh", 2 if pipeline is None else 3)
    devices = r.integer("devices", 1)
    if math.prod(mesh) != devices:
        raise ValueError(f"plan.mesh {'x'.join(map(str, mesh))} does not hold plan.devices = {devices} devices")
    names_expected = AXIS_NAMES if pipeline is None else PIPELINE_AXIS_NAMES
    axis_names = r.get("axis_names")
    if axis_names != list(names_expected):
        raise ValueError(f"plan.axis_names must be {list(names_expected)!r}, got {axis_names!r}")
    names = [x.name for x in layers]
    if len(set(names)) != len(names):
        raise ValueError("plan.layers names must be unique")
    fields = dict(
        model=r.string("model"), hardware=r.string("hardware"), devices=devices, mesh=mesh,
        axis_names=names_expected, batch=r.integer("batch", 1), dtype=r.string("dtype"),
        optimizer=r.string("optimizer"), layers=tuple(layers), collectives=tuple(collectives),
        iteration_s=r.number("iteration_s"), memory_bytes_per_device=r.number("memory_bytes_per_device"),
        memory_capacity_bytes=r.number("memory_capacity_bytes"), memory_limit_bytes=r.number("memory_limit_bytes"),
        data_parallel_iteration_s=r.number("data_parallel_iteration_s", optional=True),
        data_parallel_memory_bytes=r.number("data_parallel_memory_bytes", optional=True),
        speedup_over_data_parallel=r.number("speedup_over_data_parallel", optional=True),
        method=r.string("method"), seed=r.integer("seed"), seconds=r.number("seconds"),
        optimality_gap=r.number("optimality_gap", optional=True), meshes=tuple(meshes),
        graph_fingerprint=r.string("graph_fingerprint"), input_shape=r.ints("input_shape"),
    )
    if pipeline is not None:
        _check_pipeline(pipeline, fields)
        fields.update(stage)  # the evaluation's own: one stage's layers, one micro-batch
    fields["pipeline"] = pipeline
    # The safety margin the search kept below the limit and the platform it was
    # for (docs/validation.md "The memory promise"); files written before them
    # read as planned with no margin.
    fields["memory_margin_bytes"] = r.number("memory_margin_bytes") if "memory_margin_bytes" in r.data else 0.0
    fields["platform"] = r.string("platform") if "platform" in r.data else ""
    # a simpler plan preferred within tolerance records the fastest one (optional: older files have none)
    fields["fastest_iteration_s"] = r.number("fastest_iteration_s", optional=True) if "fastest_iteration_s" in r.data \
        else None
    fm = r.get("fastest_mesh") if "fastest_mesh" in r.data else None
    if fm is not None:
        if not (isinstance(fm, list) and len(fm) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                             and x >= 1 for x in fm)):
            raise ValueError(f"plan.fastest_mesh must be null or [d, m] of positive integers, got {fm!r}")
        fm = tuple(fm)
    fields["fastest_mesh"] = fm
    # what --verify compiled (optional: unverified plans and older files have none)
    fields["compiled_memory_bytes"] = r.number("compiled_memory_bytes", optional=True) \
        if "compiled_memory_bytes" in r.data else None
    fields["verify_rounds"] = r.integer("verify_rounds", 0) if "verify_rounds" in r.data else 0
    fields["verify_seconds"] = r.number("verify_seconds", optional=True) if "verify_seconds" in r.data else None
    # how planner.extract must treat operations it cannot map to reproduce the planned graph
    # (LayerGraph.on_unsupported; optional: older files were all made for "error")
    fields["on_unsupported"] = check_on_unsupported(r.get("on_unsupported") if "on_unsupported" in r.data
                                                    else "error", "plan.on_unsupported")
    fields["levers"] = r.string("levers") if version >= 3 else "none"
    if fields["levers"] not in LEVER_CHOICES:
        raise ValueError(f"plan.levers must be one of {', '.join(LEVER_CHOICES)}, got {fields['levers']!r}")
    if version >= 2:
        hw = r.get("hardware_spec")
        fields["hardware_spec"] = None if hw is None else hardware_from_dict(hw, source="plan.hardware_spec")
        fields["package_version"] = r.string("package_version")
        history = []
        for i, row in enumerate(r.items("history")):
            hr = _Reader(row, f"plan.history[{i}]")
            history.append(HistoryEntry(stage=hr.string("stage"), time_s=hr.number("time_s", optional=True),
                                        memory_bytes=hr.number("memory_bytes", optional=True),
                                        fits=hr.boolean("fits")))
        fields["history"] = tuple(history)
        fields["layer_specs"] = tuple(specs)
    else:  # upgrade a version-1 file
        fields["layer_specs"] = layer_specs_from_kinds(
            [x.name for x in layers], [x.kind for x in layers], [x.strategy for x in layers],
            len(fields["input_shape"]) + 1)
        name = fields["hardware"]
        fields["hardware_spec"] = load_hardware(name) if name in preset_names() else None
        fields["package_version"] = "unknown (plan file version 1)"
        fields["history"] = ()
    return fields


def _pipeline(r: _Reader, version: int) -> tuple[Any, dict[str, Any]]:
    """The plan file's pipeline (None: none, or a file before version 5) and
    the fields of its one-stage evaluation (``pipeline.stage_evaluation``)."""
    value = r.get("pipeline") if version >= 5 else None
    if value is None:
        return None, {}
    if not isinstance(value, dict):
        raise ValueError("plan.pipeline must be an object or null")
    pipeline = _pipeline_record(_Reader(value, "plan.pipeline"))
    sr = _Reader(value.get("stage_evaluation"), "plan.pipeline.stage_evaluation")
    stage = {k: sr.number(k) for k in STAGE_EVALUATION_KEYS if k not in ("devices", "mesh", "batch")}
    stage.update(devices=sr.integer("devices", 1), mesh=sr.ints("mesh", 2), batch=sr.integer("batch", 1))
    if stage["mesh"] != (pipeline.data, pipeline.tensor):
        raise ValueError(f"plan.pipeline.stage_evaluation.mesh {list(stage['mesh'])} is not the stage's "
                         f"data x model sub-mesh [{pipeline.data}, {pipeline.tensor}]")
    return pipeline, stage


def _pipeline_record(r: _Reader) -> Pipeline:
    """The :class:`Pipeline` of a plan file's ``pipeline`` object."""
    ints = {k: r.integer(k, 1) for k in ("stages", "data", "tensor", "chunks", "micro_batch", "microbatches",
                                         "blocks")}
    counts = {k: r.integer(k) for k in ("candidates", "fitting")}
    numbers = {k: r.number(k) for k in ("step_s", "pipeline_s", "bubble_s", "transfer_s", "gradient_sync_s",
                                        "optimizer_s", "state_bytes", "activation_bytes", "peak_bytes")}
    runs = r.items("stage_blocks")
    if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in x) for x in runs):
        raise ValueError(f"plan.pipeline.stage_blocks must be a list of [first, last] block indices, got {runs!r}")
    return Pipeline(**ints, **counts, **numbers, schedule=r.string("schedule"), recompute=r.string("recompute"),
                    sequence_parallel=r.boolean("sequence_parallel"),
                    distributed_optimizer=r.boolean("distributed_optimizer"),
                    stage_blocks=tuple(tuple(x) for x in runs))


def _check_pipeline(pipeline: Any, fields: dict[str, Any]) -> None:
    """A pipelined plan's top-level devices, mesh, batch, time and memory are its pipeline's."""
    mine = dict(devices=pipeline.devices, mesh=pipeline.mesh, batch=pipeline.batch, iteration_s=pipeline.step_s,
                memory_bytes_per_device=pipeline.peak_bytes)
    for key, value in mine.items():
        if fields[key] != value:
            raise ValueError(f"plan.{key} {fields[key]!r} is not its pipeline's ({value!r})")


def _layer_rows(r: _Reader, version: int) -> tuple[list[LayerCost], list]:
    """The plan file's layer rows as :class:`LayerCost` and, from version 2,
    their specs; the fields each version added read where present."""
    layers, specs = [], []
    for i, row in enumerate(r.items("layers")):
        lr = _Reader(row, f"plan.layers[{i}]")
        strategy = lr.string("strategy")
        if strategy not in STRATEGY_NAMES:
            raise ValueError(f"plan.layers[{i}].strategy {strategy!r} is not one of {', '.join(STRATEGY_NAMES)}")
        # Optional (files before them read unchanged): the strategy asked for, where
        # another was costed, and why (planner.evaluate; absent: the one costed).
        requested = row.get("requested_strategy", strategy)
        if requested not in STRATEGY_NAMES:
            raise ValueError(f"plan.layers[{i}].requested_strategy {requested!r} is not one of "
                             f"{', '.join(STRATEGY_NAMES)}")
        reason = row.get("substitution_reason")
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"plan.layers[{i}].substitution_reason must be a string or null, got {reason!r}")
        zero_stage, remat, joins = _levers(lr, i, ("zero_stage", "remat") + (("joins",) if version >= 4 else ())
                                           if version >= 3 else ())
        layers.append(LayerCost(
            name=lr.string("name"), kind=lr.string("kind"), strategy=strategy,
            compute_s=lr.number("compute_s"), comm_s=lr.number("comm_s"), reshard_s=lr.number("reshard_s"),
            memory_bytes=lr.number("memory_bytes"), requested_strategy=requested, substitution_reason=reason,
            zero_stage=zero_stage, remat=remat, joins=joins,
        ))
        if version >= 2:
            specs.append(_layer_specs(lr, i, layers[-1].name))
    return layers, specs


def _levers(lr: _Reader, i: int, keys: tuple[str, ...]) -> tuple[int, bool, bool]:
    """A layer row's memory levers ``(zero_stage, remat, joins)``, each of
    ``keys`` read and type-checked (the others: none)."""
    zero_stage = lr.integer("zero_stage") if "zero_stage" in keys else 0
    if zero_stage > 3:
        raise ValueError(f"plan.layers[{i}].zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    remat = lr.boolean("remat") if "remat" in keys else False
    joins = lr.boolean("joins") if "joins" in keys else False
    if joins and not remat:
        raise ValueError(f"plan.layers[{i}] joins a run of recomputed layers but does not recompute (remat false)")
    return zero_stage, remat, joins


def evaluation_fields(data: Any) -> dict[str, Any]:
    """What ``evaluate --plan`` reads from a JSON object without a ``schema``
    (an ``evaluate --json`` output, or hand-written): ``layers``, each row's
    ``name``, ``strategy`` and, where present, its levers ``zero_stage``,
    ``remat``, ``joins``; and those of ``model``, ``graph_fingerprint``,
    ``hardware``, ``dtype``, ``optimizer`` (strings), ``devices``, ``batch``
    (positive integers), ``mesh`` (``[d, m]``) and ``levers`` it has, all
    type-checked as :func:`plan_fields` checks them, nothing coerced;
    ``layers`` as ``(name, strategy, zero_stage, remat, joins)`` tuples."""
    r = _Reader(data, "plan")
    rows = []
    for i, row in enumerate(r.items("layers")):
        lr = _Reader(row, f"plan.layers[{i}]")
        strategy = lr.string("strategy")
        if strategy not in STRATEGY_NAMES:
            raise ValueError(f"plan.layers[{i}].strategy {strategy!r} is not one of {', '.join(STRATEGY_NAMES)}")
        levers = _levers(lr, i, tuple(k for k in ("zero_stage", "remat", "joins") if k in row))
        rows.append((lr.string("name"), strategy, *levers))
    fields: dict[str, Any] = {"layers": rows}
    for key in ("model", "graph_fingerprint", "hardware", "dtype", "optimizer", "levers"):
        if key in r.data:
            fields[key] = r.string(key)
    for key in ("devices", "batch"):
        if key in r.data:
            fields[key] = r.integer(key, 1)
    if "mesh" in r.data:
        fields["mesh"] = r.ints("mesh", 2)
        if "devices" in fields and math.prod(fields["mesh"]) != fields["devices"]:
            raise ValueError(f"plan.mesh {'x'.join(map(str, fields['mesh']))} does not hold plan.devices = "
                             f"{fields['devices']} devices")
    if fields.get("levers", "none") not in LEVER_CHOICES:
        raise ValueError(f"plan.levers must be one of {', '.join(LEVER_CHOICES)}, got {fields['levers']!r}")
    return fields


def _collective_rows(r: _Reader) -> list[CollectiveRecord]:
    """The plan file's predicted collectives."""
    collectives = []
    for i, row in enumerate(r.items("collectives")):
        cr = _Reader(row, f"plan.collectives[{i}]")
        axes = cr.get("axes")
        if not (isinstance(axes, list) and all(isinstance(a, str) for a in axes)):
            raise ValueError(f"plan.collectives[{i}].axes must be a list of axis names")
        collectives.append(CollectiveRecord(
            kind=cr.string("kind"), axes=tuple(axes), phase=cr.string("phase"), where=cr.string("where"),
            bytes_per_device=cr.number("bytes_per_device"),
        ))
    return collectives


def _mesh_rows(r: _Reader, version: int) -> list[dict[str, Any]]:
    """The plan file's mesh results, as dicts of ``MeshResult`` fields."""
    meshes = []
    for i, row in enumerate(r.items("meshes")):
        mr = _Reader(row, f"plan.meshes[{i}]")
        meshes.append(dict(
            mesh=mr.ints("mesh", 2), feasible=mr.boolean("feasible"), iteration_s=mr.number("iteration_s", optional=True),
            memory_bytes_per_device=mr.number("memory_bytes_per_device"),
            min_memory_bytes=mr.number("min_memory_bytes", optional=version >= 4), method=mr.string("method"),
            optimality_gap=mr.number("optimality_gap", optional=True),
        ))
    return meshes
