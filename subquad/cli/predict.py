"""`subquad predict`: top-5 classes for each image, with class names from the checkpoint's sidecar."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("predict", help="top-5 classes for images",
                       description="Classify images with a trained checkpoint; class names and the eval transform "
                       "come from the checkpoint's JSON sidecar (e.g. best.json beside best.safetensors).")
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--checkpoint", required=True, help="weights file (.safetensors or .pth)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--img-size", type=int, default=None, help="input side (default: the training size)")
    p.add_argument("--topk", type=int, default=5, help="classes to print per image")
    p.add_argument("--json", default=None, help="also write the predictions to this JSON file")
    p.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    p.set_defaults(func=run)
    return p


def _sidecar(ckpt: Path) -> dict[str, Any]:
    from subquad.engine.checkpoint import read_json, sidecar_path

    for cand in (sidecar_path(ckpt), ckpt.with_name(ckpt.stem.removesuffix("_ema") + ".json")):
        if cand.is_file():
            try:
                data = read_json(cand)
            except (OSError, json.JSONDecodeError) as e:
                from subquad.errors import UserError

                raise UserError(f"cannot read the sidecar {cand}: {e}") from None
            return data if isinstance(data, dict) else {}
    return {}


def load_checkpointed_model(name: str, ckpt: str | os.PathLike, img_size: int | None, device) -> tuple[Any, dict,
                                                                                                      dict]:
    """Build `name`, load `ckpt` safely (safetensors, or torch.load(weights_only=True)), return (model, sidecar,
    data config). A checkpoint of another model, or a pickle holding code, is a one-line UserError."""
    from subquad.engine.classify import build_model, check_img_size, model_input
    from subquad.errors import UserError
    from subquad.models import create_model
    from subquad.models._builder import load_into, read_state_dict

    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise UserError(f"checkpoint file not found: {ckpt}")
    sd = read_state_dict(ckpt)
    side = _sidecar(ckpt)
    if side.get("arch") and side["arch"] != name:
        raise UserError(f"checkpoint {ckpt} holds model {side['arch']!r}, not {name!r}; pass --model {side['arch']}")
    num_classes = side.get("num_classes")
    if num_classes is None:
        probe = create_model(name, device="meta")
        head = (getattr(probe, "pretrained_cfg", {}) or {}).get("classifier", "head")
        w = sd.get(f"{head}.weight")
        num_classes = int(w.shape[0]) if w is not None else int(getattr(probe, "num_classes", 1000))
    dcfg = dict(side.get("data_config") or {})
    train_size = dcfg.get("img_size")
    model = build_model(name, num_classes, img_size or train_size, device=device)
    load_into(model, sd, what=f"checkpoint {os.fspath(ckpt)!r}")
    model.eval()
    in_chans, size = model_input(model, img_size or train_size)
    if not dcfg:
        pc = getattr(model, "pretrained_cfg", {}) or {}
        dcfg = {"in_chans": in_chans, "mean": list(pc.get("mean", (0.485, 0.456, 0.406))),
                "std": list(pc.get("std", (0.229, 0.224, 0.225))), "interpolation": pc.get("interpolation", ""),
                "crop_pct": pc.get("crop_pct"), "aug": "timm", "source_aug": "timm", "native_size": None}
    dcfg["img_size"] = size
    check_img_size(model, name, in_chans, size, device)
    return model, side, dcfg


def run(args: argparse.Namespace) -> int:
    import torch
    from PIL import Image, UnidentifiedImageError

    from subquad.engine.checkpoint import write_json
    from subquad.engine.classify import eval_transform
    from subquad.engine.distributed import resolve_device
    from subquad.errors import UserError

    if args.topk < 1:
        raise UserError(f"--topk must be >= 1, got {args.topk}")
    for path in args.images:
        if not Path(path).is_file():
            raise UserError(f"image not found: {path}")
    device = resolve_device(args.device)
    model, side, dcfg = load_checkpointed_model(args.model, args.checkpoint, args.img_size, device)
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

        check_output_file(args.json, (".json",), (args.checkpoint, *args.images), "--json")
        write_json(results, args.json)
    return 0
