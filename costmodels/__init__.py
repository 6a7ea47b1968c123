"""Cost models: hardware specs and per-layer compute, communication, memory
and resharding costs of every sharding, as jitted JAX functions.

``costmodels`` reads a :class:`planner.LayerGraph`'s arrays and never imports
``search``."""

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

__all__ = [
    "HARDWARE_SCHEMA",
    "HARDWARE_VERSION",
    "Device",
    "Hardware",
    "NetworkTier",
    "hardware_from_dict",
    "load_hardware",
    "preset_names",
]
