"""Compiling a plan's step for a GPU without one (planner.runtime.gpu_target):
the target description against hand-computed fields of the presets' GPUs, and,
where the CUDA PJRT plugin is installed (the ``gpu-aot`` extra), a tiny CNN's
step compiled for an A100 against hand-counted parameter bytes."""

import importlib.util

import pytest
from builders import TINY_CNN_BATCH, tiny_cnn

import planner
from planner.runtime.gpu_target import CUDA_PLUGINS, gpu_target_config, gpu_target_mesh, gpu_target_presets
from planner.runtime.validation import fixed_plan

PLUGIN = any(importlib.util.find_spec("jax_plugins") and importlib.util.find_spec(m) for m in CUDA_PLUGINS)
MEGATRON = {"fcs/0": "filter", "relu_2": "filter", "fcs/1": "channel"}
CONV0, CONV1, BN = 3 * 3 * 3 * 8 + 8, 3 * 3 * 8 * 16 + 16, 2 * 16
FC0_W, FC0_B, FC1_W, FC1_B = 256 * 32, 32, 32 * 16, 16


def test_target_config_from_the_presets():
    a100 = gpu_target_config("dgx-a100")
    # A100: compute capability 8.0, 108 SMs of 64 FP32 cores; clock 19.5e12 / (108 * 64 * 2) = 1.4106 GHz
    for field in ("major: 8 minor: 0", "core_count: 108", "fpus_per_core: 64", "clock_rate_ghz: 1.4106",
                  "device_memory_size: 80000000000", "memory_bandwidth: 2039000000000", 'platform_name: "CUDA"'):
        assert field in a100
    # H100 SXM5: 9.0, 132 SMs of 128 cores; 67e12 / (132 * 128 * 2) = 1.9827 GHz
    h100 = gpu_target_config("dgx-h100")
    for field in ("major: 9 minor: 0", "core_count: 132", "fpus_per_core: 128", "clock_rate_ghz: 1.9827",
                  "shared_memory_per_block_optin: 232448"):
        assert field in h100
    assert set(gpu_target_presets()) >= {"dgx-a100", "dgx-h100", "h200"}
    with pytest.raises(ValueError, match="no GPU target for hardware 'abci-v100'"):
        gpu_target_config("abci-v100")


@pytest.mark.skipif(PLUGIN, reason="the CUDA PJRT plugin is installed")
def test_without_the_plugin_the_error_names_the_extra():
    model, x = tiny_cnn()
    plan = fixed_plan(model, x, (2, 4), strategies=MEGATRON, batch=TINY_CNN_BATCH, platform="gpu")
    with pytest.raises(ImportError, match=r"shardplan\[gpu-aot\]"):
        gpu_target_mesh(plan)


@pytest.mark.slow
def test_plan_step_compiled_for_an_a100():
    pytest.importorskip("jax_plugins.xla_cuda12")
    from planner.runtime.gpu_target import validate_on_gpu_target

    model, x = tiny_cnn()
    plan = fixed_plan(model, x, (2, 4), strategies=MEGATRON, batch=TINY_CNN_BATCH, hardware="dgx-a100",
                      platform="gpu")
    mesh = gpu_target_mesh(plan)
    assert {d.platform for d in mesh.devices.flat} == {"gpu"} and mesh.devices.shape == (2, 4)
    report = validate_on_gpu_target(model, plan)
    assert report.platform == "gpu"
    mem = {r.part: r for r in report.memory}
    # Megatron FC pair on 2x4: fcs/0 kernel and bias split 4 ways, fcs/1 kernel by rows, its bias whole
    local = CONV0 + CONV1 + BN + (FC0_W + FC0_B) / 4 + FC1_W / 4 + FC1_B
    assert mem["parameters"].compiled_bytes == local * 4
    assert mem["optimizer state"].compiled_bytes == 2 * local * 4 + 4  # adam: 2 slots + int32 count
    assert mem["arguments"].ok and mem["arguments"].compiled_bytes > 0


@pytest.mark.skipif(PLUGIN, reason="the CUDA PJRT plugin is installed")
def test_cli_validate_gpu_target_without_the_plugin_exits_2_naming_the_extra(tmp_path, capsys):
    from planner.cli import main

    path = tmp_path / "plan.json"
    planner.plan("vgg16-cifar10", devices=8, batch=16, hardware="dgx-a100", verify=False).write(path)
    assert main(["validate", "vgg16-cifar10", "--plan", str(path), "--gpu-target"]) == 2
    assert "shardplan[gpu-aot]" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_validates_a_bfloat16_plan_for_an_a100(tmp_path, capsys):
    """XLA:CPU computes bfloat16 in float32 and cannot check it; compiled for the A100 it is checked."""
    pytest.importorskip("jax_plugins.xla_cuda12")
    import json

    from planner.cli import main

    path = tmp_path / "plan.json"
    planner.plan("vgg16-cifar10", devices=8, batch=16, hardware="dgx-a100", dtype="bfloat16", verify=False).write(path)
    assert main(["validate", "vgg16-cifar10", "--plan", str(path), "--gpu-target", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["platform"] == "gpu" and report["ok"]
