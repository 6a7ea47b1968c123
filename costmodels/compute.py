"""Hardware as arrays, and the compute-time model: a roofline over FLOPs and
bytes moved, with an attained fraction of peak per op class.

``time = max(flops / (peak * efficiency[op class]),
             bytes / (memory bandwidth * efficiency["memory"]))``
(Williams, Waterman and Patterson, "Roofline", CACM 2009). ParaDL instead
scales one measured per-sample time by FLOP share (paradl.md §4.10); that
path belongs to the oracle.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from costmodels.collectives import Network, network_arrays
from costmodels.hardware import DTYPES, Hardware
from planner.graph import LayerKind

__all__ = ["HardwareArrays", "hardware_arrays", "roofline_s", "op_class_efficiency", "DTYPE_BYTES"]

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


class HardwareArrays(NamedTuple):
    """A :class:`Hardware` for one compute dtype, as arrays (vmappable)."""

    peak_flops_per_s: jnp.ndarray  # [] dense peak for the chosen dtype
    memory_bandwidth_bytes_per_s: jnp.ndarray  # []
    memory_bytes: jnp.ndarray  # [] capacity per device
    efficiency: jnp.ndarray  # [4] conv, matmul, elementwise, memory
    gradient_overlap: jnp.ndarray  # [] fraction of gradient sync hidden by backward compute
    network: Network


def hardware_arrays(hw: Hardware, dtype: str = "float32") -> HardwareArrays:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    peak = hw.device.peak_flops_per_s.get(dtype)
    if peak is None:
        raise ValueError(f"hardware {hw.name!r} gives no peak FLOP/s for {dtype}")
    e = hw.device.efficiency
    return HardwareArrays(
        peak_flops_per_s=jnp.asarray(peak, jnp.float32),
        memory_bandwidth_bytes_per_s=jnp.asarray(hw.device.memory_bandwidth_bytes_per_s, jnp.float32),
        memory_bytes=jnp.asarray(hw.device.memory_bytes, jnp.float32),
        efficiency=jnp.asarray([e["conv"], e["matmul"], e["elementwise"], e["memory"]], jnp.float32),
        gradient_overlap=jnp.asarray(hw.gradient_overlap, jnp.float32),
        network=network_arrays(hw),
    )


def op_class_efficiency(hw: HardwareArrays, kind):
    """Attained fraction of peak FLOP/s for layer kinds ``[L]``: conv, matmul
    (dense) or element-wise (everything else)."""
    kind = jnp.asarray(kind)
    return jnp.where(
        kind == LayerKind.CONV, hw.efficiency[0], jnp.where(kind == LayerKind.DENSE, hw.efficiency[1], hw.efficiency[2])
    )


def roofline_s(hw: HardwareArrays, flops, nbytes, efficiency):
    """Roofline time of ``flops`` FLOPs moving ``nbytes`` bytes at ``efficiency`` of peak."""
    return jnp.maximum(
        flops / (hw.peak_flops_per_s * efficiency),
        nbytes / (hw.memory_bandwidth_bytes_per_s * hw.efficiency[3]),
    )
