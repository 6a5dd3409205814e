"""`subquad lm`: prepare a byte/character corpus, train the character LM (BPC), generate with cached decoding.

    subquad lm prepare --corpus FILE_OR_DIR --out DIR [--variant bytes|chars] [--glob PATTERN]
    subquad lm train --data DIR|enwik8:PATH|text8:PATH --attention long_short [-c YAML] [--max-steps N] ...
    subquad lm train --resume RUN                 continue an interrupted run from its last evaluation
    subquad lm train ... --amp [--amp-dtype bfloat16|float16]      mixed precision (autocast)
    torchrun --nproc_per_node N -m subquad lm train ...            data-parallel (rank r: slice r of each batch)
    subquad lm eval --checkpoint RUN --split test [--data SPEC] [--eval-ctx N --eval-score N]
    subquad lm generate --checkpoint PATH --prompt TEXT --max-new 200 [--temperature T] [--top-k K]

Results on the linux-doc corpus are labelled `linuxdoc-bytes` / `linuxdoc-chars` and are not comparable to enwik8 /
text8 numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from subquad_cli.config import add_sequence_arguments
from subquad_cli.recipes import CONFIG_ROOT, load_run_args, load_yaml

CONFIG_DIR = CONFIG_ROOT / "charlm"

def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("lm", help="character-level LM: prepare a corpus, train (BPC), eval, generate",
                       description="Character-level language modelling with the Transformer-LS CharLM.")
    lsub = p.add_subparsers(dest="lm_command", metavar="{prepare,train,eval,generate}")

    pr = lsub.add_parser("prepare", help="split a text corpus 90/5/5 into uint8 memmaps")
    pr.add_argument("--corpus", required=True,
                    help="a text file (enwik8, text8) or a folder of text files (compressed and binary files in it "
                    "are skipped, counted and reported)")
    pr.add_argument("--out", required=True, help="output folder (train.bin, valid.bin, test.bin, meta.json); refused "
                    "if not empty, unless --overwrite")
    pr.add_argument("--overwrite", action="store_true",
                    help="write into --out even if it is a folder that is not empty (its files of the same names "
                    "are replaced)")
    pr.add_argument("--variant", default="bytes", choices=("bytes", "chars"),
                    help="bytes (enwik8-style, 256 ids) or chars (text8-style, 27 ids)")
    pr.add_argument("--glob", default=None,
                    help="file pattern inside a corpus folder: without '/' it matches base names at any depth "
                    "(`copyright` finds */copyright; linux-doc: *.rst.txt), with '/' the relative path")
    pr.add_argument("--name", default="", help="corpus name for meta.json and result labels")
    pr.add_argument("--limit-bytes", type=int, default=0, help="keep only the first N bytes")
    pr.set_defaults(func=run_prepare)

    t = lsub.add_parser("train", help="train the character LM and report BPC on valid/test",
                        description="Train the character LM; writes args.yaml, summary.csv, last/best.safetensors "
                        "(+ JSON sidecars) and results.json. Precedence: defaults < the recipe (-c, default small) < "
                        "flags; with --resume DIR: DIR/args.yaml < flags.")
    from subquad_cli.runconfig import LMConfig

    add_sequence_arguments(t, LMConfig, "YAML recipe, a file or a shipped name (default small = "
                           "subquad/configs/charlm/small.yaml; base = the paper's model)")
    t.set_defaults(func=run_train)

    e = lsub.add_parser("eval", help="bits per character of a trained checkpoint on a split (sliding windows)")
    e.add_argument("--checkpoint", required=True, help="run directory (its best.safetensors) or .safetensors")
    e.add_argument("--split", default="test", choices=("train", "valid", "test"))
    e.add_argument("--data", default=None, help="corpus (default: the one the run trained on)")
    e.add_argument("--eval-ctx", type=int, default=None,
                   help="window length (default: the run's eval_ctx; the paper's protocol is 32768)")
    e.add_argument("--eval-score", type=int, default=None,
                   help="tokens scored per window, the last ones (default: the run's eval_score; paper 512)")
    e.add_argument("--eval-batch", type=int, default=None, help="windows per batch (default: the run's)")
    e.add_argument("--eval-tokens", type=int, default=0, help="score only the first N targets (0 = the whole split)")
    e.add_argument("--device", default="cpu")
    e.set_defaults(func=run_eval)

    g = lsub.add_parser("generate", help="sample from a trained checkpoint (cached incremental decoding)")
    g.add_argument("--checkpoint", required=True, help="run directory or .safetensors from `subquad lm train`")
    g.add_argument("--prompt", required=True, help="prompt text")
    g.add_argument("--max-new", type=int, default=200, help="tokens to generate")
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (0 = all)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu")
    g.set_defaults(func=run_generate)
    p.set_defaults(func=lambda a: _need(p))
    return p


def _need(p: argparse.ArgumentParser) -> int:
    from subquad_cli.errors import UserError

    p.print_help()
    raise UserError("missing subcommand: prepare|train|eval|generate")


def run_prepare(args: argparse.Namespace) -> int:
    from subquad.data.char import prepare_corpus, skipped_summary
    from subquad.engine.checkpoint import refuse_existing_output

    refuse_existing_output(args.out, "--out", args.overwrite, folder=True)
    meta = prepare_corpus(args.corpus, args.out, args.variant, args.glob, args.name, args.limit_bytes)
    sizes = ", ".join(f"{k} {v['symbols']}" for k, v in meta["splits"].items())
    note = f" [{meta['note']}]" if meta["note"] else ""
    print(f"{meta['name']}: {meta['files']} file(s), {meta['source_bytes']} bytes -> {sizes} symbols "
          f"(vocab {meta['vocab_size']}){note}")
    skipped = skipped_summary(meta)
    if skipped:
        print(f"{skipped} (not text)")
    return 0


def resolve_config(args: argparse.Namespace):
    """defaults < the recipe (-c, default small) < the flags -> LMConfig; with --resume DIR: DIR/args.yaml < -c YAML
    < the flags, a setting that would change the run refused (`subquad_cli.config.resume_run`)."""
    from subquad_cli.config import apply_layers, attn_options, recipe_layers, resume_run, typed_fields
    from subquad_cli.errors import UserError
    from subquad_cli.runconfig import LMConfig

    explicit = typed_fields(args, LMConfig)
    opts = getattr(args, "attn_opt", None) or []
    if getattr(args, "resume", None):
        layers = [*recipe_layers(args, ("charlm",)), ("command line", explicit)]
        run = apply_layers(LMConfig(), [(f"{args.resume}/args.yaml", load_run_args(args.resume))])
        layers.append(("command line", attn_options(apply_layers(run, layers), opts, always=False)))
        cfg = resume_run(LMConfig, args.resume, layers)
        return dataclasses.replace(cfg, resume=True, output=str(args.resume))
    if not explicit.get("data"):
        raise UserError("--data is required (a prepared corpus folder, enwik8:PATH or text8:PATH) unless --resume")
    small = CONFIG_DIR / "small.yaml"
    layers = recipe_layers(args, ("charlm",)) or [(str(small), load_yaml(small))]
    cfg = apply_layers(LMConfig(), [*layers, ("command line", explicit)])
    if cfg.phases:
        given = [f"--{n.replace('_', '-')}" for n in ("seq_len", "batch_size", "lr", "warmup") if n in explicit]
        if given:
            raise UserError(f"{Path(layers[0][0]).name} trains in phases, each with its own sequence length, batch, "
                            f"lr and warm-up; {', '.join(given)} does not apply (edit `phases:` in a copy of the "
                            "recipe; --max-steps caps the total)")
    return apply_layers(cfg, [("command line", attn_options(cfg, opts))])


def run_train(args: argparse.Namespace) -> int:
    from subquad.attention import ATTENTION_REGISTRY
    from subquad.engine.lm import train_lm
    from subquad.engine.loop import Preempted
    from subquad_cli.config import check_run_output
    from subquad_cli.errors import UserError

    cfg = resolve_config(args)
    # get() raises the one-line unknown-attention error.
    if not ATTENTION_REGISTRY.get(cfg.attention).builder.caps.causal:
        causal = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).builder.caps.causal]
        raise UserError(f"--attention {cfg.attention}: {cfg.attention!r} has no causal form, which a language "
                        f"model needs; mechanisms with one: {', '.join(causal)}")
    if not cfg.resume:
        check_run_output(cfg.output, args.overwrite)
    try:
        r = train_lm(cfg, log=print)
    except Preempted as e:  # SIGTERM / SIGINT: the state is written and its place printed
        return int(e.code)
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 reports
        return 0
    unit = r["metric"]
    label = f"{r['corpus']}" + (" (not comparable to enwik8/text8)" if r["corpus"].startswith("linuxdoc") else "")
    print(f"{label}: valid {r['valid_bpc']:.3f} {unit}, test {r['test_bpc']:.3f} {unit} "
          f"(context {r['eval_ctx']}, last {r['eval_score']} scored; {r['steps']} steps, {r['wall_seconds']:.0f}s)")
    print(f"checkpoint: {r['checkpoint']}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import torch

    from subquad.data.char import open_corpus
    from subquad.engine.lm import evaluate_bpc, load_lm
    from subquad_cli.errors import UserError

    model, side = load_lm(args.checkpoint, torch.device(args.device))
    run = side.get("args") or {}
    spec = args.data or run.get("data")
    if not spec:
        raise UserError(f"{args.checkpoint}: the checkpoint does not record its corpus; give --data")
    meta, data = open_corpus(spec)
    if int(meta["vocab_size"]) != int(side["model_args"]["vocab_size"]):
        raise UserError(f"--data {spec} has vocabulary {meta['vocab_size']}, the checkpoint "
                        f"{side['model_args']['vocab_size']}")
    ctx = args.eval_ctx or int(run.get("eval_ctx", 1024))
    score = args.eval_score or int(run.get("eval_score", 512))
    batch = args.eval_batch or int(run.get("eval_batch", 8))
    if args.eval_tokens < 0 or batch < 1:
        raise UserError(f"--eval-tokens must be >= 0 and --eval-batch >= 1, got {args.eval_tokens} and {batch}")
    r = evaluate_bpc(model, data[args.split], ctx, score, batch, args.eval_tokens, torch.device(args.device))
    unit = "bpc" if meta.get("variant") == "chars" else "bpb"
    name = meta.get("name", "")
    note = "" if name in ("enwik8", "text8") else " (not comparable to enwik8/text8)"
    print(f"{name} {args.split}: {r['bpc']:.4f} {unit} over {r['tokens']} tokens (windows of {ctx}, the last "
          f"{score} scored, step {score}){note}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from subquad.data.char import decode_ids, encode_text
    from subquad.engine.lm import load_lm
    from subquad_cli.errors import UserError

    if args.max_new < 1 or args.temperature < 0 or args.top_k < 0:
        raise UserError(f"need --max-new >= 1, --temperature >= 0 (0 = greedy) and --top-k >= 0 (0 = all); got "
                        f"{args.max_new}, {args.temperature} and {args.top_k}")
    torch.manual_seed(args.seed)
    model, side = load_lm(args.checkpoint, torch.device(args.device))
    variant = side.get("variant") or "bytes"
    ids = encode_text(args.prompt, variant)
    if len(ids) == 0:
        raise UserError("--prompt is empty after encoding")
    prompt = torch.from_numpy(ids.astype("int64"))[None].to(args.device)
    with torch.no_grad():
        out = model.generate(prompt, args.max_new, temperature=args.temperature, top_k=args.top_k or None)
    new = out[0, prompt.shape[1]:] if out.shape[1] > args.max_new else out[0]
    print(args.prompt + decode_ids(new.cpu().numpy(), variant))
    return 0
