"""The Flax extractor (:mod:`planner.models.extraction`) against independent oracles:
hand-computed shapes and parameter counts, graphs built by hand with
``GraphBuilder``, XLA's ``cost_analysis()`` FLOPs of the forward pass, the
linen twin of each nnx model, and the zoo (``planner.models.zoo`` vs
``planner.models.flax_zoo``)."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from builders import TinyResNet
from flax import nnx

from costmodels import MEASURED_JAXLIB
from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerArrays
from planner.models.extraction import extract

B = 2


def spec(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct((B, *shape), dtype)


def abstract(ctor):
    return nnx.eval_shape(lambda: ctor(nnx.Rngs(0)))


def assert_same_graph(g, h, *, names=True):
    """Equal layer arrays (rtol 1e-12), edges and input shape; names too unless told."""
    if names:
        assert g.names == h.names
    assert g.num_layers == h.num_layers
    assert g.edges == h.edges
    assert g.input_shape == h.input_shape
    a, b = g.unpadded(), h.unpadded()
    for f in LayerArrays._fields:
        np.testing.assert_allclose(
            np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), rtol=1e-12, err_msg=f
        )


def layer(g, name, out_rank=None):
    """``(kind name, (C_in, *in_spatial), (C_out, *out_spatial), params)`` of a layer;
    the output keeps the input's spatial rank unless ``out_rank`` says otherwise
    (flatten and global pooling: 0)."""
    i = g.names.index(name)
    a = g.unpadded()
    r = int(a.spatial_rank[i])
    if out_rank is None:
        out_rank = 0 if g.kind_names[i] == "flatten" or name.endswith("global_avg_pool") else r
    ins = (int(a.in_channels[i]), *(int(v) for v in a.in_spatial[i][:r]))
    outs = (int(a.out_channels[i]), *(int(v) for v in a.out_spatial[i][:out_rank]))
    return g.kind_names[i], ins, outs, int(a.params[i])


def xla_forward_flops_per_sample(model, x):
    graphdef, state = nnx.split(model)

    def fwd(st, inp):
        return nnx.merge(graphdef, st)(inp)

    ca = jax.jit(fwd).lower(state, x).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return ca["flops"] / x.shape[0]


# -- tiny models: nnx and linen twins --------------------------------------------------


class TinyVGG(nnx.Module):
    """(16, 16, 3) -> conv8 relu conv8 relu pool conv16 relu pool flatten fc32 relu fc10."""

    def __init__(self, rngs):
        self.convs = nnx.List([
            nnx.Conv(3, 8, (3, 3), rngs=rngs),
            nnx.Conv(8, 8, (3, 3), rngs=rngs),
            nnx.Conv(8, 16, (3, 3), padding=((1, 1), (1, 1)), rngs=rngs),
        ])
        self.fc1 = nnx.Linear(16 * 4 * 4, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.convs[0](x))
        x = nnx.relu(self.convs[1](x))
        x = nnx.max_pool(x, (2, 2), strides=(2, 2))
        x = nnx.relu(self.convs[2](x))
        x = nnx.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.fc1(x))
        return self.fc2(x)


class LinenVGG(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (3, 3), padding=((1, 1), (1, 1)))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def hand_vgg(name="TinyVGG"):
    b = GraphBuilder(name, (3, 16, 16))
    x = b.conv("convs/0", b.input, 8, 3, padding="SAME")
    x = b.relu("relu", x)
    x = b.conv("convs/1", x, 8, 3, padding="SAME")
    x = b.relu("relu_1", x)
    x = b.max_pool("max_pool", x, 2, stride=2)
    x = b.conv("convs/2", x, 16, 3, padding=((1, 1), (1, 1)))
    x = b.relu("relu_2", x)
    x = b.max_pool("max_pool_1", x, 2, stride=2)
    x = b.flatten("flatten", x)
    x = b.dense("fc1", x, 32)
    x = b.relu("relu_3", x)
    b.dense("fc2", x, 10)
    return b.build()


class LinenBlock(nn.Module):
    cout: int
    stride: int

    @nn.compact
    def __call__(self, x, train: bool = True):
        def bn(h):
            return nn.BatchNorm(use_running_average=not train)(h)

        h = nn.relu(bn(nn.Conv(self.cout, (3, 3), strides=self.stride, use_bias=False)(x)))
        h = bn(nn.Conv(self.cout, (3, 3), use_bias=False)(h))
        s = x
        if self.stride != 1 or x.shape[-1] != self.cout:
            s = bn(nn.Conv(self.cout, (1, 1), strides=self.stride, use_bias=False)(x))
        return nn.relu(h + s)


class LinenResNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Conv(8, (3, 3), use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        x = LinenBlock(8, 1)(x, train)
        x = LinenBlock(16, 2)(x, train)
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def hand_resnet(name="TinyResNet"):
    b = GraphBuilder(name, (3, 16, 16))
    x = b.conv("stem", b.input, 8, 3, bias=False)
    x = b.batch_norm("bn", x)
    x = b.relu("relu", x)
    for i, (cout, stride) in enumerate(((8, 1), (16, 2))):
        s = f"blocks/{i}"
        cin = b.shape(x)[0]
        h = b.conv(f"{s}/conv1", x, cout, 3, stride=stride, bias=False)
        h = b.batch_norm(f"{s}/bn1", h)
        h = b.relu(f"{s}/relu", h)
        h = b.conv(f"{s}/conv2", h, cout, 3, bias=False)
        h = b.batch_norm(f"{s}/bn2", h)
        short = x
        if stride != 1 or cin != cout:
            short = b.conv(f"{s}/proj", x, cout, 1, stride=stride, bias=False)
            short = b.batch_norm(f"{s}/proj_bn", short)
        h = b.add(f"{s}/add", [h, short])
        x = b.relu(f"{s}/relu_1", h)
    x = b.global_avg_pool("global_avg_pool", x)
    b.dense("head", x, 10)
    return b.build()


class Tiny3D(nnx.Module):
    """(8, 8, 8, 2) -> conv3d 3^3/2 SAME, relu, conv3d 2^3 dilation 2 VALID, relu,
    avg pool 2^3, flatten, fc3."""

    def __init__(self, rngs):
        self.c1 = nnx.Conv(2, 4, (3, 3, 3), strides=2, padding="SAME", rngs=rngs)
        self.c2 = nnx.Conv(4, 8, (2, 2, 2), kernel_dilation=2, padding="VALID", rngs=rngs)
        self.fc = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.c1(x))
        x = jax.nn.relu(self.c2(x))
        x = nnx.avg_pool(x, (2, 2, 2), strides=(2, 2, 2))
        return self.fc(x.reshape(x.shape[0], -1))


class Linen3D(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3, 3), strides=2, padding="SAME")(x))
        x = nn.relu(nn.Conv(8, (2, 2, 2), kernel_dilation=2, padding="VALID")(x))
        x = nn.avg_pool(x, (2, 2, 2), strides=(2, 2, 2))
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


class Tiny1D(nnx.Module):
    """(32, 4) -> conv1d k5 stride 2 pad (2, 1), relu, max pool 2, flatten, fc5."""

    def __init__(self, rngs):
        self.conv = nnx.Conv(4, 8, (5,), strides=2, padding=((2, 1),), rngs=rngs)
        self.fc = nnx.Linear(8 * 8, 5, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(nnx.relu(self.conv(x)), (2,), strides=(2,))
        return self.fc(x.reshape(x.shape[0], -1))


class Linen1D(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.max_pool(nn.relu(nn.Conv(8, (5,), strides=2, padding=((2, 1),))(x)), (2,), strides=(2,))
        return nn.Dense(5)(x.reshape(x.shape[0], -1))


class Grouped(nnx.Module):
    """(8, 8, 8) -> grouped conv (4 groups, no bias) -> depthwise conv; concat
    both on channels; global mean; fc. (A biased output used twice would be
    counted twice by XLA, which duplicates the bias add into both fusions.)"""

    def __init__(self, rngs):
        self.g = nnx.Conv(8, 16, (3, 3), feature_group_count=4, use_bias=False, rngs=rngs)
        self.dw = nnx.Conv(16, 16, (3, 3), feature_group_count=16, rngs=rngs)
        self.fc = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x):
        a = self.g(x)
        b = self.dw(a)
        x = jnp.concatenate([a, b], axis=-1)
        return self.fc(jnp.mean(x, axis=(1, 2)))


class LinenGrouped(nn.Module):
    @nn.compact
    def __call__(self, x):
        a = nn.Conv(16, (3, 3), feature_group_count=4, use_bias=False)(x)
        b = nn.Conv(16, (3, 3), feature_group_count=16)(a)
        x = jnp.concatenate([a, b], axis=-1)
        return nn.Dense(4)(jnp.mean(x, axis=(1, 2)))


TWINS = {  # name -> (nnx ctor, linen module, per-sample input NHWC)
    "vgg": (TinyVGG, LinenVGG(), (16, 16, 3)),
    "resnet": (TinyResNet, LinenResNet(), (16, 16, 3)),
    "3d": (Tiny3D, Linen3D(), (8, 8, 8, 2)),
    "1d": (Tiny1D, Linen1D(), (32, 4)),
    "grouped": (Grouped, LinenGrouped(), (8, 8, 8)),
}


@pytest.fixture(scope="module")
def graphs():
    """nnx and linen extractions of every twin, once."""
    out = {}
    for key, (ctor, lmod, shape) in TWINS.items():
        out[key] = (extract(abstract(ctor), spec(*shape)), extract(lmod, spec(*shape)))
    return out


# -- hand-built graphs and hand-computed shapes -------------------------------------------


def test_vgg_equals_hand_built_graph(graphs):
    g = graphs["vgg"][0]
    assert_same_graph(g, hand_vgg())
    assert g.model_name == "TinyVGG"
    assert g.input_shape == (3, 16, 16)
    # hand-computed shapes and parameters
    assert layer(g, "convs/0") == ("conv2d", (3, 16, 16), (8, 16, 16), 3 * 3 * 3 * 8 + 8)
    assert layer(g, "convs/1") == ("conv2d", (8, 16, 16), (8, 16, 16), 9 * 8 * 8 + 8)
    assert layer(g, "max_pool") == ("pool", (8, 16, 16), (8, 8, 8), 0)
    assert layer(g, "convs/2") == ("conv2d", (8, 8, 8), (16, 8, 8), 9 * 8 * 16 + 16)
    assert layer(g, "max_pool_1") == ("pool", (16, 8, 8), (16, 4, 4), 0)
    assert layer(g, "flatten") == ("flatten", (16, 4, 4), (256,), 0)
    assert layer(g, "fc1") == ("dense", (256,), (32,), 256 * 32 + 32)
    assert layer(g, "fc2") == ("dense", (32,), (10,), 330)
    assert g.edges == tuple((i, i + 1) for i in range(g.num_layers - 1))
    a = g.unpadded()
    i = g.names.index("convs/0")
    assert tuple(a.pad_lo[i][:2]) == (1, 1) and tuple(a.pad_hi[i][:2]) == (1, 1)


def test_resnet_equals_hand_built_graph(graphs):
    g = graphs["resnet"][0]
    assert_same_graph(g, hand_resnet())
    assert layer(g, "blocks/1/conv1") == ("conv2d", (8, 16, 16), (16, 8, 8), 9 * 8 * 16)
    assert layer(g, "blocks/1/proj") == ("conv2d", (8, 16, 16), (16, 8, 8), 8 * 16)
    assert layer(g, "blocks/1/bn2") == ("batch_norm", (16, 8, 8), (16, 8, 8), 32)
    i = g.names.index("blocks/1/bn2")
    assert g.unpadded().buffers[i] == 32
    # SAME on a stride-2 3x3 conv of 16x16 pads (0, 1), as Flax does
    j = g.names.index("blocks/1/conv1")
    assert tuple(g.unpadded().pad_lo[j][:2]) == (0, 0) and tuple(g.unpadded().pad_hi[j][:2]) == (1, 1)
    # residual adds: two incoming edges each (bn2 and the shortcut)
    for blk, short in (("blocks/0", "relu"), ("blocks/1", "blocks/1/proj_bn")):
        add = g.names.index(f"{blk}/add")
        srcs = sorted(s for s, d in g.edges if d == add)
        assert srcs == sorted([g.names.index(f"{blk}/bn2"), g.names.index(short)])
    gp = g.names.index("global_avg_pool")
    assert g.kind_names[gp] == "pool" and g.unpadded().out_channels[gp] == 16


def test_3d_conv_shapes(graphs):
    g = graphs["3d"][0]
    b = GraphBuilder("Tiny3D", (2, 8, 8, 8))
    x = b.conv("c1", b.input, 4, 3, stride=2, padding="SAME")
    x = b.relu("relu", x)
    x = b.conv("c2", x, 8, 2, dilation=2, padding="VALID")
    x = b.relu("relu_1", x)
    x = b.avg_pool("avg_pool", x, 2, stride=2)
    x = b.flatten("flatten", x)
    b.dense("fc", x, 3)
    assert_same_graph(g, b.build())
    assert g.input_shape == (2, 8, 8, 8)
    assert layer(g, "c1") == ("conv3d", (2, 8, 8, 8), (4, 4, 4, 4), 27 * 2 * 4 + 4)
    assert layer(g, "c2") == ("conv3d", (4, 4, 4, 4), (8, 2, 2, 2), 8 * 4 * 8 + 8)
    assert tuple(g.unpadded().dilation[g.names.index("c2")]) == (2, 2, 2)
    assert layer(g, "avg_pool") == ("pool", (8, 2, 2, 2), (8, 1, 1, 1), 0)


def test_1d_conv_shapes(graphs):
    g = graphs["1d"][0]
    b = GraphBuilder("Tiny1D", (4, 32))
    x = b.conv("conv", b.input, 8, 5, stride=2, padding=((2, 1),))
    x = b.relu("relu", x)
    x = b.max_pool("max_pool", x, 2, stride=2)
    x = b.flatten("flatten", x)
    b.dense("fc", x, 5)
    assert_same_graph(g, b.build())
    # (32 + 2 + 1 - 5) // 2 + 1 = 16
    assert layer(g, "conv") == ("conv1d", (4, 32), (8, 16), 5 * 4 * 8 + 8)
    assert layer(g, "max_pool") == ("pool", (8, 16), (8, 8), 0)


def test_grouped_conv_and_concat(graphs):
    g = graphs["grouped"][0]
    b = GraphBuilder("Grouped", (8, 8, 8))
    a = b.conv("g", b.input, 16, 3, groups=4, bias=False)
    d = b.conv("dw", a, 16, 3, groups=16)
    x = b.concat("concat", [a, d])
    x = b.global_avg_pool("global_avg_pool", x)
    b.dense("fc", x, 4)
    assert_same_graph(g, b.build())
    assert layer(g, "g")[3] == 9 * (8 // 4) * 16
    assert layer(g, "dw")[3] == 9 * 1 * 16 + 16
    a_ = g.unpadded()
    assert a_.groups[g.names.index("g")] == 4 and a_.groups[g.names.index("dw")] == 16
    cat = g.names.index("concat")
    assert a_.out_channels[cat] == 32
    assert sorted(s for s, d in g.edges if d == cat) == [g.names.index("g"), g.names.index("dw")]


# -- nnx vs linen ---------------------------------------------------------------------------


LINEN_NAMES = {
    "vgg": ("Conv_0", "relu", "Conv_1", "relu_1", "max_pool", "Conv_2", "relu_2", "max_pool_1",
            "flatten", "Dense_0", "relu_3", "Dense_1"),
    "resnet": ("Conv_0", "BatchNorm_0", "relu",
               "LinenBlock_0/Conv_0", "LinenBlock_0/BatchNorm_0", "LinenBlock_0/relu",
               "LinenBlock_0/Conv_1", "LinenBlock_0/BatchNorm_1", "LinenBlock_0/add", "LinenBlock_0/relu_1",
               "LinenBlock_1/Conv_0", "LinenBlock_1/BatchNorm_0", "LinenBlock_1/relu",
               "LinenBlock_1/Conv_1", "LinenBlock_1/BatchNorm_1",
               "LinenBlock_1/Conv_2", "LinenBlock_1/BatchNorm_2", "LinenBlock_1/add", "LinenBlock_1/relu_1",
               "global_avg_pool", "Dense_0"),
}


@pytest.mark.parametrize("key", sorted(TWINS))
def test_nnx_and_linen_twins_give_identical_arrays(graphs, key):
    g_nnx, g_linen = graphs[key]
    assert_same_graph(g_nnx, g_linen, names=False)
    assert g_linen.model_name == type(TWINS[key][1]).__name__
    if key in LINEN_NAMES:
        assert g_linen.names == LINEN_NAMES[key]


def test_linen_bound_module_and_dropout_with_train_flag():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, *, deterministic: bool):
            x = nn.Dense(8)(x)
            x = nn.Dropout(0.5, deterministic=deterministic)(x)
            return nn.Dense(2)(nn.relu(x))

    g = extract(Net(), spec(4))  # called with deterministic=False: dropout folds away
    assert g.names == ("Dense_0", "relu", "Dense_1")
    assert g.kind_names == ("dense", "elementwise", "dense")
    variables = jax.eval_shape(
        lambda x: Net().init(jax.random.key(0), x, deterministic=True), spec(4)
    )
    assert_same_graph(extract(Net().bind(variables), spec(4)), g)


# -- FLOPs vs XLA --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["vgg", "resnet", "3d", "grouped"])
def test_forward_flops_match_xla(graphs, key):
    ctor, _, shape = TWINS[key]
    xla = xla_forward_flops_per_sample(abstract(ctor), spec(*shape))
    ours = graphs[key][0].total("flops_fwd")
    assert ours == pytest.approx(xla, rel=0.01)


# -- functional ops, naming, folding ---------------------------------------------------------------


class Acts(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 4, rngs=rngs)
        self.sub = Sub(rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        x = jnp.tanh(self.fc(x))
        x = jax.nn.gelu(x)
        x = jax.nn.leaky_relu(x) * 2.0  # the rescale folds into leaky_relu
        x = self.drop(x)  # folds (training mode: a select against constants)
        x = jax.nn.sigmoid(x).astype(jnp.float32) + 1.0  # inlined jit: named by its primitive
        x = jnp.maximum(x, 0.0)
        return self.sub(jax.nn.silu(x))


class Sub(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        return jax.nn.relu6(self.fc(x)) + jax.nn.relu(x)


def test_activation_names_folding_and_scopes():
    g = extract(abstract(Acts), spec(4))
    assert g.names == (
        "fc", "tanh", "gelu", "leaky_relu", "logistic", "relu", "silu", "sub/fc", "sub/relu6",
        "sub/relu", "sub/add",
    )
    assert set(g.kind_names[1:7]) == {"elementwise"}
    a = g.unpadded()
    assert a.flops_fwd[g.names.index("relu")] == 4  # 1 per element
    assert a.flops_fwd[g.names.index("gelu")] > 4  # several element-wise ops per element
    add = g.names.index("sub/add")
    assert sorted(s for s, d in g.edges if d == add) == [g.names.index("sub/relu6"), g.names.index("sub/relu")]


class _Mlp(nnx.Module):
    def __init__(self, act, rngs):
        self.up, self.down, self.act = nnx.Linear(16, 256, rngs=rngs), nnx.Linear(256, 16, rngs=rngs), act

    def __call__(self, x):
        return self.down(self.act(self.up(x)))


def _xla_temp_bytes_per_sample(model) -> float:
    """XLA:CPU's temporaries of the gradient step, per sample (batch 256 less batch 128)."""
    gdef, params = nnx.split(model)

    def loss(p, x):
        return jnp.sum(nnx.merge(gdef, p)(x) ** 2)

    def temp(b):
        lowered = jax.jit(jax.grad(loss)).lower(params, jax.ShapeDtypeStruct((b, 16), jnp.float32))
        return lowered.compile().memory_analysis().temp_size_in_bytes

    return (temp(256) - temp(128)) / 128


def test_an_activation_keeps_the_transcendental_values_its_derivative_reads():
    """Against XLA:CPU: what each activation function keeps beside ReLU
    (which keeps its input) is what the extraction counts: GELU(tanh) its
    tanh, SiLU its logistic, 256 floats each per sample; tanh alone no more
    than ReLU (its output, the tanh, is the next layer's input, which that
    layer keeps). GELU(erf) keeps its erf and exp(-x^2) on jaxlib 0.10 (the
    release the cpu rules were measured on, costmodels.MEASURED_JAXLIB) and
    one of them on 0.12: the count is its upper bound there."""
    acts = {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "gelu_erf": lambda x: jax.nn.gelu(x, approximate=False),
            "silu": jax.nn.silu, "tanh": jnp.tanh}
    kept = {"relu": 0, "gelu": 1, "gelu_erf": 2, "silu": 1, "tanh": 0}
    xla, saved = {}, {}
    for name, act in acts.items():
        model = _Mlp(act, nnx.Rngs(0))
        g = extract(model, spec(16))
        saved[name] = float(g.unpadded().saved_elements[1])  # the activation's row
        assert saved[name] == 256 * (1 + kept[name]), name
        xla[name] = _xla_temp_bytes_per_sample(model)
    for name in ("gelu", "silu", "tanh"):
        assert xla[name] - xla["relu"] == (saved[name] - saved["relu"]) * 4, name
    counted = (saved["gelu_erf"] - saved["relu"]) * 4
    measured_here = jaxlib.__version__.split(".")[:2] == MEASURED_JAXLIB.split(".")[:2]
    assert xla["gelu_erf"] - xla["relu"] == counted if measured_here else 0 < xla["gelu_erf"] - xla["relu"] <= counted


class Shared(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        return self.fc(nnx.relu(self.fc(x)))


def test_a_module_called_twice_gives_two_layers():
    g = extract(abstract(Shared), spec(4))
    assert g.names == ("fc", "relu", "fc_1")
    assert g.edges == ((0, 1), (1, 2))


class Transformed(nnx.Module):
    def __init__(self, rngs):
        self.c = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.d = nnx.Conv(4, 4, (3, 3), rngs=rngs)
        self.e = nnx.Conv(4, 4, (3, 3), rngs=rngs)

    def __call__(self, x):
        x = nnx.jit(lambda m, y: m(y))(self.c, x)
        x = nnx.remat(lambda m, y: jax.nn.relu(m(y)))(self.d, x)
        return jax.jit(lambda y: jax.nn.relu(y) * 2.0)(self.e(x))


def test_modules_inside_nnx_transforms_and_jitted_activations():
    for _ in range(2):  # the second time, jit caches hold the first trace
        g = extract(abstract(Transformed), spec(6, 6, 3))
        assert g.names == ("c", "d", "relu", "e", "<lambda>")
        assert g.edges == ((0, 1), (1, 2), (2, 3), (3, 4))


def test_model_that_is_one_leaf_module_and_concrete_weights():
    g = extract(nnx.Linear(6, 3, rngs=nnx.Rngs(0)), np.zeros((B, 6), np.float32))
    assert g.names == ("dense",)
    assert layer(g, "dense") == ("dense", (6,), (3,), 21)
    assert g.model_name == "Linear"
    assert extract(nnx.Linear(6, 3, rngs=nnx.Rngs(0)), np.zeros((B, 6), np.float32), name="lin").model_name == "lin"


# -- unsupported ops ------------------------------------------------------------------------------------


class WithEmbed(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(100, 8, rngs=rngs)
        self.fc = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, tokens):
        return self.fc(self.embed(tokens))


class Mixer(nnx.Module):
    def __call__(self, x):
        return x.transpose(0, 2, 1, 3)


class WithTranspose(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.mix = Mixer()
        self.fc = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc(self.mix(nnx.relu(self.conv(x))))


class Scale(nnx.Module):  # owns a parameter directly: not a modelled layer
    def __init__(self, c):
        self.gamma = nnx.Param(jnp.ones((c,)))

    def __call__(self, x):
        return x * self.gamma[...]


class WithScale(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.scale = Scale(4)
        self.fc = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc(self.scale(self.conv(x)).mean(axis=(1, 2)))


class WithCircularConv(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), padding="CIRCULAR", rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.conv(x))


class WithAttention(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(8, 8, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(2, 8, decode=False, normalize_qk=True, rngs=rngs)  # not mapped

    def __call__(self, x):
        h = self.fc(x)
        return self.attn(h, h, h)


@pytest.mark.parametrize(
    "ctor, x, needles",
    [
        (WithTranspose, spec(6, 6, 3), ["'transpose'", "'mix'"]),
        (WithScale, spec(6, 6, 3), ["Scale", "'scale'"]),
        (WithAttention, spec(5, 8), ["nnx.MultiHeadAttention", "'attn'"]),
        (WithCircularConv, spec(6, 6, 3), ["nnx.Conv", "circular", "'conv'"]),
    ],
)
def test_unsupported_raises_naming_op_and_path(ctor, x, needles):
    with pytest.raises(ValueError) as info:
        extract(abstract(ctor), x)
    msg = str(info.value)
    for n in [*needles, 'on_unsupported="replicate"']:
        assert n in msg


def test_an_embedding_of_token_ids_is_a_layer():
    g = extract(abstract(WithEmbed), spec(10, dtype=jnp.int32))  # (batch, 10) int32 token ids
    assert g.names == ("embed", "fc") and g.on_unsupported == "error"
    assert g.kind_names == ("embed", "dense")
    assert g.input_shape == (1, 10) and g.reads_token_ids  # one channel of ids per token
    assert layer(g, "embed") == ("embed", (1, 10), (8, 10), 800)  # nnx.Embed(100, 8): the table
    assert layer(g, "fc") == ("dense", (8, 10), (4, 10), 36)  # per position
    assert g.edges == ((0, 1),)


def test_replicate_fallback_transpose_and_direct_params():
    g = extract(abstract(WithTranspose), spec(6, 6, 3), on_unsupported="replicate")
    assert g.names == ("conv", "relu", "mix/transpose", "fc")
    assert g.kind_names[2] == "other" and g.unpadded().flops_fwd[2] == 0

    g = extract(abstract(WithScale), spec(6, 6, 3), on_unsupported="replicate")
    assert g.names == ("conv", "scale", "global_avg_pool", "fc")
    a = g.unpadded()
    i = g.names.index("scale")
    assert g.kind_names[i] == "other" and a.params[i] == 4
    assert a.flops_fwd[i] == 6 * 6 * 4  # one multiply per element
    assert a.flops_bwd_weight[i] == a.flops_fwd[i]


def test_replicate_conv_with_circular_padding():
    model = abstract(WithCircularConv)
    g = extract(model, spec(6, 6, 3), on_unsupported="replicate")
    assert g.names == ("conv", "relu")
    assert layer(g, "conv") == ("other", (3, 6, 6), (4, 6, 6), 27 * 4 + 4)
    # every tap is valid after the wrap-around padding: 2 * 27 per output element, + bias
    assert g.unpadded().flops_fwd[0] == 36 * 4 * (2 * 27 + 1)


def test_replicate_attention_is_one_layer_with_flops_close_to_xla():
    model = abstract(WithAttention)
    g = extract(model, spec(5, 8), on_unsupported="replicate")
    assert g.names == ("fc", "attn")
    a = g.unpadded()
    assert a.params[1] == 4 * (8 * 8 + 8) + 2 * 4  # q, k, v, out projections with biases; q and k norm scales
    xla = xla_forward_flops_per_sample(model, spec(5, 8))
    assert g.total("flops_fwd") == pytest.approx(xla, rel=0.1)


# -- API hygiene ---------------------------------------------------------------------------------------------


def test_patched_calls_are_restored_even_after_errors():
    originals = {c: c.__dict__["__call__"] for c in (nnx.Conv, nnx.Linear, Mixer, WithTranspose)}
    extract(abstract(TinyVGG), spec(16, 16, 3))
    with pytest.raises(ValueError):
        extract(abstract(WithTranspose), spec(6, 6, 3))
    for c, f in originals.items():
        assert c.__dict__["__call__"] is f


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((lambda x: x, spec(4)), {}, "flax.nnx.Module or a flax.linen.Module"),
        ((None, spec(4)), {"on_unsupported": "skip"}, "on_unsupported"),
        ((None, jax.ShapeDtypeStruct((4,), jnp.float32)), {}, "batch-first"),
    ],
)
def test_bad_arguments(args, kwargs, match):
    model = abstract(TinyVGG) if args[0] is None else args[0]
    with pytest.raises(ValueError, match=match):
        extract(model, args[1], **kwargs)


# -- the zoo: extract(flax twin) == hand-built graph ---------------------------------------------------------


ZOO = [
    "vgg16-cifar10", "vgg16", "resnet50", "alexnet", "cosmoflow-256",
    "vgg16-cifar10-splitbrain", "cosmoflow-512", pytest.param("resnet152", marks=pytest.mark.slow),
    "vit-tiny", "vit-b16", "gpt2-small", "decoder-tiny", "llama-tiny",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_extract_matches_zoo(name):
    flax_zoo = pytest.importorskip("planner.models.flax_zoo")
    zoo = pytest.importorskip("planner.models.zoo")
    model, x = flax_zoo.flax_model(name)
    g = extract(model, x, name=name)
    z = zoo.get_model(name)
    assert g.model_name == z.model_name
    assert_same_graph(g, z)


def test_extract_traces_once_and_compiles_nothing():
    """Extraction is one abstract trace of the model (what makes it fast): JAX
    reports no lowering and no compilation while it runs (its own monitoring
    events, not a clock)."""
    from jax import monitoring

    flax_zoo = pytest.importorskip("planner.models.flax_zoo")
    model, x = flax_zoo.flax_model("vgg16")
    events: list[str] = []

    def listen(name, _secs, **_):
        events.append(name)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        jax.jit(lambda v: v * 2.0)(jax.numpy.ones(3))  # the listener hears a compilation when there is one
        assert "/jax/core/compile/backend_compile_duration" in events
        events.clear()
        g = extract(model, x)
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert g.total("params") == 138_357_544
    assert events.count("/jax/core/compile/jaxpr_trace_duration") <= 1
    assert not [e for e in events if "backend_compile" in e or "mlir" in e], events
