"""Training the MLP baseline the way the model is trained (pipeline/train/): the same loss
(energy_flow_loss with train.cosine_weight, nce_weight, nce_temperature), the same AdamW (the
portable one, pipeline/train/optimizer.py) with train.weight_decay and the same schedule (linear
warm-up over train.warmup_steps, then cosine decay), train.grad_clip, train.batch_size and
train.epochs, the same batches in the same order for a seed (BatchLoader seeded as the trainer
seeds it), and the same selection rule: the weights after the last epoch. Only the peak learning
rate is its own (baseline.mlp_lr): the model's is tuned for the model, and a rival held at it
would be a weaker rival than it need be."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from pipeline.baselines.mlp import MLPBaseline, MLPShape
from pipeline.data.loader import BatchLoader
from pipeline.model import energy_flow_loss
from pipeline.train.optimizer import AdamW, loss_weights, lr_lambda


def fit_mlp(
    shape: MLPShape,
    inputs,
    targets,
    t,
    lr: float,
    seed: int,
    on_epoch: Optional[Callable[[int, MLPBaseline], dict]] = None,
) -> tuple[MLPBaseline, list[dict]]:
    """The trained MLP and its history: a row per epoch (epoch, train/loss: the epoch's mean
    batch loss, and what `on_epoch(epoch, module)` measured on val)."""
    torch.manual_seed(seed)
    module = MLPBaseline(shape)
    loader = BatchLoader(inputs, targets, t.batch_size, shuffle=True, seed=seed, drop_last=len(inputs) > t.batch_size)
    per_epoch = len(loader)
    opt = AdamW(module.parameters(), lr=lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, int(t.epochs) * per_epoch))
    weights = loss_weights(t)
    history = []
    for epoch in range(int(t.epochs)):
        module.train()
        loader.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            loss = energy_flow_loss(module(x), y, **weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(module.parameters(), t.grad_clip)
            opt.step()
            sched.step()
            total += float(loss.detach())
            batches += 1
        row = {"epoch": epoch + 1, "train/loss": total / max(batches, 1)}
        if on_epoch is not None:
            row.update(on_epoch(epoch + 1, module))
        history.append(row)
    module.eval()
    return module, history


@torch.no_grad()
def val_loss(module: MLPBaseline, inputs, targets, t) -> dict:
    """The MLP's mean loss and cosine over a held-out split, as the trainer measures the model's
    (pipeline/train/validation.py) at each epoch's end."""
    module.eval()
    loader = BatchLoader(inputs, targets, t.batch_size, shuffle=False, even=False)
    loss_sum, cos_sum, n = 0.0, 0.0, 0
    weights = loss_weights(t)
    for x, y in loader:
        pred = module(x)
        loss_sum += float(energy_flow_loss(pred, y, **weights)) * len(x)
        cos_sum += float(torch.nn.functional.cosine_similarity(pred, y, dim=1).sum())
        n += len(x)
    module.train()
    return {"val/loss": loss_sum / max(n, 1), "val/cosine": cos_sum / max(n, 1)}
