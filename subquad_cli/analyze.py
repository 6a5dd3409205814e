"""`subquad analyze`: what attention sees - maps of query points, Grad-CAM, rank, entropy, locality, kernels."""

from __future__ import annotations

import argparse
from pathlib import Path

from subquad_cli.recipes import LIBRARY_ROOT
from subquad_cli.sizes import square_side


def _query(text: str) -> tuple[float, float]:
    try:
        x, y = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a query point is x,y as fractions of the image, got {text!r}") from None
    return x, y


def sample_image() -> Path:
    """The bundled sample photograph (subquad/assets/, see its README)."""
    return LIBRARY_ROOT / "assets" / "chelsea.png"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("analyze", help="attention maps, Grad-CAM, rank/entropy/locality per layer, LiSA kernels",
                       description="Analyse a model's attention on one image: maps of query points per layer "
                       "(overlaid), Grad-CAM of the predicted class, per-layer rank of the equivalent attention "
                       "matrix, entropy, locality and token similarity across depth (table + plot), and LiSA "
                       "kernels. Writes PNGs, layer_stats.csv and summary.json to --out.")
    p.add_argument("--model", default=None,
                   help="registered model name (default: the checkpoint sidecar's; required without --checkpoint)")
    p.add_argument("--checkpoint", default=None,
                   help="weights (.safetensors or official .pth) or a run directory (its best.safetensors); "
                   "the sidecar supplies the model, classes and eval transform (default: untrained)")
    p.add_argument("--image", default=None, help="image file (default: the bundled sample, subquad/assets)")
    p.add_argument("--out", required=True, help="output folder (refused if not empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into --out even if it is a folder that is not empty (its files of the same names "
                   "are replaced)")
    p.add_argument("--img-size", type=square_side, default=None, metavar="S",
                   help="square input side (default: the training size, else the model's, at most 224)")
    p.add_argument("--layers", type=int, nargs="+", default=None, metavar="I",
                   help="attention layers (call order, negative from the end) for maps and kernels "
                   "(default: up to 4 spread over depth)")
    p.add_argument("--queries", type=_query, nargs="+", default=None, metavar="X,Y",
                   help="query points as fractions of the image (default: 0.5,0.5 0.3,0.35 0.7,0.7)")
    p.add_argument("--kernel-heads", type=int, nargs="+", default=[0], metavar="H", help="LiSA heads to show")
    p.add_argument("--locality-k", type=int, default=3, help="neighbourhood side for locality (default: 3)")
    p.add_argument("--rank-max-tokens", type=int, default=256,
                   help="larger maps: rank of a random principal submatrix of this size (default: 256)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model's initialisation (an untrained --model: its maps show this init) and of "
                   "any random input, so two runs with the same arguments write the same summary.json (default: 0)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import subquad
    from subquad.analysis.report import analyze_model
    from subquad.engine.checkpoint import load_checkpointed_model, refuse_existing_output
    from subquad.engine.classify import eval_transform
    from subquad.engine.rng import seed_everything
    from subquad_cli.errors import UserError

    refuse_existing_output(args.out, "--out", args.overwrite, folder=True)
    image = Path(args.image) if args.image else sample_image()
    if not image.is_file():
        raise UserError(f"cannot read image {str(image)!r}: no such file")
    if args.img_size is not None and args.img_size < 8:
        raise UserError(f"--img-size must be at least 8, got {args.img_size}")
    if args.rank_max_tokens < 1:
        raise UserError(f"--rank-max-tokens must be >= 1, got {args.rank_max_tokens}")
    if args.locality_k < 1 or args.locality_k % 2 == 0:
        raise UserError(f"--locality-k must be a positive odd number, got {args.locality_k}")
    transform = dcfg = classes = None
    seed_everything(args.seed)
    if args.checkpoint is not None:
        name, model, side, dcfg, _ = load_checkpointed_model(args.checkpoint, args.model, args.img_size,
                                                             args.device)
        transform, classes = eval_transform(dcfg), side.get("classes")
    elif args.model is None:
        raise UserError("give --checkpoint (a weights file or run directory) or --model NAME (untrained)")
    else:
        name, model = args.model, subquad.create_model(args.model).to(args.device)
    s = analyze_model(model, image, args.out, args.img_size, args.layers, args.queries, args.kernel_heads,
                      args.locality_k, args.rank_max_tokens, model_name=name, transform=transform,
                      data_config=dcfg, classes=classes)
    if args.checkpoint is None:
        print(f"note: {name} is untrained (no --checkpoint); maps show the initialisation of --seed {args.seed}")
    print(f"{'layer':>5}  {'mechanism':<16} {'grid':>7} {'rank':>12} {'+local':>12} {'entropy':>8} "
          f"{'locality':>8} {'cosine':>7}")
    for r in s["layers"]:
        rank = f"{r['rank']:.1f}/{r['rank_size']}"
        local = "-" if r["rank_with_local"] is None else f"{r['rank_with_local']:.1f}/{r['rank_size']}"
        loc = "-" if r["locality"] is None else f"{r['locality']:.3f}"
        print(f"{r['layer']:>5}  {r['mechanism']:<16} {r['grid'] or '-':>7} {rank:>12} {local:>12} "
              f"{r['entropy_ratio']:>8.3f} {loc:>8} {r['token_cosine']:>7.3f}")
    print("rank: numerical rank of the equivalent attention matrix per head (mean; a random principal submatrix of "
          f"{args.rank_max_tokens} tokens on larger grids); +local: with the block's LCM map added; "
          f"entropy: / log(keys); locality: mass within {args.locality_k}x{args.locality_k}; "
          "cosine: mean token similarity")
    label = f" {s['predicted_label']!r}" if s.get("predicted_label") else ""
    print(f"predicted class {s['predicted_class']}{label} (p={s['predicted_prob']:.3f}); wrote {args.out}/ "
          f"({', '.join(str(v) for v in s['files'].values() if isinstance(v, str))}, summary.json)")
    return 0
