"""The loss_spikes check's messages."""

from __future__ import annotations

from typing import Mapping, Sequence

from pipeline.report.checks.wording.common import steps_text

FIX = (
    "Lower the LR or lengthen warm-up, clip gradients at 1.0, look for bad batches at the spike "
    "steps, and skip the update on a spike (train.skip_spikes=true) instead of applying it."
)
NOTHING = "train/loss not logged and no loss_spike events."
NO_FINITE_LOSS = "train/loss has no finite values."


def events_only(event_steps: Sequence[int]) -> str:
    return (
        f"{len(event_steps)} loss_spike event(s) (steps {steps_text(event_steps)}); "
        "recovery cannot be checked without train/loss."
    )


def clean(rows: int, k: float, window: int) -> str:
    return f"No loss spike in {rows:,} logged steps (loss > mean + {k:g}·std of the trailing {window} losses)."


def summary(spike_steps: Sequence[int], e: Mapping, ranked: bool) -> str:
    """From the check's evidence; `ranked`: some spike has a ratio to the trailing mean."""
    top = f" (worst at step {e['max_ratio_step']}: {e['max_ratio']:.3g}x the trailing mean loss)" if ranked else ""
    outcome = "loss recovered"
    if e["unrecovered"]:
        outcome = f"{e['unrecovered']} not recovered (last-10 % median {e['tail_median_loss']:.4g})"
    why = f"; {e['severe']} at >= {e['fail_factor']:g}x (fails)" if e["severe"] else ""
    at = "step" if len(spike_steps) == 1 else "steps"
    return f"{len(spike_steps)} loss spike(s) at {at} {steps_text(spike_steps)}{top}; {outcome}{why}."
