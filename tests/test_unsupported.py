"""Models with operations the extraction cannot map (on_unsupported="replicate"):
the graph, the plan and the CLI record it, so that validate and planner.shard
extract the model as it was planned instead of refusing it as another model."""

import json

import jax
import jax.numpy as jnp
import optax
import pytest
from builders import tiny_cnn
from flax import nnx

from planner import LayerGraph, Plan, extract
from planner.cli import main

FACTORY = '''
import jax, jax.numpy as jnp
from flax import nnx


class Tokens(nnx.Module):
    """Patches -> tokens -> attention (with query-key norms, a module the extraction cannot map) and a
    transpose (an operation it cannot map) -> dense -> mean -> classes."""

    def __init__(self, rngs):
        self.patch = nnx.Conv(3, 8, (4, 4), strides=(4, 4), rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, normalize_qk=True, rngs=rngs)
        self.mix = nnx.Linear(8, 8, rngs=rngs)
        self.head = nnx.Linear(8, 10, rngs=rngs)

    def __call__(self, x):
        x = self.patch(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = x + self.attn(x)
        x = jnp.swapaxes(jnp.swapaxes(x, 1, 2), 1, 2)
        return self.head(nnx.relu(self.mix(x)).mean(axis=1))


def make():
    return Tokens(nnx.Rngs(0)), jax.ShapeDtypeStruct((8, 8, 8, 3), jnp.float32)
'''


@pytest.fixture
def tokens(tmp_path, monkeypatch):
    (tmp_path / "tokens_factory_mod.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tokens_factory_mod

    return tokens_factory_mod


def test_the_graph_records_replicated_stand_ins(tokens):
    model, x = tokens.make()
    with pytest.raises(ValueError, match="--on-unsupported replicate"):
        extract(model, x)
    g = extract(model, x, on_unsupported="replicate")
    assert g.on_unsupported == "replicate"
    kinds = dict(zip(g.names, g.kind_names, strict=True))
    assert kinds["attn"] == "other" and kinds["reshape"] == "flatten"  # the attention kept as a replicated layer
    assert sum(k == "other" for k in g.kind_names) >= 2  # and the transposes
    again = LayerGraph.from_json(g.to_json())
    assert again.on_unsupported == "replicate" and again.fingerprint == g.fingerprint
    # an unmapped module alone (no unmapped operation) is a stand-in too
    class OnlyAttention(nnx.Module):
        def __init__(self, rngs):
            self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, normalize_qk=True, rngs=rngs)

        def __call__(self, x):
            return self.attn(x).mean(axis=1)

    alone = extract(OnlyAttention(nnx.Rngs(0)), jax.ShapeDtypeStruct((2, 4, 8), jnp.float32),
                    on_unsupported="replicate")
    assert alone.kind_names[0] == "other" and alone.on_unsupported == "replicate"
    # a model with nothing to replace says so, whatever the option
    cnn = extract(*tiny_cnn(), on_unsupported="replicate")
    assert cnn.on_unsupported == "error" and "on_unsupported" not in cnn.to_dict()


@pytest.mark.slow
def test_plan_validate_and_shard_accept_the_model_as_planned(tokens, tmp_path, capsys, devices):
    assert main(["layers", "tokens_factory_mod:make", "--json"]) == 2
    assert "--on-unsupported replicate" in capsys.readouterr().err
    path = tmp_path / "plan.json"
    assert main(["plan", "tokens_factory_mod:make", "--on-unsupported", "replicate", "--devices", "8",
                 "--batch", "8", "--hardware", "dgx-a100", "-o", str(path), "--json"]) == 0
    capsys.readouterr()
    assert json.loads(path.read_text())["on_unsupported"] == "replicate"
    assert main(["validate", "tokens_factory_mod:make", "--plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]

    import planner

    plan = Plan.read(path)
    model, _ = tokens.make()
    x = jax.random.normal(jax.random.key(0), (8, 8, 8, 3))
    y = jnp.arange(8) % 10
    want = optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
    step, state = planner.shard(model, plan, optax.sgd(0.1))
    _, loss = step(state, x, y)
    assert float(loss) == pytest.approx(float(want), rel=1e-5)


def test_older_plan_files_read_as_made_without_stand_ins(tmp_path):
    from planner import plan as make_plan
    from planner.models.zoo import get_model

    p = make_plan(get_model("alexnet"), devices=8, hardware="dgx-a100", batch=64)
    data = json.loads(p.to_json())
    assert data["on_unsupported"] == "error"
    data.pop("on_unsupported")
    assert Plan.from_dict(data).on_unsupported == "error"
    data["on_unsupported"] = "ignore"
    with pytest.raises(ValueError, match="on_unsupported"):
        Plan.from_dict(data)


def test_the_oracle_takes_the_option_too(tokens, capsys):
    assert main(["oracle", "tokens_factory_mod:make", "--devices", "4", "--json"]) == 2
    assert "--on-unsupported replicate" in capsys.readouterr().err
    assert main(["oracle", "tokens_factory_mod:make", "--devices", "4", "--on-unsupported", "replicate",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["devices"] == 4 for r in rows)


@pytest.mark.slow
def test_a_plan_is_independent_of_the_example_batch(tokens, devices):
    """The replicated stand-ins extract alike at any batch (same
    fingerprint), so a plan made from a batch-2 example is accepted by
    validate and planner.shard, which trace the model at the plan's batch."""
    from planner import plan, shard, validate

    model, x = tokens.make()
    small = jax.ShapeDtypeStruct((2, *x.shape[1:]), x.dtype)
    g = extract(model, small, on_unsupported="replicate")
    assert extract(model, jax.ShapeDtypeStruct((16, *x.shape[1:]), x.dtype),
                   on_unsupported="replicate").fingerprint == g.fingerprint
    p = plan(g, devices=8, hardware="dgx-a100", batch=16, platform="cpu")
    report = validate(model, p, memory_rtol=2.0, activation_rtol=2.0)  # runs: the plan is this model's
    assert report.batch == 16
    step, state = shard(model, p, optax.sgd(0.1))
    state, loss = step(state, jnp.ones((16, *x.shape[1:])), jnp.arange(16) % 10)
    assert jnp.isfinite(loss)
