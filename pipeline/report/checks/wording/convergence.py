"""The convergence check's messages."""

from __future__ import annotations

from typing import Mapping

NEVER_ARRIVE = "; batches stop before any flow can arrive: energy collapses and every flow dies."
NEVER_ARRIVE_FIX = (
    "Flows die (energy < model.energy_min) before reaching the output surface, so the lattice "
    "contributes nothing: lower model.energy_min, lower the LR, or check the carrier's energy "
    "update for a sign or scale error."
)
AT_CAP_FIX = (
    "Every batch runs the full step cap: lower model.convergence_threshold or model.patience, or "
    "raise model.min_forward so flows arrive sooner."
)
GROWING_FIX = "Flows slow down as training proceeds: check model.min_forward and the carrier's forward head."


def no_finite(col: str) -> str:
    return f"{col} has no finite values."


def summary(evidence: Mapping, cap: int | None, arrive: int | None) -> str:
    throughput = (
        f"; throughput {evidence['median_samples_per_s']:,.0f} samples/s" if "median_samples_per_s" in evidence else ""
    )
    bounds = (f" (arrival needs >= {arrive}" if arrive else "") + (f", cap {cap})" if cap else (")" if arrive else ""))
    return (
        f"Adaptive flow steps per batch: median {evidence['early_median_steps']:.3g} early -> "
        f"{evidence['steady_median_steps']:.3g} steady{bounds}{throughput}"
    )


def at_cap(frac_at_cap: float) -> str:
    return f"; {100 * frac_at_cap:.0f} % of steady rows at the cap: adaptive stopping never fires."


def growing(ratio: float) -> str:
    return f"; steps per batch grew {ratio:.2f}x, and step cost grows with them."
