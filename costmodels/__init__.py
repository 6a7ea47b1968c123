"""Cost models: hardware specs and per-layer compute, communication, memory
and resharding costs of every sharding, as jitted JAX functions; measured
shard times (:mod:`costmodels.calibration`) and ParaDL's whole-model oracle
(:mod:`costmodels.oracle`).

``costmodels`` reads a model's layer arrays (:class:`LayerArrays`, as a
:class:`LayerTable` such as ``planner.LayerGraph``), produces a
:class:`CostTable`, and imports neither ``search`` nor ``planner``.

``__all__`` is the contract: ``search`` and ``planner`` import every name
they use from here, never from the modules inside. Each name loads its
module on first use (``_LAZY`` says which), so ``import costmodels`` pays
for neither JAX nor NumPy; type checkers and IDEs see the names through the
``TYPE_CHECKING`` imports below."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from costmodels.calibration._file import MAX_WORK_POINTS, Calibration, check_hardware, load_calibration
    from costmodels.calibration._keys import LayerDims, OpKey, ShapePoint, ShardDims, graph_op_keys
    from costmodels.calibration._lookup import CalibrationArrays, calibration_arrays
    from costmodels.collective_list import CollectiveRecord, auxiliary_collectives, plan_collectives, sharded_parameters
    from costmodels.collectives import MAX_TIERS
    from costmodels.compute import HardwareArrays, hardware_arrays
    from costmodels.evaluate import expected_time, iteration_time, memory_per_device, one_hot, reshard_per_edge
    from costmodels.files import check_writable, parse_json, read_json, write_atomic
    from costmodels.hardware import (
        HARDWARE_SCHEMA,
        HARDWARE_VERSION,
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
    from costmodels.xla_cpu import XlaCpuBuffers, scheduled_memory_per_device

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
    "MAX_SPATIAL_DIMS",
    "MAX_TIERS",
    "MAX_WORK_POINTS",
    "MIN_BUCKET",
    "MODEL_AXIS",
    "NUM_STRATEGIES",
    "OPTIMIZER_SLOTS",
    "OP_CLASSES",
    "STRATEGY_NAMES",
    "VECTOR_FIELDS",
    "Calibration",
    "CalibrationArrays",
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
    "ShapePoint",
    "ShardDims",
    "ShardShapes",
    "Strategy",
    "StrategyCost",
    "XlaCpuBuffers",
    "auxiliary_collectives",
    "bucket_size",
    "calibration_arrays",
    "check_hardware",
    "check_writable",
    "cost_table",
    "expected_time",
    "graph_op_keys",
    "hardware_arrays",
    "hardware_from_dict",
    "io_layout_names",
    "iteration_time",
    "key_value_heads",
    "kind_name",
    "layer_type",
    "lc_family",
    "lever_menu",
    "levers_per_strategy",
    "load_calibration",
    "load_hardware",
    "load_lc",
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
    "parse_strategies",
    "parse_strategy",
    "plan_collectives",
    "preset_names",
    "read_json",
    "reshard_per_edge",
    "scheduled_memory_per_device",
    "shard_shapes",
    "sharded_parameters",
    "strategy_mask",
    "strategy_probs",
    "tied_output",
    "token_lookups",
    "with_lever",
    "write_atomic",
]

_LAZY = {  # public name -> the module that defines it, imported on first use
    "MAX_WORK_POINTS": "costmodels.calibration._file",
    "Calibration": "costmodels.calibration._file",
    "check_hardware": "costmodels.calibration._file",
    "load_calibration": "costmodels.calibration._file",
    "LayerDims": "costmodels.calibration._keys",
    "OpKey": "costmodels.calibration._keys",
    "ShapePoint": "costmodels.calibration._keys",
    "ShardDims": "costmodels.calibration._keys",
    "graph_op_keys": "costmodels.calibration._keys",
    "CalibrationArrays": "costmodels.calibration._lookup",
    "calibration_arrays": "costmodels.calibration._lookup",
    "CollectiveRecord": "costmodels.collective_list",
    "auxiliary_collectives": "costmodels.collective_list",
    "plan_collectives": "costmodels.collective_list",
    "sharded_parameters": "costmodels.collective_list",
    "MAX_TIERS": "costmodels.collectives",
    "HardwareArrays": "costmodels.compute",
    "hardware_arrays": "costmodels.compute",
    "expected_time": "costmodels.evaluate",
    "iteration_time": "costmodels.evaluate",
    "memory_per_device": "costmodels.evaluate",
    "one_hot": "costmodels.evaluate",
    "reshard_per_edge": "costmodels.evaluate",
    "check_writable": "costmodels.files",
    "parse_json": "costmodels.files",
    "read_json": "costmodels.files",
    "write_atomic": "costmodels.files",
    "HARDWARE_SCHEMA": "costmodels.hardware",
    "HARDWARE_VERSION": "costmodels.hardware",
    "OP_CLASSES": "costmodels.hardware",
    "Device": "costmodels.hardware",
    "Hardware": "costmodels.hardware",
    "NetworkTier": "costmodels.hardware",
    "hardware_from_dict": "costmodels.hardware",
    "load_hardware": "costmodels.hardware",
    "preset_names": "costmodels.hardware",
    "ATTENTION_KINDS": "costmodels.layers",
    "CHANNELWISE_KINDS": "costmodels.layers",
    "LAYER_FIELDS": "costmodels.layers",
    "LAYER_TYPES": "costmodels.layers",
    "MAX_SPATIAL_DIMS": "costmodels.layers",
    "MIN_BUCKET": "costmodels.layers",
    "VECTOR_FIELDS": "costmodels.layers",
    "LayerArrays": "costmodels.layers",
    "LayerKind": "costmodels.layers",
    "LayerTable": "costmodels.layers",
    "bucket_size": "costmodels.layers",
    "key_value_heads": "costmodels.layers",
    "kind_name": "costmodels.layers",
    "layer_type": "costmodels.layers",
    "tied_output": "costmodels.layers",
    "token_lookups": "costmodels.layers",
    "LEVER_CHOICES": "costmodels.levers",
    "Lever": "costmodels.levers",
    "lever_menu": "costmodels.levers",
    "levers_per_strategy": "costmodels.levers",
    "menu_covering": "costmodels.levers",
    "menu_of": "costmodels.levers",
    "option_index": "costmodels.levers",
    "option_name": "costmodels.levers",
    "option_recomputing": "costmodels.levers",
    "option_strategy": "costmodels.levers",
    "parse_option": "costmodels.levers",
    "strategy_probs": "costmodels.levers",
    "with_lever": "costmodels.levers",
    "StrategyCost": "costmodels.oracle._cost",
    "MASK_FAMILIES": "costmodels.oracle._layers",
    "OracleLayers": "costmodels.oracle._layers",
    "oracle_calibration": "costmodels.oracle._layers",
    "oracle_layers": "costmodels.oracle._layers",
    "lc_family": "costmodels.oracle._masks",
    "load_lc": "costmodels.oracle._masks",
    "parse_lc": "costmodels.oracle._masks",
    "oracle_context": "costmodels.oracle._table",
    "oracle_table": "costmodels.oracle._table",
    "parse_strategies": "costmodels.oracle._table",
    "ShardShapes": "costmodels.shards",
    "shard_shapes": "costmodels.shards",
    "AXIS_NAMES": "costmodels.strategies",
    "DATA_AXIS": "costmodels.strategies",
    "MODEL_AXIS": "costmodels.strategies",
    "NUM_STRATEGIES": "costmodels.strategies",
    "STRATEGY_NAMES": "costmodels.strategies",
    "Layout": "costmodels.strategies",
    "Strategy": "costmodels.strategies",
    "io_layout_names": "costmodels.strategies",
    "parse_strategy": "costmodels.strategies",
    "strategy_mask": "costmodels.strategies",
    "OPTIMIZER_SLOTS": "costmodels.table",
    "CostSettings": "costmodels.table",
    "CostTable": "costmodels.table",
    "cost_table": "costmodels.table",
    "XlaCpuBuffers": "costmodels.xla_cpu",
    "scheduled_memory_per_device": "costmodels.xla_cpu",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'costmodels' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
