"""``shardplan plan``: search the fastest per-layer sharding of a model.

``shardplan plan MODEL --devices P [--memory-limit 16GiB] [--hardware NAME|FILE]
[--batch B | --batch-per-device b] [--method auto|gradient|dp|milp] [--seed S]
[--dtype float32|bfloat16] [--optimizer sgd|momentum|adam] [--calibration FILE]
[--allow-cross-node-model-axis] [--pipeline auto|always|never] [--json] [--full] [-o plan.json]``

Prints the per-layer plan (strategy, compute, communication, resharding,
memory), the mesh, the predicted iteration time and its speed-up over pure
data parallelism: a rich table on a terminal (compact above 40 layers,
every row with ``--full``: :mod:`planner._compact`), JSON otherwise (or with
``--json``; the keys of ``shardplan evaluate --json`` plus ``mesh``,
``method``, ``seconds`` and the search's own). ``-o FILE`` writes the plan
JSON as well (``shardplan evaluate --plan FILE`` reads it back). Same inputs
and seed give the same plan. When no plan fits the memory limit the command
prints one line saying the smallest limit that would fit and exits with 1;
usage errors exit with 2.

A decoder (a zoo decoder or a transformer-config file) that no one-stage
plan fits is planned with pipeline stages (``--pipeline auto``, the default;
``always``: only pipelined plans, ``never``: none): the table then shows the
mesh (stage x data x model), the micro-batches, schedule and memory levers,
the predicted step and its parts, one row per stage and the per-layer
strategies of one block (every block runs the same).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from planner.cli.common import COMMAND_HELP, add_model_argument

__all__ = ["add_plan_commands"]


def _progress(console: Any):
    """A callback that shows the search's stages on a terminal (stderr)."""
    status = console.status("planning ...")
    status.start()

    def callback(event) -> None:
        status.update(f"{event.stage}: {event.message}")
        if event.stage == "done":
            status.stop()

    return callback, status


def _render(data: dict[str, Any], output: str | None, full: bool = True) -> None:
    from planner.cli._terminal import console as terminal

    from planner._format import format_bytes
    from planner.cli.cost import layer_cost_table

    d, m = data["mesh"]
    speedup = data["speedup_over_data_parallel"]
    dp_mem = data.get("data_parallel_memory_bytes")
    room = data["memory_limit_bytes"] - data.get("memory_margin_bytes", 0.0)
    if speedup is None:
        vs_dp = ", pure data parallelism cannot split the batch over every device"
    elif dp_mem is not None and dp_mem > room:
        vs_dp = (f", {speedup:.3f}x pure data parallelism ({data['data_parallel_iteration_s'] * 1e3:.3f} ms), "
                 f"which does not fit the limit ({format_bytes(dp_mem)} per device)")
    else:
        vs_dp = f", {speedup:.3f}x pure data parallelism ({data['data_parallel_iteration_s'] * 1e3:.3f} ms)"
    if data.get("fastest_iteration_s") is not None:
        fd, fm = data["fastest_mesh"]
        vs_dp += (f"; the simplest plan within 1% of the fastest found ({data['fastest_iteration_s'] * 1e3:.3f} ms "
                  f"on mesh {fd}x{fm}, {data['iteration_s'] / data['fastest_iteration_s'] - 1:.2%} faster)")
    title = (
        f"{data['model']} on {data['devices']} x {data['hardware']}, mesh {d}x{m} (data x model), "
        f"batch {data['batch']}, {data['dtype']}, {data['optimizer']}: "
        f"{data['iteration_s'] * 1e3:.3f} ms/iteration{vs_dp}"
    )
    console = terminal()
    console.print(layer_cost_table(title, data["layers"], full=full, iteration_s=data["iteration_s"]))
    gap = data["optimality_gap"]
    gap_text = "optimal" if gap == 0 else (f"within {gap:.2%} of optimal" if gap is not None else "no optimality bound")
    console.print(
        f"memory {format_bytes(data['memory_bytes_per_device'])} per device (limit "
        f"{format_bytes(data['memory_limit_bytes'])}, device {format_bytes(data['memory_capacity_bytes'])}); "
        f"method {data['method']} ({gap_text}), seed {data['seed']}, searched {len(data['meshes'])} mesh shape(s) "
        f"in {data['seconds']:.2f} s" + (f"; written to {output}" if output else ""),
        highlight=False,
    )


def _render_pipelined(result: Any, output: str | None) -> None:
    """A pipelined plan: its header, one row per stage and one block's strategies
    (:func:`planner.plans.summary.pipeline_summary`), and how the search went."""
    from planner.cli._terminal import console as terminal

    p = result.pipeline
    console = terminal()
    console.print(result.summary(), highlight=False, markup=False)
    console.print(
        f"searched {p.candidates} pipelined configurations ({p.fitting} fit) and {len(result.meshes)} one-stage "
        f"mesh shape(s) in {result.seconds:.2f} s" + (f"; written to {output}" if output else ""), highlight=False)


def _flax_model_to_verify(args: argparse.Namespace, hw: Any) -> Any:
    """The Flax model ``--verify`` compiles (:func:`planner.models.loading.flax_model_of`),
    where the plan's compiler is on this machine; None otherwise."""
    from planner.models.loading import flax_model_of
    from planner.plan_inputs import platform_of
    from planner.verification import gpu_compiler_missing

    platform = platform_of(args.platform, hw)
    if args.verify is False or platform == "tpu" or (platform == "gpu" and gpu_compiler_missing(hw)):
        return None
    return flax_model_of(args.model)


def _run_plan(args: argparse.Namespace) -> int:
    from costmodels import load_calibration, load_hardware
    from costmodels import check_writable, schedule_note
    from planner.cli import cost_table_cache_dir
    from planner.cli.common import PROG, notes_to_stderr
    from planner.plan_inputs import platform_of
    from planner.models.loading import load_model, transformer_of
    from planner.plan_inputs import check_seed
    from planner.planning import InfeasibleMemoryError, parse_memory_limit, plan
    from planner._format import printable
    from planner.usage import one_line

    # what the plan file holds must read back (plan_file.py): counts within its integer range
    if not args.time_budget >= 0:
        raise ValueError(f"--time-budget must be a non-negative number of seconds, got {args.time_budget}")
    if not args.milp_time_limit >= 0:
        raise ValueError(f"--milp-time-limit must be a non-negative number of seconds, got {args.milp_time_limit}")
    check_seed(args.seed, "--seed")
    for name, v in (("--devices", args.devices), ("--batch", args.batch),
                    ("--batch-per-device", args.batch_per_device)):
        if v is not None and v >= 10**15:
            raise ValueError(f"{name} must be below 10^15, got {v}")
    limit = parse_memory_limit(args.memory_limit) if args.memory_limit is not None else None
    if args.output:
        check_writable(args.output, "-o")  # before the search, not after it
    if args.verify is not False:  # XLA:CPU devices for the plan's mesh, set before JAX starts
        from planner.verification import VERIFY_MAX_CPU_DEVICES

        if args.devices <= VERIFY_MAX_CPU_DEVICES and "JAX_NUM_CPU_DEVICES" not in os.environ:
            import jax

            try:
                jax.config.update("jax_num_cpu_devices", max(args.devices, jax.config.jax_num_cpu_devices))
            except RuntimeError:  # the backends have started (a caller's JAX): their devices stay
                pass
    graph = load_model(args.model, args.on_unsupported)
    decoder = transformer_of(args.model)
    model, name = (graph, None) if decoder is None else decoder  # a transformer: planned from its config
    hw = load_hardware(args.hardware)
    flax_model = _flax_model_to_verify(args, hw)
    calibration = load_calibration(args.calibration) if args.calibration else None
    as_json = args.json or not sys.stdout.isatty()
    progress, status = None, None
    if not as_json and sys.stderr.isatty():
        from planner.cli._terminal import console as terminal

        progress, status = _progress(terminal(stderr=True))
    # why a plan was not verified, where the default expects it (a cpu plan, or --verify, which raises instead)
    callback = notes_to_stderr(progress, verify_notes=platform_of(args.platform, hw) == "cpu")
    try:
        result = plan(
            model, name=name, pipeline=args.pipeline, devices=args.devices, hardware=hw, memory_limit=limit, batch=args.batch,
            batch_per_device=args.batch_per_device, method=args.method, seed=args.seed, dtype=args.dtype,
            optimizer=args.optimizer, allow_cross_node_model_axis=args.allow_cross_node_model_axis,
            calibration=calibration, allow_other_hardware=args.allow_other_hardware, callback=callback,
            platform=args.platform, milp_time_limit_s=args.milp_time_limit if args.milp_time_limit > 0 else None,
            time_budget_s=args.time_budget if args.time_budget > 0 else None,
            levers=args.levers, cache_dir=cost_table_cache_dir(), verify=args.verify, flax_model=flax_model,
        )
    except InfeasibleMemoryError as e:
        print(f"{PROG}: error: {printable(one_line(str(e)))}", file=sys.stderr)
        return 1
    finally:
        if status is not None:
            status.stop()
    if result.platform == "cpu" and schedule_note():
        print(f"{PROG}: note: {schedule_note()}", file=sys.stderr)
    if result.compiled_memory_bytes is not None:
        print(f"{PROG}: verified: the compiled step needs {result.compiled_memory_bytes:,.0f} B per device, within "
              f"the limit ({result.verify_rounds} compile(s), {result.verify_seconds:.1f} s)", file=sys.stderr)
    if args.output:
        result.write(args.output)  # atomic (costmodels/files.py); the path was checked before the search
    data = result.to_dict()
    if as_json:
        print(result.to_json())
    elif result.pipeline is not None:
        _render_pipelined(result, args.output)
    else:
        _render(data, args.output, full=args.full)
    return 0


def add_plan_commands(sub: Any) -> None:
    """Register ``plan`` on an argparse subparsers object."""
    from costmodels import LEVER_CHOICES
    from planner._compact import COMPACT_ABOVE
    from search import METHODS, TIME_BUDGET_S

    pl = sub.add_parser(
        "plan", help=COMMAND_HELP["plan"],
        description="Search the fastest per-layer sharding of a model on P devices within a memory limit, "
                    "over every data x model mesh shape; print it and optionally write it.",
    )
    add_model_argument(pl)
    pl.add_argument("--devices", type=int, required=True, metavar="P", help="number of devices")
    pl.add_argument("--memory-limit", metavar="SIZE",
                    help="per device, e.g. 16GiB, 16GB, 500MiB or bytes (default: the device's memory)")
    pl.add_argument("--hardware", default="abci-v100", metavar="NAME|FILE", help="preset or JSON file (default abci-v100)")
    batch = pl.add_mutually_exclusive_group()
    batch.add_argument("--batch", type=int, metavar="B", help="global batch")
    batch.add_argument("--batch-per-device", type=int, metavar="b", help="samples per device (default 32)")
    pl.add_argument("--method", choices=METHODS, default="auto",
                    help="auto (DP on chains, else MILP; the gradient search joins in where they prove nothing "
                         "within 5 s), gradient, dp (chains) or milp (default auto)")
    pl.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the gradient search (default 0)")
    pl.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    pl.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="adam")
    pl.add_argument("--calibration", metavar="FILE", help="measured per-layer times (shardplan profile)")
    pl.add_argument("--allow-other-hardware", action="store_true",
                    help="use a calibration measured on other hardware than --hardware")
    pl.add_argument("--time-budget", type=float, default=TIME_BUDGET_S, metavar="S",
                    help="with --method auto: where the exact solvers prove nothing in their share, stop the "
                         "local search after about S seconds per mesh-shape search with the plan it has; "
                         f"0 = no budget (default {TIME_BUDGET_S:g})")
    pl.add_argument("--milp-time-limit", type=float, default=120.0, metavar="S",
                    help="with --method milp (or where auto runs it): stop after S seconds per mesh shape with the "
                         "best plan found and report its optimality gap; 0 = no limit (default 120)")
    pl.add_argument("--platform", choices=("cpu", "gpu", "tpu"), default=None,
                    help="XLA platform the plan will be compiled on; the search keeps its memory margin free "
                         "(default: the hardware's, cpu for cpu-local, else gpu)")
    pl.add_argument("--levers", choices=("auto", *LEVER_CHOICES), default="auto",
                    help="memory levers each layer may take beside its strategy: zero (ZeRO stages 1-3 over its "
                         "data-parallel group), remat (recompute its activations in the backward pass; on a CNN, in runs "
                         "of layers), all, none, or auto (the default: none, and all only when no plan without "
                         "levers fits; a lever that buys nothing is dropped, docs/levers.md)")
    pl.add_argument("--allow-cross-node-model-axis", action="store_true",
                    help="also try model axes larger than one node")
    pl.add_argument("--pipeline", choices=("auto", "always", "never"), default="auto",
                    help="pipeline stages for a decoder: auto (when no one-stage plan fits the memory), always "
                         "(only pipelined plans) or never (default auto; docs/llm-scale.md)")
    pl.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                    help="compile the plan's training step (XLA, nothing runs) and plan again below the limit "
                         "while the compiled program exceeds it (default: where the plan's compiler is on this "
                         "machine: --platform cpu with a Flax model)")
    pl.add_argument("--json", action="store_true", help="print JSON even on a terminal")
    pl.add_argument("-o", "--output", metavar="FILE", help="write the plan as JSON to FILE")
    pl.add_argument("--full", action="store_true",
                    help=f"print every layer's row: a table of more than {COMPACT_ABOVE} layers otherwise groups "
                         "runs of data-parallel layers of one block into one row each (JSON is never grouped)")
    pl.set_defaults(run=_run_plan)
