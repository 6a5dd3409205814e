"""The ListOps input-blind baselines that `subquad arena check` prints, on a hand-computed case."""

from __future__ import annotations

from subquad.arena.lra import listops_baselines


def _tsv(path, rows):
    path.write_text("Source\tTarget\n" + "".join(f"{s}\t{y}\n" for s, y in rows))


def test_listops_baselines_hand_computed(tmp_path):
    mx, mn = "( [MAX 3 ( [MIN 1 9 ] ) ] )", "( [MIN ( [MAX 2 5 ] ) 7 ] )"
    _tsv(tmp_path / "train.tsv", [(mx, 9), (mx, 9), (mx, 3), (mn, 0), (mn, 2), (mn, 0)])
    # overall majority of train: 9 and 0 tie at 2 -> the first seen (9); per operator: MAX -> 9, MIN -> 0
    _tsv(tmp_path / "test.tsv", [(mx, 9), (mx, 4), (mn, 0), (mn, 9)])
    b = listops_baselines(tmp_path)
    assert b == {"majority": 50.0, "outer_operator": 50.0}
    _tsv(tmp_path / "test.tsv", [(mx, 9), (mn, 0), (mn, 0), (mn, 1)])
    assert listops_baselines(tmp_path) == {"majority": 25.0, "outer_operator": 75.0}
