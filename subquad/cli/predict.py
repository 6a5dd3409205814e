"""`subquad predict`: top-5 classes for each image, with class names from the checkpoint's sidecar."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="top-5 classes for images",
                       description="Classify images with a trained checkpoint; the model, class names and the eval "
                       "transform come from the checkpoint's JSON sidecar (e.g. best.json beside best.safetensors).")
    p.add_argument("--checkpoint", required=True,
                   help="weights file (.safetensors or .pth) or a run directory (its best.safetensors)")
    p.add_argument("--model", default=None,
                   help="registered model name (default: the checkpoint sidecar's; required without a sidecar)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--img-size", type=int, default=None, help="input side (default: the training size)")
    p.add_argument("--topk", type=int, default=5, help="classes to print per image")
    p.add_argument("--json", default=None, help="also write the predictions to this JSON file")
    p.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import torch
    from PIL import Image, UnidentifiedImageError

    from subquad.engine.checkpoint import load_checkpointed_model, write_json
    from subquad.engine.classify import eval_transform
    from subquad.engine.distributed import resolve_device
    from subquad.errors import UserError

    if args.topk < 1:
        raise UserError(f"--topk must be >= 1, got {args.topk}")
    for path in args.images:
        if not Path(path).is_file():
            raise UserError(f"image not found: {path}")
    device = resolve_device(args.device)
    _, model, side, dcfg, ckpt = load_checkpointed_model(args.checkpoint, args.model, args.img_size, device)
    classes = side.get("classes") or [str(i) for i in range(model.num_classes)]
    tf = eval_transform(dcfg)
    mode = "L" if dcfg["in_chans"] == 1 else "RGB"
    xs = []
    for path in args.images:
        try:
            with Image.open(path) as im:
                xs.append(tf(im.convert(mode)))
        except (UnidentifiedImageError, OSError) as e:
            raise UserError(f"cannot read image {path}: {e}") from None
    t0 = time.perf_counter()
    with torch.no_grad():
        probs = model(torch.stack(xs).to(device)).float().softmax(dim=1).cpu()
    dt = time.perf_counter() - t0
    k = min(args.topk, probs.shape[1])
    results = []
    for path, p in zip(args.images, probs):
        vals, idx = p.topk(k)
        top = [{"class": classes[i] if i < len(classes) else str(i), "index": int(i), "prob": float(v)}
               for v, i in zip(vals.tolist(), idx.tolist())]
        results.append({"image": path, "top": top})
        print(f"{path}: " + ", ".join(f"{t['class']} ({100 * t['prob']:.1f} %)" for t in top))
    print(f"{len(xs)} image(s) in {dt * 1000:.1f} ms ({len(xs) / max(dt, 1e-9):.0f} images/s)")
    if args.json:
        from subquad.engine.checkpoint import check_output_file

        check_output_file(args.json, (".json",), (ckpt, *args.images), "--json")
        write_json(results, args.json)
    return 0
