"""What a plan is asked for, checked: a memory limit (the one size parser,
:func:`parse_memory_limit`), the share of it kept free per XLA platform
(:data:`MEMORY_MARGIN`), the mesh shapes ``d x m`` of ``P`` devices a
search tries (:func:`mesh_shapes`), the device count, the global batch and
a mesh given by hand (:func:`positive_int`, :func:`device_count`,
:func:`resolve_batch`, :func:`resolve_mesh`), the search's seed
(:func:`check_seed`)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from costmodels import MAX_DEVICES, Hardware

__all__ = ["MAX_SEED", "MEMORY_MARGIN", "check_seed", "device_count", "memory_limit_bytes", "memory_margin_bytes",
           "mesh_shapes", "parse_memory_limit", "platform_of", "positive_int", "resolve_batch", "resolve_mesh"]

MAX_SEED = 2**32  # seeds are 32-bit: 0 <= seed < 2^32, which a plan file holds and reads back


# The share of a memory limit the search keeps free, per XLA platform: what
# the cost model does not capture (docs/validation.md, "The memory promise").
# cpu, measured with what XLA:CPU does counted by the cost model (its
# max-pool expansion and transposed convolution output gradients, and
# its schedule, costmodels.xla_cpu_schedule: kernel copies,
# reversed kernels, the pools' iotas, the gradient all-reduce;
# benchmarks/xla_agreement.py: 96 plans of four models, batches 64 and 256,
# every 8-device mesh, limits none / mid / tight, and 48 held out at batch
# 128; benchmarks/zero_xla.py; tests/test_memory_promise.py's tiny CNN):
# what is left is a channel dense layer's weight gradient that the schedule
# does not count at the backward's start, and buffer assignment's
# fragmentation (7.6% on VGG16-CIFAR-10, batch 256, 2x4). Worst compiled /
# predicted: 1.097 on the grid (SplitBrain VGG16, batch 64, 1x8, tight),
# 1.150 held out (SplitBrain VGG16, batch 128, 1x8, mid), 1.129 under ZeRO
# (the ResNet's stage 2, batch 64, 4x2, every layer data, two phases;
# VGG16-CIFAR-10's stage 1 was 1.162 before its gathered update was counted)
# and 1.056 on the full-size transformers (docs/transformers.md), so plans
# are predicted at most 0.8 x the limit (1 / 0.8 = 1.25). It was 45% (1.82)
# while the model added the optimizer's update to the activations and left
# XLA:CPU's buffers out (worst 1.69). gpu, tpu: not measured yet (no GPU was
# at hand), so no margin: validate there first.
MEMORY_MARGIN: dict[str, float] = {"cpu": 0.20, "gpu": 0.0, "tpu": 0.0}

_UNITS = {
    "": 1.0, "b": 1.0,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
}
_MEMORY = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_memory_limit(value: float | int | str) -> float:
    """Bytes from a number of bytes or a string with a unit: ``"16GiB"``,
    ``"16GB"``, ``"500MiB"``, ``"1.5e9"`` (units B, kB, MB, GB, TB, KiB, MiB,
    GiB, TiB; decimal units are powers of 1000, binary ones of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"memory limit must be bytes or a size like '16GiB', got {value!r}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        nbytes = float(value)
    elif isinstance(value, str):
        match = _MEMORY.fullmatch(value)
        if not match:
            raise ValueError(f"memory limit {value!r} is not a size; write e.g. 16GiB, 16GB, 500MiB or 17179869184")
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(
                f"unknown unit {match.group(2)!r} in memory limit {value!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB"
            )
        nbytes = float(match.group(1)) * _UNITS[unit]
    else:
        raise ValueError(f"memory limit must be bytes or a size like '16GiB', got {type(value).__name__}")
    if not (nbytes > 0 and math.isfinite(nbytes)):
        raise ValueError(f"memory limit must be a positive size, got {value!r}")
    return nbytes


def memory_limit_bytes(memory_limit: float | int | str | None, hw: Hardware) -> float:
    """The limit per device in bytes (``16GiB``, a number of bytes, or None
    for the device's memory), at most what a device of ``hw`` has: a plan
    "fitting" memory the device does not have is no answer."""
    from planner._format import format_bytes_up

    limit = hw.device.memory_bytes if memory_limit is None else parse_memory_limit(memory_limit)
    if limit > hw.device.memory_bytes:
        raise ValueError(
            f"memory limit {format_bytes_up(limit)} is more than a {hw.name} device has "
            f"({format_bytes_up(hw.device.memory_bytes)}); give at most that, or a hardware file with the right "
            "memory_bytes")
    return limit


def memory_margin_bytes(limit_bytes: float, platform: str) -> float:
    """The bytes of ``limit_bytes`` the search keeps free for ``platform``
    (``cpu``, ``gpu`` or ``tpu``): :data:`MEMORY_MARGIN` of the limit."""
    if platform not in MEMORY_MARGIN:
        raise ValueError(f"unknown platform {platform!r}; choose from {', '.join(MEMORY_MARGIN)}")
    return MEMORY_MARGIN[platform] * float(limit_bytes)


def platform_of(platform: str | None, hw: Hardware) -> str:
    """The platform a plan is made for: ``platform``, else the hardware's:
    ``cpu`` for CPU hardware (a name starting ``cpu``, as the ``cpu-local``
    preset), ``gpu`` otherwise (every other preset is a GPU system)."""
    if platform is not None:
        if platform not in MEMORY_MARGIN:
            raise ValueError(f"unknown platform {platform!r}; choose from {', '.join(MEMORY_MARGIN)}")
        return platform
    return "cpu" if hw.name.lower().startswith("cpu") else "gpu"


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, by trial division up to sqrt(n)."""
    small, large = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    return small + large[::-1]


def mesh_shapes(devices: int, batch: int, devices_per_node: int, allow_cross_node_model_axis: bool = False
                ) -> list[tuple[int, int]]:
    """Every ``(d, m)`` with ``d * m = devices`` whose data axis divides the
    batch and (unless allowed) whose model axis fits in one node; by ``m``."""
    if devices < 1:
        raise ValueError(f"devices must be a positive integer, got {devices}")
    shapes = []
    for m in _divisors(devices):  # by divisors: work bounded by sqrt(devices), not devices
        d = devices // m
        if batch % d:
            continue
        if m > devices_per_node and not allow_cross_node_model_axis:
            continue
        shapes.append((d, m))
    if not shapes:
        raise ValueError(
            f"batch {batch} is not divisible by any data-parallel degree d of {devices} devices with a model axis "
            f"of at most {devices_per_node} (one node); use a batch that is a multiple of {devices // max(1, min(devices, devices_per_node))}"
            " or allow a cross-node model axis"
        )
    return shapes


def resolve_batch(devices: int, batch: int | None, batch_per_device: int | None) -> int:
    """The global batch from ``batch`` or ``batch_per_device`` (exactly one, or
    neither for 32 per device)."""
    if batch is not None and batch_per_device is not None:
        raise ValueError("give either batch or batch_per_device, not both")
    if batch is None:
        b = 32 if batch_per_device is None else batch_per_device
        return positive_int(b, "batch per device") * device_count(devices)
    return positive_int(batch, "batch")


def positive_int(x: Any, what: str) -> int:
    """``x`` as a positive whole number (an integer, or a float with an integer
    value such as ``256.0``); anything else, bools and NaN included, is an error."""
    ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
    if not (ok and math.isfinite(x) and float(x).is_integer() and x >= 1):
        raise ValueError(f"{what} must be a positive integer, got {x!r}")
    return int(x)


def device_count(x: Any, what: str = "devices") -> int:
    """``x`` as a device count: a positive integer (:func:`positive_int`) of
    at most :data:`costmodels.MAX_DEVICES`."""
    n = positive_int(x, what)
    if n > MAX_DEVICES:
        raise ValueError(f"{what} must be at most {MAX_DEVICES} (2^20), got {n}")
    return n


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` if it is an integer with ``0 <= seed <`` :data:`MAX_SEED`
    (bools and floats refused); else a one-line ``ValueError``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"{what} must be a non-negative integer below 2^32, got {seed!r}")
    return int(seed)


def resolve_mesh(devices: int, mesh: tuple[int, int] | None, hardware: Hardware) -> tuple[int, int]:
    """``mesh`` checked against ``devices``; by default the model axis is one
    node (``min(devices, devices_per_node)``), SplitBrain's groups."""
    devices = device_count(devices)
    if mesh is None:
        m = min(devices, hardware.devices_per_node)
        if devices % m:
            m = 1
        return devices // m, m
    if not (isinstance(mesh, (tuple, list)) and len(mesh) == 2):
        raise ValueError(f"mesh must be a (data, model) pair of positive integers, got {mesh!r}")
    try:
        d, m = (positive_int(x, "mesh axis") for x in mesh)
    except ValueError:
        raise ValueError(f"mesh {mesh[0]}x{mesh[1]} needs positive integer axes; give D x M = {devices}") from None
    if d * m != devices:
        raise ValueError(f"mesh {d}x{m} has {d * m} devices, but {devices} were asked for; give D x M = {devices}")
    return d, m
