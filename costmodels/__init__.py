"""Cost models: hardware specs and per-layer compute, communication, memory
and resharding costs of every sharding, as jitted JAX functions; measured
shard times (:mod:`costmodels.calibration`) and ParaDL's whole-model oracle
(:mod:`costmodels.oracle`).

``costmodels`` reads a model's layer arrays (:class:`LayerArrays`, as a
:class:`LayerTable` such as ``planner.LayerGraph``), produces a
:class:`CostTable`, and imports neither ``search`` nor ``planner``.

``__all__`` is the contract: ``search`` and ``planner`` import every name
they use from here, never from the modules inside. Each name loads its
module on first use (``_LAZY``, read from the ``TYPE_CHECKING`` imports), so
``import costmodels`` pays
for neither JAX nor NumPy; type checkers and IDEs see the names through the
``TYPE_CHECKING`` imports below."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from costmodels.calibration._applicable import check_calibration
    from costmodels.calibration._file import MAX_WORK_POINTS, Calibration, check_hardware, load_calibration
    from costmodels.calibration._keys import LayerDims, OpKey, ShapePoint, ShardDims, graph_op_keys
    from costmodels.calibration._lookup import CalibrationArrays, calibration_arrays
    from costmodels.collective_list import CollectiveRecord, auxiliary_collectives, plan_collectives, sharded_parameters
    from costmodels.collectives import MAX_TIERS
    from costmodels.compute import HardwareArrays, hardware_arrays
    from costmodels.evaluate import expected_time, iteration_time, memory_per_device, one_hot, reshard_per_edge
    from costmodels.files import MAX_INPUT_BYTES, check_not_input, check_writable, parse_json, read_input, read_json
    from costmodels.files import write_atomic
    from costmodels.hardware import (
        HARDWARE_SCHEMA,
        HARDWARE_VERSION,
        MAX_DEVICES,
        OP_CLASSES,
        Device,
        Hardware,
        NetworkTier,
        hardware_from_dict,
        load_hardware,
        preset_names,
    )
    from costmodels.layers import (
        ATTENTION_KINDS,
        CHANNELWISE_KINDS,
        LAYER_FIELDS,
        LAYER_TYPES,
        MAX_SPATIAL_DIMS,
        MIN_BUCKET,
        VECTOR_FIELDS,
        LayerArrays,
        LayerKind,
        LayerTable,
        bucket_size,
        key_value_heads,
        kind_name,
        layer_type,
        tied_output,
        token_lookups,
    )
    from costmodels.levers import (
        LEVER_CHOICES,
        Lever,
        lever_menu,
        levers_per_strategy,
        menu_covering,
        menu_of,
        option_index,
        option_name,
        option_recomputing,
        option_strategy,
        parse_option,
        strategy_probs,
        with_lever,
    )
    from costmodels.oracle._cost import StrategyCost
    from costmodels.oracle._layers import MASK_FAMILIES, OracleLayers, oracle_calibration, oracle_layers
    from costmodels.oracle._masks import lc_family, load_lc, parse_lc
    from costmodels.oracle._table import oracle_context, oracle_table, parse_strategies
    from costmodels.pipeline import (
        NUM_SEGMENTS,
        RECOMPUTE_NAMES,
        SCHEDULE_NAMES,
        ChainConfig,
        ChainCost,
        ChainShape,
        PipelineStep,
        Recompute,
        Schedule,
        Segment,
        SegmentCosts,
        StageCosts,
        StateBytes,
        boundary_crosses_nodes,
        bubble_fraction,
        chain_cost,
        first_stage_activation_bytes,
        in_flight_microbatches,
        last_stage_activation_bytes,
        layer_activation_bytes,
        megatron_options,
        parse_recompute,
        parse_schedule,
        pipeline_step_s,
        segment_costs,
        stage_memory_bytes,
        state_bytes,
        step_slots,
    )
    from costmodels.shards import ShardShapes, shard_shapes
    from costmodels.strategies import (
        AXIS_NAMES,
        DATA_AXIS,
        MODEL_AXIS,
        NUM_STRATEGIES,
        STRATEGY_NAMES,
        Layout,
        Strategy,
        io_layout_names,
        parse_strategy,
        strategy_mask,
    )
    from costmodels.table import OPTIMIZER_SLOTS, CostSettings, CostTable, cost_table
    from costmodels.xla_cpu import LOCAL_GRADIENT_STRATEGIES, MEASURED_JAXLIB, XlaCpuBuffers, schedule_note
    from costmodels.xla_cpu_schedule import scheduled_memory_per_device

__all__ = [
    "ATTENTION_KINDS",
    "AXIS_NAMES",
    "CHANNELWISE_KINDS",
    "DATA_AXIS",
    "HARDWARE_SCHEMA",
    "HARDWARE_VERSION",
    "LAYER_FIELDS",
    "LAYER_TYPES",
    "LEVER_CHOICES",
    "MASK_FAMILIES",
    "MAX_DEVICES",
    "MAX_INPUT_BYTES",
    "MAX_SPATIAL_DIMS",
    "MAX_TIERS",
    "MAX_WORK_POINTS",
    "LOCAL_GRADIENT_STRATEGIES",
    "MEASURED_JAXLIB",
    "MIN_BUCKET",
    "MODEL_AXIS",
    "NUM_SEGMENTS",
    "NUM_STRATEGIES",
    "OPTIMIZER_SLOTS",
    "OP_CLASSES",
    "RECOMPUTE_NAMES",
    "SCHEDULE_NAMES",
    "STRATEGY_NAMES",
    "VECTOR_FIELDS",
    "Calibration",
    "CalibrationArrays",
    "ChainConfig",
    "ChainCost",
    "ChainShape",
    "CollectiveRecord",
    "CostSettings",
    "CostTable",
    "Device",
    "Hardware",
    "HardwareArrays",
    "LayerArrays",
    "LayerDims",
    "LayerKind",
    "LayerTable",
    "Layout",
    "Lever",
    "NetworkTier",
    "OpKey",
    "OracleLayers",
    "PipelineStep",
    "Recompute",
    "Schedule",
    "Segment",
    "SegmentCosts",
    "ShapePoint",
    "ShardDims",
    "ShardShapes",
    "StageCosts",
    "StateBytes",
    "Strategy",
    "StrategyCost",
    "XlaCpuBuffers",
    "auxiliary_collectives",
    "boundary_crosses_nodes",
    "bubble_fraction",
    "bucket_size",
    "calibration_arrays",
    "chain_cost",
    "check_calibration", "check_hardware",
    "check_not_input",
    "check_writable",
    "cost_table",
    "expected_time",
    "first_stage_activation_bytes",
    "graph_op_keys",
    "hardware_arrays",
    "hardware_from_dict",
    "in_flight_microbatches",
    "io_layout_names",
    "iteration_time",
    "key_value_heads",
    "kind_name",
    "last_stage_activation_bytes",
    "layer_activation_bytes",
    "layer_type",
    "lc_family",
    "lever_menu",
    "levers_per_strategy",
    "load_calibration",
    "load_hardware",
    "load_lc",
    "megatron_options",
    "memory_per_device",
    "menu_covering",
    "menu_of",
    "one_hot",
    "option_index",
    "option_name",
    "option_recomputing",
    "option_strategy",
    "oracle_calibration",
    "oracle_context",
    "oracle_layers",
    "oracle_table",
    "parse_json",
    "parse_lc",
    "parse_option",
    "parse_recompute",
    "parse_schedule",
    "parse_strategies",
    "parse_strategy",
    "pipeline_step_s",
    "plan_collectives",
    "preset_names",
    "read_input",
    "read_json",
    "reshard_per_edge",
    "schedule_note",
    "scheduled_memory_per_device",
    "segment_costs",
    "shard_shapes",
    "sharded_parameters",
    "stage_memory_bytes",
    "state_bytes",
    "step_slots",
    "strategy_mask",
    "strategy_probs",
    "tied_output",
    "token_lookups",
    "with_lever",
    "write_atomic",
]

def _lazy_map() -> dict[str, str]:
    """Public name -> the module that defines it, read once from the
    ``TYPE_CHECKING`` imports above (the one list of them)."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    return {a.asname or a.name: imp.module for imp in block.body for a in imp.names}


def __getattr__(name: str) -> Any:
    if name == "_LAZY":  # the map, built on first use
        value: Any = _lazy_map()
    else:
        module = (globals().get("_LAZY") or __getattr__("_LAZY")).get(name)
        if module is None:
            raise AttributeError(f"module 'costmodels' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
