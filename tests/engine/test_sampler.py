from __future__ import annotations

import pytest

from subquad.engine.distributed import GlobalBatchSampler


@pytest.mark.parametrize("n", [37, 40])
def test_ranks_see_the_single_process_global_batches(n):
    single = list(GlobalBatchSampler(n, 8, shuffle=True, seed=3))
    ranks = [list(GlobalBatchSampler(n, 4, r, 2, shuffle=True, seed=3)) for r in range(2)]
    assert len(single) == (n // 8) * 8 == sum(len(r) for r in ranks)
    for j in range(n // 8):
        glob = single[j * 8:(j + 1) * 8]
        assert ranks[0][j * 4:(j + 1) * 4] + ranks[1][j * 4:(j + 1) * 4] == glob


def test_epochs_reshuffle_deterministically():
    s = GlobalBatchSampler(50, 5, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(50))
    s.set_epoch(0)
    assert list(s) == e0


def test_eval_split_covers_everything_once():
    parts = [list(GlobalBatchSampler(23, 4, r, 3, shuffle=False, drop_last=False)) for r in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(23))
    assert [len(p) for p in parts] == [len(GlobalBatchSampler(23, 4, r, 3, shuffle=False, drop_last=False))
                                       for r in range(3)]
