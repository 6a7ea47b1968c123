"""Cost-table evaluations per second for ResNet-152: the jitted, vectorised
model (one call, and vmapped over 1,000 configurations) beside the same
formulas evaluated by a plain-Python per-layer loop
(``costmodels.reference``). Ratios are measured side by side in one run.

    python benchmarks/costmodel_speed.py [--model resnet152] [--configs 1000] [--seconds 2]

One "evaluation" = build the cost table of a (hardware, batch, mesh)
configuration and evaluate one plan's iteration time and memory. The numbers
go to ``--json PATH`` (default ``benchmarks/results/costmodel_speed.json``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from costmodels import (  # noqa: E402
    cost_table,
    hardware_arrays,
    iteration_time,
    load_hardware,
    memory_per_device,
    one_hot,
)
from costmodels.reference import reference_iteration_time, reference_memory  # noqa: E402
from planner.models.zoo import get_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402


def rate(fn, seconds: float) -> tuple[float, int]:
    """Calls per second of ``fn`` over at least ``seconds`` (after one warm-up call)."""
    fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed, n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet152")
    ap.add_argument("--configs", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=2.0)
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)

    g = get_model(args.model)
    hw = load_hardware("dgx-a100")
    hwa = hardware_arrays(hw)
    rows = g.arrays.mask.shape[0]
    choice = np.zeros(rows, int)
    probs = one_hot(choice, 5)
    batch, d, m = 512.0, 64.0, 1.0

    @jax.jit
    def single(hwa, batch, d, m):
        t = cost_table(g.arrays, hwa, batch, d, m)
        return iteration_time(t, probs), memory_per_device(t, probs)

    rng = np.random.default_rng(0)
    n = args.configs
    ms = jnp.asarray(rng.choice([1, 2, 4, 8], n), jnp.float32)
    ds = jnp.asarray(rng.choice([1, 4, 16, 64], n), jnp.float32)
    bs = ds * ms * jnp.asarray(rng.choice([1, 8, 32], n), jnp.float32)
    hws = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), hwa)
    vmapped = jax.jit(jax.vmap(single))

    t0 = time.perf_counter()
    jax.block_until_ready(single(hwa, batch, d, m))
    compile_single = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(vmapped(hws, bs, ds, ms))
    compile_vmap = time.perf_counter() - t0

    r_single, _ = rate(lambda: jax.block_until_ready(single(hwa, batch, d, m)), args.seconds)
    r_vmap_calls, _ = rate(lambda: jax.block_until_ready(vmapped(hws, bs, ds, ms)), args.seconds)
    r_vmap = r_vmap_calls * n
    r_python, _ = rate(
        lambda: (reference_iteration_time(g, choice, hw, batch, int(d), int(m)), reference_memory(g, choice, batch, int(d), int(m))),
        args.seconds,
    )
    # The three agree on the value they compute:
    jt, jm = single(hwa, batch, d, m)
    pt = reference_iteration_time(g, choice, hw, batch, int(d), int(m))

    print(f"model {args.model}: {g.num_layers} layers (bucket {rows}), {len(g.edges)} edges; jax {jax.__version__}, "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s)")
    print(f"agreement: jitted {float(jt):.6e} s vs plain Python {pt:.6e} s per iteration")
    print(f"compile: single {compile_single:.2f} s, vmapped x{n} {compile_vmap:.2f} s")
    print(f"{'method':<34}{'evaluations/s':>16}{'vs plain Python':>18}")
    methods = (("plain-Python per-layer loop", r_python), ("jitted, one configuration", r_single),
               (f"jitted + vmap over {n} configs", r_vmap))
    for name, r in methods:
        print(f"{name:<34}{r:>16,.0f}{r / r_python:>17.1f}x")
    summary = {"model": args.model, "layers": g.num_layers, "configs": n, "jitted_iteration_s": float(jt),
               "python_iteration_s": pt, "compile_single_s": compile_single, "compile_vmapped_s": compile_vmap,
               "vmapped_over_python": r_vmap / r_python, "single_over_python": r_single / r_python}
    rows = [{"method": name, "evaluations_per_s": r, "vs_python": r / r_python} for name, r in methods]
    mode = "default" if (args.model, args.configs, args.seconds) == ("resnet152", 1000, 2.0) else "custom"
    write_results(args.json, __file__, mode, summary, rows, argv)


if __name__ == "__main__":
    main()
