"""Render a `run_checks` result as Markdown (PNG links) or self-contained HTML (PNG data URIs).

Both formats are built from the same pieces (verdict line, check table, evidence, run info,
evaluation table) so they always say the same thing. Reading order is the researcher's: verdict,
what failed, the run it is about, then per check the evidence, the fix and the plot.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any, Mapping

from pipeline.report.checks import CHECK_ORDER, STATUSES, headline_verdict

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

# Units of evidence values and metrics, by key (the part after the last "/"): (pattern, unit,
# multiplier), first match wins. "_x" matches a suffix, "x_" a prefix, anything else a substring.
# Every number in the report carries a unit; pure statistics (p-values, R², rho) have none.
_UNITS: tuple[tuple[str, str, float], ...] = (
    ("_mb_per_1k_steps", "MB per 1k steps", 1.0),
    ("_mb", "MB", 1.0),
    ("_ms", "ms", 1.0),
    ("_us", "µs", 1.0),  # device_utilisation: mean kernel duration
    ("samples_per_s", "samples/s", 1.0),
    ("seconds", "s", 1.0),
    ("frac_", "%", 100.0),
    ("fraction", "%", 100.0),
    ("duration", "steps", 1.0),  # before "ratio", which it holds
    ("ratio", "x", 1.0),
    ("fail_factor", "x", 1.0),
    ("scale", "(loss scale)", 1.0),
    ("flow_steps", "flow-steps per batch (live flows summed over steps)", 1.0),
    ("median_steps", "flow steps per batch", 1.0),
    ("min_steps", "flow steps per batch", 1.0),
    ("max_steps", "flow steps per batch", 1.0),
    ("step_cap", "flow steps per batch", 1.0),
    ("steps_used", "flow steps per batch", 1.0),
    ("_norm", "(L2 norm)", 1.0),
    ("_rise", "%", 100.0),  # loss_regression: the smoothed loss above its running best, a fraction
    ("regressions", "regression(s)", 1.0),
    ("loss_drop", "%", 100.0),  # learning: the share the training loss fell by
    ("min_drop", "%", 100.0),
    ("seed_reference_seeds", "seeds", 1.0),
    ("loss", "(loss)", 1.0),
    ("_sigma", "std above the trailing mean", 1.0),
    ("cosine", "(cosine)", 1.0),
    ("vs_", "(cosine)", 1.0),
    ("top1", "%", 100.0),
    ("top5", "%", 100.0),
    ("mrr", "(mean reciprocal rank)", 1.0),
    ("rows", "logged rows", 1.0),
)
_STEP_NUMBER = ("_step", "first_step", "last_step")  # a step number: "step 15"
_PER_STEP = "_per_step"  # a count per training step (host syncs, kernels, ops): not a step number
_STEP_COUNTS = {
    "count",
    "events",
    "total_steps",
    "skipped_total",
    "backoffs",
    "growths",
    "severe",
    "unrecovered",
    "from_events",
    "steps",
    "planned_steps",
    "skipped_steps",
    "spikes",
}


def _matches(key: str, pattern: str) -> bool:
    if pattern.startswith("_"):
        return key.endswith(pattern)
    if pattern.endswith("_"):
        return key.startswith(pattern)
    return pattern in key


def unit(key: str) -> tuple[str, float]:
    """(unit, multiplier) for an evidence or metric key; ('', 1.0) for a pure statistic."""
    k = str(key).rsplit("/", 1)[-1]
    if k.endswith(_PER_STEP):  # a count per training step: host_syncs_per_step -> "host syncs per step"
        return k.replace("_", " "), 1.0
    if k.endswith(_STEP_NUMBER):
        return "step", 1.0
    if k in _STEP_COUNTS:
        return "steps", 1.0
    return next(((name, mult) for pattern, name, mult in _UNITS if _matches(k, pattern)), ("", 1.0))


def fmt_value(key: str, value: Any) -> str:
    """A value with its unit: '12.3 MB', '4.2 %', 'step 15', '1.03x', '0.886 (cosine)'."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return fmt(value)
    name, mult = unit(key)
    if name == "step":
        return f"step {fmt(value)}"
    shown = fmt(value * mult if mult != 1.0 else value)
    if name == "x":
        return f"{shown}x"
    return f"{shown} {name}" if name else shown


# ---------------------------------------------------------------- shared pieces


def fmt(value: Any) -> str:
    """Numbers short enough to read at a glance: 201.3, 0.0123, 1.2e-45, 12,345."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 0.01:
            return f"{value:.4g}"
        return f"{value:.2e}"
    return str(value)


def _ordered_checks(result: Mapping) -> list[tuple[str, Mapping]]:
    """fail, warn, skip, pass; canonical order within a status (whatever order result has)."""
    rank = {s: i for i, s in enumerate(STATUSES)}
    canon = {n: i for i, n in enumerate(CHECK_ORDER)}
    items = list(result["checks"].items())
    return sorted(items, key=lambda kv: (rank.get(kv[1]["status"], 4), canon.get(kv[0], len(canon))))


def verdict_parts(result: Mapping) -> tuple[str, str]:
    """('STABLE'|'STABLE, WITH WARNINGS'|'UNSTABLE', the rest of the line: failed checks first,
    then warnings)."""
    checks = _ordered_checks(result)
    by = {s: [n for n, c in checks if c["status"] == s] for s in ("fail", "warn", "skip")}
    parts = []
    if by["fail"]:
        parts.append("failed: " + ", ".join(by["fail"]))
    if by["warn"]:
        parts.append("warnings: " + ", ".join(by["warn"]))
    if by["skip"]:
        parts.append("skipped: " + ", ".join(by["skip"]))
    applicable = [n for n, c in checks if c["status"] != "n/a"]
    rest = "; ".join(parts) if parts else f"all {len(applicable)} checks passed"
    return headline_verdict(result).upper(), rest


def _flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def eval_table(eval_metrics: Mapping) -> tuple[list[str], list[list[str]]]:
    """Header and rows: rows = metric, columns = split x predictor ('test model', 'test ridge',
    ...); a cell is the value and its 95 % CI, "0.832 [0.80, 0.86]".

    Keys (the evaluate stage's): `eval/<split>/<predictor>/<metric>`, its CI ends under
    `.../ci95_low` and `.../ci95_high`. Only columns and rows that hold a number are kept."""
    cells: dict[tuple[str, str, str], str] = {}
    flat = _flatten(eval_metrics)
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
    models = [m for m in EVAL_MODELS] + sorted({m for _, m, _ in cells} - set(EVAL_MODELS))
    metrics = [m for m in EVAL_METRICS] + sorted({m for _, _, m in cells} - set(EVAL_METRICS))
    cols = [(s, m) for s in EVAL_SPLITS for m in models if any(k[:2] == (s, m) for k in cells)]
    metrics = [m for m in metrics if any((s, mo, m) in cells for s, mo in cols)]
    header = ["metric"] + [f"{s} {m}" for s, m in cols]
    rows = [[m] + [cells.get((s, mo, m), "—") for s, mo in cols] for m in metrics]
    return header, rows


def _plot_sections(plots: Mapping[str, Path]) -> tuple[dict[str, Path], dict[str, Path]]:
    """(plot per check name, plots no check section shows)."""
    per_check = {c: Path(plots[n]) for c, n in CHECK_PLOTS.items() if n in plots}
    used = set(CHECK_PLOTS.values())
    return per_check, {n: Path(p) for n, p in plots.items() if n not in used}


# ---------------------------------------------------------------- Markdown


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(
    result: Mapping,
    plots: Mapping[str, Path],
    run_info: Mapping,
    eval_metrics: Mapping | None = None,
    plots_rel: str = "plots/",
) -> str:
    """The report as Markdown; images link to `plots_rel + <file name>` (relative to the report)."""
    verdict, rest = verdict_parts(result)
    per_check, others = _plot_sections(plots)
    shown: dict[Path, str] = {}  # a plot shared by two checks (loss) is drawn once, under the first
    out = ["# Stability report", "", f"**Verdict: {verdict}** — {rest}", ""]
    out += ["| check | status | summary |", "|---|---|---|"]
    for name, c in _ordered_checks(result):
        out.append(f"| {name} | {c['status'].upper()} | {_md_cell(c['summary'])} |")
    out.append("")
    if run_info:
        # run_info comes from outside (tags, config): escape it, Markdown viewers render raw HTML.
        out += ["## Run", ""]
        out += [
            f"- **{_md_cell(html.escape(str(k)))}**: {_md_cell(html.escape(fmt_value(k, v)))}"
            for k, v in run_info.items()
        ]
        out.append("")
    for name, c in _ordered_checks(result):
        out += [f"## {name}: {c['status'].upper()}", "", c["summary"], ""]
        out += [f"- {k}: {fmt_value(k, v)}" for k, v in c["evidence"].items()]
        if c["evidence"]:
            out.append("")
        if c["status"] != "pass" and c.get("fix"):
            out += [f"**Fix:** {c['fix']}", ""]
        if name in per_check and per_check[name] not in shown:
            shown[per_check[name]] = name
            out += [f"![{name}]({plots_rel}{per_check[name].name})", ""]
        elif name in per_check:
            out += [f"(plot: see {shown[per_check[name]]} above)", ""]
    if others:
        out += ["## Other plots", ""]
        for n, path in others.items():
            out += [f"![{n}]({plots_rel}{path.name})", ""]
    if eval_metrics:
        header, rows = eval_table(eval_metrics)
        if rows:
            out += ["## Evaluation", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:960px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:.85em;
font-weight:600}
.verdict{font-size:1.25em;color:#fff;padding:.6em 1em;border-radius:6px;margin:.5em 0 1em}
.fix{background:#fff4e5;border-left:4px solid #b26a00;padding:.5em .8em}
img{max-width:100%;border:1px solid #eee}section{margin-bottom:2em}
"""


def _badge(status: str) -> str:
    colour = STATUS_COLOURS.get(status, "#616161")
    return f'<span class="badge" style="background:{colour}">{html.escape(status.upper())}</span>'


def _img(path: Path, alt: str) -> str:
    """PNG as a data URI so the file works alone (mailed, attached to MLflow, opened offline)."""
    try:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    except OSError as e:
        return f"<p><em>plot {html.escape(str(Path(path).name))} unavailable: {html.escape(str(e))}</em></p>"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def render_html(
    result: Mapping, plots: Mapping[str, Path], run_info: Mapping, eval_metrics: Mapping | None = None
) -> str:
    """The same report as one self-contained HTML page: inline CSS, embedded PNGs, no links out."""
    e = html.escape
    verdict, rest = verdict_parts(result)
    per_check, others = _plot_sections(plots)
    shown: dict[Path, str] = {}  # a plot shared by two checks (loss) is drawn once, under the first
    headline = headline_verdict(result)
    colour = STATUS_COLOURS[{"stable": "pass", "unstable": "fail"}.get(headline, "warn")]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>Stability report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Stability report</h1>",
        # The verdict first, as a coloured banner (green stable, amber with warnings, red
        # unstable): the one line a reader needs before anything else.
        f'<p class="verdict" style="background:{colour}"><strong>Verdict: {e(verdict)}</strong> — {e(rest)}</p>',
        "<table><tr><th>check</th><th>status</th><th>summary</th></tr>",
    ]
    for name, c in _ordered_checks(result):
        out.append(f"<tr><td>{e(name)}</td><td>{_badge(c['status'])}</td><td>{e(c['summary'])}</td></tr>")
    out.append("</table>")
    if run_info:
        out.append("<h2>Run</h2><ul>")
        out += [f"<li><strong>{e(str(k))}</strong>: {e(fmt_value(k, v))}</li>" for k, v in run_info.items()]
        out.append("</ul>")
    for name, c in _ordered_checks(result):
        out.append(f"<section><h2>{e(name)} {_badge(c['status'])}</h2><p>{e(c['summary'])}</p>")
        if c["evidence"]:
            out.append(
                "<ul>"
                + "".join(f"<li>{e(str(k))}: {e(fmt_value(k, v))}</li>" for k, v in c["evidence"].items())
                + "</ul>"
            )
        if c["status"] != "pass" and c.get("fix"):
            out.append(f'<p class="fix"><strong>Fix:</strong> {e(c["fix"])}</p>')
        if name in per_check and per_check[name] not in shown:
            shown[per_check[name]] = name
            out.append(_img(per_check[name], name))
        elif name in per_check:
            out.append(f"<p><em>Plot: see {e(shown[per_check[name]])} above.</em></p>")
        out.append("</section>")
    if others:
        out.append("<section><h2>Other plots</h2>")
        out += [_img(path, n) for n, path in others.items()]
        out.append("</section>")
    if eval_metrics:
        header, rows = eval_table(eval_metrics)
        if rows:
            out.append("<h2>Evaluation</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(v)}</td>" for v in r) + "</tr>" for r in rows]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
