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
from typing import Any

from subquad.config import load_yaml, parse_yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "charlm"

_FLAGS: list[tuple[str, type, str]] = [
    ("dim", int, "model width"),
    ("depth", int, "layers"),
    ("num_heads", int, "heads"),
    ("ffn_dim", int, "FFN width (0 = 4 x dim)"),
    ("dropout", float, "dropout on attention outputs and in the FFN"),
    ("emb_dropout", float, "dropout on the embeddings and the last hidden state"),
    ("residual", str, "standard (textbook pre-LN, final LN) or official (Transformer-LS normalised-input residual)"),
    ("seq_len", int, "training sample length (tokens)"),
    ("batch_size", int, "batch size"),
    ("lr", float, "learning rate after warm-up (fixed)"),
    ("warmup", int, "linear warm-up steps"),
    ("weight_decay", float, "AdamW weight decay"),
    ("clip_grad", float, "gradient-norm clipping (0 = off, as the official runs)"),
    ("max_steps", int, "training steps"),
    ("max_minutes", float, "wall-clock budget in minutes (0 = none); stops early and evaluates"),
    ("eval_every", int, "evaluate valid BPC every N steps"),
    ("eval_ctx", int, "evaluation context length"),
    ("eval_score", int, "tokens scored per evaluation window (the last ones; paper 512)"),
    ("eval_batch", int, "evaluation windows per batch"),
    ("eval_tokens", int, "valid tokens scored at each periodic evaluation (0 = all)"),
    ("final_eval_tokens", int, "valid/test tokens scored at the end (0 = the whole splits)"),
    ("seed", int, "random seed"),
    ("checkpoint_every", int, "also write the resumable state every N steps (0: at evaluations only); SIGTERM / "
     "SIGINT always write it before stopping"),
    ("device", str, "cpu, cuda, ... (default: cuda when available)"),
    ("output", str, "run directory (default runs/<time>-lm-<attention>)"),
]


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

    t = lsub.add_parser("train", help="train the character LM and report BPC on valid/test")
    t.add_argument("--data", default=None,
                   help="prepared corpus folder (subquad lm prepare), or enwik8:PATH / text8:PATH (the file or its "
                   "zip, split 90M/5M/5M; a file of another size 90/5/5 %%); required unless --resume")
    t.add_argument("--resume", default=None, metavar="RUN",
                   help="continue the run in RUN from its last state (an evaluation, --checkpoint-every or a SIGTERM) "
                   "with its own settings (only --device and --checkpoint-every may be given); ends bit-identical "
                   "to an uninterrupted run")
    t.add_argument("--attention", default="long_short",
                   help="a mechanism with a causal form: long_short (default), softmax, sliding_window, linear_elu1, "
                   "linear_relu")
    t.add_argument("-c", "--config", default=None,
                   help="YAML recipe, a file or a shipped name (default small = subquad/configs/charlm/small.yaml; "
                   "base = the paper's model)")
    t.add_argument("--attn-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="mechanism option (YAML value), e.g. --attn-opt window_size=128")
    for name, typ, help_text in _FLAGS:
        t.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=help_text)
    t.add_argument("--amp", action="store_true", default=None,
                   help="mixed precision: autocast in training and evaluation (see --amp-dtype)")
    t.add_argument("--amp-dtype", default=None, choices=("bfloat16", "float16"),
                   help="autocast dtype with --amp (default bfloat16; float16 adds a grad scaler on CUDA)")
    t.add_argument("--overwrite", action="store_true",
                   help="train into --output even if it is a folder that is not empty (a run there is still refused)")
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
    from subquad.errors import UserError

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
    from subquad.cli.config import find_config
    from subquad.engine.sequence import LMConfig
    from subquad.errors import UserError

    if getattr(args, "resume", None):
        return _resume_config(args)
    if not args.data:
        raise UserError("--data is required (a prepared corpus folder, enwik8:PATH or text8:PATH) unless --resume")
    path = find_config(args.config, ("charlm",)) if args.config else CONFIG_DIR / "small.yaml"
    values: dict[str, Any] = load_yaml(path)
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"unknown LM config key(s) {unknown}; allowed: {sorted(fields)}")
    values.update(data=args.data, attention=args.attention)
    for name, _, _ in _FLAGS:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    for name in ("amp", "amp_dtype"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    opts = dict(values.get("attn_kw", {}).get(args.attention, {}))
    for o in args.attn_opt:
        if "=" not in o:
            raise UserError(f"--attn-opt expects KEY=VALUE, got {o!r}")
        k, v = o.split("=", 1)
        opts[k.strip()] = parse_yaml(v, f"--attn-opt {o}")
    values["attn_kw"] = {**values.get("attn_kw", {}), args.attention: opts}
    if values.get("phases"):
        given = [f"--{n.replace('_', '-')}" for n in ("seq_len", "batch_size", "lr", "warmup")
                 if getattr(args, n, None) is not None]
        if given:
            raise UserError(f"{path.name} trains in phases, each with its own sequence length, batch, lr and "
                            f"warm-up; {', '.join(given)} does not apply (edit `phases:` in a copy of the recipe; "
                            "--max-steps caps the total)")
    return LMConfig(**values)


def _resume_config(args: argparse.Namespace):
    """--resume RUN: the run's own args.yaml with resume on (and --device when given)."""
    from subquad.engine.runfiles import refuse_resume_changes
    from subquad.engine.sequence import LMConfig
    from subquad.errors import UserError

    out = Path(args.resume)
    given = [f"--{n.replace('_', '-')}" for n, _, _ in _FLAGS
             if n not in ("device", "checkpoint_every") and getattr(args, n, None) is not None]
    given += [f for f, v in (("--config", args.config), ("--attn-opt", args.attn_opt), ("--data", args.data),
                             ("--amp", getattr(args, "amp", None)), ("--amp-dtype", getattr(args, "amp_dtype", None)))
              if v]
    refuse_resume_changes(out, given, ["--device", "--checkpoint-every"])
    if not (out / "args.yaml").is_file():
        raise UserError(f"--resume {out}: no args.yaml there (not a `subquad lm train` run directory)")
    values = load_yaml(out / "args.yaml")
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"--resume {out}: args.yaml has unknown key(s) {unknown}")
    if args.attention != values.get("attention") and args.attention != "long_short":
        raise UserError(f"--resume {out}: the run has --attention {values.get('attention')!r}, not "
                        f"{args.attention!r}")
    values.update(resume=True, output=str(out))
    for name in ("device", "checkpoint_every"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    return LMConfig(**values)


def run_train(args: argparse.Namespace) -> int:
    from subquad.attention import ATTENTION_REGISTRY
    from subquad.engine.loop import Preempted
    from subquad.engine.sequence import train_lm
    from subquad.errors import UserError

    # get() raises the one-line unknown-attention error.
    if not ATTENTION_REGISTRY.get(args.attention).builder.caps.causal:
        causal = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).builder.caps.causal]
        raise UserError(f"--attention {args.attention}: {args.attention!r} has no causal form, which a language "
                        f"model needs; mechanisms with one: {', '.join(causal)}")
    from subquad.cli.config import check_run_output

    cfg = resolve_config(args)
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
    from subquad.engine.sequence import evaluate_bpc, load_lm
    from subquad.errors import UserError

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
    from subquad.engine.sequence import load_lm
    from subquad.errors import UserError

    if args.max_new < 1:
        raise UserError(f"--max-new must be >= 1, got {args.max_new}")
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
