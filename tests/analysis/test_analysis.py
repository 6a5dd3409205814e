"""analyze: rank/entropy/locality/similarity measures, the rank property of mechanisms, figures, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import subquad
from subquad.analysis.kernels import structure_kernels
from subquad.analysis.linear_stats import attention_entropy, attention_locality, token_cosine
from subquad.analysis.maps import collect_mixer_calls, grad_cam, mixer_attention
from subquad.analysis.rank import attention_rank, matrix_rank
from subquad.analysis.report import analyze_model, layer_stats
from subquad.attention.base import TokenMixer
from subquad.errors import UserError
from subquad_cli.__main__ import main
from subquad_cli.analyze import sample_image


def test_matrix_rank_and_sampled_rank():
    a = torch.randn(3, 40, 5, dtype=torch.float64) @ torch.randn(3, 5, 40, dtype=torch.float64)
    assert matrix_rank(a).tolist() == [5, 5, 5]
    assert matrix_rank(torch.eye(7)).item() == 7
    r = attention_rank(a, max_tokens=20)
    assert r["sampled"] and r["size"] == 20 and r["ranks"] == [5, 5, 5] and r["rank_ratio"] == 0.25
    full = attention_rank(torch.rand(2, 30, 30, dtype=torch.float64), max_tokens=256)
    assert not full["sampled"] and full["rank"] == 30


def test_entropy_locality_cosine_on_known_maps():
    n = 12
    uniform = torch.full((1, n, n), 1.0 / n)
    assert attention_entropy(uniform)["entropy_ratio"] == pytest.approx(1.0)
    assert attention_entropy(torch.eye(n)[None])["entropy"] == pytest.approx(0.0, abs=1e-12)
    assert attention_locality(torch.eye(n)[None], (3, 4), k=3) == pytest.approx(1.0)
    # On a 3 x 4 grid the 3 x 3 window of a corner holds 4 tokens, of an edge 6, of the centre 9.
    counts = [4, 6, 6, 4, 6, 9, 9, 6, 4, 6, 6, 4]
    assert attention_locality(uniform, (3, 4), k=3) == pytest.approx(sum(counts) / n / n)
    assert attention_locality(torch.ones(1, 5, 4), (2, 2)) is None
    assert token_cosine(torch.ones(5, 3)) == pytest.approx(1.0)
    assert token_cosine(torch.eye(4)) == pytest.approx(0.0)
    assert token_cosine(torch.cat([torch.zeros(1, 4), torch.ones(3, 4)]), prefix=1) == pytest.approx(1.0)


def _layer_rows(model: nn.Module, img: int, mechanism: str) -> list[dict]:
    """layer_stats rows of the layers using `mechanism` in an untrained model."""
    calls, _ = collect_mixer_calls(model.eval(), torch.randn(1, 3, img, img))
    rows = [layer_stats(c, rank_max_tokens=512) for c in calls if c.module.name == mechanism]
    assert rows, f"no {mechanism!r} layer found"
    return rows


LOW_RANK = "linear"  # with feature_map="relu": plain ReLU kernel linear attention (FLatten Fig. 5: rank <= head dim)


def test_plain_relu_linear_attention_is_low_rank():
    model = subquad.create_model("vit_attn_micro", attn=LOW_RANK, attn_kwargs={"feature_map": "relu"})
    # 65 tokens, head dim 32: rank <= 32 < N in every layer.
    for r in _layer_rows(model, 32, LOW_RANK):
        assert r["tokens"] == 65 and r["rank"] <= 32


@pytest.mark.parametrize("name", ["focused_linear", "enhanced_linear"])
def test_focused_and_enhanced_attention_restore_rank(name):
    """FLatten's DWC (inside the mechanism) and L2ViT's LCM (beside it in the block) give near-full rank maps,
    where the kernel product alone is limited by the head dim (the papers' direction)."""
    if name == "focused_linear":
        # 65 tokens, head dim 32: the kernel product alone could reach at most rank 32.
        for r in _layer_rows(subquad.create_model("vit_attn_micro", attn=name, num_classes=10), 32, name):
            assert r["tokens"] == 65 and r["rank"] > 0.9 * 65
    else:
        # l2vit_micro at 32 px: enhanced-linear layers on 16 x 16 and 8 x 8 grids, head dim 32.
        rows = [r for r in _layer_rows(subquad.create_model("l2vit_micro", num_classes=10), 32, name)
                if r["tokens"] >= 64]
        assert rows
        for r in rows:
            assert r["rank"] <= 32 < r["rank_size"]
            assert r["rank_with_local_ratio"] > 0.9


def test_lisa_kernels_are_shown():
    m = subquad.build_attention("structure_aware", 16, 2, input_size=(5, 6))
    k = structure_kernels(m, heads=(1,))
    assert k.shape[0] == 1 and k.shape[-2:] == (5, 6)
    # Offset (0, 0) is moved to the centre of the image.
    assert torch.equal(k[0, :, 2, 3], m.kernel_b.detach()[1, :, 0, 0])
    with pytest.raises(ValueError, match="out of range"):
        structure_kernels(m, heads=(5,))
    assert structure_kernels(subquad.build_attention("softmax", 16, 2)) is None


def test_grad_cam_is_a_normalised_map():
    model = subquad.create_model("vit_attn_micro", num_classes=5).eval()
    cam, cls = grad_cam(model, torch.randn(1, 3, 32, 32))
    assert cam.shape == (8, 8) and 0 <= cls < 5 and cam.min() >= 0 and cam.max() == pytest.approx(1.0)
    assert (cam > 0).sum() > 4


def test_analyze_cli_writes_figures_and_summary(tmp_path, capsys):
    out = tmp_path / "an"
    assert main(["analyze", "--model", "vit_attn_micro", "--image", str(sample_image()), "--out", str(out),
                 "--layers", "0", "-1", "--queries", "0.5,0.5", "0.2,0.8"]) == 0
    for f in ("attention_maps.png", "gradcam.png", "layer_stats.png", "layer_stats.csv", "summary.json"):
        assert (out / f).stat().st_size > 0, f
    s = json.loads((out / "summary.json").read_text())
    assert s["num_attention_layers"] == 4 and s["layers_shown"] == [0, 3] and len(s["layers"]) == 4
    for r in s["layers"]:
        assert 0 < r["rank"] <= r["rank_size"] and 0 <= r["entropy_ratio"] <= 1 + 1e-9
        assert 0 <= r["locality"] <= 1 and math.isfinite(r["token_cosine"])
    assert "rank" in capsys.readouterr().out


def _one_line_error(capsys, *args: str) -> str:
    assert main(["analyze", "--model", "vit_attn_micro", *args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("subquad analyze: error: "), lines
    return lines[0]


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    out = str(tmp_path / "o")
    assert "cannot read image" in _one_line_error(capsys, "--image", str(bad), "--out", out)
    err = _one_line_error(capsys, "--out", out, "--layers", "7")
    assert "layer index 7 is out of range" in err and "0..3" in err
    assert "no such file" in _one_line_error(capsys, "--out", out, "--image", str(tmp_path / "missing.jpg"))


@pytest.mark.parametrize("model,args,what", [
    ("vit_attn_micro", ["--layers", "99"], "layer index 99 is out of range"),
    ("l2vit_micro", ["--img-size", "8"], "smaller than the model's total stride"),
    ("lisanet_micro", ["--kernel-heads", "9"], "kernel head(s) [9] out of range"),
    ("vit_attn_micro", ["--rank-max-tokens", "0"], "--rank-max-tokens must be >= 1, got 0"),
    ("vit_attn_micro", ["--rank-max-tokens", "-4"], "--rank-max-tokens must be >= 1, got -4"),
])
def test_refused_options_write_nothing(tmp_path, capsys, model, args, what):
    """A refused command leaves no --out folder behind (it used to create it, empty, before checking the options;
    a LiSA layer's kernel figure could be written before a later layer refused --kernel-heads)."""
    out = tmp_path / "o"
    assert main(["analyze", "--model", model, "--out", str(out), *args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and what in lines[0], lines
    assert not out.exists()


def test_seed_makes_an_untrained_model_reproducible(tmp_path):
    """Issue: an untrained model gave other maps on every run. --seed (default 0) seeds its initialisation."""
    runs = {}
    for key, extra in (("a", []), ("b", []), ("seed0", ["--seed", "0"]), ("seed1", ["--seed", "1"])):
        out = tmp_path / key
        assert main(["analyze", "--model", "vit_attn_micro", "--out", str(out), "--layers", "0", *extra]) == 0
        runs[key] = ((out / "summary.json").read_text(), (out / "layer_stats.csv").read_text())
    assert runs["a"] == runs["b"] == runs["seed0"]
    assert runs["seed1"][0] != runs["a"][0]


class _NoMap(TokenMixer):
    name = "no_map"

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, hw=None, mask=None):
        return self.proj(x)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 8, 8)
        self.attn = _NoMap()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.embed(x)
        hw = t.shape[-2:]
        t = t.flatten(2).transpose(1, 2)
        return self.head(self.attn(t, hw).mean(1))


def test_mechanism_without_attention_matrix_is_a_clear_error(tmp_path):
    calls, _ = collect_mixer_calls(_Tiny().eval(), torch.randn(1, 3, 32, 32))
    with pytest.raises(UserError, match="'no_map' does not provide attention_matrix"):
        mixer_attention(calls[0])
    with pytest.raises(UserError, match="no attention modules"):
        analyze_model(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2)), sample_image(), tmp_path)


class _Host(nn.Module):
    """Patch embedding -> one registered mechanism on the token grid -> mean-pool head."""

    def __init__(self, name: str, dim: int = 16, grid: tuple[int, int] = (6, 5)) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, 4)
        self.attn = subquad.build_attention(name, dim, 2, input_size=grid)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        t = self.embed(x)
        hw = tuple(t.shape[-2:])
        t = t.flatten(2).transpose(1, 2)
        return self.head((t + self.attn(t, hw)).mean(1))


@pytest.mark.parametrize("name", [n for n in subquad.list_attention()
                                  if subquad.attention.get_attention_cls(n).caps.bidirectional])
def test_every_mechanism_is_analysable(name):
    model = _Host(name).eval()
    images = torch.randn(1, 3, 24, 20)
    calls, _ = collect_mixer_calls(model, images)
    assert len(calls) == 1 and calls[0].hw == (6, 5)
    r = layer_stats(calls[0])
    assert r["tokens"] == 30 and 0 < r["rank"] <= r["rank_size"] and 0 <= r["entropy_ratio"] <= 1 + 1e-9
    if r["keys"] == 30:
        assert 0 <= r["locality"] <= 1 + 1e-9
    cam, _ = grad_cam(model, images)
    assert cam.shape == (6, 5) and math.isfinite(float(cam.sum()))


@pytest.mark.parametrize("D", [1, 2, 6])
def test_lisa_kernel_figure_title_fits(tmp_path, D):
    """Issue 13 item 10: the title of a narrow kernel figure stays inside the figure and above the kernels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from subquad.analysis.kernels import plot_kernels

    title = "structure_aware_micro_model layer 11: LiSA kernels W^b (offset 0 at centre)"
    seen = {}
    real_close = plt.close

    def keep(fig=None):
        seen["fig"] = fig

    plt.close = keep
    try:
        p = plot_kernels(torch.randn(2, D, 5, 5), tmp_path / "k.png", [0, 1], title)
    finally:
        plt.close = real_close
    fig = seen["fig"]
    r = fig.canvas.get_renderer()
    box = fig._suptitle.get_window_extent(r)
    assert p.stat().st_size > 1000
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (box, fig.bbox)
    axes_top = max(ax.get_window_extent(r).y1 for ax in fig.axes)
    title_row = max(ax.title.get_window_extent(r).y1 for ax in fig.axes)
    assert box.y0 >= max(axes_top, title_row) - 1, (box, axes_top, title_row)
    assert fig._suptitle.get_text().replace("\n", " ") == title
    real_close(fig)
