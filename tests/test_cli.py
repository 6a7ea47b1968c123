"""``shardplan layers``: JSON and table output for every kind of MODEL, and
one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from planner.cli import main
from planner.models.netfile import parse_net

REPO = Path(__file__).resolve().parents[1]
from reference_files import PARADL_MODELS as MODELS  # noqa: E402
from reference_files import TINY_NET  # noqa: E402

LAYER_KEYS = {
    "name", "kind", "input_shape", "output_shape", "params", "flops_forward", "flops_backward", "activation_bytes",
}
TOTAL_KEYS = {"layers", "params", "flops_forward", "flops_backward", "activation_bytes"}



def _run_json(capsys, *argv: str) -> dict:
    assert main(["layers", *argv]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return json.loads(out.out)


def _check_report(report: dict, batch: int = 1) -> None:
    assert report["batch"] == batch
    assert report["layers"] and all(set(row) == LAYER_KEYS for row in report["layers"])
    assert set(report["totals"]) == TOTAL_KEYS
    assert report["totals"]["layers"] == len(report["layers"])
    for key in TOTAL_KEYS - {"layers"}:
        assert report["totals"][key] == sum(row[key] for row in report["layers"])
    for row in report["layers"]:
        assert all(isinstance(d, int) for d in row["input_shape"] + row["output_shape"])
        assert isinstance(row["params"], int)


def test_vgg16_cifar10_json(capsys):
    report = _run_json(capsys, "vgg16-cifar10", "--json")
    _check_report(report)
    assert report["dtype"] == "float32"
    # torchvision-convention count: 14,714,688 conv + 5,130 FC (512 -> 10)
    assert report["totals"]["params"] == 14_714_688 + 5_130 == 14_719_818
    first, last = report["layers"][0], report["layers"][-1]
    assert first["input_shape"] == [3, 32, 32]
    assert last["kind"] == "dense" and last["output_shape"] == [10]


def test_batch_and_dtype_scale_flops_and_bytes(capsys):
    one = _run_json(capsys, "vgg16-cifar10")
    many = _run_json(capsys, "vgg16-cifar10", "--batch", "8", "--dtype", "bfloat16")
    _check_report(many, batch=8)
    assert many["totals"]["params"] == one["totals"]["params"]
    assert many["totals"]["flops_forward"] == 8 * one["totals"]["flops_forward"]
    assert many["totals"]["activation_bytes"] == 8 * one["totals"]["activation_bytes"] // 2


@pytest.mark.skipif(not (MODELS / "VGG_ImageNet_profall.net_sc").is_file(), reason=f"no ParaDL models at {MODELS}")
def test_paradl_net_file(capsys):
    report = _run_json(capsys, str(MODELS / "VGG_ImageNet_profall.net_sc"))
    _check_report(report)
    assert report["model"] == "VGG16"
    assert report["totals"]["params"] == 169_801_408  # paradl.md §5
    flat = {row["name"]: row for row in report["layers"]}
    assert flat["FC6/flatten"]["input_shape"] == [512, 8, 8] and flat["FC6/flatten"]["output_shape"] == [512 * 8 * 8]
    assert flat["FC6"]["output_shape"] == [4096]


def test_net_file_detected_by_first_line(tmp_path, capsys):
    p = tmp_path / "tiny.txt"
    p.write_text(TINY_NET)
    report = _run_json(capsys, str(p), "--batch", "2")
    _check_report(report, batch=2)
    assert [r["name"] for r in report["layers"]] == ["CONV1", "RELU", "MPOOL", "FC/flatten", "FC"]
    assert report["layers"][0]["activation_bytes"] == 3 * 8 * 8 * 2 * 4
    assert report["layers"][2]["output_shape"] == [4, 4, 4]


def test_layer_graph_json_file(tmp_path, capsys):
    graph = parse_net(TINY_NET)
    p = tmp_path / "graph.json"
    p.write_text(graph.to_json())
    report = _run_json(capsys, str(p), "--json")
    _check_report(report)
    assert report["model"] == "tiny"
    assert report["totals"]["params"] == graph.total("params")


def test_table_on_a_terminal(tmp_path, capsys, monkeypatch):
    p = tmp_path / "tiny.net"
    p.write_text(TINY_NET)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["layers", str(p)]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "FC/flatten" in out and "748" in out
    assert not out.lstrip().startswith("{")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    report = _run_json(capsys, str(p), "--json")  # --json wins on a terminal
    assert report["totals"]["params"] == 748


FACTORY = """
import jax.numpy as jnp
from flax import nnx


class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, kernel_size=(3, 3), rngs=rngs)
        self.fc = nnx.Linear(4 * 8 * 8, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv(x))
        return self.fc(x.reshape(x.shape[0], -1))


def make():
    return Tiny(nnx.Rngs(0)), jnp.zeros((1, 8, 8, 3))
"""


def test_factory(tmp_path, capsys, monkeypatch):
    (tmp_path / "tiny_factory_mod.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    report = _run_json(capsys, "tiny_factory_mod:make", "--json")
    _check_report(report)
    assert report["totals"]["params"] == (3 * 3 * 3 * 4 + 4) + (256 * 10 + 10)
    assert report["layers"][0]["input_shape"] == [3, 8, 8]


def test_factory_wiring_with_a_stub_extractor(tmp_path, capsys, monkeypatch):
    """The CLI side of ``pkg:factory`` without the real extractor: the
    factory's pair goes to ``planner.extract.extract`` unchanged."""
    seen = []

    def fake_extract(module, example_input, on_unsupported="error"):
        seen.append((module, example_input, on_unsupported))
        return parse_net(TINY_NET)

    stub = types.ModuleType("planner.models.extraction")
    stub.extract = fake_extract
    monkeypatch.setitem(sys.modules, "planner.models.extraction", stub)
    (tmp_path / "cli_stub_factory.py").write_text("def make():\n    return 'module', 'example'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    report = _run_json(capsys, "cli_stub_factory:make")
    assert seen == [("module", "example", "error")]
    assert report["totals"]["params"] == 748


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("shardplan: error: ") and "Traceback" not in out.err
    assert "; " in lines[0]  # what is wrong; what would be accepted
    return lines[0]


def test_errors_are_one_line(tmp_path, capsys, monkeypatch):
    assert "unknown model 'no-such-model'" in _error(capsys, "layers", "no-such-model")
    assert "no such file" in _error(capsys, "layers", str(tmp_path / "missing.net"))
    assert "no such file" in _error(capsys, "layers", str(tmp_path / "missing.json"))
    truncated = tmp_path / "truncated.json"
    truncated.write_text(parse_net(TINY_NET).to_json()[:200])
    assert "truncated.json" in _error(capsys, "layers", str(truncated))
    bad_net = tmp_path / "bad.net"
    bad_net.write_text(TINY_NET.replace("4x10x4x4", "4x10x1x1"))
    assert f"{bad_net}:7:" in _error(capsys, "layers", str(bad_net))
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    assert "neither" in _error(capsys, "layers", str(other))
    assert "--batch" in _error(capsys, "layers", str(bad_net), "--batch", "0")
    assert "--batch" in _error(capsys, "layers", str(bad_net), "--batch", "-3")
    assert "invalid int" in _error(capsys, "layers", str(bad_net), "--batch", "many")
    assert "cannot import 'nonexistent.module'" in _error(capsys, "layers", "nonexistent.module:factory")
    (tmp_path / "cli_bad_factories.py").write_text("def needs(x):\n    return x\n\ndef wrong():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "needs arguments" in _error(capsys, "layers", "cli_bad_factories:needs")
    assert "not a (module, example_input) pair" in _error(capsys, "layers", "cli_bad_factories:wrong")
    assert "no attribute" in _error(capsys, "layers", "cli_bad_factories:absent")
    _error(capsys, "layers")  # argparse: missing MODEL
    _error(capsys, "layers", str(bad_net), "--dtype", "int8")
    _error(capsys)  # no command
    _error(capsys, "frobnicate")


def test_help_exits_zero(capsys):
    assert main(["layers", "--help"]) == 0
    assert "MODEL" in capsys.readouterr().out


def test_python_dash_m(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-m", "planner", "layers", "alexnet", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    _check_report(report)
    assert report["totals"]["params"] == 61_100_840  # torchvision AlexNet
    bad = subprocess.run(
        [sys.executable, "-m", "planner", "layers", "alexnet", "--batch", "0"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1


@pytest.mark.slow
def test_plan_header_says_when_pure_data_parallelism_does_not_fit(capsys, monkeypatch):
    """Under a limit below what pure data parallelism needs, the speed-up in the
    header is against a plan that could not run, and the header says so with
    its memory (the JSON's data_parallel_memory_bytes, which exceeds the limit)."""
    import re as _re

    from planner._format import format_bytes

    argv = ["plan", "vgg16", "--devices", "64", "--hardware", "dgx-a100"]
    assert main(argv + ["--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    dp = free["data_parallel_memory_bytes"]
    assert "which does not fit" not in json.dumps(free)
    limit = int((dp + free["memory_bytes_per_device"]) / 2)  # between the hybrid's memory and pure data's
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(argv + ["--memory-limit", str(limit)]) == 0
    out = " ".join(_re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out).split())
    assert "pure data parallelism" in out and f"which does not fit the limit ({format_bytes(dp)} per device)" in out
    assert dp > limit
