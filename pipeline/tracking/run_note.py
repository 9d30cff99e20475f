"""The model run's description (MLflow's run tag `mlflow.note.content`, markdown): the first thing
the run page's Overview shows. It says in a few lines what a researcher looks for first: what
the run is (preset and overrides), the headline test metrics with their 95 % intervals, the
stability verdict, and where to look next. Each stage that adds to the run (train, evaluate,
report) writes it again from the run's tags, so it says what the run holds so far.
"""

from __future__ import annotations

from typing import Mapping

NOTE_TAG = "mlflow.note.content"
# (interval tag, label) in the order shown; the tags are metric_names.INTERVAL_TAGS'. The page
# shows the description's first lines only ("Show more" for the rest): the first paragraph holds
# the headline, the second the rest.
HEADLINES = (
    ("eval.test.group_top1", "group top-1"),
    ("eval.test.cosine", "cosine"),
    ("eval.test.vs_mlp.group_top1", "group top-1 minus the MLP baseline's"),
)
MORE = (
    ("eval.test.vs_ridge.group_top1", "group top-1 minus ridge's"),
    ("eval.test.group_top5", "group top-5"),
    ("eval.test.mrr", "MRR"),
    ("eval.test.top1", "exact top-1"),
    ("eval.test.vs_ridge.cosine", "cosine minus ridge's"),
)
WHERE_TO_LOOK = (
    "*Model metrics* opens on `curves`: loss, val loss and cosine, gradient norm, update ratio, step time, lr",
    "artifacts: `report/stability.html` (the checks and their plots), `evaluate/eval.json` (every metric, "
    "every interval, every baseline), `train/train_steps.csv` (every telemetry column)",
)


def note_text(tags: Mapping[str, str]) -> str:
    """The description, from the run's tags."""
    shown = [f"{label} **{tags[tag]}**" for tag, label in HEADLINES if tags.get(tag)]
    if shown:
        items = tags.get("eval.test.items")
        headline = f"Test{f' ({items} items)' if items else ''}: " + ", ".join(shown) + " (95 % intervals)."
    else:
        status = tags.get("stage.evaluate.status")
        headline = f"Not evaluated{f' (evaluate: {status})' if status else ' yet'}."
    if tags.get("learning.vs_strongest"):
        headline += f" Against the strongest baseline: **{tags['learning.vs_strongest']}**."
    verdict = tags.get("stability.verdict")
    if verdict:
        headline += f" Stability: **{verdict}**."
    overrides = tags.get("run.overrides")
    lines = [headline, "", f"**{tags.get('mlflow.runName', 'this run')}**" + (f": `{overrides}`" if overrides else "")]
    more = [f"{label} {tags[tag]}" for tag, label in MORE if tags.get(tag)]
    if more:
        lines += ["", "Also on test: " + ", ".join(more) + "."]
    if verdict:
        failed, warned = tags.get("stability.failed", "none"), tags.get("stability.warned", "none")
        lines += ["", f"Stability checks failed: {failed}; warned: {warned}."]
    lines += ["", *(f"- {line}" for line in WHERE_TO_LOOK)]
    return "\n".join(lines)


MODEL_USE = (
    "The answer model of the run **{run}**: a question in, the answer bank's k nearest answers out, each with "
    "its cosine score and whether it is confident (`mlflow.pyfunc.load_model('models:/{model_id}')`, then "
    "`predict(pd.DataFrame({{'question': [...]}}), params={{'k': 3}})`; docs/serving.md)."
)


def model_note_text(tags: Mapping[str, str], model_id: str) -> str:
    """The logged model's description (its tag `mlflow.note.content`, the model page's *Description*):
    what it is and how to call it, then its run's headline."""
    use = MODEL_USE.format(run=tags.get("mlflow.runName", "?"), model_id=model_id)
    return use + "\n\n" + note_text(tags).split("\n\n- ", 1)[0]


def update_note() -> None:
    """Write the description of the run this process logs to, and of its logged model(s) (tracking
    off or no run: nothing)."""
    from pipeline.tracking import store as tracking

    run_id = tracking.current_run_id() if tracking.enabled() else ""
    if not run_id:
        return
    import mlflow

    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    tags = run.data.tags
    tracking.set_tags({NOTE_TAG: note_text(tags)})
    for output in getattr(run.outputs, "model_outputs", None) or []:
        client.set_logged_model_tags(output.model_id, {NOTE_TAG: model_note_text(tags, output.model_id)})
