"""Copy the runs of one MLflow store into another through MlflowClient's public API: the project's
SQLite `mlflow.db` into the team server (`./dev team copy-store`). docs/team.md ("Moving your local
runs to the team server") says what is copied, what is not copied verbatim and why. The source is
only read. A copy is found again by its tag `energy_flow.copied_from`: a second copy skips it; one
an interruption left without its last tag, `energy_flow.copy_complete`, is deleted and made again.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from pipeline.core.environment import temporary_env
from pipeline.core.errors import PipelineError
from tools.team.store_ids import (
    COPIED_FROM,
    COPY_COMPLETE,
    MLMODEL,
    MODEL_VERSIONS,
    OURS,
    PARENT_RUN,
    RUN_NAME,
    id_swap,
)

# MLflow's per-request limits of log_batch (mlflow.utils.validation): 1000 entities in all, of
# which at most 100 params and 100 tags.
BATCH_METRICS = 1000
BATCH_PARAMS_TAGS = 100
PAGE = 1000
FINAL = ("READY", "FAILED")  # the statuses finalize_logged_model takes


@dataclass
class CopySummary:
    copied: int = 0
    skipped: int = 0  # copied before: found by their tag
    replaced: int = 0  # partial copies an interrupted run left, deleted and copied again
    params: int = 0
    metric_values: int = 0
    datasets: int = 0
    models: int = 0
    artifact_files: int = 0
    artifact_bytes: int = 0
    seconds: float = 0.0
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (source run id, copy's run id), every run

    def line(self, source: str, dest: str) -> str:
        return (
            f"copied {self.copied} runs from {source} to {dest} ({self.skipped} there already, "
            f"{self.replaced} partial copies redone): {self.params} params, {self.metric_values} metric values, "
            f"{self.datasets} dataset inputs, {self.models} logged models, {self.artifact_files} artifact files "
            f"({self.artifact_bytes / 1e6:.1f} MB) in {self.seconds:.1f} s"
        )


def sqlite_source_problem(uri: str) -> str | None:
    """Why a sqlite:/// source cannot be copied from, or None. Opening a missing file, or one
    without MLflow's tables, through MLflow would make it a new store: the source must stay as
    it is, so it is looked at with sqlite3, read-only, first."""
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///") :])
    if not path.is_file():
        return f"{path}: no such file; expected the SQLite store (mlflow.db) to copy from"
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        return f"{path}: not a SQLite database ({e}); expected an MLflow store (mlflow.db)"
    if not {"experiments", "runs", "metrics"} <= tables:
        return f"{path}: no MLflow tables (experiments, runs, metrics) in it; expected an MLflow store"
    return None


def quiet_mlflow():
    """No progress bar of MLflow's per artifact download and no "View run ... at" line per ended
    run: a line or two per run would bury the copy's own bar and summary."""
    return temporary_env(
        {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
    )


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def paged(call, **kwargs) -> Iterator:
    """Every item of a paged MlflowClient search."""
    token = None
    while True:
        page = call(**kwargs, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def source_experiments(src, names: Iterable[str] | None, source_uri: str) -> list:
    """The source's active experiments, or those named (each must exist)."""
    from mlflow.entities import ViewType

    experiments = src.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=PAGE)
    if not names:
        return sorted(experiments, key=lambda e: int(e.experiment_id) if e.experiment_id.isdigit() else 0)
    by_name = {e.name: e for e in experiments}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise PipelineError(
            f"{source_uri}: no active experiment named {', '.join(map(repr, missing))}; "
            f"it has {', '.join(sorted(map(repr, by_name))) or 'none'}"
        )
    return [by_name[n] for n in dict.fromkeys(names)]


def dest_experiment(dst, experiment, dest_uri: str) -> str:
    """The destination's experiment of the same name (made if missing), with the source's tags
    set on it; its id."""
    from pipeline.tracking.store import artifact_location

    found = dst.get_experiment_by_name(experiment.name)
    if found is None:
        return dst.create_experiment(
            experiment.name, artifact_location=artifact_location(dest_uri), tags=experiment.tags
        )
    if found.lifecycle_stage != "active":
        raise PipelineError(
            f"{dest_uri}: experiment {experiment.name!r} is deleted there; restore it "
            f"(`mlflow experiments restore --experiment-id {found.experiment_id}`) or copy other experiments"
        )
    for key, value in experiment.tags.items():
        if found.tags.get(key) != value:
            dst.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def parents_first(runs: list) -> list:
    """The runs ordered by start time, each parent before its children (its copy's id is needed
    for theirs)."""
    by_id = {r.info.run_id: r for r in runs}
    ordered, placed = [], set()

    def place(run, path=()):
        run_id = run.info.run_id
        if run_id in placed or run_id in path:
            return
        parent = by_id.get(run.data.tags.get(PARENT_RUN, ""))
        if parent is not None:
            place(parent, (*path, run_id))
        placed.add(run_id)
        ordered.append(run)

    for run in sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)):
        place(run)
    return ordered


def existing_copies(dst, experiment_id: str) -> dict[str, list]:
    """The destination's active runs in the experiment that are copies, by source run id (a
    list: two copies of one run are a fault the comparison reports)."""
    found: dict[str, list] = {}
    for run in paged(dst.search_runs, experiment_ids=[experiment_id], filter_string=f"tags.`{COPIED_FROM}` != ''"):
        found.setdefault(run.data.tags[COPIED_FROM], []).append(run)
    return found


def models_by_run(mlflow_client, experiment_id: str) -> dict[str, list]:
    """The experiment's logged models, by the run that made them."""
    models: dict[str, list] = {}
    for model in paged(mlflow_client.search_logged_models, experiment_ids=[experiment_id], max_results=100):
        models.setdefault(model.source_run_id or "", []).append(model)
    return models


@dataclass
class Copier:
    src: object
    dst: object
    source_uri: str
    dest_uri: str
    summary: CopySummary
    run_map: dict[str, str] = field(default_factory=dict)  # source run id -> copy's
    model_map: dict[str, str] = field(default_factory=dict)  # source model id -> copy's
    scratch: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))

    def where(self, run) -> str:
        return f"run {run.info.run_id} ({run.info.run_name!r}) of {self.source_uri}"

    def copy_run(self, run, dest_experiment_id: str, models: list) -> str:
        from mlflow.entities import Param, RunTag

        # (OURS too: a run that is itself a copy, from another server, is marked anew)
        tags = {k: v for k, v in run.data.tags.items() if k not in (RUN_NAME, PARENT_RUN, *OURS)}
        if PARENT_RUN in run.data.tags:
            parent = run.data.tags[PARENT_RUN]
            if parent not in self.run_map:
                raise PipelineError(
                    f"{self.where(run)}: its parent run {parent} is not copied (deleted, or in an experiment not "
                    "selected); copy the parent's experiment too"
                )
            tags[PARENT_RUN] = self.run_map[parent]
        # The mark first: whatever step fails after create_run, the run is known as a partial copy.
        # mlflow.user too: create_run takes the run's user from it (the rest follows in batches).
        first = {COPIED_FROM: run.info.run_id, **{k: v for k, v in tags.items() if k == "mlflow.user"}}
        new = self.dst.create_run(
            dest_experiment_id, start_time=run.info.start_time, tags=first, run_name=run.info.run_name
        )
        new_id = new.info.run_id
        self.run_map[run.info.run_id] = new_id
        params = [Param(k, v) for k, v in run.data.params.items()]
        rest = [RunTag(k, v) for k, v in tags.items() if k not in first]
        for batch in chunks(params, BATCH_PARAMS_TAGS):
            self.dst.log_batch(new_id, params=batch)
        for batch in chunks(rest, BATCH_PARAMS_TAGS):
            self.dst.log_batch(new_id, tags=batch)
        self.summary.params += len(params)
        self.copy_metrics(run, new_id)
        if run.inputs and run.inputs.dataset_inputs:
            self.dst.log_inputs(new_id, datasets=list(run.inputs.dataset_inputs))
            self.summary.datasets += len(run.inputs.dataset_inputs)
        self.copy_artifacts(run, new_id)
        for model in models:
            self.copy_model(model, run, new_id, dest_experiment_id)
        self.link_models(run, new_id)
        self.finish(run, new_id)
        return new_id

    def copy_metrics(self, run, new_id: str) -> None:
        from mlflow.entities import Metric

        values = [
            Metric(m.key, m.value, m.timestamp, m.step)
            for key in sorted(run.data.metrics)
            for m in self.src.get_metric_history(run.info.run_id, key)
        ]
        for batch in chunks(values, BATCH_METRICS):
            self.dst.log_batch(new_id, metrics=batch)
        self.summary.metric_values += len(values)

    def copy_artifacts(self, run, new_id: str) -> None:
        if not self.src.list_artifacts(run.info.run_id):
            return
        with tempfile.TemporaryDirectory(dir=self.scratch, prefix="copy-store-") as tmp:
            local = self.src.download_artifacts(run.info.run_id, "", tmp)
            self.count_files(Path(local))
            self.dst.log_artifacts(new_id, local)

    def copy_model(self, model, run, new_run_id: str, dest_experiment_id: str) -> None:
        """A logged model of `run`: made on the destination with the copy as its source run, its
        artifacts (the MLmodel file naming the copy's ids and location), its metrics (logged
        through the run, as MLflow links them), then finalized with the source's status."""
        import mlflow
        from mlflow.entities import Metric

        tags = {k: v for k, v in model.tags.items() if k != MODEL_VERSIONS and k not in OURS}
        new = self.dst.create_logged_model(
            dest_experiment_id,
            name=model.name,
            source_run_id=new_run_id,
            tags={**tags, COPIED_FROM: model.model_id},
            params=model.params,
            model_type=model.model_type,
        )
        self.model_map[model.model_id] = new.model_id
        with tempfile.TemporaryDirectory(dir=self.scratch, prefix="copy-store-model-") as tmp:
            try:
                local = Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=model.artifact_location, dst_path=tmp, tracking_uri=self.source_uri
                    )
                )
            except Exception as e:  # a model whose artifacts are gone from the source's store
                raise PipelineError(
                    f"{self.where(run)}: the artifacts of its logged model {model.model_id} ({model.name!r}) "
                    f"cannot be read from {model.artifact_location}: {e}"
                ) from e
            mlmodel = local / MLMODEL
            if mlmodel.is_file():
                swap = {model.artifact_location: new.artifact_location, model.model_id: new.model_id}
                swap[run.info.run_id] = new_run_id
                mlmodel.write_text(id_swap(mlmodel.read_text(), swap))
            self.count_files(local)
            if any(local.iterdir()):
                self.dst.log_model_artifacts(new.model_id, str(local))
        by_run: dict[str, list] = {}
        for m in model.metrics or []:
            by_run.setdefault(m.run_id or run.info.run_id, []).append(m)
        for source_run, values in by_run.items():
            target = self.run_map.get(source_run)
            if target is None:
                raise PipelineError(
                    f"{self.where(run)}: metrics of its logged model {model.model_id} were logged by run "
                    f"{source_run}, which is not copied"
                )
            metrics = [
                Metric(
                    m.key,
                    m.value,
                    m.timestamp,
                    m.step,
                    model_id=new.model_id,
                    dataset_name=m.dataset_name,
                    dataset_digest=m.dataset_digest,
                )
                for m in values
            ]
            for batch in chunks(metrics, BATCH_METRICS):
                self.dst.log_batch(target, metrics=batch)
        if str(model.status) in FINAL:  # a PENDING model (its logging never ended) stays PENDING
            self.dst.finalize_logged_model(new.model_id, model.status)
        self.summary.models += 1

    def link_models(self, run, new_id: str) -> None:
        """The run's model inputs and outputs, to the copies of those models."""
        from mlflow.entities import LoggedModelInput, LoggedModelOutput

        def mapped(model_id: str, what: str) -> str:
            if model_id not in self.model_map:
                raise PipelineError(
                    f"{self.where(run)}: its {what} logged model {model_id} is not copied (its run is deleted or "
                    "in an experiment not selected)"
                )
            return self.model_map[model_id]

        outputs = run.outputs.model_outputs if run.outputs else []
        if outputs:
            self.dst.log_outputs(new_id, [LoggedModelOutput(mapped(o.model_id, "output"), o.step) for o in outputs])
        inputs = run.inputs.model_inputs if run.inputs else []
        if inputs:
            self.dst.log_inputs(new_id, models=[LoggedModelInput(mapped(i.model_id, "input")) for i in inputs])

    def finish(self, run, new_id: str) -> None:
        """The source's status and end time, then the tag that says the copy is whole."""
        if run.info.end_time:
            self.dst.set_terminated(new_id, run.info.status, end_time=run.info.end_time)
        elif run.info.status != "RUNNING":
            self.dst.update_run(new_id, status=run.info.status)
        self.dst.set_tag(new_id, COPY_COMPLETE, "true")

    def count_files(self, root: Path) -> None:
        for path in root.rglob("*"):
            if path.is_file():
                self.summary.artifact_files += 1
                self.summary.artifact_bytes += path.stat().st_size


def copy_store(
    source_uri: str,
    dest_uri: str,
    experiments: Iterable[str] | None = None,
    progress: bool = True,
) -> CopySummary:
    """Copy every active run of `source_uri`'s experiments (or of those named) into `dest_uri`,
    skipping those copied before. Returns what was copied, and every (source, copy) run pair."""
    from tqdm.auto import tqdm

    if source_uri.rstrip("/") == dest_uri.rstrip("/"):
        raise PipelineError(f"--from and --to are the same store ({source_uri}); expected two different stores")
    problem = sqlite_source_problem(source_uri)
    if problem:
        raise PipelineError(problem)
    t0 = time.monotonic()
    src, dst = client(source_uri), client(dest_uri)
    summary = CopySummary()
    copier = Copier(src, dst, source_uri, dest_uri, summary)
    plan = []  # (source experiment, destination experiment id, runs, source models by run)
    for experiment in source_experiments(src, experiments, source_uri):
        dest_id = dest_experiment(dst, experiment, dest_uri)
        runs = parents_first(list(paged(src.search_runs, experiment_ids=[experiment.experiment_id])))
        copies = existing_copies(dst, dest_id)
        dst_models = models_by_run(dst, dest_id)
        for source_id, found in copies.items():
            for copy in found:
                if copy.data.tags.get(COPY_COMPLETE) == "true":
                    copier.run_map[source_id] = copy.info.run_id
                    for model in dst_models.get(copy.info.run_id, []):
                        if COPIED_FROM in model.tags:
                            copier.model_map[model.tags[COPIED_FROM]] = model.model_id
                else:  # an interrupted copy: its run and logged models deleted (MLflow keeps them as deleted)
                    for model in dst_models.get(copy.info.run_id, []):
                        dst.delete_logged_model(model.model_id)
                    dst.delete_run(copy.info.run_id)
                    summary.replaced += 1
        plan.append((experiment, dest_id, runs, models_by_run(src, experiment.experiment_id)))
    total = sum(len(runs) for _, _, runs, _ in plan)
    bar = tqdm(total=total, unit="run", desc="copy-store", disable=not progress, mininterval=0.5)
    with bar, quiet_mlflow():
        for experiment, dest_id, runs, models in plan:
            for run in runs:
                if run.info.run_id in copier.run_map:
                    summary.skipped += 1
                else:
                    try:
                        copier.copy_run(run, dest_id, models.get(run.info.run_id, []))
                    except PipelineError:
                        raise
                    except Exception as e:
                        raise PipelineError(
                            f"{copier.where(run)} (experiment {experiment.name!r}) could not be copied to "
                            f"{dest_uri}: {type(e).__name__}: {e}. What was copied of it is tagged without "
                            f"{COPY_COMPLETE}; the next copy-store replaces it"
                        ) from e
                    summary.copied += 1
                summary.pairs.append((run.info.run_id, copier.run_map[run.info.run_id]))
                bar.update(1)
    for _, _, runs, _ in plan:
        relink_children(dst, runs, copier.run_map)
    summary.seconds = time.monotonic() - t0
    return summary


def relink_children(dst, runs: list, run_map: dict[str, str]) -> None:
    """Each copied child run's parent tag naming its parent's copy now. A parent copied again (an
    interrupted copy made anew) has a new id, and children copied before still name the old one."""
    for run in runs:
        parent = run.data.tags.get(PARENT_RUN)
        if parent in run_map and run.info.run_id in run_map:
            copy_id = run_map[run.info.run_id]
            if dst.get_run(copy_id).data.tags.get(PARENT_RUN) != run_map[parent]:
                dst.set_tag(copy_id, PARENT_RUN, run_map[parent])
