import math

import pytest
import torch

from pipeline.model import EnergyFlowModel, energy_flow_loss

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_intra_op_thread")]


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


@pytest.mark.parametrize("residual", ["identity", "linear"])
def test_residual_path_keeps_the_input_s_precision_under_bf16_autocast(residual):
    m = make(residual=residual)
    x = torch.randn(4, 6) * 1.001
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = m(x).pred
    # Untrained, the prediction is the input itself, in fp32: bf16 would round it to ~3 digits.
    assert pred.dtype == torch.float32
    assert torch.allclose(pred, x, rtol=0, atol=1e-6)


@pytest.mark.parametrize("residual", ["identity", "linear"])
def test_residual_model_starts_as_the_identity_and_learns_a_correction(residual):
    m = make(residual=residual)
    x = torch.randn(5, 6)
    # The output mapper's last layer starts at zero: an untrained residual model copies its input.
    assert torch.allclose(m(x).pred, x, atol=1e-6)
    y = x + 0.5
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    before = energy_flow_loss(m(x).pred, y, 1.0).item()
    for _ in range(20):
        opt.zero_grad()
        energy_flow_loss(m(x).pred, y, 1.0).backward()
        opt.step()
    after = energy_flow_loss(m(x).pred, y, 1.0).item()
    assert after < 0.5 * before
    # The flows carry the correction: the lattice, neuron and carrier all get gradients.
    energy_flow_loss(m(x).pred, y, 1.0).backward()
    for name in ("lattice.state", "neuron.net.0.weight", "carrier.cells.0.weight_ih"):
        assert m.get_parameter(name).grad.abs().sum() > 0, name
    assert (m.skip is not None) == (residual == "linear")


def test_unknown_residual_is_refused():
    with pytest.raises(ValueError, match="residual='gated'"):
        make(residual="gated")


def test_infonce_term_rewards_the_own_target_over_the_batch_s_others():
    target = torch.nn.functional.normalize(torch.randn(8, 6), dim=1)
    own = target.clone()
    shuffled = target[torch.tensor([1, 2, 3, 4, 5, 6, 7, 0])]
    # Off: MSE + cosine only, as before.
    assert energy_flow_loss(own, target, 1.0, nce_weight=0.0).item() == pytest.approx(0.0, abs=1e-6)
    on_own = energy_flow_loss(own, target, 1.0, nce_weight=1.0, nce_temperature=0.05)
    on_shuffled = energy_flow_loss(shuffled, target, 1.0, nce_weight=1.0, nce_temperature=0.05)
    # Cross-entropy of cosine / 0.05: the own target's logit is 20, the others' at most
    # 20 * max cosine, so the own-target loss is small but not zero, the shuffled one large.
    logits = target @ target.T / 0.05
    expected = torch.nn.functional.cross_entropy(logits, torch.arange(8))
    assert on_own.item() == pytest.approx(expected.item(), rel=1e-5)
    assert on_shuffled.item() > on_own.item() + 1.0
    # One row has no negatives: the term is skipped rather than a constant log(1) = 0.
    assert energy_flow_loss(own[:1], target[:1], 1.0, nce_weight=1.0).item() == pytest.approx(0.0, abs=1e-6)


def test_value_ranges_are_recorded_only_when_asked():
    from pipeline.model.energy_flow import RANGE_KEYS

    m = make()
    x = torch.randn(5, 6)
    assert m(x).ranges is None
    m.record_ranges = True
    out = m(x)
    r = dict(zip(RANGE_KEYS, out.ranges.tolist()))
    s = out.surface
    assert r["surface_min"] == pytest.approx(s.min().item())
    assert r["surface_max"] == pytest.approx(s.max().item())
    assert r["surface_rms"] == pytest.approx(s.square().mean().sqrt().item(), rel=1e-5)
    # Carried energies are tanh-bounded, hidden states are GRU outputs in (-1, 1).
    for what in ("energy", "hidden"):
        lo, hi, rms = r[f"{what}_min"], r[f"{what}_max"], r[f"{what}_rms"]
        assert -1 <= lo <= hi <= 1 and 0 < rms <= max(abs(lo), abs(hi))
    # Recording changes nothing the model computes.
    m.record_ranges = False
    assert torch.equal(m(x).pred, out.pred)
