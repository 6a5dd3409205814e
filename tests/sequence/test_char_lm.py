"""CharLM: shapes, causality, parallel == cached decoding (long_short and softmax), generation, bad input."""

from __future__ import annotations

import pytest
import torch

from subquad.sequence import CharLM, create_sequence_model, list_sequence_models
from tests._tol import assert_close

LS = dict(window_size=4, chunk_size=2, rank=2)


def _model(attention="long_short", **kw):
    args = LS if attention == "long_short" else {}
    return CharLM(40, 32, 2, 2, attention=attention, **{**args, **kw}).double().eval()


@pytest.mark.parametrize("attention,residual", [("long_short", "official"),
                                                pytest.param("long_short", "standard", marks=pytest.mark.slow),
                                                ("softmax", "official")])
def test_parallel_equals_cached_decoding(attention, residual):
    m = _model(attention, residual=residual)
    tok = torch.randint(0, 40, (2, 11))
    with torch.no_grad():
        full = m(tok)
        assert full.shape == (2, 11, 40)
        for block in (1, 3):
            cache = m.init_cache(2)
            out = torch.cat([m(tok[:, i:i + block], cache=cache) for i in range(0, 11, block)], dim=1)
            assert_close(out, full, name=f"{attention} blocks of {block}")


@pytest.mark.parametrize("attention", ["long_short", "softmax"])
def test_causal_no_leak(attention):
    m = _model(attention)
    tok = torch.randint(0, 40, (1, 15))
    with torch.no_grad():
        y = m(tok)
        tok2 = tok.clone()
        tok2[0, 9] = (tok[0, 9] + 1) % 40
        y2 = m(tok2)
    assert torch.equal(y2[:, :9], y[:, :9])
    assert not torch.equal(y2[:, 9], y[:, 9])


def test_training_step_reaches_every_parameter():
    m = CharLM(30, 16, 2, 2, **LS, dropout=0.1, emb_dropout=0.1).train()
    tok = torch.randint(0, 30, (2, 13))
    logits = m(tok[:, :-1])
    torch.nn.functional.cross_entropy(logits.reshape(-1, 30), tok[:, 1:].reshape(-1)).backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, missing
    assert m.out_emb.weight is m.in_emb.weight


def test_generate_greedy_matches_argmax_and_sampling_is_seeded():
    m = _model()
    prompt = torch.randint(0, 40, (2, 5))
    g = m.generate(prompt, 6, temperature=0)
    assert g.shape == (2, 11) and torch.equal(g[:, :5], prompt)
    with torch.no_grad():
        nxt = m(g[:, :-1]).argmax(-1)[:, 4:]
    assert torch.equal(nxt, g[:, 5:])
    a = m.generate(prompt, 3, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    b = m.generate(prompt, 3, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_registry_and_bad_input():
    assert {"char_lm", "charlm_ls_base", "charlm_ls_large"} <= set(list_sequence_models())
    big = create_sequence_model("charlm_ls_base", device="meta")
    n = sum(p.numel() for p in big.parameters())
    assert abs(n - 44e6) / 44e6 < 0.02, n  # paper Table 4: 44M
    m, other = _model(), _model()
    with pytest.raises(ValueError, match="another model"):
        m(torch.zeros(1, 2, dtype=torch.long), cache=other.init_cache(1))
    with pytest.raises(ValueError, match="token ids"):
        m(torch.full((1, 2), 40))
    with pytest.raises(ValueError, match="integer"):
        m(torch.zeros(1, 2))
    with pytest.raises(ValueError, match="window_size"):
        CharLM(10, 16, 1, 2, window_size=-1)  # 0 is the dynamic-projection-only ablation


def test_clamp_len_reaches_the_causal_attention():
    """The official `clamp_len` (relative positions clamped) is an option of CharLM and of build_attention."""
    from subquad.attention import build_attention

    m = _model(clamp_len=3)
    causal = [blk.attn for blk in m.modules() if hasattr(getattr(blk, "attn", None), "clamp_len")]
    assert causal and all(a.clamp_len == 3 for a in causal)
    tok = torch.randint(0, 40, (1, 9))
    with torch.no_grad():
        clamped, free = m(tok), _model()
        free.load_state_dict(m.state_dict())
        assert not torch.allclose(clamped, free(tok))  # positions beyond 3 are clamped, so the logits differ
    assert build_attention("long_short", 32, 4, causal=True, clamp_len=16, window_size=8, chunk_size=8,
                           rank=2).clamp_len == 16
    with pytest.raises(ValueError, match="causal=True only"):
        build_attention("long_short", 32, 4, clamp_len=16, window_size=8, rank=2)
