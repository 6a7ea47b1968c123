"""Hardware presets and files: the ABCI preset reproduces ParaDL's network
step function (paradl.md §3.2), and malformed files are rejected."""

import json

import pytest

from costmodels import Hardware, hardware_from_dict, load_hardware, preset_names


def test_presets_listed_and_load():
    assert {"abci-v100", "dgx-a100", "dgx-h100", "h200"} <= set(preset_names())
    for name in preset_names():
        hw = load_hardware(name)
        assert isinstance(hw, Hardware) and hw.name == name


@pytest.mark.parametrize(
    "ranks, latency_us, bandwidth",
    # paradl.md §3.2, the values verified by running the original code.
    [(2, 9.0, 50e9), (4, 9.0, 50e9), (8, 40.31, 12.5e9), (68, 40.31, 12.5e9),
     (69, 40.49, 12.5e9), (136, 40.49, 12.5e9), (137, 40.98, 12.5e9), (1024, 40.98, 12.5e9)],
)
def test_abci_step_function(ranks, latency_us, bandwidth):
    hw = load_hardware("abci-v100")
    t = hw.tier_for(ranks, crosses_nodes=ranks > hw.devices_per_node)
    assert t.latency_s == pytest.approx(latency_us * 1e-6, rel=1e-12)
    assert t.bandwidth_bytes_per_s == bandwidth


def test_abci_constants():
    hw = load_hardware("abci-v100")
    assert hw.devices_per_node == 4 and hw.device.memory_bytes == 16e9
    assert hw.gradient_overlap == 0.0  # ParaDL assumes no overlap


def test_small_collective_across_nodes_skips_intra_node_tier():
    hw = load_hardware("abci-v100")
    assert hw.tier_for(2, crosses_nodes=True).name == "ib-leaf"
    assert hw.tier_for(2, crosses_nodes=False).name == "nvlink"


def test_user_file_round_trip(tmp_path):
    d = load_hardware("dgx-h100").to_dict()
    d["name"] = "mine"
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(d))
    hw = load_hardware(p)
    assert hw.name == "mine" and hw.to_dict() == d


def _base():
    return load_hardware("abci-v100").to_dict()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["tiers"][0].update(bandwidth_gbps=50), "unknown field"),
        (lambda d: d["tiers"][0].pop("latency_s"), "missing latency_s"),
        (lambda d: d["device"].update(memory_bytes=-1), "positive"),
        (lambda d: d["device"].update(memory_bytes=float("inf")), "finite"),
        (lambda d: d["device"]["efficiency"].update(conv=1.5), "at most 1.0"),
        (lambda d: d.update(devices_per_node=0), "positive integer"),
        (lambda d: d.update(schema="x"), "schema"),
        (lambda d: d.update(version=9), "not supported"),
        (lambda d: d.update(tiers=d["tiers"][:1]), "last tier"),
        (lambda d: d["device"]["peak_flops_per_s"].pop("float32"), "missing float32"),
    ],
)
def test_bad_hardware_rejected(mutate, message):
    d = _base()
    mutate(d)
    with pytest.raises(ValueError, match=message):
        hardware_from_dict(d)


def test_unknown_preset_names_the_presets():
    with pytest.raises(ValueError, match="abci-v100"):
        load_hardware("tpu-v9")
