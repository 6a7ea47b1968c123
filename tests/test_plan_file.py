"""Plan files: exact round trip, and rejection of malformed or foreign files."""

import json

import pytest

from planner.planning import Plan, plan


@pytest.fixture(scope="module")
def vgg_plan():
    return plan("vgg16-cifar10-splitbrain", devices=16, hardware="abci-v100", batch=256, method="dp")


def test_round_trip_is_exact(vgg_plan, tmp_path):
    text = vgg_plan.to_json()
    back = Plan.from_json(text)
    assert back == vgg_plan
    assert back.to_json() == text
    path = tmp_path / "plan.json"
    vgg_plan.write(path)
    assert Plan.read(path) == vgg_plan
    assert json.loads(text)["schema"] == "shardplan/plan" and json.loads(text)["version"] == 1


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="shardplan/layer-graph"), "not a plan file"),
        (lambda d: d.update(version=2), "newer"),
        (lambda d: d.update(version="1"), "integer"),
        (lambda d: d.pop("mesh"), 'missing "mesh"'),
        (lambda d: d.update(mesh=[3, 5]), "does not hold"),
        (lambda d: d.update(iteration_s=float("nan")), "finite"),
        (lambda d: d["layers"][0].update(strategy="diagonal"), "not one of"),
        (lambda d: d["layers"][0].pop("compute_s"), 'missing "compute_s"'),
        (lambda d: d.update(layers=[]), "must not be empty"),
        (lambda d: d.update(axis_names=["x", "y"]), "axis_names"),
        (lambda d: d["collectives"][0].update(axes="model"), "axes"),
        (lambda d: d.update(input_shape=[3, -1]), "positive integers"),
    ],
)
def test_malformed_plans_rejected(vgg_plan, mutate, message):
    d = json.loads(vgg_plan.to_json())
    mutate(d)
    with pytest.raises(ValueError, match=message):
        Plan.from_dict(d)


def test_truncated_and_missing_files(vgg_plan, tmp_path):
    with pytest.raises(ValueError, match="malformed JSON"):
        Plan.from_json(vgg_plan.to_json()[:100])
    with pytest.raises(ValueError, match="cannot read plan file"):
        Plan.read(tmp_path / "nope.json")
