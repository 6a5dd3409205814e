"""Optimizer and learning-rate schedule for image training: thin wrappers over timm.

`build_optimizer` calls `timm.optim.create_optimizer_v2`, whose parameter groups put 1-D parameters, biases and the
names in `model.no_weight_decay()` in a group without weight decay (the rule every official recipe here follows,
see the L2ViT and FLatten official training configs). `build_scheduler` calls `create_scheduler_v2` with
per-update stepping by default (`step_update` every optimizer step; `step` once per epoch).
"""

from __future__ import annotations

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler

from subquad_cli.runconfig import TrainConfig

from ..errors import UserError

__all__ = ["build_optimizer", "build_scheduler", "check_scheduler", "SCHEDULERS"]

#: The schedules `timm.scheduler.create_scheduler_v2` builds (`sched=`); tests hold the list to the installed timm.
SCHEDULERS = ("cosine", "tanh", "step", "multistep", "plateau", "poly", "constant", "wsd", "rsqrt")


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (or any timm optimizer) with weight-decay groups from `no_weight_decay()` and the bias/1-D rule."""
    kw = {}
    if cfg.opt_eps is not None:
        kw["eps"] = cfg.opt_eps
    if cfg.opt_betas is not None:
        kw["betas"] = tuple(cfg.opt_betas)
    try:
        return create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                   momentum=cfg.momentum, **kw)
    except (AssertionError, ValueError) as e:
        from timm.optim import list_optimizers

        from ..errors import closest

        if cfg.opt.lower() not in list_optimizers():
            near = closest(cfg.opt.lower(), list_optimizers())
            hint = f"did you mean {', '.join(near)}?" if near else "e.g. adamw, sgd, lamb"
            raise UserError(f"unknown --opt {cfg.opt!r}; {hint} (timm.optim.list_optimizers() lists all "
                            f"{len(list_optimizers())})") from None
        raise UserError(f"--opt {cfg.opt!r}: {str(e).splitlines()[0] if str(e) else 'invalid optimizer'}") from None


def check_scheduler(name: str) -> None:
    """Refuse a schedule name timm does not build, with the closest name and every allowed one."""
    if name not in SCHEDULERS:
        from ..errors import closest

        near = closest(name, SCHEDULERS)
        hint = f"did you mean {', '.join(near)}? " if near else ""
        raise UserError(f"unknown --sched {name!r}; {hint}allowed: {', '.join(SCHEDULERS)}")


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, updates_per_epoch: int) -> Scheduler:
    """timm schedule over `cfg.epochs` (warm-up from `warmup_lr`, decay to `min_lr`)."""
    check_scheduler(cfg.sched)
    try:
        sched, _ = create_scheduler_v2(optimizer, sched=cfg.sched, num_epochs=cfg.epochs,
                                       warmup_epochs=cfg.warmup_epochs, warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr,
                                       cooldown_epochs=cfg.cooldown_epochs, step_on_epochs=not cfg.sched_on_updates,
                                       updates_per_epoch=updates_per_epoch)
    except (AssertionError, ValueError) as e:
        raise UserError(f"--sched {cfg.sched!r}: {str(e).splitlines()[0] if str(e) else 'invalid schedule'}") \
            from None
    if sched is None:
        raise UserError(f"unknown --sched {cfg.sched!r}; allowed: {', '.join(SCHEDULERS)}")
    return sched
