"""The pipelined step's cost model (costmodels.pipeline) against oracles: a
discrete-event simulation of GPipe and 1F1B, the papers' numbers computed by
hand, the collectives' alpha-beta formulas."""

import jax.numpy as jnp
import numpy as np
import pytest

import costmodels as cm
from costmodels import pipeline as pp


# -- a discrete-event simulation of the schedules (the oracle) --------------------------
def _orders(S, m, schedule):
    """Each stage's operations in order: GPipe all forwards then all backwards;
    1F1B ``S - i - 1`` warm-up forwards, then one forward one backward."""
    out = []
    for i in range(S):
        if schedule == "gpipe":
            ops = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
        else:
            warm = min(S - i - 1, m)
            ops = [("F", j) for j in range(warm)]
            for k in range(m - warm):
                ops += [("F", warm + k), ("B", k)]
            ops += [("B", k) for k in range(m - warm, m)]
        out.append(ops)
    return out


def simulate(tf, tb, m, schedule):
    """Makespan and, per stage, the most micro-batches forward but not yet backward."""
    S = len(tf)
    orders, done, free, pos = _orders(S, m, schedule), {}, [0.0] * S, [0] * S
    while any(pos[i] < len(orders[i]) for i in range(S)):
        for i in range(S):
            if pos[i] >= len(orders[i]):
                continue
            op, j = orders[i][pos[i]]
            if op == "F":
                dep = ("F", i - 1, j) if i > 0 else None
            else:
                dep = ("B", i + 1, j) if i < S - 1 else ("F", i, j)
            if dep is not None and dep not in done:
                continue
            start = max(free[i], done[dep] if dep else 0.0)
            done[(op, i, j)] = free[i] = start + (tf[i] if op == "F" else tb[i])
            pos[i] += 1
    peaks = []
    for ops in orders:
        held = peak = 0
        for op, _ in ops:
            held += 1 if op == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return max(done.values()), peaks


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S, m", [(4, 8), (4, 2), (3, 5), (1, 4)])
def test_slots_and_in_flight_match_a_simulation(schedule, S, m):
    makespan, peaks = simulate([1.0] * S, [2.0] * S, m, schedule)
    code = pp.parse_schedule(schedule)
    assert float(pp.step_slots(code, S, m)) * 3.0 == pytest.approx(makespan)
    held = [float(pp.in_flight_microbatches(code, S, m, 1, i)) for i in range(S)]
    assert held == peaks


def test_bubble_and_interleaving_by_hand():
    # Narayanan et al. 2021 §2.2: bubble (S - 1) / (v m); interleaved m + (S - 1) / v slots
    assert float(pp.bubble_fraction(pp.Schedule.ONE_F_ONE_B, 8, 32)) == pytest.approx(7 / 32)
    assert float(pp.bubble_fraction(pp.Schedule.INTERLEAVED, 8, 32, 4)) == pytest.approx(7 / 128)
    assert float(pp.step_slots(pp.Schedule.INTERLEAVED, 8, 32, 4)) == pytest.approx(32 + 7 / 4)
    assert float(pp.step_slots(pp.Schedule.GPIPE, 8, 32, 4)) == pytest.approx(39)  # v only interleaves
    # the first stage holds S + (S - 1) / v micro-batches' worth: Korthikanti et al. 2022 §4.2.3's factor
    # 1 + (S - 1) / (S v) over 1F1B's S; S = 4, v = 2: (2 * 3 + 1 * 4 + 1) / 2 = 5.5
    assert float(pp.in_flight_microbatches(pp.Schedule.INTERLEAVED, 4, 8, 2, 0)) == pytest.approx(4 * (1 + 3 / 8))
    assert float(pp.in_flight_microbatches(pp.Schedule.INTERLEAVED, 4, 8, 2, 3)) == pytest.approx(2.5)
    assert float(pp.in_flight_microbatches(pp.Schedule.INTERLEAVED, 4, 8, 1, 0)) == 4  # v = 1 is 1F1B
    assert float(pp.in_flight_microbatches(pp.Schedule.GPIPE, 4, 8, 1, 2)) == 8


def test_bad_names_say_what_is_allowed():
    with pytest.raises(ValueError, match="gpipe, 1f1b, interleaved"):
        pp.parse_schedule("pipedream")
    with pytest.raises(ValueError, match="none, selective, full"):
        pp.parse_recompute("partial")
    assert pp.parse_recompute(None) is pp.Recompute.NONE


# -- Korthikanti et al. 2022's activation bytes, by hand ---------------------------------
S_, H, A = 2048, 12288, 96  # GPT-3 175B: s, h, a
SBH = S_ * H  # b = 1


@pytest.mark.parametrize("t, sp, recompute, expected", [
    (1, 0, "none", SBH * (34 + 5 * A * S_ / H)),  # Eq. 1: 34 + 80
    (8, 0, "none", SBH * (10 + 24 / 8 + 5 * A * S_ / (H * 8))),  # Eq. 2
    (8, 1, "none", SBH / 8 * (34 + 5 * A * S_ / H)),  # Eq. 3
    (8, 0, "selective", SBH * (10 + 24 / 8)),  # Table 2
    (8, 1, "selective", SBH / 8 * 34),
    (8, 0, "full", 2 * SBH),
    (8, 1, "full", 2 * SBH / 8),
])
def test_layer_activations_are_korthikantis(t, sp, recompute, expected):
    got = pp.layer_activation_bytes(S_, 1, H, A, 4 * H, t, sp, pp.parse_recompute(recompute))
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_activations_without_dropout_keep_no_masks():
    # without dropout: 16 elements of 2 bytes per token and width, 2 per score (no mask, no dropped copy)
    got = pp.layer_activation_bytes(S_, 1, H, A, 4 * H, 1, 0, pp.Recompute.NONE, dropout=False)
    assert float(got) == pytest.approx(SBH * 32 + 2 * A * S_ * S_, rel=1e-6)


def test_embedding_and_output_activations_by_hand():
    # Korthikanti §4.3: embedding dropout mask sbh / t (sp); final norm and output inputs 4 sbh / t (sp), logits 4sbv / t
    assert float(pp.first_stage_activation_bytes(S_, 2, H, 8, 1)) == pytest.approx(2 * SBH / 8)
    assert float(pp.first_stage_activation_bytes(S_, 2, H, 8, 0)) == pytest.approx(2 * SBH)
    got = pp.last_stage_activation_bytes(S_, 1, H, 51200, 8, 1)
    assert float(got) == pytest.approx(4 * SBH / 8 + 4 * S_ * 51200 / 8, rel=1e-6)


# -- memory per stage --------------------------------------------------------------------
def test_state_is_eighteen_bytes_and_zero_one_shards_twelve():
    st = pp.state_bytes("float16", "adam")
    assert (st.weight, st.gradient, st.master, st.optimizer, st.total) == (2.0, 4.0, 4.0, 8.0, 18.0)
    assert pp.state_bytes("float32", "adam").total == 16.0
    params = jnp.asarray([1e9, 5e8])
    state, act = pp.stage_memory_bytes(params, jnp.asarray([1e8, 1e8]), jnp.asarray([4.0, 1.0]),
                                       jnp.asarray([1e7, 2e7]), 4, st, False)
    np.testing.assert_allclose(state, [18e9, 9e9])
    np.testing.assert_allclose(act, [4 * 1.1e8, 1.2e8])
    state, _ = pp.stage_memory_bytes(params, 0.0, 1.0, 0.0, 4, st, True)
    np.testing.assert_allclose(state, [(6 + 12 / 4) * 1e9, (6 + 12 / 4) * 5e8])  # Megatron: 6 + 12 / d


# -- the step ----------------------------------------------------------------------------
def _hardware():
    return cm.hardware_arrays(cm.load_hardware("dgx-a100"), "float16")


def _stages(slot_f, slot_b, n, **kw):
    z = jnp.zeros(n)
    fields = dict(forward_s=jnp.asarray(slot_f), backward_s=jnp.asarray(slot_b), send_bytes=z, gather_bytes=z,
                  gradient_bytes=z, weight_bytes=z, tied_bytes=z, optimizer_bytes=z, mask=jnp.ones(n))
    fields.update({k: jnp.asarray(v) for k, v in kw.items()})
    return pp.StageCosts(**fields)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_step_of_equal_stages_is_the_simulated_makespan(schedule):
    costs = _stages([1.0] * 4, [2.0] * 4, 4)
    step = pp.pipeline_step_s(costs, _hardware(), 4, 8, 1, 1, pp.parse_schedule(schedule))
    assert float(step.step_s) == pytest.approx(simulate([1.0] * 4, [2.0] * 4, 8, schedule)[0])
    assert float(step.bubble_s) == pytest.approx(3 * 3.0)


def test_unequal_stages_gpipe_exact_1f1b_bounded():
    tf, tb = [1.0, 1.5, 1.0, 1.2], [2.0, 3.0, 2.0, 2.4]
    costs = _stages(tf, tb, 4)
    hw = _hardware()
    gpipe = pp.pipeline_step_s(costs, hw, 4, 8, 1, 1, pp.Schedule.GPIPE)
    assert float(gpipe.step_s) == pytest.approx(simulate(tf, tb, 8, "gpipe")[0])
    one_f = pp.pipeline_step_s(costs, hw, 4, 8, 1, 1, pp.Schedule.ONE_F_ONE_B)
    assert simulate(tf, tb, 8, "1f1b")[0] <= float(one_f.step_s) <= 1.1 * simulate(tf, tb, 8, "1f1b")[0]


def test_interleaving_shrinks_the_fill_by_v():
    costs = _stages([1.0] * 4, [2.0] * 4, 4)
    step = pp.pipeline_step_s(costs, _hardware(), 4, 8, 1, 1, pp.Schedule.INTERLEAVED, v=3)
    assert float(step.pipeline_s) == pytest.approx((8 + 3 / 3) * 3.0)


def test_transfers_data_sync_and_optimizer_by_hand():
    hw_file = cm.load_hardware("dgx-a100")
    hw = _hardware()
    nvs, ib = hw_file.tiers
    # 4 stages of d = 2, t = 8: every boundary crosses nodes (16 devices per stage)
    act = 2048 * 4096 * 2.0
    costs = _stages([1.0] * 4, [2.0] * 4, 4, send_bytes=[act / 8] * 4, gather_bytes=[act] * 4,
                    gradient_bytes=[4e9] * 4, weight_bytes=[2e9] * 4, optimizer_bytes=[5e10] * 4)
    step = pp.pipeline_step_s(costs, hw, 4, 8, 2, 8, pp.Schedule.ONE_F_ONE_B)
    one = ib.latency_s + act / 8 / ib.bandwidth_bytes_per_s + 7 * (nvs.latency_s + act / 8 / nvs.bandwidth_bytes_per_s)
    assert float(step.transfer_s) == pytest.approx(2 * one, rel=1e-5)  # a middle stage: on and back
    # 2 replicas, one per node: the all-reduce across nodes, ring or tree (the cheaper), ParaDL §3.1
    ring = 2 * (ib.latency_s + 4e9 / 2 / ib.bandwidth_bytes_per_s)
    tree = 2 * ib.latency_s + 2 * 4e9 / ib.bandwidth_bytes_per_s
    assert float(step.gradient_sync_s) == pytest.approx(min(ring, tree), rel=1e-5)
    eff = hw_file.device.efficiency["memory"]
    assert float(step.optimizer_s) == pytest.approx(5e10 / (hw_file.device.memory_bandwidth_bytes_per_s * eff))


def test_boundaries_cross_nodes_where_stages_straddle_them():
    # 8 devices a node, stages of 4 devices: boundaries 0->1 inside, 1->2 across, 2->3 inside
    got = [bool(pp.boundary_crosses_nodes(i, 4, 8)) for i in range(3)]
    assert got == [False, True, False]
    assert bool(pp.boundary_crosses_nodes(0, 8, 8))
