"""`subquad predict`: top-5 classes for each image, with class names from the checkpoint's sidecar."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from subquad_cli.config import add_inference_arguments
from subquad_cli.sizes import size_arg


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="top-5 classes for images",
                       description="Classify images with a trained checkpoint; the model, class names and the eval "
                       "transform come from the checkpoint's JSON sidecar (e.g. best.json beside best.safetensors), "
                       "or from the saved args of a timm train.py checkpoint.")
    p.add_argument("--checkpoint", required=True,
                   help="weights file (.safetensors, .pth or timm's .pth.tar) or a run directory (its "
                   "best.safetensors)")
    p.add_argument("--model", default=None,
                   help="registered model name (default: the checkpoint sidecar's; required without a sidecar)")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files, or folders (every image directly in one, in sorted order); an image that cannot "
                   "be read is skipped and reported, and the command then exits with status 2")
    p.add_argument("--img-size", type=size_arg, default=None, metavar="S|HxW",
                   help="input size: a side S (S x S) or HxW, e.g. 224 or 224x320 (default: the training size)")
    p.add_argument("--topk", type=int, default=5, help="classes to print per image")
    p.add_argument("-b", "--batch-size", type=int, default=64, help="images per forward")
    p.add_argument("--json", default=None, help="also write the predictions to this JSON file (an existing file is "
                   "replaced only with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="let --json replace an existing file")
    add_inference_arguments(p)
    p.set_defaults(func=run)
    return p


def expand_images(paths: list[str]) -> list[str]:
    """Image files in command-line order; a folder stands for the images directly in it (sorted by name; by
    extension, `subquad.data.imagefolder.IMG_EXTENSIONS`).

    Raises:
        UserError: a path that does not exist, or a folder without images.
    """
    from subquad.data.imagefolder import IMG_EXTENSIONS
    from subquad_cli.errors import UserError

    out: list[str] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            found = sorted(str(q) for q in p.iterdir() if q.is_file() and q.suffix.lower() in IMG_EXTENSIONS)
            if not found:
                raise UserError(f"folder {p} holds no images (allowed extensions: {', '.join(IMG_EXTENSIONS)})")
            out += found
        elif p.is_file():
            out.append(path)
        else:
            raise UserError(f"image not found: {path}")
    return out


def run(args: argparse.Namespace) -> int:
    import torch
    from PIL import Image, UnidentifiedImageError

    from subquad.backend import precision_context, resolve_precision
    from subquad.engine.checkpoint import check_output_file, load_checkpointed_model, write_json
    from subquad.engine.classify import eval_transform
    from subquad.engine.distributed import resolve_device
    from subquad.layers.int8 import precision_model
    from subquad_cli.errors import UserError

    if args.topk < 1:
        raise UserError(f"--topk must be >= 1, got {args.topk}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    precision = resolve_precision(args.precision, resolve_device(args.device))
    images = expand_images(args.images)
    if args.json:  # before any work
        check_output_file(args.json, (".json",), (args.checkpoint, *images), "--json", overwrite=args.overwrite)
    device = resolve_device(args.device)
    _, model, side, dcfg, _ = load_checkpointed_model(args.checkpoint, args.model, args.img_size, device)
    model = precision_model(model, precision)
    classes = side.get("classes") or [str(i) for i in range(model.num_classes)]
    tf = eval_transform(dcfg)
    mode = "L" if dcfg["in_chans"] == 1 else "RGB"
    results, dt, skipped = [], 0.0, []
    # One autocast region for the whole run (each batch enters its own inside it): each fp32 weight is cast to
    # bf16 once, by autocast's weight cache, instead of once per batch.
    with precision_context(precision, device):
        for i in range(0, len(images), args.batch_size):
            batch, xs = [], []
            for path in images[i:i + args.batch_size]:
                try:
                    with Image.open(path) as im:
                        xs.append(tf(im.convert(mode)))
                    batch.append(path)
                except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
                    skipped.append((path, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__))
            if not batch:
                continue
            t0 = time.perf_counter()
            with torch.no_grad(), precision_context(precision, device):
                probs = model(torch.stack(xs).to(device)).float().softmax(dim=1).cpu()
            dt += time.perf_counter() - t0
            k = min(args.topk, probs.shape[1])
            for path, p in zip(batch, probs):
                vals, idx = p.topk(k)
                top = [{"class": classes[i] if i < len(classes) else str(i), "index": int(i), "prob": float(v)}
                       for v, i in zip(vals.tolist(), idx.tolist())]
                results.append({"image": path, "top": top})
                print(f"{path}: " + ", ".join(f"{t['class']} ({100 * t['prob']:.1f} %)" for t in top), flush=True)
    done = len(results)
    print(f"{done} image(s) in {dt * 1000:.1f} ms ({done / max(dt, 1e-9):.0f} images/s)")
    if args.json and results:
        write_json(results, args.json)
    if skipped:
        path, why = skipped[0]
        more = f", and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        raise UserError(f"skipped {len(skipped)} of {len(images)} image(s) that cannot be read: {path} ({why}){more}"
                        + ("; the others were predicted" if results else ""))
    return 0
