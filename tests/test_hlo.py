"""Parsing collectives from compiled HLO: real programs compiled on the 8
fake CPU devices (XLA is the oracle for what is there), plus hand-written
lines for the formats CPU does not emit (async starts, transposed iota)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from planner.runtime.hlo import (
    expand_replica_groups,
    label_mesh_axes,
    parse_collectives,
)

MESH_SHAPE, AXES = (4, 2), ("data", "model")


@pytest.fixture(scope="module")
def mesh(devices):
    return jax.make_mesh(MESH_SHAPE, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def test_shard_map_collectives_kinds_bytes_axes(mesh):
    def f(x):  # x: (8, 16) f32 replicated, 512 B per device
        a = jax.lax.psum(x, "model")
        b = jax.lax.all_gather(x, "data", tiled=True)
        c = jax.lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True)
        d = jax.lax.all_to_all(x, "model", 0, 0, tiled=True)
        e = jax.lax.ppermute(x, "data", [(i, (i + 1) % 4) for i in range(4)])
        g = jax.lax.psum(x, ("data", "model"))
        return a.sum() + b.sum() + c.sum() + d.sum() + e.sum() + g.sum()

    sm = jax.shard_map(f, mesh=mesh, in_specs=P(None, None), out_specs=P(), check_vma=False)
    text = jax.jit(sm).lower(jnp.ones((8, 16))).compile().as_text()
    got = sorted((c.kind, c.axes, c.bytes_per_device) for c in parse_collectives(text, MESH_SHAPE, AXES))
    x = 8 * 16 * 4
    assert got == sorted([
        ("all-reduce", ("model",), x),
        ("all-gather", ("data",), 4 * x),
        ("reduce-scatter", ("data",), x // 4),
        ("all-to-all", ("model",), x),
        ("collective-permute", ("data",), x),
        ("all-reduce", ("data", "model"), x),
    ])


def test_gspmd_program_uses_iota_and_mesh_formats(mesh):
    ns = lambda *s: NamedSharding(mesh, P(*s))

    def loss(w1, w2, x):
        h = jax.nn.relu(jax.lax.with_sharding_constraint(x @ w1, ns("data", "model")))
        return (jax.lax.with_sharding_constraint(h @ w2, ns("data", None)) ** 2).mean()

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)),
                   in_shardings=(ns(None, "model"), ns("model", None), ns(("data", "model"), None)))
    text = step.lower(jnp.ones((64, 128)), jnp.ones((128, 32)), jnp.ones((64, 64))).compile().as_text()
    colls = parse_collectives(text, MESH_SHAPE, AXES)
    assert "<=[" in text and "mesh[" in text  # both compact formats really occur
    assert all(c.axes is not None for c in colls)
    by = {(c.kind, c.axes): c.bytes_per_device for c in colls}
    # x (64 rows over 8 devices, 8 x 64 f32) gathered over model for the column-parallel w1.
    assert by[("all-gather", ("model",))] == 16 * 64 * 4
    # Gradients of the model-sharded weights are summed over data (a combined tuple):
    # w1 shard 64 x 64, w2 shard 32 x 64 (transposed layout), plus the scalar loss.
    assert by[("all-reduce", ("data",))] == (64 * 64 + 32 * 64 + 1) * 4


@pytest.mark.parametrize(
    "line, groups",
    [
        ("replica_groups={{0,1},{2,3}}", ((0, 1), (2, 3))),
        ("replica_groups={}", ((0, 1, 2, 3),)),
        ("replica_groups=[2,2]<=[4]", ((0, 1), (2, 3))),
        ("replica_groups=[2,2]<=[2,2]T(1,0)", ((0, 2), (1, 3))),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}", ((0, 2), (1, 3))),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0','axis_1'}", ((0, 1, 2, 3),)),
        # a permuted mesh, as XLA prints it for a transposed device order (seen on 2x4)
        ("replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_0'}", ((0, 1), (2, 3))),
    ],
)
def test_replica_group_formats(line, groups):
    assert expand_replica_groups(line, 4) == groups


def test_labels():
    assert label_mesh_axes(((0, 2, 4, 6), (1, 3, 5, 7)), (4, 2), AXES) == ("data",)
    assert label_mesh_axes(((0, 1), (2, 3), (4, 5), (6, 7)), (4, 2), AXES) == ("model",)
    assert label_mesh_axes((tuple(range(8)),), (4, 2), AXES) == ("data", "model")
    assert label_mesh_axes(((0, 3), (1, 2), (4, 7), (5, 6)), (4, 2), AXES) is None


def test_async_and_tuple_forms():
    text = (
        "%ars = (f32[128]{0}, bf16[64,2]{1,0}) all-reduce-start(%a, %b), replica_groups={{0,1}}, to_apply=%add\n"
        "%ard = (f32[128]{0}, bf16[64,2]{1,0}) all-reduce-done(%ars)\n"
        "%ags = (f32[4,8]{1,0}, f32[8,8]{1,0}) all-gather-start(%c), replica_groups=[1,2]<=[2], dimensions={0}\n"
        "%agd = f32[8,8]{1,0} all-gather-done(%ags)\n"
        # XLA:GPU's form (compiled for an A100): the operands as a tuple, then the result
        "%rss = ((f32[32,4,4,256]{3,2,1,0}), f32[8,4,4,256]{3,2,1,0}) reduce-scatter-start(%e), "
        "replica_groups={{0,1}}, dimensions={0}, to_apply=%add\n"
        "%rsd = f32[8,4,4,256]{3,2,1,0} reduce-scatter-done(%rss)\n"
        # and its all-reduce on an H100 (jax 0.12.0.1)
        "%ar2 = ((f32[3251083]{0}), f32[3251083]{0}) all-reduce-start(%f), replica_groups={{0,1}}, to_apply=%add\n"
        "ROOT %cp = f32[2,1,32,16]{3,2,1,0} collective-permute(%d), source_target_pairs={{0,1},{1,0}}\n"
    )
    colls = parse_collectives(text, (1, 2), AXES)
    assert [(c.kind, c.bytes_per_device, c.asynchronous, c.axes) for c in colls] == [
        ("all-reduce", 128 * 4 + 64 * 2 * 2, True, ("model",)),
        ("all-gather", 8 * 8 * 4, True, ("model",)),
        ("reduce-scatter", 8 * 4 * 4 * 256 * 4, True, ("model",)),
        ("all-reduce", 3251083 * 4, True, ("model",)),
        ("collective-permute", 2 * 32 * 16 * 4, False, ("model",)),
    ]


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown HLO element type"):
        parse_collectives("%x = q7[4]{0} all-reduce(%a), replica_groups={{0}}")
    with pytest.raises(ValueError, match="unknown axes"):
        expand_replica_groups("replica_groups=mesh['axis_0'=2] {'axis_9'}", 2)
    with pytest.raises(ValueError, match="both"):
        parse_collectives("", (2,), None)


def test_permute_between_some_neighbours_of_an_axis():
    # A halo exchange on a 2x4 mesh that links only shards 0-1 and 2-3 of each model
    # group: its components are not whole groups, but every pair stays on "model".
    text = "%cp = f32[4]{0} collective-permute(%a), source_target_pairs={{0,1},{1,0},{2,3},{6,7}}"
    (c,) = parse_collectives(text, (2, 4), AXES)
    assert c.axes == ("model",)
    (c,) = parse_collectives(text.replace("{6,7}", "{3,7}"), (2, 4), AXES)
    assert c.axes == ("data", "model")
