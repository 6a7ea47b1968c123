"""What ``planner.validate`` reports (:class:`ValidationReport`: memory rows
and collective rows, predicted against compiled, per device), the limit
row, the optimizer it compiles with and the XLA:CPU scheduler in use; for
one-stage plans (:mod:`planner.runtime.validation`) and pipelined ones
(:mod:`planner.runtime.pipeline_validation`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import optax

from planner.plans.record import Plan
from planner.runtime.collective_rows import CollectiveRow

__all__ = ["MemoryRow", "ValidationReport", "cpu_scheduler", "default_optimizer", "limit_row"]


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    part: str  # parameters | optimizer state | batch statistics | inputs | arguments | activations and temporaries | total | limit
    predicted_bytes: float  # per device
    compiled_bytes: float  # per device
    rtol: float  # allowed |compiled - predicted| / predicted (0: exact)
    ok: bool
    note: str = ""


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    model: str
    mesh: tuple[int, ...]  # (d, m); a pipelined plan's (stages, d, m)
    batch: int  # global
    optimizer: str
    platform: str  # jax backend the step was compiled for
    memory_rtol: float  # total memory
    activation_rtol: float  # activations and temporaries
    comm_rtol: float  # collective bytes per (kind, axes)
    memory: tuple[MemoryRow, ...]
    collectives: tuple[CollectiveRow, ...]
    # on CPU, the XLA:CPU scheduler the step was ordered by (cpu_scheduler): compiled memory depends on it
    scheduler: str = ""
    notes: tuple[str, ...] = ()  # on CPU, costmodels.schedule_note where this jaxlib is not the one measured

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.memory) and all(r.ok for r in self.collectives)

    @property
    def over_limit(self) -> MemoryRow | None:
        """The ``limit`` row when the compiled program exceeds the plan's memory limit, else None."""
        return next((r for r in self.memory if r.part == "limit" and not r.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mesh": list(self.mesh),
            "batch": self.batch,
            "optimizer": self.optimizer,
            "platform": self.platform,
            "scheduler": self.scheduler,
            "notes": list(self.notes),
            "memory_rtol": self.memory_rtol,
            "activation_rtol": self.activation_rtol,
            "comm_rtol": self.comm_rtol,
            "ok": self.ok,
            "memory": [dataclasses.asdict(r) for r in self.memory],
            "collectives": [{**dataclasses.asdict(r), "axes": list(r.axes)} for r in self.collectives],
        }


def cpu_scheduler(xla_flags: str | None = None) -> str:
    """Which XLA:CPU scheduler orders a step compiled in this process, from
    ``xla_flags`` (default: the ``XLA_FLAGS`` environment variable, which XLA
    reads once, when the process starts): ``concurrency`` (XLA's default,
    ``--xla_cpu_enable_concurrency_optimized_scheduler``: its breadth-first
    ``BFSMemoryScheduler``, which trades memory for concurrency) or
    ``memory`` (that flag false: the depth-first ``DFSMemoryScheduler``;
    XLA's cpu_compiler.cc). The last setting of the flag wins, as in XLA's
    flag parsing. A CPU step's compiled memory depends on it
    (docs/validation.md, "The memory promise")."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    value = "true"
    for flag in flags.split():
        name, _, v = flag.lstrip("-").partition("=")
        if name == "xla_cpu_enable_concurrency_optimized_scheduler":
            value = v.lower() or "true"
    return "memory" if value in ("false", "0") else "concurrency"


def default_optimizer(name: str) -> optax.GradientTransformation:
    """The optax optimizer ``validate`` builds for a plan's optimizer name.
    The hyper-parameters (sgd and momentum: learning rate 0.01, momentum 0.9;
    adam: 1e-3) change no buffer size."""
    if name == "sgd":
        return optax.sgd(1e-2)
    if name == "momentum":
        return optax.sgd(1e-2, momentum=0.9)
    if name == "adam":
        return optax.adam(1e-3)
    raise ValueError(f"unknown optimizer {name!r}; choose from sgd, momentum, adam")


def limit_row(plan: Plan, rows: tuple[MemoryRow, ...], compiled_total: float) -> MemoryRow:
    """The plan's memory limit against the compiled total (the promise the plan
    makes); when broken, the note names the part that grew most."""
    limit = float(plan.memory_limit_bytes)
    kept = f", {plan.memory_margin_bytes:,.0f} B of it kept free for {plan.platform}" if plan.memory_margin_bytes else ""
    if compiled_total <= limit:
        return MemoryRow("limit", limit, compiled_total, 0.0, True, f"the plan's memory limit{kept}; fits")
    parts = [r for r in rows if r.part not in ("arguments", "total")]
    grown = max(parts, key=lambda r: r.compiled_bytes - r.predicted_bytes)
    note = (f"compiled {compiled_total:,.0f} B exceed the plan's limit {limit:,.0f} B{kept} by "
            f"{compiled_total - limit:,.0f} B; the part that grew: {grown.part}, "
            f"{grown.compiled_bytes - grown.predicted_bytes:+,.0f} B over its prediction")
    return MemoryRow("limit", limit, compiled_total, 0.0, False, note)
