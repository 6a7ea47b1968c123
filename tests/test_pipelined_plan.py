"""Plans with pipeline stages: planner.plan's fallback to a pipelined plan
when no one-stage plan fits, its predicted step against the cost functions
called directly, the plan file (version 5) and the command line."""

from __future__ import annotations

import json
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from planner import TransformerConfig, plan
from planner.cli import main
from planner.infeasible import InfeasibleMemoryError
from planner.plans.pipeline import Pipeline, stage_blocks
from planner.plans.record import Plan

SMALL = TransformerConfig.gpt(256, 8, 8, tokens=512, vocab=1024)  # 8 blocks: stages of 1, 2, 4 or 8 blocks
TIGHT = 60e6  # bytes: no one-stage plan of SMALL on 8 devices at batch 16 fits (211 MB needed); 2 stages do
KW = dict(devices=8, hardware="dgx-a100", batch=16)


@pytest.fixture(scope="module")
def small_pipelined() -> Plan:
    return plan(SMALL, name="small", memory_limit=TIGHT, **KW)


def test_stage_blocks_cut_the_chain_into_equal_runs():
    assert stage_blocks(8, 2) == ((0, 3), (4, 7))
    assert stage_blocks(8, 2, 2) == ((0, 1), (2, 3), (4, 5), (6, 7))  # chunks 0, 2 on stage 0; 1, 3 on stage 1
    with pytest.raises(ValueError, match="do not split"):
        stage_blocks(8, 3)


def test_auto_pipelines_only_where_no_one_stage_plan_fits(small_pipelined):
    with pytest.raises(InfeasibleMemoryError) as one_stage:
        plan(SMALL, name="small", memory_limit=TIGHT, pipeline="never", **KW)
    assert one_stage.value.required_bytes > TIGHT
    p = small_pipelined
    assert p.pipeline is not None and p.axis_names == ("stage", "data", "model")
    assert p.memory_bytes_per_device == p.pipeline.peak_bytes <= TIGHT
    assert p.iteration_s == p.pipeline.step_s and p.devices == 8 and p.batch == 16
    assert p.mesh == (p.pipeline.stages, p.pipeline.data, p.pipeline.tensor)
    assert p.pipeline.micro_batch * p.pipeline.microbatches * p.pipeline.data == 16
    # the evaluation: one micro-batch per replica on the stage's data x model sub-mesh
    assert p.evaluation.mesh == (p.pipeline.data, p.pipeline.tensor)
    assert p.evaluation.batch == p.pipeline.micro_batch * p.pipeline.data
    assert p.meshes and not any(m.feasible for m in p.meshes)  # the one-stage search that found nothing
    # with room, auto keeps the one-stage plan
    roomy = plan(SMALL, name="small", memory_limit="80GB", **KW)
    assert roomy.pipeline is None and roomy.axis_names == ("data", "model")


def test_nothing_fits_names_the_smallest_pipelined_memory():
    with pytest.raises(InfeasibleMemoryError, match="no pipelined plan of small on 8 devices") as e:
        plan(SMALL, name="small", memory_limit=1e6, **KW)
    assert "without stages" in str(e.value)
    with pytest.raises(InfeasibleMemoryError) as only:
        plan(SMALL, name="small", memory_limit=1e6, pipeline="always", **KW)
    assert 1e6 < only.value.required_bytes <= e.value.required_bytes
    assert f"{only.value.required_bytes:,.0f} bytes" in str(only.value)


def test_pipeline_is_refused_for_a_cnn():
    with pytest.raises(ValueError, match="pipelined plans are made for decoders"):
        plan("vgg16-cifar10", pipeline="always", **KW)
    with pytest.raises(ValueError, match="pipeline must be one of"):
        plan(SMALL, pipeline="sometimes", **KW)


def test_the_predicted_step_is_the_chain_cost_of_its_configuration(small_pipelined):
    """Oracle: the plan's configuration costed by calling costmodels' segment
    and chain costs directly, and the Narayanan et al. 2021 pipeline time
    ``(m - 1/v) max T_i + sum T_i / v`` from the stages' slots by hand."""
    from costmodels import (
        ChainConfig,
        CostSettings,
        Recompute,
        Schedule,
        chain_cost,
        hardware_arrays,
        load_hardware,
        megatron_options,
        segment_costs,
        state_bytes,
    )
    from planner.models.block_chain import block_chain

    p = small_pipelined.pipeline
    hw = load_hardware("dgx-a100")
    bc = block_chain(SMALL, dtype="float32", dropout=False)
    hwa = hardware_arrays(hw, "float32")
    seg = segment_costs(bc.graph.arrays, hwa, float(p.micro_batch), float(p.tensor),
                        jnp.asarray(megatron_options(bc.graph, p.sequence_parallel)), jnp.asarray(bc.segment),
                        CostSettings(dtype="float32"), True, False)
    schedule = {"gpipe": Schedule.GPIPE, "1f1b": Schedule.ONE_F_ONE_B, "interleaved": Schedule.INTERLEAVED}
    recompute = {"none": Recompute.NONE, "selective": Recompute.SELECTIVE, "full": Recompute.FULL}
    f = lambda x: jnp.asarray(float(x), jnp.float32)  # noqa: E731
    cfg = ChainConfig(f(p.tensor), f(p.stages), f(p.data), f(p.micro_batch), f(p.microbatches), f(p.chunks),
                      f(schedule[p.schedule]), f(recompute[p.recompute]), f(p.sequence_parallel),
                      f(p.distributed_optimizer))
    cost = chain_cost(bc.chain.shape(), seg, cfg, hwa, state_bytes("float32", "adam"), 8)
    assert p.step_s == pytest.approx(float(cost.step.step_s), rel=1e-6)
    assert p.peak_bytes == pytest.approx(float(cost.peak_bytes), rel=1e-6)
    slots = np.asarray(cost.step.slot_s)[: p.stages].astype(np.float64)
    v, m = p.chunks, p.microbatches
    assert p.pipeline_s == pytest.approx((m - 1 / v) * slots.max() + slots.sum() / v, rel=1e-5)
    assert p.bubble_s == pytest.approx(p.pipeline_s - m * slots.max(), rel=1e-4, abs=1e-9)
    assert p.step_s == pytest.approx(p.pipeline_s + p.gradient_sync_s + p.optimizer_s, rel=1e-6)


def test_plan_file_round_trip(small_pipelined, tmp_path):
    path = tmp_path / "plan.json"
    small_pipelined.write(path)
    back = Plan.read(path)
    assert back == small_pipelined and back.to_json() == small_pipelined.to_json()
    d = json.loads(path.read_text())
    assert d["version"] == 5 and d["axis_names"] == ["stage", "data", "model"]
    p = small_pipelined.pipeline
    assert d["mesh"] == [p.stages, p.data, p.tensor] and d["iteration_s"] == p.step_s
    assert d["pipeline"]["stage_evaluation"]["mesh"] == [p.data, p.tensor]
    d["pipeline"]["stage_blocks"] = [[0, 7]] * len(p.stage_blocks)
    with pytest.raises(ValueError, match="stage_blocks"):
        Plan.from_dict(d)
    d = json.loads(path.read_text())
    d["iteration_s"] = 1.0
    with pytest.raises(ValueError, match="plan.iteration_s 1.0 is not its pipeline's"):
        Plan.from_dict(d)


def test_a_version_4_file_reads_with_no_pipeline():
    one = plan("gpt2-small", devices=8, hardware="dgx-a100", batch=16, pipeline="never", levers="none")
    d = json.loads(one.to_json())
    assert d["pipeline"] is None
    d["version"] = 4
    d.pop("pipeline")
    back = Plan.from_dict(d)
    assert back == one and back.pipeline is None


def test_pipeline_dataclass_checks_its_names():
    p = Pipeline(stages=2, data=1, tensor=1, chunks=1, micro_batch=1, microbatches=2, schedule="1f1b",
                 recompute="none", sequence_parallel=False, distributed_optimizer=False, blocks=4,
                 stage_blocks=((0, 1), (2, 3)), step_s=1.0, pipeline_s=1.0, bubble_s=0.0, transfer_s=0.0,
                 gradient_sync_s=0.0, optimizer_s=0.0, state_bytes=1.0, activation_bytes=1.0, peak_bytes=2.0)
    assert p.devices == 2 and p.batch == 2 and p.blocks_of_stage(1) == ((2, 3),)
    with pytest.raises(ValueError, match="schedule"):
        Pipeline(**{**p.__dict__, "schedule": "zigzag"})


def test_cli_prints_the_grouped_table(tmp_path, capsys, monkeypatch):
    config = tmp_path / "small.json"
    config.write_text(json.dumps(SMALL.to_dict("small")))
    out = tmp_path / "plan.json"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    argv = ["plan", str(config), "--devices", "8", "--batch", "16", "--hardware", "dgx-a100", "--memory-limit",
            "60MB", "-o", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    p = Plan.read(out).pipeline
    assert f"mesh {p.stages}x{p.data}x{p.tensor} (stage x data x model)" in text
    assert "predicted step" in text and "bubble" in text and "gradient sync" in text and "optimizer" in text
    stage_lines = [line for line in text.splitlines() if line.startswith("stage ")]
    assert len(stage_lines) == p.stages
    assert stage_lines[0].startswith("stage 0: embed + pos_embed + block")
    assert stage_lines[-1].rstrip().endswith("norm + lm_head")
    assert text.count("blocks/0/attn/qkv") == 1 and "blocks/1/" not in text  # one block's strategies, once


def test_cli_json_is_the_plan_file(capsys):
    assert main(["plan", "decoder-tiny", "--devices", "8", "--batch", "16", "--hardware", "dgx-a100",
                 "--pipeline", "always", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert Plan.from_dict(d).pipeline is not None and d["axis_names"] == ["stage", "data", "model"]


def test_cli_refuses_pipeline_for_a_cnn(capsys):
    assert main(["plan", "vgg16-cifar10", "--devices", "8", "--pipeline", "always"]) == 2
    err = capsys.readouterr().err
    assert "pipelined plans are made for decoders" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_gpt3_175b_on_1024_a100s_is_pipelined():
    """GPT-3 175B at its batch of 1,536 on 1,024 A100-80GB: no one-stage plan
    fits (253 GB needed); Megatron-LM runs it with 8 stages."""
    p = plan("gpt3-175b", devices=1024, hardware="dgx-a100", batch=1536)
    assert p.pipeline is not None and p.pipeline.stages > 1
    assert p.fits_memory and p.memory_bytes_per_device <= 80e9 and p.devices == 1024 and p.batch == 1536


def test_evaluate_refuses_a_pipelined_plan_and_shard_what_it_cannot_run(small_pipelined, tmp_path, capsys):
    from planner import shard, validate
    from planner.runtime.pipelined import check_runnable

    try:  # what the pipelined runtime cannot run (tests/test_pipelined_shard.py runs what it can)
        check_runnable(small_pipelined)
    except ValueError as e:
        for run in (lambda: shard(None, small_pipelined, None), lambda: validate(None, small_pipelined)):
            with pytest.raises(ValueError, match="pipelined runtime|GPipe and 1F1B"):
                run()
        assert "PipelineSpace" in str(e)
    path = tmp_path / "plan.json"
    small_pipelined.write(path)
    assert main(["evaluate", "decoder-tiny", "--devices", "8", "--plan", str(path)]) == 2
    assert "is a pipelined plan" in capsys.readouterr().err
