"""The width search of ``automl_width_search.py`` as an Optuna objective:
Optuna samples the four stage-width multipliers; the objective is the
network's forward FLOPs (a capacity proxy), and the exact iteration time of
its best plan (``planner.cost_fn``'s ``exact_time_s``) must stay within the
budget (a constraint Optuna's samplers see as a penalty).

    pip install 'shardplan[automl]'     # optuna (optional extra)
    python examples/automl_optuna.py --trials 50

Without Optuna it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import jax.numpy as jnp

from planner.automl import cost_fn
from planner.automl.parametric import ArchParams, total_forward_flops
from planner.automl.templates import resnet_parametric


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--hardware", default="dgx-a100")
    ap.add_argument("--batch-per-device", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a small ResNet on 8 devices (for tests)")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("optuna") is None:
        print("optuna is not installed (pip install 'shardplan[automl]'); skipping the Optuna example")
        return 0
    import optuna

    depths, base, res, classes, devices = (3, 4, 6, 3), (64, 128, 256, 512), 224, 1000, args.devices
    if args.tiny:
        depths, base, res, classes, devices = (1, 1, 1, 1), (8, 16, 32, 64), 32, 10, 8
    graph = resnet_parametric(depths, base, resolution=res, num_classes=classes, channel_multiple=8)
    cf = cost_fn(graph, args.hardware, devices)
    batch = jnp.float32(args.batch_per_device * devices)
    budget = float(cf(ArchParams(jnp.ones(len(depths)), jnp.float32(1.0), batch)).exact_time_s)

    def objective(trial: optuna.Trial) -> float:
        w = jnp.asarray([trial.suggest_float(f"width{i + 1}", 0.25, 2.0, log=True) for i in range(len(depths))])
        p = ArchParams(w, jnp.float32(1.0), batch)
        c = cf(p)
        trial.set_user_attr("time_ms", float(c.exact_time_s) * 1e3)
        flops = float(total_forward_flops(graph(p, rounded=True)))
        over = max(0.0, float(c.exact_time_s) / budget - 1.0)
        return flops / 1e9 * (1.0 - 10.0 * over)  # GFLOPs per sample, penalised over the budget

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=args.seed))
    study.optimize(objective, n_trials=args.trials)
    best = study.best_trial
    widths = [best.params[f"width{i + 1}"] for i in range(len(depths))]
    print(f"best of {args.trials} trials: width multipliers {[round(w, 3) for w in widths]}, "
          f"{best.value:.3f} GFLOPs/sample, {best.user_attrs['time_ms']:.3f} ms/iteration "
          f"(budget {budget * 1e3:.3f} ms) on {devices} x {args.hardware}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
