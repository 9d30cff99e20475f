"""Per-flow reference implementation of the energy-flow forward pass: the test oracle.

It loops over steps and over flows one at a time, as the prototype did (`for flow in active_flows`),
with plain Python for positions, cell lookup, arrival, death and the bilinear deposit, and the
model's own parameters applied to one flow at a time. It shares no code path with the vectorised
forward in pipeline/model/energy_flow.py beyond the parameters, so agreement between the two
(tests/test_model_reference.py) says the vectorisation is right. It is also the "before" side
of bench.model's speedup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Flow:
    sample: int
    x: torch.Tensor  # 0-d tensors (differentiable)
    y: torch.Tensor
    z: torch.Tensor
    energy: torch.Tensor
    hidden: list  # one (1, C) tensor per carrier layer


def _linear(layer, v):
    return F.linear(v, layer.weight, layer.bias)


def _gru_cell(cell, inp, h):
    """torch.nn.GRUCell written out (gates r, z, n in PyTorch's order)."""
    gi = F.linear(inp, cell.weight_ih, cell.bias_ih)
    gh = F.linear(h, cell.weight_hh, cell.bias_hh)
    i_r, i_z, i_n = gi.chunk(3, dim=1)
    h_r, h_z, h_n = gh.chunk(3, dim=1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def _neuron(model, state, energy, pos_norm):
    net = model.neuron.net
    v = torch.cat([state, energy.reshape(1, 1), pos_norm.reshape(1, 3)], dim=1)
    return _linear(net[2], F.gelu(_linear(net[0], v)))


def _deposit(surface, model, flow, value):
    """Bilinear splat on cell centres, one flow, Python indices."""
    W, H = model.W, model.H
    u, v = flow.x - 0.5, flow.y - 0.5
    i0 = min(max(math.floor(u.item()), 0), max(W - 2, 0))
    j0 = min(max(math.floor(v.item()), 0), max(H - 2, 0))
    fu = torch.clamp(u - i0, 0, 1)
    fv = torch.clamp(v - j0, 0, 1)
    i1, j1 = min(i0 + 1, W - 1), min(j0 + 1, H - 1)
    row = surface[flow.sample]
    for (i, j), w in (
        ((i0, j0), (1 - fu) * (1 - fv)),
        ((i1, j0), fu * (1 - fv)),
        ((i0, j1), (1 - fu) * fv),
        ((i1, j1), fu * fv),
    ):
        row[j * W + i] = row[j * W + i] + w * value


def reference_forward(model, x_in: torch.Tensor):
    """(pred (B, E), surface (B, W*H), steps_used, flow_steps) computed one flow at a time."""
    W, H, D = model.W, model.H, model.D
    B = x_in.shape[0]
    carrier = model.carrier
    energies0 = torch.tanh(_linear(model.input_mapper.proj, model.input_mapper.norm(x_in)))
    F_ = max(1, min(W * H, model.max_active_flows // B))
    flows = []
    for b in range(B):
        order = sorted(range(W * H), key=lambda c: -abs(energies0[b, c].item()))[:F_]
        for c in order:
            flows.append(
                Flow(
                    b,
                    x_in.new_tensor((c % W) + 0.5),
                    x_in.new_tensor((c // W) + 0.5),
                    x_in.new_tensor(0.0),
                    energies0[b, c],
                    [x_in.new_zeros(1, model.carrier_hidden) for _ in carrier.cells],
                )
            )
    n_total = len(flows)
    surface = [[x_in.new_tensor(0.0) for _ in range(W * H)] for _ in range(B)]
    steps_used = flow_steps = converged_for = 0
    alive = flows
    for _ in range(model.max_steps):
        steps_used += 1
        flow_steps += len(alive)
        still = []
        for f in alive:
            cx = min(max(math.floor(f.x.item()), 0), W - 1)
            cy = min(max(math.floor(f.y.item()), 0), H - 1)
            cz = min(max(math.floor(f.z.item()), 0), D - 1)
            state = model.lattice.state[(cz * H + cy) * W + cx].reshape(1, -1)
            pos = torch.stack([f.x / W, f.y / H, f.z / D])
            inp = _neuron(model, state, f.energy, pos)
            new_hidden = []
            for cell, h in zip(carrier.cells, f.hidden):
                inp = _gru_cell(cell, inp, h)
                new_hidden.append(inp)
            lateral = carrier.max_lateral * torch.tanh(_linear(carrier.lateral, inp))[0]
            fwd = (
                carrier.min_forward
                + (carrier.max_forward - carrier.min_forward) * torch.sigmoid(_linear(carrier.forward_head, inp))[0, 0]
            )
            f.energy = torch.tanh(f.energy + _linear(carrier.energy, inp)[0, 0])
            f.x = torch.clamp(f.x + lateral[0], 0.5, W - 0.5)
            f.y = torch.clamp(f.y + lateral[1], 0.5, H - 0.5)
            f.z = f.z + fwd
            f.hidden = new_hidden
            if f.z.item() >= D:
                _deposit(surface, model, f, f.energy)  # arrived
            elif abs(f.energy.item()) < model.energy_min:
                pass  # died: deposits nothing
            else:
                still.append(f)
        alive = still
        if not alive:
            break
        converged_for = converged_for + 1 if 1 - len(alive) / n_total >= model.convergence_threshold else 0
        if model.adaptive_stop and converged_for >= model.patience:
            break
    for f in alive:  # stopped early: deposit where they are, weighted by how far they got
        _deposit(surface, model, f, f.energy * torch.clamp(f.z / D, max=1))
    surface_t = torch.stack([torch.stack(row) for row in surface])
    return model.output_mapper(surface_t), surface_t, steps_used, flow_steps
