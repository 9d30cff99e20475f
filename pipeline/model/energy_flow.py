"""The vectorised energy-flow model: all B*F flows of a batch move as one tensor.

The only Python loop is over flow steps, in two forms that compute the same thing (docs/gpu.md;
tests/test_flow_loops.py holds them to it, outputs and gradients): **compact** (the CPU's), where
finished flows are compacted out at one host read per flow step, and **masked** (the GPU's), where
every flow stays to the end, masked out of the deposits, with no host read inside the loop (so it
can be captured as a CUDA graph). `flow_loop` picks one ("auto": masked on CUDA, compact
elsewhere); with masked, `fixed_steps` runs exactly that many flow steps and reports in
`unfinished` whether flows were still travelling: the compacting loop would have gone on, so the
trainer does not apply that batch's update. The stopping rule is the prototype's
(docs/prototype.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.core.exact_math import exact_sqrt
from pipeline.model.components import EmbeddingMapper, EnergyCarrier, EnergyLattice, OutputMapper, SimpleNeuron


@dataclass
class FlowOutput:
    pred: torch.Tensor  # (B, E) predicted target embedding
    surface: torch.Tensor  # (B, W*H) energy deposited on the output face
    steps_used: int  # flow steps run before stopping
    flow_steps: int  # sum over steps of live flows: the work actually done
    spawned: int  # flows started (B * F)
    stragglers: int  # flows still travelling when the loop stopped (deposited weighted by z / D)
    # With record_ranges on: (len(RANGE_KEYS),) device tensor, min / max / RMS of the carried
    # energies and the last carrier layer's hidden states over every live flow of every step,
    # and of the output surface. Else None.
    ranges: torch.Tensor | None = None
    # The masked loop's counters stay on the device (steps_used, flow_steps, stragglers are 0-dim
    # tensors then: reading them would be a sync); unfinished: a device bool, True when a
    # fixed_steps loop stopped with flows still travelling. None from the compacting loop.
    unfinished: torch.Tensor | None = None


RANGE_KEYS = tuple(f"{what}_{stat}" for what in ("energy", "hidden", "surface") for stat in ("min", "max", "rms"))
FLOW_LOOPS = ("auto", "compact", "masked")
MASKED_CHECK_EVERY = 4  # flow steps between the host checks of a masked loop run to max_steps


class _Ranges:
    """Running min / max / sum of squares of tensors, on their device (no host read); the count
    is a host int (numel is known there), or a device tensor when only masked rows count."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []
        self.count = 0

    def add(self, t: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Add t's values, or only those of its rows where `rows` (a bool mask) is set."""
        t = t.detach().float()
        if rows is None:
            self.parts.append(torch.stack([t.min(), t.max(), t.square().sum()]))
            self.count += t.numel()
            return
        m = rows.view(-1, *([1] * (t.dim() - 1))).expand_as(t)
        inf = torch.full((), float("inf"), device=t.device)
        self.parts.append(
            torch.stack([torch.where(m, t, inf).min(), torch.where(m, t, -inf).max(), (t * m).square().sum()])
        )
        self.count = self.count + m.sum()

    def stats(self) -> torch.Tensor:
        a = torch.stack(self.parts)
        return torch.stack([a[:, 0].min(), a[:, 1].max(), exact_sqrt(a[:, 2].sum() / self.count)])


class EnergyFlowModel(nn.Module):
    def __init__(
        self,
        dim: int,
        *,
        lattice_width: int,
        lattice_height: int,
        lattice_depth: int,
        max_active_flows: int,
        cell_state_dim: int,
        neuron_hidden: int,
        carrier_layers: int,
        carrier_hidden: int,
        min_forward: float,
        max_forward: float,
        max_lateral: float,
        energy_min: float,
        convergence_threshold: float,
        patience: int,
        max_steps: int,
        adaptive_stop: bool = True,
        output_hidden: int = 256,
        checkpoint_steps: bool = False,
        residual: str = "none",
    ):
        super().__init__()
        self.dim = dim
        self.W, self.H, self.D = lattice_width, lattice_height, lattice_depth
        self.n_cells = self.W * self.H
        self.max_active_flows = max_active_flows
        self.carrier_layers, self.carrier_hidden = carrier_layers, carrier_hidden
        self.energy_min = energy_min
        self.convergence_threshold, self.patience = convergence_threshold, patience
        self.max_steps, self.adaptive_stop = max_steps, adaptive_stop
        self.checkpoint_steps = checkpoint_steps
        self.record_ranges = False  # the trainer turns it on for the forward of a log step
        self.flow_loop = "auto"  # FLOW_LOOPS; the trainer sets train.flow_loop
        self.fixed_steps: int | None = None  # masked loop: run exactly this many flow steps
        self.input_mapper = EmbeddingMapper(dim, self.n_cells)
        self.lattice = EnergyLattice(self.W, self.H, self.D, cell_state_dim)
        self.neuron = SimpleNeuron(cell_state_dim, neuron_hidden)
        self.carrier = EnergyCarrier(
            neuron_hidden, carrier_hidden, carrier_layers, min_forward, max_forward, max_lateral
        )
        self.output_mapper = OutputMapper(self.n_cells, output_hidden, dim)
        # The residual path (model.residual): the prediction is the input ("identity") or a
        # learned linear map of it ("linear") plus what the flows deposit, so the lattice learns
        # the correction from question to answer instead of rebuilding 384 numbers from the 64
        # of the output surface. The linear map starts as the identity and the mapper's last
        # layer at zero: an untrained residual model predicts its input, not noise.
        if residual not in ("none", "identity", "linear"):
            raise ValueError(f"residual={residual!r}: expected none, identity or linear")
        self.residual = str(residual)
        self.skip = None
        if self.residual == "linear":
            self.skip = nn.Linear(dim, dim)
            nn.init.eye_(self.skip.weight)
            nn.init.zeros_(self.skip.bias)
        if self.residual != "none":
            nn.init.zeros_(self.output_mapper.net[-1].weight)
            nn.init.zeros_(self.output_mapper.net[-1].bias)

    @classmethod
    def from_config(cls, model_cfg, dim: int) -> "EnergyFlowModel":
        return cls(dim, **{k: model_cfg[k] for k in model_cfg})

    def flows_per_sample(self, batch_size: int) -> int:
        # max_active_flows caps the whole batch; every sample gets at least one flow.
        return max(1, min(self.n_cells, self.max_active_flows // batch_size))

    @property
    def step_bound(self) -> int:
        """No flow can take more steps than this: each step moves it forward >= min_forward."""
        return math.ceil(self.D / self.carrier.min_forward)

    @property
    def masked_step_cap(self) -> int:
        """The most flow steps a masked loop needs to run: step_bound, plus one for a z summed in
        floats that falls a hair short of the depth at step_bound, capped at max_steps (where
        the compacting loop stops too)."""
        return min(self.max_steps, self.step_bound + 1)

    @property
    def min_steps_to_arrive(self) -> int:
        """No flow can arrive sooner: each step moves it forward <= max_forward. A batch that
        stops earlier stopped because every flow died (energy < energy_min), none arrived."""
        return math.ceil(self.D / self.carrier.max_forward)

    # --- one flow step over all live flows (checkpointable: pure function of its inputs) ---
    def _advance(self, x, y, z, energy, *hidden):
        pos_norm = torch.stack([x / self.W, y / self.H, z / self.D], dim=1)
        n = self.neuron(self.lattice(x, y, z), energy, pos_norm)
        lateral, fwd, new_energy, new_hidden = self.carrier(n, hidden, energy)
        # Cell centres span [0.5, W - 0.5]: keeping flows there keeps the bilinear deposit in range.
        x = (x + lateral[:, 0]).clamp(0.5, self.W - 0.5)
        y = (y + lateral[:, 1]).clamp(0.5, self.H - 0.5)
        return (x, y, z + fwd, new_energy, *new_hidden)

    def _deposit(self, surface, sample, x, y, value):
        """Bilinear splat of `value` at (x, y) onto the cell centres of each flow's sample row;
        differentiable in value and position."""
        u, v = x - 0.5, y - 0.5
        i0 = u.detach().floor().clamp(0, max(self.W - 2, 0))
        j0 = v.detach().floor().clamp(0, max(self.H - 2, 0))
        fu, fv = (u - i0).clamp(0, 1), (v - j0).clamp(0, 1)
        i0, j0 = i0.long(), j0.long()
        i1, j1 = (i0 + 1).clamp(max=self.W - 1), (j0 + 1).clamp(max=self.H - 1)
        base = sample * self.n_cells
        idx = torch.cat(
            [base + j0 * self.W + i0, base + j0 * self.W + i1, base + j1 * self.W + i0, base + j1 * self.W + i1]
        )
        w = torch.cat([(1 - fu) * (1 - fv), fu * (1 - fv), (1 - fu) * fv, fu * fv])
        return surface.index_add(0, idx, w * value.repeat(4))

    def forward(self, x_in: torch.Tensor) -> FlowOutput:
        B = x_in.shape[0]
        energies0 = self.input_mapper(x_in)  # (B, W*H)
        F_ = self.flows_per_sample(B)
        top = energies0.abs().topk(F_, dim=1).indices  # spawn at the largest |energy| cells
        energy = energies0.gather(1, top).reshape(-1)
        cells = top.reshape(-1)
        x = (cells % self.W).to(x_in.dtype) + 0.5
        y = (cells // self.W).to(x_in.dtype) + 0.5
        z = torch.zeros_like(x)
        sample = torch.arange(B, device=x_in.device).repeat_interleave(F_)
        n_total = B * F_
        hidden = tuple(x_in.new_zeros(n_total, self.carrier_hidden) for _ in range(self.carrier_layers))
        surface = x_in.new_zeros(B * self.n_cells)

        flows = (x, y, z, energy, hidden, sample)
        ranges = (_Ranges(), _Ranges()) if self.record_ranges else None
        if self.uses_masked_loop(x_in.device):
            surface, counters = self._masked_loop(surface, flows, n_total, ranges)
        else:
            surface, counters = self._compact_loop(surface, flows, n_total, ranges)
        surface = surface.view(B, self.n_cells)
        pred = self.output_mapper(surface)
        if self.skip is not None:
            # In fp32 even under autocast: bf16 would round the near-identity map's copy of the
            # input to 3 significant digits (a 384 x 384 product: nothing to save).
            with torch.autocast(x_in.device.type, enabled=False):
                pred = self.skip(x_in.float()) + pred.float()
        elif self.residual == "identity":
            pred = x_in + pred.to(x_in.dtype)  # in the input's precision: bf16 would round the copy
        stats = None
        if ranges is not None:
            surface_ranges = _Ranges()
            surface_ranges.add(surface)
            stats = torch.cat([ranges[0].stats(), ranges[1].stats(), surface_ranges.stats()])
        steps_used, flow_steps, stragglers, unfinished = counters
        return FlowOutput(pred, surface, steps_used, flow_steps, n_total, stragglers, stats, unfinished)

    def uses_masked_loop(self, device: torch.device) -> bool:
        if self.flow_loop not in FLOW_LOOPS:
            raise ValueError(f"flow_loop={self.flow_loop!r}: expected one of {', '.join(FLOW_LOOPS)}")
        return self.flow_loop == "masked" or (self.flow_loop == "auto" and device.type == "cuda")

    def _step(self, x, y, z, energy, hidden):
        if self.checkpoint_steps and self.training and torch.is_grad_enabled():
            return checkpoint(self._advance, x, y, z, energy, *hidden, use_reentrant=False)
        return self._advance(x, y, z, energy, *hidden)

    def _compact_loop(self, surface, flows, n_total, ranges):
        """Finished flows leave the tensors; one host read per flow step (the live count)."""
        x, y, z, energy, hidden, sample = flows
        steps_used, flow_steps, converged_for = 0, 0, 0
        n_alive = n_total
        for _ in range(self.max_steps):
            flow_steps += n_alive
            steps_used += 1
            x, y, z, energy, *hidden = self._step(x, y, z, energy, hidden)
            if ranges is not None:
                ranges[0].add(energy)
                ranges[1].add(hidden[-1])
            arrived = z >= self.D
            dead = (energy.abs() < self.energy_min) & ~arrived
            # Masked deposit over all live flows: no host sync to find the arrived ones.
            surface = self._deposit(surface, sample, x, y, energy * arrived.to(energy.dtype))
            keep = (~(arrived | dead)).nonzero().squeeze(1)  # the step's one host read
            n_alive = keep.numel()
            if n_alive == 0:
                break
            if n_alive < x.numel():
                x, y, z, energy, sample = x[keep], y[keep], z[keep], energy[keep], sample[keep]
                hidden = tuple(h[keep] for h in hidden)
            converged_for = converged_for + 1 if 1 - n_alive / n_total >= self.convergence_threshold else 0
            if self.adaptive_stop and converged_for >= self.patience:
                break
        if n_alive:
            # Stopped early: the stragglers deposit where they are, weighted by how far they got.
            surface = self._deposit(surface, sample, x, y, energy * (z / self.D).clamp(max=1))
        return surface, (steps_used, flow_steps, n_alive, None)

    def _masked_loop(self, surface, flows, n_total, ranges):
        """Every flow stays; `live` masks the finished ones and `running` says whether the
        compacting loop would still be going. Each flow's step is a function of its own row
        only, so the rows of finished flows compute on without touching the live ones, and
        everything they would add is multiplied by zero. Without fixed_steps: up to max_steps,
        with a host read every MASKED_CHECK_EVERY flow steps to stop once done (evaluation, and
        training before the trainer has chosen fixed_steps)."""
        x, y, z, energy, hidden, sample = flows
        dev, dt = x.device, energy.dtype
        live = torch.ones(n_total, dtype=torch.bool, device=dev)
        running = torch.ones((), dtype=torch.bool, device=dev)
        converged_for = torch.zeros((), dtype=torch.int64, device=dev)
        steps_used = torch.zeros((), dtype=torch.int64, device=dev)
        flow_steps = torch.zeros((), dtype=torch.int64, device=dev)
        stragglers = torch.zeros((), dtype=torch.int64, device=dev)
        n_steps = self.fixed_steps or self.max_steps
        check_every = 0 if self.fixed_steps else MASKED_CHECK_EVERY
        for i in range(n_steps):
            flow_steps = flow_steps + live.sum()
            steps_used = steps_used + running.long()
            x, y, z, energy, *hidden = self._step(x, y, z, energy, hidden)
            if ranges is not None:
                ranges[0].add(energy, live)
                ranges[1].add(hidden[-1], live)
            arrived = live & (z >= self.D)
            dead = live & (energy.abs() < self.energy_min) & ~arrived
            live = live & ~(arrived | dead)
            n_alive = live.sum()
            done = n_alive == 0
            converged = (1 - n_alive / n_total) >= self.convergence_threshold
            converged_for = torch.where(converged, converged_for + 1, 0)
            stop = running & ~done & (converged_for >= self.patience) if self.adaptive_stop else torch.zeros_like(done)
            # One deposit for the arrived and, on an adaptive stop, the stragglers, weighted by
            # how far they got (the two sets are disjoint).
            weight = arrived.to(dt) + (z / self.D).clamp(max=1) * (live & stop).to(dt)
            surface = self._deposit(surface, sample, x, y, energy * weight)
            stragglers = stragglers + (live & stop).sum()
            live = live & ~stop
            running = running & ~done & ~stop
            if check_every and (i + 1) % check_every == 0 and not bool(running):  # the chunk's host read
                break
        if n_steps == self.max_steps:
            # The compacting loop stops here too: the stragglers deposit as after an adaptive stop.
            surface = self._deposit(surface, sample, x, y, energy * (z / self.D).clamp(max=1) * live.to(dt))
            unfinished = torch.zeros_like(running)
        else:
            unfinished = running  # flows still travelling: the compacting loop would go on
        return surface, (steps_used, flow_steps, stragglers + live.sum(), unfinished)


def energy_flow_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    cosine_weight: float,
    nce_weight: float = 0.0,
    nce_temperature: float = 0.05,
) -> torch.Tensor:
    """MSE + cosine_weight * (1 - cosine) + nce_weight * InfoNCE, averaged over the batch.

    InfoNCE scores each prediction against every target of the batch (cosine / temperature) and
    asks for its own target to win: the in-batch targets are the negatives. MSE and cosine reward
    being near the answer; retrieval (group top-1) rewards being nearer to it than to the other
    answers, which is what this term trains. Under DDP each rank's batch is its own set of
    negatives."""
    mse = F.mse_loss(pred, target)
    cos = F.cosine_similarity(pred, target, dim=1).mean()
    loss = mse + cosine_weight * (1 - cos)
    if nce_weight > 0 and len(pred) > 1:
        logits = F.normalize(pred, dim=1) @ F.normalize(target, dim=1).T / nce_temperature
        loss = loss + nce_weight * F.cross_entropy(logits, torch.arange(len(pred), device=pred.device))
    return loss
