"""Can a plan's training step be compiled for a GPU on this machine, without
one? Deviceless ahead-of-time compilation through the CUDA PJRT plugin
(``jax-cuda12-plugin``, the ``gpu-aot`` extra): compile-only devices from
``jax.experimental.topologies.get_topology_desc(platform="cuda",
topology="1x1x8", target_config=...)``, a mesh of them, and ``lower`` /
``compile`` / ``memory_analysis()`` on abstract inputs. Nothing runs.

Steps, each in its own process (a target description XLA cannot use may
kill the process instead of raising):

* ``no-target-config``: a topology without a target description;
* ``no-topology-shape``: a target description without a topology shape;
* ``minimal-target-config``: only the compute capability (8.0), on
  ``sum(tanh(x @ x.T))`` with ``x``'s rows split over 8 devices;
* ``garbage-target-config``: text that is not a GpuTargetConfigProto;
* ``matmul-<preset>``: a 1024x1024 float32 matmul, rows split over 8 devices;
* ``plan-<preset>``: VGG16-CIFAR-10 at batch 64 planned for 8 devices of
  the preset (adam, float32), its step compiled for the preset's GPU by
  ``planner.runtime.gpu_target.validate_on_gpu_target``: predicted and
  compiled memory per device and collectives;
* ``plan-dgx-h100-bfloat16``: the same in bfloat16 (which XLA:CPU cannot check).

Without the plugin it records "plugin not installed" and stops.

    PYTHONPATH=. python benchmarks/gpu_aot_probe.py [--json PATH]

Rows and versions go to ``--json PATH`` (default
``benchmarks/results/gpu_aot_probe.json``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only devices need no GPU backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax",
            "nvidia-cuda-nvcc-cu12")
PRESETS = ("dgx-a100", "dgx-h100")
STEPS = ("no-target-config", "no-topology-shape", "minimal-target-config", "garbage-target-config",
         *(f"matmul-{p}" for p in PRESETS), *(f"plan-{p}" for p in PRESETS), "plan-dgx-h100-bfloat16")
DEVICES, MODEL, BATCH = 8, "vgg16-cifar10", 64


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def plugin_installed() -> bool:
    return importlib.util.find_spec("jax_plugins") is not None and any(
        importlib.util.find_spec(m) is not None for m in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"))


def _topology(**kw):
    from jax.experimental import topologies

    return topologies.get_topology_desc(platform="cuda", **kw)


def _matmul(preset: str) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from planner.runtime.gpu_target import gpu_target_config

    topo = _topology(topology=f"1x1x{DEVICES}", target_config=gpu_target_config(preset))
    mesh = Mesh(topo.devices[:DEVICES], ("x",))
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    ma = jax.jit(lambda a, b: jnp.sum(a @ b)).lower(x, w).compile().memory_analysis()
    return {"device_kind": topo.devices[0].device_kind, "argument_bytes": ma.argument_size_in_bytes,
            "output_bytes": ma.output_size_in_bytes, "temp_bytes": ma.temp_size_in_bytes}


def _plan(preset: str, dtype: str) -> dict:
    import planner
    from planner.models.flax_zoo import flax_model
    from planner.runtime.gpu_target import validate_on_gpu_target

    model, _ = flax_model(MODEL, batch=BATCH)
    plan = planner.plan(MODEL, devices=DEVICES, hardware=preset, batch=BATCH, optimizer="adam", dtype=dtype,
                        platform="gpu")
    t = time.perf_counter()
    report = validate_on_gpu_target(model, plan)
    return {"compile_s": round(time.perf_counter() - t, 2), "mesh": list(plan.mesh), "dtype": dtype,
            "platform": report.platform, "within_tolerance": report.ok,
            "memory": [{"part": r.part, "predicted_bytes": r.predicted_bytes, "compiled_bytes": r.compiled_bytes,
                        "ok": r.ok} for r in report.memory],
            "collectives": [{"kind": r.kind, "axes": list(r.axes), "predicted_bytes": r.predicted_bytes,
                             "compiled_bytes": r.compiled_bytes, "ok": r.ok} for r in report.collectives]}


def run_step(step: str) -> dict:
    """One step in this process: what it produced (raises what it raised)."""
    from planner.runtime.gpu_target import gpu_target_config

    if step == "no-target-config":
        return {"devices": len(_topology(topology=f"1x1x{DEVICES}").devices)}
    if step == "no-topology-shape":
        return {"devices": len(_topology(target_config=gpu_target_config("dgx-a100")).devices)}
    if step == "garbage-target-config":
        return {"devices": len(_topology(topology=f"1x1x{DEVICES}", target_config="not a proto").devices)}
    if step == "minimal-target-config":
        minimal = 'gpu_device_info { cuda_compute_capability { major: 8 minor: 0 } }\nplatform_name: "CUDA"\n'
        return _matmul_with(minimal)
    if step.startswith("matmul-"):
        return _matmul(step.removeprefix("matmul-"))
    if step == "plan-dgx-h100-bfloat16":
        return _plan("dgx-h100", "bfloat16")
    if step.startswith("plan-"):
        return _plan(step.removeprefix("plan-"), "float32")
    raise ValueError(f"unknown step {step!r}; choose from {', '.join(STEPS)}")


def _matmul_with(target_config: str) -> dict:
    import jax
    import jax.numpy as jnp

    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    topo = _topology(topology=f"1x1x{DEVICES}", target_config=target_config)
    mesh = Mesh(topo.devices[:DEVICES], ("x",))
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x")))
    ma = jax.jit(lambda a: jnp.sum(jnp.tanh(a @ a.T))).lower(x).compile().memory_analysis()
    return {"temp_bytes": ma.temp_size_in_bytes}


def _child(step: str) -> None:
    try:
        row = {"step": step, "ok": True, **run_step(step)}
    except Exception as e:  # the probe records what failed, and how
        row = {"step": step, "ok": False, "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
    print("RESULT " + json.dumps(row))


def probe(step: str) -> dict:
    """``step`` in a fresh process; a process that dies is a row too."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--step", step], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                              os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              os.environ.get("PYTHONPATH")]))})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if lines:
        row = json.loads(lines[-1].removeprefix("RESULT "))
    else:
        how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exit status {proc.returncode}")
        row = {"step": step, "ok": False, "error": f"process {how}"}
    return {**row, "wall_s": round(time.perf_counter() - t, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)  # one step, in the child process
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    if args.step:
        _child(args.step)
        return 0
    found = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items() if v))
    if not plugin_installed():
        rows = [{"step": "plugin", "ok": False, "error": "plugin not installed: pip install 'shardplan[gpu-aot]' "
                                                          "(jax-cuda12-plugin, the version of jaxlib)"}]
    else:
        rows = []
        for step in STEPS:
            rows.append(probe(step))
            r = rows[-1]
            print(f"{step:24s} {'works' if r['ok'] else 'FAILS'}  " + (r.get("error") or json.dumps(
                {k: v for k, v in r.items() if k not in ("step", "ok", "memory", "collectives")})))
            for m in r.get("memory", []):
                print(f"    {m['part']:28s} predicted {m['predicted_bytes']:>15,.0f}  compiled {m['compiled_bytes']:>15,.0f}"
                      f"  {'ok' if m['ok'] else 'OUT'}")
            bad = [f"{c['kind']} {','.join(c['axes'])}" for c in r.get("collectives", []) if not c["ok"]]
            if "collectives" in r:
                print("    collectives: " + (f"outside tolerance: {'; '.join(bad)}" if bad else "all within tolerance"))
    summary = {"plugin_installed": plugin_installed(), "versions": found,
               "works": [r["step"] for r in rows if r["ok"]], "fails": [r["step"] for r in rows if not r["ok"]]}
    if args.json:
        print(f"wrote {write_results(args.json, __file__, 'full', summary, rows, argv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
