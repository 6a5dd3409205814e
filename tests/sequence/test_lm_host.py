"""The LM host of `train_lm` / the charlm arena task: `build_lm` honours ffn_dim and dropout, is the textbook pre-LN
causal LM, and only the token mixer changes between mechanisms (chosen by declared capabilities, not names)."""

from __future__ import annotations

import math

import pytest
import torch

from subquad.engine.sequence import LMConfig, build_lm
from subquad.errors import UserError
from subquad.sequence import CharLM
from tests._tol import assert_close

MIXERS = {"softmax": {}, "sliding_window": {"window_size": 5}, "linear_elu1": {"chunk_size": 4},
          "long_short": {"window_size": 5, "chunk_size": 3, "rank": 2}}


def _cfg(attention="softmax", **kw):
    return LMConfig(attention=attention, attn_kw={attention: MIXERS[attention]}, dim=16, depth=2, num_heads=2, **kw)


def test_build_lm_honours_ffn_dim_and_dropout():
    m = build_lm(40, _cfg(ffn_dim=24, dropout=0.25, emb_dropout=0.1))
    for layer in m.layers:
        assert layer.ff.fc1.out_features == 24 and layer.ff.fc2.in_features == 24
        assert layer.ff.dropout.p == 0.25 and layer.attn_dropout.p == 0.25
    assert m.emb_dropout.p == 0.1
    tok = torch.randint(0, 40, (2, 9))
    m.train()
    assert not torch.equal(m(tok), m(tok)), "dropout inactive in training"
    m.eval()
    assert torch.equal(m(tok), m(tok))
    assert build_lm(40, _cfg()).layers[0].ff.fc1.out_features == 64  # ffn_dim 0: 4 d
    with pytest.raises(UserError, match="dropout"):
        build_lm(40, _cfg(dropout=1.5))
    with pytest.raises(UserError, match="residual"):
        build_lm(40, _cfg(residual="post"))


def test_attention_output_dropout_is_applied():
    """Dropout reaches the attention branch itself (not only the FFN): with the FFN dropout off by hand, the
    training-mode output still varies from call to call."""
    m = build_lm(40, _cfg(dropout=0.5)).train()
    for layer in m.layers:
        layer.ff.dropout.p = 0.0
    tok = torch.randint(0, 40, (1, 7))
    assert not torch.equal(m(tok), m(tok))


@pytest.mark.parametrize("attention", list(MIXERS))
def test_host_is_the_textbook_pre_ln_lm(attention):
    """logits = W_e LN_f(h_L), h_l = h' + FFN(LN2(h')), h' = h_{l-1} + Attn(LN1(h_{l-1})), h_0 = sqrt(d) E[x] (+ P)."""
    m = build_lm(40, _cfg(attention, ffn_dim=20)).double().eval()
    tok = torch.randint(0, 40, (2, 13))
    h = m.in_emb(tok) * math.sqrt(16)
    if m.pos_embed == "sinusoid":
        pos = torch.arange(13, dtype=torch.float64)
        inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
        ang = pos[:, None] * inv[None]
        h = h + torch.cat([ang.sin(), ang.cos()], dim=-1)
    for layer in m.layers:
        h = h + layer.attn(layer.norm1(h))
        h = h + layer.ff.fc2(torch.nn.functional.gelu(layer.ff.fc1(layer.norm2(h))))
    logits = m.norm(h) @ m.in_emb.weight.t() + m.out_emb.bias
    with torch.no_grad():
        assert_close(m(tok), logits.detach(), name=f"{attention} host")


def test_only_the_token_mixer_changes_and_positions_follow_caps():
    shapes = {}
    for attention in MIXERS:
        m = build_lm(40, _cfg(attention))
        shapes[attention] = {n: tuple(p.shape) for n, p in m.named_parameters() if ".attn." not in n}
        assert m.pos_embed == ("none" if attention == "long_short" else "sinusoid")
        assert m.residual == "standard" and m.norm is not None
    first = next(iter(shapes.values()))
    assert all(s == first for s in shapes.values())


@pytest.mark.parametrize("attention", ["sliding_window", "linear_elu1"])
def test_new_causal_mixers_in_the_lm(attention):
    m = build_lm(40, _cfg(attention)).double().eval()
    tok = torch.randint(0, 40, (2, 17))
    with torch.no_grad():
        full = m(tok)
        tok2 = tok.clone()
        tok2[:, 10] = (tok[:, 10] + 1) % 40
        y2 = m(tok2)
        assert torch.equal(y2[:, :10], full[:, :10]) and not torch.equal(y2[:, 10], full[:, 10])
        cache = m.init_cache(2)
        out = torch.cat([m(tok[:, i:i + 4], cache=cache) for i in range(0, 17, 4)], dim=1)
    assert_close(out, full, name=f"{attention} cached decoding")


def test_a_mechanism_without_a_causal_form_is_refused():
    with pytest.raises(ValueError, match="'enhanced_linear' has no causal mode.*sliding_window"):
        CharLM(40, 16, 1, 2, attention="enhanced_linear")
    with pytest.raises(ValueError, match="needs a 2-D token grid"):
        CharLM(40, 16, 1, 2, attention="cswin")
    with pytest.raises(UserError, match="linear_l1. has no causal mode"):
        build_lm(40, LMConfig(attention="linear_l1", dim=16, depth=1, num_heads=2))


def test_shipped_lm_recipes_set_the_host():
    import argparse

    from subquad_cli.lm import CONFIG_DIR, resolve_config

    def cfg(name):
        ns = argparse.Namespace(data="d", attention="long_short", config=str(CONFIG_DIR / f"{name}.yaml"), attn_opt=[])
        return resolve_config(ns)

    base = cfg("base")
    assert (base.ffn_dim, base.dropout, base.emb_dropout, base.residual) == (2048, 0.2, 0.2, "official")
    m = build_lm(256, base, device=torch.device("meta"))
    assert m.layers[0].ff.fc1.out_features == 2048 and m.layers[0].attn_dropout.p == 0.2
    assert abs(sum(p.numel() for p in m.parameters()) - 44e6) / 44e6 < 0.02  # paper Table 4: 44M
    assert cfg("small").residual == "official"  # the README's small run


def test_cli_flags_and_checkpoint_keep_the_host(tmp_path):
    import argparse

    from subquad.data.char import prepare_corpus
    from subquad.engine.sequence import load_lm, train_lm
    from subquad_cli.lm import resolve_config

    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    prepare_corpus(tmp_path / "t.txt", tmp_path / "prep")
    ns = argparse.Namespace(data=str(tmp_path / "prep"), attention="sliding_window", config=None,
                            attn_opt=["window_size=4"], dim=16, depth=1, num_heads=2, ffn_dim=24, dropout=0.1,
                            emb_dropout=None,
                            residual="official", seq_len=32, batch_size=2, max_steps=1, eval_every=1, eval_ctx=32,
                            eval_score=16, eval_tokens=32, final_eval_tokens=32, output=str(tmp_path / "run"),
                            device="cpu")
    cfg = resolve_config(ns)
    assert (cfg.ffn_dim, cfg.dropout, cfg.residual) == (24, 0.1, "official")
    train_lm(cfg, log=lambda s: None)
    model, side = load_lm(tmp_path / "run")
    assert model.layers[0].ff.fc1.out_features == 24 and model.residual == "official" and model.norm is None
    assert model.layers[0].attn.window_size == 4 and side["model_args"]["dropout"] == 0.1
