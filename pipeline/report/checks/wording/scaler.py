"""The scaler check's messages."""

from __future__ import annotations

NO_SCALER = "No GradScaler in this run (fp32 or bf16 train in full range: nothing to scale)."


def summary(
    first: float,
    lowest: float,
    lowest_step: int,
    final: float,
    backoffs: int,
    fraction: float,
    total: int,
    limit: float,
    growths: int,
    collapsed: bool,
    min_scale: float,
) -> str:
    return (
        f"Loss scale {first:g} -> min {lowest:g} (step {lowest_step}) -> final {final:g}; "
        f"{backoffs} overflow backoff(s) ({100 * fraction:.1f} % of {total:,} steps, limit "
        f"{100 * limit:g} %), {growths} growth(s)"
        + (f"; scale fell below {min_scale:g}: gradients overflow even unscaled" if collapsed else "")
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
