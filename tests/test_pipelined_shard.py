"""planner.shard and validate on pipelined plans: decoder-tiny planned on
2 stages x 2 data x 2 model (8 CPU devices) under GPipe and 1F1B trains
three steps with the losses, gradients and parameters of the unsharded
model; validate's stage-to-stage transfers against a hand count; what the
runtime cannot run is refused with what to plan instead; the command line."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import planner
from planner.models.flax_transformers import transformer
from planner.models.transformer import TransformerConfig
from planner.runtime.pipelined import model_parameters
from planner.runtime.pipeline import param_name

BATCH, MICRO_BATCH, TOKENS, WIDTH, VOCAB = 16, 2, 64, 64, 512  # decoder-tiny: 64 tokens, width 64, vocab 512


def _space(schedule: str, **kw) -> planner.PipelineSpace:
    return planner.PipelineSpace(stages=(2,), tensor=(2,), micro_batch=(MICRO_BATCH,), schedule=(schedule,),
                                 **{"recompute": ("full",), "sequence_parallel": (False,), **kw})


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def planned(request):
    return planner.plan("decoder-tiny", devices=8, batch=BATCH, hardware="cpu-local", pipeline=_space(request.param))


def test_the_plan_has_the_asked_pipeline(planned):
    p = planned.pipeline
    assert (p.stages, p.data, p.tensor, p.micro_batch, p.microbatches) == (2, 2, 2, MICRO_BATCH, 4)
    assert p.schedule in ("gpipe", "1f1b") and p.recompute == "full" and p.stage_blocks == ((0, 0), (1, 1))


def _data(seed):
    x = jax.random.randint(jax.random.key(seed), (BATCH, TOKENS), 0, VOCAB)
    y = jax.random.randint(jax.random.key(seed + 1), (BATCH, TOKENS), 0, VOCAB)
    return x, y


def recording_sgd(rate):
    """SGD whose state is the last gradient it applied (to compare gradients after a step)."""
    return optax.GradientTransformation(lambda p: jax.tree.map(jax.numpy.zeros_like, p),
                                        lambda g, state, params=None: (jax.tree.map(lambda a: -rate * a, g), g))


def _unsharded(model, batches, rate):
    """(loss, gradients by name, parameters by name) per step of the model on one device."""
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p)(x), y).mean()

    out = []
    for x, y in batches:
        value, grads = jax.jit(jax.value_and_grad(loss))(params, x, y)
        params = jax.tree.map(lambda a, g: a - rate * g, params, grads)
        named = lambda t: {param_name(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(t)[0]}  # noqa: E731
        out.append((float(value), named(grads), named(params)))
    return out


def _close(got: dict, expected: dict):
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_allclose(np.asarray(got[name]), expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_pipelined_plan_trains_like_the_unsharded_model(planned):
    batches = [_data(2 * i) for i in range(3)]
    step, state = planner.shard(transformer("decoder-tiny", nnx.Rngs(0)), planned, recording_sgd(0.1))
    assert state.params.blocks["attn/qkv/kernel"].sharding.spec == jax.sharding.PartitionSpec("stage", None, "model")
    assert state.params.head["lm_head/kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    expected = _unsharded(transformer("decoder-tiny", nnx.Rngs(0)), batches, 0.1)
    for (x, y), (loss_1, grads_1, params_1) in zip(batches, expected, strict=True):
        state, loss = step(state, x, y)
        assert abs(float(loss) - loss_1) <= 1e-5
        _close(model_parameters(jax.device_get(state.opt_state)), grads_1)
        _close(model_parameters(jax.device_get(state.params)), params_1)


@pytest.mark.slow
def test_validate_counts_the_stage_transfers(planned):
    report = planner.validate(nnx.eval_shape(lambda: transformer("decoder-tiny", nnx.Rngs(0))), planned)
    (row,) = report.collectives
    # by hand: 2 sends per tick, 2 (m + S - 1) = 10 ticks, each 2 rows x 64 tokens x 64 wide x 4 B on one device
    assert row.kind == "collective-permute" and row.axes == ("stage",)
    assert row.count == 20 and row.predicted_bytes == row.compiled_bytes == 20 * MICRO_BATCH * TOKENS * WIDTH * 4
    assert row.ok and report.mesh == (2, 2, 2)
    total = next(r for r in report.memory if r.part == "total")
    assert total.predicted_bytes > 0 and total.compiled_bytes > 0
    assert report.ok  # the runtime's count within the default 30% of the compiled total, both schedules


def test_the_runtime_memory_is_counted_by_hand(planned):
    """decoder-tiny (s 64, h 64, 4 heads, MLP 176, vocab 512) on 2 x 2 x 2, micro-batch 2, m = 4, fp32 Adam."""
    from planner.models.transformer import build_transformer
    from planner.models.zoo import TRANSFORMERS
    from planner.runtime._pipeline_memory import DecoderDims, decoder_dims, runtime_memory

    dims = decoder_dims(build_transformer(TRANSFORMERS["decoder-tiny"], "d"))
    assert dims == DecoderDims(tokens=64, width=64, heads=4, ffn=176, vocab=512)
    slots = {"gpipe": 4, "1f1b": 2}[planned.pipeline.schedule]  # stage inputs held (act_slots), 1 cotangent slot
    held = runtime_memory(planned, dims, {"first": 1000.0, "blocks": 2000.0, "head": 4000.0}, slots, 1)
    one = 64 * 2 * 64 * 4  # one micro-batch's stage input: s b h x 4 B
    assert held.buffer_bytes == (slots + 1 + 2) * one + 2 * 4 * one
    # 7,000 B of fp32 weights: x (4 + 4 + 8) / 4 for weight, gradient, Adam; fresh gradients of blocks and head
    assert held.state_bytes == 7000 * 4 + 6000
    sbh = 64 * 2 * 64
    block = sbh * 16 + (sbh * 16 + 2 * 64 * 2 * 176 * 4 + 4 * 64 * 64 * 2 * 4) / 2  # Korthikanti, t = 2, 4 B
    head = 2 * 4 * sbh + 4 * 64 * 2 * 512 / 2  # the norm's and output layer's inputs, fp32 logits over t
    assert held.backward_bytes == block + head + 4 * 64 * 2 * 512 / 2  # + the logits' gradient


def test_refusals_say_what_to_plan(planned):
    model = transformer("decoder-tiny", nnx.Rngs(0))
    p = planned.pipeline
    cases = [(dict(schedule="interleaved"), "GPipe and 1F1B"), (dict(recompute="none"), "honours 'full' only"),
             (dict(sequence_parallel=True), "no sequence parallelism"),
             (dict(distributed_optimizer=True), "distributed optimizer")]
    for change, message in cases:
        bad = dataclasses.replace(planned, pipeline=dataclasses.replace(p, **change))
        with pytest.raises(ValueError, match=message):
            planner.shard(model, bad, optax.sgd(0.1))
        with pytest.raises(ValueError, match=message):
            planner.validate(model, bad)


def test_a_tied_decoder_is_refused():
    config = TransformerConfig.gpt(64, 2, 4, tokens=16, vocab=128)  # the output layer is the token table
    plan = planner.plan(config, devices=8, batch=BATCH, hardware="cpu-local", pipeline=_space("gpipe"), name="tied")
    with pytest.raises(ValueError, match="tied embedding"):
        planner.shard(transformer(config, nnx.Rngs(0)), plan, optax.sgd(0.1))


def test_a_model_without_a_list_of_blocks_is_refused(planned):
    class Stacked(nnx.Module):
        def __init__(self):
            self.blocks = nnx.Linear(4, 4, rngs=nnx.Rngs(0))

    with pytest.raises(ValueError, match="list attribute 'blocks'"):
        from planner.runtime._model_chain import model_chain

        model_chain(Stacked(), jax.ShapeDtypeStruct((2, 4), np.float32), lambda a, b: a.mean(), blocks=2)
    with pytest.raises(ValueError, match="made for another model"):
        planner.shard(transformer("llama-tiny", nnx.Rngs(0)), planned, optax.sgd(0.1))


@pytest.mark.slow
def test_cli_validates_a_pipelined_plan_file(tmp_path, capsys):
    from planner.cli import main

    plan = planner.plan("decoder-tiny", devices=8, batch=BATCH, hardware="cpu-local", pipeline=_space("gpipe"))
    path = tmp_path / "plan.json"
    plan.write(path)
    assert planner.Plan.read(path).pipeline == plan.pipeline
    assert main(["validate", "decoder-tiny", "--plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["mesh"] == [2, 2, 2]
    assert [c["kind"] for c in data["collectives"]] == ["collective-permute"]
