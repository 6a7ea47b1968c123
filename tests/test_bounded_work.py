"""Work is bounded by the input's size, not its values: huge device counts and
huge spatial sizes answer at once (each would loop up to the value before)."""

from __future__ import annotations

import time

from reference_files import TINY_NET

from planner.models.netfile import parse_net
from planner.plan_inputs import _divisors, mesh_shapes


def test_divisors_by_hand():
    assert _divisors(1) == [1]
    assert _divisors(12) == [1, 2, 3, 4, 6, 12]
    assert _divisors(49) == [1, 7, 49]
    assert _divisors(2**40)[-3:] == [2**38, 2**39, 2**40] and len(_divisors(2**40)) == 41


def test_mesh_shapes_of_2_to_the_40_devices():
    """2**40 devices, 8 per node: model axes 1, 2, 4, 8 (a loop to P would never end)."""
    start = time.process_time()
    shapes = mesh_shapes(2**40, 2**41, 8)
    assert shapes == [(2**40, 1), (2**39, 2), (2**38, 4), (2**37, 8)]
    assert time.process_time() - start < 30  # a hang, not a timing claim: it takes milliseconds


def test_net_file_with_a_huge_image_parses():
    """A 3x1e9x8 input through the tiny .net's layers: the stride search is a
    bounded range, not a loop over the 1e9 rows."""
    big = (TINY_NET.replace("100x3x8x8", "100x3x1000000000x8")
           .replace("CONV1|3x8x8|3x4x3x3|4x8x8", "CONV1|3x1000000000x8|3x4x3x3|4x1000000000x8")
           .replace("RELU|4x8x8|4x4x0x0|4x8x8", "RELU|4x1000000000x8|4x4x0x0|4x1000000000x8")
           .replace("MPOOL|4x8x8|0x0x2x2|4x4x4", "MPOOL|4x1000000000x8|0x0x2x2|4x500000000x4")
           .replace("FC|4x4x4|4x10x4x4", "FC|4x500000000x4|4x10x500000000x4"))
    g = parse_net(big)
    pool = list(g.names).index(next(n for n in g.names if "POOL" in n.upper()))
    assert [int(x) for x in g.arrays.stride[pool][:2]] == [2, 2]


def test_valid_taps_equals_brute_force():
    """The closed-form count of non-padding (output, tap) pairs against
    enumerating every pair."""
    import itertools

    import numpy as np

    from planner.ir.flops import valid_taps

    for n_in, k, s, d, p in itertools.product([1, 2, 5, 8, 13], [1, 2, 3, 7], [1, 2, 3], [1, 2], [0, 1, 3]):
        for n_out in {1, 2, n_in, (n_in + 2 * p - d * (k - 1) - 1) // s + 1}:
            if n_out < 1:
                continue
            o, j = np.arange(n_out)[:, None], np.arange(k)[None, :]
            idx = o * s - p + j * d
            assert valid_taps(n_in, n_out, k, s, d, p) == int(np.count_nonzero((idx >= 0) & (idx < n_in)))
