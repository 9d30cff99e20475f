"""The energy-flow model's parts (docs/prototype.md says what the prototype did instead). Each
is a plain nn.Module that works on whole tensors of flows; none keeps a tensor between calls."""

from __future__ import annotations

import torch
from torch import nn


class EmbeddingMapper(nn.Module):
    """Input embedding (B, E) -> one bounded initial energy per input-face cell (B, W*H)."""

    def __init__(self, dim: int, n_cells: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, n_cells)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(self.norm(x)))


class EnergyLattice(nn.Module):
    """The learned per-cell state of the W x H x D lattice, looked up at each flow's current cell.

    Flow tensors (positions, energies, hidden states) live in the forward pass only: the prototype kept
    them on the lattice object across batches and so kept every batch's graph alive (OOM on batch 2).
    """

    def __init__(self, width: int, height: int, depth: int, state_dim: int):
        super().__init__()
        self.width, self.height, self.depth = width, height, depth
        self.state = nn.Parameter(torch.randn(depth * width * height, state_dim) * 0.1)

    def cell_index(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        cx = x.detach().floor().long().clamp_(0, self.width - 1)
        cy = y.detach().floor().long().clamp_(0, self.height - 1)
        cz = z.detach().floor().long().clamp_(0, self.depth - 1)
        return (cz * self.height + cy) * self.width + cx

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.state[self.cell_index(x, y, z)]


class SimpleNeuron(nn.Module):
    """MLP over [cell state, energy, normalised position] -> the carrier's input."""

    def __init__(self, state_dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim + 4, hidden), nn.GELU(), nn.Linear(hidden, hidden))

    def forward(self, cell_state: torch.Tensor, energy: torch.Tensor, pos_norm: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([cell_state, energy.unsqueeze(1), pos_norm], dim=1))


class EnergyCarrier(nn.Module):
    """Stacked GRU cells (one call per layer per step over all live flows) and the three heads."""

    def __init__(
        self, in_dim: int, hidden: int, layers: int, min_forward: float, max_forward: float, max_lateral: float
    ):
        super().__init__()
        self.cells = nn.ModuleList(nn.GRUCell(in_dim if i == 0 else hidden, hidden) for i in range(layers))
        self.lateral = nn.Linear(hidden, 2)
        self.forward_head = nn.Linear(hidden, 1)
        self.energy = nn.Linear(hidden, 1)
        self.min_forward, self.max_forward, self.max_lateral = min_forward, max_forward, max_lateral

    def forward(self, inp: torch.Tensor, hidden: tuple[torch.Tensor, ...], energy: torch.Tensor):
        new_hidden = []
        for cell, h in zip(self.cells, hidden):
            inp = cell(inp, h)
            new_hidden.append(inp)
        lateral = self.max_lateral * torch.tanh(self.lateral(inp))
        # min_forward > 0 bounds the trip: every flow reaches z = D within ceil(D / min_forward) steps.
        gate = torch.sigmoid(self.forward_head(inp)).squeeze(1)
        fwd = self.min_forward + (self.max_forward - self.min_forward) * gate
        # Residual: the carried energy is updated, not replaced, so what the input put into a flow
        # survives the trip (replacing it made every prediction collapse to the targets mean).
        energy = torch.tanh(energy + self.energy(inp).squeeze(1))
        return lateral, fwd, energy, tuple(new_hidden)


class OutputMapper(nn.Module):
    """Output surface (B, W*H) -> predicted target embedding (B, E)."""

    def __init__(self, n_cells: int, hidden: int, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(n_cells), nn.Linear(n_cells, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, surface: torch.Tensor) -> torch.Tensor:
        return self.net(surface)
