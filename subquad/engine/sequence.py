"""The long-sequence trainers under their former module name: LRA classification is `subquad.engine.lra`, the
character LM `subquad.engine.lm`, what they share `subquad.engine.steps`, their configs `subquad_cli.runconfig`."""

from __future__ import annotations

from .lm import (
                 LM_TIMING_FIELDS,
                 LMConfig,
                 _phase_lr,
                 build_lm,
                 evaluate_bpc,
                 lm_model_args,
                 lm_phases,
                 load_lm,
                 train_lm,
)
from .lra import (
                 LRA_TASKS,
                 LRA_TIMING_FIELDS,
                 LRAConfig,
                 _train_batches,
                 build_lra_data,
                 build_lra_model,
                 evaluate_lra,
                 one_cycle,
                 train_lra,
)

__all__ = ["LRAConfig", "LMConfig", "train_lra", "train_lm", "evaluate_lra", "evaluate_bpc", "build_lra_data",
           "build_lra_model", "build_lm", "load_lm", "one_cycle", "lm_phases", "lm_model_args", "LM_TIMING_FIELDS",
           "LRA_TIMING_FIELDS", "LRA_TASKS", "_phase_lr", "_train_batches"]
