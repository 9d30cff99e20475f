import math

import pytest
import torch

from pipeline.model import EnergyFlowModel, energy_flow_loss

pytestmark = pytest.mark.unit

SMALL = dict(
    lattice_width=4,
    lattice_height=3,
    lattice_depth=3,
    max_active_flows=40,
    cell_state_dim=4,
    neuron_hidden=8,
    carrier_layers=2,
    carrier_hidden=8,
    min_forward=0.5,
    max_forward=1.5,
    max_lateral=1.0,
    energy_min=0.0,
    convergence_threshold=0.95,
    patience=2,
    max_steps=50,
    adaptive_stop=True,
    output_hidden=16,
    checkpoint_steps=False,
)


def make(**kw):
    torch.manual_seed(0)
    return EnergyFlowModel(6, **{**SMALL, **kw})


def test_shapes_and_spawn_cap():
    m = make()
    x = torch.randn(5, 6)
    out = m(x)
    assert out.pred.shape == (5, 6) and out.surface.shape == (5, 12)
    # max_active_flows 40 over a batch of 5 -> 8 flows per sample (of 12 input cells).
    assert m.flows_per_sample(5) == 8 and out.spawned == 40
    assert m.flows_per_sample(100) == 1  # at least one flow per sample
    assert m.flows_per_sample(1) == 12  # never more than the input face has cells
    assert torch.isfinite(out.pred).all()


def test_every_flow_arrives_within_the_step_bound():
    m = make(adaptive_stop=False, min_forward=0.4, max_forward=0.6)
    out = m(torch.randn(4, 6))
    assert m.step_bound == math.ceil(3 / 0.4) == 8
    assert out.steps_used <= m.step_bound
    # No deaths (energy_min 0) and no early stop: every flow arrived, none left travelling.
    assert out.stragglers == 0 and out.flow_steps >= out.spawned


def test_fixed_speed_flows_all_arrive_together():
    # min_forward == max_forward == 1 on depth 3: every flow arrives exactly at step 3.
    m = make(adaptive_stop=False, min_forward=1.0, max_forward=1.0)
    out = m(torch.randn(3, 6))
    assert out.steps_used == 3
    assert out.flow_steps == 3 * out.spawned


def test_flows_below_energy_min_die_and_deposit_nothing():
    m = make(energy_min=0.999999)  # tanh energies are practically never above this
    out = m(torch.randn(3, 6))
    assert out.steps_used == 1
    assert torch.count_nonzero(out.surface) == 0


def test_bilinear_deposit_conserves_and_places_energy():
    m = make()
    n = 50
    sample = torch.randint(0, 2, (n,))
    x = torch.rand(n) * 3 + 0.5  # anywhere in [0.5, W - 0.5]
    y = torch.rand(n) * 2 + 0.5
    value = torch.rand(n)
    surface = m._deposit(torch.zeros(2 * 12), sample, x, y, value).view(2, 12)
    for s in range(2):
        assert surface[s].sum().item() == pytest.approx(value[sample == s].sum().item(), rel=1e-5)
    # At a cell centre the whole value lands on that one cell.
    one = m._deposit(
        torch.zeros(12), torch.zeros(1, dtype=torch.long), torch.tensor([2.5]), torch.tensor([1.5]), torch.tensor([0.7])
    )
    assert one[1 * 4 + 2].item() == pytest.approx(0.7) and one.sum().item() == pytest.approx(0.7)


def test_gradients_reach_every_part():
    m = make()
    out = m(torch.randn(4, 6))
    energy_flow_loss(out.pred, torch.randn(4, 6), 1.0).backward()
    for name in ("input_mapper", "lattice", "neuron", "carrier", "output_mapper"):
        grads = [p.grad for p in getattr(m, name).parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert any(g.abs().sum() > 0 for g in grads), name


def test_checkpointing_gives_the_same_result():
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    results = []
    for ckpt in (False, True):
        m = make(checkpoint_steps=ckpt)
        out = m(x)
        energy_flow_loss(out.pred, y, 1.0).backward()
        results.append((out.pred.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)


def test_nothing_is_kept_on_the_module_between_batches():
    m = make()

    def tensors_held(module):
        held = {}
        for name, sub in module.named_modules():
            for k, v in vars(sub).items():
                if isinstance(v, torch.Tensor) and k not in ("_parameters", "_buffers"):
                    held[f"{name}.{k}"] = v
        return held

    before = tensors_held(m)
    for _ in range(2):
        out = m(torch.randn(4, 6))
        energy_flow_loss(out.pred, torch.randn(4, 6), 1.0).backward()
    assert tensors_held(m).keys() == before.keys()
    assert all(b.grad_fn is None for b in m.buffers())


def test_adaptive_stop_cuts_steps():
    # Slow flows (min_forward 0.05) with large random weights, so speeds differ: without adaptive
    # stopping the loop waits for the last one; with it, it stops once half have been done for 2
    # steps and deposits the stragglers where they are.
    kw = dict(min_forward=0.05, max_forward=0.5, convergence_threshold=0.5, patience=2)
    torch.manual_seed(3)
    x = torch.randn(8, 6)
    outs = []
    for adaptive in (False, True):
        m = make(adaptive_stop=adaptive, **kw)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 1.0)
        outs.append(m(x))
    full, early = outs
    assert full.stragglers == 0
    assert early.steps_used < full.steps_used and early.stragglers > 0


def test_energies_stay_bounded():
    # Every energy is tanh-bounded and a flow deposits at most its |energy| in total, so a
    # sample's surface mass never exceeds its number of flows.
    m = make(energy_min=0.0)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 3.0)  # large weights push every pre-activation into saturation
    out = m(torch.randn(4, 6) * 10)
    per_sample = out.spawned // 4
    assert (out.surface.abs().sum(dim=1) <= per_sample + 1e-4).all()
    assert torch.isfinite(out.pred).all()


def test_bf16_autocast_forward_and_backward_on_cpu():
    m = make()
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
        loss = energy_flow_loss(out.pred.float(), y, 1.0)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
