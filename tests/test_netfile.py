"""The ParaDL ``.net`` importer against the published per-network totals
(paradl.md §5 table, §4.10 measured times) and on malformed input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference_files import MISSING_REASON, TINY_NET
from reference_files import PARADL_MODELS as MODELS

from planner.ir.graph import LayerGraph, LayerKind
from planner.models.netfile import layer_type, load_net, paradl_totals, parse_net

# paradl.md §5 "Shipped networks" (per sample, elements; Σx and Σy exclude
# ReLU/BN) and §4.10 (measured FW+BW time per sample, seconds): the
# published oracle, hard-coded.
#   file: (layers, input shape, Σ|x|, Σ|y|, Σ|w|, t_sample)
TABLE = {
    "ALEXNET_ImageNet.net": (20, (3, 226, 226), 931_692, 779_464, 62_367_776, None),
    "ALEXNET_ImageNet_profall.net_sc": (20, (3, 226, 226), 931_692, 779_464, 62_367_776, 0.000610938),
    "VGG_ImageNet_profall.net_sc": (38, (3, 226, 226), 15_705_164, 15_552_936, 169_801_408, 0.008245589),
    "RESNET50_ImageNet_profall.net_sc": (166, (3, 226, 226), 14_971_596, 14_819_368, 22_734_016, 0.003119502),
    "COSMOFLOW.net": (25, (4, 512, 512, 512), 3_528_104_656, 2_991_233_748, 2_128_064, 2.108143184),
    "COSMOFLOW.net_256": (25, (4, 256, 256, 256), 464_228_736, 397_119_876, 2_128_064, 0.263517898),
}

needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason=MISSING_REASON)



@pytest.fixture(scope="module")
def graphs() -> dict[str, LayerGraph]:
    return {name: load_net(MODELS / name) for name in TABLE if (MODELS / name).is_file()}


def _graph(graphs: dict[str, LayerGraph], name: str) -> LayerGraph:
    if name not in graphs:
        pytest.skip(f"{MODELS / name} is absent")
    return graphs[name]


def _sums_from_arrays(g: LayerGraph) -> tuple[int, int]:
    """Σ|x|, Σ|y| straight from the arrays: every layer but ReLU (by its
    ParaDL NAME), batch norm and the inserted flattens."""
    a = g.unpadded()
    kind = np.asarray(a.kind).astype(int)
    keep = np.array(
        [("RELU" not in n) for n in g.names]
    ) & ~np.isin(kind, [LayerKind.BATCH_NORM, LayerKind.FLATTEN])
    return int(np.sum(a.in_elements[keep])), int(np.sum(a.out_elements[keep]))


@needs_models
@pytest.mark.parametrize("name", sorted(TABLE))
def test_totals_match_paradl_table(graphs, name):
    layers, shape, sx, sy, sw, t = TABLE[name]
    g = _graph(graphs, name)
    kinds = np.asarray(g.unpadded().kind).astype(int)
    assert g.input_shape == shape
    assert int(np.sum(kinds != LayerKind.FLATTEN)) == layers
    assert paradl_totals(g) == {"x": sx, "y": sy, "w": sw}
    assert _sums_from_arrays(g) == (sx, sy)
    assert g.total("params") == sw
    if t is None:
        assert g.measured_time_per_sample_s is None
    else:
        assert g.measured_time_per_sample_s == t


@needs_models
def test_layer_mapping(graphs):
    alex = _graph(graphs, "ALEXNET_ImageNet.net")
    assert alex.names[:6] == ("CONV1", "RELU", "MPOOL", "CONV2", "RELU_1", "MPOOL_1")
    assert alex.names[13:15] == ("FC6/flatten", "FC6")
    a = alex.unpadded()
    conv1 = alex.names.index("CONV1")
    assert a.stride[conv1].tolist() == [4, 4, 1] and a.params[conv1] == 3 * 96 * 11 * 11  # no bias
    fc6 = alex.names.index("FC6")
    assert alex.kind_names[fc6] == "dense" and a.in_channels[fc6] == 256 * 6 * 6
    resnet = _graph(graphs, "RESNET50_ImageNet_profall.net_sc")
    r = resnet.unpadded()
    kinds = dict(zip(resnet.names, resnet.kind_names, strict=True))
    assert kinds["BNORM"] == "batch_norm" and kinds["ADD"] == "elementwise"
    assert resnet.total("buffers") > 0 and r.params[resnet.names.index("BNORM")] == 0  # affine=False
    assert resnet.num_edges == resnet.num_layers - 1  # a chain
    vgg = _graph(graphs, "VGG_ImageNet_profall.net_sc")
    v = vgg.unpadded()
    pool = vgg.names.index("MPOOL_1")  # 113 -> 57: stride 2, one padding row
    assert v.stride[pool].tolist() == [2, 2, 1] and v.pad_hi[pool].tolist() == [1, 1, 0]
    assert v.out_spatial[pool].tolist() == [57, 57, 1]


@needs_models
def test_cosmoflow_256_typo_is_tolerated(graphs):
    g = _graph(graphs, "COSMOFLOW.net_256")
    a = g.unpadded()
    i = g.names.index("RELU_1")  # "RELU|32x2128x128x128" in the file
    assert a.in_channels[i] == 32 and a.in_spatial[i].tolist() == [128, 128, 128]


@needs_models
@pytest.mark.parametrize("name", ["ALEXNET_ImageNet_profall.net_sc", "COSMOFLOW.net"])
def test_json_round_trip_is_exact(graphs, name):
    g = _graph(graphs, name)
    back = LayerGraph.from_json(g.to_json())
    assert back.to_json() == g.to_json()
    assert back.names == g.names and back.measured_time_per_sample_s == g.measured_time_per_sample_s
    for f in g.arrays._fields:
        np.testing.assert_array_equal(np.asarray(getattr(back.arrays, f)), np.asarray(getattr(g.arrays, f)))


def test_parse_tiny_string():
    g = parse_net(TINY_NET)
    assert g.model_name == "tiny" and g.input_shape == (3, 8, 8)
    assert g.names == ("CONV1", "RELU", "MPOOL", "FC/flatten", "FC")
    assert g.total("params") == 3 * 4 * 9 + 64 * 10
    assert g.measured_time_per_sample_s == 0.5
    assert paradl_totals(g) == {"x": 192 + 256 + 64, "y": 256 + 64 + 10, "w": 748}


def test_comments_whitespace_and_crlf():
    text = "# header\r\n" + TINY_NET.replace("\n", " \r\n").replace("4x8x8|0x0", " 4x8x8 | 0x0") + "# trailing|0\r\n"
    text = text.replace("RELU|4x8x8|4x4x0x0|4x8x8|0", "RELU|4x8x8|4x4x0x0|4x8x8 |0   # inline comment")
    assert parse_net(text).to_json() == parse_net(TINY_NET).to_json()


def test_no_time_and_names_made_unique():
    text = TINY_NET.replace("|0.5", "").replace("MPOOL|", "RELU|4x8x8|4x4x0x0|4x8x8\nMPOOL|")
    g = parse_net(text)
    assert g.measured_time_per_sample_s is None
    assert g.names[:3] == ("CONV1", "RELU", "RELU_1")


def test_layer_type_uses_paradl_order():
    assert [layer_type(n) for n in ("CONV_2a1", "MPOOL", "APOOL", "RELU_3", "FC6", "BNORM", "ADD", "DROPOUT")] == [
        "CONV", "MPOOL", "APOOL", "RELU", "FC", "BNORM", "ADD", "DROPOUT",
    ]
    assert layer_type("softmax") is None


def _replace_line(lineno: int, new: str) -> str:
    lines = TINY_NET.splitlines()
    lines[lineno - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (_replace_line(4, "CONV1|3x8x8|3x4x3x3"), 4, "fields"),
        (_replace_line(4, "CONV1|3x8x8|3x4x3x3|4x8x8|0|1"), 4, "fields"),
        (_replace_line(4, "CONV1|3xAx8|3x4x3x3|4x8x8"), 4, "x dims"),
        (_replace_line(4, "CONV1|3x8x8|3x4x3x3|4x8x-8"), 4, "y dims"),
        (_replace_line(4, "SOFTMAX|3x8x8|3x4x3x3|4x8x8"), 4, "layer type"),
        (_replace_line(4, "CONV1|3x9x9|3x4x3x3|4x9x9"), 4, "previous layer"),
        (_replace_line(4, "CONV1|3x8x8|5x4x3x3|4x8x8"), 4, "w dims"),
        (_replace_line(4, "CONV1|3x8x8|3x4x3x3|4x9x9"), 4, "padding"),
        (_replace_line(4, "CONV1|3x8x8|3x4x3x3|4x8x8|soon"), 4, "time"),
        (_replace_line(5, "RELU|4x8x8|4x4x0x0|4x7x8|0"), 5, "y dims"),
        (_replace_line(5, "RELU|4x8x8|4x4x1x1|4x8x8|0"), 5, "no weights"),
        (_replace_line(6, "MPOOL|4x8x8|0x0x2x2|5x4x4|0"), 6, "channels"),
        (_replace_line(6, "MPOOL|4x8x8|0x0x0x0|4x4x4|0"), 6, "window"),
        (_replace_line(7, "FC|4x4x4|4x10x1x1|10x1x1|0"), 7, "cover"),
        (_replace_line(2, "Input|100x3"), 2, "Input"),
        (_replace_line(2, "Input|lots"), 2, "Input"),
        (_replace_line(1, "Dataset"), 1, "Dataset|VALUE"),
        (TINY_NET.replace("Model|tiny\n", ""), 3, "Model|"),
        (TINY_NET + "Model|again\n", 8, "header"),
    ],
)
def test_malformed_input_names_file_and_line(text, line, words):
    with pytest.raises(ValueError) as e:
        parse_net(text, source="bad.net")
    msg = str(e.value)
    assert msg.startswith(f"bad.net:{line}:"), msg
    assert words in msg and "expected" in msg, msg


@pytest.mark.parametrize("text", ["", "# only a comment\n", "Dataset|x\nInput|1x3x8x8\nModel|m\n"])
def test_no_layers(text):
    with pytest.raises(ValueError, match=r"^bad\.net: no layers; expected"):
        parse_net(text, source="bad.net")


def test_load_net_names_the_file(tmp_path):
    p = tmp_path / "broken.net"
    p.write_text(_replace_line(5, "RELU|4x8x8"))
    with pytest.raises(ValueError, match=rf"^{p}:5: "):
        load_net(p)
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="not a text file"):
        load_net(p)
    with pytest.raises(ValueError, match="missing.net: No such file or directory; expected a ParaDL .net"):
        load_net(tmp_path / "missing.net")
    with pytest.raises(ValueError, match="is a folder; expected a ParaDL .net"):
        load_net(tmp_path)


def test_3d_and_fc_without_flatten():
    text = """Dataset|d
Input|1x2x4x4x4
Model|m3
CONV_1|2x4x4x4|2x8x2x2x2|8x2x2x2|0
APOOL|8x2x2x2|0x0x2x2x2|8x1x1x1|0
FC_1|8x1x1x1|8x3x1x1x1|3x1x1x1|0
"""
    g = parse_net(text)
    assert g.kind_names == ("conv3d", "pool", "dense")
    a = g.unpadded()
    assert a.stride[0].tolist() == [2, 2, 2] and a.pad_lo[0].tolist() == [0, 0, 0]
    assert math.isclose(g.total("params"), 2 * 8 * 8 + 8 * 3)


def test_spatial_dims_are_reversed_to_graph_order():
    # x = C x W x H: W = 8, H = 6 -> graph (C, H, W) = (3, 6, 8)
    text = "Dataset|d\nInput|1x3x8x6\nModel|m\nCONV|3x8x6|3x4x3x1|4x6x6|0\n"
    g = parse_net(text)
    a = g.unpadded()
    assert g.input_shape == (3, 6, 8)
    assert a.kernel[0].tolist() == [1, 3, 1] and a.out_spatial[0].tolist() == [6, 6, 1]
