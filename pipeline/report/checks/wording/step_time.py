"""The step_time_degradation check's messages."""

from __future__ import annotations

from typing import Mapping

FIX = (
    "Step time grows: look for per-step host syncs (.item()/.cpu()/printing a tensor every step "
    "— accumulate on device, sync every log_every steps), torch.cuda.empty_cache() in the loop "
    "(measured 15-20 % slower in the prototype, docs/prototype.md), "
    "a logging cadence whose cost grows with history, "
    "and data loading (compare data-wait time; use workers, pin_memory, prefetch)."
)
FEWER_FLOW_STEPS = (
    " The time per training step stayed within the limit: fewer flow steps per batch, over which "
    "the step's fixed work is spread, can account for it."
)
FEWER_FLOW_STEPS_FIX = (
    "Time per flow step rose, the step itself did not slow past the limit: see the convergence "
    "check (fewer flow steps per batch). If the step is slower than it should be, look for per-step "
    "host syncs, empty_cache() calls and data waits."
)
MORE_FLOW_STEPS_FIX = (
    "More flow steps per step: see the convergence check (flows that arrive later, or not at "
    "all, after a bad update or a too-high learning rate)."
)


def judged(per_flow: bool) -> str:
    return "time per flow step" if per_flow else "time per training step"


def too_little_data(why: str) -> str:
    return f"Too little timing data: {why}."


def too_little_data_fix(min_rows: int) -> str:
    return f"Run more than warmup_steps + {min_rows} logged steps to enable this check."


def trend(rho: float, rho_p: float) -> str:
    return f"Spearman rho={rho:.2f} (p={rho_p:.2g})"


def per_flow_summary(e: Mapping, trend_text: str) -> str:
    """From the check's evidence (judged per flow step)."""
    flow_ratio = e.get("flow_steps_ratio")
    more = f", with {flow_ratio:.2f}x the flow steps per training step" if flow_ratio is not None else ""
    return (
        f"Steady-state median time per flow step {e['steady_flow_step_ms']:.3g} ms is {e['ratio']:.2f}x the early "
        f"median {e['early_flow_step_ms']:.3g} ms (limit {e['max_ratio']:g}x); per training step "
        f"{e['steady_median_ms']:.1f} ms is {e['step_ratio']:.2f}x the early {e['early_median_ms']:.1f} ms{more}; "
        f"{trend_text}."
    )


def per_step_summary(e: Mapping, trend_text: str) -> str:
    return (
        f"Steady-state median step time {e['steady_median_ms']:.1f} ms is {e['ratio']:.2f}x the early median "
        f"{e['early_median_ms']:.1f} ms (limit {e['max_ratio']:g}x); {trend_text}."
    )


def more_flow_steps(flow_ratio: float) -> str:
    return (
        f" The model takes {flow_ratio:.2f}x the flow steps per training step it took early "
        "(flow/steps_used), which accounts for it: more work per step, not a slower loop."
    )
