"""Plans on JAX's runtime: export to jax.sharding, the sharded step, multi-process meshes, validation against the
compiled program, HLO parsing, and pipelined training over a stage mesh axis.

The pipeline's names load on first use (``_LAZY`` says from which module), so
``import planner.runtime`` pays for neither JAX nor Flax; type checkers see
them through the ``TYPE_CHECKING`` imports below."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (module docstring)
    from planner.runtime._pipeline_chain import nnx_chain
    from planner.runtime._pipeline_schedule import (
        SCHEDULE_NAMES,
        ExecutorTables,
        PipelineSchedule,
        executor_tables,
        pipeline_schedule,
    )
    from planner.runtime.pipeline import (
        PIPELINE_AXES,
        Chain,
        ChainParams,
        param_name,
        pipeline_loss_and_grads,
        pipeline_mesh,
        pipeline_shardings,
        pipeline_step,
        pipeline_training,
    )

__all__ = [
    "PIPELINE_AXES",
    "SCHEDULE_NAMES",
    "Chain",
    "ChainParams",
    "ExecutorTables",
    "PipelineSchedule",
    "executor_tables",
    "nnx_chain",
    "param_name",
    "pipeline_loss_and_grads",
    "pipeline_mesh",
    "pipeline_schedule",
    "pipeline_shardings",
    "pipeline_step",
    "pipeline_training",
]

_LAZY = {  # public name -> the module it is defined in, imported on first use
    "nnx_chain": "planner.runtime._pipeline_chain",
    "SCHEDULE_NAMES": "planner.runtime._pipeline_schedule",
    "ExecutorTables": "planner.runtime._pipeline_schedule",
    "PipelineSchedule": "planner.runtime._pipeline_schedule",
    "executor_tables": "planner.runtime._pipeline_schedule",
    "pipeline_schedule": "planner.runtime._pipeline_schedule",
    "PIPELINE_AXES": "planner.runtime.pipeline",
    "Chain": "planner.runtime.pipeline",
    "ChainParams": "planner.runtime.pipeline",
    "param_name": "planner.runtime.pipeline",
    "pipeline_loss_and_grads": "planner.runtime.pipeline",
    "pipeline_mesh": "planner.runtime.pipeline",
    "pipeline_shardings": "planner.runtime.pipeline",
    "pipeline_step": "planner.runtime.pipeline",
    "pipeline_training": "planner.runtime.pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'planner.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
