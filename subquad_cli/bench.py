"""`subquad bench attention|model`: time, peak memory and GMACs sweeps, written as CSV and plotted.

By default a run writes a new file under runs/, named after the hardware, torch version and time
(`runs/bench-attn-<device>-pt<ver>-<YYYYmmdd-HHMMSS>.csv`), and never replaces an existing file: committed results
are rewritten only with `--out FILE --overwrite` (and only by a result of the same kind, when the sweep has finished:
its rows go to `<stem>.partial.csv` until then, so an interrupted sweep leaves the earlier result whole). The plot is
written beside the CSV with the same stem unless `--plot` names it (`--no-plot`: none).

torch's threads are pinned to OMP_NUM_THREADS when it is set, else to the physical cores this process was given
(`--threads` overrides both; the CSV's
`threads` column records it). A one-line warning is printed when the load average is above the threads in use, or
when the timed repeats of a step spread by more than 20 % (`time_spread_pct`).

Before numbers are recorded each step's outputs (and gradients with --backward) must be finite; a mechanism or model
that fails is refused unless --force, and forced rows are marked `forced=1`. The test suite is not run here: run
`make test` before committing results.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def _size_list(text: str) -> list[int | str]:
    """'224, 320x512' -> [224, '320x512']: image sizes, a side S (S x S) or HxW."""
    from subquad.bench.sweep import image_size, size_label
    from subquad.errors import UserError

    out: list[int | str] = []
    for v in text.replace(" ", "").split(","):
        if not v:
            continue
        try:
            out.append(size_label(image_size(v)))
        except UserError:
            raise argparse.ArgumentTypeError(f"expected comma-separated sizes S or HxW (positive integers, for "
                                             f"example 224,320x512), got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes S or HxW, got {text!r}")
    return list(dict.fromkeys(out))


def _word_list(text: str) -> list[str]:
    """'a, b,a' -> ['a', 'b']: a value named twice is measured once."""
    return list(dict.fromkeys(v for v in text.replace(" ", "").split(",") if v))


def _name_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [n for v in values for n in v.split(",") if n]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backward", action="store_true", help="also time forward + backward (train_* columns)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: cpu)")
    p.add_argument("--max-mem", type=float, default=8192.0, metavar="MIB",
                   help="skip a size (and larger ones) whose peak memory, extrapolated from smaller sizes, would "
                   "exceed this many MiB (default: 8192)")
    p.add_argument("--max-time", type=float, default=None, metavar="S",
                   help="skip a size whose measurement (warm-up + repeats + memory probe) would exceed S seconds")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls before timing (default: 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls; the median is reported (default: 5)")
    p.add_argument("--out", default=None, help="CSV path (default: a new runs/bench-<kind>-<device>-pt<torch>-<time>"
                   ".csv); an existing file is replaced only with --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="let --out (and --plot) replace an existing result of the same kind, once the sweep has "
                   "finished (its rows go to <stem>.partial.csv until then)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: OMP_NUM_THREADS when set, else the physical cores this "
                   "process may use)")
    p.add_argument("--plot", default=None, help="PNG path (default: the CSV path with .png)")
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument("--force", action="store_true",
                   help="record mechanisms/models whose outputs or gradients are not finite (rows get forced=1)")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmark attention mechanisms or models (CSV + plot)",
                       description="Time (median after warm-up), peak memory and GMACs of attention mechanisms "
                       "over token grids, or of models over image sizes. Writes a CSV with timm's benchmark "
                       "columns and a log-log plot.")
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    a = kinds.add_parser("attention", help="sweep mechanisms over square token grids",
                         description="Sweep registered mechanisms over t x t token grids; 'softmax' is always "
                         "included as the baseline of the *_time_vs_softmax ratios.")
    a.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="mechanisms, space- or comma-separated (default: every registered bidirectional one)")
    a.add_argument("--dim", type=int, default=192, help="channels C (default: 192)")
    a.add_argument("--heads", type=int, default=6, help="heads (default: 6)")
    a.add_argument("--tokens", type=_int_list, default=[14, 28, 56, 112, 224], metavar="T,T,...",
                   help="grid sides t; N = t * t tokens (default: 14,28,56,112,224)")
    a.add_argument("-b", "--batch-size", type=int, default=1, help="batch size (default: 1)")
    _common(a)
    a.set_defaults(func=run_attention)
    m = kinds.add_parser("model", help="benchmark models at image sizes",
                         description="Latency, images/s, peak memory, params and GMACs of models at image sizes.")
    m.add_argument("--model", nargs="+", required=True, metavar="NAME",
                   help="registered models (subquad or timm), space- or comma-separated")
    m.add_argument("--img-size", type=_size_list, default=[224], metavar="S|HxW,...",
                   help="input sizes: a side S for S x S, or HxW for any other shape, e.g. 224,320x512 (default: 224)")
    m.add_argument("-b", "--batch-size", type=int, default=1, help="batch size (default: 1)")
    m.add_argument("--compile", action="store_true",
                   help="time torch.compile(model) (the untimed first call compiles; column `compiled`); the same "
                   "as --backend compile")
    m.add_argument("--precision", type=_word_list, default=["fp32"], metavar="P,P,...",
                   help="fp32, bf16 (autocast), int8 (eager/compile: every nn.Linear a dynamic int8 GEMM, the rest "
                   "fp32; onnxruntime: its dynamic quantization of MatMul/Gemm), comma-separated; a pair that does "
                   "not run here (bf16 onnxruntime, bf16 or int8 on a CPU without them) gets a row saying why it "
                   "was skipped (default: fp32)")
    m.add_argument("--backend", type=_word_list, default=None, metavar="B,B,...",
                   help="eager, compile (torch.compile), onnxruntime (the model exported to ONNX), comma-separated "
                   "(default: eager). Each row has `speedup_vs_fp32_eager` (when fp32 eager is measured too) and "
                   "its achieved GFLOP/s as a fraction of this machine's GEMM rate at its precision, measured once "
                   "per run")
    _common(m)
    m.set_defaults(func=run_model)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    return p


def _check(args: argparse.Namespace) -> None:
    from subquad_cli.errors import UserError

    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.repeats < 1 or args.warmup < 0:
        raise UserError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.max_mem is not None and args.max_mem <= 0:
        raise UserError(f"--max-mem must be positive MiB, got {args.max_mem}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    import torch

    dev = torch.device(args.device)  # a device this machine lacks was refused before the command ran
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda[:i], got {args.device!r}")


def _fmt(v) -> str:
    if v in ("", None):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# Live table: CSV column -> header with its unit.
ATTN_TABLE = {"name": "name", "grid": "grid (t x t)", "infer_step_time": "fwd (ms)", "peak_mem_mb": "fwd peak (MiB)",
              "infer_time_vs_softmax": "fwd / softmax (x)", "train_step_time": "fwd+bwd (ms)",
              "train_peak_mem_mb": "fwd+bwd peak (MiB)", "infer_gmacs": "fwd GMACs"}
MODEL_TABLE = {"model": "model", "precision": "precision", "backend": "backend",
               "infer_img_size": "size (px)", "infer_step_time": "fwd (ms)",
               "infer_samples_per_sec": "fwd (img/s)", "peak_mem_mb": "fwd peak (MiB)",
               "train_step_time": "train (ms)", "infer_gmacs": "fwd GMACs", "param_count": "params",
               "speedup_vs_fp32_eager": "vs fp32 eager (x)", "gemm_fraction": "of GEMM rate"}


def _printer(table: dict[str, str], out: Path, columns: list[str]):
    """Print each finished row under headers with units, and rewrite the CSV so far (an interrupted sweep keeps
    its rows)."""
    from subquad.bench.sweep import write_csv

    cols, labels = list(table), list(table.values())
    widths = [max(18, len(labels[0]))] + [max(10, len(h)) for h in labels[1:]]

    def fmt(cells: list[str]) -> str:
        return "  ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(cells, widths)))

    print(fmt(labels))
    done: list[dict] = []

    def show(row: dict) -> None:
        done.append(row)
        write_csv(done, out, columns)
        line = fmt([_fmt(row.get(c)) for c in cols])
        status = row.get("status", "ok")
        print(line + ("" if status == "ok" else f"  [{status}]"), flush=True)

    return show


def _progress_path(out: Path) -> Path:
    """Where the rows go while the sweep runs: --out itself when it is new; beside it (<stem>.partial.csv) when
    --overwrite replaces an earlier result, which is then replaced only once the sweep has finished (an interrupted
    sweep leaves the earlier result whole and its own rows in the .partial.csv)."""
    return out.with_name(f"{out.stem}.partial.csv") if out.exists() else out


def _drop_progress(progress: Path, out: Path) -> None:
    if progress != out:
        progress.unlink(missing_ok=True)


def _outputs(args: argparse.Namespace, kind: str) -> tuple[Path, Path | None]:
    """The CSV and plot paths: new files unless --out FILE --overwrite names an earlier result of this kind."""
    from subquad.bench.sweep import ATTN_COLUMNS, MODEL_COLUMNS, new_result_path
    from subquad.engine.checkpoint import check_output_file
    from subquad_cli.errors import UserError

    out = Path(args.out) if args.out else new_result_path(kind, args.device)
    plot = None if args.no_plot else (Path(args.plot) if args.plot else out.with_suffix(".png"))
    columns = MODEL_COLUMNS if kind == "model" else ATTN_COLUMNS

    def _earlier_csv(p: Path) -> bool:
        # A result of the same kind, possibly from before columns were added: its header is this kind's first
        # columns and none that this kind lacks.
        with open(p, errors="replace") as f:
            header = f.readline().rstrip("\r\n").split(",")
        return header[:3] == columns[:3] and set(header) <= set(columns)

    for path, flag in ((out, "--out"), (plot, "--plot")):
        if path is not None and path.exists() and not path.is_dir() and not args.overwrite:
            raise UserError(f"{flag} {path} exists; pass --overwrite to replace it, or leave {flag} out for a new "
                            "file (nothing was written)")
    check_output_file(out, (".csv",), (), "--out", overwrite_if=_earlier_csv)
    if out.exists():  # the rows will go to the .partial.csv beside it: only an earlier one of ours may be replaced
        check_output_file(_progress_path(out), (".csv",), (), "--out's .partial.csv", overwrite_if=_earlier_csv)
    if plot is not None:
        check_output_file(plot, (".png",), (out,), "--plot",
                          overwrite_if=lambda p: p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n")
    return out, plot


@contextlib.contextmanager
def _pinned_threads(args: argparse.Namespace):
    """Pin torch's CPU threads for the run (restored after, for in-process callers)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield _pin_threads(args)
    finally:
        torch.set_num_threads(before)


def _pin_threads(args: argparse.Namespace) -> int:
    """Pin torch's CPU threads: --threads, else OMP_NUM_THREADS, else the physical cores this process was given."""
    import torch

    from subquad.bench.machine import default_threads

    n = args.threads or default_threads()
    torch.set_num_threads(n)
    return n


def _warn_load() -> None:
    """One line when the load average is above the threads in use (checked before measuring)."""
    import torch

    from subquad.bench.machine import load_warning

    warning = load_warning(torch.get_num_threads())
    if warning:
        print(warning, file=sys.stderr, flush=True)


def _warn_spread(rows: list[dict], label) -> None:
    from subquad.bench.machine import spread_warning

    warning = spread_warning((label(r), float(r["time_spread_pct"]) / 100) for r in rows
                             if r.get("time_spread_pct") not in ("", None))
    if warning:
        print(warning, file=sys.stderr, flush=True)


def run_attention(args: argparse.Namespace) -> int:
    from subquad.attention import ATTENTION_REGISTRY
    from subquad_cli.errors import UserError

    _check(args)
    if args.dim < 1 or args.heads < 1:
        raise UserError(f"--dim and --heads must be >= 1, got {args.dim} and {args.heads}")
    if args.dim % args.heads:
        raise UserError(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    for name in _name_list(args.names) or []:
        ATTENTION_REGISTRY.get(name)  # an unknown name: one line before anything is printed or written
    with _pinned_threads(args):
        return _run_attention(args)


def run_model(args: argparse.Namespace) -> int:
    from subquad.bench.precision import check_pairs
    from subquad.bench.sweep import check_model_names, check_model_sizes
    from subquad_cli.errors import UserError

    _check(args)
    if args.compile and args.backend and args.backend != ["compile"]:
        raise UserError(f"--compile means --backend compile; give one of them, not --backend {','.join(args.backend)}")
    args.backend = args.backend or (["compile"] if args.compile else ["eager"])
    check_pairs(args.precision, args.backend)
    check_model_names(_name_list(args.model))
    check_model_sizes(_name_list(args.model), args.img_size)
    with _pinned_threads(args):
        return _run_model(args)


def _run_attention(args: argparse.Namespace) -> int:
    import subquad  # noqa: F401 - registers the mechanisms
    from subquad.bench.sweep import ATTN_COLUMNS, plot_attention, sweep_attention, write_csv

    out, plot = _outputs(args, "attn")
    _warn_load()
    progress = _progress_path(out)
    show = _printer(ATTN_TABLE, progress, ATTN_COLUMNS)
    rows = sweep_attention(_name_list(args.names), args.dim, args.heads, args.tokens, args.backward,
                           args.batch_size, args.device, args.max_mem, args.max_time, args.warmup, args.repeats,
                           args.force, on_row=show)
    print("\nratio to softmax at the same grid (step time / softmax step time; < 1 is faster):")
    for r in rows:
        if r["name"] != "softmax" and r.get("infer_time_vs_softmax") not in ("", None):
            train = r.get("train_time_vs_softmax")
            extra = f", forward+backward {train}" if train not in ("", None) else ""
            print(f"  {r['name']:<18} {r['grid']:>8}: forward {r['infer_time_vs_softmax']}{extra}")
    write_csv(rows, out, ATTN_COLUMNS)
    _drop_progress(progress, out)
    _warn_spread(rows, lambda r: f"{r['name']} at {r['grid']}")
    print(f"wrote {out}")
    if plot is not None:
        plot_attention(rows, plot)
        print(f"wrote {plot}")
    sys.stdout.flush()
    return 0


def _run_model(args: argparse.Namespace) -> int:
    import subquad  # noqa: F401 - registers the models
    from subquad.bench.sweep import MODEL_COLUMNS, bench_models, plot_models, write_csv

    out, plot = _outputs(args, "model")
    _warn_load()
    progress = _progress_path(out)
    show = _printer(MODEL_TABLE, progress, MODEL_COLUMNS)
    rows = bench_models(_name_list(args.model), args.img_size, args.batch_size, args.backward, args.device,
                        args.max_mem, args.max_time, args.warmup, args.repeats, args.force, on_row=show,
                        precisions=args.precision, backends=args.backend)
    write_csv(rows, out, MODEL_COLUMNS)
    _drop_progress(progress, out)
    _warn_spread(rows, lambda r: f"{r['model']} at {r['infer_img_size']} px")
    print(f"wrote {out}")
    if plot is not None:
        plot_models(rows, plot)
        print(f"wrote {plot}")
    return 0
