"""`subquad export`: a model (optionally trained weights) to ONNX or a `torch.export` program, checked against eager."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="export a model to ONNX or torch.export (.pt2)",
                       description="Export a registered model, or a trained checkpoint, to ONNX "
                       "(torch.onnx.export(dynamo=True); needs `pip install \"subquad[export]\"`) or to a torch.export "
                       "program (.pt2). The written file is checked against eager PyTorch at the export size (and, "
                       "with --dynamic, at a second size) and removed if it disagrees.")
    p.add_argument("--model", default=None,
                   help="registered model name (default: the checkpoint sidecar's; required without --checkpoint)")
    p.add_argument("--checkpoint", default=None,
                   help="weights file or run directory (default: the model's initial weights)")
    p.add_argument("--format", required=True, choices=("onnx", "pt2"), help="onnx or pt2")
    p.add_argument("--img-size", nargs="+", default=None, metavar="S|HxW",
                   help="export size: a side S (S x S) or HxW, e.g. 224 or 224x320; H W also works (default: the "
                   "checkpoint's or the model's)")
    p.add_argument("--dynamic", action="store_true",
                   help="symbolic H and W over every size the model admits, up to 2048 (the program pads like eager)")
    p.add_argument("--out", required=True, help="output file (.onnx or .pt2)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="int8: ONNX Runtime dynamic quantization of the MatMul/Gemm weights (--format onnx only); "
                   "the check then reports top-1 agreement and the max/mean absolute logit error against eager fp32, "
                   "on up to 64 held-out images of the checkpoint's data when its sidecar names them, else on random "
                   "inputs")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    from subquad.export import check_output
    from subquad_cli.errors import UserError
    from subquad_cli.sizes import one_size

    size = one_size(args.img_size)
    if args.model is None and args.checkpoint is None:
        raise UserError("give --model NAME, --checkpoint PATH, or both")
    from subquad.export import _check_quantize

    _check_quantize(args.quantize, args.format)
    check_output(args.out, args.format, args.overwrite, (args.checkpoint,))  # before any model is built
    with torch.no_grad():
        return _export(args, size)


def _export(args: argparse.Namespace, size) -> int:
    import time

    from subquad.export import export_model

    inputs = None
    if args.checkpoint is not None:
        from subquad.engine.checkpoint import load_checkpointed_model

        name, model, side, dcfg, _ = load_checkpointed_model(args.checkpoint, args.model, size, "cpu")
        if size is None and dcfg.get("img_size"):
            s = dcfg["img_size"]
            size = (s, s) if isinstance(s, int) else tuple(s)
        if args.quantize:
            inputs = _held_out(side, dcfg, size)
    else:
        from subquad.models import create_model

        name, model = args.model, create_model(args.model)
    t0 = time.perf_counter()
    res = export_model(model, args.format, args.out, size, dynamic=args.dynamic, overwrite=args.overwrite,
                       name=name, protect=(args.checkpoint,), quantize=args.quantize, check_inputs=inputs)
    worst = max(c["rel_err"] for c in res["checks"])
    if args.quantize:
        c = res["checks"][0]
        print(f"{args.quantize} against eager fp32 ({'held-out images' if inputs is not None else 'random inputs'}"
              f"): top-1 agreement {100 * c['top1_agreement']:.1f} %, max abs logit error {c['max_abs_err']:.3g}, "
              f"mean {c['mean_abs_err']:.3g}")
    cov = res["covers"]
    kind = (f"dynamic: H {cov['H'][0]}-{cov['H'][1]}, W {cov['W'][0]}-{cov['W'][1]}" if args.dynamic
            else "static size")
    print(f"wrote {res['file']} ({args.format}, {kind}; largest relative error {worst:.1e}; "
          f"{time.perf_counter() - t0:.0f} s)")
    return 0


def _held_out(side: dict, dcfg: dict, size) -> object:
    """Up to 64 images of the test (else val) split of the data the checkpoint's sidecar names, transformed for
    eval, when they come out at the export `size`; None otherwise (the check then uses random inputs)."""
    from subquad.data.registry import open_source
    from subquad.engine.classify import eval_loader

    spec = (side.get("args") or {}).get("data")
    if not spec or size is None:
        return None
    from subquad.errors import UserError

    try:
        source = open_source(spec, need_val=False)
        split = source.test_split or source.val_split
        x, _ = next(iter(eval_loader(source, split, dcfg, 64, 0, 64)))
    except (UserError, OSError, StopIteration):  # data that is not here: the check falls back to random inputs
        return None
    return x if x.dim() == 4 and tuple(x.shape[-2:]) == tuple(size) else None
