"""Does XLA:CPU recompute what a plan says it recomputes? Two measurements,
compiled only (nothing runs), side by side in one run (docs/levers.md):

1. A chain of eight 3x3 convolutions with ReLUs (64 channels, 32x32, batch
   32, one CPU device), its gradient compiled with every run of layers kept,
   under ``jax.checkpoint`` (whole, by halves, in pairs) and under a
   recomputation tied to the cotangent (a ``jax.custom_vjp`` whose backward
   adds ``0 *`` one cotangent element to the run's input, the device the
   export uses, ``planner.runtime.calls``): XLA's temporaries and the
   convolutions lowered and compiled.
3. Runs of recomputed CNN layers in the export (``planner.runtime.runs``):
   VGG16-CIFAR-10 (each conv with its ReLU and pool a run, batch 512) and a
   ResNet-18-sized bottleneck ResNet ((2, 2, 2, 2) blocks, 64x64, each
   residual block a run, batch 256), every layer ``data`` on 8x1:
   ``planner.validate``'s total memory per device, predicted and compiled,
   with every activation kept and with the runs; with ``--train N``, the
   losses of N Adam steps of both (they must agree).
2. Three residual ``nnx.MultiHeadAttention`` blocks (4 heads, 32 features,
   ``--tokens`` tokens, batch 8) on a 2x4 mesh of 8 CPU devices, heads split
   over the model axis, the attentions kept and recomputed
   (``filter+remat``, ``planner.runtime.calls.recomputing_attention``):
   ``planner.validate``'s total memory per device, predicted and compiled.

    PYTHONPATH=. .venv/bin/python benchmarks/remat_xla.py [--tokens 256] [--train 2] [--json PATH]

The rows of the three go to ``--json PATH`` (default ``benchmarks/results/remat_xla.json``).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import add_json_option, write_results  # noqa: E402

LAYERS, CHANNELS, SIZE, BATCH = 8, 64, 32, 32


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _run(ws, x):
    for w in ws:
        x = jax.nn.relu(_conv(x, w))
    return x


def _tied(f):
    """``f`` recomputed in the backward pass from its inputs, tied to the cotangent."""

    @jax.custom_vjp
    def g(ws, x):
        return f(ws, x)

    def fwd(ws, x):
        return f(ws, x), (ws, x)

    def bwd(res, ct):
        ws, x = res
        _, vjp = jax.vjp(f, ws, x + jnp.ravel(ct)[0] * 0.0)
        return vjp(ct)

    g.defvjp(fwd, bwd)
    return g


def conv_chain() -> list[dict]:
    params = [jax.random.normal(jax.random.key(i), (3, 3, CHANNELS, CHANNELS)) * 0.05 for i in range(LAYERS)]
    x = jax.random.normal(jax.random.key(99), (BATCH, SIZE, SIZE, CHANNELS))
    runs = {"kept": [(0, 8)], "whole": [(0, 8)], "halves": [(0, 4), (4, 8)], "pairs": [(0, 2), (2, 4), (4, 6), (6, 8)]}
    print(f"1. {LAYERS} convs 3x3, {CHANNELS} channels, {SIZE}x{SIZE}, batch {BATCH}, one CPU device")
    print(f"   {'runs':8s} {'recompute':14s} {'temp MB':>8s} {'/ kept':>7s} {'convs lowered':>14s} {'compiled':>9s}")
    kept, out = None, []
    for label, spans in runs.items():
        for how in (("-",) if label == "kept" else ("checkpoint", "tied")):
            wrap = {"-": lambda f: f, "checkpoint": jax.checkpoint, "tied": _tied}[how]

            def loss(ps, x, spans=spans, wrap=wrap):
                for a, b in spans:
                    x = wrap(_run)(ps[a:b], x)
                return jnp.sum(x ** 2)

            lowered = jax.jit(jax.grad(loss)).lower(params, x)
            compiled = lowered.compile()
            temp = compiled.memory_analysis().temp_size_in_bytes
            kept = temp if kept is None else kept
            out.append({"runs": label, "recompute": how, "temp_bytes": temp, "over_kept": temp / kept,
                        "convs_lowered": lowered.as_text().count("stablehlo.convolution"),
                        "convs_compiled": compiled.as_text().count("convolution(")})
            print(f"   {label:8s} {how:14s} {temp / 1e6:8.1f} {temp / kept:7.3f} "
                  f"{out[-1]['convs_lowered']:>14d} {out[-1]['convs_compiled']:>9d}")
    return out


class _Stack(nnx.Module):
    def __init__(self, rngs):
        self.attn = nnx.List([nnx.MultiHeadAttention(num_heads=4, in_features=32, decode=False, rngs=rngs)
                              for _ in range(3)])
        self.head = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        for a in self.attn:
            x = x + a(x)
        return self.head(x.mean(axis=1))


def attention(tokens: int) -> list[dict]:
    import planner
    from planner.runtime.validation import fixed_plan

    model = nnx.eval_shape(lambda: _Stack(nnx.Rngs(0)))
    spec = jax.ShapeDtypeStruct((8, tokens, 32), jnp.float32)
    print(f"\n2. three nnx.MultiHeadAttention blocks, 4 heads, {tokens} tokens, batch 8, 2x4, heads split")
    print(f"   {'attention':14s} {'predicted MB':>13s} {'compiled MB':>12s} {'compiled / predicted':>21s}")
    out = []
    for option in ("filter", "filter+remat"):
        strategies = {f"attn/{i}/{part}": option if part == "attention" else "filter"
                      for i in range(3) for part in ("qkv", "attention")}
        plan = fixed_plan(model, spec, (2, 4), strategies=strategies, batch=8)
        row = {r.part: r for r in planner.validate(model, plan, memory_rtol=1.0, activation_rtol=1.0).memory}["total"]
        print(f"   {option:14s} {row.predicted_bytes / 1e6:13.3f} {row.compiled_bytes / 1e6:12.3f} "
              f"{row.compiled_bytes / row.predicted_bytes:21.3f}")
        out.append({"attention": option, "predicted_bytes": row.predicted_bytes, "compiled_bytes": row.compiled_bytes,
                    "compiled_over_predicted": row.compiled_bytes / row.predicted_bytes})
    return out


def cnn_runs(train: int) -> list[dict]:
    import numpy as np
    import optax

    import planner
    from planner.models.flax_zoo import ResNet
    from planner.runtime.validation import fixed_plan

    print("\n3. runs of recomputed CNN layers, every layer data on 8x1")
    print(f"   {'model':18s} {'activations':12s} {'runs':>5s} {'predicted MB':>13s} {'compiled MB':>12s} "
          f"{'compiled / predicted':>21s}{'  losses' if train else ''}")
    table = []
    for name in ("vgg16-cifar10", "resnet-2222-64px"):
        if name == "vgg16-cifar10":
            model, x = planner.flax_model(name, batch=512)
            names = planner.extract(model, x).names
            starts = [i for i, n in enumerate(names) if n.startswith("features/")] + [names.index("flatten")]
            runs = [list(names[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
        else:
            model = nnx.eval_shape(lambda: ResNet((2, 2, 2, 2), 10, rngs=nnx.Rngs(0)))
            x = jax.ShapeDtypeStruct((256, 64, 64, 3), jnp.float32)
            names = planner.extract(model, x).names
            blocks = sorted({n.rsplit("/", 1)[0] for n in names if n.startswith("layer")})
            runs = [[n for n in names if n.startswith(b + "/")] for b in blocks]
        weights = None
        if train:
            weights = ResNet((2, 2, 2, 2), 10, rngs=nnx.Rngs(0)) if name.startswith("resnet") else \
                planner.flax_model(name, abstract=False)[0]
            images = jax.random.normal(jax.random.key(1), x.shape, x.dtype)
            labels = jnp.arange(x.shape[0]) % 10
        for label in ("kept", "recomputed"):
            options = {n: "data" for n in names}
            for run in runs if label == "recomputed" else []:
                options[run[0]] = "data+remat"
                options.update({n: "data+remat+join" for n in run[1:]})
            plan = fixed_plan(model, x, (8, 1), strategies=options, batch=int(x.shape[0]))
            row = {r.part: r for r in planner.validate(model, plan, memory_rtol=1.0,
                                                          activation_rtol=1.0).memory}["total"]
            losses, values = "", []
            if train:
                step, state = planner.shard(weights, plan, optax.adam(1e-4))
                out = []
                for _ in range(train):
                    state, loss = step(state, images, labels)
                    out.append(float(loss))
                losses = "  " + " ".join(f"{v:.6f}" for v in np.asarray(out))
                values = out
            print(f"   {name:18s} {label:12s} {len(plan.recompute_runs):5d} {row.predicted_bytes / 1e6:13.3f} "
                  f"{row.compiled_bytes / 1e6:12.3f} {row.compiled_bytes / row.predicted_bytes:21.3f}{losses}")
            table.append({"model": name, "activations": label, "runs": len(plan.recompute_runs),
                          "predicted_bytes": row.predicted_bytes, "compiled_bytes": row.compiled_bytes,
                          "compiled_over_predicted": row.compiled_bytes / row.predicted_bytes, "losses": values})
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--train", type=int, default=0, help="also train the CNN plans this many steps (section 3)")
    add_json_option(ap, __file__)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices")
    chain = conv_chain()
    heads = attention(args.tokens)
    runs = cnn_runs(args.train)
    summary = {"tokens": args.tokens, "train_steps": args.train,
               "tied_pairs_over_kept": next(r["over_kept"] for r in chain if (r["runs"], r["recompute"]) == ("pairs", "tied")),
               "checkpoint_pairs_over_kept": next(r["over_kept"] for r in chain
                                                  if (r["runs"], r["recompute"]) == ("pairs", "checkpoint")),
               "attention_compiled_over_predicted": {r["attention"]: r["compiled_over_predicted"] for r in heads},
               "runs_compiled_over_predicted": {f"{r['model']} {r['activations']}": r["compiled_over_predicted"]
                                                for r in runs}}
    mode = "default" if (args.tokens, args.train) == (256, 0) else "custom"
    write_results(args.json, __file__, mode, summary, chain, argv, attention=heads, cnn_runs=runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
