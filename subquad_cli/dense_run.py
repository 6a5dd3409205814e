"""The eval and predict halves of `subquad detect` / `subquad segment` (imported only when a command runs)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from subquad.dense.data import detection_transforms, open_dense_source, read_rgb, segmentation_transforms
from subquad.dense.engine import _subset, evaluate_detection, evaluate_segmentation, load_dense_run
from subquad.engine.checkpoint import check_output_file, refuse_existing_output, sidecar_path, write_json
from subquad.engine.distributed import cleanup, init_distributed
from subquad_cli.config import write_result_keeping
from subquad_cli.errors import UserError

__all__ = ["evaluate_run", "predict_run", "RESULT_KEYS", "palette"]

RESULT_KEYS = {"maskrcnn": ("bbox_mAP", "bbox_mAP50", "segm_mAP", "segm_mAP50"),
               "fasterrcnn": ("bbox_mAP", "bbox_mAP50"), "retinanet": ("bbox_mAP", "bbox_mAP50"),
               "semantic_fpn": ("mIoU", "aAcc"), "upernet": ("mIoU", "aAcc")}


def _is_results(p: Path) -> bool:
    """An existing file we may replace: a JSON object holding only result keys."""
    import json

    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError):
        return False
    keys = {k for v in RESULT_KEYS.values() for k in v}
    return isinstance(obj, dict) and bool(obj) and set(obj) <= keys


def evaluate_run(args: argparse.Namespace) -> int:
    """`subquad <task> eval`: metrics of a run on a split, written to <run>/results.json (and --results-file)."""
    task = args.task
    if args.batch_size < 1 or args.limit < 0:
        raise UserError(f"need --batch-size >= 1 and --limit >= 0 (0: all images), got {args.batch_size} and "
                        f"{args.limit}")
    if args.results_file:  # before any work: an existing file is replaced only with --overwrite
        refuse_existing_output(args.results_file, "--results-file", getattr(args, "overwrite", False))
    info = init_distributed(args.device)
    try:
        model, side, cfg, weights = load_dense_run(args.checkpoint, task, info.device)
        spec = args.data or cfg.data
        source = open_dense_source(spec, task, cfg.seed)
        if side.get("classes") and side["classes"] != source.classes:
            raise UserError(f"the run's classes ({len(side['classes'])}: {', '.join(side['classes'][:3])}, ...) differ "
                            f"from those of --data {spec!r} ({len(source.classes)})")
        split = args.split or source.val_split
        kind = side["kind"]
        t0 = time.perf_counter()
        if task == "detect":
            ds = _subset(source.detection(split, detection_transforms(False), kind == "maskrcnn"), args.limit,
                         cfg.seed)
            metrics: dict[str, Any] = evaluate_detection(model, ds, info.device, info, args.batch_size)
        else:
            num_classes = int(side["num_classes"])
            ds = _subset(source.segmentation(split, num_classes, segmentation_transforms(
                False, cfg.scale, cfg.ratio_range, cfg.crop_size)), args.limit, cfg.seed)
            metrics = evaluate_segmentation(model, ds, info.device, num_classes, info)
        dt = time.perf_counter() - t0
        if not info.is_main:
            return 0
        results = {k: float(metrics[k]) for k in RESULT_KEYS[kind]}
        run_dir = weights.parent
        protect = (weights, sidecar_path(weights))
        overwrite = getattr(args, "overwrite", False)
        # The run's own files keep an earlier, different result (another split, --limit or --data): the new one
        # goes to the next numbered name unless --overwrite.
        extra = check_output_file(args.results_file, (".json",), protect, "--results-file", _is_results) \
            if args.results_file else None  # refused before anything is written
        res, note = write_result_keeping(run_dir / "results.json", results, overwrite)
        targets = [res]
        if extra is not None:
            write_json(results, extra)
            targets.append(extra)
        detail = {"task": task, "kind": kind, "backbone": side.get("arch"), "checkpoint": os.fspath(weights),
                  "data": spec, "split": split, "images": len(ds), "limit": args.limit or None,
                  "seconds": round(dt, 2), **results}
        if "IoU" in metrics:
            detail["IoU"] = dict(zip(side.get("classes") or range(len(metrics["IoU"])), metrics["IoU"]))
        det, _ = write_result_keeping(run_dir / f"results-{split}.detail.json", detail, overwrite,
                                      ("seconds", "checkpoint"))
        shown = "  ".join(f"{k} {v:.4f}" for k, v in results.items())
        print(f"{kind} {side.get('arch')} on {spec} [{split}, {len(ds)} images]: {shown}  ({dt:.1f} s)")
        print(f"results: {', '.join(os.fspath(t) for t in targets)}{note}; details: {det}")
        return 0
    finally:
        cleanup(info)


def palette(n: int) -> np.ndarray:
    """(n, 3) uint8 distinct colours (the PASCAL VOC bit-interleaving palette)."""
    pal = np.zeros((n, 3), np.uint8)
    for i in range(n):
        c, r, g, b = i + 1, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        pal[i] = (r, g, b)
    return pal


def _check_out_dir(out: Path, files: list[str], overwrite: bool) -> None:
    """Refuse an --out-dir that is a file, or that holds one of the prediction `files` unless --overwrite: only what
    would actually be replaced is refused (a second predict of other images into the same folder is fine)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out-dir {out} is a file, not a folder; choose another --out-dir (nothing was written)")
    there = [f for f in files if (out / f).exists()]
    if there and not overwrite:
        more = f" (and {len(there) - 1} more)" if len(there) > 1 else ""
        raise UserError(f"--out-dir {out} already holds {there[0]}{more}, a prediction of an image of the same name; "
                        "pass --overwrite to replace it, or choose another --out-dir (nothing was written)")


def _save_png(arr: np.ndarray, path: Path, protect: tuple) -> None:
    from PIL import Image

    from subquad.files import atomic_write

    check_output_file(path, (".png",), protect, "prediction", lambda p: True)
    atomic_write(path, lambda tmp: Image.fromarray(arr).save(tmp, format="PNG"))


@torch.no_grad()
def predict_run(args: argparse.Namespace) -> int:
    """`subquad <task> predict`: drawn PNG (+ JSON for detect, label PNG for segment) per image."""
    from subquad.engine.distributed import resolve_device

    task, device = args.task, resolve_device(args.device)
    inputs = [Path(p) for p in args.images]
    seen: dict[str, Path] = {}
    for path in inputs:  # every input before anything is loaded or written
        if not path.is_file():
            raise UserError(f"image not found: {path}")
        if path.stem in seen:
            raise UserError(f"{seen[path.stem]} and {path} would write the same predictions ({path.stem}.pred.png); "
                            "predict them into separate --out-dir folders")
        seen[path.stem] = path
    files = [f"{p.stem}{s}" for p in inputs for s in (".pred.png", ".pred.json" if task == "detect" else ".label.png")]
    overwrite = getattr(args, "overwrite", False)
    if args.out_dir:  # before the model is loaded
        _check_out_dir(Path(args.out_dir), files, overwrite)
    model, side, cfg, weights = load_dense_run(args.checkpoint, task, device)
    classes = list(side.get("classes") or [])
    out = Path(args.out_dir) if args.out_dir else weights.parent / "predict"
    _check_out_dir(out, files, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    protect = tuple(inputs) + (weights, sidecar_path(weights))
    pal = palette(max(len(classes), int(side["num_classes"])) + 1)
    for path in inputs:
        img = read_rgb(path)
        if task == "detect":
            from pycocotools import mask as mask_utils
            from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

            fb = model.backbone.body
            fb.check_size(*img.shape[-2:])
            o = model([img.float().div(255).to(device)])[0]
            keep = o["scores"] >= args.score_thresh
            o = {k: v[keep].cpu() for k, v in o.items()}
            names = [classes[int(lab) - 1] if 0 < int(lab) <= len(classes) else str(int(lab)) for lab in o["labels"]]
            colours = [tuple(int(c) for c in pal[int(lab) % len(pal)]) for lab in o["labels"]]
            drawn = img
            dets: list[dict[str, Any]] = []
            masks = (o["masks"][:, 0] > 0.5) if "masks" in o else None
            if masks is not None and len(masks):
                drawn = draw_segmentation_masks(drawn, masks, alpha=0.45, colors=colours)
            if len(o["boxes"]):
                drawn = draw_bounding_boxes(drawn, o["boxes"], [f"{n} {s:.2f}" for n, s in zip(names, o["scores"])],
                                            colors=colours, width=2)
            for k in range(len(o["boxes"])):
                d = {"category": names[k], "label": int(o["labels"][k]), "score": round(float(o["scores"][k]), 4),
                     "box": [round(v, 2) for v in o["boxes"][k].tolist()]}
                if masks is not None:
                    rle = mask_utils.encode(np.asfortranarray(masks[k].numpy().astype(np.uint8)))
                    d["mask"] = {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}
                dets.append(d)
            _save_png(drawn.permute(1, 2, 0).numpy(), out / f"{path.stem}.pred.png", protect)
            jpath = check_output_file(out / f"{path.stem}.pred.json", (".json",), protect, "prediction",
                                      lambda p: True)
            write_json({"image": os.fspath(path), "height": int(img.shape[1]), "width": int(img.shape[2]),
                        "detections": dets}, jpath)
            print(f"{path}: {len(dets)} detection(s) -> {out / (path.stem + '.pred.png')}")
        else:
            import torch.nn.functional as F
            from torchvision import tv_tensors

            tf = segmentation_transforms(False, cfg.scale, cfg.ratio_range, cfg.crop_size)
            x = tf(tv_tensors.Image(img))
            logits = model(x[None].to(device))["out"].float()
            pred = F.interpolate(logits, size=tuple(img.shape[-2:]), mode="bilinear", align_corners=False)
            pred = pred.argmax(1)[0].cpu().numpy()
            overlay = (0.5 * img.permute(1, 2, 0).numpy() + 0.5 * pal[pred]).astype(np.uint8)
            _save_png(overlay, out / f"{path.stem}.pred.png", protect)
            _save_png((pred + 1).astype(np.uint8), out / f"{path.stem}.label.png", protect)
            present = [classes[c] if c < len(classes) else str(c) for c in np.unique(pred)]
            print(f"{path}: classes {', '.join(present)} -> {out / (path.stem + '.pred.png')}")
    return 0
