"""learning: did training teach the model anything, and is it better than the evaluate stage's
baselines (copying the input; the best linear map; the answer of the nearest training question;
an MLP of its size trained as it is)? On the test split (val when there is none), by the headline
metric, group top-1:

- fail: the model's predictions are not finite, or its training loss fell by less than
  learning_min_drop between the first and last logged rows (it learned nothing);
- warn: it is worse than a baseline on group top-1 (the paired difference's interval lies
  below 0): a stable run, but not a model to use;
- pass: otherwise.
The summary names the strongest baseline on the headline metric and says where the model stands
against it, in one of four words (`standing`): ahead (the interval lies above 0), behind (below
0: a warning), equivalent (inside +-the preset's margin, eval/<split>/margin/<metric>), or
undecided; ahead and equivalent need an interval that covers both sides' training seeds.
Every difference is the evaluate stage's, with its interval, said in words; so is what the
intervals cover (the test items, and the training seed when the preset's seed-variance
reference matched: eval/<split>/ci_covers_seeds)."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline.report.checks.result import CheckResult
from pipeline.report.checks.telemetry import finite_number
from pipeline.report.checks.wording import learning as say

HEADLINE = "group_top1"  # what "better than a baseline" is judged on (the evaluate stage's headline)
LEARNING_BASELINES = ("identity", "ridge", "nearest", "mlp")
TRAINED = ("mlp",)  # baselines with seed luck of their own (replicates): eval/<split>/model_vs_<b>/ci_covers_seeds
EVIDENCE_METRICS = ("group_top1", "group_top5", "mrr", "cosine", "top1", "top5")
DIFFERENCE_PARTS = ("", "ci95_low", "ci95_high", "p_value")  # the model's paired difference from a baseline


def loss_drop(df: pd.DataFrame | None) -> tuple[float, float, float] | None:
    """(first, last, drop): the training loss over its first and last 3 logged rows (medians, so
    one noisy row does not decide) and the share it fell by; None without 2 finite rows."""
    if df is None or "train/loss" not in df:
        return None
    loss = df["train/loss"].to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    if len(loss) < 2:
        return None
    k = max(1, min(3, len(loss) // 2))
    first, last = float(np.median(loss[:k])), float(np.median(loss[-k:]))
    return first, last, (first - last) / abs(first) if first else 0.0


def standing(d: list[float], covered: bool, margin: float | None) -> str:
    """Where the model stands against a baseline from their difference [value, low, high]."""
    if d[2] < 0:
        return "behind"
    if covered and d[1] > 0:
        return "ahead"
    if covered and margin is not None and math.isfinite(margin) and -margin <= d[1] and d[2] <= margin:
        return "equivalent"
    return "undecided"


def check_learning(eval_metrics: Mapping | None, p: Mapping, df: pd.DataFrame | None = None) -> CheckResult:
    if not eval_metrics:
        return CheckResult("skip", say.NO_METRICS, {}, say.NO_METRICS_FIX)
    split = next((s for s in ("test", "val") if f"eval/{s}/model/cosine" in eval_metrics), None)
    if split is None:
        return CheckResult("skip", say.NO_COSINE, {}, say.NO_COSINE_FIX)

    def get(who: str, metric: str = "cosine", part: str = "") -> float:
        v = eval_metrics.get(f"eval/{split}/{who}/{metric}" + (f"/{part}" if part else ""))
        return float(v) if finite_number(v) else float("nan")

    # The headline metric, or cosine for an evaluation that has no retrieval metrics.
    headline = HEADLINE if math.isfinite(get("model", HEADLINE)) else "cosine"
    covers_seeds = bool(eval_metrics.get(f"eval/{split}/ci_covers_seeds", 0))
    ref_seeds = int(eval_metrics.get(f"eval/{split}/seed_reference_seeds", 0) or 0)
    evidence: dict[str, Any] = {
        "split": split,
        "headline": headline,
        "ci_covers_seeds": covers_seeds,
        "seed_reference_seeds": ref_seeds,
    }
    evidence["model_cosine"] = get("model", "cosine")  # (NaN too: the figure the fail is about)
    for metric in EVIDENCE_METRICS:
        for name in ("model", *LEARNING_BASELINES):
            if math.isfinite(get(name, metric)):
                evidence[f"{name}_{metric}"] = get(name, metric)
    said, worse_than = [], []
    for b in LEARNING_BASELINES:
        for metric in dict.fromkeys((headline, "cosine")):
            d = [get(f"model_vs_{b}", metric, part) for part in DIFFERENCE_PARTS]
            if not all(math.isfinite(x) for x in d):
                continue
            evidence.update(
                {f"vs_{b}_{metric}" + (f"_{part}" if part else ""): x for part, x in zip(DIFFERENCE_PARTS, d)}
            )
            interval = say.interval(d)
            if d[1] > 0:
                said.append(say.compared("beats", b, metric, interval))
            elif d[2] < 0:
                said.append(say.compared("trails", b, metric, interval))
                if metric == headline:
                    worse_than.append((b, interval))
            else:
                said.append(say.no_difference(b, metric, interval))
    strongest = say.strongest(headline, *_strongest(eval_metrics, split, headline, get, covers_seeds, evidence))
    drop = loss_drop(df)
    if drop is not None:
        evidence.update(loss_first=drop[0], loss_last=drop[1], loss_drop=drop[2])
    evidence["min_drop"] = p["learning_min_drop"]
    against = say.against([(n, get(n, headline)) for n in LEARNING_BASELINES if math.isfinite(get(n, headline))])
    summary = say.headline(split, headline, get("model", headline), against)
    fix = None
    if not math.isfinite(get("model", "cosine")):
        status, fix = "fail", say.NOT_FINITE_FIX
        summary = say.not_finite(split, get("model", "cosine"), against)
    elif drop is not None and drop[2] < p["learning_min_drop"]:
        status, fix = "fail", say.NOTHING_LEARNED_FIX
        summary += say.nothing_learned(drop[0], drop[1], drop[2], p["learning_min_drop"])
    elif worse_than:
        status, fix = "warn", say.WORSE_FIX
        summary += say.worse(worse_than, headline)
    else:
        status = "pass"
        summary += say.not_worse(headline)
    summary += strongest + say.comparisons(said) + say.luck(covers_seeds, ref_seeds)
    return CheckResult(status, summary, evidence, fix)


def _strongest(eval_metrics: Mapping, split: str, headline: str, get, covers_seeds: bool, evidence: dict):
    """(name, its value, the model's difference from it, whether that interval covers both
    sides' seeds, the margin, where the model stands, the baseline's replicates) of the strongest
    baseline on `headline`; its entries go into `evidence` too. All None without baselines."""
    found = [(b, get(b, headline)) for b in LEARNING_BASELINES if math.isfinite(get(b, headline))]
    if not found:
        return (None,) * 7
    name, value = max(found, key=lambda kv: kv[1])
    d = [get(f"model_vs_{name}", headline, part) for part in DIFFERENCE_PARTS]
    if not all(math.isfinite(x) for x in d[:3]):
        return name, value, None, False, None, None, None
    covered = (
        bool(eval_metrics.get(f"eval/{split}/model_vs_{name}/ci_covers_seeds", 0)) if name in TRAINED else covers_seeds
    )
    margin = eval_metrics.get(f"eval/{split}/margin/{headline}")
    margin = float(margin) if finite_number(margin) else None
    where = standing(d, covered, margin)
    replicates = int(eval_metrics.get(f"eval/{split}/{name}/replicates", 0) or 0) or None
    evidence.update(
        strongest_baseline=name,
        strongest_value=value,
        vs_strongest=d[0],
        vs_strongest_ci95_low=d[1],
        vs_strongest_ci95_high=d[2],
        vs_strongest_covers_seeds=covered,
        vs_strongest_standing=where,
        margin=margin if margin is not None else float("nan"),
    )
    return name, value, d, covered, margin, where, replicates
