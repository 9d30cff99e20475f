"""The scaler check's messages."""

from __future__ import annotations

from typing import Mapping

NO_SCALER = "No GradScaler in this run (fp32 or bf16 train in full range: nothing to scale)."


def summary(e: Mapping, collapsed: bool, p: Mapping) -> str:
    """From the check's evidence."""
    return (
        f"Loss scale {e['first_scale']:g} -> min {e['min_scale']:g} (step {e['min_scale_step']}) -> final "
        f"{e['final_scale']:g}; {e['backoffs']} overflow backoff(s) ({100 * e['backoff_fraction']:.1f} % of "
        f"{e['total_steps']:,} steps, limit {100 * p['scaler_max_backoff_fraction']:g} %), {e['growths']} growth(s)"
        + (f"; scale fell below {p['scaler_min_scale']:g}: gradients overflow even unscaled" if collapsed else "")
        + "."
    )


def fix(collapsed: bool) -> str:
    return (
        "Each backoff is a lost update. Start lower and grow slower — train.scaler init_scale=1024, "
        "growth_factor=1.5, growth_interval=200 (the prototype's 65536 / 2.0 / 100 overflows from step 1) — "
        "clip gradients at 1.0 after unscale_, and lower the LR; or use bf16 (train.precision=bf16), "
        "which has fp32's range and needs no scaler."
        + (
            " A scale below 1 means the gradients themselves are inf/NaN: see nonfinite and grad_norm."
            if collapsed
            else ""
        )
    )
