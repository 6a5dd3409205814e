"""Offline proof that a video model learns time (slow): on the generated direction task a small video model reaches
> 90 % test accuracy and a single-frame model stays below 40 % (four classes; the label is in the motion only)."""

from __future__ import annotations

import json

import pytest

from subquad.cli.__main__ import main


@pytest.mark.slow
def test_video_model_learns_direction_single_frame_does_not(tmp_path):
    data = tmp_path / "clips"
    assert main(["video", "generate", "--out", str(data), "--n-train", "200", "--n-val", "40", "--n-test", "80",
                 "--frames", "16", "--size", "32"]) == 0
    top1 = {}
    for t in (8, 1):
        out = tmp_path / f"run{t}"
        assert main(["train", "--data", f"video:{data}", "--model", "hylisanet_micro_video", "--num-frames", str(t),
                     "--frame-stride", "2", "--epochs", "15", "-b", "16", "--output", str(out)]) == 0
        top1[t] = json.loads((out / "results.json").read_text())["top1"]
    assert top1[8] > 90.0, top1
    assert top1[1] < 40.0, top1
