"""Render a `run_checks` result as Markdown (PNG links) or self-contained HTML (PNG data URIs),
each from its Jinja2 template (templates/stability.md.j2, templates/stability.html.j2) over the
same pieces (layout.py), so they always say the same thing."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Mapping

from jinja2 import Environment, FileSystemLoader, select_autoescape

from pipeline.report.layout import STATUS_COLOURS, check_sections, eval_table, verdict_colour, verdict_parts
from pipeline.report.units import fmt_value

TEMPLATES = Path(__file__).parent / "templates"


def md_cell(text: object) -> str:
    """Text that stays inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def embedded(path: Path) -> dict[str, str | None]:
    """A PNG as base64 for a data URI, so the page works alone (mailed, attached to MLflow, opened
    offline); or why it could not be read."""
    try:
        return {"data": base64.b64encode(Path(path).read_bytes()).decode("ascii"), "error": None}
    except OSError as e:
        return {"data": None, "error": str(e)}


def environment() -> Environment:
    """HTML templates autoescaped (run info and summaries come from outside); Markdown ones not."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(md_cell=md_cell, html_escape=html.escape)
    env.globals.update(fmt_value=fmt_value, embedded=embedded, status_colours=STATUS_COLOURS)
    return env


def page_context(result: Mapping, plots: Mapping[str, Path], run_info: Mapping, eval_metrics: Mapping | None) -> dict:
    verdict, rest = verdict_parts(result)
    sections, others = check_sections(result, plots)
    header, rows = eval_table(eval_metrics) if eval_metrics else ([], [])
    return {
        "verdict": verdict,
        "rest": rest,
        "verdict_colour": verdict_colour(result),
        "sections": sections,
        "others": others,
        "run_info": run_info,
        "header": header,
        "rows": rows,
    }


def render_markdown(
    result: Mapping,
    plots: Mapping[str, Path],
    run_info: Mapping,
    eval_metrics: Mapping | None = None,
    plots_rel: str = "plots/",
) -> str:
    """The report as Markdown; images link to `plots_rel + <file name>` (relative to the report)."""
    context = page_context(result, plots, run_info, eval_metrics)
    text = environment().get_template("stability.md.j2").render(**context, plots_rel=plots_rel)
    return text.rstrip() + "\n"


def render_html(
    result: Mapping, plots: Mapping[str, Path], run_info: Mapping, eval_metrics: Mapping | None = None
) -> str:
    """The same report as one self-contained HTML page: inline CSS, embedded PNGs, no links out."""
    return environment().get_template("stability.html.j2").render(**page_context(result, plots, run_info, eval_metrics))
