"""Pipeline stage cuts (search.exact.stage_cuts): the exact DP against brute
force over every cut set of random small chains, hand-computed cases, the
infeasibility message, and its speed on 128 layers in 64 stages."""

from __future__ import annotations

import time

import numpy as np
import pytest

from search import StageCutProblem, StageCutsInfeasibleError, score_stage_cuts, solve_stage_cuts
from search.exact import in_flight_microbatches, solve_stage_cuts_brute
from search.exact.stage_cuts import _segments


def chain(L: int, S: int, m: int, schedule: str, rng: np.random.Generator) -> StageCutProblem:
    """Random layers; whole bytes, so the oracle's sums and the DP's are exact."""
    return StageCutProblem(
        layer_time_s=rng.uniform(0.1, 2.0, L), layer_state_bytes=rng.integers(0, 100, L).astype(float),
        layer_activation_bytes=rng.integers(0, 30, L).astype(float), boundary_time_s=rng.uniform(0.0, 0.6, L - 1),
        num_stages=S, num_microbatches=m, schedule=schedule)


def solve_both(p: StageCutProblem):
    """(DP, brute force), each a StageCuts or the StageCutsInfeasibleError raised."""
    out = []
    for solve in (solve_stage_cuts, solve_stage_cuts_brute):
        try:
            out.append(solve(p))
        except StageCutsInfeasibleError as e:
            out.append(e)
    return out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_brute_force_on_small_chains(seed, schedule):
    """Random chains of 1..9 layers in 1..4 stages: without a limit, at the
    smallest limit any cut set fits, between it and the largest peak, and
    just below the smallest (infeasible, with the same smallest memory as
    brute force's). The DP's cut set fits and is as fast as brute force's."""
    rng = np.random.default_rng(seed)
    infeasible = feasible = 0
    for _ in range(12):
        L = int(rng.integers(1, 10))
        p = chain(L, int(rng.integers(1, min(L, 4) + 1)), int(rng.choice([1, 2, 3, 8])), schedule, rng)
        with pytest.raises(StageCutsInfeasibleError) as e:
            solve_stage_cuts_brute(p._replace(memory_limit_bytes=-1.0))
        smallest = e.value.min_memory_bytes
        largest = max(solve_stage_cuts_brute(p).stage_memory_bytes)
        for limit in (np.inf, smallest, float(rng.integers(int(smallest), int(largest) + 1)), smallest - 1):
            dp, brute = solve_both(p._replace(memory_limit_bytes=limit))
            assert type(dp) is type(brute), (limit, dp, brute)
            if isinstance(dp, StageCutsInfeasibleError):
                assert dp.min_memory_bytes == brute.min_memory_bytes == smallest
                infeasible += 1
                continue
            assert dp.step_time_s == pytest.approx(brute.step_time_s, rel=1e-12)
            assert max(dp.stage_memory_bytes) <= limit
            feasible += 1
    assert feasible >= 24 and infeasible >= 12


def test_four_equal_layers_in_two_stages():
    """4 layers of 1 s, 2 stages, 4 micro-batches: the cut after layer 2,
    stages of 2 s, step 3 * 2 + 4 = 10 s. A 0.5 s boundary joins stage 0:
    2.5 s and 2 s, step 3 * 2.5 + 4.5 = 12 s (cutting after layer 1 gives
    3 * 3 + 4.5 = 13.5 s, after layer 3 3 * 3.5 + 4.5 = 15 s)."""
    p = StageCutProblem(np.ones(4), np.zeros(4), np.zeros(4), np.zeros(3), 2, 4, "gpipe")
    r = solve_stage_cuts(p)
    assert (r.stage_starts, r.stage_time_s, r.step_time_s) == ((0, 2), (2.0, 2.0), 10.0)
    r = solve_stage_cuts(p._replace(boundary_time_s=np.full(3, 0.5)))
    assert (r.stage_starts, r.stage_time_s, r.step_time_s) == ((0, 2), (2.5, 2.0), 12.0)
    assert score_stage_cuts(p._replace(boundary_time_s=np.full(3, 0.5)), (0, 3)).step_time_s == 15.0


def test_equal_stages_give_the_bubble():
    """8 layers of 0.5 s in 4 stages, 6 micro-batches: 1 s stages, step
    (m + S - 1) * t = 9 s; one stage: m * 4 s = 24 s; one layer a stage:
    (6 + 7) * 0.5 = 6.5 s."""
    p = StageCutProblem(np.full(8, 0.5), np.zeros(8), np.zeros(8), np.zeros(7), 4, 6, "1f1b")
    r = solve_stage_cuts(p)
    assert r.stage_starts == (0, 2, 4, 6) and r.step_time_s == 9.0
    assert solve_stage_cuts(p._replace(num_stages=1)).step_time_s == 24.0
    assert solve_stage_cuts(p._replace(num_stages=8)).stage_starts == tuple(range(8))
    assert solve_stage_cuts(p._replace(num_stages=8)).step_time_s == 6.5


def test_in_flight_microbatches():
    """GPipe keeps all m; 1F1B keeps S - i at stage i, at most m."""
    assert in_flight_microbatches(4, 8, "gpipe").tolist() == [8, 8, 8, 8]
    assert in_flight_microbatches(4, 8, "1f1b").tolist() == [4, 3, 2, 1]
    assert in_flight_microbatches(4, 2, "1f1b").tolist() == [2, 2, 2, 1]


def test_memory_moves_the_cut_and_the_message_names_the_smallest_limit():
    """Layers [1, 1, 1, 3] s, 10 state and 5 activation bytes each, 2 stages,
    4 micro-batches, 1F1B (2 then 1 in flight). Cut after layer 1: 1 | 5 s,
    21 s, memory 20 | 45; after 2: 2 | 4 s, 18 s, 40 | 30; after 3: 3 | 3 s,
    15 s, 60 | 15. Limit 45 or 40: the cut after layer 2; 39: none fits,
    the smallest is 40. GPipe (4 in flight everywhere): 30 | 90, 60 | 60,
    90 | 30, the smallest 60."""
    p = StageCutProblem(np.array([1.0, 1, 1, 3]), np.full(4, 10.0), np.full(4, 5.0), np.zeros(3), 2, 4, "1f1b")
    r = solve_stage_cuts(p)
    assert (r.stage_starts, r.step_time_s, r.stage_memory_bytes) == ((0, 3), 15.0, (60.0, 15.0))
    for limit in (45, 40):
        r = solve_stage_cuts(p._replace(memory_limit_bytes=limit))
        assert (r.stage_starts, r.step_time_s, r.stage_memory_bytes) == ((0, 2), 18.0, (40.0, 30.0))
    with pytest.raises(StageCutsInfeasibleError, match=r"smallest peak stage memory of any cut is 40 bytes") as e:
        solve_stage_cuts(p._replace(memory_limit_bytes=39))
    assert e.value.min_memory_bytes == 40.0 and "raise the limit" in str(e.value)
    with pytest.raises(StageCutsInfeasibleError, match=r"is 60 bytes under gpipe") as e:
        solve_stage_cuts(p._replace(memory_limit_bytes=59, schedule="gpipe"))


@pytest.mark.parametrize("bad, message", [
    (dict(num_stages=5), "num_stages must be between 1 and the 4 layers"),
    (dict(schedule="interleaved"), "schedule must be one of"),
    (dict(boundary_time_s=np.zeros(4)), "boundary_time_s one fewer"),
    (dict(layer_time_s=np.array([1.0, -1, 1, 1])), "finite and non-negative"),
    (dict(num_microbatches=0), "num_microbatches must be at least 1"),
])
def test_bad_input_says_what_is_wrong(bad, message):
    p = StageCutProblem(np.ones(4), np.zeros(4), np.zeros(4), np.zeros(3), 2, 4, "gpipe")
    with pytest.raises(ValueError, match=message):
        solve_stage_cuts(p._replace(**bad))


def blocks(L: int, S: int, m: int) -> StageCutProblem:
    """An embedding, L - 2 identical blocks and a head, 1F1B."""
    time_s, state, act = np.full(L, 1.0), np.full(L, 4e8), np.full(L, 1e8)
    time_s[[0, -1]], state[[0, -1]] = (0.3, 0.7), (2e9, 2e9)
    return StageCutProblem(time_s, state, act, np.full(L - 1, 0.02), S, m, "1f1b")


def test_identical_blocks_have_few_candidate_stage_times():
    """Segments of identical layers sum to identical times, so 128 layers
    give at most 3 distinct times per length (with or without the first or
    last layer), not one per segment."""
    seg = _segments(blocks(128, 64, 128))
    assert np.unique(seg.time_s[np.isfinite(seg.time_s)]).size <= 3 * 128


@pytest.mark.parametrize("case", ["blocks", "random"])
def test_128_layers_in_64_stages_within_two_seconds(case):
    """128 layers in 64 stages under a tight limit (5% over the smallest),
    well within a couple of seconds; the cut set fits, and is no slower than
    balanced cuts where those fit."""
    p = blocks(128, 64, 128) if case == "blocks" else chain(128, 64, 16, "1f1b", np.random.default_rng(7))
    with pytest.raises(StageCutsInfeasibleError) as e:
        solve_stage_cuts(p._replace(memory_limit_bytes=0.0))
    p = p._replace(memory_limit_bytes=1.05 * e.value.min_memory_bytes)
    start = time.perf_counter()
    r = solve_stage_cuts(p)
    assert time.perf_counter() - start < 2.0
    assert max(r.stage_memory_bytes) <= p.memory_limit_bytes
    even = score_stage_cuts(p, range(0, 128, 2))
    if max(even.stage_memory_bytes) <= p.memory_limit_bytes:
        assert r.step_time_s <= even.step_time_s
