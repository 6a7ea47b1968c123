"""Compile a plan's training step for a GPU on a machine without one.

XLA:GPU compiles for a described GPU without a device: the CUDA PJRT plugin
(``jax-cuda12-plugin``, the ``gpu-aot`` extra) makes compile-only devices from
a topology shape and a target description
(``jax.experimental.topologies.get_topology_desc(platform="cuda",
topology=..., target_config=...)``), and a step lowered on a mesh of those
devices compiles for that GPU; ``memory_analysis()`` and the HLO text read as
on the GPU itself. Nothing runs.

The target description (XLA's ``GpuTargetConfigProto`` text) is built from
data: ``gpu_targets.json`` beside this module (per GPU: compute capability,
multiprocessors, limits, L2, cuDNN, with sources) and the plan's hardware
preset (memory size, bandwidth, and the SM clock from its float32 peak).
docs/validation.md, "Compiling for a GPU target on a machine without one",
has what was checked and with which versions
(``benchmarks/gpu_aot_probe.py``).
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from typing import Any

import numpy as np
from jax.sharding import Mesh

from costmodels import Hardware, load_hardware
from planner.plans.record import Plan
from planner.runtime.report import ValidationReport

__all__ = ["CUDA_PLUGINS", "gpu_target_config", "gpu_target_mesh", "gpu_target_presets", "validate_on_gpu_target"]

CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")  # the CUDA PJRT plugins' modules
_INSTALL = "pip install 'shardplan[gpu-aot]' (the CUDA PJRT plugin; no GPU or CUDA driver needed)"


def _targets() -> dict[str, Any]:
    text = resources.files("planner.runtime").joinpath("gpu_targets.json").read_text(encoding="utf-8")
    return json.loads(text)


def gpu_target_presets() -> tuple[str, ...]:
    """The hardware presets whose GPU ``gpu_targets.json`` describes."""
    return tuple(sorted(_targets()["presets"]))


def gpu_target_config(hardware: str | Hardware) -> str:
    """XLA's target description (``GpuTargetConfigProto`` text format) of
    ``hardware``'s GPU: a preset name of :func:`gpu_target_presets` or a
    :class:`~costmodels.Hardware` of that name."""
    hw = load_hardware(hardware)
    data = _targets()
    key = data["presets"].get(hw.name)
    if key is None:
        raise ValueError(f"no GPU target for hardware {hw.name!r}; gpu_targets.json describes the GPUs of "
                         f"{', '.join(gpu_target_presets())}")
    g = data["gpus"][key]
    dev = hw.device
    # SM clock: the datasheet's float32 peak = multiprocessors x FP32 cores x 2 FLOP (one FMA) x clock
    # (A100: 19.5e12 / (108 x 64 x 2) = 1.41 GHz; H100 SXM5: 67e12 / (132 x 128 x 2) = 1.98 GHz)
    clock_ghz = dev.peak_flops_per_s["float32"] / (g["multiprocessors"] * g["fp32_cores_per_multiprocessor"] * 2) / 1e9
    major, minor = g["compute_capability"]
    bx, by, bz = g["block_dim_limits"]
    dnn = g["cudnn_version"]
    fields = {
        "threads_per_block_limit": g["threads_per_block_limit"],
        "threads_per_warp": g["threads_per_warp"],
        "shared_memory_per_block": g["shared_memory_per_block_bytes"],
        "shared_memory_per_block_optin": g["shared_memory_per_block_optin_bytes"],
        "shared_memory_per_core": g["shared_memory_per_multiprocessor_bytes"],
        "threads_per_core_limit": g["threads_per_multiprocessor_limit"],
        "core_count": g["multiprocessors"],
        "fpus_per_core": g["fp32_cores_per_multiprocessor"],
        "block_dim_limit_x": bx,
        "block_dim_limit_y": by,
        "block_dim_limit_z": bz,
        "memory_bandwidth": int(dev.memory_bandwidth_bytes_per_s),
        "l2_cache_size": g["l2_cache_bytes"],
        "clock_rate_ghz": f"{clock_ghz:.4f}",
        "device_memory_size": int(dev.memory_bytes),
        "registers_per_core_limit": g["registers_per_multiprocessor"],
        "registers_per_block_limit": g["registers_per_block"],
    }
    info = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    return (f"gpu_device_info {{\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n{info}\n}}\n"
            f'platform_name: "CUDA"\n'
            f"dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: {dnn[2]} }}\n"
            f'device_description_str: "{key} ({hw.name})"\n')


def gpu_target_mesh(plan: Plan, hardware: str | Hardware | None = None) -> Mesh:
    """The plan's mesh (its shape and axis names) over compile-only devices
    of ``hardware``'s GPU (default: the plan's hardware), all in one
    process. Raises ``ImportError`` without a CUDA PJRT plugin."""
    if not any(importlib.util.find_spec("jax_plugins") and importlib.util.find_spec(m) for m in CUDA_PLUGINS):
        raise ImportError(f"compiling for a GPU target needs the CUDA PJRT plugin: {_INSTALL}")
    from jax.experimental import topologies

    if hardware is None:
        if plan.hardware_spec is None:
            raise ValueError("the plan does not record its hardware; pass hardware= (a preset such as 'dgx-a100')")
        hardware = plan.hardware_spec
    n = int(np.prod(plan.mesh))
    # topology "slices x hosts x devices per host"
    topology = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{n}",
                                            target_config=gpu_target_config(hardware))
    return Mesh(np.array(topology.devices[:n]).reshape(plan.mesh), tuple(plan.axis_names))


def validate_on_gpu_target(model: Any, plan: Plan, *, hardware: str | Hardware | None = None,
                           **tolerances: float) -> ValidationReport:
    """:func:`planner.validate` of ``plan``'s step compiled for ``hardware``'s
    GPU (default: the plan's hardware) on this machine, GPU or not:
    predicted against compiled memory (XLA:GPU's ``memory_analysis()``) and
    collectives per device, in the plan's precision. ``tolerances``:
    ``memory_rtol``, ``activation_rtol``, ``comm_rtol`` as for
    :func:`planner.validate`."""
    from planner.runtime.validation import validate

    return validate(model, plan, mesh=gpu_target_mesh(plan, hardware), **tolerances)
