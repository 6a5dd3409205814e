"""`subquad arena`: every mechanism in the same host under the same recipe, over seeds; leaderboard and claims.

    subquad arena run --task TASK [--attention a,b,c | all] [--seeds 0,1,2] [--budget default|quick] --out DIR
                      [--workers N] [--device cpu|cuda]
    subquad arena report DIR [--plots]   the leaderboard as a Markdown table (mean ± std over seeds); --plots
                                    rewrites its two plots from the cells
    subquad arena check DIR         the papers' claims: both means, the difference with a 95 % interval, a verdict
                                    and the verdict after a Holm correction over the task's claims
    subquad arena tasks             the shipped tasks and their mechanisms
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("arena", help="train every mechanism in one host over seeds; leaderboard and claim checks",
                       description="Train each (mechanism, seed) cell of an arena task (subquad/configs/arena/"
                       "<task>.yaml) resumably, cells side by side with one thread each; write DIR/leaderboard.csv, "
                       "leaderboard.png and curves.png; print the leaderboard or check the papers' claims.")
    asub = p.add_subparsers(dest="arena_command", metavar="{run,report,check,tasks}")
    r = asub.add_parser("run", help="train the cells (a rerun skips finished cells and resumes the others)")
    r.add_argument("--task", required=True, help="arena task (see `subquad arena tasks`)")
    r.add_argument("--attention", default="all", help="'all' (the task's list) or comma-separated mechanisms")
    r.add_argument("--seeds", default=None, help="comma-separated seeds (default: the task's)")
    r.add_argument("--budget", default="default", help="default (the committed run) or quick (a few steps, tests)")
    r.add_argument("--out", required=True, help="run directory (refused when it holds another kind of run)")
    r.add_argument("--workers", type=int, default=None, help="cells side by side (default and maximum: the cores "
                   "this process may use)")
    r.add_argument("--device", default=None,
                   help="cpu or cuda: train every cell on this device (default: the task recipe's); a task marked "
                   "`requires: gpu` needs --device cpu to run on a machine without CUDA")
    r.set_defaults(func=run_run)
    rep = asub.add_parser("report", help="print DIR/leaderboard.csv as a Markdown table")
    rep.add_argument("dir")
    rep.add_argument("--plots", action="store_true", help="also rewrite DIR/leaderboard.png and curves.png from the "
                     "cells (nothing is trained; leaderboard.csv is left as it is)")
    rep.set_defaults(func=run_report)
    c = asub.add_parser("check", help="test the task's claims on the cells in DIR")
    c.add_argument("dir")
    c.set_defaults(func=run_check)
    t = asub.add_parser("tasks", help="list the shipped tasks")
    t.set_defaults(func=run_tasks)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    return p


def _seeds(text: str | None) -> list[int] | None:
    from subquad_cli.errors import UserError

    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds takes comma-separated integers, got {text!r}") from None


def run_run(args: argparse.Namespace) -> int:
    from subquad.arena import run_arena
    from subquad_cli.errors import UserError

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    r = run_arena(args.task, args.attention, _seeds(args.seeds), args.budget, args.out, args.workers,
                  device=args.device)
    return 1 if r["failed"] else 0


def _task_of(d: str):
    from subquad.arena.runner import task_of_run

    return task_of_run(d)


def run_report(args: argparse.Namespace) -> int:
    from subquad.arena import leaderboard_markdown

    task = _task_of(args.dir)
    print(f"arena {task.name}: {task.description}")
    print()
    print(leaderboard_markdown(args.dir, task))
    from subquad.arena.report import stale_note

    note = stale_note(args.dir)
    if note:
        print()
        print(note)
    if args.plots:
        from subquad.arena.report import replot

        written = replot(args.dir, task)
        print()
        print("plots: " + (", ".join(str(p) for p in written) if written else "none (matplotlib is not installed: "
                           "pip install subquad[plot])"))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from subquad.arena import check_claims
    from subquad.arena.report import check_run_claims, claims_text, method_text, smoke_note

    task = _task_of(args.dir)
    note = check_run_claims(args.dir, task)  # refuses claims edited since the run began
    if not task.claims:
        print(f"arena {task.name}: the task states no claims")
        return 0
    results = check_claims(args.dir, task)
    if smoke_note(args.dir):
        print(smoke_note(args.dir, markdown=False))
    if note:
        print(note)
    print(method_text(results))
    print(claims_text(results))
    if task.data.get("generator") == "listops":
        from pathlib import Path

        from subquad.arena.lra import listops_baselines

        for folder in sorted((Path(args.dir) / "data").glob("*/train.tsv")):
            b = listops_baselines(folder.parent)
            print(f"baselines on {folder.parent.name} (test, %): most common answer {b['majority']:.2f}; most common "
                  f"answer of the outermost operator {b['outer_operator']:.2f}")
    return 0


def run_tasks(args: argparse.Namespace) -> int:
    from subquad.arena import load_task
    from subquad.arena.tasks import task_names

    for name in task_names():
        t = load_task(name)
        needs = ", needs a GPU (--device cpu forces the CPU)" if t.requires == "gpu" else ""
        metric = "" if t.metric["name"] == "acc" else f", metric {t.metric['name']} ({t.metric['goal']})"
        print(f"{name} ({t.kind}, seeds {','.join(map(str, t.seeds))}{metric}{needs}): {t.description}")
        print(f"  mechanisms: {', '.join(t.default_mechanisms)}")
    return 0
