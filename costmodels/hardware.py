"""Hardware as data: a device's compute and memory, and the network tiers a
collective runs over. Presets are JSON files shipped in ``costmodels/presets``;
users pass their own files with the same schema.

Every quantity is SI with its unit in the key (``latency_s``,
``bandwidth_bytes_per_s``, ``memory_bytes``, ``peak_flops_per_s``), so a file
written in other units (``bandwidth_gbps``) is rejected rather than misread.
Numbers far outside any real machine's range are taken as the wrong unit
and rejected too (``_PLAUSIBLE``): a ``memory_bytes`` of 16 (GB meant),
a ``bandwidth_bytes_per_s`` of 12.5 (GB/s meant), a ``latency_s`` of 9 (us
meant), a ``peak_flops_per_s`` of 15.7 (TFLOP/s meant).

Tier choice follows ParaDL (ParaDL §3.1-3.2): a collective over ``ranks``
devices runs at the latency and bandwidth of the first tier, in file order,
whose ``max_ranks`` covers it; a tier marked ``intra_node`` is skipped when the
collective's ranks span more than one node.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from importlib import resources
from pathlib import Path
from typing import Any

from costmodels.files import check_float32, parse_json, read_json
from costmodels.transport import Environment, environment_from_dict

__all__ = [
    "Device",
    "KernelSpec",
    "NetworkTier",
    "Hardware",
    "HARDWARE_SCHEMA",
    "HARDWARE_VERSION",
    "MAX_DEVICES",
    "OP_CLASSES",
    "preset_names",
    "load_hardware",
    "hardware_from_dict",
]

HARDWARE_SCHEMA = "shardplan/hardware"
HARDWARE_VERSION = 1
# The most devices a plan, an evaluation or an oracle row may span: 2^20, far above any machine
# trained on (tens of thousands of accelerators), so a typo such as 2^41 is an error, not a plan.
MAX_DEVICES = 2**20
DTYPES = ("float32", "bfloat16", "float16")
# Tensor-core math modes a peak may be given for: the dtypes, plus TF32 (float32 matmuls
# and convolutions on tensor cores, NVIDIA A100/H100 datasheets).
MATH_MODES = ("float32", "tf32", "bfloat16", "float16")
# jax.default_matmul_precision names (JAX docs, "jax.lax.Precision"): on GPUs XLA runs
# float32 dots and convolutions as TF32 at DEFAULT and HIGH, as true float32 at HIGHEST.
MATMUL_PRECISIONS = ("default", "high", "highest")
# Bounds no real accelerator or network crosses; a value outside is a unit mistake.
_PLAUSIBLE: dict[str, tuple[float, float, str]] = {  # field -> (min, max, example in the right unit)
    "peak_flops_per_s": (1e9, math.inf, "15.7e12 for 15.7 TFLOP/s"),
    "memory_bandwidth_bytes_per_s": (1e6, math.inf, "900e9 for 900 GB/s"),
    "memory_bytes": (1e6, math.inf, "16e9 for 16 GB"),
    "latency_s": (0.0, 0.1, "9e-6 for 9 us"),
    "bandwidth_bytes_per_s": (1e6, math.inf, "12.5e9 for 12.5 GB/s"),
    "launch_s": (0.0, 1e-2, "5e-6 for 5 us"),
    "dispatch_s": (0.0, 1.0, "2e-4 for 0.2 ms"),
    "conv_call_s": (0.0, 1e-2, "3e-5 for 30 us"),
}
OP_CLASSES = ("conv", "matmul", "elementwise", "memory")
# An attained fraction of peak below this is no measurement of a real kernel (the slowest a
# roofline-bound op runs is a few percent of peak) but a typo whose reciprocal overflows.
MIN_EFFICIENCY = 1e-6


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """How one kernel's time departs from the roofline (costmodels/compute.py).
    The defaults are the plain roofline: no fixed cost, no tiles, no
    saturation, compute and memory fully overlapped."""

    launch_s: float = 0.0  # fixed cost of every kernel launch (forward, backward-data, backward-weight, epilogue)
    channel_tile: float = 1.0  # a GEMM's output-feature dim is padded to a multiple of this (thread-block tile width)
    reduction_tile: float = 1.0  # its reduction dim is padded to a multiple of this (tensor-core k step)
    saturation_output_elements: float = 0.0  # output elements at which a kernel reaches half its peak rate
    compute_memory_exponent: float | None = None  # p of the p-norm combining compute and memory time; None = max
    dispatch_s: float = 0.0  # host-side cost of one jitted call, paid once per training step
    conv_call_s: float = 0.0  # fixed cost of one convolution library call (each of a conv's 3 kernels), beyond launch_s
    # per math mode, the layout a convolution library's kernels run in: "channels_first" (the framework's
    # channels-last activations x, dx and its HWIO weights w, dw are transposed to and from it) or
    # "channels_last" (only w, dw: HWIO is no library filter layout); a mode not listed converts nothing
    conv_layout: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator."""

    peak_flops_per_s: dict[str, float]  # per math mode (float32, tf32, bfloat16, float16), dense
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float
    # attained fraction of peak per op class (conv, matmul, elementwise, memory): one number,
    # or one per math mode (tf32, bfloat16, ...), the mode the op runs in choosing
    efficiency: dict[str, float | dict[str, float]]
    matmul_precision: str = "default"  # as jax.default_matmul_precision; decides float32's math mode
    kernel: KernelSpec = KernelSpec()

    def math_mode(self, dtype: str) -> str:
        """The math mode convolutions and matmuls of ``dtype`` run in: float32
        runs as TF32 at precision default/high where the device has a TF32 peak."""
        if dtype == "float32" and self.matmul_precision != "highest" and "tf32" in self.peak_flops_per_s:
            return "tf32"
        return dtype

    def efficiency_of(self, op_class: str, mode: str) -> float:
        """Attained fraction of peak for ``op_class`` in math ``mode`` (falling
        back from tf32 to float32, then to 1.0)."""
        e = self.efficiency.get(op_class, 1.0)
        if isinstance(e, dict):
            for key in (mode, "float32" if mode == "tf32" else mode):
                if key in e:
                    return e[key]
            return 1.0
        return e


@dataclasses.dataclass(frozen=True)
class NetworkTier:
    """One level of the network, in alpha-beta form (ParaDL §3.1)."""

    name: str
    max_ranks: int | None  # largest collective this tier serves; None = unbounded
    intra_node: bool  # only for collectives whose ranks share a node
    latency_s: float  # alpha: start-up time per message step
    bandwidth_bytes_per_s: float  # 1 / beta: bottleneck link bandwidth


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    device: Device
    devices_per_node: int
    gradient_overlap: float  # fraction of the gradient all-reduce hidden behind backward compute; 0 = ParaDL
    tiers: tuple[NetworkTier, ...]
    sources: tuple[str, ...] = ()
    # the software environment the collectives run in (costmodels/transport.py); None = ParaDL's ideal network
    environment: Environment | None = None

    def tier_for(self, ranks: int, crosses_nodes: bool) -> NetworkTier:
        """The tier a collective over ``ranks`` devices runs on (ParaDL §3.2)."""
        if ranks < 1:
            raise ValueError(f"a collective needs at least 1 rank, got {ranks}")
        for t in self.tiers:
            if t.intra_node and crosses_nodes:
                continue
            if t.max_ranks is None or ranks <= t.max_ranks:
                return t
        raise ValueError(f"hardware {self.name!r} has no network tier for {ranks} ranks")

    def to_dict(self) -> dict[str, Any]:
        d = self.device
        return {
            "schema": HARDWARE_SCHEMA,
            "version": HARDWARE_VERSION,
            "name": self.name,
            "description": self.description,
            "sources": list(self.sources),
            "device": {
                "peak_flops_per_s": dict(d.peak_flops_per_s),
                "memory_bandwidth_bytes_per_s": d.memory_bandwidth_bytes_per_s,
                "memory_bytes": d.memory_bytes,
                "efficiency": {k: dict(v) if isinstance(v, dict) else v for k, v in d.efficiency.items()},
                "matmul_precision": d.matmul_precision,
                "kernel": d.kernel.to_dict(),
            },
            "devices_per_node": self.devices_per_node,
            "gradient_overlap": self.gradient_overlap,
            "tiers": [dataclasses.asdict(t) for t in self.tiers],
            **({"environment": self.environment.to_dict()} if self.environment is not None else {}),
        }


def preset_names() -> tuple[str, ...]:
    """Names of the shipped hardware presets."""
    files = resources.files("costmodels").joinpath("presets").iterdir()
    return tuple(sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json")))


def load_hardware(name_or_path: str | Path | Hardware) -> Hardware:
    """A preset by name (``abci-v100``) or a hardware JSON file by path; a
    :class:`Hardware` is returned as it is (every public function that takes
    ``hardware=`` accepts all three through this)."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    key = str(name_or_path)
    if key in preset_names():
        text = resources.files("costmodels").joinpath("presets", f"{key}.json").read_text()
        source = f"preset {key!r}"
    else:
        path = Path(key)
        if not path.exists():  # a folder or a device exists: read_json says what it is
            if "/" in key or "\\" in key or path.suffix == ".json":
                raise ValueError(
                    f"no such hardware file: {key}; give a preset ({', '.join(preset_names())}) or an existing JSON file"
                )
            close = [n for n in preset_names() if key.lower() in n] or difflib.get_close_matches(
                key, preset_names(), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close and len(key) >= 2 else ""
            raise ValueError(
                f"unknown hardware {key!r}{hint}: not a preset ({', '.join(preset_names())}) nor an existing JSON file"
            )
        return hardware_from_dict(read_json(path, "hardware JSON file"), source=str(path))
    return hardware_from_dict(parse_json(text, source), source=source)


def _positive(v: Any, where: str, *, allow_zero: bool = False, upper: float | None = None,
              plausible: str | None = None, lower: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{where} must be {'non-negative' if allow_zero else 'positive'}, got {v!r}")
    if upper is not None and v > upper:
        raise ValueError(f"{where} must be at most {upper}, got {v!r}")
    if lower is not None and v < lower:
        raise ValueError(f"{where} must be at least {lower:g}, got {v!r}")
    check_float32(v, where)
    if plausible is not None:
        low, high, example = _PLAUSIBLE[plausible]
        if 0 < v < low or v > high:
            size = f"small (under {low:g})" if v < low else f"large (over {high:g})"
            raise ValueError(f"{where} = {v!r} is implausibly {size}, probably in another unit; "
                             f"give {plausible} in SI units, e.g. {example}")
    return float(v)


def _keys(d: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object")
    missing = [k for k in required if k not in d]
    unknown = sorted(set(d) - set(required) - set(optional))
    if missing:
        extra = f" and has unknown field(s) {', '.join(unknown)}" if unknown else ""
        raise ValueError(
            f"{where} is missing {', '.join(missing)}{extra}; expected {', '.join(required + optional)} "
            "(quantities are SI, with the unit in the name)"
        )
    if unknown:
        raise ValueError(
            f"{where} has unknown field(s) {', '.join(unknown)}; expected {', '.join(required + optional)} "
            "(quantities are SI, with the unit in the name)"
        )
    return d


def _kernel_spec(data: Any, where: str) -> KernelSpec:
    k = _keys(data, where, (), tuple(f.name for f in dataclasses.fields(KernelSpec)))

    def tile(name: str) -> float:
        v = _positive(k.get(name, 1.0), f"{where}.{name}")
        if v != int(v):
            raise ValueError(f"{where}.{name} must be a whole number of elements, got {v!r}")
        return v

    exponent = k.get("compute_memory_exponent")
    if exponent is not None:
        exponent = _positive(exponent, f"{where}.compute_memory_exponent")
        if exponent < 1.0:
            raise ValueError(f"{where}.compute_memory_exponent must be at least 1 (1 = compute and memory "
                             f"time add, null = they overlap fully), got {exponent!r}")
    return KernelSpec(
        launch_s=_positive(k.get("launch_s", 0.0), f"{where}.launch_s", allow_zero=True, plausible="launch_s"),
        channel_tile=tile("channel_tile"),
        reduction_tile=tile("reduction_tile"),
        saturation_output_elements=_positive(k.get("saturation_output_elements", 0.0),
                                             f"{where}.saturation_output_elements", allow_zero=True),
        compute_memory_exponent=exponent,
        dispatch_s=_positive(k.get("dispatch_s", 0.0), f"{where}.dispatch_s", allow_zero=True, plausible="dispatch_s"),
        conv_call_s=_positive(k.get("conv_call_s", 0.0), f"{where}.conv_call_s", allow_zero=True,
                              plausible="conv_call_s"),
        conv_layout=_conv_layout(k.get("conv_layout", {}), f"{where}.conv_layout"),
    )


CONV_LAYOUTS = ("channels_first", "channels_last")


def _conv_layout(data: Any, where: str) -> dict[str, str]:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must map math modes to a layout, e.g. {{\"tf32\": \"channels_first\"}}")
    for mode, layout in data.items():
        if layout not in CONV_LAYOUTS:
            raise ValueError(f"{where}.{mode} is {layout!r}; expected one of {', '.join(CONV_LAYOUTS)}")
    return dict(data)


def hardware_from_dict(data: Any, *, source: str = "hardware") -> Hardware:
    """Validate and build a :class:`Hardware` from its JSON form."""
    if isinstance(data, dict) and "schema" in data and data["schema"] != HARDWARE_SCHEMA:
        raise ValueError(f'{source}: not a hardware file ("schema" is {data["schema"]!r}, expected {HARDWARE_SCHEMA!r}); '
                         f"give a preset ({', '.join(preset_names())}) or a hardware JSON file")
    top = _keys(
        data, source,
        ("schema", "version", "name", "device", "devices_per_node", "tiers"),
        ("description", "sources", "gradient_overlap", "environment"),
    )
    if top["schema"] != HARDWARE_SCHEMA:
        raise ValueError(f'{source}: "schema" is {top["schema"]!r}, expected {HARDWARE_SCHEMA!r}')
    if top["version"] != HARDWARE_VERSION:
        raise ValueError(f"{source}: hardware version {top['version']!r} is not supported (expected {HARDWARE_VERSION})")
    if not isinstance(top["name"], str) or not top["name"]:
        raise ValueError(f'{source}: "name" must be a non-empty string')
    dev = _keys(
        top["device"], f"{source}: device",
        ("peak_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_bytes"),
        ("efficiency", "matmul_precision", "kernel"),
    )
    peaks = _keys(dev["peak_flops_per_s"], f"{source}: device.peak_flops_per_s", ("float32",), MATH_MODES[1:])
    eff = _keys(dev.get("efficiency", {}), f"{source}: device.efficiency", (), OP_CLASSES)
    precision = dev.get("matmul_precision", "default")
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"{source}: device.matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)} "
                         f"(as jax.default_matmul_precision), got {precision!r}")

    def efficiency(c: str, v: Any) -> float | dict[str, float]:
        where = f"{source}: efficiency.{c}"
        if isinstance(v, dict):
            per = _keys(v, where, (), MATH_MODES)
            return {k: _positive(x, f"{where}.{k}", upper=1.0, lower=MIN_EFFICIENCY) for k, x in per.items()}
        return _positive(v, where, upper=1.0, lower=MIN_EFFICIENCY)

    device = Device(
        peak_flops_per_s={k: _positive(v, f"{source}: peak_flops_per_s.{k}", plausible="peak_flops_per_s")
                          for k, v in peaks.items()},
        memory_bandwidth_bytes_per_s=_positive(dev["memory_bandwidth_bytes_per_s"], f"{source}: memory_bandwidth_bytes_per_s",
                                               plausible="memory_bandwidth_bytes_per_s"),
        memory_bytes=_positive(dev["memory_bytes"], f"{source}: memory_bytes", plausible="memory_bytes"),
        efficiency={c: efficiency(c, eff.get(c, 1.0)) for c in OP_CLASSES},
        matmul_precision=precision,
        kernel=_kernel_spec(dev.get("kernel", {}), f"{source}: device.kernel"),
    )
    dpn = top["devices_per_node"]
    if isinstance(dpn, bool) or not isinstance(dpn, int) or dpn < 1:
        raise ValueError(f"{source}: devices_per_node must be a positive integer, got {dpn!r}")
    if not isinstance(top["tiers"], list) or not top["tiers"]:
        raise ValueError(f"{source}: tiers must be a non-empty list")
    tiers = []
    for i, t in enumerate(top["tiers"]):
        where = f"{source}: tiers[{i}]"
        t = _keys(t, where, ("name", "max_ranks", "intra_node", "latency_s", "bandwidth_bytes_per_s"))
        mr = t["max_ranks"]
        if mr is not None and (isinstance(mr, bool) or not isinstance(mr, int) or mr < 1):
            raise ValueError(f"{where}.max_ranks must be a positive integer or null, got {mr!r}")
        if not isinstance(t["intra_node"], bool):
            raise ValueError(f"{where}.intra_node must be true or false")
        tiers.append(NetworkTier(
            name=str(t["name"]), max_ranks=mr, intra_node=t["intra_node"],
            latency_s=_positive(t["latency_s"], f"{where}.latency_s", allow_zero=True, plausible="latency_s"),
            bandwidth_bytes_per_s=_positive(t["bandwidth_bytes_per_s"], f"{where}.bandwidth_bytes_per_s",
                                            plausible="bandwidth_bytes_per_s"),
        ))
    if not any(t.max_ranks is None and not t.intra_node for t in tiers):
        raise ValueError(f"{source}: the last tier must serve any number of ranks across nodes (max_ranks: null, intra_node: false)")
    sources = top.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ValueError(f"{source}: sources must be a list of strings")
    return Hardware(
        name=top["name"],
        description=str(top.get("description", "")),
        device=device,
        devices_per_node=dpn,
        gradient_overlap=_positive(top.get("gradient_overlap", 0.0), f"{source}: gradient_overlap", allow_zero=True, upper=1.0),
        tiers=tuple(tiers),
        sources=tuple(sources),
        environment=None if top.get("environment") is None else environment_from_dict(
            top["environment"], [t.name for t in tiers], source=source),
    )
