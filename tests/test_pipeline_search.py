"""The pipelined configuration search (search.pipeline) against brute force
on small chains; the segment costs against the collectives' formulas;
Megatron-LM's layout; one compilation per bucket."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import costmodels as cm
import search
from planner import TransformerConfig
from planner.models.block_chain import block_chain

SMALL = TransformerConfig.gpt(64, 4, 4, tokens=32, vocab=256)


def test_megatron_layout_of_a_gpt_block():
    bc = block_chain(SMALL)
    names = bc.graph.names
    opts = dict(zip(names, cm.megatron_options(bc.graph, False)))
    S = cm.Strategy
    assert opts["blocks/0/attn/qkv"] == opts["blocks/0/mlp/fc1"] == opts["lm_head"] == S.FILTER
    assert opts["blocks/0/attn/attention"] == opts["blocks/0/mlp/gelu"] == S.FILTER
    assert opts["blocks/0/attn/out"] == opts["blocks/0/mlp/fc2"] == S.CHANNEL
    assert opts["blocks/0/norm1"] == opts["blocks/0/add"] == opts["norm"] == S.REPLICATED
    sp = dict(zip(names, cm.megatron_options(bc.graph, True)))
    assert sp["blocks/0/norm1"] == sp["blocks/0/add_1"] == sp["pos_embed"] == S.SPATIAL
    assert [int(x) for x in bc.segment[: len(names)]] == [0, 0] + [1] * 10 + [2, 2]
    assert bc.chain.vocab == 1024 and block_chain(SMALL, vocab_multiple=128).chain.vocab == 256  # Megatron's padding


def test_block_collectives_are_megatrons_all_reduces():
    """A block on t = 2 without sequence parallelism: two all-reduces of the
    ``s b h`` activation forward (after out and fc2) and two backward (before
    qkv and fc1), Shoeybi et al. 2019 §3; the cheaper of ring and tree."""
    bc = block_chain(SMALL)
    hw_file = cm.load_hardware("dgx-a100")
    hw = cm.hardware_arrays(hw_file, "float16")
    b, t = 4.0, 2.0
    seg = cm.segment_costs(bc.graph.arrays, hw, b, t, jnp.asarray(cm.megatron_options(bc.graph, False)),
                           jnp.asarray(bc.segment))
    nvs = hw_file.tiers[0]
    nbytes = 32 * 64 * b * 2.0
    ring = 2 * (t - 1) * (nvs.latency_s + nbytes / t / nvs.bandwidth_bytes_per_s)
    tree = 2 * nvs.latency_s + 2 * nbytes / nvs.bandwidth_bytes_per_s
    one = min(ring, tree)
    assert float(seg.forward_comm_s[cm.Segment.BLOCK]) == pytest.approx(2 * one, rel=1e-5)
    assert float(seg.backward_comm_s[cm.Segment.BLOCK]) == pytest.approx(2 * one, rel=1e-5)
    # the vocabulary-parallel embedding all-reduces its looked-up rows forward
    assert float(seg.forward_comm_s[cm.Segment.FIRST]) == pytest.approx(one, rel=1e-5)
    # parameters per device: the block's matrices split, its norms and the row-parallel biases whole
    h, f = 64, 256
    block = (3 * h * h + 3 * h) / t + (h * h) / t + h + (h * f + f) / t + (f * h) / t + h + 4 * h
    assert float(seg.params[cm.Segment.BLOCK]) == pytest.approx(block)


def _brute_force(bc, hw_file, devices, batch, limit):
    """Every configuration from plain loops, each costed on its own."""
    chain, hw = bc.chain, cm.hardware_arrays(hw_file, "float16")
    best = (np.inf, None)
    L, heads = chain.layers, chain.heads
    for t, S, b, v, r, sp in itertools.product(range(1, 9), range(1, L + 1), range(1, batch + 1), range(1, L + 1),
                                               (0, 1, 2), (False, True)):
        if L % S or heads % t or devices % (t * S) or t > hw_file.devices_per_node or (sp and t == 1):
            continue
        d = devices // (t * S)
        if batch % (d * b):
            continue
        m = batch // (d * b)
        if (L // S) % v or (v > 1 and (S == 1 or m % S)):
            continue
        seg = cm.segment_costs(bc.graph.arrays, hw, float(b), float(t),
                               jnp.asarray(cm.megatron_options(bc.graph, sp)), jnp.asarray(bc.segment),
                               dropout=True)
        sched = cm.Schedule.INTERLEAVED if v > 1 else cm.Schedule.ONE_F_ONE_B
        cfg = cm.ChainConfig(*(jnp.float32(x) for x in (t, S, d, b, m, v, int(sched), r, float(sp), 0.0)))
        cost = cm.chain_cost(chain.shape(), seg, cfg, hw, cm.state_bytes("float16", "adam"), 8)
        if float(cost.peak_bytes) <= limit and float(cost.step.step_s) < best[0]:
            best = (float(cost.step.step_s), (t, S, d, b, v, cm.RECOMPUTE_NAMES[r], sp))
    return best


@pytest.mark.slow
@pytest.mark.parametrize("limit_share", [1.0, 0.5])
def test_search_finds_the_brute_force_best(limit_share):
    bc = block_chain(SMALL)
    hw = cm.load_hardware("dgx-a100")
    everything = search.search_pipeline(bc.graph, bc.segment, bc.chain, hw, 8, 16, float("inf"))
    limit = limit_share * everything.best.peak_bytes + (1 - limit_share) * everything.smallest.peak_bytes
    found = search.search_pipeline(bc.graph, bc.segment, bc.chain, hw, 8, 16, limit)
    step, config = _brute_force(bc, hw, 8, 16, limit)
    p = found.best
    assert (p.tensor, p.stages, p.data, p.micro_batch, p.chunks, p.recompute, p.sequence_parallel) == config
    assert p.step_s == pytest.approx(step, rel=1e-5)
    assert p.peak_bytes <= limit


def test_space_narrows_and_nothing_fitting_says_so():
    bc = block_chain(SMALL)
    hw = cm.load_hardware("dgx-a100")
    space = search.PipelineSpace(tensor=(2,), stages=(2,), recompute=("full",), sequence_parallel=(False,))
    got = search.search_pipeline(bc.graph, bc.segment, bc.chain, hw, 8, 16, space=space)
    assert (got.best.tensor, got.best.stages, got.best.data, got.best.recompute) == (2, 2, 2, "full")
    none = search.search_pipeline(bc.graph, bc.segment, bc.chain, hw, 8, 16, 1.0, space)
    assert none.best is None and none.fitting == 0 and none.smallest.peak_bytes > 1.0
    with pytest.raises(ValueError, match="no pipelined configuration"):
        search.candidates(4, 4, 8, 3, 8, search.PipelineSpace(tensor=(8,)))


def test_search_compiles_once_per_bucket():
    from search.pipeline._search import _chain_costs, _grid_costs

    hw = cm.load_hardware("dgx-a100")
    space = search.PipelineSpace(tensor=(2,), recompute=("full",), sequence_parallel=(False,))
    first = block_chain(SMALL)
    search.search_pipeline(first.graph, first.segment, first.chain, hw, 8, 16, space=space)
    sizes = (_grid_costs._cache_size(), _chain_costs._cache_size())
    other = block_chain(TransformerConfig.gpt(96, 4, 4, tokens=32, vocab=512))  # other sizes, same buckets
    search.search_pipeline(other.graph, other.segment, other.chain, hw, 8, 16, space=space)
    assert (_grid_costs._cache_size(), _chain_costs._cache_size()) == sizes


def test_chain_memory_per_stage_by_hand():
    """GPT h 64, 4 blocks, 4 heads, 32 tokens, vocabulary 256, tied; t 1, S 2, d 4, b 2, m 2, 1F1B, no
    recomputation: 18 B per parameter; Korthikanti's s b h (34 + 5 a s / h) per block times the
    micro-batches in flight (2 on the first stage, 1 on the last), the embedding's mask on the
    first, the output layer's inputs and fp32 logits on the last."""
    bc = block_chain(SMALL, vocab_multiple=256)  # the vocabulary as it is (block_chain pads it to 1024)
    hw = cm.hardware_arrays(cm.load_hardware("dgx-a100"), "float16")
    seg = cm.segment_costs(bc.graph.arrays, hw, 2.0, 1.0, jnp.asarray(cm.megatron_options(bc.graph, False)),
                           jnp.asarray(bc.segment), dropout=True)
    cfg = cm.ChainConfig(*(jnp.float32(x) for x in (1, 2, 4, 2, 2, 1, int(cm.Schedule.ONE_F_ONE_B), 0, 0, 0)))
    cost = cm.chain_cost(bc.chain.shape(), seg, cfg, hw, cm.state_bytes("float16", "adam"), 8)
    h, s, b, V = 64, 32, 2, 256
    block = 12 * h * h + 13 * h
    first = 2 * block + V * h + s * h  # two blocks, the table, the positions
    last = 2 * block + 2 * h + V * h  # two blocks, the final norm, the table's copy
    np.testing.assert_allclose(np.asarray(cost.state_bytes)[:2], [18 * first, 18 * last])
    sbh = s * b * h
    layer = sbh * (34 + 5 * 4 * s / h)
    np.testing.assert_allclose(np.asarray(cost.activation_bytes)[:2],
                               [2 * (2 * layer + sbh), 1 * (2 * layer + 4 * sbh + 4 * s * b * V)])
    assert not np.asarray(cost.state_bytes)[2:].any() and bool(cost.feasible)
