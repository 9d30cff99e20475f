"""The vectorised model equals the per-flow reference (bench/reference_model.py): output surface,
loss and every parameter gradient within 1e-5, in float64 so the comparison measures the
algorithm, not float32 summation order."""

import pytest
import torch

from bench.reference_model import reference_forward
from pipeline.model import EnergyFlowModel, energy_flow_loss

pytestmark = pytest.mark.unit

BASE = dict(
    lattice_width=4,
    lattice_height=3,
    lattice_depth=3,
    max_active_flows=1000,
    cell_state_dim=4,
    neuron_hidden=8,
    carrier_layers=2,
    carrier_hidden=8,
    min_forward=0.3,
    max_forward=1.2,
    max_lateral=1.0,
    energy_min=0.0,
    convergence_threshold=0.9,
    patience=2,
    max_steps=30,
    adaptive_stop=True,
    output_hidden=16,
    checkpoint_steps=False,
)

CASES = {
    "adaptive_on": dict(convergence_threshold=0.5, patience=2, min_forward=0.05, max_forward=0.5),
    "adaptive_off": dict(convergence_threshold=0.5, patience=2, min_forward=0.05, max_forward=0.5, adaptive_stop=False),
    "early_stop_with_stragglers": dict(convergence_threshold=0.3, patience=1, min_forward=0.05, max_forward=0.5),
    "max_steps_cuts": dict(max_steps=2, adaptive_stop=False),
    "flows_dying": dict(energy_min=0.3),
    "spawn_capped": dict(max_active_flows=9),  # 3 samples x 3 flows of 12 input cells
    "one_layer_wide": dict(carrier_layers=1, carrier_hidden=12, lattice_width=5, lattice_height=2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_vectorised_equals_per_flow_reference(case):
    torch.manual_seed(1)
    model = EnergyFlowModel(6, **{**BASE, **CASES[case]}).double()
    # Large random weights, so flows move at different speeds, drift, die and arrive at different
    # steps (at the default init they move almost in lockstep and exercise little).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1.0)
    x, y = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)

    out = model(x)
    loss = energy_flow_loss(out.pred, y, 1.0)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    ref_pred, ref_surface, ref_steps, ref_flow_steps = reference_forward(model, x)
    ref_loss = energy_flow_loss(ref_pred, y, 1.0)
    ref_grads = torch.autograd.grad(ref_loss, list(model.parameters()), allow_unused=True)

    assert (out.steps_used, out.flow_steps) == (ref_steps, ref_flow_steps)
    torch.testing.assert_close(out.surface, ref_surface, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=0)
    for (name, _), g, rg in zip(model.named_parameters(), grads, ref_grads):
        if g is None or rg is None:
            assert g is None and rg is None, name
            continue
        torch.testing.assert_close(g, rg, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")
    if case == "flows_dying":
        assert out.flow_steps < out.spawned * out.steps_used  # some flows really died
    if case == "spawn_capped":
        assert out.spawned == 9
    if case == "adaptive_off":
        assert out.stragglers == 0  # ran until every flow arrived or died
    if case in ("adaptive_on", "early_stop_with_stragglers"):
        assert out.stragglers > 0 and out.steps_used < model.step_bound  # stopped before every flow arrived
