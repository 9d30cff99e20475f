"""What the trainer optimizes and how: the loss's weights, AdamW and its LR schedule."""

from __future__ import annotations

import math
from typing import Callable

import torch

from pipeline.core.exact_math import exact_sqrt


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


class AdamW(torch.optim.AdamW):
    """torch's AdamW, with a correctly rounded square root on the CPU, so a CPU run gives the
    same bits on an Intel and an AMD machine.

    torch's CPU AdamW takes the square root of its second moment with torch.sqrt, whose CPU
    kernel differs by CPU vendor (pipeline/core/exact_math.py). The arithmetic is torch's
    single-tensor AdamW (torch/optim/adam.py, decoupled weight decay) step for step, so where
    torch's root happens to be exact the results are the bits torch's class gives; the
    state_dict is torch's too, so checkpoints load either way. What this does not cover (GPU
    tensors, fused/foreach/capturable/amsgrad, complex or low-precision parameters) is left to
    torch's step."""

    def _portable(self) -> bool:
        for g in self.param_groups:
            if g["amsgrad"] or g["maximize"] or g["capturable"] or g["differentiable"] or g["fused"] or g["foreach"]:
                return False
            for p in g["params"]:
                if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.float64):
                    return False
        return True

    @torch.no_grad()
    def step(self, closure=None):
        if not self._portable():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            lr, eps, wd = g["lr"], g["eps"], g["weight_decay"]
            beta1, beta2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:  # torch's lazy state: a float32 step on the CPU, two zero moments
                    state["step"] = torch.tensor(0.0, dtype=torch.get_default_dtype())
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq, grad = state["exp_avg"], state["exp_avg_sq"], p.grad
                state["step"] += 1
                if wd != 0:
                    p.mul_(1 - lr * wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = state["step"].item()
                step_size = lr / (1 - beta1**step)
                bias_correction2_sqrt = (1 - beta2**step) ** 0.5
                denom = (exact_sqrt(exp_avg_sq) / bias_correction2_sqrt).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)
        return loss


def build_optimizer(model: torch.nn.Module, t, total_steps: int):
    """AdamW over the trainable parameters, and its schedule over `total_steps` (train.* is `t`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, total_steps))
