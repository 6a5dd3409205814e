"""What the PolaFormer families share: the release facts (paper, code, pretrained cfg, card).

Paper: PolaFormer: Polarity-aware Linear Attention for Vision Transformers (arXiv 2501.15061).
Official: ZacharyMeng/PolaFormer@44cdd39 (`models/pola_swin.py`, `models/pola_pvt.py`, `cfgs/*.yaml`).
"""

from __future__ import annotations

__all__ = ["POLA_CODE", "POLA_PAPER", "POLA_CFG", "POLA_CARD"]

POLA_CODE = "ZacharyMeng/PolaFormer"
POLA_PAPER = "PolaFormer: Polarity-aware Linear Attention for Vision Transformers (arXiv 2501.15061)"
#: The pretrained-cfg fields of both PolaFormer families (the repository's LICENSE is MIT).
POLA_CFG = dict(license="mit", paper_ids="arXiv:2501.15061", origin_url="https://github.com/" + POLA_CODE,
                notes="the official README links only the Hugging Face folder huggingface.co/ZachMeng/PolaFormer, no "
                      "per-model file; load a downloaded official checkpoint with "
                      "pretrained_cfg_overlay=dict(file=...)")
POLA_CARD = dict(family="polaformer", source="official README (top-1; it publishes no params or GMACs)",
                 code=POLA_CODE,
                 notes="ref_params / ref_gmacs measured from the official classes at 44cdd39 (GMACs: torch "
                       "FlopCounterMode, the counter of `subquad flops`)")
