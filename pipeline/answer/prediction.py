"""A model's predictions for a block of inputs, batch by batch.

Its own module, apart from the retrieval metrics and their intervals: serving an answer needs
only this, and not the statistics stack (scipy) that the metrics import, which costs the first
answer of `./dev ask` most of a second."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.data.loader import BatchLoader


@torch.no_grad()
def predict(model, inputs: np.ndarray, batch_size: int, device: torch.device | str = "cpu") -> np.ndarray:
    model.eval()
    outs = []
    for x, _ in BatchLoader(inputs, inputs, batch_size, shuffle=False):
        outs.append(model(x.to(device)).pred.float().cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, model.dim), dtype=np.float32)
