"""``python -m planner.launch``: start one program as several JAX processes
on this machine, joined by ``jax.distributed``.

::

    python -m planner.launch --processes 2 --devices-per-process 4 -- train.py --steps 3
    python -m planner.launch --processes 2 --devices-per-process 4 -- -m mypackage.train

Every process gets the environment :func:`planner.runtime.distributed.initialize`
reads (coordinator ``127.0.0.1:<free port>``, process count and id, devices
per process, heartbeat timeout). On CPU (``--platform cpu``, or ``auto``
when this machine has fewer NVIDIA GPUs than requested), each process gets
``--devices-per-process`` XLA CPU devices and gloo collectives; with
``--platform gpu`` (or ``auto`` when enough NVIDIA GPUs are present) process
``i`` sees GPUs ``i*K .. i*K+K-1`` through ``CUDA_VISIBLE_DEVICES``.

Failure handling: the launcher watches its processes; when one exits with a
non-zero status (or is killed), it stops the others (SIGTERM to each
process group, SIGKILL after ``--grace`` seconds) and exits with status 1
and one line naming the process and its status. ``--timeout`` bounds the
whole run the same way. JAX's own heartbeat (``--heartbeat``) is the
backstop on clusters, where no launcher watches: a process that stops
sending heartbeats for that long makes every other one exit.

This is a convenience for one machine; on a cluster, use the scheduler's
launcher (``srun``) and let :func:`planner.runtime.distributed.initialize` read its
environment (docs/multi-host.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from planner.runtime.distributed import (
    ENV_COORDINATOR,
    ENV_DEVICES_PER_PROCESS,
    ENV_HEARTBEAT_SECONDS,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
)

__all__ = ["LaunchResult", "free_port", "launch", "main", "process_env"]

PROG = "python -m planner.launch"
_POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How a launch ended."""

    returncodes: tuple[int | None, ...]  # per process; negative = killed by that signal, None = never exited
    failed: int | None  # the first process seen to fail, None if all succeeded or the run timed out
    timed_out: bool
    seconds: float  # wall time from start to the last process stopping
    message: str  # one line, empty on success

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.timed_out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


def _platform(platform: str, processes: int, devices_per_process: int) -> str:
    if platform not in ("auto", "cpu", "gpu"):
        raise ValueError(f"unknown platform {platform!r}; choose auto, cpu or gpu")
    if platform != "auto":
        return platform
    gpus = _gpu_count()
    return "gpu" if gpus and gpus >= processes * devices_per_process else "cpu"


def process_env(
    base: Mapping[str, str],
    process_id: int,
    processes: int,
    devices_per_process: int,
    coordinator: str,
    platform: str,
    heartbeat_s: int,
) -> dict[str, str]:
    """The environment of process ``process_id``: ``base`` plus the settings
    :func:`planner.runtime.distributed.config_from_env` reads and the platform's
    device selection."""
    env = dict(base)
    env[ENV_COORDINATOR] = coordinator
    env[ENV_NUM_PROCESSES] = str(processes)
    env[ENV_PROCESS_ID] = str(process_id)
    env[ENV_DEVICES_PER_PROCESS] = str(devices_per_process)
    env[ENV_HEARTBEAT_SECONDS] = str(heartbeat_s)
    env["PYTHONUNBUFFERED"] = "1"  # a dying process's last lines reach the terminal
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        # An inherited forced device count (tests set one) would override ours.
        flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", "")).strip()
        if flags:
            env["XLA_FLAGS"] = flags
        else:
            env.pop("XLA_FLAGS", None)
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
    else:
        first = process_id * devices_per_process
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + j) for j in range(devices_per_process))
    return env


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every live process group, then SIGKILL whatever outlives ``grace_s``."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in live) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for p in procs:
        try:  # the group too: grandchildren of a process that already exited
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()


def launch(
    command: Sequence[str],
    processes: int,
    devices_per_process: int,
    *,
    platform: str = "auto",
    port: int | None = None,
    timeout_s: float | None = None,
    heartbeat_s: int = 20,
    grace_s: float = 5.0,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> LaunchResult:
    """Run ``command`` (a script and its arguments, or ``-m module ...``) as
    ``processes`` Python processes of ``devices_per_process`` devices each,
    and wait for them; stop all of them as soon as one fails or
    ``timeout_s`` passes. ``on_start(process_id, pid)`` is called for each
    process started. Processes inherit this one's stdout and stderr."""
    if processes < 1:
        raise ValueError(f"--processes must be a positive integer, got {processes}")
    if devices_per_process < 1:
        raise ValueError(f"--devices-per-process must be a positive integer, got {devices_per_process}")
    if heartbeat_s < 1:
        raise ValueError(f"--heartbeat must be at least 1 second, got {heartbeat_s}")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"--timeout must be positive seconds, got {timeout_s}")
    command = list(command)
    if not command:
        raise ValueError("no program to run; put it after --, e.g. -- train.py --steps 3")
    if command[0] == "-m" and len(command) < 2:
        raise ValueError("-m needs a module name")
    if command[0] != "-m" and not os.path.isfile(command[0]):
        raise ValueError(f"script {command[0]!r} does not exist (use -m for a module)")
    plat = _platform(platform, processes, devices_per_process)
    if plat == "gpu" and _gpu_count() < processes * devices_per_process:
        raise ValueError(f"{processes} x {devices_per_process} GPUs requested but {_gpu_count()} are visible; "
                         "use fewer or --platform cpu")
    coordinator = f"127.0.0.1:{free_port() if port is None else port}"
    base = dict(os.environ if env is None else env)
    argv = [sys.executable, *command]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    failed: int | None = None
    timed_out = False
    try:
        for i in range(processes):
            p = subprocess.Popen(
                argv,
                env=process_env(base, i, processes, devices_per_process, coordinator, plat, heartbeat_s),
                start_new_session=True,  # its own process group, stopped as one
            )
            procs.append(p)
            if on_start is not None:
                on_start(i, p.pid)
        while True:
            codes = [p.poll() for p in procs]
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                timed_out = True
                break
            time.sleep(_POLL_S)
    finally:
        _stop(procs, grace_s)
    codes = tuple(p.returncode for p in procs)
    seconds = time.monotonic() - start
    if failed is not None:
        others = processes - 1
        message = (f"process {failed} (pid {procs[failed].pid}) exited with {_describe(codes[failed])} "
                   f"after {seconds:.1f} s; stopped the other {others} process{'es' if others != 1 else ''}")
    elif timed_out:
        message = f"the run exceeded --timeout {timeout_s:g} s; stopped all {processes} processes"
    else:
        message = ""
    return LaunchResult(codes, failed, timed_out, seconds, message)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Start a program as several JAX processes on this machine, joined by jax.distributed.",
        usage=f"{PROG} --processes N --devices-per-process K [options] -- SCRIPT.py [ARGS...] | -m MODULE [ARGS...]",
    )
    p.add_argument("--processes", "-n", type=int, required=True, help="number of processes")
    p.add_argument("--devices-per-process", "-k", type=int, required=True,
                   help="devices per process (a node of the hardware description)")
    p.add_argument("--platform", default="auto", choices=("auto", "cpu", "gpu"),
                   help="auto: GPUs when enough are present, else CPU devices with gloo collectives")
    p.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    p.add_argument("--timeout", type=float, default=None, help="stop everything after this many seconds")
    p.add_argument("--heartbeat", type=int, default=20,
                   help="seconds of silence after which JAX declares a process dead (default 20)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if "--" in argv:
        cut = argv.index("--")
        options, command = argv[:cut], argv[cut + 1:]
    else:
        options, command = argv, []
    if any(a in ("-h", "--help") for a in options):
        parser.print_help()
        return 0
    try:
        args = parser.parse_args(options)
    except SystemExit as e:  # argparse already printed its usage line
        return 2 if e.code else 0

    def forward(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds launch(), whose finally stops every process

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        result = launch(command, args.processes, args.devices_per_process, platform=args.platform, port=args.port,
                        timeout_s=args.timeout, heartbeat_s=args.heartbeat, grace_s=args.grace)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted; stopped all processes", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not result.ok:
        print(f"{PROG}: error: {result.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
