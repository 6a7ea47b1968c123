"""One plan across processes: ``python -m planner.launch`` starts
JAX processes on localhost joined by ``jax.distributed`` (CPU devices, gloo
collectives); the same plan gives the same losses on 2 processes x 4 devices
as on 1 process x 8, the sharded state survives a restart through Orbax (the
resumed run's losses are the uninterrupted run's, exactly), and
a dead process stops the run instead of hanging it.

Every subprocess runs in its own process group and is killed in ``finally``;
ports are chosen at run time; every wait has a hard timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from costmodels import load_hardware
from planner.launch import free_port, launch, main, process_env
from planner.runtime import distributed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"
HARD_TIMEOUT_S = 240  # per subprocess run: generous for a loaded 2-core machine; a hang fails here


def _env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["JAX_PLATFORMS"] = "cpu"
    if cache is not None:  # the restart reuses the first run's compiled step
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env.update(extra)
    return env


def _popen(cmd: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, **kw)


def _stop(p: subprocess.Popen | None) -> None:
    """SIGTERM the process group (a launcher then stops its own processes),
    SIGKILL after 10 s; close its pipes."""
    if p is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if p.poll() is not None:
            break
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=10)
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    for f in (p.stdout, p.stderr):
        if f is not None:
            f.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- configuration, mesh and batch helpers (no subprocess) -------------------------------


def test_config_from_env_reads_launcher_and_cluster_settings():
    env = process_env({}, 1, 2, 4, "127.0.0.1:1234", "cpu", 7)
    cfg = distributed.config_from_env(env)
    assert cfg == distributed.DistributedConfig("launcher", "127.0.0.1:1234", 2, 1, 4, 7)
    assert env["JAX_NUM_CPU_DEVICES"] == "4" and env["JAX_PLATFORMS"] == "cpu"
    # SLURM with several tasks: JAX's own cluster detection fills every field
    slurm = distributed.config_from_env({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"})
    assert (slurm.source, slurm.coordinator_address, slurm.num_processes, slurm.process_id) == ("cluster", None, None, None)
    assert slurm.devices_per_process is None  # JAX's default
    # one task per node owning all 8 GPUs of it
    assert distributed.config_from_env({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", distributed.ENV_DEVICES_PER_PROCESS: "8"}
                                       ).devices_per_process == 8
    assert distributed.config_from_env({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "1"}) is None
    assert distributed.config_from_env({}) is None
    with pytest.raises(ValueError, match="SHARDPLAN_PROCESS_ID=2 must be below SHARDPLAN_NUM_PROCESSES=2"):
        distributed.config_from_env({**env, distributed.ENV_PROCESS_ID: "2"})
    with pytest.raises(ValueError, match="is set but SHARDPLAN_NUM_PROCESSES"):
        distributed.config_from_env({distributed.ENV_COORDINATOR: "h:1", distributed.ENV_PROCESS_ID: "0"})
    with pytest.raises(ValueError, match="not an integer"):
        distributed.config_from_env({**env, distributed.ENV_NUM_PROCESSES: "two"})


def test_process_env_overrides_an_inherited_device_count_and_splits_gpus():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x"}
    cpu = process_env(base, 0, 2, 4, "127.0.0.1:1", "cpu", 20)
    assert cpu["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    assert process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 0, 2, 4, "h:1", "cpu", 20
                       ).get("XLA_FLAGS") is None
    gpu = process_env({}, 1, 2, 4, "127.0.0.1:1", "gpu", 20)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and "JAX_NUM_CPU_DEVICES" not in gpu
    assert distributed.config_from_env(gpu).devices_per_process == 4  # GPUs 0-3 of the visible 4


def test_process_mesh_keeps_the_model_axis_inside_a_process(devices):
    mesh = distributed.process_mesh(2, 4)
    assert mesh.axis_names == ("data", "model") and mesh.devices.shape == (2, 4)
    assert distributed.process_rows(16, mesh) == slice(0, 16)  # one process feeds every row
    # four fake devices in each of two processes, listed interleaved
    fake = [SimpleNamespace(id=10 * p + i, process_index=p) for i in range(4) for p in range(2)]
    with pytest.raises(ValueError, match=r"model axis of 8 devices would span processes \[0, 1\].*\[4, 4\]"):
        distributed.process_mesh(1, 8, fake)
    with pytest.raises(ValueError, match="a 3x2 mesh needs 6 devices, but 8"):
        distributed.process_mesh(3, 2, fake)


def test_crosses_processes_reads_device_groups_against_the_mesh():
    fake = SimpleNamespace(devices=SimpleNamespace(reshape=lambda _: [SimpleNamespace(process_index=i // 4)
                                                                      for i in range(8)]))
    assert not distributed.crosses_processes([(0, 1, 2, 3), (4, 5, 6, 7)], fake)
    assert distributed.crosses_processes([(0, 4), (1, 5)], fake)


@pytest.fixture(scope="module")
def vgg_plan():
    """planner.plan's plan of VGG16-CIFAR-10 on 2 processes x 4 local CPU devices."""
    import planner

    return planner.plan("vgg16-cifar10", devices=8, hardware="cpu-local", batch=8)


def test_plan_puts_cross_process_collectives_on_the_inter_node_tier(vgg_plan):
    hw = load_hardware("cpu-local")
    assert hw.devices_per_node == 4
    plan = vgg_plan
    assert plan.mesh == (2, 4)  # the model axis is one process
    assert any(s in ("filter", "channel") for s in plan.strategies.values())  # a hybrid, not pure data parallel
    tiers = distributed.collective_tiers(plan, hw)
    assert len(tiers) == len(plan.collectives) > 0
    # hand-derived: on a 2x4 process mesh the model axis is one process; the
    # data axis (alone or with the model axis) joins the two processes
    for t in tiers:
        crosses = "data" in t.collective.axes
        assert t.crosses_processes == crosses
        assert t.ranks == {("model",): 4, ("data",): 2, ("data", "model"): 8}[t.collective.axes]
        assert t.tier == ("gloo-loopback" if crosses else "in-process")
    assert {t.crosses_processes for t in tiers} == {True, False}


# -- the launcher on plain scripts (no JAX in the processes) ------------------------------


def test_launcher_reports_usage_errors(capsys):
    assert main(["--processes", "2", "--devices-per-process", "4", "--", "no/such/script.py"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m planner.launch: error: script 'no/such/script.py' does not exist (use -m for a module)")
    assert main(["--processes", "0", "--devices-per-process", "4", "--", __file__]) == 2
    assert "--processes must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["--processes", "2", "--devices-per-process", "4"]) == 2
    assert "no program to run" in capsys.readouterr().err
    assert main(["--processes", "2"]) == 2  # argparse: --devices-per-process is required


def test_launcher_runs_every_process_with_its_id_and_stops_on_timeout(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(textwrap.dedent("""
        import os, pathlib, sys, time
        pathlib.Path(sys.argv[1], os.environ["SHARDPLAN_PROCESS_ID"]).write_text(
            os.environ["SHARDPLAN_NUM_PROCESSES"] + " " + os.environ["SHARDPLAN_COORDINATOR"])
        time.sleep(float(sys.argv[2]))
    """))
    r = launch([str(script), str(tmp_path), "0"], 3, 2, platform="cpu", timeout_s=HARD_TIMEOUT_S)
    assert r.ok and r.returncodes == (0, 0, 0) and r.message == ""
    texts = {(tmp_path / str(i)).read_text() for i in range(3)}
    assert len(texts) == 1 and texts.pop().startswith("3 127.0.0.1:")
    pids = []
    r = launch([str(script), str(tmp_path), "600"], 2, 1, platform="cpu", timeout_s=1.0, grace_s=2.0,
               on_start=lambda i, pid: pids.append(pid))
    assert r.timed_out and not r.ok and r.failed is None
    assert r.message == "the run exceeded --timeout 1 s; stopped all 2 processes"
    assert r.returncodes == (-signal.SIGTERM, -signal.SIGTERM)
    assert not any(_alive(p) for p in pids)


# -- JAX processes ------------------------------------------------------------------------

_WORKER = """
import os, pathlib, sys, time
from planner.runtime import distributed
distributed.initialize()
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = distributed.process_mesh(jax.process_count(), jax.local_device_count())
rows = distributed.process_rows(8, mesh)
total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P()))
x = distributed.global_batch(np.arange(8, dtype=np.float32)[rows], mesh)
assert float(total(x).addressable_data(0)) == 28.0  # a collective across both processes worked
pathlib.Path(sys.argv[1], str(jax.process_index())).write_text(str(os.getpid()))
while True:  # keep exchanging data with the other process
    total(x).block_until_ready()
    time.sleep(0.1)
"""


def _wait_for_files(directory: Path, names: list[str], procs: list[subprocess.Popen]) -> list[int]:
    deadline = time.monotonic() + HARD_TIMEOUT_S
    while not all((directory / n).exists() for n in names):
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"a process exited before the run started: {[p.poll() for p in procs]}")
        if time.monotonic() > deadline:
            pytest.fail("the processes did not start within the hard timeout")
        time.sleep(0.1)
    time.sleep(0.2)  # let the files' writers finish
    return [int((directory / n).read_text()) for n in names]


@pytest.mark.slow
def test_killing_a_process_stops_the_launch_with_one_line(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    launcher = None
    try:
        launcher = _popen([sys.executable, "-m", "planner.launch", "-n", "2", "-k", "2", "--platform", "cpu",
                           "--timeout", str(HARD_TIMEOUT_S), "--", str(worker), str(tmp_path)],
                          _env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        pid0, pid1 = _wait_for_files(tmp_path, ["0", "1"], [launcher])
        os.kill(pid1, signal.SIGKILL)
        _, err = launcher.communicate(timeout=30)  # the grace period is 5 s
        assert launcher.returncode == 1
        assert err.strip().splitlines()[-1].startswith(
            f"python -m planner.launch: error: process 1 (pid {pid1}) exited with signal SIGKILL after ")
        assert err.strip().endswith("stopped the other 1 process")
        assert not _alive(pid0)
    finally:
        _stop(launcher)


@pytest.mark.slow
def test_without_a_launcher_jax_heartbeats_stop_the_survivor(tmp_path):
    """On a cluster no launcher watches: the process that loses its peer exits
    through JAX's coordination service once the heartbeat timeout passes."""
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    coordinator = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen] = []
    try:
        for i in range(2):
            procs.append(_popen([sys.executable, str(worker), str(tmp_path)],
                                process_env(_env(), i, 2, 2, coordinator, "cpu", heartbeat_s=3),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        _, pid1 = _wait_for_files(tmp_path, ["0", "1"], procs)
        os.kill(pid1, signal.SIGKILL)
        _, err = procs[0].communicate(timeout=60)  # heartbeat 3 s; hangs would fail here
        assert procs[0].returncode != 0
        assert "stopped sending heartbeats" in err or "another task died" in err
    finally:
        for p in procs:
            _stop(p)


def _run_example(cmd: list[str], env: dict[str, str], out: Path) -> dict:
    p = None
    try:
        p = _popen(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log, _ = p.communicate(timeout=HARD_TIMEOUT_S)
        assert p.returncode == 0, log[-3000:]
        return {**json.loads(out.read_text()), "log": log}
    finally:
        _stop(p)


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume_from_a_checkpoint(tmp_path, request, vgg_plan):
    plan = vgg_plan
    assert plan.mesh == (2, 4) and any(s in ("filter", "channel") for s in plan.strategies.values())
    plan_file = tmp_path / "plan.json"
    plan.write(plan_file)
    store = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = store.mkdir("jax_compilation_cache") if store is not None else tmp_path / "cache"
    env = _env(cache)
    ckpt = tmp_path / "ckpt"
    single = [sys.executable, str(EXAMPLE), "--plan", str(plan_file)]
    launch_cmd = [sys.executable, "-m", "planner.launch", "-n", "2", "-k", "4", "--platform", "cpu",
                  "--timeout", str(HARD_TIMEOUT_S), "--", str(EXAMPLE), "--plan", str(plan_file)]
    ref_proc = None
    try:
        # the one-process reference (3 steps) runs beside the first two-process run (3 steps, then save)
        ref_proc = _popen(single + ["--steps", "3", "--out", str(tmp_path / "ref.json")],
                          _env(cache, JAX_NUM_CPU_DEVICES="8"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
        first = _run_example(launch_cmd + ["--steps", "3", "--save", str(ckpt), "--validate",
                                           "--out", str(tmp_path / "a.json")], env, tmp_path / "a.json")
        log, _ = ref_proc.communicate(timeout=HARD_TIMEOUT_S)
        assert ref_proc.returncode == 0, log[-3000:]
        ref = json.loads((tmp_path / "ref.json").read_text())
    finally:
        _stop(ref_proc)
    assert (ref["processes"], ref["devices"]) == (1, 8)
    assert (first["processes"], first["devices"], first["mesh"]) == (2, 8, [2, 4])
    assert first["rows_of_process_0"] == [0, 4]  # each process feeds its own half of the batch
    # what a user reads: one line per step and a summary, from process 0 only (among the transport's lines)
    steps = [ln for ln in first["log"].splitlines() if ln.startswith("step ")]
    assert [ln.split()[:4] for ln in steps] == [["step", f"{i}/2", "loss", f"{first['losses'][i]:.6f}"] for i in range(3)]
    assert [ln for ln in first["log"].splitlines() if ln.startswith("done: ")] == [
        ln for ln in first["log"].splitlines() if ln.startswith(f"done: 3 step(s), loss {first['losses'][0]:.6f} -> ")]
    assert sum(ln.startswith("done: ") for ln in first["log"].splitlines()) == 1
    assert "in 2 process(es), mesh 2x4" in first["log"]
    # each process wrote its own shards
    assert {p.name for p in ckpt.iterdir() if p.name.startswith("ocdbt.process_")} == {"ocdbt.process_0",
                                                                                       "ocdbt.process_1"}
    # both processes restart from the checkpoint and continue
    second = _run_example(launch_cmd + ["--steps", "3", "--start-step", "3", "--restore", str(ckpt),
                                        "--out", str(tmp_path / "b.json")], env, tmp_path / "b.json")
    # the same two processes, 6 steps without the restart
    whole = _run_example(launch_cmd + ["--steps", "6", "--out", str(tmp_path / "c.json")], env, tmp_path / "c.json")
    # gloo sums across processes in another order than one process does: f32 rounding only
    assert first["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    # The restored state is the saved one bit for bit and runs the same compiled step: the same losses exactly.
    # The one-process run is no oracle for the steps after the restart: Adam's first updates move a weight
    # whose gradient is rounding noise by up to the learning rate, and from the third step on the losses part
    # by up to 1e-3 relative wherever f32 rounding differs (measured: one process whose initial weights moved
    # by at most one ulp follows the two-process losses, not its own unmoved run's).
    assert first["losses"] + second["losses"] == whole["losses"]
    assert len(set(whole["losses"])) == 6  # training moves the loss: a stale state would not match

    # what crossed processes in the compiled program is what the plan charges to the inter-node tier
    assert first["collectives_error"] is None
    compiled = {(c["kind"], tuple(c["axes"])) for c in first["collectives"] if c["crosses_processes"]}
    planned = {(t.collective.kind, t.collective.axes) for t in distributed.collective_tiers(plan, load_hardware("cpu-local"))
               if t.tier == "gloo-loopback"}
    assert planned == {("all-reduce", ("data",)), ("all-reduce", ("data", "model"))}
    # XLA may also swap a small layer's weight-gradient all-reduce over data for all-gathers of its (smaller)
    # activations over data (docs/validation.md, known differences); those cross processes too
    assert planned <= compiled and all("data" in axes for _, axes in compiled)
    assert all(not c["crosses_processes"] for c in first["collectives"] if c["axes"] == ["model"])
    # planner.validate, run in both processes, says the same of its compiled step
    rows = first["validation"]
    assert rows and all(r["crosses_processes"] == ("data" in r["axes"]) for r in rows)
    assert planned <= {(r["kind"], tuple(r["axes"])) for r in rows if r["crosses_processes"]}
