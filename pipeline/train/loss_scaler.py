"""fp16's loss scale: GradScaler's dynamic scaling with the trainer's recovery policy and the
ranks' agreement, as tensor operations on the device (no host read).

A scaler of our own rather than a GradScaler subclass: the recovery floor and the ranks' agreement
rewrite the scale and the growth count, which GradScaler keeps in private fields. The arithmetic
is GradScaler's, bit for bit: the same two kernels (`torch._amp_foreach_non_finite_check_and_unscale_`
and `torch._amp_update_scale_`, which GradScaler.unscale_ and .update call), the same lazily made
float32 scale and int32 growth count, and the same state_dict (a checkpoint holds GradScaler's keys).

The scale tensor is read, never synced, by the step's health read-out (`scale_tensor`);
`get_scale()` makes the host wait for the device.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# train.scaler.recovery=prototype: the prototype's recovery (docs/prototype.md). An overflow
# multiplies the scale by this factor (as the standard back-off, so its growth count resets the
# same way), then the scale is floored at PROTOTYPE_FLOOR.
PROTOTYPE_BACKOFF = 0.1
PROTOTYPE_FLOOR = 1.0


class LossScaler:
    """scale -> backward -> unscale_ -> (the update, or its skip) -> end_step: update, the recovery
    floor, then (with several ranks) the agreed state."""

    def __init__(
        self, device_type: str, scaler_cfg, agree: Optional[Callable[[torch.Tensor, str], torch.Tensor]] = None
    ):
        prototype = scaler_cfg.recovery == "prototype"
        self.init_scale, self.init_growth = float(scaler_cfg.init_scale), 0
        self.growth_factor = float(scaler_cfg.growth_factor)
        self.backoff_factor = PROTOTYPE_BACKOFF if prototype else float(scaler_cfg.backoff_factor)
        self.growth_interval = int(scaler_cfg.growth_interval)
        self.recovery_floor = PROTOTYPE_FLOOR if prototype else None
        # Distributed training: an all-reduce over the ranks (Dist.all_reduce); None with one process.
        self.agree_ranks = agree
        # Made at the first scale(), on the loss's device; found_inf: unscale_'s, for end_step.
        self.scale_t = self.growth_t = self.found_inf = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        if self.scale_t is None:
            self.scale_t = torch.full((), self.init_scale, dtype=torch.float32, device=loss.device)
            self.growth_t = torch.full((), self.init_growth, dtype=torch.int32, device=loss.device)
        return loss * self.scale_t

    def unscale_(self, opt: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale in place and note whether any is not finite."""
        inv_scale = self.scale_t.double().reciprocal().float()
        self.found_inf = torch.zeros((), dtype=torch.float32, device=self.scale_t.device)
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        with torch.no_grad():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv_scale)

    def scale_tensor(self) -> Optional[torch.Tensor]:
        """The current scale as the device tensor (None before the first `scale`): for a read
        batched with others."""
        return self.scale_t

    def get_scale(self) -> float:
        return self.init_scale if self.scale_t is None else float(self.scale_t.item())

    def end_step(self, overflowed: bool) -> None:
        """After the step's update (or its skip): back off after an overflow (found by unscale_),
        else count towards growth; `overflowed` is the host's knowledge of that overflow."""
        torch._amp_update_scale_(
            self.scale_t, self.growth_t, self.found_inf, self.growth_factor, self.backoff_factor, self.growth_interval
        )
        self.found_inf = None
        if self.recovery_floor is not None and overflowed:
            self.scale_t.clamp_(min=self.recovery_floor)  # max(scale * 0.1, 1), on the device
        if self.agree_ranks is not None:
            self._agree()

    def _agree(self) -> None:
        """Every rank's scaler in the same state. Each found its overflow in its own (reduced, so
        equal) gradients, but an inf made on one rank after the all-reduce backs off that rank's
        scale alone, and DDP would then average gradients scaled differently. The smallest scale
        and growth count win: the backed-off ones."""
        state = torch.stack([self.scale_t.double(), self.growth_t.double()])
        self.agree_ranks(state, "min")
        self.scale_t.fill_(state[0])
        self.growth_t.fill_(state[1].to(self.growth_t.dtype))

    def state_dict(self) -> dict:
        """GradScaler's state_dict, keys and all."""
        return {
            "scale": self.get_scale(),
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.init_growth if self.growth_t is None else int(self.growth_t.item()),
        }

    def load_state_dict(self, state: dict) -> None:
        self.init_scale, self.init_growth = float(state["scale"]), int(state["_growth_tracker"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval = state["growth_interval"]
        if self.scale_t is not None:
            self.scale_t.fill_(self.init_scale)
            self.growth_t.fill_(self.init_growth)


def build_scaler(
    scaler_cfg, device: torch.device, amp_dtype: Optional[torch.dtype], agree=None
) -> Optional[LossScaler]:
    """A scaler for fp16 (its range needs one); None for fp32 and bf16."""
    if amp_dtype != torch.float16:
        return None
    return LossScaler(device.type, scaler_cfg, agree)
