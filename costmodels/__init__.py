"""Cost models: hardware specs and per-layer compute, communication, memory
and resharding costs of every sharding, as jitted JAX functions.

``costmodels`` reads a model's layer arrays (:class:`LayerArrays`, as a
:class:`LayerTable` such as ``planner.LayerGraph``), produces a
:class:`CostTable`, and imports neither ``search`` nor ``planner``."""

from costmodels.calibration import (
    Calibration,
    CalibrationArrays,
    calibration_arrays,
    load_calibration,
)
from costmodels.collective_list import CollectiveRecord, plan_collectives
from costmodels.compute import HardwareArrays, hardware_arrays
from costmodels.evaluate import (
    expected_time,
    iteration_time,
    memory_per_device,
    one_hot,
)
from costmodels.hardware import (
    HARDWARE_SCHEMA,
    HARDWARE_VERSION,
    Device,
    Hardware,
    NetworkTier,
    hardware_from_dict,
    load_hardware,
    preset_names,
)
from costmodels.layers import LayerArrays, LayerKind, LayerTable
from costmodels.levers import (
    LEVER_CHOICES,
    Lever,
    lever_menu,
    menu_covering,
    option_index,
    option_name,
    option_strategy,
    parse_option,
    strategy_probs,
)
from costmodels.strategies import STRATEGY_NAMES, Layout, Strategy, parse_strategy
from costmodels.table import CostSettings, CostTable, cost_table
from costmodels.xla_cpu import XlaCpuBuffers, scheduled_memory_per_device

__all__ = [
    "HARDWARE_SCHEMA",
    "HARDWARE_VERSION",
    "LEVER_CHOICES",
    "STRATEGY_NAMES",
    "Calibration",
    "CalibrationArrays",
    "CollectiveRecord",
    "CostSettings",
    "CostTable",
    "Device",
    "Hardware",
    "HardwareArrays",
    "LayerArrays",
    "LayerKind",
    "LayerTable",
    "Lever",
    "Layout",
    "NetworkTier",
    "Strategy",
    "XlaCpuBuffers",
    "calibration_arrays",
    "cost_table",
    "expected_time",
    "hardware_arrays",
    "hardware_from_dict",
    "iteration_time",
    "lever_menu",
    "menu_covering",
    "option_index",
    "load_calibration",
    "load_hardware",
    "memory_per_device",
    "one_hot",
    "scheduled_memory_per_device",
    "option_name",
    "option_strategy",
    "parse_option",
    "parse_strategy",
    "plan_collectives",
    "preset_names",
    "strategy_probs",
]
