"""pipeline/train/optimizer.AdamW: torch's AdamW arithmetic with an exact square root on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.exact_math import exact_sqrt
from pipeline.train.optimizer import AdamW

pytestmark = pytest.mark.unit


def _exact_sqrt(self):
    """For torch's own AdamW: the exact root where it takes MKL's (the CPU, no autograd)."""
    return exact_sqrt(self) if self.device.type == "cpu" and not self.requires_grad else _TORCH_SQRT(self)


_TORCH_SQRT = torch.Tensor.sqrt


def _train(opt_class, steps=25, monkeypatch=None, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    opt = opt_class(model.parameters(), lr=3e-3, weight_decay=0.01, **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 16, generator=gen) * 100  # large gradients: sqrt of many magnitudes
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def test_same_bits_as_torch_adamw_given_an_exact_sqrt(monkeypatch):
    ours, ours_opt = _train(AdamW)
    monkeypatch.setattr(torch.Tensor, "sqrt", _exact_sqrt)
    theirs, theirs_opt = _train(torch.optim.AdamW)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    for sa, sb in zip(ours_opt.state.values(), theirs_opt.state.values()):
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


def test_the_square_root_is_correctly_rounded_for_every_float():
    """Every float32 in [1, 4): every mantissa at both exponent parities, so every normal float up
    to a power of 4. The exact root, rounded once, is the float64 root rounded to float32 (53 bits
    are more than the 2 x 24 + 2 that rule needs)."""
    x = np.arange(0x3F800000, 0x40800000, dtype=np.uint32).view(np.float32)
    exact = np.sqrt(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(exact_sqrt(torch.from_numpy(x)).numpy(), exact)
    tiny = np.array([0.0, 1e-45, 4e-40, 1e-30, 3e38], dtype=np.float32)  # subnormals, extremes
    exact_tiny = np.sqrt(tiny.astype(np.float64)).astype(np.float32)
    assert np.array_equal(exact_sqrt(torch.from_numpy(tiny)).numpy(), exact_tiny)


def test_checkpoints_load_across_torch_adamw_and_ours():
    _, ours_opt = _train(AdamW, steps=3)
    _, theirs_opt = _train(torch.optim.AdamW, steps=3)
    a, _ = _train(AdamW, steps=0)
    a_opt = AdamW(a.parameters(), lr=3e-3)
    a_opt.load_state_dict(theirs_opt.state_dict())
    b_opt = torch.optim.AdamW(a.parameters(), lr=3e-3)
    b_opt.load_state_dict(ours_opt.state_dict())
    assert a_opt.state_dict()["state"].keys() == ours_opt.state_dict()["state"].keys()


def test_what_it_does_not_cover_is_torch_step(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: calls.append(1))
    _train(AdamW, steps=2, amsgrad=True)
    assert len(calls) == 2
