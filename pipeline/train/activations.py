"""What a training step saves for backward, measured by a probe of the model's own flow step
(the activations part of pipeline/train/memory_estimate.py)."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from pipeline.model import EnergyFlowModel

MB = 2**20
FP32 = 4  # bytes per parameter, gradient and AdamW moment: the weights stay fp32 under autocast

# The probe runs the flow step on this many flows, for this many steps, twice: the difference
# between the two runs is what a flow step costs, the rest is per forward pass (autocast's
# casts of the weights, which it caches per forward). Small enough to be quick for the largest
# preset's carrier; 3 steps because autocast casts twice before its cache settles.
_PROBE_FLOWS = (16, 64)
_PROBE_STEPS = 3
# The probe builds the neuron and carrier with the config's sizes (the lattice shrunk to 2x2),
# well under this for every preset. Past this it runs on the meta
# device instead: no memory, and the same bytes as the CPU in fp32 (equal for the default, seed
# and checkpointed sizes), but no autocast (meta has none), so a huge carrier under fp16/bf16
# gets its fp32 figure (larger than the bf16 one: autocast saves half-width activations).
_PROBE_MAX_BYTES = 256 * MB


def _probe_model(model_cfg, dim: int, device: str) -> EnergyFlowModel:
    cfg = {**{k: model_cfg[k] for k in model_cfg}, "lattice_width": 2, "lattice_height": 2}
    # fork_rng: building on the CPU draws initial weights; the run's RNG stream must not move.
    with torch.random.fork_rng(devices=[]), torch.device(device):
        model = EnergyFlowModel.from_config(cfg, dim)
    return model.train()


def _saved_bytes(model: EnergyFlowModel, n: int, amp_dtype: Optional[torch.dtype]) -> int:
    """Bytes saved for backward by `_PROBE_STEPS` flow steps of `n` flows: the loop body of
    EnergyFlowModel.forward (advance, deposit, compaction), parameters excluded (counted as
    params), each storage once (views share one)."""
    device = next(model.parameters()).device
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}
    kept = []  # holding them keeps a freed storage's address from being reused and miscounted

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s._cdata not in params and s._cdata not in seen:
            seen[s._cdata] = s.nbytes()
            kept.append(t)
        return t

    # As forward starts them: positions at cell centres, zero z and hidden state, energies from the
    # input map (so they require grad). The device is named on each tensor, not through a
    # `with torch.device(...)` block: once sentence-transformers is loaded in the process (tests do
    # that), linspace under that block came out on the CPU and the meta probe failed.
    x = torch.linspace(0.5, model.W - 0.5, n, device=device)
    y = torch.linspace(0.5, model.H - 0.5, n, device=device)
    z = torch.zeros(n, device=device)
    energy = torch.linspace(0.2, 0.9, n, device=device).requires_grad_()
    hidden = tuple(torch.zeros(n, model.carrier_hidden, device=device) for _ in range(model.carrier_layers))
    sample = torch.arange(n, device=device) % 2
    surface = torch.zeros(2 * model.n_cells, device=device)
    keep = torch.arange(n, device=device)
    amp = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
        for _ in range(_PROBE_STEPS):
            if model.checkpoint_steps:
                x, y, z, energy, *hidden = torch_checkpoint(
                    model._advance, x, y, z, energy, *hidden, use_reentrant=False
                )
            else:
                x, y, z, energy, *hidden = model._advance(x, y, z, energy, *hidden)
            arrived = z >= model.D
            surface = model._deposit(surface, sample, x, y, energy * arrived.to(energy.dtype))
            # Compaction on every step (forward compacts only when a flow finished): 8 bytes a
            # flow for the shared index, an upper bound.
            x, y, z, energy, sample = x[keep], y[keep], z[keep], energy[keep], sample[keep]
            hidden = tuple(h[keep] for h in hidden)
    return sum(seen.values())


def flow_step_bytes(model_cfg, dim: int, amp_dtype: Optional[torch.dtype] = None) -> tuple[float, float, str]:
    """(bytes saved for backward per flow step, bytes per forward pass that do not scale with
    flows, where the probe ran).

    Measured, not derived: a probe runs the model's own `_advance` and deposit on a few flows
    under torch.autograd.graph.saved_tensors_hooks (as bench/model.py's activation_bytes does)
    and counts the storages. Why not a formula: what is saved depends on torch's kernels and on
    precision, and a formula drifts from both. The CPU GRU cell saves ~8 x carrier_hidden floats
    per layer per flow, and bf16 autocast saves less (this function at the default sizes: 3,129
    bytes per flow step against 5,095 in fp32, plus 107 KB of weights autocast casts once per
    forward; the train stage logs the figure it used). A formula would have to be
    re-derived for each; the probe follows them. The flow count does not change what a flow saves
    (the lattice is shrunk to 2 x 2 for the probe: a flow's tensors do not depend on W or H).
    On CUDA the probe still runs on the CPU: CUDA's fused GRU cell saves a (flows, 5 x hidden)
    workspace plus its matmul inputs, ~7 x hidden per layer instead of ~8 (not measured here: no
    GPU on this machine), so the CPU figure is an upper bound there."""
    shapes = _probe_model(model_cfg, dim, "meta")
    probe_bytes = FP32 * sum(p.numel() for p in shapes.parameters())
    where = "cpu" if probe_bytes <= _PROBE_MAX_BYTES else "meta"
    model = _probe_model(model_cfg, dim, where) if where == "cpu" else shapes
    n1, n2 = _PROBE_FLOWS
    with torch.enable_grad():
        b1 = _saved_bytes(model, n1, amp_dtype if where == "cpu" else None)
        b2 = _saved_bytes(model, n2, amp_dtype if where == "cpu" else None)
    per_flow_step = (b2 - b1) / (_PROBE_STEPS * (n2 - n1))
    per_forward = max(0.0, b1 - _PROBE_STEPS * n1 * per_flow_step)
    return per_flow_step, per_forward, where


def fixed_activation_bytes(batch: int, n_cells: int, dim: int, output_hidden: int, flows: int) -> int:
    """Saved for backward once per forward, whatever the flows do (fp32): the input map's
    LayerNorm input and output (batch, dim) and tanh output (batch, cells); the spawn indices
    (topk, gather: int64); the output map's LayerNorm input (the surface) and output (batch,
    cells) and its Linear/GELU/Linear inputs (batch, output_hidden); the loss's (batch, dim)
    prediction and target terms. The (batch, cells) tensors are what matters: 3 per sample."""
    floats = batch * (3 * n_cells + 2 * dim + 2 * output_hidden + 3 * dim) + 4 * batch  # + LN mean/rstd
    return FP32 * floats + 8 * 2 * batch * flows
