"""`subquad segment train|eval|predict`: semantic segmentation with a subquad backbone (see `subquad detect`)."""

from __future__ import annotations

import argparse

from subquad_cli.detect import add_task_parser


def add_parser(sub) -> argparse.ArgumentParser:
    return add_task_parser(sub, "segment")
