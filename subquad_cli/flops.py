"""`subquad flops`: parameters and GMACs of a model, counted on the meta device."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("flops", help="count params and GMACs of a model",
                       description="Count parameters and GMACs (= FLOPs / 2, as the papers count) with "
                       "torch's FlopCounterMode on the meta device, plus formulas for FFTs and CPU SDPA.")
    p.add_argument("--model", required=True, help="registered model name (subquad or timm)")
    p.add_argument("--img-size", nargs="+", default=None, metavar="S|HxW",
                   help="input size: a side S (S x S) or HxW, e.g. 224 or 224x320; H W also works "
                   "(default: the model's pretrained_cfg size)")
    p.add_argument("--breakdown", action="store_true", help="also print GMACs per module")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import timm

    import subquad
    from subquad_cli.errors import unknown_name
    from subquad_cli.sizes import one_size

    if not timm.is_model(args.model):
        raise unknown_name("model", args.model, subquad.list_models() + timm.list_models())
    size = one_size(args.img_size)
    if size is None:
        cfg = timm.models.get_pretrained_cfg(args.model)
        size = tuple(cfg.input_size[-2:]) if cfg is not None else (224, 224)
    r = subquad.count_macs(args.model, size, breakdown=args.breakdown)
    print(f"model: {args.model}")
    print(f"img_size: {size[0]}x{size[1]}")
    print(f"params: {r['params']:,} ({r['params'] / 1e6:.3f} M)")
    print(f"GMACs: {r['gmacs']:.4f}")
    if args.breakdown:
        for name, g in r["breakdown"].items():
            if g > 0:
                print(f"  {name:60s} {g:.4f}")
    return 0
