"""Gradient health and the skip decision of one optimizer step, computed on the device.

Everything here is a tensor op: per-module gradient norms, the global norm, clipping, the spike
test and the window's accumulators stay on the device. The trainer reads one small vector per
step (the decision code, plus the window's accumulators on a log step): that read is the step's
only host sync. The code packs every fact a skip needs to be explained into one integer:

    bit 0 / 1   the loss is NaN / Inf
    bit 2 / 3   the global gradient norm is NaN / Inf (some gradient element is)
    bit 4       the loss is a spike (above mean + k * std of the trailing window of good losses)
    bit 5       flows were still travelling when a fixed-length flow loop ended (an overrun: the
                compacting loop would have gone on, so the step's update is not applied)
    bit 6 + i   module i (nearest the loss first) holds a non-finite gradient
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from pipeline.core.config import MIN_SPIKE_WINDOW
from pipeline.core.exact_math import exact_sqrt
from pipeline.model.energy_flow import RANGE_KEYS

NAN_LOSS, INF_LOSS, NAN_GRAD, INF_GRAD, SPIKE, OVERRUN = 1, 2, 4, 8, 16, 32
NONFINITE = NAN_LOSS | INF_LOSS | NAN_GRAD | INF_GRAD
MODULE_SHIFT = 6
ZONES = ("healthy", "warning", "critical", "exploded")
# The spike test needs some history: mean and std of fewer losses flag ordinary noise. One floor
# for the trainer, the config check of train.spike_window and the report's offline scan.
MIN_SPIKE_HISTORY = MIN_SPIKE_WINDOW


def decode_kind(code: int) -> Optional[str]:
    """nan_loss / inf_loss / nan_grad / inf_grad for a non-finite step (loss first), else None."""
    kinds = ((NAN_LOSS, "nan_loss"), (INF_LOSS, "inf_loss"), (NAN_GRAD, "nan_grad"), (INF_GRAD, "inf_grad"))
    return next((kind for bit, kind in kinds if code & bit), None)


class SpikeDetector:
    """Trailing window of the last `window` finite losses as a device ring buffer."""

    def __init__(self, window: int, k: float, device: torch.device):
        self.window, self.k = window, k
        self.buf = torch.zeros(window, dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self._slots = torch.arange(window, device=device)

    def threshold(self) -> torch.Tensor:
        """mean + k * std of the window; +inf until MIN_SPIKE_HISTORY losses are in."""
        n = self.count.clamp(max=self.window)
        filled = (self._slots < n).to(self.buf.dtype)
        nf = n.to(self.buf.dtype)
        mean = (self.buf * filled).sum() / nf.clamp(min=1)
        var = (((self.buf - mean) * filled) ** 2).sum() / (nf - 1).clamp(min=1)
        # Floor std at 1e-9 * |mean|, so a perfectly flat loss does not flag its own rounding.
        std = torch.maximum(exact_sqrt(var), 1e-9 * mean.abs())
        enough = n >= min(MIN_SPIKE_HISTORY, self.window)
        return torch.where(enough, mean + self.k * std, torch.full_like(mean, float("inf")))

    def push(self, loss: torch.Tensor, threshold: torch.Tensor) -> None:
        """Add a finite loss to the window, winsorised at the threshold: a x1000 spike does not
        inflate the std and mask the next one, yet a lasting shift of the loss level still moves
        the window (each capped value raises mean and std), so it is not flagged forever."""
        keep = torch.isfinite(loss)
        slot = (self.count % self.window).view(1)
        value = torch.minimum(loss.to(self.buf.dtype), threshold)
        new = torch.where(keep, value, self.buf[slot].squeeze(0))
        self.buf.index_put_((slot,), new.view(1))
        self.count += keep.to(torch.long)

    def state_dict(self) -> dict:
        return {"buf": self.buf.cpu(), "count": self.count.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.buf.copy_(state["buf"])
        self.count.copy_(state["count"])


class StepHealth:
    """Measures a step's gradients, clips them and keeps the log window's accumulators."""

    def __init__(
        self,
        model: nn.Module,
        *,
        grad_clip: float,
        grad_warning: float,
        grad_critical: float,
        spike_window: int,
        spike_k: float,
        skip_spikes: bool,
        device: torch.device,
        agree: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ):
        # Top-level modules nearest the loss first (backward order): the first one with a
        # non-finite gradient is where the trouble surfaced.
        self.modules = [
            (name, [p for p in m.parameters() if p.requires_grad]) for name, m in reversed(list(model.named_children()))
        ]
        self.modules = [(n, ps) for n, ps in self.modules if ps]
        self.module_names = [n for n, _ in self.modules]
        self.params = [p for _, ps in self.modules for p in ps]
        self.grad_clip, self.grad_warning, self.grad_critical = grad_clip, grad_warning, grad_critical
        self.skip_spikes = skip_spikes
        self.device = device
        self.spikes = SpikeDetector(spike_window, spike_k, device)
        # The code's bits in the order of measure()'s flags: the loss's and the norm's, then one per module.
        module_bits = [1 << (MODULE_SHIFT + i) for i in range(len(self.modules))]
        self._code_bits = torch.tensor(
            [NAN_LOSS, INF_LOSS, NAN_GRAD, INF_GRAD, SPIKE, OVERRUN, *module_bits], dtype=torch.long, device=device
        )
        # Distributed training: an element-wise max of the flags over ranks (Dist.all_reduce), so
        # a non-finite value or a spike on any rank skips the step on every rank.
        self.agree = agree
        self.update_ratio = torch.zeros((), dtype=torch.float64, device=device)  # latest sample
        self.new_window()

    @classmethod
    def from_config(cls, model: nn.Module, t, device: torch.device, agree=None) -> "StepHealth":
        """From train.* (`t`)."""
        keys = ("grad_clip", "grad_warning", "grad_critical", "spike_window", "spike_k", "skip_spikes")
        return cls(model, **{k: t[k] for k in keys}, device=device, agree=agree)

    # Accumulator layout: sums over the window's steps (module norms over good steps only).
    FIELDS = ("n_ok", "loss", "norm", "clipped", "n_clipped", "nonfinite", "spikes", *(f"zone_{z}" for z in ZONES))

    def new_window(self) -> None:
        self.acc = torch.zeros(len(self.FIELDS) + len(self.modules), dtype=torch.float64, device=self.device)
        self.norm_max = torch.zeros((), dtype=torch.float64, device=self.device)

    def measure(self, loss: torch.Tensor, overrun: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """After backward (and scaler.unscale_): norms, clipping, accumulators. `overrun`: a
        device bool, the flow loop ended with flows still travelling (the step is not applied).

        Returns (code, threshold) as device tensors; the host decides from the code."""
        grads = [[p.grad for p in ps if p.grad is not None] for _, ps in self.modules]
        zero = torch.zeros((), device=self.device)
        mod_norms = torch.stack([torch.nn.utils.get_total_norm(g) if g else zero for g in grads]).double()
        norm = torch.linalg.vector_norm(mod_norms)
        loss = loss.detach().double()
        threshold = self.spikes.threshold()
        flags = torch.cat(
            [
                torch.stack(
                    [
                        torch.isnan(loss),
                        torch.isinf(loss),
                        torch.isnan(norm),
                        torch.isinf(norm),
                        torch.isfinite(loss) & (loss > threshold),
                        overrun if overrun is not None else torch.zeros((), dtype=torch.bool, device=self.device),
                    ]
                ),
                ~torch.isfinite(mod_norms),
            ]
        )
        if self.agree is not None:
            # With DDP the loss (reduced by the trainer) and the gradients are the same on every
            # rank, so the flags already agree; a non-finite value made after the reduction on one
            # rank alone (unscaling, an injected fault) would not, and the ranks' weights would part.
            flags = self.agree(flags.double()) > 0
        code = (flags * self._code_bits).sum()
        spike = flags[4]
        finite = ~flags[:4].any()
        ok = finite & ~spike if self.skip_spikes else finite  # the host's skip decision, on the device
        ok = ok & ~flags[5]
        if self.grad_clip > 0:
            # clip_grads_with_norm_ reuses our norm (no second pass over the gradients). With a
            # non-finite norm the step is skipped anyway, whatever clipping makes of the grads.
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm.float())
            clipped = norm.clamp(max=self.grad_clip)
        else:
            clipped = norm
        self.spikes.push(loss, threshold)
        safe = lambda t: torch.where(ok, torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0), 0.0)  # noqa: E731
        zone = torch.stack(
            [
                finite & (norm <= self.grad_warning),
                finite & (norm > self.grad_warning) & (norm <= self.grad_critical),
                finite & (norm > self.grad_critical),
                ~finite,
            ]
        ).double()
        self.acc += torch.cat(
            [
                torch.stack(
                    [
                        ok.double(),
                        safe(loss),
                        safe(norm),
                        safe(clipped),
                        safe((norm > self.grad_clip).double()) if self.grad_clip > 0 else zero.double(),
                        (~finite).double(),
                        spike.double(),
                    ]
                ),
                zone,
                safe(mod_norms),
            ]
        )
        self.norm_max = torch.maximum(self.norm_max, safe(norm))
        return code, threshold

    def step_readout(
        self,
        code: torch.Tensor,
        loss: torch.Tensor,
        threshold: torch.Tensor,
        scale: Optional[torch.Tensor],
        with_window: bool,
        ranges: Optional[torch.Tensor] = None,
        flow: Optional[torch.Tensor] = None,
    ) -> list[float]:
        """The one vector read this step: [code, loss, threshold, (scale, update_ratio, norm_max,
        value ranges, accumulators...) on a log step, (flow...)]. Read it with one .tolist().
        `ranges` is the model's FlowOutput.ranges of this step (RANGE_KEYS; NaN when not
        recorded); `flow`, device counters of the flow loop the caller wants read with it,
        comes last (the caller takes it off before window_metrics)."""
        head = [code.double(), loss.detach().double(), threshold]
        tail = [flow.double()] if flow is not None else []
        if not with_window:
            return torch.cat([torch.stack(head), *tail]).tolist()
        nan = torch.full((), float("nan"), dtype=torch.float64, device=self.device)
        s = scale.double() if scale is not None else nan
        r = ranges.double() if ranges is not None else nan.expand(len(RANGE_KEYS))
        return torch.cat([torch.stack(head + [s, self.update_ratio, self.norm_max]), r, self.acc, *tail]).tolist()

    def window_metrics(self, values: list[float]) -> dict[str, float]:
        """Telemetry fields of the window from the tail of a step_readout with the window."""
        scale, ratio, norm_max = values[3:6]
        ranges = values[6 : 6 + len(RANGE_KEYS)]
        tail = 6 + len(RANGE_KEYS)
        acc = dict(zip(self.FIELDS, values[tail : tail + len(self.FIELDS)]))
        mods = values[tail + len(self.FIELDS) :]
        n_ok = acc["n_ok"]
        mean = (lambda v: v / n_ok) if n_ok else (lambda v: float("nan"))
        worst = max((i for i, z in enumerate(ZONES) if acc[f"zone_{z}"] > 0), default=0)
        return {
            "train/loss": mean(acc["loss"]),
            "train/spikes": acc["spikes"],
            "grad/global_norm": mean(acc["norm"]),
            "grad/max_norm": norm_max if n_ok else float("nan"),
            "grad/clipped_norm": mean(acc["clipped"]),
            "grad/clip_fraction": acc["n_clipped"] / n_ok if n_ok else float("nan"),
            "grad/nonfinite_steps": acc["nonfinite"],
            "grad/update_ratio": ratio,
            "grad/zone": float(worst),
            **{f"grad/steps_{z}": acc[f"zone_{z}"] for z in ZONES},
            "amp/scale": scale,
            **{f"grad/{name}/norm": mean(v) for name, v in zip(self.module_names, mods)},
            # The log step's own forward (not a window mean): energies and hidden states of every
            # live flow at every flow step, and the output surface.
            **{f"range/{k}": v for k, v in zip(RANGE_KEYS, ranges)},
        }

    def nonfinite_modules(self, code: int) -> list[str]:
        return [n for i, n in enumerate(self.module_names) if code & (1 << (MODULE_SHIFT + i))]

    # -- update / weight ratio, sampled once per window (a parameter copy per window, not per step)
    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def record_update(self, before: list[torch.Tensor]) -> None:
        with torch.no_grad():
            delta = torch.nn.utils.get_total_norm([p - b for p, b in zip(self.params, before)])
            weight = torch.nn.utils.get_total_norm(self.params)
            self.update_ratio = (delta / weight.clamp(min=1e-12)).double()
