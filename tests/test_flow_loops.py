"""The masked flow loop (the GPU's: fixed shapes, no host read inside) computes what the compacting
loop (the CPU's) computes: the same prediction, surface, counters, value ranges and gradients for
the same batch, in every way a loop can end (all arrived, flows dying, an adaptive stop with
stragglers, max_steps reached), within 1e-5 relative (float sums in another order; measured
0 to 6e-8)."""

import pytest
import torch

from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.model.energy_flow import FLOW_LOOPS, MASKED_CHECK_EVERY
from pipeline.train.step_counters import count_host
from tests.test_model import SMALL

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_intra_op_thread")]


# The model tests' small model, a little wider and deeper so that flows differ in how long they take.
BASE = {
    **SMALL,
    "lattice_width": 5,
    "lattice_height": 4,
    "lattice_depth": 6,
    "max_active_flows": 240,
    "cell_state_dim": 6,
    "neuron_hidden": 12,
    "carrier_hidden": 12,
    "energy_min": 0.0,
    "output_hidden": 16,
    "residual": "linear",
}
# Each ends the loop another way (checked by the test, not assumed).
ENDINGS = {
    "all_arrive": {},
    "flows_die": {"energy_min": 0.25},
    "adaptive_stop_with_stragglers": {"convergence_threshold": 0.3, "patience": 1, "min_forward": 0.05},
    "max_steps_reached": {"max_steps": 3, "min_forward": 0.05, "adaptive_stop": False},
    "checkpointed_steps": {"checkpoint_steps": True},
    "no_residual": {"residual": "none"},
}
TOL = 1e-5


def run(model, loop, x, y):
    model.flow_loop = loop
    model.zero_grad(set_to_none=True)
    model.record_ranges = True
    out = model(x)
    energy_flow_loss(out.pred, y, cosine_weight=1.0, nce_weight=0.1).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, grads


def close(a, b):
    scale = max(a.abs().max().item(), 1e-6)
    return (a - b).abs().max().item() <= TOL * scale


@pytest.mark.parametrize("ending", ENDINGS)
def test_masked_loop_equals_compacting_loop(ending):
    torch.manual_seed(0)
    model = EnergyFlowModel(8, **{**BASE, **ENDINGS[ending]})
    with torch.no_grad():  # a trained-looking carrier: flows that differ in speed and energy
        for p in model.carrier.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    x, y = torch.randn(12, 8), torch.randn(12, 8)
    compact, g_compact = run(model, "compact", x, y)
    masked, g_masked = run(model, "masked", x, y)

    assert isinstance(compact.steps_used, int) and masked.steps_used.dim() == 0
    assert (compact.steps_used, compact.flow_steps, compact.stragglers) == (
        int(masked.steps_used),
        int(masked.flow_steps),
        int(masked.stragglers),
    )
    assert close(compact.pred, masked.pred)
    assert close(compact.surface, masked.surface)
    assert close(compact.ranges, masked.ranges)
    for name, g in g_compact.items():
        assert close(g, g_masked[name]), name
    # The ending is the one named: the cases cover what they claim.
    if ending == "flows_die":
        assert compact.flow_steps < compact.spawned * compact.steps_used
    if ending == "adaptive_stop_with_stragglers":
        assert 0 < compact.stragglers and compact.steps_used < model.max_steps
    if ending == "max_steps_reached":
        assert compact.steps_used == model.max_steps and compact.stragglers > 0


def test_masked_loop_makes_no_host_read_with_fixed_steps():
    torch.manual_seed(0)
    model = EnergyFlowModel(8, **BASE)
    x = torch.randn(12, 8)
    model.flow_loop = "compact"
    with count_host() as compact:
        ref = model(x)
    model.flow_loop, model.fixed_steps = "masked", model.max_steps
    with count_host() as fixed:
        out = model(x)
    assert compact.host_syncs == ref.steps_used  # one live count per flow step
    assert fixed.host_syncs == 0
    assert close(ref.pred, out.pred)
    model.fixed_steps = None  # up to max_steps, a read every few flow steps to stop once done
    with count_host() as checked:
        model(x)
    assert ref.steps_used > MASKED_CHECK_EVERY  # (so the check below is not one read by chance)
    assert checked.host_syncs == -(-ref.steps_used // MASKED_CHECK_EVERY)  # one read per chunk, to the first done


def test_fixed_steps_too_few_reports_unfinished():
    torch.manual_seed(0)
    model = EnergyFlowModel(8, **BASE)
    x = torch.randn(12, 8)
    model.flow_loop = "compact"
    needed = model(x).steps_used
    model.flow_loop = "masked"
    model.fixed_steps = needed
    assert not bool(model(x).unfinished)
    model.fixed_steps = needed - 1
    assert bool(model(x).unfinished)


def test_auto_picks_masked_on_cuda_only():
    model = EnergyFlowModel(8, **BASE)
    assert FLOW_LOOPS == ("auto", "compact", "masked")
    assert not model.uses_masked_loop(torch.device("cpu"))
    assert model.uses_masked_loop(torch.device("cuda"))
    model.flow_loop = "masked"
    assert model.uses_masked_loop(torch.device("cpu"))
    model.flow_loop = "sideways"
    with pytest.raises(ValueError, match="flow_loop='sideways'"):
        model.uses_masked_loop(torch.device("cpu"))
