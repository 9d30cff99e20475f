"""The loss and cosine of the model over a held-out split, the same numbers on one process or many;
`Validation`, the part of the loop (pipeline/train/parts.py) that runs it at each epoch's end."""

from __future__ import annotations

import time

import torch

from pipeline.core.distributed import Dist
from pipeline.data.loader import BatchLoader
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.parts import TrainPart


@torch.no_grad()
def evaluate_loss(
    model: EnergyFlowModel,
    inputs,
    targets,
    batch_size: int,
    weights: dict[str, float],
    device: torch.device,
    place: Dist = Dist(),
) -> dict[str, float]:
    """Mean loss and cosine over the rows; with several ranks each takes every world_size-th batch
    and the sums are all-reduced (the same batches as one process, so the same numbers)."""
    model.eval()
    loader = BatchLoader(
        inputs, targets, batch_size, shuffle=False, rank=place.rank, world_size=place.world_size, even=False
    )
    loss_sum = torch.zeros((), device=device)
    cos_sum = torch.zeros((), device=device)
    n = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss_sum += energy_flow_loss(out.pred, y, **weights) * len(x)
        cos_sum += torch.nn.functional.cosine_similarity(out.pred, y, dim=1).sum()
        n += len(x)
    model.train()
    count = torch.tensor(float(n), dtype=torch.float64, device=device)
    totals = place.all_reduce(torch.stack([loss_sum.double(), cos_sum.double(), count]))
    loss_total, cos_total, n_total = totals.tolist()
    return {"loss": loss_total / max(n_total, 1), "cosine": cos_total / max(n_total, 1)}


class Validation(TrainPart):
    """The val split's loss and cosine after each epoch: into the summary and the run's on_log."""

    def __init__(self, inputs, targets):
        self.inputs, self.targets = inputs, targets

    def on_epoch_end(self, tr) -> None:
        t_val = time.perf_counter()
        val = evaluate_loss(tr.model, self.inputs, self.targets, tr.t.batch_size, tr.loss_weights, tr.device, tr.place)
        # Not a training step: kept out of perf/step_ms (it showed as a spike at every epoch
        # boundary of the default run).
        tr.window.not_steps_s += time.perf_counter() - t_val
        row = {"val/loss": val["loss"], "val/cosine": val["cosine"], "epoch": tr.epoch}
        tr.result.summary.update({k: v for k, v in row.items() if k != "epoch"})
        if tr.on_log:
            tr.on_log(row, tr.step)
