"""What the trainer optimizes and how: the loss's weights, AdamW and its LR schedule."""

from __future__ import annotations

import math
from typing import Callable

import torch


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to 10 % of the peak LR."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def loss_weights(t) -> dict[str, float]:
    """The loss's terms from train.*: energy_flow_loss's keyword arguments."""
    return {"cosine_weight": t.cosine_weight, "nce_weight": t.nce_weight, "nce_temperature": t.nce_temperature}


def build_optimizer(model: torch.nn.Module, t, total_steps: int):
    """AdamW over the trainable parameters, and its schedule over `total_steps` (train.* is `t`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, total_steps))
