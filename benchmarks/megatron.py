"""Predicted against measured: Megatron-LM's published training runs.

    python benchmarks/megatron.py --measurements DIR [--json OUT] [--hardware dgx-a100]

Reads every ``megatron-*.json`` in DIR (the layout of
``shared/reference/measurements/megatron-narayanan2021.json``: its README).
For each row of ``rows``:

(a) the predicted step under the published execution (tensor, pipeline and
    data sizes, batch, micro-batch, interleave, recomputation, sequence
    parallelism); where the file says ``null`` the planner chooses (the
    fastest that fits the memory), and the table marks the choice with ``*``;
    against ``measured``: ``tflops_per_gpu`` (and ``pct_of_peak``,
    ``aggregate_pflops``) or ``iteration_s``, whichever the row has;
(b) the planner's own plan for the same model, GPUs, batch and memory
    (``--memory-limit``, 80 GB), with its predicted step beside (a)'s.

For each row of ``memory_rows`` (if the file has them): the predicted model
state (parameters, gradients, optimizer) and activation bytes per GPU, at the
stage of the peak, against ``measured`` (GiB; a key naming ``activation``,
one naming parameters / state / optimizer, or a ``total``).

Model FLOPs per step, as Narayanan et al. 2021 (Eq. 3) count them with the
MLP width ``f``: ``passes x B s l (8 h^2 + 4 h f + 4 s h) + 6 B s h V``,
``passes`` 4 with full recomputation (the recomputed forward counts), else 3.

Prints per-row signed errors, their mean and largest absolute value;
``--json`` (default ``benchmarks/results/megatron.json``, through
``benchmarks/_results.py``) writes ``rows`` and ``memory_rows`` with per row
its ``id``, ``measured``, ``predicted`` (the same keys), ``error`` (signed
relative, per key), the execution costed (choices filled in), the planner's
own plan and both step times; ``summary``: the hardware, the memory limit and
the errors' mean and largest absolute values.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import add_json_option, write_results  # noqa: E402

DEFAULT_MEASUREMENTS = next(
    (p for p in (ROOT / "shared/reference/measurements", ROOT.parent / "shared/reference/measurements") if p.is_dir()),
    ROOT.parent / "shared/reference/measurements",
)
GIB = 2.0**30
TIME_KEYS = ("tflops_per_gpu", "iteration_s")


def read_files(folder: Path) -> list[tuple[str, dict]]:
    files = sorted(folder.glob("megatron-*.json"))
    if not files:
        raise SystemExit(f"no megatron-*.json in {folder}")
    return [(f.name, json.loads(f.read_text())) for f in files]


def model_config(model: dict):
    """The row's model as a :class:`planner.TransformerConfig`."""
    from planner import TransformerConfig

    kind = model.get("kind", "gpt")
    h, layers, heads = model["hidden"], model["layers"], model["heads"]
    ffn = model.get("ffn", 4 * h)
    if kind == "gpt":
        return TransformerConfig.gpt(h, layers, heads, tokens=model["seq"], vocab=model["vocab"], hidden=ffn,
                                     tied=model.get("tied", True))
    if kind == "llama":
        return TransformerConfig.llama(h, layers, heads, hidden=ffn, tokens=model["seq"], vocab=model["vocab"],
                                       kv_heads=model.get("kv_heads"), tied=model.get("tied", False))
    raise ValueError(f"model kind {kind!r} is not modelled (gpt, llama)")


def block_chain_of(row: dict):
    from planner.models.block_chain import block_chain

    ex = row["execution"]
    model = row["model"]
    dropout = model.get("dropout", model.get("kind", "gpt") == "gpt")  # Megatron's GPT drops out; Llama does not
    return block_chain(model_config(model), dtype=ex.get("dtype", "float16"), optimizer=ex.get("optimizer", "adam"),
                       dropout=bool(dropout))


def model_flops(model: dict, batch: int, recompute: str) -> float:
    """Model FLOPs per step (module docstring; Narayanan et al. 2021, Eq. 3 at f = 4h)."""
    s, h, layers, V = model["seq"], model["hidden"], model["layers"], model["vocab"]
    f = model.get("ffn", 4 * h)
    passes = 4.0 if recompute == "full" else 3.0
    return passes * batch * s * layers * (8.0 * h * h + 4.0 * h * f + 4.0 * s * h) + 6.0 * batch * s * h * V


CHOOSABLE = {  # execution field -> PipelinePlan field; a null one is the planner's choice
    "tensor": "tensor", "pipeline": "stages", "microbatch": "micro_batch", "interleave": "chunks",
    "recompute": "recompute", "sequence_parallel": "sequence_parallel", "distributed_optimizer": "distributed_optimizer",
}


def published_space(ex: dict):
    """The :class:`search.PipelineSpace` of a published execution: its values, ``null`` left open
    (``distributed_optimizer`` absent: off, as in Megatron-LM 2021)."""
    from search import PipelineSpace

    fixed = lambda key: None if ex.get(key) is None else (int(ex[key]),)  # noqa: E731
    either = lambda key: (False, True) if ex.get(key, False) is None else (bool(ex.get(key, False)),)  # noqa: E731
    recompute = ("none", "selective", "full") if ex.get("recompute") is None else (ex["recompute"],)
    return PipelineSpace(tensor=fixed("tensor"), stages=fixed("pipeline"), micro_batch=fixed("microbatch"),
                         chunks=fixed("interleave"), recompute=recompute,
                         sequence_parallel=either("sequence_parallel"),
                         distributed_optimizer=either("distributed_optimizer"))


def costed_execution(ex: dict, plan) -> tuple[dict, list[str]]:
    """The execution with the planner's choices filled in, and which fields it chose."""
    chosen = [k for k, f in CHOOSABLE.items() if k in ex and ex[k] is None]
    return {**ex, **{k: getattr(plan, CHOOSABLE[k]) for k in chosen}, "data": plan.data}, chosen


def published_plan(row: dict, hardware, memory_limit: float):
    """(a): the :class:`search.PipelinePlan` of the published execution, open
    fields chosen; where nothing fits the model's memory, the fastest anyway
    with ``fits`` false (it ran: the memory model is what is wrong)."""
    from search import search_pipeline

    ex = row["execution"]
    bc = block_chain_of(row)
    args = (bc.graph, bc.segment, bc.chain, hardware, int(ex["gpus"]), int(ex["batch"]))
    found = search_pipeline(*args, memory_limit_bytes=memory_limit, space=published_space(ex))
    if found.best is not None:
        return found.best
    fastest = search_pipeline(*args, memory_limit_bytes=float("inf"), space=published_space(ex)).best
    return fastest.__class__(**{**fastest.to_dict(), "fits": False})


def own_plan(row: dict, hardware, memory_limit: float):
    """(b): the planner's own :class:`search.PipelinePlan` for the row's model,
    GPUs and batch within ``memory_limit`` (None: nothing fits)."""
    from search import PipelineSpace, search_pipeline

    ex = row["execution"]
    bc = block_chain_of(row)
    return search_pipeline(bc.graph, bc.segment, bc.chain, hardware, int(ex["gpus"]), int(ex["batch"]),
                           memory_limit_bytes=memory_limit,
                           space=PipelineSpace(distributed_optimizer=(False, True))).best


def predicted_values(row: dict, plan, peak_flops: float) -> dict:
    """The predicted value of every key of the row's ``measured`` the model predicts."""
    ex = row["execution"]
    tflops = model_flops(row["model"], int(ex["batch"]), ex.get("recompute") or "none") / plan.step_s \
        / int(ex["gpus"]) / 1e12
    values = {"iteration_s": plan.step_s, "tflops_per_gpu": tflops, "pct_of_peak": 100.0 * tflops * 1e12 / peak_flops,
              "aggregate_pflops": tflops * int(ex["gpus"]) / 1e3}
    return {k: values[k] for k in row["measured"] if k in values}


def errors(measured: dict, predicted: dict) -> dict:
    return {k: (predicted[k] - measured[k]) / measured[k] for k in predicted if measured.get(k)}


def memory_values(row: dict, plan) -> dict:
    """Predicted GiB under the row's ``measured`` keys (module docstring)."""
    out = {}
    for key in row["measured"]:
        k = key.lower()
        if "activation" in k:
            out[key] = plan.activation_bytes / GIB
        elif "total" in k or "peak" in k:
            out[key] = (plan.state_bytes + plan.activation_bytes) / GIB
        elif any(w in k for w in ("param", "state", "optimizer", "weight")):
            out[key] = plan.state_bytes / GIB
    return out


def _settings(plan) -> str:
    return (f"t{plan.tensor} S{plan.stages} d{plan.data} b{plan.micro_batch} v{plan.chunks} {plan.recompute}"
            + (" sp" if plan.sequence_parallel else "") + (" zero1" if plan.distributed_optimizer else ""))


def _row_line(row: dict, costed: dict, chosen: list[str], pred: dict, err: dict, plan_a, own) -> str:
    mark = lambda k: f"{costed[k]}{'*' if k in chosen else ''}"  # noqa: E731
    key = next((k for k in TIME_KEYS if k in pred), None)
    versus = f"{key:<14} {row['measured'][key]:>8.2f} {pred[key]:>8.2f} {100 * err[key]:>+7.1f}% " if key \
        else f"{'(no time key)':<42}"
    return (f"{row['id']:<14} {mark('tensor'):>3} {mark('pipeline'):>3} {costed['data']:>3} {costed['batch']:>5} "
            f"{mark('microbatch'):>4} {mark('interleave'):>3} {versus}"
            f"{plan_a.step_s:>8.2f} {'' if plan_a.fits else '(over memory) '}| "
            f"{(own.step_s if own else float('nan')):>8.2f}  {_settings(own) if own else 'nothing fits'}")


def _failure(name: str, row: dict, e: Exception) -> dict:
    return {"id": row.get("id"), "file": name, "measured": row.get("measured"), "predicted": {}, "error": {},
            "failure": str(e)}


def run_rows(files, hardware, memory_limit: float, peak_flops: float):
    """Every row of every file: its report entry and its printed line."""
    entries, lines = [], []
    for name, data in files:
        for row in data.get("rows", []):
            try:
                plan_a, own = published_plan(row, hardware, memory_limit), own_plan(row, hardware, memory_limit)
            except (ValueError, KeyError) as e:  # a row the model cannot cost: said, not fatal
                entries.append(_failure(name, row, e))
                lines.append(f"{row.get('id', '?'):<14} not costed: {e}")
                continue
            pred = predicted_values(row, plan_a, peak_flops)
            err = errors(row["measured"], pred)
            costed, chosen = costed_execution(row["execution"], plan_a)
            entries.append({"id": row["id"], "file": name, "measured": row["measured"], "predicted": pred,
                            "error": err, "execution": costed, "chosen": chosen, "fits": plan_a.fits,
                            "published_step_s": plan_a.step_s, "plan": own.to_dict() if own else None,
                            "plan_step_s": own.step_s if own else None,
                            "plan_at_least_as_fast": bool(own and own.step_s <= plan_a.step_s * (1 + 1e-6))})
            lines.append(_row_line(row, costed, chosen, pred, err, plan_a, own))
    return entries, lines


def run_memory_rows(files, hardware, memory_limit: float):
    entries, lines = [], []
    for name, data in files:
        for row in data.get("memory_rows", []):
            try:
                plan_a = published_plan(row, hardware, memory_limit)
            except (ValueError, KeyError) as e:
                entries.append(_failure(name, row, e))
                lines.append(f"{row.get('id', '?'):<24} not costed: {e}")
                continue
            pred = memory_values(row, plan_a)
            err = errors(row["measured"], pred)
            costed, chosen = costed_execution(row["execution"], plan_a)
            entries.append({"id": row["id"], "file": name, "measured": row["measured"], "predicted": pred,
                            "error": err, "execution": costed, "chosen": chosen})
            for k in pred:
                lines.append(f"{row['id']:<24} {k:<24} {row['measured'][k]:>8.2f} {pred[k]:>8.2f} "
                             f"{100 * err.get(k, float('nan')):>+7.1f}%")
    return entries, lines


def headline_errors(entries: list[dict]) -> list[float]:
    """Each row's signed error in its time key (``tflops_per_gpu`` or ``iteration_s``)."""
    return [e["error"][k] for e in entries for k in [next((k for k in TIME_KEYS if k in e["error"]), None)] if k]


def error_summary(errs: list[float]) -> dict:
    """Mean and largest absolute error, and over how many (None where there are none)."""
    absolute = [abs(e) for e in errs]
    return {"mean_abs_error": sum(absolute) / len(absolute) if absolute else None,
            "largest_abs_error": max(absolute, default=None), "count": len(absolute)}


def summary(errs: list[float]) -> str:
    s = error_summary(errs)
    if not s["count"]:
        return "no rows"
    return f"mean |error| {100 * s['mean_abs_error']:.1f}%, largest {100 * s['largest_abs_error']:.1f}% " \
        f"over {s['count']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", type=Path, default=DEFAULT_MEASUREMENTS)
    add_json_option(ap, __file__)
    ap.add_argument("--hardware", default="dgx-a100")
    ap.add_argument("--memory-limit", type=float, default=80e9, help="bytes per GPU (default 80 GB)")
    args = ap.parse_args(argv)
    from costmodels import load_hardware

    hardware = load_hardware(args.hardware)
    files = read_files(args.measurements)
    peak = hardware.device.peak_flops_per_s.get("float16", hardware.device.peak_flops_per_s["float32"])
    rows, lines = run_rows(files, hardware, args.memory_limit, peak)
    print(f"Megatron-LM runs on {hardware.name}: predicted under the published execution (* = chosen by the "
          f"planner: unpublished) | the planner's own plan within {args.memory_limit / 1e9:g} GB")
    print(f"{'id':<14} {'t':>3} {'S':>3} {'d':>3} {'B':>5} {'b':>4} {'v':>3} {'measured':<14} {'':>8} "
          f"{'predicted':>8} {'error':>8} {'step s':>8} | {'own s':>8}  own plan")
    for line in lines:
        print(line)
    print(summary(headline_errors(rows)))
    mem, mem_lines = run_memory_rows(files, hardware, args.memory_limit)
    if mem_lines:
        print("\nMemory per GPU (GiB) at the stage of the peak")
        for line in mem_lines:
            print(line)
        print(summary([v for e in mem for v in e["error"].values()]))
    mode = "default" if (args.hardware, args.memory_limit) == ("dgx-a100", 80e9) else "custom"
    numbers = {"hardware": hardware.name, "memory_limit_bytes": args.memory_limit,
               "files": [name for name, _ in files], **error_summary(headline_errors(rows)),
               "memory": error_summary([v for e in mem for v in e["error"].values()])}
    write_results(args.json, __file__, mode, numbers, rows, argv, memory_rows=mem)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
