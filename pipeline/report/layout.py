"""What the report shows, and in which order, whatever its format: the verdict line, the checks
(fail, warn, skip, pass, n/a), the plot under each check, the evaluation table. The Markdown and
HTML templates (templates/stability.*.j2) lay out the same pieces, so they always say the same
thing. Reading order is the researcher's: verdict, what failed, the run it is about, then per
check the evidence, the fix and the plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipeline.report.checks.result import STATUS_RANK
from pipeline.report.checks.suite import CHECK_ORDER, headline_verdict
from pipeline.report.units import fmt

# Which plot shows the evidence for which check; plots not listed go under "Other plots".
CHECK_PLOTS = {
    "memory_growth": "memory",
    "step_time_degradation": "step_time",
    "device_utilisation": "device",
    "nonfinite": "loss",
    "grad_norm": "grad_norm",
    "loss_spikes": "loss",
    "loss_regression": "loss",
    "scaler": "scaler",
    "convergence": "adaptive_steps",
    "learning": "learning",
}
EVAL_METRICS = ("group_top1", "group_top5", "mrr", "cosine", "mse", "top1", "top5")
EVAL_SPLITS = ("test", "val")
EVAL_MODELS = ("model", "identity", "ridge", "nearest")  # then any others found
STATUS_COLOURS = {"pass": "#2e7d32", "warn": "#b26a00", "fail": "#c62828", "skip": "#616161", "n/a": "#607d8b"}


def ordered_checks(result: Mapping) -> list[tuple[str, Mapping]]:
    """fail, warn, skip, pass; canonical order within a status (whatever order result has)."""
    canon = {n: i for i, n in enumerate(CHECK_ORDER)}
    items = list(result["checks"].items())
    return sorted(items, key=lambda kv: (STATUS_RANK.get(kv[1]["status"], 4), canon.get(kv[0], len(canon))))


def verdict_parts(result: Mapping) -> tuple[str, str]:
    """('STABLE'|'STABLE, WITH WARNINGS'|'UNSTABLE', the rest of the line: failed checks first,
    then warnings)."""
    checks = ordered_checks(result)
    by = {s: [n for n, c in checks if c["status"] == s] for s in ("fail", "warn", "skip")}
    labels = {"fail": "failed", "warn": "warnings", "skip": "skipped"}
    parts = [f"{labels[s]}: " + ", ".join(names) for s, names in by.items() if names]
    applicable = [n for n, c in checks if c["status"] != "n/a"]
    rest = "; ".join(parts) if parts else f"all {len(applicable)} checks passed"
    return headline_verdict(result).upper(), rest


def verdict_colour(result: Mapping) -> str:
    """The banner's colour: green stable, amber with warnings, red unstable."""
    headline = headline_verdict(result)
    return STATUS_COLOURS[{"stable": "pass", "unstable": "fail"}.get(headline, "warn")]


def flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def eval_table(eval_metrics: Mapping) -> tuple[list[str], list[list[str]]]:
    """Header and rows: rows = metric, columns = split x predictor ('test model', 'test ridge',
    ...); a cell is the value and its 95 % CI, "0.832 [0.80, 0.86]".

    Keys (the evaluate stage's): `eval/<split>/<predictor>/<metric>`, its CI ends under
    `.../ci95_low` and `.../ci95_high`. Only columns and rows that hold a number are kept."""
    cells: dict[tuple[str, str, str], str] = {}
    flat = flatten(eval_metrics)
    for key, value in flat.items():
        parts = key.split("/")
        if len(parts) != 4 or parts[0] != "eval" or parts[2].startswith("model_vs_"):
            continue
        _, split, model, metric = parts
        if split in EVAL_SPLITS and isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = flat.get(f"{key}/ci95_low"), flat.get(f"{key}/ci95_high")
            ci = (
                f" [{fmt(low)}, {fmt(high)}]"
                if isinstance(low, (int, float)) and isinstance(high, (int, float))
                else ""
            )
            cells[(split, model, metric)] = fmt(float(value)) + ci
    models = list(EVAL_MODELS) + sorted({m for _, m, _ in cells} - set(EVAL_MODELS))
    metrics = list(EVAL_METRICS) + sorted({m for _, _, m in cells} - set(EVAL_METRICS))
    cols = [(s, m) for s in EVAL_SPLITS for m in models if any(k[:2] == (s, m) for k in cells)]
    metrics = [m for m in metrics if any((s, mo, m) in cells for s, mo in cols)]
    header = ["metric"] + [f"{s} {m}" for s, m in cols]
    rows = [[m] + [cells.get((s, mo, m), "—") for s, mo in cols] for m in metrics]
    return header, rows


@dataclass(frozen=True)
class CheckSection:
    """One check as the report shows it: its result, and either the plot drawn under it or the
    check above whose section already shows that plot (one plot, the loss, serves three)."""

    name: str
    check: Mapping
    plot: Path | None = None
    see: str | None = None

    @property
    def shows_fix(self) -> bool:
        return self.check["status"] != "pass" and bool(self.check.get("fix"))


def check_sections(result: Mapping, plots: Mapping[str, Path]) -> tuple[list[CheckSection], dict[str, Path]]:
    """(a section per check in the report's order, the plots no check section shows)."""
    per_check = {c: Path(plots[n]) for c, n in CHECK_PLOTS.items() if n in plots}
    used = set(CHECK_PLOTS.values())
    others = {n: Path(p) for n, p in plots.items() if n not in used}
    shown: dict[Path, str] = {}  # a plot shared by two checks (loss) is drawn once, under the first
    sections = []
    for name, c in ordered_checks(result):
        path = per_check.get(name)
        if path is not None and path not in shown:
            shown[path] = name
            sections.append(CheckSection(name, c, plot=path))
        elif path is not None:
            sections.append(CheckSection(name, c, see=shown[path]))
        else:
            sections.append(CheckSection(name, c))
    return sections, others
