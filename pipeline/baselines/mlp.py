"""The MLP baseline: a plain learned map of the model's own size, the rival a reviewer of the
model asks for first. Two layers with a GELU between them, plus a linear skip path from input to
output (the model has one too: model.residual=linear), its hidden width chosen so that its
parameter count matches the energy-flow model's as its config builds it (mlp_shape): a change of
lattice or carrier size changes the rival's size with it.

A model too small to afford the skip path (its dim x dim weights alone would exceed its budget)
gets an MLP without one."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

MIN_HIDDEN = 8  # fewer hidden units is no longer a two-layer MLP worth the name


@dataclass(frozen=True)
class MLPShape:
    dim_in: int
    dim_out: int
    hidden: int
    skip: bool

    @property
    def params(self) -> int:
        layers = self.dim_in * self.hidden + self.hidden + self.hidden * self.dim_out + self.dim_out
        return layers + (self.dim_in * self.dim_out + self.dim_out if self.skip else 0)

    def as_dict(self) -> dict:
        return asdict(self)


def model_params(model_cfg, dim: int) -> int:
    """The energy-flow model's parameter count for `dim`-d embeddings (built on the meta device:
    no memory, no random draw)."""
    from pipeline.model import EnergyFlowModel

    with torch.device("meta"):
        model = EnergyFlowModel.from_config(model_cfg, int(dim))
    return sum(p.numel() for p in model.parameters())


def mlp_shape(budget: int, dim_in: int, dim_out: int) -> MLPShape:
    """The MLP whose parameter count is nearest `budget`: the hidden width that fills what the
    skip path leaves (or the whole budget without a skip path, when it leaves too little)."""
    per_unit = dim_in + 1 + dim_out  # one hidden unit: its input weights, its bias, its output weights
    skip_cost = dim_in * dim_out + dim_out
    skip = budget - skip_cost - dim_out >= MIN_HIDDEN * per_unit
    rest = budget - dim_out - (skip_cost if skip else 0)
    return MLPShape(dim_in, dim_out, max(MIN_HIDDEN, round(rest / per_unit)), skip)


class MLPBaseline(nn.Module):
    def __init__(self, shape: MLPShape):
        super().__init__()
        self.shape = shape
        self.hidden = nn.Linear(shape.dim_in, shape.hidden)
        self.out = nn.Linear(shape.hidden, shape.dim_out)
        self.skip = nn.Linear(shape.dim_in, shape.dim_out) if shape.skip else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.out(F.gelu(self.hidden(x)))
        return y + self.skip(x) if self.skip is not None else y


@torch.no_grad()
def predict(module: MLPBaseline, inputs, batch_size: int = 4096):
    """The MLP's outputs for `inputs` (rows x dim_in, memory-mapped or not) as float32 numpy."""
    import numpy as np

    module.eval()
    out = np.empty((len(inputs), module.shape.dim_out), dtype=np.float32)
    for s in range(0, len(inputs), batch_size):
        x = torch.from_numpy(np.asarray(inputs[s : s + batch_size], dtype=np.float32))
        out[s : s + len(x)] = module(x).numpy()
    return out
