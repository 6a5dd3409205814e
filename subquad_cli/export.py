"""`subquad export`: a model (optionally trained weights) to ONNX or a `torch.export` program, checked against eager."""

from __future__ import annotations

import argparse

# subquad.export's INT8_WEIGHTS and DEFAULT_INT8_WEIGHTS, spelled out so that building the parser imports no torch
# (a test holds them equal).
INT8_WEIGHTS = ("7bit", "8bit", "7bit-per-channel", "8bit-per-channel")
DEFAULT_INT8_WEIGHTS = "7bit-per-channel"


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
    p.add_argument("--int8-weights", default=None, metavar="|".join(INT8_WEIGHTS),
                   help=f"needs --quantize int8: weight bits and scales (default {DEFAULT_INT8_WEIGHTS}: one scale "
                   "per output channel). 7-bit weights compute exactly on every CPU; 8-bit ones are clipped on x86 "
                   "CPUs without VNNI (ONNX Runtime's uint8 x int8 products saturate there), so use them only for "
                   "CPUs with VNNI, AMX or Arm")
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
    _check_int8_weights(args)
    check_output(args.out, args.format, args.overwrite, (args.checkpoint,))  # before any model is built
    with torch.no_grad():
        return _export(args, size)


def _check_int8_weights(args: argparse.Namespace) -> None:
    """Refuse --int8-weights without --quantize int8 or with an unknown name (before any model is built). Where
    8-bit weights are asked for on a CPU that clips them, `subquad.export.quantize_int8` warns (one line)."""
    from subquad.export import check_int8_weights
    from subquad_cli.errors import UserError

    if args.int8_weights is None:
        return
    if args.quantize != "int8":
        raise UserError(f"--int8-weights {args.int8_weights} needs --quantize int8")
    check_int8_weights(args.int8_weights)


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
                       name=name, protect=(args.checkpoint,), quantize=args.quantize, check_inputs=inputs,
                       int8_weights=args.int8_weights)
    weights = res["int8_weights"]
    worst = max(c["rel_err"] for c in res["checks"])
    if args.quantize:
        c = res["checks"][0]
        where = "held-out images" if inputs is not None else "random inputs"
        print(f"{args.quantize} ({weights} weights) against eager fp32 ({where}): top-1 agreement "
              f"{100 * c['top1_agreement']:.1f} %, max abs logit error {c['max_abs_err']:.3g}, "
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
