"""The learning check's messages."""

from __future__ import annotations

from typing import Sequence

NO_METRICS = "No evaluate metrics given."
NO_METRICS_FIX = "Run the evaluate stage (metrics/eval.json) to enable this check."
NO_COSINE = "The evaluate metrics hold no eval/test/model/cosine or eval/val/model/cosine."
NO_COSINE_FIX = "Re-run the evaluate stage."
NOT_FINITE_FIX = "The trained model's predictions are not finite: see nonfinite and grad_norm."
NOTHING_LEARNED_FIX = (
    "Training did not lower the loss: check the LR (too high diverges, too low does nothing), the number "
    "of epochs, and that skipped steps (nonfinite) did not eat the run."
)
WORSE_FIX = (
    "The model is worse than a baseline (one that needs no training, or the MLP of its size): train longer "
    "(train.epochs), widen the model (model.output_hidden, lattice size), or add the linear path "
    "(model.residual=linear); ./dev compare workspace --baseline mlp shows where; the smoke preset is expected "
    "to stop here."
)


def metric_name(metric: str) -> str:
    return metric.replace("group_top1", "group top-1")


def interval(d: Sequence[float]) -> str:
    """'+0.012 [+0.004, +0.020]': a difference and its 95 % interval."""
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def compared(verb: str, baseline: str, metric: str, iv: str) -> str:
    """'beats ridge on group top-1 by ...' (verb: beats or trails)."""
    return f"{verb} {baseline} on {metric_name(metric)} by {iv}"


def no_difference(baseline: str, metric: str, iv: str) -> str:
    return f"no significant difference from {baseline} on {metric_name(metric)} ({iv})"


def against(values: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{n} {v:.3f}" for n, v in values)


def headline(split: str, metric: str, model: float, against_text: str) -> str:
    return f"{split} {metric_name(metric)} {model:.3f} ({against_text or 'no baselines'})"


def luck(covers_seeds: bool, ref_seeds: int) -> str:
    text = (
        f"the intervals cover the test items and the training seed (the preset's seed-variance reference, "
        f"{ref_seeds} seeds)"
        if covers_seeds
        else "the intervals cover the test items only, not the training seed's luck (no seed-variance reference "
        "for this preset and data: ./dev seeds measures one)"
    )
    return f" {text[0].upper()}{text[1:]}."


def not_finite(split: str, cosine: float, against_text: str) -> str:
    return f"{split} cosine of the trained model is {cosine}; baselines: {against_text}."


def nothing_learned(first: float, last: float, drop: float, min_drop: float) -> str:
    return (
        f": it learned nothing: the training loss went from {first:.4g} to {last:.4g} "
        f"({-drop:+.1%}; needs a fall of at least {min_drop:.0%})."
    )


def worse(worse_than: Sequence[tuple[str, str]], metric: str) -> str:
    return ": worse than " + ", ".join(f"{b} ({iv})" for b, iv in worse_than) + f" on {metric_name(metric)}."


def not_worse(metric: str) -> str:
    return f": not worse than any baseline on {metric_name(metric)}."


def comparisons(said: Sequence[str]) -> str:
    return " The model " + "; ".join(said) + "." if said else ""


STANDING = {
    "ahead": "the model is ahead of it",
    "behind": "the model is BEHIND it",
    "equivalent": "the model is equivalent to it",
    "undecided": "undecided",
}


def strongest(metric, name, value, d, covered, margin, where, replicates) -> str:
    """' Strongest baseline: mlp (5 seeds), group top-1 0.876: the model is equivalent to it (+0.004
    [-0.007, +0.014], within +-0.011; the interval covers the test items and both sides' seeds).'"""
    if name is None:
        return ""
    seeds = f" ({replicates} seeds)" if replicates else ""
    text = f" Strongest baseline on {metric_name(metric)}: {name}{seeds}, {value:.3f}"
    if d is None:
        return text + "."
    within = f", within +-{margin:g}" if where == "equivalent" and margin is not None else ""
    if where == "undecided":
        why = (
            "the interval straddles 0 and is wider than the margin"
            if covered
            else "training luck is not covered on both sides (no seed-variance reference for the model)"
        )
        within = f"; {why}"
    cover = (
        "the test items and both sides' training seeds" if covered else "the test items, not both sides' training seeds"
    )
    return f"{text}: {STANDING[where]} ({interval(d)}{within}; the interval covers {cover})."
