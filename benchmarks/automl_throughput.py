"""Configurations planned per second: ``planner.plan_many`` (one compiled call
for the whole batch) against ``planner.plan`` in a Python loop, plus
``planner.cost_fn`` evaluations per second (vmapped over architectures, with
and without the gradient). Rates and ratios come from one run.

    python benchmarks/automl_throughput.py [--configs 256] [--loop 3] [--archs 64] [--seconds 3]

Configurations: ResNet-50-shaped networks with random stage widths (0.5-1.5x,
multiples of 8), on 32, 64 or 128 devices of dgx-a100 or dgx-h100, 32 samples
per device. One "cost evaluation" is the cost model evaluated for one
configuration on one mesh shape: its cost table, and the exact DP over all of
its plans on that mesh (a configuration with 4 mesh shapes is 4 evaluations,
however many plans the DP covers). ``plan_many`` is timed over repeated calls
on the same 256 configurations (``--seconds``); the median call is reported,
with the load average of the machine before and after. The numbers go to
``--json PATH`` (default ``benchmarks/results/automl_throughput.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from costmodels import load_hardware
from planner.automl import PlanConfig, cost_fn, plan_many
from planner.automl.parametric import ArchParams
from planner.automl.templates import resnet_parametric, resnet_template
from planner.planning import mesh_shapes, plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

BASE = (64, 128, 256, 512)


def configs(n: int, seed: int) -> list[PlanConfig]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        widths = [max(8, round(b * rng.uniform(0.5, 1.5) / 8) * 8) for b in BASE]
        g = resnet_template(widths=widths, name=f"resnet50-w{i}")
        out.append(PlanConfig(g, int(rng.choice([32, 64, 128])), str(rng.choice(["dgx-a100", "dgx-h100"]))))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=256)
    ap.add_argument("--loop", type=int, default=3, help="configurations planned by plan() one by one")
    ap.add_argument("--archs", type=int, default=64, help="architectures per vmapped cost_fn call")
    ap.add_argument("--seconds", type=float, default=3.0)
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)

    cfgs = configs(args.configs, 0)
    pairs = sum(len(mesh_shapes(c.devices, 32 * c.devices, load_hardware(c.hardware).devices_per_node))
                for c in cfgs)  # (configuration, mesh shape) pairs: the cost evaluations of one call
    per_config = pairs / args.configs
    load = os.getloadavg()
    print(f"{args.configs} ResNet-50-shaped configurations (174 layers), {pairs} (configuration, mesh) pairs; "
          f"jax {jax.__version__}, {jax.device_count()} cpu device(s), {os.cpu_count()} cores; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    t = time.perf_counter()
    plan_many(configs(args.configs, 1))  # compile (other widths, same shapes)
    compile_s = time.perf_counter() - t
    calls, start = [], time.perf_counter()
    while len(calls) < 3 or time.perf_counter() - start < args.seconds:
        t = time.perf_counter()
        out = plan_many(cfgs)
        calls.append(time.perf_counter() - t)
    many_s = float(np.median(calls))
    print(f"plan_many: compile + first call {compile_s:.1f} s; {out.certified.sum()} of {args.configs} certified "
          f"exact in-graph, {out.fallback.sum()} planned by plan(); {len(calls)} calls: median {many_s * 1e3:.1f} ms, "
          f"fastest {min(calls) * 1e3:.1f} ms, slowest {max(calls) * 1e3:.1f} ms")

    plan(cfgs[0].model, devices=cfgs[0].devices, hardware=cfgs[0].hardware,
         simplicity_tolerance=0.0)  # compile the gradient search
    t = time.perf_counter()
    # plan_many gives each configuration's fastest plan: compare with plan()'s fastest (no simplicity preference)
    loop = [plan(c.model, devices=c.devices, hardware=c.hardware, simplicity_tolerance=0.0) for c in cfgs[: args.loop]]
    loop_s = time.perf_counter() - t
    ratio = [out.iteration_s[i] / p.iteration_s for i, p in enumerate(loop)]

    pg = resnet_parametric()
    cf = cost_fn(pg, "dgx-a100", 64)
    rng = np.random.default_rng(2)
    batch = ArchParams(jnp.asarray(rng.uniform(0.5, 1.5, (args.archs, 4)), jnp.float32),
                       jnp.ones(args.archs, jnp.float32), jnp.full(args.archs, 2048.0, jnp.float32))
    value = jax.jit(jax.vmap(cf))
    grad = jax.jit(jax.vmap(jax.value_and_grad(lambda p: cf(p).time_s)))

    def rate(fn) -> float:
        jax.block_until_ready(fn(batch))
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            jax.block_until_ready(fn(batch))
            n += 1
        return n * args.archs / (time.perf_counter() - start)

    one = ArchParams(batch.widths[0], batch.resolution[0], batch.batch[0])
    single = jax.jit(lambda p: cf(p))

    def rate_one(fn) -> float:
        jax.block_until_ready(fn(one))
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            jax.block_until_ready(fn(one))
            n += 1
        return n / (time.perf_counter() - start)

    s_rate = rate_one(single)
    v_rate, g_rate = rate(value), rate(grad)
    many_rate, loop_rate = args.configs / many_s, args.loop / loop_s
    e = per_config  # cost evaluations per configuration
    print(f"agreement with plan(): plan_many / plan iteration time on {args.loop} configurations: "
          + ", ".join(f"{r:.6f}" for r in ratio))
    print(f"{'method':44s} {'configs/s':>10s} {'cost evals/s':>13s} {'vs plan loop':>13s}")
    print(f"{'plan() in a Python loop':44s} {loop_rate:10.2f} {loop_rate * e:13.1f} {1.0:12.1f}x")
    print(f"{'plan_many (median call)':44s} {many_rate:10.1f} {many_rate * e:13.1f} "
          f"{many_rate / loop_rate:12.1f}x")
    print(f"{'cost_fn, one architecture per call':44s} {s_rate:10.1f} {s_rate * 4:13.1f} "
          f"{s_rate / loop_rate:12.1f}x")
    print(f"{'cost_fn, vmapped, value (4 meshes each)':44s} {v_rate:10.1f} {v_rate * 4:13.1f} "
          f"{v_rate / loop_rate:12.1f}x")
    print(f"{'cost_fn, vmapped, value and gradient':44s} {g_rate:10.1f} {g_rate * 4:13.1f} "
          f"{g_rate / loop_rate:12.1f}x")
    after = os.getloadavg()
    print(f"load average after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
    methods = (("plan() in a Python loop", loop_rate, e), ("plan_many (median call)", many_rate, e),
               ("cost_fn, one architecture per call", s_rate, 4), ("cost_fn, vmapped, value (4 meshes each)", v_rate, 4),
               ("cost_fn, vmapped, value and gradient", g_rate, 4))
    rows = [{"method": name, "configs_per_s": r, "cost_evaluations_per_s": r * k, "vs_plan_loop": r / loop_rate}
            for name, r, k in methods]
    summary = {"configs": args.configs, "pairs": pairs, "plan_many_evaluations_per_s": many_rate * e,
               "plan_many_over_plan_loop": many_rate / loop_rate, "plan_many_median_call_s": many_s,
               "plan_many_compile_s": compile_s, "certified": int(out.certified.sum()),
               "agreement_with_plan": ratio, "load_average_before": list(load), "load_average_after": list(after)}
    mode = "default" if (args.configs, args.loop, args.archs, args.seconds) == (256, 3, 64, 3.0) else "custom"
    write_results(args.json, __file__, mode, summary, rows, argv)


if __name__ == "__main__":
    main()
