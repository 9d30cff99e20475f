"""CI's verdict on a smoke run: the run compared with the committed smoke reference run by the
rule `./dev compare` uses (decision.compare_arms, with the seed luck of
reference/seed_variance/smoke.json), as a table per metric for a CI log and a GitHub Actions job
summary, and a pass or a fail: a gating metric (GATES) whose outcome is "worse" fails it.

Why cosine and mse gate and the retrieval rates do not: docs/ci.md ("Which metrics gate, and
why"). The reference's seed spread is passed for the run whatever its arm: the question is whether
the run could be a run of the reference's arm (the project as committed), and a check that
borrowed the spread only for the reference's own arm would never see a config regression (docs/ci.md,
"What it catches, and what it does not").
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.decision import CONFIDENCE, ArmRuns, compare_arms
from pipeline.stats.item_sources import Side, predictor_table, runs_values, shared_values
from pipeline.stats.metrics import METRICS, SCORE_COLUMNS, format_interval, format_metric
from pipeline.stats.seed_variance import find_reference

PRESET = "smoke"
# The smoke run's item table, committed beside tests/smoke_reference.json's numbers (written with
# it by `./dev reference --refresh`). Not named eval_items.parquet: .gitignore keeps those out.
REFERENCE_ITEMS = REPO_ROOT / "reference" / "smoke_items.parquet"
REPORT = REPO_ROOT / "reports" / "smoke_verdict.md"  # where the table goes outside GitHub Actions
SUMMARY_VAR = "GITHUB_STEP_SUMMARY"
GATES = ("cosine", "mse")
REFRESH = "./dev reference --refresh"


class VerdictError(PipelineError):
    """The run cannot be judged against the reference (another preset, other data, a stale reference)."""


def _shown(path: Path) -> str:
    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _meta(side: Side, what: str):
    if len(side.sources) != 1:
        raise VerdictError(f"{what} ({side.spec}): one run expected, got {len(side.sources)}")
    meta = side.sources[0].meta
    if meta is None:
        raise VerdictError(
            f"{what} ({side.spec}): its item table says nothing of its preset and data (written by an older "
            "version): re-run the evaluate stage"
        )
    return meta


def identical(run: Side, reference: Side) -> bool:
    """The same items with the same scores, bit for bit: the same run (the usual CI case on the
    reference's own CPU path). Said as such rather than compared: there is nothing to decide."""
    a, b = (predictor_table(s.sources[0]) for s in (reference, run))
    if sorted(a["id"]) != sorted(b["id"]):
        return False
    a, b = (t.set_index("id").sort_index() for t in (a, b))
    return all(np.array_equal(a[c].to_numpy(), b[c].to_numpy()) for c in SCORE_COLUMNS)


def judge(run: Side, reference: Side, *, resamples: int, seed: int, reference_dir: Path | None = None) -> dict:
    """The verdict on `run` against `reference` (both one smoke run), as one JSON-able dict:
    per metric the reference's and the run's means, the difference run - reference, its interval
    and outcome, and whether it gates; `passed` False when a gating metric came out worse."""
    run_meta, ref_meta = _meta(run, "the run"), _meta(reference, "the reference")
    for meta, what in ((run_meta, f"the run ({run.spec})"), (ref_meta, f"the reference ({reference.spec})")):
        if meta.preset != PRESET:
            raise VerdictError(
                f"{what} is a run of preset {meta.preset!r}; the verdict judges a {PRESET} run (dvc exp run -S "
                f"preset={PRESET})"
            )
    if run_meta.data != ref_meta.data:
        raise VerdictError(
            f"the run was evaluated on other data (digest {run_meta.data}) than the reference {reference.spec} "
            f"({ref_meta.data}): after an intended change of the data or the embedding, refresh the reference "
            f"({REFRESH}) and commit it"
        )
    seeds = find_reference(PRESET, ref_meta.data, reference_dir)
    if seeds is None:
        raise VerdictError(
            f"no seed-variance reference of the {PRESET} preset on the reference's data ({ref_meta.data}) in "
            "reference/seed_variance/: re-measure it (./dev seeds --preset smoke) and commit it"
        )
    base = {
        "run": {"spec": run.spec, "arm": run_meta.arm_name, "digest": run_meta.arm_digest, "seed": run_meta.seed},
        "reference": {"spec": _shown(Path(reference.spec)), "seed": ref_meta.seed, "arm": ref_meta.arm_name},
        "seed_reference": seeds.shown_path,
        "gates": list(GATES),
        "level": CONFIDENCE,
    }
    if identical(run, reference):
        table = predictor_table(run.sources[0])
        means = {m: float(v.mean()) for m, v in runs_values([table], list(table["id"])).items()}
        rows = {
            m: {
                "a": means[m],
                "b": means[m],
                "difference": 0.0,
                "ci_low": None,
                "ci_high": None,
                "outcome": "identical",
            }
            for m in METRICS
        }
        return {
            **base,
            "identical": True,
            "items": len(table),
            "covers": "nothing to cover (no difference)",
            "metrics": rows,
            "warnings": [],
            "failed": [],
            "passed": True,
        }
    ids, (values_ref, values_run) = shared_values(
        [[predictor_table(reference.sources[0])], [predictor_table(run.sources[0])]]
    )
    tables = (len(reference.sources[0].table), len(run.sources[0].table))
    if not ids or set(tables) != {len(ids)}:
        raise VerdictError(
            f"the run holds {tables[1]} test items and the reference {tables[0]}, {len(ids)} of them shared: they were "
            f"split differently; after an intended change of the split, refresh the reference ({REFRESH})"
        )
    # No arm on either side (decision.ArmRuns.arm): the question is whether the run could be a run
    # of the reference's arm, so under it the run's seed spread is the reference's own.
    arm_ref = ArmRuns("reference", [ref_meta.seed], values_ref)
    arm_run = ArmRuns("run", [run_meta.seed], values_run)
    decisions, luck = compare_arms(arm_ref, arm_run, [seeds], resamples=resamples, seed=seed)
    rows = {m: d.as_dict() for m, d in decisions.items()}
    failed = [m for m in GATES if rows[m]["outcome"] == "worse"]
    return {
        **base,
        "identical": False,
        "items": len(ids),
        "covers": luck.describe(),
        "metrics": rows,
        "warnings": [] if luck.covers_seeds else [f"training luck is not covered: {luck.describe()}"],
        "failed": failed,
        "passed": not failed,
    }


def _cells(verdict: dict) -> list[list[str]]:
    rows = []
    for m, r in verdict["metrics"].items():
        interval = "-" if r["ci_low"] is None else format_interval(r["ci_low"], r["ci_high"], m, True)
        outcome = r["outcome"]
        if m in verdict["failed"]:
            outcome = f"{outcome}: FAILS"
        rows.append(
            [
                m + ("" if m not in verdict["gates"] else " (gate)"),
                format_metric(r["a"], m),
                format_metric(r["b"], m),
                format_metric(r["difference"], m, True),
                interval,
                outcome,
            ]
        )
    return rows


HEAD = ["metric", "reference", "run", "run - reference", "95 % interval", "outcome"]


def headline(verdict: dict) -> str:
    if verdict["identical"]:
        return "PASS: the smoke run is identical to the committed reference (every item's scores, bit for bit)"
    if verdict["passed"]:
        return f"PASS: no gating metric ({', '.join(verdict['gates'])}) is worse than the committed reference"
    return (
        f"FAIL: the smoke run is worse than the committed reference on {', '.join(verdict['failed'])} (beyond the "
        "luck of the test items and of the training seeds)"
    )


def _about(verdict: dict) -> list[str]:
    run, ref = verdict["run"], verdict["reference"]
    return [
        f"Run {run['spec']} (arm {run['arm']} [{run['digest']}], seed {run['seed']}) against the reference "
        f"{ref['spec']} (seed {ref['seed']}), over {verdict['items']} test items. Intervals at "
        f"{verdict['level'] * 100:g} %, covering: {verdict['covers']}.",
        f"Gates: {', '.join(verdict['gates'])} (a 'worse' fails the check); the retrieval rates sit near their floor "
        "on smoke and are shown only (docs/ci.md).",
    ]


def _why(verdict: dict) -> list[str]:
    """Each gate's outcome in words (why "inconclusive" is not "worse", for one)."""
    return [
        f"{m}: {verdict['metrics'][m]['outcome']}, {verdict['metrics'][m]['why']}"
        for m in verdict["gates"]
        if verdict["metrics"][m].get("why")
    ]


def _after(verdict: dict) -> list[str]:
    if verdict["passed"]:
        return []
    return [
        f"If the change is intended, refresh the reference ({REFRESH}) and commit it; to measure the change: "
        "./dev compare with replicates, or ./dev decide (docs/decisions.md)."
    ]


def render_text(verdict: dict) -> str:
    rows = _cells(verdict)
    widths = [max(len(r[i]) for r in [HEAD, *rows]) for i in range(len(HEAD))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, 4, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [headline(verdict), *_about(verdict), "", line(HEAD).rstrip(), "-" * len(line(HEAD).rstrip())]
    out += [line(r).rstrip() for r in rows]
    out += [f"warning: {w}" for w in verdict["warnings"]]
    out += ["", *_why(verdict)] if _why(verdict) else []
    return "\n".join([*out, *(["", *_after(verdict)] if _after(verdict) else [])])


def render_markdown(verdict: dict) -> str:
    """The verdict as GitHub-flavoured Markdown: a job summary's heading, the table, the notes."""
    status = ":white_check_mark:" if verdict["passed"] else ":x:"
    out = [f"### {status} Smoke verdict", "", f"**{headline(verdict)}**", "", *_about(verdict), ""]
    out += ["| " + " | ".join(HEAD) + " |", "|---|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") or " " for c in r) + " |" for r in _cells(verdict)]
    out += [""] + [f"> warning: {w}" for w in verdict["warnings"]]
    out += [f"- {line}" for line in _why(verdict)] + [""]
    return "\n".join([*out, *_after(verdict)]).rstrip() + "\n"


def publish(markdown: str, environ: dict | None = None, report: Path | None = None) -> Path:
    """Append the Markdown to GitHub Actions' job summary when GITHUB_STEP_SUMMARY names it (the
    file collects every step's summary, hence append), else write it to `report` (default REPORT). Returns where."""
    environ = os.environ if environ is None else environ
    target = environ.get(SUMMARY_VAR)
    if target:
        path = Path(target)
        with path.open("a", encoding="utf-8") as f:
            f.write(markdown + "\n")
        return path
    from pipeline.core.atomic import write_text

    report = Path(report or REPORT)
    report.parent.mkdir(parents=True, exist_ok=True)
    write_text(report, markdown)
    return report
