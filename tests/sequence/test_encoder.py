"""LRA encoder classifier: pooling, padding invariance, two-tower Retrieval, every 1-D mechanism, bad input."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention import ATTENTION_REGISTRY, Request, check
from subquad.attention.long_short import remap_legacy as remap_ls_official
from subquad.sequence import create_sequence_model, list_sequence_models
from subquad.sequence.encoder import LRAClassifier
from tests._tol import assert_close

SEQ_MECHS = [n for n in subquad.list_attention() if not check(ATTENTION_REGISTRY.get(n).builder.caps,
                                                               Request(sequence=True))]
MASK_MECHS = [n for n in SEQ_MECHS if ATTENTION_REGISTRY.get(n).builder.caps.supports_mask]

# Small per-mechanism options so that windows / ranks fit the short test sequences.
SMALL_KW = {"long_short": {"window_size": 4, "rank": 3, "global_token_rule": "lra"}}
# Options for the block that sees the class token (the LRA CLS rule of long_short).
CLS_KW = {"long_short": {"num_prefix_tokens": 1}}


def _kw(name: str) -> dict:
    return dict(SMALL_KW.get(name, {}))


def _model(attention: str = "softmax", **kw) -> LRAClassifier:
    args = dict(vocab_size=20, num_classes=10, dim=16, depth=2, num_heads=2, mlp_dim=24, max_len=64,
                attention=attention, attn_kw=_kw(attention), cls_attn_kw=CLS_KW.get(attention))
    args.update(kw)
    return create_sequence_model("lra_encoder", **args)


def _batch(B: int = 3, T: int = 21, lengths=(21, 13, 7)) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, 20, (B, T))
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return tokens * mask, mask


def test_registered():
    assert "lra_encoder" in list_sequence_models()
    assert "softmax" in SEQ_MECHS


def test_official_key_layout():
    keys = set(_model().state_dict())
    for k in ("model.embeddings.word_embeddings.weight", "model.embeddings.position_embeddings.weight",
              "model.cls_embed", "model.transformer_0.norm1.weight", "model.transformer_1.mlpblock.0.weight",
              "model.transformer_1.mlpblock.3.weight", "model.norm.weight", "seq_classifer.mlpblock.0.weight",
              "seq_classifer.mlpblock.2.weight"):
        assert k in keys, k


@pytest.mark.parametrize("attention", SEQ_MECHS)
def test_every_sequence_mechanism_trains(attention):
    m = _model(attention)
    tokens, mask = _batch()
    logits = m(tokens, mask if attention in MASK_MECHS else None)
    assert logits.shape == (3, 10) and torch.isfinite(logits).all()
    logits.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# Mechanisms whose feature maps normalise over the token axis: padded tokens must be left out of those norms.
TOKEN_NORMALISED = ("linear_cosformer", "linear_l1")


def _pad_cases():
    cases = []
    for name in MASK_MECHS:
        # Every pooling for the two LRA baselines; the default (cls_last) for the others, to keep the suite short.
        pools = ("cls_last", "cls", "masked_mean") if name in ("softmax", "long_short") else ("cls_last",)
        if name in TOKEN_NORMALISED:
            pools = ("cls_last", "masked_mean")
        cases += [pytest.param(name, pool, id=f"{name}-{pool}") for pool in pools]
    return cases


@pytest.mark.parametrize("attention,pool", _pad_cases())
def test_padding_invariance(attention, pool):
    """Appending padding (mask False) leaves the pooled output unchanged (float64)."""
    m = _model(attention, pool=pool, dtype=torch.float64).eval()
    tokens, mask = _batch()
    out = m.model(tokens, mask)
    tokens2 = torch.cat([tokens, torch.zeros(3, 11, dtype=torch.long)], 1)
    mask2 = torch.cat([mask, torch.zeros(3, 11, dtype=torch.bool)], 1)
    out2 = m.model(tokens2, mask2)
    assert_close(out2, out, torch.float64, f"{attention}/{pool} padded")
    # The shortest sequence alone (no padding at all) gives the same vector as inside the padded batch.
    alone = m.model(tokens[2:, :7], mask[2:, :7])
    assert_close(alone, out[2:], torch.float64, f"{attention}/{pool} alone")


def test_masked_mean_pooling_is_mask_aware():
    m = _model(pool="masked_mean", dtype=torch.float64).eval()
    tokens, mask = _batch()
    enc = m.model
    x = enc.embeddings(tokens)
    for i in range(enc.num_layers):
        x = getattr(enc, f"transformer_{i}")(x, mask)
    x = enc.norm(x)
    expect = torch.stack([x[b, mask[b]].mean(0) for b in range(3)])
    assert_close(enc(tokens, mask), expect, torch.float64, "masked mean")
    # The official 'mean' divides by the padded length instead.
    m.model.pool = "mean"
    official = torch.stack([x[b, mask[b]].sum(0) / mask.shape[1] for b in range(3)])
    assert_close(enc(tokens, mask), official, torch.float64, "official mean")


def test_cls_last_adds_class_token_in_last_layer_only():
    m = _model(dtype=torch.float64).eval()
    tokens, mask = _batch()
    seen = []
    for i in range(2):
        getattr(m.model, f"transformer_{i}").mha.register_forward_hook(lambda mod, a, o: seen.append(a[0].shape[1]))
    m(tokens, mask)
    assert seen == [21, 22]


def test_retrieval_two_tower():
    m = _model(num_classes=2, dual=True)
    t0, m0 = _batch()
    t1, m1 = _batch(lengths=(5, 21, 9))
    logits = m(t0, m0, t1, m1)
    assert logits.shape == (3, 2)
    assert m.seq_classifer.mlpblock[0].in_features == 4 * 16
    # Shared encoder: swapping the documents changes only the sign of x0 - x1 (the head sees both orders).
    x0, x1 = m.model(t0, m0), m.model(t1, m1)
    feats = torch.cat([x0, x1, x0 * x1, x0 - x1], -1)
    assert_close(logits, m.seq_classifer(feats), torch.float32, "two-tower head")
    with pytest.raises(ValueError, match="tokens_1"):
        m(t0, m0)


def test_bad_input():
    with pytest.raises(ValueError, match="pooling"):
        _model(pool="max")
    with pytest.raises(ValueError, match="unknown attention"):
        _model(attention="no_such_attention")
    m = _model()
    with pytest.raises(ValueError, match="max_len"):
        m(torch.ones(2, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        m(torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8))
    spatial = [n for n in subquad.list_attention() if n not in SEQ_MECHS]
    for name in spatial[:1]:
        with pytest.raises(ValueError, match="1-D"):
            _model(attention=name)


def test_meta_device():
    m = _model(device="meta")
    assert next(m.parameters()).device.type == "meta"


@pytest.mark.parity
def test_parity_official_lra_model(official_root):
    """The whole official LRA model (lra/model.py + model_wrapper.SCHead, `lsta`, --cls_last_layer) loads strictly
    into LRAClassifier(attention="long_short") and gives the same logits."""
    import importlib
    import sys
    import types
    from pathlib import Path

    root = Path(official_root)
    lra = (root / "transformer-ls" if (root / "transformer-ls").is_dir() else root) / "lra"
    if not (lra / "model_wrapper.py").is_file():
        pytest.skip(f"official LRA code not found under {lra}")
    names = ("model_wrapper", "model", "attention", "attention_transformer_ls")
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.path.insert(0, str(lra))
    try:
        wrapper = importlib.import_module("model_wrapper")
        for w, r in [(8, 4), (4, 2)]:
            cfg = types.SimpleNamespace(
                mixed_precision=False, pooling_mode="MEAN", cls_last_layer=True, cls_token=False, vocab_size=20,
                embedding_dim=16, transformer_dim=16, transformer_hidden_dim=24, max_seq_len=32, debug=False,
                dropout_prob=0.0, attn_type="lsta", num_layers=2, tied_weights=False, num_classes=10, num_head=2,
                head_dim=8, num_landmarks=r, window_size=w, attention_dropout=0.0, fp32_attn=False,
                conv_kernel_size=-1, attention_grad_checkpointing=False)
            off = wrapper.ModelForSC(cfg).eval()
            with torch.no_grad():
                off.model.cls_embed.normal_()
            ours = LRAClassifier(vocab_size=20, num_classes=10, dim=16, depth=2, num_heads=2, mlp_dim=24, max_len=32,
                                 attention="long_short",
                                 attn_kw={"global_token_rule": "lra", "window_size": w, "rank": r},
                                 cls_attn_kw={"num_prefix_tokens": 1}).eval()
            # the LRA code's W_q/W_k/W_v/W_o/dual_ln_l/dual_ln_s/dconv_fc -> our one set of long-short names
            ours.load_state_dict(remap_ls_official(off.state_dict(), ours), strict=True)
            tokens, mask = _batch(3, 32, (32, 20, 9))
            with torch.no_grad():
                ref = off.seq_classifer(off.model(tokens, mask.float()))
                assert_close(ours(tokens, mask), ref.double(), torch.float32, f"official LRA model w={w} r={r}")
    finally:
        sys.path.remove(str(lra))
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
