"""COCO box/mask mAP through pycocotools' COCOeval, and mIoU / pixel accuracy from a confusion matrix.

mAP is COCOeval's stats[0] (AP averaged over IoU 0.50:0.05:0.95, all areas, 100 detections) and stats[1] (AP at IoU
0.5), as fractions. mIoU follows mmsegmentation: IoU_k = TP_k / (TP_k + FP_k + FN_k) per class, classes whose union is
empty are left out of the mean; aAcc = correctly labelled pixels / labelled pixels (ignored pixels left out).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["detections_to_coco", "coco_map", "confusion_matrix", "segmentation_scores"]


def detections_to_coco(outputs: Sequence[Mapping[str, torch.Tensor]], image_ids: Sequence[int],
                       label_to_cat: Mapping[int, int], mask_threshold: float = 0.5) -> list[dict[str, Any]]:
    """torchvision detector outputs -> COCO result dicts (bbox XYWH, score, category_id, RLE segmentation).

    Shapes:
        outputs[i]['boxes']: (K, 4) XYXY; ['scores'], ['labels']: (K,); ['masks'] (optional): (K, 1, H, W) in [0, 1].
    """
    from pycocotools import mask as mask_utils

    res: list[dict[str, Any]] = []
    for out, img_id in zip(outputs, image_ids):
        boxes = out["boxes"].detach().float().cpu()
        scores = out["scores"].detach().float().cpu().tolist()
        labels = out["labels"].detach().cpu().tolist()
        rles = None
        if "masks" in out:
            m = (out["masks"].detach().cpu()[:, 0] > mask_threshold).numpy().astype(np.uint8)
            rles = mask_utils.encode(np.asfortranarray(m.transpose(1, 2, 0))) if len(m) else []
        for k in range(len(scores)):
            x0, y0, x1, y1 = boxes[k].tolist()
            r = {"image_id": int(img_id), "category_id": int(label_to_cat[int(labels[k])]),
                 "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(scores[k])}
            if rles is not None:
                rle = dict(rles[k])
                rle["counts"] = rle["counts"].decode("ascii")
                r["segmentation"] = rle
            res.append(r)
    return res


def coco_map(coco_gt, results: list[dict[str, Any]], iou_type: str = "bbox",
             img_ids: Sequence[int] | None = None) -> dict[str, float]:
    """COCOeval of `results` against `coco_gt` (a pycocotools COCO); {'mAP', 'mAP50'} as fractions in [0, 1].

    No detections at all give 0.0 (COCOeval cannot load an empty result list).
    """
    from pycocotools.cocoeval import COCOeval

    if not results:
        return {"mAP": 0.0, "mAP50": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        dt = coco_gt.loadRes([dict(r) for r in results])
        ev = COCOeval(coco_gt, dt, iou_type)
        if img_ids is not None:
            ev.params.imgIds = sorted(int(i) for i in img_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    # COCOeval reports -1 where no ground truth exists: count it as 0.
    return {"mAP": max(0.0, float(ev.stats[0])), "mAP50": max(0.0, float(ev.stats[1]))}


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
                     ignore_index: int = 255) -> torch.Tensor:
    """(K, K) int64 counts, rows = true class, columns = predicted; ignored pixels left out.

    Shapes:
        pred, target: same shape, int; target in [0, K) or ignore_index.
    """
    t = target.reshape(-1).long()
    p = pred.reshape(-1).long()
    keep = t != ignore_index
    t, p = t[keep], p[keep]
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
        raise ValueError(f"target classes must lie in [0, {num_classes}) or be {ignore_index}")
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def segmentation_scores(cm: torch.Tensor) -> dict[str, Any]:
    """mIoU, aAcc (fractions) and the per-class IoU list (None where the class has an empty union)."""
    cm = cm.double()
    tp = cm.diag()
    union = cm.sum(0) + cm.sum(1) - tp
    valid = union > 0
    iou = torch.where(valid, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    total = cm.sum()
    return {"mIoU": float(iou[valid].mean()) if valid.any() else 0.0,
            "aAcc": float(tp.sum() / total) if total > 0 else 0.0,
            "IoU": [None if not v else float(x) for x, v in zip(iou.tolist(), valid.tolist())]}
