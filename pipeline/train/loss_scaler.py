"""fp16's loss scale: torch's GradScaler plus the trainer's recovery policy and the ranks'
agreement, as tensor operations on the device (no host read).

The scale tensor is read, never synced, by the step's health read-out (`scale_tensor`);
`get_scale()` would make the host wait for the device.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

# train.scaler.recovery=prototype: the prototype's recovery (docs/prototype.md). An overflow
# multiplies the scale by this factor (as GradScaler's back-off, so its growth count resets the
# same way), then the scale is floored at PROTOTYPE_FLOOR.
PROTOTYPE_BACKOFF = 0.1
PROTOTYPE_FLOOR = 1.0


class LossScaler(torch.amp.GradScaler):
    """GradScaler whose step ends with `end_step`: update, the recovery floor, then (with several
    ranks) the agreed state."""

    def __init__(
        self,
        device_type: str,
        scaler_cfg,
        agree: Optional[Callable[[torch.Tensor, str], torch.Tensor]] = None,
    ):
        prototype = scaler_cfg.recovery == "prototype"
        super().__init__(
            device_type,
            init_scale=scaler_cfg.init_scale,
            growth_factor=scaler_cfg.growth_factor,
            backoff_factor=PROTOTYPE_BACKOFF if prototype else scaler_cfg.backoff_factor,
            growth_interval=scaler_cfg.growth_interval,
        )
        self.recovery_floor = PROTOTYPE_FLOOR if prototype else None
        # Distributed training: an all-reduce over the ranks (Dist.all_reduce); None with one process.
        self.agree_ranks = agree

    def scale_tensor(self) -> Optional[torch.Tensor]:
        """The current scale as the device tensor (None before the first `scale`): for a read
        batched with others."""
        return self._scale

    def end_step(self, overflowed: bool) -> None:
        """After the step's update (or its skip): back off after an overflow (found by unscale_),
        else count towards growth; `overflowed` is the host's knowledge of that overflow."""
        self.update()
        if self.recovery_floor is not None and overflowed:
            self._scale.clamp_(min=self.recovery_floor)  # max(scale * 0.1, 1), on the device
        if self.agree_ranks is not None:
            self._agree()

    def _agree(self) -> None:
        """Every rank's scaler in the same state. Each found its overflow in its own (reduced, so
        equal) gradients, but an inf made on one rank after the all-reduce backs off that rank's
        scale alone, and DDP would then average gradients scaled differently. The smallest scale
        and growth count win: the backed-off ones."""
        state = torch.stack([self._scale.double(), self._growth_tracker.double()])
        self.agree_ranks(state, "min")
        self._scale.fill_(state[0])
        self._growth_tracker.fill_(state[1].to(self._growth_tracker.dtype))


def build_scaler(
    scaler_cfg, device: torch.device, amp_dtype: Optional[torch.dtype], agree=None
) -> Optional[LossScaler]:
    """A scaler for fp16 (its range needs one); None for fp32 and bf16."""
    if amp_dtype != torch.float16:
        return None
    return LossScaler(device.type, scaler_cfg, agree)
