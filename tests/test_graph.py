"""The layer IR: hand-computed shapes, counts and FLOPs; XLA's own FLOP count
for single layers; bucketing (one compilation per bucket); JSON round trip
and rejection of malformed files."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from planner import GraphBuilder, LayerGraph, LayerKind, bucket_size


def xla_flops(fn, *shapes):
    """FLOPs XLA reports for ``fn`` on float32 inputs of the given shapes."""
    compiled = jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).compile()
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    return ca["flops"]


# -- hand-computed ---------------------------------------------------------------


def test_conv_same_counts_by_hand():
    b = GraphBuilder("t", (3, 32, 32))
    i = b.conv("c", b.input, 64, 3)
    a = b.build().arrays
    assert a.params[i] == 3 * 3 * 3 * 64 + 64
    assert list(a.out_spatial[i]) == [32, 32, 1] and a.out_channels[i] == 64
    assert list(a.pad_lo[i]) == [1, 1, 0] and list(a.pad_hi[i]) == [1, 1, 0]
    # 3x3 SAME on 32: 3*32 - 2 = 94 taps per dim land inside the input.
    macs = 94 * 94 * 3 * 64
    assert a.flops_fwd[i] == 2 * macs + 64 * 32 * 32
    assert a.flops_bwd_data[i] == 0  # no gradient is taken w.r.t. the model input
    assert a.flops_bwd_weight[i] == 2 * macs + 64 * 32 * 32
    assert a.saved_elements[i] == 3 * 32 * 32


def test_conv_stride2_explicit_padding_by_hand():
    b = GraphBuilder("t", (3, 224, 224))
    i = b.conv("c", b.input, 64, 7, stride=2, padding=((3, 3), (3, 3)), bias=False)
    a = b.build().arrays
    assert list(a.out_spatial[i]) == [112, 112, 1]
    # o=0 keeps 4 taps, o=1 keeps 6, o=111 keeps 5, the 109 others keep 7.
    taps = 4 + 6 + 7 * 109 + 5
    assert a.flops_fwd[i] == 2 * taps * taps * 3 * 64
    assert a.params[i] == 7 * 7 * 3 * 64


def test_dense_pool_bn_add_by_hand():
    b = GraphBuilder("t", (8, 4, 4))
    p = b.max_pool("p", b.input, 2)
    n = b.batch_norm("bn", p)
    s = b.add("add", [p, n])
    f = b.flatten("f", s)
    d = b.dense("d", f, 10)
    g = b.build()
    a = g.arrays
    assert list(a.out_spatial[p]) == [2, 2, 1] and a.flops_fwd[p] == 3 * 8 * 2 * 2
    assert a.params[n] == 16 and a.buffers[n] == 16
    assert a.flops_fwd[s] == 8 * 2 * 2
    assert a.out_channels[f] == 32 and a.spatial_rank[d] == 0
    assert a.params[d] == 32 * 10 + 10 and a.flops_fwd[d] == 2 * 32 * 10 + 10
    assert g.edges == ((p, n), (p, s), (n, s), (s, f), (f, d))
    assert g.kind_names == ("pool", "batch_norm", "add", "flatten", "dense")


def test_builder_rejects_bad_layers():
    b = GraphBuilder("t", (3, 8, 8))
    x = b.conv("c", b.input, 4, 3)
    with pytest.raises(ValueError, match="duplicate layer name"):
        b.conv("c", x, 4, 3)
    with pytest.raises(ValueError, match="groups"):
        b.conv("g", x, 6, 3, groups=3)
    with pytest.raises(ValueError, match="does not fit"):
        b.conv("big", x, 4, 9, padding="VALID")
    with pytest.raises(ValueError, match="different shapes"):
        b.add("a", [x, b.input])
    with pytest.raises(ValueError, match="input_shape"):
        GraphBuilder("t", (3, 0, 8))
    with pytest.raises(ValueError, match="no layers"):
        GraphBuilder("t", (3,)).build()


def test_auto_name_counts_per_scope():
    b = GraphBuilder("t", (3,))
    assert [b.auto_name("", "relu") for _ in range(3)] == ["relu", "relu_1", "relu_2"]
    assert b.auto_name("layer1/0", "relu") == "layer1/0/relu"


# -- XLA's count is the oracle for single layers ----------------------------------------


@pytest.mark.parametrize(
    "in_hw, cin, cout, k, stride, padding, dilation, groups",
    [
        (32, 3, 16, 3, 1, "SAME", 1, 1),
        (17, 8, 8, 3, 2, ((1, 1), (1, 1)), 1, 1),
        (16, 4, 8, 5, 1, ((2, 1), (0, 3)), 2, 1),
        (12, 8, 16, 3, 1, "SAME", 1, 4),
        (9, 2, 4, 1, 2, "VALID", 1, 1),
    ],
)
def test_conv_forward_flops_equal_xla(in_hw, cin, cout, k, stride, padding, dilation, groups):
    b = GraphBuilder("t", (cin, in_hw, in_hw))
    i = b.conv("c", b.input, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups)
    g = b.build()
    pads = [(int(lo), int(hi)) for lo, hi in zip(g.arrays.pad_lo[i][:2], g.arrays.pad_hi[i][:2], strict=True)]

    def conv(x, w, bias):
        y = jax.lax.conv_general_dilated(
            x, w, (stride, stride), pads, rhs_dilation=(dilation, dilation),
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
        )
        return y + bias

    batch = 2
    got = xla_flops(conv, (batch, in_hw, in_hw, cin), (k, k, cin // groups, cout), (cout,))
    assert got == pytest.approx(batch * g.arrays.flops_fwd[i], rel=1e-9)


def test_dense_and_elementwise_flops_equal_xla():
    b = GraphBuilder("t", (256,))
    d = b.dense("d", b.input, 10)
    r = b.relu("r", d)
    g = b.build()
    got = xla_flops(lambda x, w, c: jax.nn.relu(x @ w + c), (4, 256), (256, 10), (10,))
    assert got == pytest.approx(4 * (g.arrays.flops_fwd[d] + g.arrays.flops_fwd[r]), rel=1e-9)


# -- bucketing ---------------------------------------------------------------------


def test_bucket_sizes():
    assert [bucket_size(n) for n in (0, 1, 8, 9, 16, 17, 100, 1000)] == [8, 8, 8, 16, 16, 32, 128, 1024]
    with pytest.raises(ValueError):
        bucket_size(-1)


def _chain(n_convs: int, width: int, name: str) -> LayerGraph:
    b = GraphBuilder(name, (3, 16, 16))
    x = b.input
    for i in range(n_convs):
        x = b.relu(f"r{i}", b.conv(f"c{i}", x, width, 3))
    return b.build()


def test_padding_rows_cost_nothing():
    g = _chain(5, 8, "m")  # 10 layers -> bucket 16
    a = g.arrays
    assert a.mask.shape == (16,)
    assert g.num_layers == 10 and a.mask.sum() == 10
    for f in ("params", "flops_fwd", "flops_bwd_data", "flops_bwd_weight", "saved_elements", "buffers"):
        assert np.all(getattr(a, f)[10:] == 0), f
    assert a.kind[10:].tolist() == [LayerKind.PAD] * 6
    assert g.num_edges == 9 and a.edge_mask.shape == (16,)


def test_models_in_one_bucket_compile_once():
    traces = []

    @jax.jit
    def cost(arrays, batch):
        traces.append(1)  # runs once per trace, i.e. per compilation
        return batch * jnp.sum(arrays.mask * arrays.flops_total)

    graphs = [_chain(n, w, f"m{n}-{w}") for n, w in ((5, 8), (6, 16), (7, 4), (8, 32))]
    assert {g.arrays.mask.shape for g in graphs} == {(16,)}
    for g in graphs:
        got = float(cost(g.arrays, 2.0))
        assert got == pytest.approx(2.0 * g.total("flops_fwd") + 2.0 * g.total("flops_bwd_data")
                                    + 2.0 * g.total("flops_bwd_weight"), rel=1e-6)
    assert len(traces) == 1
    cost(_chain(9, 8, "bigger").arrays, 2.0)  # 18 layers: next bucket
    assert len(traces) == 2


def test_graph_is_a_pytree_of_its_arrays():
    g = _chain(2, 8, "m")
    leaves, treedef = jax.tree.flatten(g)
    assert len(leaves) == len(g.arrays)
    back = jax.tree.unflatten(treedef, leaves)
    assert back.names == g.names and back.model_name == "m"


# -- JSON ---------------------------------------------------------------------------


def test_json_round_trip_exact():
    b = GraphBuilder("res", (8, 6, 6, 6))
    c = b.conv("c", b.input, 8, 3, stride=(1, 2, 1), bias=False)
    n = b.batch_norm("bn", c)
    r = b.relu("r", n)
    s = b.add("add", [c, r])
    p = b.global_avg_pool("gap", s)
    b.dense("fc", p, 3)
    g = b.build(measured_time_per_sample_s=0.25)
    text = g.to_json()
    data = json.loads(text)
    assert data["schema"] == "shardplan/layer-graph" and data["version"] == 1
    g2 = LayerGraph.from_json(text)
    assert g2.names == g.names and g2.edges == g.edges and g2.input_shape == g.input_shape
    assert g2.measured_time_per_sample_s == 0.25 and g2.model_name == "res"
    for f, x, y in zip(g.arrays._fields, g.arrays, g2.arrays, strict=True):
        np.testing.assert_array_equal(x, y, err_msg=f)
    assert g2.to_json() == text


def _valid_dict():
    return json.loads(_chain(1, 4, "m").to_json())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="other"), "not a layer graph"),
        (lambda d: d.update(version=2), "newer"),
        (lambda d: d.update(version="1"), "integer"),
        (lambda d: d.pop("layers"), 'missing "layers"'),
        (lambda d: d["layers"][0].pop("params"), 'missing "params"'),
        (lambda d: d["layers"][0].update(params=-1), "non-negative"),
        (lambda d: d["layers"][0].update(params=float("nan")), "finite"),
        (lambda d: d["layers"][0].update(kind=42), "not a known layer kind"),
        (lambda d: d["layers"][0].update(kernel=[3, 3]), "list of 3"),
        (lambda d: d.update(edges=[[1, 0]]), "earlier to a later"),
        (lambda d: d.update(input_shape=[3, 0]), "input_shape"),
        (lambda d: d.update(layers=[]), "non-empty"),
    ],
)
def test_json_rejects_malformed(mutate, message):
    d = _valid_dict()
    mutate(d)
    with pytest.raises(ValueError, match=message):
        LayerGraph.from_json(json.dumps(d))


def test_json_rejects_truncated_text():
    text = _chain(1, 4, "m").to_json()
    with pytest.raises(ValueError, match="malformed"):
        LayerGraph.from_json(text[: len(text) // 2])


def test_totals_are_exact_beyond_float32():
    # 4098 * 4099 + 4099 = 16,801,801 is odd and above 2**24: float32 cannot hold it.
    b = GraphBuilder("t", (4098,))
    b.dense("d", b.input, 4099, bias=True)
    assert float(np.float32(16_801_801)) != 16_801_801
    assert b.build().total("params") == 16_801_801


def test_every_test_sees_eight_cpu_devices(devices):
    assert len(devices) == 8 and {d.platform for d in devices} == {"cpu"}


def test_fingerprint_tracks_structure_not_names_of_the_model():
    a, b = _chain(3, 8, "one"), _chain(3, 8, "two")
    assert a.fingerprint == b.fingerprint and a.fingerprint.startswith("sha256:")
    assert _chain(3, 16, "one").fingerprint != a.fingerprint
    assert a.padded(layers=64).fingerprint == a.fingerprint
    assert LayerGraph.from_json(a.to_json()).fingerprint == a.fingerprint


def test_public_functions_stay_functions_after_their_modules_load():
    """Importing a submodule sets an attribute of the package: no public name
    may be a module's name (``planner.evaluate`` is the function, its module
    ``planner.evaluation``)."""
    import importlib
    import pkgutil

    import planner

    for info in pkgutil.iter_modules(planner.__path__):
        if info.name not in ("__main__",):
            importlib.import_module(f"planner.{info.name}")
    for name in planner.__all__:
        value = getattr(planner, name)  # every public name resolves
        assert not isinstance(value, type(planner)), f"planner.{name} is shadowed by a module of that name"
    assert callable(planner.evaluate) and callable(planner.plan) and callable(planner.oracle)
    assert set(planner._LAZY) <= set(planner.__all__)
