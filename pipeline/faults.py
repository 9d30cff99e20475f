"""Deliberate faults (the `fault` config group): how the detectors and the report are proven.

Each fault hits optimizer steps [step, step + steps) (1-based), except `leak`, which starts at
`step` and never stops, as the seeds' bug did.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from .errors import ConfigError


class FaultInjector:
    def __init__(self, fault_cfg, model: nn.Module):
        self.kind = fault_cfg.kind
        self.first, self.last = fault_cfg.step, fault_cfg.step + fault_cfg.steps - 1
        self.factor = float(fault_cfg.factor)
        self.module = fault_cfg.module
        self._kept: list[torch.Tensor] = []  # the leak: losses whose graphs stay alive
        self._target = None
        if self.kind == "inf_grad":
            children = dict(model.named_children())
            if self.module not in children:
                raise ConfigError(f"parameter 'fault.module' = {self.module!r}: expected one of the model's "
                                  f"top-level modules: {', '.join(children)}")
            params = [p for p in children[self.module].parameters() if p.requires_grad]
            self._target = params[0]

    def hits(self, step: int) -> bool:
        if self.kind == "none":
            return False
        if self.kind == "leak":
            return step >= self.first
        return self.first <= step <= self.last

    def on_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Applied to each micro-batch loss before backward."""
        if not self.hits(step):
            return loss
        if self.kind == "nan_loss":
            return loss * float("nan")
        if self.kind == "loss_spike":
            return loss * self.factor
        if self.kind == "leak":
            self._kept.append(loss)  # not detached: every saved activation of the step stays alive
        return loss

    def on_grads(self, step: int) -> None:
        """Applied after backward, before the gradients are measured."""
        if self.kind == "inf_grad" and self.hits(step) and self._target.grad is not None:
            with torch.no_grad():
                self._target.grad.view(-1)[0] = float("inf")

    @contextlib.contextmanager
    def lr(self, step: int, opt: torch.optim.Optimizer) -> Iterator[None]:
        """Around opt.step(): the LR spike, restored after so the schedule is untouched."""
        if self.kind != "lr_spike" or not self.hits(step):
            yield
            return
        saved = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * self.factor
        try:
            yield
        finally:
            for g, lr in zip(opt.param_groups, saved):
                g["lr"] = lr
