"""The memory_growth check's messages."""

from __future__ import annotations

from typing import Mapping

MEMORY_LABELS = {"rss": "host RSS", "device": "device allocated"}


def skip_summary(not_tested: list[str]) -> str:
    return f"No memory series to test ({'; '.join(not_tested)})."


def skip_fix(min_rows: int) -> str:
    return (
        "Log mem/rss_mb (and mem/device_allocated_mb on GPU) for at least warmup_steps + "
        f"{min_rows} logged steps to enable this check."
    )


def summary(fits: Mapping[str, Mapping], worst: str, failing: bool, p: Mapping) -> str:
    parts = [
        f"{MEMORY_LABELS[n]} {f['slope_mb_per_1k_steps']:+.1f} MB per 1k steps (p={f['p_value']:.2g}, R²={f['r2']:.2f})"
        for n, f in fits.items()
    ]
    w = fits[worst]
    span = f"over steps {w['first_step']}-{w['last_step']}"
    if failing:
        proj = f", projected {w['projected_mb']:,.0f} MB at step {p['planned_steps']:,}" if "projected_mb" in w else ""
        return f"Memory grows: {'; '.join(parts)} {span}{proj}."
    return (
        f"Memory flat: {'; '.join(parts)} {span} "
        f"(fails only when p < {p['memory_alpha']:g}, slope > {p['memory_min_mb_per_1k']:g} MB per 1k "
        f"and growth over the run > {p['memory_min_growth_mb']:g} MB)."
    )


def fix(slope_mb_per_1k_steps: float) -> str:
    return (
        f"Memory grows ~{slope_mb_per_1k_steps:.0f} MB per 1k steps: something keeps the autograd "
        "graph alive across steps — detach values you keep (loss.detach(), .item() only at log "
        "boundaries), don't store step tensors on modules or in history lists, never use "
        "retain_graph=True."
    )
