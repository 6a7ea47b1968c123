"""The compiler in the loop: ``planner.plan(..., verify=True)`` compiles the
chosen plan's training step ahead of time (``planner.validate``'s compile:
``jax.jit(...).lower(...).compile()`` on abstract inputs, nothing runs, no
weights in memory), reads XLA's memory of that exact program
(``argument + output - alias + temp`` per device), and, while it exceeds the
memory limit, plans again below a limit lowered by the measured excess, at
most :data:`VERIFY_ROUNDS` compiles. Each round is reported to the progress
callback (``SearchEvent("verify", ...)``). The plan returned records the
compiled bytes (``Plan.compiled_memory_bytes``) and the rounds it took; when
no round's plan fits, :class:`~planner.infeasible.InfeasibleMemoryError`
gives the smallest compiled figure.

``verify=None`` (the default) verifies where the plan's compiler is at hand:
a ``cpu`` plan (XLA:CPU is this machine's) on as many local devices as the
plan's mesh, or a ``gpu`` plan for a GPU ``gpu_targets.json`` describes
with the CUDA PJRT plugin installed (the ``gpu-aot`` extra: compile-only
devices, :mod:`planner.runtime.gpu_target`), and a Flax model to compile
(a zoo model's twin, a
:class:`~planner.models.transformer.TransformerConfig`'s model, or
``flax_model=``);
otherwise the callback hears why it did not (``SearchEvent("verify", ...)``).
``verify=True`` requires all three and says which is missing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from planner.infeasible import InfeasibleMemoryError
from planner.plans.record import Plan
from search import SearchEvent

__all__ = ["VERIFY_MAX_CPU_DEVICES", "VERIFY_ROUNDS", "compiled_memory_bytes", "gpu_compiler_missing", "verified_plan"]

VERIFY_ROUNDS = 4  # compiles at most, the first plan's included
VERIFY_MAX_CPU_DEVICES = 64  # XLA:CPU devices the command line makes for a plan's mesh (one process, one core each)


def compiled_memory_bytes(flax_model: Any, plan: Plan) -> float:
    """XLA's memory per device of ``plan``'s training step for ``flax_model``
    (``argument + output - alias + temp``; one compile, nothing runs): on
    XLA:CPU's local devices for a ``cpu`` plan, else for the plan's GPU on
    compile-only devices (:mod:`planner.runtime.gpu_target`)."""
    from planner.runtime.validation import validate

    mesh = None
    if plan.platform != "cpu":
        from planner.runtime.gpu_target import gpu_target_mesh

        mesh = gpu_target_mesh(plan)
    report = validate(flax_model, plan, mesh=mesh)
    return next(r.compiled_bytes for r in report.memory if r.part == "total")


def gpu_compiler_missing(hw: Any) -> str | None:
    """Why this machine cannot compile for ``hw``'s GPU (None: it can)."""
    import importlib.util

    from planner.runtime.gpu_target import CUDA_PLUGINS, gpu_target_presets

    if hw.name not in gpu_target_presets():
        return (f"the plan is for gpu on {hw.name!r}, whose GPU has no target description here "
                f"(described: {', '.join(gpu_target_presets())})")
    if not (importlib.util.find_spec("jax_plugins") and any(importlib.util.find_spec(m) for m in CUDA_PLUGINS)):
        return ("the plan is for gpu, whose compiler is not on this machine (pip install 'shardplan[gpu-aot]' to "
                "compile for the GPU without one, or plan with platform='cpu' to verify on XLA:CPU)")
    return None


def _flax_model_of(model: Any) -> Any:
    """The Flax model of a zoo name or a transformer config (abstract: nothing
    initialised), or None (a layer graph)."""
    from planner.models.loading import flax_model_of
    from planner.models.transformer import TransformerConfig

    if isinstance(model, str):
        return flax_model_of(model)
    if isinstance(model, TransformerConfig):
        from flax import nnx

        from planner.models.flax_transformers import transformer

        return nnx.eval_shape(lambda: transformer(model, nnx.Rngs(0)))
    return None


def _compiler_missing(args: dict[str, Any]) -> str | None:
    """Why this machine cannot compile the plan of ``args`` (None: it can)."""
    from costmodels import load_hardware

    from planner.plan_inputs import platform_of

    hw = load_hardware(args["hardware"])
    platform = platform_of(args["platform"], hw)
    if platform == "tpu":
        return "the plan is for tpu, whose compiler is not on this machine"
    if platform == "gpu":  # compile-only devices, as many as the mesh needs
        return gpu_compiler_missing(hw)
    import jax

    local = len(jax.devices("cpu"))
    if local < int(args["devices"]):
        return (f"the plan's {args['devices']} devices are more than this machine's {local} CPU devices (set "
                f"JAX_NUM_CPU_DEVICES={args['devices']} before JAX starts)")
    return None


def verified_plan(plan_fn: Callable[..., Plan], args: dict[str, Any]) -> Plan:
    """:func:`planner.plan` of the call's ``args`` with the compiler in the
    loop (module docstring); ``plan_fn`` is ``planner.plan`` itself."""
    callback = args["callback"]
    say = (lambda message: callback(SearchEvent("verify", message))) if callback is not None else (lambda _: None)
    why, flax_model = _compiler_missing(args), None
    if why is None:  # the model built only where it will be compiled
        flax_model = args["flax_model"] if args["flax_model"] is not None else _flax_model_of(args["model"])
        if flax_model is None:
            why = "there is no Flax model to compile (give flax_model=, or plan a zoo model or a TransformerConfig)"
    if why is not None:
        if args["verify"]:
            raise ValueError(f"verify: cannot compile this plan here: {why}")
        say(f"not verified: {why}")
        return plan_fn(**{**args, "verify": False})
    limit = None
    searched = args["memory_limit"]
    best: tuple[float, Plan] | None = None
    compiled_rounds: list[float] = []
    started = time.perf_counter()
    for round_ in range(1, VERIFY_ROUNDS + 1):  # noqa: B007 (reported in the plan)
        try:
            found = plan_fn(**{**args, "verify": False, "memory_limit": searched})
        except InfeasibleMemoryError:
            if best is None:  # nothing fits the limit itself: the search's own error
                raise
            break
        limit = found.memory_limit_bytes if limit is None else limit
        try:
            compiled = compiled_memory_bytes(flax_model, found)
        except ValueError as e:
            if best is None and args["verify"]:
                raise ValueError(f"verify: cannot compile the plan's training step: {e}") from e
            if best is None:  # the default: the plan as searched, and why it is not verified
                say(f"not verified: cannot compile the plan's training step here: {e}")
                return found
            say(f"round {round_}: cannot compile the plan searched below {searched:,.0f} B: {e}")
            break
        compiled_rounds.append(compiled)
        fits = compiled <= limit
        say(f"round {round_}: compiled {compiled:,.0f} B per device, predicted {found.memory_bytes_per_device:,.0f} "
            f"B, limit {limit:,.0f} B: {'fits' if fits else 'over by ' + format(compiled - limit, ',.0f') + ' B'}")
        if fits:
            return dataclasses.replace(found, memory_limit_bytes=limit, compiled_memory_bytes=compiled,
                                       verify_rounds=round_, verify_seconds=time.perf_counter() - started)
        if best is None or compiled < best[0]:
            best = (compiled, found)
        searched = found.memory_limit_bytes - (compiled - limit)  # the excess taken off the limit searched
        if searched <= 0:
            break
    compiled, found = best
    raise InfeasibleMemoryError(
        f"no plan verifies under {limit:,.0f} B per device: of the {len(compiled_rounds)} plan(s) compiled, the "
        f"smallest needs {compiled:,.0f} B (mesh {'x'.join(map(str, found.mesh))}, predicted "
        f"{found.memory_bytes_per_device:,.0f} B); raise the memory limit, use more devices or a smaller batch",
        compiled)
