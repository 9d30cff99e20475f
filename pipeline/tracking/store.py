"""MLflow tracking: where the store is, the runs a stage starts or adds to, and what it logs there.
(What a run is tagged with about its source: provenance.py; datasets as run inputs: datasets.py.)

Default store: `sqlite:///<project root>/mlflow.db`, artifacts in `<project root>/mlruns`, where
the project root is the repository the user works in. `dvc exp run --temp` / `--queue` run stages
in a copy under `<root>/.dvc/tmp/exps/...` that DVC deletes afterwards; we resolve the root out of
that copy (DVC_ROOT, or the path), so those runs and their artifacts land in the same store.
`MLFLOW_TRACKING_URI` overrides everything (a shared server).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from filelock import FileLock

from pipeline.core.atomic import write_json
from pipeline.core.errors import PipelineError, TrackingUnavailable
from pipeline.core.paths import REPO_ROOT
from pipeline.tracking.provenance import DIFF_ARTIFACT, provenance
from pipeline.tracking.redact import redact_params, redact_text
from pipeline.tracking.relocate import relocate
from pipeline.tracking.store_check import mlflow_env_problem, store_problem

log = logging.getLogger(__name__)

# The MLflow run each stage made, for the stages after it (evaluate and report add to train's run):
# runs/<stage>.json, beside the outputs and not in them. A DVC output must hold nothing
# run-specific, or two identical runs would never give identical hashes in dvc.lock.
# ENERGY_FLOW_RUNS_DIR moves it (the tests' stage processes use it, to leave the project's alone).
RUNS_DIR = Path(os.environ.get("ENERGY_FLOW_RUNS_DIR") or REPO_ROOT / "runs")
SOURCE_NAME = "mlflow.source.name"
# The experiment's kind: MLflow 3 tells GenAI experiments (traces) from model training with it.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# Embed runs have an experiment of their own, `<run.experiment>-embed`: one embed run feeds many
# model runs, and in the model experiment it would be a row with none of the model's columns
# (no eval metrics, no stability verdict) between the rows a researcher compares.
EMBED_EXPERIMENT_SUFFIX = "-embed"


def project_root(start: Path = REPO_ROOT) -> Path:
    """The user's repository, also when running inside a DVC temp-experiment copy. DVC sets
    DVC_ROOT for every stage it runs (to the user's repository for --temp / --queue runs); the
    `.dvc/tmp/exps` path is the fallback for a stage started by hand inside such a copy."""
    dvc_root = os.environ.get("DVC_ROOT")
    if dvc_root and start == REPO_ROOT:
        return Path(dvc_root).resolve()
    parts = start.resolve().parts
    for i in range(len(parts) - 2):
        if parts[i] == ".dvc" and parts[i + 1] == "tmp" and parts[i + 2] == "exps":
            return Path(*parts[:i])
    return start.resolve()


def project_store_uri() -> str:
    """The project's own store, used when MLFLOW_TRACKING_URI is unset: mlflow.db in the project."""
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or project_store_uri()


# What runs/<stage>.json records as the store of its run (`store`): the project's own mlflow.db is
# PROJECT_STORE, not its path, because a checkout copied (`cp -a`) or moved takes mlflow.db and
# mlruns/ along and is the same store in its new folder; any other store is its URI, redacted.
PROJECT_STORE = "project"
# On every run (and logged model) `./dev team copy-store` copies: the id of the run it is a copy
# of. A run file naming a run of another store finds the run's copy in this one by it.
COPIED_FROM = "energy_flow.copied_from"


def store_key(uri: str | None = None) -> str:
    """How a run file names the store at `uri` (default: the one in use)."""
    uri = tracking_uri() if uri is None else uri
    return PROJECT_STORE if uri == project_store_uri() else redact_text(uri)


def recorded_store(info: dict) -> str:
    """The store a run file's run is in: its `store`, or, in a file written before there was one,
    its tracking URI (the project's store only where that is this folder's mlflow.db)."""
    if isinstance(info.get("store"), str) and info["store"]:
        return info["store"]
    return store_key(str(info.get("tracking_uri") or ""))


def pending_dir() -> Path:
    """Where metric values the store refused wait to be replayed (pipeline/tracking/metric_buffer.py): in
    the project, beside the store, so a --temp experiment's copy can go without losing them."""
    return project_root() / ".mlflow-pending"


@dataclass
class TrackingSession:
    """How one stage tracks, owned by the stage (stages/_cli.py opens one around each stage with
    `active(TrackingSession())`); the functions of this module act on the session that is active."""

    # Off with run.tracking=disabled, or =optional and a server that does not answer: every
    # function here is then a no-op, and runs have no id ("").
    enabled: bool = True
    sweep: str = ""  # run.sweep of the stage ("" = none), tagged on every run it starts or adds to
    adding_to: str = ""  # the run the stage adds to (adding_to_run), while it does: all logging goes there
    killed_runs: list[str] = field(default_factory=list)  # ended KILLED (stages/_cli.py says so on a signal)


# Which session is active. A context variable, not a module global: `active` scopes a session to
# a `with` block and restores the one before it, so stages run one after another in one process
# (as the tests run them) never see each other's switch, sweep or runs. Code that opens no session
# (a notebook, a tool) gets a default one for its context on first use, as decimal.getcontext() does.
_ACTIVE: ContextVar[TrackingSession] = ContextVar("energy_flow_tracking_session")


def session() -> TrackingSession:
    """The active tracking session (a default one, tracking on, where none was opened)."""
    try:
        return _ACTIVE.get()
    except LookupError:
        _ACTIVE.set(opened := TrackingSession())
        return opened


@contextlib.contextmanager
def active(tracking_session: TrackingSession) -> Iterator[TrackingSession]:
    """Make `tracking_session` the active one for the `with` block."""
    token = _ACTIVE.set(tracking_session)
    try:
        yield tracking_session
    finally:
        _ACTIVE.reset(token)


# A server that answers at all answers /health within this; one that does not is unreachable.
# MLflow's own client would retry 7 times with back-off (about 4 minutes, by its own estimate).
PROBE_TIMEOUT_S = 5.0


def enabled() -> bool:
    return session().enabled


SWEEP_TAG = "sweep"  # the sweep that started a run: the MLflow UI's filter tags.sweep = 'NAME'
SWEEP_MEMBER_PREFIX = "sweep."  # sweep.NAME = the DVC experiment: every model run a sweep has


def set_sweep(name: str) -> None:
    """Set run.sweep for the active session: every run it starts or adds to joins the sweep."""
    session().sweep = name or ""


def sweep_tags(existing: dict | None = None) -> dict[str, str]:
    """The tags that put a run into this process's sweep (run.sweep), {} outside one.

    `sweep.NAME` = the DVC experiment's name marks membership; `./dev compare --sweep NAME`
    searches by it. A run can be in several sweeps: when a combination's train stage is already
    in dvc.lock or DVC's run cache (the sweep `train.lr=1e-3,3e-3,1e-2` holds the default 3e-3),
    DVC restores the model instead of training it, and only the report stage (always run) adds
    to that earlier run; one `sweep` tag would have to move it out of the sweep that made it.
    `sweep` = NAME is set too where the run has none yet (`existing`: its tags; None: a new run),
    so the UI's tags.sweep = 'NAME' lists the sweep's runs as well."""
    sweep = session().sweep
    if not sweep:
        return {}
    tags = {f"{SWEEP_MEMBER_PREFIX}{sweep}": os.environ.get("DVC_EXP_NAME") or "workspace"}
    if not (existing or {}).get(SWEEP_TAG):
        tags[SWEEP_TAG] = sweep
    return tags


def unreachable_reason(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the tracking server at `uri` cannot be reached (None: it answered, or the store is a
    local one). Any HTTP answer counts as reachable: a 401 or 404 is the server's to explain."""
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


def configure(mode: str) -> None:
    """Apply run.tracking to the active session, before any work. required: a tracking server that does
    not answer stops the stage now, naming it (not after minutes of MLflow retries, and not after
    the stage has written outputs it then cannot log); optional: it turns tracking off, with a
    warning; disabled: no tracking at all."""
    current = session()
    current.enabled = mode != "disabled"
    if mode == "disabled":
        return
    uri = tracking_uri()
    shown = redact_text(uri)
    problem = store_problem(uri)
    scheme = f"MLFLOW_TRACKING_URI = {shown}: {problem}" if problem else mlflow_env_problem()
    if scheme:
        if mode == "optional":
            current.enabled = False
            log.warning("%s. Tracking is OFF for this stage (run.tracking=optional)", scheme)
            return
        raise TrackingUnavailable(
            f"{scheme}. Fix or unset it (with no MLFLOW_TRACKING_URI the project's mlflow.db is used), "
            "or set run.tracking=disabled"
        )
    reason = unreachable_reason(uri)
    if reason is None:
        return
    if mode == "optional":
        current.enabled = False
        log.warning(
            "the MLflow tracking server %s is unreachable (%s): tracking is OFF for this stage "
            "(run.tracking=optional); nothing of it will be in MLflow",
            shown,
            reason,
        )
        return
    raise TrackingUnavailable(
        f"the MLflow tracking server {shown} (MLFLOW_TRACKING_URI) is unreachable: {reason}. Start it, point "
        "MLFLOW_TRACKING_URI at one that runs (unset, the project's mlflow.db is used), or set "
        "run.tracking=optional (track when it answers) or run.tracking=disabled"
    )


def use_store() -> str:
    """Point MLflow at tracking_uri() and return it. A SQLite store is first opened under an
    exclusive file lock, released when the process ends however it ends: MLflow creates a
    missing store's tables, and upgrades an old one's, with Alembic migrations that are not safe
    to run twice at once. `dvc queue start -j 2` on a project without mlflow.db started two embed
    stages together, and one failed with Alembic's "Online migration expected to match one row
    when updating ... 0 found"; under the lock the second finds the tables complete and skips
    them. Every first access of a stage process to the store goes through here."""
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        _open_sqlite_store(uri)
    return uri


@functools.cache  # once per store and process: the tables, once complete, stay complete
def _open_sqlite_store(uri: str) -> None:
    import mlflow

    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    # Beside the store, so every process opening it waits on one lock; removed while held (a waiter
    # then takes the file at the path), so nothing is left in the store's directory, maybe anyone's.
    with (lock := FileLock(db.parent / f".{db.name}.lock")):
        mlflow.search_experiments(max_results=1)  # opens the store: creates or upgrades its tables
        relocate(db)  # a store copied or moved with its folder: its artifacts are beside it now
        with contextlib.suppress(OSError):
            os.unlink(lock.lock_file)


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts. A SQLite store's default is `./mlruns` under
    the *current directory*, which for a first run from `dvc exp run --temp` is DVC's temporary
    copy, deleted when the run ends; we put them next to the database instead. A server decides
    for itself (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).resolve().parent / "mlruns").as_uri()
    return None


def run_name(cfg) -> str:
    """What the UI lists a run as: under `dvc exp run`, the experiment's name (so `dvc exp show`
    and MLflow's runs line up by name); otherwise the preset and what differs from it
    (`default`, `default lr=0.001`; pipeline/core/run_label.py). The stage is the tag `stage`,
    and embed runs have an experiment of their own, so the name need not say it."""
    from pipeline.core.run_label import run_label

    return os.environ.get("DVC_EXP_NAME") or run_label(cfg)


def overrides_tag(cfg) -> dict[str, str]:
    """`run.overrides`: the preset, the fault and every difference from them, in full (the name
    may be cut), as the Hydra overrides that compose the run again: `preset=smoke fault=nan_loss
    train.epochs=3`. Always set, so the runs table's column is never empty."""
    from pipeline.core.run_label import hydra_overrides

    return {"run.overrides": hydra_overrides(cfg)[:5000]}


def embed_experiment(experiment: str) -> str:
    return experiment + EMBED_EXPERIMENT_SUFFIX


def _set_experiment(name: str, models: bool = False) -> None:
    """Make `name` the active experiment, creating it if needed, of the model-training kind;
    `models`: the model experiment, whose runs table gets the saved view (views.py)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    found = mlflow.get_experiment_by_name(name)
    if found is None:
        with contextlib.suppress(MlflowException):  # a parallel queue worker made it first
            mlflow.create_experiment(name, artifact_location=artifact_location(tracking_uri()), tags=EXPERIMENT_KIND)
        found = mlflow.get_experiment_by_name(name)
    tag_experiment(mlflow.MlflowClient(), found, models)
    mlflow.set_experiment(name)


def tag_experiment(client, experiment, models: bool) -> None:
    """Give an experiment its kind, and the model experiment its saved view (views.py), where a
    store from before them lacks them or holds an older view; nothing is written otherwise."""
    from pipeline.tracking.views import ensure_view

    for key, value in EXPERIMENT_KIND.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    if models:
        ensure_view(client, experiment.experiment_id, experiment.tags)


@contextlib.contextmanager
def mlflow_run(
    run_name: str,
    preset: str,
    experiment: str = "energy-flow",
    run_id: str | None = None,
    tags: dict | None = None,
    stage: str = "",
) -> Iterator[Any]:
    """Start (or, with run_id, resume: the train stage from its checkpoint) a run; end it
    FINISHED, FAILED or KILLED on every path (_outcome), after the asynchronous metric queue is
    flushed: MLflow's end_run does not wait for it, so a run could read FINISHED with its last
    metrics still in flight. A stage that adds to another stage's run uses adding_to_run instead.

    With tracking off it yields a stand-in whose run id is "". A run_id of "" (a model trained
    with tracking off) starts a new run."""
    if not enabled():
        yield _NO_RUN
        return
    import mlflow
    from mlflow.environment_variables import MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS

    use_store()
    # MLflow's queue thread waits for work with a 1 s timeout unless it buffers: the flush at the
    # end then waits out that timeout (0-1 s a run). Buffering for 1 s, the thread waits on an
    # event the flush sets, and the flush returns as soon as the values are stored.
    if not MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS.defined:
        MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS.set(1)
    if not run_id:
        _set_experiment(experiment, models=stage != "embed")
        prov, diff = provenance(preset)
        if stage:
            prov[SOURCE_NAME] = f"stages/{stage}.py"  # not the absolute path of a --temp copy
        # Off here even if MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING is set: train's metric buffer samples
        # them (pipeline.tracking.metric_buffer), and a second sampler would log each metric twice.
        # The tags go in with the start: they override MLflow's own git context, which under
        # --temp would name DVC's stash commit.
        run = mlflow.start_run(
            run_name=run_name, log_system_metrics=False, tags={**prov, **sweep_tags(), **(tags or {})}
        )
        if diff:
            mlflow.log_text(diff, DIFF_ARTIFACT)
    else:
        found = mlflow.get_run(run_id) if session().sweep else None
        run = mlflow.start_run(run_id=run_id, log_system_metrics=False)
        tags = {**(sweep_tags(found.data.tags) if found else {}), **(tags or {})}
        if tags:
            mlflow.set_tags(tags)

    def end(status: str) -> None:
        try:
            mlflow.flush_async_logging()
        finally:
            mlflow.end_run(status=status)
            if status == "KILLED":
                session().killed_runs.append(run.info.run_id)

    with _outcome(end):
        yield run


@contextlib.contextmanager
def _outcome(finish) -> Iterator[None]:
    """Run the body, then `finish(status)`: FINISHED, KILLED (Ctrl-C, and SIGTERM, which
    stages/_cli.py turns into errors.Terminated) or FAILED (any other exception), re-raised."""
    status = "FINISHED"
    try:
        yield
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        finish(status)


def stage_status_tag(stage: str) -> str:
    return f"stage.{stage}.status"


@contextlib.contextmanager
def adding_to_run(run_id: str, stage: str, tags: dict | None = None) -> Iterator[Any]:
    """Add a stage's results to another stage's run (evaluate and report add to the model's run)
    without re-opening it: the run keeps the status its own stage gave it (the model trained,
    or the run diverged, whatever happens after), also when this stage is killed outright.
    This stage's own outcome is the tag `stage.<stage>.status`: RUNNING while it works, then
    FINISHED, FAILED or KILLED. Yields the run (a stand-in with run id "" when tracking is off
    or there is no run)."""
    if not enabled() or not run_id:
        yield _NO_RUN
        return
    import mlflow

    use_store()
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    _log_tags(client, run_id, {**sweep_tags(run.data.tags), **(tags or {}), stage_status_tag(stage): "RUNNING"})
    # A model logged to the run (evaluate's) belongs to the run's experiment: MLflow puts it in
    # the active experiment, which is otherwise "Default".
    mlflow.set_experiment(experiment_id=run.info.experiment_id)

    def end(status: str) -> None:
        try:
            mlflow.flush_async_logging()
        finally:
            client.set_tag(run_id, stage_status_tag(stage), status)

    # The stage's session, adding to run_id for the block: killed runs and the sweep stay its own.
    with active(replace(session(), adding_to=run_id)), _outcome(end):
        yield run


def current_run_id() -> str:
    """The run this process logs to: the one a stage adds to (adding_to_run), else the active
    run's, else ""."""
    current = session()
    if current.adding_to or not current.enabled:
        return current.adding_to
    import mlflow

    active = mlflow.active_run()
    return active.info.run_id if active else ""


def _log_tags(client, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    if tags:
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


_NO_RUN = SimpleNamespace(info=SimpleNamespace(run_id="", experiment_id="", run_name=""))


def run_exists(run_id: str) -> bool:
    """Whether the store at tracking_uri() holds this run (a checkpoint may come from another store)."""
    if not enabled() or not run_id:
        return False
    import mlflow
    from mlflow.exceptions import MlflowException

    use_store()
    try:
        mlflow.get_run(run_id)
    except MlflowException:
        return False
    return True


def set_tags(tags: dict[str, str]) -> None:
    if not enabled():
        return
    import mlflow

    adding_to = session().adding_to
    if adding_to:
        _log_tags(mlflow.MlflowClient(), adding_to, tags)
    else:
        mlflow.set_tags(tags)


def log_metrics(
    metrics: dict[str, float], step: int | None = None, model_id: str | None = None, dataset: Any = None
) -> None:
    """One batched, asynchronous call per log boundary (never one call per metric). The keys are
    the files' (metrics/*.json, the telemetry): metric_names.route gives their MLflow names, and
    turns constants and the headline intervals into tags. `model_id` (MLflow 3's logged model):
    the values also show on that model's page; `dataset` (an MLflow dataset, e.g.
    shards_dataset's): the data they were measured on."""
    if not enabled():
        return
    import mlflow

    from pipeline.tracking.metric_names import route

    clean, tags = route(metrics)
    if tags:
        set_tags(tags)
    if clean:
        mlflow.log_metrics(
            clean,
            step=step,
            synchronous=False,
            run_id=session().adding_to or None,
            model_id=model_id or None,
            dataset=dataset,
        )


def log_params(params: dict[str, Any]) -> None:
    if not enabled():
        return
    import mlflow

    # MLflow caps a param value at 6000 characters and a batch at 100 params. Secrets are replaced
    # first (pipeline/tracking/redact.py): a param is kept forever and shown to everyone with the UI.
    items = [(k, v[:6000]) for k, v in redact_params(params).items()]
    for i in range(0, len(items), 100):
        mlflow.log_params(dict(items[i : i + 100]), run_id=session().adding_to or None)


def run_file(stage: str) -> Path:
    return RUNS_DIR / f"{stage}.json"


def write_run_file(stage: str, info: dict, tx=None) -> None:
    """`info`: run_id, experiment_id, tracking_uri and the digest of what the run made (e.g.
    model_sha256), so a reader can tell whether the output in the workspace is still that run's.
    `tx`: the stage's output transaction, which puts the file in place with its other outputs.

    The file points to the last *tracked* run: a run with tracking off (run.tracking=disabled, or
    optional with no server) has no run to point to, and leaves the file as it is (the readers
    then find the tracked run of the model at hand by its digest, or say there is none)."""
    if not info.get("run_id"):
        kept = "still names the last tracked" if run_file(stage).is_file() else "is not written: there is no tracked"
        log.info("tracking is off: %s %s %s run", run_file(stage), kept, stage)
        return
    dest = run_file(stage) if tx is None else tx.path(run_file(stage))
    info = {**info, "store": store_key()}
    # Shown to anyone with the working copy: no password of a tracking URI in it.
    write_json(dest, {k: redact_text(v) if isinstance(v, str) else v for k, v in info.items()})


def read_run_file(
    stage: str, output: Path | None = None, digest_key: str = "model_sha256", required: bool = True
) -> dict:
    """The run `stage` made. With `output` (the file the run made), the run must be the one that
    made this very file: after `dvc checkout` or `dvc exp apply` of another experiment the file
    in runs/ still names the last run here, and a `dvc exp run --temp/--queue` copy has no runs/
    at all (it is not in git), so the run is then looked up in MLflow by the file's digest (a tag
    its run carries). `required=False`: {} when no run is found, instead of an error."""
    from pipeline.core.stage_outputs import read_json
    from pipeline.data.shards import sha256_file

    path = run_file(stage)
    if not path.is_file():
        if output is not None and enabled():
            digest = sha256_file(output)
            found = find_run_by_tag(f"{stage}.{digest_key}", digest)
            if found:
                return {"run_id": found, digest_key: digest}
        if not required:
            return {}
    info = read_json(path, stage)
    if not isinstance(info.get("run_id"), str):
        raise PipelineError(
            f"{path}: holds no run_id; it is written by the {stage} stage: run it again (dvc repro {stage})"
        )
    if enabled() and info["run_id"] and recorded_store(info) != store_key():
        info = _run_in_this_store(stage, path, info, output, digest_key, required)
        if not info:
            return {}
    if output is None or not info.get(digest_key):
        return info
    digest = sha256_file(output)
    if info[digest_key] == digest:
        return info
    found = find_run_by_tag(f"{stage}.{digest_key}", digest) if enabled() else None
    if found:
        return {**info, "run_id": found, digest_key: digest}
    if not required:
        return {}
    raise PipelineError(
        f"{output} (sha256 {digest[:12]}) is not the file the last {stage} run here made ({path} "
        f"names run {info['run_id']}, whose file had sha256 {str(info[digest_key])[:12]}), and no "
        f"run in the tracking store carries its digest: run the {stage} stage again "
        f"(dvc repro -f {stage})"
    )


def _run_in_this_store(
    stage: str, path: Path, info: dict, output: Path | None, digest_key: str, required: bool
) -> dict:
    """`path` names a run of another store than the one in use (the checkout moved onto the team
    server, or back): the run itself where this store has it too (a copy of the whole store keeps
    run ids), else its copy (`./dev team copy-store` tags it COPIED_FROM), else the run that made
    `output` (by its digest tag); none of these: an error saying what to run, before any work."""
    from pipeline.data.shards import sha256_file

    here = {"store": store_key(), "tracking_uri": redact_text(tracking_uri())}
    if run_exists(info["run_id"]):
        return {**info, **here}
    copy = find_run_by_tag(COPIED_FROM, info["run_id"])
    if copy:
        return {**info, **here, "run_id": copy}
    if output is not None and output.is_file():
        digest = sha256_file(output)
        found = find_run_by_tag(f"{stage}.{digest_key}", digest)
        if found:
            return {**info, **here, "run_id": found, digest_key: digest}
    if not required:
        return {}
    where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the project's own, mlflow.db"
    old = info.get("tracking_uri") or "(not recorded)"
    raise PipelineError(
        f"{path} names MLflow run {info['run_id']} of the tracking store {old}, "
        f"but the store in use is {here['tracking_uri']} ({where}), which holds neither that run nor a copy of it. "
        "Copy the runs of the old store into this one (`./dev team copy-store` for the team server; docs/team.md), "
        f"or make the {stage} stage's run here again (`dvc repro -f {stage}`), or go back to the old store "
        "(MLFLOW_TRACKING_URI)"
    )


def find_run_by_tag(key: str, value: str) -> str | None:
    """The newest run of any experiment whose tag `key` is `value`, or None."""
    import mlflow

    use_store()  # called before any run of this process has set it
    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=f"tags.`{key}` = '{value}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return runs[0].info.run_id if runs else None


def download_run_files(run_id: str, artifact_dir: str, names: list[str], dest: Path) -> bool:
    """Download the artifacts `artifact_dir`/NAME of run `run_id` into `dest` (as dest/NAME);
    False, downloading nothing more, when tracking is off or the run lacks one of them. A store
    that cannot be read raises, as any other request to it does."""
    if not enabled() or not run_id:
        return False
    import mlflow

    use_store()
    client = mlflow.MlflowClient()
    have = {Path(f.path).name for f in client.list_artifacts(run_id, artifact_dir)}
    if not set(names) <= have:
        return False
    for name in names:
        got = Path(client.download_artifacts(run_id, f"{artifact_dir}/{name}", str(dest)))
        if got != dest / name:  # where MLflow put it depends on the artifact repository
            got.replace(dest / name)
    return True


def log_artifact_file(path: Path, artifact_path: str | None = None) -> None:
    if not enabled():
        return
    import mlflow

    mlflow.log_artifact(str(path), artifact_path=artifact_path, run_id=session().adding_to or None)


def log_dict(values: dict, artifact_file: str) -> None:
    """`values` as a JSON artifact of the run this process logs to."""
    if not enabled():
        return
    import mlflow

    mlflow.log_dict(values, artifact_file, run_id=session().adding_to or None)
