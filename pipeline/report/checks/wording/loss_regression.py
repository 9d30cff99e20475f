"""The loss_regression check's messages."""

from __future__ import annotations

from typing import Mapping, Sequence

from pipeline.report.checks.wording.common import LIST_MAX

FIX = (
    "The loss climbed back and stayed there: an LR too high for this stage of training (lower "
    "train.lr, lengthen train.warmup_steps, or decay sooner), a bad stretch of data (look at the "
    "batches from the start step), or a resume that did not restore the optimizer state. "
    "Start with the module whose gradient moved first."
)


def skip_summary(why: str) -> str:
    return f"No loss-regression test: {why}."


def skip_fix(min_rows: int) -> str:
    return f"Log train/loss for at least warmup_steps + {min_rows} logged steps to enable this check."


def series_label(module: str, kind: str) -> str:
    return f"{module} {'gradient norm' if kind == 'norm' else 'update ratio'}"


GLOBAL_UPDATE_RATIO = "update ratio (all parameters)"


def rule(rise: float, min_steps: int) -> str:
    return f"a regression is > {100 * rise:g} % above the best for > {min_steps} steps"


def mover(m: Mapping) -> str:
    when = f" from step {m['first_step']}" if m["first_step"] is not None else ""
    return f"{m['label']} x{m['factor']:.2g}{when}"


def movers(ms: Sequence[Mapping]) -> str:
    return "; ".join(mover(m) for m in ms)


def regression_list(regressions: Sequence[Mapping]) -> str:
    return "; ".join(
        f"steps {r['start_step']}-{r['recovery_step'] or 'end'} +{100 * r['peak_rise']:.0f} %"
        for r in regressions[:LIST_MAX]
    )


def pending(r: Mapping, rule_text: str) -> str:
    return (
        f"The smoothed loss ends {100 * r['peak_rise']:.0f} % above its best ({r['best_loss']:.4g}) "
        f"over the last {r['duration']} steps of training, from step {r['start_step']}: too short to "
        f"call a regression ({rule_text}), but the run ends worse than its best."
    )


def clean(window: int, max_rise: float, max_rise_step: int, rule_text: str) -> str:
    return (
        f"No loss regression: the smoothed loss (median of {window} logged rows) rose at most "
        f"{100 * max_rise:.1f} % above its running best (step {max_rise_step}); {rule_text}."
    )


def regression(r: Mapping, rise: float) -> str:
    outcome = (
        f"came back within {100 * rise:g} % of it at step {r['recovery_step']}"
        if r["recovered"]
        else "had not recovered by the end of training"
    )
    return (
        f"the smoothed loss rose {100 * r['peak_rise']:.0f} % above its best at step {r['start_step']} "
        f"({r['best_loss']:.4g} -> {r['peak_loss']:.4g} at step {r['peak_step']}, "
        f"{r['peak_loss'] / r['best_loss']:.2f}x, +{r['rise_loss']:.3g}), stayed up {r['duration']} steps and "
        f"{outcome}"
    )


def summary(
    count: int, worst: Mapping, ms: Sequence[Mapping], unrecovered_elsewhere: Mapping | None, rise: float
) -> str:
    head = "Loss regression: " if count == 1 else f"{count} loss regressions; the largest: "
    text = head + regression(worst, rise)
    if ms:
        m = ms[0]
        text += (
            f". Moved first: {mover(m)}"
            if m["first_step"] is not None
            else f". No module's gradient or update ratio moved by more than {100 * rise:g} %; the largest "
            f"change: {mover(m)}"
        )
        others = [x for x in ms[1:] if x["first_step"] is not None][:2]
        if others:
            text += " (then " + ", ".join(mover(x) for x in others) + ")"
    if unrecovered_elsewhere is not None:
        text += f". Not recovered by the end of training: the one from step {unrecovered_elsewhere['start_step']}"
    return text + "."
