"""`subquad eval`: top-1 / top-5 / loss of a checkpoint on a data split; prints them and writes a JSON file."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from subquad_cli.config import add_inference_arguments
from subquad_cli.sizes import size_arg


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="evaluate a checkpoint",
                       description="Evaluate a checkpoint (safetensors from `subquad train`, an official .pth, or a "
                       "checkpoint of timm's train.py such as model_best.pth.tar; torch files are read with "
                       "weights_only=True) on a data split. The sidecar JSON next to the checkpoint supplies the "
                       "model, class names and the eval transform; for a timm checkpoint they come from its saved "
                       "args, as timm's train.py evaluated it.")
    p.add_argument("--checkpoint", required=True,
                   help="weights file (.safetensors, .pth, timm's .pth.tar) or a run directory (its "
                   "best.safetensors)")
    p.add_argument("--model", default=None,
                   help="registered model name (default: the checkpoint sidecar's; required without a sidecar)")
    p.add_argument("--data", default=None, help="data spec (default: the one the checkpoint was trained on)")
    p.add_argument("--split", default=None, help="split (default: the data's test split, or val when it has none)")
    p.add_argument("--img-size", type=size_arg, default=None, metavar="S|HxW",
                   help="input size: a side S (S x S) or HxW, e.g. 224 or 224x320 (default: the training size)")
    p.add_argument("--views", default=None, metavar="CLIPSxCROPS",
                   help="video: multi-view testing, temporal clips x spatial crops with the scores averaged (e.g. "
                   "4x3; default 1x1, the centre clip)")
    p.add_argument("--use-ema", action="store_true", help="evaluate the EMA weights: <name>_ema.safetensors beside "
                   "the checkpoint, or the state_dict_ema of a timm checkpoint")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("-j", "--workers", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="evaluate a seeded subset of this many images (0: all)")
    p.add_argument("--results-file", default=None, help="JSON output; an existing file is replaced only with "
                   "--overwrite (default: <checkpoint>.eval-<split>.json, left as it is when it holds the same "
                   "result; a different, earlier result there is kept and the new one goes to "
                   "<checkpoint>.eval-<split>-2.json, -3, ...)")
    p.add_argument("--overwrite", action="store_true", help="let the results file replace an existing one")
    add_inference_arguments(p)
    p.set_defaults(func=run)
    return p


def _natural_class_order(model, classes: list[str]):
    """A model trained by timm's train.py on a folder numbers the classes in natural order (timm's folder reader,
    `timm.utils.misc.natural_key`: c2 before c10); subquad's folders number them in sorted order (c10 before c2).
    Returns the model with its outputs put in `classes`' order (the model itself when the two orders agree)."""
    import torch
    from timm.utils.misc import natural_key

    natural = sorted(classes, key=natural_key)
    if natural == classes:
        return model

    class _Reordered(torch.nn.Module):
        def __init__(self, net: torch.nn.Module, perm: torch.Tensor) -> None:
            super().__init__()
            self.net, self.num_classes = net, net.num_classes
            self.register_buffer("perm", perm, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)[:, self.perm]

    device = next(model.parameters()).device
    return _Reordered(model, torch.tensor([natural.index(c) for c in classes], device=device)).eval()


def _parse_views(text: str) -> list[int]:
    from subquad_cli.errors import UserError

    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise UserError(f"--views {text!r}: expected CLIPSxCROPS with both >= 1 (e.g. 2x1, 4x3)")
    return [int(p) for p in parts]


def run(args: argparse.Namespace) -> int:
    from subquad.backend import precision_context, resolve_precision
    from subquad.data.registry import open_source
    from subquad.engine.checkpoint import check_output_file, load_checkpointed_model, sidecar_path, write_json
    from subquad.engine.classify import eval_loader, evaluate
    from subquad.engine.distributed import DistInfo, resolve_device
    from subquad.layers.int8 import precision_model
    from subquad_cli.errors import UserError

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.workers < 0 or args.limit < 0:
        raise UserError(f"--workers and --limit must be >= 0 (0: the main process; all images), got {args.workers} "
                        f"and {args.limit}")
    if args.results_file:  # before any work
        check_output_file(args.results_file, (".json",), (args.checkpoint,), "--results-file",
                          overwrite=args.overwrite)
    info = DistInfo(device=resolve_device(args.device))
    precision = resolve_precision(args.precision, info.device)
    name, model, sidecar, dcfg, ckpt = load_checkpointed_model(args.checkpoint, args.model, args.img_size,
                                                               info.device, use_ema=args.use_ema)
    spec = args.data or (sidecar.get("args") or {}).get("data")
    if not spec:
        raise UserError("--data is required (the checkpoint has no sidecar naming its data)")
    source = open_source(spec, need_val=False)  # `--split test` needs no val/ folder
    if sidecar.get("classes") and sidecar["classes"] != source.classes:
        raise UserError(f"the checkpoint's classes ({len(sidecar['classes'])}) differ from those of {spec!r} "
                        f"({len(source.classes)})")
    if model.num_classes != len(source.classes):
        raise UserError(f"the checkpoint has {model.num_classes} outputs but {spec!r} has {len(source.classes)} "
                        "classes")
    if sidecar.get("class_order") == "natural" and spec.lower().startswith("imagefolder"):
        model = _natural_class_order(model, source.classes)
    split = args.split or source.test_split or source.val_split
    model = precision_model(model, precision)
    if args.views is not None:
        if not source.video or "video" not in dcfg:
            raise UserError(f"--views applies to video data and video checkpoints, not {spec!r}")
        dcfg["video"] = dict(dcfg["video"], views=_parse_views(args.views))
    loader = eval_loader(source, split, dcfg, args.batch_size, args.workers, args.limit)
    t0 = time.perf_counter()
    # One autocast region around the run (each batch enters its own inside it): weights are cast to bf16 once.
    with precision_context(precision, info.device):
        m = evaluate(model, loader, info.device, info,
                     None if precision == "fp32" else (lambda: precision_context(precision, info.device)))
    dt = time.perf_counter() - t0
    n = len(loader.dataset)
    n_params = sum(p.numel() for p in model.parameters())
    s = dcfg["img_size"]
    size_label = s if isinstance(s, int) else "x".join(map(str, s))  # 224, or 224x320
    row = {"model": name, "checkpoint": os.fspath(ckpt), "data": spec, "split": split, "images": n,
           "top1": round(m["eval_top1"], 4), "top1_err": round(100 - m["eval_top1"], 4),
           "top5": round(m["eval_top5"], 4), "top5_err": round(100 - m["eval_top5"], 4),
           "loss": round(m["eval_loss"], 6), "param_count": round(n_params / 1e6, 4), "img_size": size_label,
           "crop_pct": dcfg.get("crop_pct"), "interpolation": dcfg.get("interpolation") or "default",
           "precision": precision, "images_per_sec": round(n / dt, 1)}
    if "video" in dcfg:
        row["views"] = "x".join(str(v) for v in dcfg["video"]["views"])
    print(f"{name} on {spec} [{split}, {n} images]: top-1 {m['eval_top1']:.2f} %  top-5 {m['eval_top5']:.2f} %  "
          f"loss {m['eval_loss']:.4f}  ({precision}, {n / dt:.0f} images/s)", flush=True)
    if args.results_file:
        out, note = Path(args.results_file), ""
        check_output_file(out, (".json",), (ckpt, sidecar_path(ckpt)), "--results-file", overwrite=args.overwrite)
        write_json(row, out)
    else:
        out, note = _default_results(ckpt, split, row, args.overwrite)
    print(f"results: {out}{note}")
    return 0


# Fields of a results file that change from run to run without the result changing.
_VOLATILE = ("images_per_sec", "checkpoint")


def _default_results(ckpt: Path, split: str, row: dict, overwrite: bool) -> tuple[Path, str]:
    """Where the results go without --results-file: <checkpoint>.eval-<split>.json when it is new (or --overwrite),
    is left as it is when it holds the same result, and an earlier, different result is kept: the new one goes to
    the first free <checkpoint>.eval-<split>-N.json (N = 2, 3, ...). Returns the path and a note saying which."""
    from subquad.engine.checkpoint import check_output_file, sidecar_path
    from subquad_cli.config import write_result_keeping

    base = ckpt.with_name(f"{ckpt.stem}.eval-{split}.json")
    check_output_file(base, (".json",), (ckpt, sidecar_path(ckpt)), "--results-file")
    return write_result_keeping(base, row, overwrite, _VOLATILE)


