"""Video data: the synthetic generator writes real .mp4 clips and lists; the reader's sampling, views, CSV layout and
its 1 % rule for missing/undecodable clips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from subquad.data.video import (
    DIRECTIONS,
    VideoClipDataset,
    clip_indices,
    decode_frames,
    generate_moving_squares,
    multiview_logits,
    read_video_list,
    write_video,
)
from subquad.errors import UserError


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("vid")
    generate_moving_squares(root, n_train=8, n_val=4, n_test=4, frames=12, size=32, seed=3)
    return root


def test_generator_writes_real_videos_and_lists(clips):
    for split, n in (("train", 8), ("val", 4), ("test", 4)):
        samples, names = read_video_list(clips, split)
        assert len(samples) == n and names == list(DIRECTIONS)
        assert [lab for _, lab in samples] == [i % 4 for i in range(n)]
    lines = (clips / "train.txt").read_text().splitlines()
    assert lines[0] == "train/right/train_00000.mp4 0"
    f = decode_frames(str(clips / "train/right/train_00000.mp4"))
    assert f.shape == (12, 32, 32, 3) and f.dtype == np.uint8
    assert (clips / "train/right/train_00000.mp4").read_bytes()[4:8] == b"ftyp"  # an MP4 container


def test_label_is_in_the_motion_only(clips):
    """Frame to frame the square moves by the class's direction (modulo the frame: it wraps); its position in a single
    frame is uniform for every class (the generator draws the start uniformly over the whole frame)."""
    samples, _ = read_video_list(clips, "train")
    for path, label in samples:
        f = decode_frames(path).astype(float).mean(-1)
        a, b = f[0] - f[0].mean(), f[1] - f[1].mean()
        best = max(((dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)),
                   key=lambda d: (np.roll(a, d, axis=(0, 1)) * b).sum())
        step = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}[DIRECTIONS[label]]
        assert np.sign(best).tolist() == list(step), (path, best)
    from subquad.data.video import _square_clip

    rng = np.random.RandomState(0)
    for d in DIRECTIONS:  # single-frame occupancy: uniform over the frame's quadrants for every class
        occ = np.mean([_square_clip(rng, d, 4, 32)[2].mean(-1) > 150 for _ in range(400)], axis=0)
        quads = [occ[:16, :16].mean(), occ[:16, 16:].mean(), occ[16:, :16].mean(), occ[16:, 16:].mean()]
        assert max(quads) / min(quads) < 1.35, (d, quads)


def test_clip_shapes_train_eval_views(clips):
    samples, _ = read_video_list(clips, "train")
    torch.manual_seed(0)
    tr = VideoClipDataset(samples, num_frames=5, frame_stride=2, img_size=24, training=True)
    x, y = tr[0]
    assert x.shape == (3, 5, 24, 24) and x.dtype == torch.float32 and y == 0
    ev = VideoClipDataset(samples, num_frames=5, frame_stride=2, img_size=24)
    a, b = ev[1][0], ev[1][0]
    assert a.shape == (3, 5, 24, 24) and torch.equal(a, b)  # centre clip, deterministic
    mv = VideoClipDataset(samples, num_frames=5, frame_stride=2, img_size=24, views=(2, 3))
    v, _ = mv[1]
    assert v.shape == (6, 3, 5, 24, 24)
    batch = torch.utils.data.default_collate([ev[0], ev[1]])[0]
    assert batch.shape == (2, 3, 5, 24, 24)  # (B, C, T, H, W): the *_video models' input


def test_clip_indices_stride_and_short_video():
    assert clip_indices(20, 4, 3, 2).tolist() == [2, 5, 8, 11]
    assert clip_indices(6, 4, 3, 0).tolist() == [0, 3, 5, 5]


def test_multiview_averages_scores():
    class Lin(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :4]

    x = torch.randn(2, 3, 1, 1, 2, 2)  # (B, V, C, T, H, W)
    out = multiview_logits(Lin(), x)
    ref = x.flatten(2)[..., :4].softmax(-1).mean(1).log()
    torch.testing.assert_close(out, ref)
    assert multiview_logits(Lin(), x[:, 0]).shape == (2, 4)


def test_corrupt_and_missing_are_counted_and_the_1_percent_rule(tmp_path, caplog):
    good = tmp_path / "ok.mp4"
    write_video(good, np.full((4, 16, 16, 3), 100, np.uint8))
    (tmp_path / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 20)
    samples = [(str(good), 0)] * 198 + [(str(tmp_path / "bad.mp4"), 1), (str(tmp_path / "gone.mp4"), 2)]
    bad = samples[-2:]
    with pytest.raises(UserError, match=r"^2 of 102 videos in train.txt are missing or undecodable \(2.0 % > 1 %\)"):
        VideoClipDataset(samples[:100] + bad, num_frames=2, frame_stride=1, img_size=16, where="train.txt")
    ds = VideoClipDataset(samples[:99] + bad[:1], num_frames=2, frame_stride=1, img_size=16)
    assert ds.num_corrupt == 1 and len(ds) == 99 and "skipped 1 missing or undecodable" in caplog.text
    ds = VideoClipDataset(samples, num_frames=2, frame_stride=1, img_size=16)  # 2 of 200: exactly 1 %, kept
    assert ds.num_corrupt == 2 and len(ds) == 198


def test_kinetics_csv_layout(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val" / "b").mkdir(parents=True)
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    write_video(tmp_path / "train" / "abc_000010_000020.mp4", frames)
    write_video(tmp_path / "val" / "b" / "xyz_000001_000011.mp4", frames)
    head = "label,youtube_id,time_start,time_end,split\n"
    (tmp_path / "train.csv").write_text(head + "b,abc,10,20,train\na,abc,10,20,train\n")
    (tmp_path / "validate.csv").write_text(head + "b,xyz,1,11,val\n")
    s, names = read_video_list(tmp_path, "val")
    assert names == ["a", "b"] and s == [(str(tmp_path / "val" / "b" / "xyz_000001_000011.mp4"), 1)]
    s, _ = read_video_list(tmp_path, "train")
    assert s[0] == (str(tmp_path / "train" / "abc_000010_000020.mp4"), 1)


def test_bad_list_and_generator_input(tmp_path):
    (tmp_path / "train.txt").write_text("a.mp4 notalabel\n")
    with pytest.raises(UserError, match="integer label"):
        read_video_list(tmp_path, "train")
    with pytest.raises(UserError, match="no list for split 'test'"):
        read_video_list(tmp_path, "test")
    with pytest.raises(UserError, match="--size must be even"):
        generate_moving_squares(tmp_path / "g", 1, 1, 1, size=33)
