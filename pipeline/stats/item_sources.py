"""Item tables by name, and sets of them: what `./dev compare`, `./dev decide` and the sweep
ranking read.

A name is tried as, in this order (the first that matches is used; one that matches nothing stops
with one line saying what was tried):

  1. `workspace`          the working copy's reports/eval_items.parquet;
  2. a file path          an existing item-table parquet file (relative to the directory the
                          command was started in);
  3. an MLflow run id     32 hex characters, a run in the project's store (mlflow.db at the
                          repository root, or MLFLOW_TRACKING_URI): its artifact
                          evaluate/eval_items.parquet;
  4. a git revision       a branch, tag or commit (`main`, `HEAD~1`, `3f2a9c1`): the table as
                          committed there (the default run's is in git; an experiment's in DVC's
                          cache);
  5. a DVC experiment     a name from `dvc exp run -n NAME` / `dvc exp show`.

Git revisions come before experiment names as in DVC itself (`dvc metrics diff` resolves a name
the same way), so a branch and an experiment of one name mean the branch.

A side of a comparison is one name or a set of replicates (runs of one arm, pipeline/core/arm.py):
`NAME,NAME,...`, a glob of DVC experiment names of this commit, or `arm:KEY` (every evaluated model
run whose arm digest starts with KEY, or whose arm name is KEY). Each table's metadata
(item_tables.py) says its preset, arm, seed and data.
"""

from __future__ import annotations

import fnmatch
import io
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.item_tables import read_items, replicate_predictor
from pipeline.stats.metrics import METRICS, SCORE_COLUMNS, item_metrics

ITEMS_PATH = "reports/eval_items.parquet"  # in the repository (a DVC output of evaluate)
MLFLOW_ARTIFACT = "evaluate/eval_items.parquet"  # in the model's MLflow run
WORKSPACE = "workspace"
_RUN_ID = re.compile(r"[0-9a-f]{32}")


class CompareError(PipelineError):
    """A name that names no item table, or two tables that cannot be compared."""


@dataclass
class Source:
    name: str  # what the user typed
    label: str  # what the output calls it
    kind: str  # workspace | file | mlflow-run | git-revision | dvc-experiment
    description: str  # where the table came from, in words
    table: pd.DataFrame
    predictor: str = "model"
    meta: object = None  # item_tables.TableMeta; None: a table that does not say

    @property
    def seed(self) -> int | None:
        return None if self.meta is None else self.meta.seed

    @property
    def arm(self) -> str | None:
        return None if self.meta is None else self.meta.arm_digest


# --------------------------------------------------------------------------- finding a table


def load(name: str, root: Path = REPO_ROOT) -> Source:
    """The item table `name` stands for (see the module doc for the order), or CompareError."""
    root = Path(root)
    tried: list[str] = []
    if name == WORKSPACE:
        path = root / ITEMS_PATH
        if not path.is_file():
            raise CompareError(
                f"workspace: {path} does not exist; it is written by the evaluate stage "
                f"(dvc repro evaluate, or dvc exp apply NAME for an experiment's)"
            )
        table, meta = read_table(path, name)
        return Source(name, name, "workspace", f"the working copy's {ITEMS_PATH}", table, meta=meta)
    tried.append(f"not `{WORKSPACE}`")

    path = Path(name)
    if path.is_file():
        table, meta = read_table(path, name)
        return Source(name, name, "file", f"file {path}", table, meta=meta)
    tried.append("not an existing file" + (" (a directory)" if path.is_dir() else ""))

    if _RUN_ID.fullmatch(name):
        found = _from_mlflow(name, tried)
        if found is not None:
            return found
    else:
        tried.append("not an MLflow run id (32 hex characters)")

    found = _from_dvc(name, root, tried)
    if found is not None:
        return found
    raise CompareError(f"{name!r} names no item table: " + "; ".join(tried))


def read_table(source, name: str):
    """(table, metadata) of an item-table file, its bytes or a stream; CompareError if unreadable."""
    try:
        return read_items(source.getvalue() if isinstance(source, io.BytesIO) else source)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix, said in one line
        raise CompareError(f"{name}: not a readable parquet file ({type(e).__name__}: {e})") from None


def read_client():
    """(an MLflow client on the project's store, for reading; the store as shown, no password).
    No client when the store is a sqlite file that does not exist: nothing was tracked there, and
    a search must not create an empty store."""
    from pipeline.tracking import store as tracking

    uri = tracking.tracking_uri()
    shown = tracking.redact_text(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        return None, shown
    quiet_mlflow()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr holds warnings and errors only
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri), shown


def _from_mlflow(run_id: str, tried: list[str]) -> Source | None:
    from pipeline.tracking import store as tracking

    client, shown = read_client()
    if client is None:
        tried.append(f"no MLflow store at {shown} to look up run {run_id} in")
        return None
    from mlflow.exceptions import MlflowException  # (after read_client has quieted MLflow's logging)

    try:
        run = client.get_run(run_id)
    except MlflowException:
        tried.append(f"not a run in the MLflow store {shown}")
        return None
    except Exception as e:  # noqa: BLE001 - an unreachable server: say which and go on to git
        tried.append(f"not looked up in the MLflow store {shown} ({type(e).__name__}: {tracking.redact_text(str(e))})")
        return None
    run_name = run.info.run_name or ""
    found = mlflow_table(client, run_id)
    if found is None:
        raise CompareError(
            f"MLflow run {run_id} ({run_name or 'unnamed'}) has no artifact {MLFLOW_ARTIFACT}: "
            "it is logged to the model's run by the evaluate stage (an embed run, or a run "
            "evaluated before the item table existed, has none)"
        )
    table, meta = found
    label = f"{run_name} (run {run_id[:8]})" if run_name else f"run {run_id[:8]}"
    return Source(
        run_id,
        label,
        "mlflow-run",
        f"MLflow run {run_id} ({run_name or 'unnamed'}) in {shown}, artifact {MLFLOW_ARTIFACT}",
        table,
        meta=meta,
    )


def mlflow_table(client, run_id: str):
    """(table, metadata) of a run's item-table artifact; None when the run has none."""
    with tempfile.TemporaryDirectory(prefix="items-") as tmp:
        try:
            local = client.download_artifacts(run_id, MLFLOW_ARTIFACT, tmp)
        except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
            return None
        return read_table(local, run_id)


def search_runs(client, shown: str, *filters: str) -> list:
    """The runs of every experiment of the store that match one of `filters` (each run once, every
    page); CompareError when the store cannot be searched."""
    from mlflow.utils import get_results_from_paginated_fn

    from pipeline.tracking.redact import redact_text

    try:
        ids = [e.experiment_id for e in client.search_experiments()]
        pages = (lambda n, token, f=f: client.search_runs(ids, f, max_results=n, page_token=token) for f in filters)
        runs = {r.info.run_id: r for search in pages for r in get_results_from_paginated_fn(search, 1000)}
    except Exception as e:  # noqa: BLE001 - an unreachable server or a store MLflow cannot read: one line
        raise CompareError(
            f"could not search the MLflow store {shown}: {type(e).__name__}: {redact_text(str(e))}"
        ) from None
    return list(runs.values())


def _from_dvc(name: str, root: Path, tried: list[str]) -> Source | None:
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import AmbiguousExpRefInfo, resolve_name
    from scmrepo.exceptions import SCMError
    from scmrepo.noscm import NoSCM

    try:
        repo = Repo(str(root))
    except NotDvcRepoError:
        tried.append(f"not a git revision or DVC experiment ({root} is not a DVC repository)")
        return None
    with repo:
        scm = repo.scm
        if isinstance(scm, NoSCM):
            tried.append(f"not a git revision or DVC experiment ({root} is not a git repository)")
            return None
        try:
            sha, kind, what = scm.resolve_rev(name), "git-revision", f"git revision {name}"
        except SCMError:
            tried.append(f"not a git revision of {root}")
            try:
                ref = resolve_name(scm, name).get(name)
            except AmbiguousExpRefInfo:
                raise CompareError(
                    f"{name!r}: several DVC experiments have this name (on different baseline "
                    "commits); name one by its commit (dvc exp show --sha)"
                ) from None
            if ref is None:
                tried.append("not a DVC experiment there (dvc exp show lists them)")
                return None
            sha, kind, what = scm.get_ref(str(ref)), "dvc-experiment", f"DVC experiment {name}"
    return _at_rev(root, name, kind, what, sha)


def _at_rev(root: Path, name: str, kind: str, what: str, sha: str) -> Source:
    """The item table at a commit: from DVC's cache when it is a DVC output there (or from git)."""
    import dvc.api
    from dvc.exceptions import DvcException, OutputNotFoundError, PathMissingError

    what = f"{what} (commit {sha[:8]})"
    try:
        with dvc.api.open(ITEMS_PATH, repo=str(root), rev=sha, mode="rb") as f:
            raw = f.read()
    except (FileNotFoundError, DvcException) as e:
        missing = isinstance(e, (FileNotFoundError, PathMissingError, OutputNotFoundError))
        why = (
            f"{ITEMS_PATH} is not there (neither in git nor a DVC output: the evaluate stage of that commit "
            "predates the item table, or it never ran)"
            if missing
            else f"{ITEMS_PATH} could not be read from DVC's cache ({type(e).__name__}: {e}; `dvc pull` fetches a "
            "missing one from the remote)"
        )
        raise CompareError(f"{what}: {why}") from None
    table, meta = read_table(raw, what)
    return Source(name, name, kind, f"{what}, {ITEMS_PATH}", table, meta=meta)


def quiet_mlflow() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="mlflow")


# --------------------------------------------------------------------------- comparing


TRAINED_BASELINES = ("mlp",)  # baselines with replicates in the table (pipeline/evaluate/retrieval.py: TRAINED)


def baseline_replicates(sources: list[Source], name: str) -> list[Source]:
    """A trained baseline's replicates in the sources' item tables, one Source each (predictor
    `mlp.<seed>`, the baseline's arm and seed in its meta), each (arm, seed) once: the MLP of seed
    1 trained beside the model of seed 0 and beside that of seed 1 is one model."""
    from pipeline.stats.item_tables import TableMeta

    out, seen = [], set()
    for s in sources:
        found = (s.meta.baselines.get(name) if s.meta is not None else None) or None
        if found is None:
            raise CompareError(
                f"{s.label}: its item table holds no {name} replicates (written before the {name} baseline, or by "
                f"another tool): re-run the evaluate stage (dvc repro) to score it beside the model"
            )
        for seed in found["seeds"]:
            if (found["arm"], seed) in seen:
                continue
            seen.add((found["arm"], seed))
            meta = TableMeta(s.meta.preset, found["arm"], found["name"], int(seed), s.meta.data)
            out.append(
                Source(
                    s.name,
                    f"{s.label}:{replicate_predictor(name, seed)}",
                    s.kind,
                    f"{s.description}, {name} seed {seed}",
                    s.table,
                    predictor=replicate_predictor(name, seed),
                    meta=meta,
                )
            )
    return out


def pooled_replicates(tables: list[tuple[pd.DataFrame, object]], ids: list[str], name: str = "mlp") -> dict:
    """A trained baseline's replicates in (item table, TableMeta) pairs, pooled by the baseline's
    arm: {arm digest: (seeds, metric -> (replicates, items) over `ids`)}, each seed once (an MLP
    trained beside two model runs is one model). Tables whose meta names none are skipped."""
    found: dict[str, dict[int, pd.DataFrame]] = {}
    for table, meta in tables:
        b = meta.baselines.get(name) if meta is not None else None
        for s in (b or {}).get("seeds", []):
            seeds = found.setdefault(b["arm"], {})
            if s not in seeds:
                source = Source(name, replicate_predictor(name, s), "table", "", table)
                seeds[s] = predictor_table(source, replicate_predictor(name, s))
    return {d: (sorted(seeds), runs_values([seeds[s] for s in sorted(seeds)], ids)) for d, seeds in found.items()}


def predictor_table(source: Source, predictor: str = "model") -> pd.DataFrame:
    """id, input, target and the four score columns of one predictor (the model, or a baseline's
    <name>_rank... columns) of the source's table, checked."""
    df = source.table
    wanted = {c: c if predictor == "model" else f"{predictor}_{c}" for c in SCORE_COLUMNS}
    missing = [c for c in ("id", *wanted.values()) if c not in df.columns]
    if missing:
        extra = ""
        if predictor != "model":
            have = sorted(
                {
                    c[: -len("_rank")]
                    for c in df.columns
                    if c.endswith("_rank") and c != "group_rank" and not c.endswith("_group_rank")
                }
            )
            extra = f" (baselines in it: {', '.join(have) or 'none'})"
        raise CompareError(
            f"{source.label}: the item table has no column {', '.join(missing)}{extra}; expected the "
            f"evaluate stage's {ITEMS_PATH}"
        )
    out = pd.DataFrame(
        {
            "id": df["id"].astype(str),
            "input": df["input"].astype(str) if "input" in df else "",
            "target": df["target"].astype(str) if "target" in df else "",
        }
    )
    for c, col in wanted.items():
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        if not np.isfinite(values).all():
            raise CompareError(
                f"{source.label}: column {col} holds {int((~np.isfinite(values)).sum())} missing or non-finite values"
            )
        out[c] = values
    dup = out["id"][out["id"].duplicated()]
    if len(dup):
        raise CompareError(f"{source.label}: item ids are not unique ({len(dup)} repeated, e.g. {dup.iloc[0]!r})")
    return out


def _per_item(t: pd.DataFrame) -> dict[str, np.ndarray]:
    return item_metrics({c: t[c].to_numpy() for c in SCORE_COLUMNS})


def shared_ids(tables: list[pd.DataFrame]) -> list[str]:
    """The item ids every table holds, in the first table's order."""
    common = set(tables[0]["id"])
    for t in tables[1:]:
        common &= set(t["id"])
    return [i for i in tables[0]["id"] if i in common]


def runs_values(tables: list[pd.DataFrame], ids: list[str]) -> dict[str, np.ndarray]:
    """metric -> (runs, items): each predictor table's per-item values over `ids`, in that order."""
    per_run = [_per_item(t.set_index("id").loc[ids].reset_index()) for t in tables]
    return {m: np.stack([r[m] for r in per_run]) for m in METRICS}


def shared_values(groups: list[list[pd.DataFrame]]) -> tuple[list[str], list[dict[str, np.ndarray]]]:
    """The item ids every table of every group holds, and each group's runs_values over them."""
    ids = shared_ids([t for g in groups for t in g])
    return ids, [runs_values(g, ids) for g in groups]


# --------------------------------------------------------------------------- sets of runs

_GLOB = re.compile(r"[*?\[]")
ARM_PREFIX = "arm:"


@dataclass
class Side:
    """One side of a comparison: one run, or replicates of one arm (or a baseline of them)."""

    spec: str  # what the user typed
    sources: list[Source]
    predictor: str = "model"
    warnings: list[str] = field(default_factory=list)
    name: str = ""  # what the output calls it, when not the label below

    @property
    def metas(self) -> list:
        return [s.meta for s in self.sources if s.meta is not None]

    @property
    def arm_digest(self) -> str | None:
        found = {m.arm_digest for m in self.metas}
        return found.pop() if len(found) == 1 and len(self.metas) == len(self.sources) else None

    @property
    def arm_name(self) -> str | None:
        return self.metas[0].arm_name if self.arm_digest else None

    @property
    def preset(self) -> str | None:
        return self.metas[0].preset if self.arm_digest else None

    @property
    def data(self) -> str | None:
        found = {m.data for m in self.metas}
        return found.pop() if len(found) == 1 else None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        base = self.sources[0].label if len(self.sources) == 1 else (self.arm_name or self.spec)
        return base if self.predictor == "model" else f"{base}:{self.predictor}"

    def check(self, what: str) -> None:
        """Replicates must be of one arm, on one dataset, each seed once: else CompareError."""
        if len(self.sources) < 2:
            return
        arms = {s.meta.arm_digest: s.meta.arm_name for s in self.sources if s.meta is not None}
        if len(arms) > 1:
            listed = "; ".join(
                f"{name} [{d}]: " + ", ".join(s.label for s in self.sources if s.arm == d) for d, name in arms.items()
            )
            raise CompareError(
                f"{what} ({self.spec}) mixes arms, and replicates must be one arm (the same config and data, "
                f"other seeds): {listed}"
            )
        if len({m.data for m in self.metas}) > 1:
            raise CompareError(f"{what} ({self.spec}) mixes datasets: replicates must be scored on the same data")
        seen: dict[int, str] = {}
        for s in self.sources:
            if s.seed is not None and s.seed in seen:
                raise CompareError(
                    f"{what} ({self.spec}) holds seed {s.seed} twice ({seen[s.seed]} and {s.label}): one model "
                    "counted twice is not a replicate"
                )
            if s.seed is not None:
                seen[s.seed] = s.label
        if len(self.metas) < len(self.sources):
            self.warnings.append(
                f"{what}: {len(self.sources) - len(self.metas)} of its tables say nothing of their arm and seed "
                "(made by an older version): they are taken as replicates of one arm unchecked"
            )


def load_side(spec: str, root: Path = REPO_ROOT) -> Side:
    """The runs `spec` names (see the module doc): one name, NAME,NAME,..., a glob of DVC
    experiment names, or arm:KEY."""
    if spec.startswith(ARM_PREFIX):
        return _arm_side(spec, spec[len(ARM_PREFIX) :])
    sources, seen = [], set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        found = _glob(part, Path(root)) if _GLOB.search(part) and not Path(part).exists() else [load(part, root)]
        for s in found:
            key = (s.kind, s.description)
            if key not in seen:
                seen.add(key)
                sources.append(s)
    if not sources:
        raise CompareError(f"{spec!r} names no item table")
    return Side(spec, sources)


def _glob(pattern: str, root: Path) -> list[Source]:
    """The DVC experiments made from this commit whose names match `pattern`."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import exp_refs_by_rev

    try:
        repo = Repo(str(root))
    except NotDvcRepoError:
        raise CompareError(f"{pattern!r}: a pattern of DVC experiment names, but {root} is no DVC repository") from None
    with repo:
        head = repo.scm.get_rev()
        refs = sorted((r for r in exp_refs_by_rev(repo.scm, head) if fnmatch.fnmatchcase(r.name, pattern)), key=str)
        shas = [(r.name, repo.scm.get_ref(str(r))) for r in refs]
    if not shas:
        raise CompareError(
            f"{pattern!r} matches no DVC experiment made from this commit ({head[:8]}; `dvc exp show` lists them)"
        )
    return [_at_rev(root, name, "dvc-experiment", f"DVC experiment {name}", sha) for name, sha in shas]


def _arm_side(spec: str, key: str) -> Side:
    """Every evaluated model run of the MLflow store whose arm digest starts with `key` or whose
    arm name is `key`."""
    if not key:
        raise CompareError(f"{spec!r}: give an arm's digest (or its start) or its name after 'arm:'")
    client, shown = read_client()
    if client is None:
        raise CompareError(f"{spec}: no MLflow store at {shown} to look for the arm in")
    safe = key.replace("'", "''")
    filters = (f"tags.`arm.digest` LIKE '{safe}%'", f"tags.arm LIKE '{safe} [%'")
    try:
        runs = search_runs(client, shown, *(f"{f} and tags.stage = 'train'" for f in filters))
    except CompareError as e:
        raise CompareError(f"{spec}: {e}") from None
    if not runs:
        raise CompareError(
            f"{spec}: no model run in the MLflow store {shown} has an arm whose digest starts with {key!r} or "
            "whose name is it (the runs table's `arm` tag shows them)"
        )
    side = Side(spec, [])
    latest: dict[str, object] = {}  # one run per seed: a seed trained twice is one model, the latest counts
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        latest[run.data.params.get("run.seed", run.info.run_id)] = run
    if len(latest) < len(runs):
        side.warnings.append(
            f"{spec}: {len(runs) - len(latest)} run(s) repeat a seed of another: the latest run of each seed is used"
        )
    for seed, run in sorted(latest.items(), key=lambda kv: str(kv[0]).zfill(12)):
        try:
            found = _from_mlflow(run.info.run_id, [])
        except CompareError as e:
            side.warnings.append(f"{spec}: run {run.info.run_id[:8]} (seed {seed}) left out: {e}")
            continue
        if found is not None:
            side.sources.append(found)
    if not side.sources:
        raise CompareError(f"{spec}: none of its {len(runs)} model runs has an item table: " + "; ".join(side.warnings))
    return side
