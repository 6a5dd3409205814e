"""COCO and ADE20K readers, the synthetic generator, the transforms, and mAP / mIoU against hand-computed cases."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO

from subquad.dense.data import (
    ADE20KSegmentation,
    CocoDetection,
    detection_transforms,
    load_coco,
    open_dense_source,
    segmentation_transforms,
)
from subquad.dense.metrics import coco_map, confusion_matrix, detections_to_coco, segmentation_scores
from subquad.dense.synthetic import SYNTHETIC_CLASSES, generate_synthetic
from subquad.errors import UserError


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    return generate_synthetic(tmp_path_factory.mktemp("synth"), seed=3, n_train=4, n_val=3, size=(40, 56),
                              min_r=5, max_r=10)


def test_synthetic_is_seeded(synth, tmp_path):
    again = generate_synthetic(tmp_path, seed=3, n_train=4, n_val=3, size=(40, 56), min_r=5, max_r=10)
    for rel in ("coco/annotations/instances_train.json", "coco/val/000002.png",
                "ade20k/annotations/validation/000001.png"):
        assert (synth / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_coco_reader_round_trips_a_generated_file(synth):
    ann = synth / "coco" / "annotations" / "instances_train.json"
    ds = CocoDetection(ann, synth / "coco" / "train", with_masks=True)
    ref = COCO(str(ann))
    assert ds.classes == list(SYNTHETIC_CLASSES) and len(ds) == 4
    rebuilt = []
    for i in range(len(ds)):
        img, t = ds[i]
        assert img.shape == (3, 40, 56) and img.dtype == torch.uint8
        for k in range(len(t["labels"])):
            x0, y0, x1, y1 = t["boxes"][k].tolist()
            m = t["masks"][k].numpy()
            rebuilt.append({"image_id": t["image_id"], "category_id": ds.label_to_cat[int(t["labels"][k])],
                            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float(m.sum()), "mask": m})
    orig = [a for a in ref.dataset["annotations"]]
    assert len(rebuilt) == len(orig) > 0
    for r, a in zip(rebuilt, orig):
        assert r["image_id"] == a["image_id"] and r["category_id"] == a["category_id"]
        np.testing.assert_allclose(r["bbox"], a["bbox"], atol=1e-4)
        assert r["area"] == a["area"]
        np.testing.assert_array_equal(r["mask"], ref.annToMask(a))
        # The box is the mask's tight extent.
        ys, xs = np.nonzero(r["mask"])
        assert [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()] == a["bbox"]


def test_ade_twin_matches_the_instances(synth):
    coco = CocoDetection(synth / "coco" / "annotations" / "instances_val.json", synth / "coco" / "val")
    ade = ADE20KSegmentation(synth / "ade20k", "validation", 4)
    src = open_dense_source(f"synthetic:{synth}", "segment")
    assert src.classes == ["background", *SYNTHETIC_CLASSES] and src.val_split == "validation"
    for i in range(len(coco)):
        img, t = coco[i]
        img2, lab = ade[i]
        assert torch.equal(img, img2)
        expect = torch.zeros(40, 56, dtype=torch.int64)
        for m, c in zip(t["masks"], t["labels"]):
            expect[m.bool()] = int(c)
        assert torch.equal(lab, expect)


def test_not_coco(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"images": [], "categories": []}))
    with pytest.raises(UserError, match=r"x.json is not COCO instances JSON \(no 'annotations' list\)"):
        load_coco(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(UserError, match="is not COCO instances JSON"):
        load_coco(bad)
    bad.write_text("not json")
    with pytest.raises(UserError, match="is not COCO instances JSON"):
        load_coco(bad)


def test_label_png_out_of_range(tmp_path):
    for d in ("images/training", "annotations/training"):
        (tmp_path / d).mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "images/training/a.png")
    lab = np.ones((8, 8), np.uint8)
    lab[0, 0] = 9
    Image.fromarray(lab).save(tmp_path / "annotations/training/a.png")
    ds = ADE20KSegmentation(tmp_path, "training", 4)
    with pytest.raises(UserError, match=r"a.png holds class value 9, outside 0..4"):
        ds[0]
    lab[0, 0] = 255
    Image.fromarray(lab).save(tmp_path / "annotations/training/a.png")
    _, y = ds[0]
    assert int(y[0, 0]) == 255 and int(y[1, 1]) == 0


def test_transforms_move_boxes_masks_and_labels_together(synth):
    tf_train = segmentation_transforms(True, (40, 56), (0.5, 2.0), (32, 32), hflip=1.0)
    ds = ADE20KSegmentation(synth / "ade20k", "training", 4, tf_train)
    torch.manual_seed(0)
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y.shape == (32, 32)
    assert set(torch.unique(y).tolist()) <= {0, 1, 2, 3, 255}
    det = CocoDetection(synth / "coco" / "annotations" / "instances_train.json", synth / "coco" / "train",
                        transforms=None)
    img, t = det[0]
    img2, t2 = detection_transforms(True, hflip=1.0)(img, t)
    assert img2.dtype == torch.float32 and float(img2.max()) <= 1.0
    # A flip maps x0 -> W - x1, and the masks flip with the boxes.
    np.testing.assert_allclose(t2["boxes"][:, 0].numpy(), (56 - t["boxes"][:, 2]).numpy(), atol=1e-5)
    assert torch.equal(t2["masks"], t["masks"].flip(-1))


def _gt(boxes):
    return {"images": [{"id": 1, "height": 100, "width": 100, "file_name": "a.png"}],
            "annotations": [{"id": i + 1, "image_id": 1, "category_id": 7, "bbox": b, "area": b[2] * b[3],
                             "iscrowd": 0} for i, b in enumerate(boxes)],
            "categories": [{"id": 7, "name": "thing"}]}


def test_map_hand_case(tmp_path):
    """Two ground-truth boxes A, B; detections: A exactly (score 0.9), a false positive (0.8), B at IoU 2/3 (0.7).

    Where B is matched (IoU thresholds 0.50 .. 0.65, four of them) the ranked hits are (TP, FP, TP): precision 1 up to
    recall 1/2 and 2/3 beyond, so the 101-point AP is (51 * 1 + 50 * 2/3) / 101. At the six thresholds 0.70 .. 0.95 B
    is missed: AP = 51 / 101 (precision 1 up to recall 1/2, then nothing).
    """
    f = tmp_path / "gt.json"
    f.write_text(json.dumps(_gt([[10, 10, 20, 20], [50, 50, 20, 20]])))
    coco = load_coco(f)
    # B' = [54, 50, 74, 70] (XYXY) against B = [50, 50, 70, 70]: overlap 16 x 20, union 2 * 400 - 320.
    outputs = [{"boxes": torch.tensor([[10.0, 10, 30, 30], [80, 0, 95, 15], [54, 50, 74, 70]]),
                "scores": torch.tensor([0.9, 0.8, 0.7]), "labels": torch.tensor([1, 1, 1])}]
    from torchvision.ops import box_iou

    assert float(box_iou(torch.tensor([[50.0, 50, 70, 70]]), outputs[0]["boxes"][2:])) == pytest.approx(2 / 3)
    res = detections_to_coco(outputs, [1], {1: 7})
    assert res[2]["bbox"] == [54.0, 50.0, 20.0, 20.0] and res[0]["category_id"] == 7
    m = coco_map(coco, res, "bbox")
    ap_hit, ap_miss = Fraction(51 + 50 * Fraction(2, 3), 101), Fraction(51, 101)
    expected = (4 * ap_hit + 6 * ap_miss) / 10
    assert m["mAP50"] == pytest.approx(float(ap_hit), abs=1e-6)
    assert m["mAP"] == pytest.approx(float(expected), abs=1e-6)
    assert coco_map(coco, [], "bbox") == {"mAP": 0.0, "mAP50": 0.0}


def test_miou_hand_case():
    target = torch.tensor([[0, 0, 1], [1, 2, 255]])
    pred = torch.tensor([[0, 1, 1], [1, 1, 0]])
    cm = confusion_matrix(pred, target, 4)
    # class 0: TP 1, FN 1 (a 0 predicted 1), FP 0 -> 1/2; class 1: TP 2, FP 2 (a 0 and the 2), FN 0 -> 2/4;
    # class 2: TP 0, FN 1 -> 0; class 3: absent everywhere -> left out. aAcc = 3 / 5.
    s = segmentation_scores(cm)
    assert s["IoU"] == [0.5, 0.5, 0.0, None]
    assert s["mIoU"] == pytest.approx(1 / 3)
    assert s["aAcc"] == pytest.approx(3 / 5)


class _Oracle(torch.nn.Module):
    """Returns each image's ground truth as detections (score 1): mAP 1 exactly when every image is evaluated."""

    kind = "fasterrcnn"

    def __init__(self, ds):
        super().__init__()
        self.by_size = {}
        for i in range(len(ds)):
            img, t = ds[i]
            self.by_size[img.float().sum().item()] = t

    def forward(self, images):
        out = []
        for im in images:
            t = self.by_size[im.float().sum().item()]
            out.append({"boxes": t["boxes"].float(), "labels": t["labels"], "scores": torch.ones(len(t["labels"]))})
        return out


def _rank_eval(rank, world, port, root, q):
    import os

    import torch.distributed as dist

    from subquad.dense.engine import evaluate_detection
    from subquad.engine.distributed import DistInfo

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ds = CocoDetection(root / "coco" / "annotations" / "instances_val.json", root / "coco" / "val")
        info = DistInfo(rank, world, rank, torch.device("cpu"), True)
        q.put((rank, evaluate_detection(_Oracle(ds), ds, torch.device("cpu"), info, batch_size=1)))
    finally:
        dist.destroy_process_group()


def test_detection_eval_gathers_every_rank(synth):
    """Two ranks each see half of the validation images; the gathered COCOeval still scores all of them."""
    import socket

    import torch.multiprocessing as mp

    ds = CocoDetection(synth / "coco" / "annotations" / "instances_val.json", synth / "coco" / "val")
    from subquad.dense.engine import evaluate_detection

    assert evaluate_detection(_Oracle(ds), ds, torch.device("cpu"), batch_size=1) == \
        {"bbox_mAP": 1.0, "bbox_mAP50": 1.0}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_eval, args=(r, 2, port, synth, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got[0] == got[1] == {"bbox_mAP": 1.0, "bbox_mAP50": 1.0}
