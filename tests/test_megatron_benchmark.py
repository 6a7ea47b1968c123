"""benchmarks/megatron.py on a small file of the same layout: rows with
either time key, a memory row, the JSON it writes."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import megatron  # noqa: E402

MODEL = {"kind": "gpt", "layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "seq": 32, "vocab": 256}


def _execution(**kw):
    ex = {"gpus": 8, "tensor": 2, "pipeline": 2, "data": 2, "batch": 16, "microbatch": None, "interleave": None,
          "recompute": "full", "sequence_parallel": False, "dtype": "float16", "optimizer": "adam"}
    ex.update(kw)
    return ex


def test_model_flops_is_narayanans_equation_three():
    m = {"layers": 24, "hidden": 2304, "heads": 24, "seq": 2048, "vocab": 51200}
    h, s, L, V, B = 2304, 2048, 24, 51200, 512
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert megatron.model_flops(m, B, "full") == pytest.approx(eq3)
    assert megatron.model_flops(m, B, "selective") == pytest.approx(eq3 - 24 * B * s * L * h * h * (1 + s / (6 * h)))


@pytest.mark.slow
def test_benchmark_writes_every_row(tmp_path):
    data = {"rows": [
        {"id": "small-tflops", "model": MODEL, "execution": _execution(), "measured": {"tflops_per_gpu": 1.0}},
        {"id": "small-time", "model": MODEL, "execution": _execution(microbatch=2, recompute="selective",
                                                                     sequence_parallel=True),
         "measured": {"iteration_s": 0.01}},
        {"id": "small-open", "model": MODEL, "execution": _execution(tensor=None, recompute=None,
                                                                     sequence_parallel=None),
         "measured": {"iteration_s": 0.01}},
    ], "memory_rows": [
        {"id": "small-memory", "model": MODEL, "execution": _execution(microbatch=1, recompute="none"),
         "measured": {"activations_gib": 0.001, "params_optimizer_gib": 0.001}},
    ]}
    (tmp_path / "megatron-small.json").write_text(json.dumps(data))
    out = tmp_path / "out.json"
    assert megatron.main(["--measurements", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    first, second, third = report["rows"]
    assert set(first["predicted"]) == {"tflops_per_gpu"} and first["chosen"] == ["microbatch", "interleave"]
    assert set(second["predicted"]) == {"iteration_s"} and second["execution"]["microbatch"] == 2
    assert second["error"]["iteration_s"] == pytest.approx(second["predicted"]["iteration_s"] / 0.01 - 1)
    assert set(third["chosen"]) == {"tensor", "microbatch", "interleave", "recompute", "sequence_parallel"}
    assert third["execution"]["recompute"] in ("none", "selective", "full") and third["execution"]["tensor"] >= 1
    assert all(r["plan_at_least_as_fast"] for r in report["rows"])
    (mem,) = report["memory_rows"]
    assert set(mem["predicted"]) == {"activations_gib", "params_optimizer_gib"}
