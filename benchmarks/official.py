"""Our models beside the official implementations on CPU: the same logits from the official weights, and the speed.

Issue target: "the same logits (fp32 relative error < 1e-5) at 1.2x the official speed or better".

Protocol, per model (defaults: batch 1, 224 px, fp32, CPU, torch's thread count):
1. The official model is built from its checkout (`tests/_official.py`, `build_official`: the official configs) after
   `torch.manual_seed(--seed)`, in eval mode. Its own init is random (truncated-normal weights); every tensor that
   init leaves constant (biases, norm weights, FLatten `scale` / `positional_encoding`, L2ViT temperatures,
   BatchNorm statistics) is then perturbed from the same seed (zeros -> N(0, 0.2^2), a constant c -> c * U(0.5, 1.5)),
   so that no branch is an identity. Its `state_dict()` is the "official checkpoint".
2. Ours: `subquad.create_model(name, img_size=...)`, the checkpoint through the family's `remap_official` and
   `load_into(..., strict=True)` (every key of ours loaded, nothing unexpected; `keys_dropped` counts the official
   keys the remap drops on purpose: recomputed buffers, FLatten-PVT's unused final norm).
3. Logits on one fixed random batch: logits_rel_err = ||ours - official|| / ||official|| (float64 norms of the
   fp32 logits); parity_ok = logits_rel_err < 1e-5.
4. Timing under torch.no_grad: --warmup calls of each, then --rounds rounds, each timing one official forward and
   then one of ours (interleaved A/B/A/B, so load changes on the machine hit both). ours_ms / official_ms are
   medians, *_min_ms minima; speedup = official_ms / ours_ms (> 1: ours is faster), speedup_min from the minima;
   target_met = parity_ok and speedup >= 1.2.

Needs SUBQUAD_OFFICIAL_ROOT (or --official-root): the folder holding L2ViT/, FLatten-Transformer/, transformer-ls/.
Exit status: 0 when every model matched, 1 when one did not (or failed to run; its row says why), 2 on a usage error
(one line on stderr, nothing written). Speed below the target is reported, not an error.

Usage (from the repository root):
    SUBQUAD_OFFICIAL_ROOT=/work/official python benchmarks/official.py   # -> results/official-speed-<hw>.csv
    python benchmarks/official.py --model flatten_pvt_v2_b1 --rounds 5 --batch-size 8 --threads 1 --out x.csv
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import subquad  # noqa: E402
from subquad.errors import UserError  # noqa: E402
from subquad.models._builder import load_into  # noqa: E402
from tests._official import OFFICIAL_NAMES, build_official, official_files, quiet  # noqa: E402

DEFAULT_MODELS = ["l2vit_tiny", "flatten_swin_tiny", "flatten_pvt_tiny", "flatten_pvt_v2_b1", "flatten_cswin_tiny",
                  "vil_ls_medium"]
COLUMNS = ["model", "img_size", "batch_size", "logits_rel_err", "parity_ok", "ours_ms", "official_ms", "speedup",
           "ours_min_ms", "official_min_ms", "speedup_min", "target_met", "rounds", "warmup", "params",
           "keys_dropped", "threads", "torch", "subquad", "device", "status"]
REL_ERR_MAX = 1e-5
SPEEDUP_TARGET = 1.2


def randomise_(model: torch.nn.Module, seed: int) -> None:
    """Perturb, in place, every parameter and BatchNorm statistic that holds one constant value (see the protocol)."""
    g = torch.Generator().manual_seed(seed)
    tensors = list(model.named_parameters())
    tensors += [(n, b) for n, b in model.named_buffers() if n.endswith(("running_mean", "running_var"))]
    with torch.no_grad():
        for _, t in tensors:
            if not t.is_floating_point() or t.numel() == 0:
                continue
            c = t.reshape(-1)[0]
            if not torch.all(t == c):
                continue
            if c == 0:
                t.copy_(torch.randn(t.shape, generator=g) * 0.2)
            else:
                t.mul_(torch.empty(t.shape).uniform_(0.5, 1.5, generator=g))


def _ours(name: str, img_size: int) -> torch.nn.Module:
    kwargs = {"img_size": img_size}
    if name.startswith("flatten_swin"):
        # The official Swin rule for softmax-window stages: 7, or 12 when the focused window (stage grid) exceeds 56.
        kwargs["window_size"] = 7 if img_size // 4 <= 56 else 12
    return subquad.create_model(name, **kwargs).eval()


def _transfer(official: torch.nn.Module, ours: torch.nn.Module) -> int:
    """Official state dict -> ours through the family's remap_official, strictly; returns the keys it dropped."""
    remap = sys.modules[type(ours).__module__].remap_official
    official_sd = official.state_dict()
    sd = remap({"model": official_sd}, ours)
    load_into(ours, sd, strict=True, what="official state dict")
    return len(set(official_sd) - set(sd))


def _time_pair(official: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor, rounds: int,
               warmup: int) -> dict[str, list[float]]:
    from subquad.bench.timing import time_interleaved

    with torch.no_grad(), quiet():
        return time_interleaved({"official": lambda: official(x), "ours": lambda: ours(x)}, rounds, warmup)


class StageError(RuntimeError):
    """A step of one model's comparison failed; the message names the step."""


def _stage(label: str, fn):
    try:
        return fn()
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise StageError(f"{label} failed: {type(e).__name__}: {msg}") from e


def bench_one(root: str, name: str, args: argparse.Namespace) -> dict:
    """Parity and interleaved timing of one model; returns its CSV row."""
    row = {"model": name, "img_size": args.img_size, "batch_size": args.batch_size, "rounds": args.rounds,
           "warmup": args.warmup}
    torch.manual_seed(args.seed)
    official = _stage("official build", lambda: build_official(root, name, img_size=args.img_size).eval())
    randomise_(official, args.seed)
    ours = _stage("our build", lambda: _ours(name, args.img_size))
    row["keys_dropped"] = _stage("weight transfer", lambda: _transfer(official, ours))
    row["params"] = sum(p.numel() for p in ours.parameters())
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size,
                    generator=torch.Generator().manual_seed(args.seed + 1))
    with torch.no_grad(), quiet():
        want = _stage("official forward", lambda: official(x))
        got = _stage("our forward", lambda: ours(x))
    if got.shape != want.shape or got.dtype != torch.float32 or want.dtype != torch.float32:
        raise StageError(f"logits differ in shape/dtype: ours {tuple(got.shape)} {got.dtype}, official "
                         f"{tuple(want.shape)} {want.dtype}")
    rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
    row["logits_rel_err"] = f"{rel:.3e}"
    row["parity_ok"] = int(rel < REL_ERR_MAX)
    t = _time_pair(official, ours, x, args.rounds, args.warmup)
    ours_ms, off_ms = statistics.median(t["ours"]) * 1e3, statistics.median(t["official"]) * 1e3
    ours_min, off_min = min(t["ours"]) * 1e3, min(t["official"]) * 1e3
    row.update(ours_ms=f"{ours_ms:.2f}", official_ms=f"{off_ms:.2f}", speedup=f"{off_ms / ours_ms:.3f}",
               ours_min_ms=f"{ours_min:.2f}", official_min_ms=f"{off_min:.2f}", speedup_min=f"{off_min / ours_min:.3f}",
               target_met=int(rel < REL_ERR_MAX and off_ms / ours_ms >= SPEEDUP_TARGET),
               status="ok" if rel < REL_ERR_MAX else f"logits differ: relative error {rel:.2e} >= {REL_ERR_MAX:g}")
    return row


def _earlier_output(path: Path) -> bool:
    with open(path, errors="replace") as f:
        return f.readline().strip().startswith(",".join(COLUMNS[:4]))


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=DEFAULT_MODELS, metavar="NAME",
                   help=f"models to compare (default: {' '.join(DEFAULT_MODELS)})")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15, help="timed official/ours pairs per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each model first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--official-root", default=os.environ.get("SUBQUAD_OFFICIAL_ROOT", ""),
                   help="official checkouts (default: $SUBQUAD_OFFICIAL_ROOT)")
    p.add_argument("--out", default=None, help="CSV (default: benchmarks/results/official-speed-<hw>.csv)")
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> Path:
    """Validate everything before any model is built; returns the output path."""
    from subquad.bench.sweep import device_tag
    from subquad.engine.checkpoint import check_output_file

    if not args.official_root:
        raise UserError("SUBQUAD_OFFICIAL_ROOT is not set (or pass --official-root): it must name the folder "
                        "holding L2ViT/, FLatten-Transformer/ and transformer-ls/")
    if not Path(args.official_root).is_dir():
        raise UserError(f"official root {args.official_root} is not a folder")
    for name, value, low in (("--img-size", args.img_size, 32), ("--batch-size", args.batch_size, 1),
                             ("--rounds", args.rounds, 1), ("--warmup", args.warmup, 0)):
        if value < low:
            raise UserError(f"{name} must be >= {low}, got {value}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    known = set(subquad.list_models())
    for name in args.model:
        if name not in OFFICIAL_NAMES or name not in known:
            raise UserError(f"no official counterpart for model {name!r}; choose from {', '.join(OFFICIAL_NAMES)}")
        official_files(args.official_root, name)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"official-speed-{device_tag('cpu')}.csv"
    return check_output_file(out, (".csv",), (), "--out", overwrite_if=_earlier_output)


def main(argv: list[str] | None = None) -> int:
    from subquad.bench.sweep import device_tag, write_csv
    from subquad.version import __version__

    args = _args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        out = _check(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = {"threads": torch.get_num_threads(), "torch": torch.__version__, "subquad": __version__,
           "device": device_tag("cpu")}
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, {args.img_size} px, batch {args.batch_size}, {args.rounds} rounds -> {out}",
          flush=True)
    print(f"{'model':20s} {'rel_err':>10s} {'ours_ms':>9s} {'offic_ms':>9s} {'speedup':>8s} {'(min)':>7s}", flush=True)
    rows = []
    for name in args.model:
        try:
            row = {**bench_one(args.official_root, name, args), **env}
        except Exception as e:  # one model failing (build, load, forward) must not lose the others' rows
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            msg = msg if isinstance(e, StageError) else f"{type(e).__name__}: {msg}"
            row = {"model": name, "img_size": args.img_size, "batch_size": args.batch_size, "parity_ok": 0,
                   "target_met": 0, **env, "status": f"error: {msg}"}
        rows.append(row)
        write_csv(rows, out, COLUMNS)
        if row.get("speedup"):
            print(f"{name:20s} {row['logits_rel_err']:>10s} {row['ours_ms']:>9s} {row['official_ms']:>9s} "
                  f"{row['speedup']:>8s} {row['speedup_min']:>7s}" + ("" if row["status"] == "ok"
                                                                    else f"  [{row['status']}]"), flush=True)
        else:
            print(f"{name:20s} [{row['status']}]", flush=True)
    failed = [r["model"] for r in rows if not r.get("parity_ok")]
    slow = [r["model"] for r in rows if r.get("parity_ok") and not r.get("target_met")]
    print(f"wrote {out}; logits match (< {REL_ERR_MAX:g}): {len(rows) - len(failed)}/{len(rows)}; speedup >= "
          f"{SPEEDUP_TARGET}: {sum(int(r.get('target_met', 0)) for r in rows)}/{len(rows)}"
          + (f"; below target: {', '.join(slow)}" if slow else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
