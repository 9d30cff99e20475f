"""Replicates through DVC's experiment queue: train seeds of one or more arms, wait, read the results.

A replicate is one DVC experiment of an arm with its own `run.seed` (pipeline/core/arm.py), for
`./dev seeds` (one arm's seed variance) and `./dev decide` (seed pairs of two arms). `plan` names
each `rep-<arm id>-s<seed>`, so an experiment of that name already made from this commit is read
back instead of trained again; `Queue` runs the others (`dvc queue start -j N`, each in a copy
under .dvc/tmp/exps logging to the project's store) and stops what it started on every exit path;
`collect` reads an experiment's item table and training curve from its commit, as `./dev compare`
does; `run_replicates` puts them together.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd

from pipeline.core.arm import arm_digest
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.item_sources import ITEMS_PATH, Source, predictor_table, shared_values
from pipeline.stats.item_tables import read_items
from pipeline.stats.seed_variance import Reference, measure

STEPS = "telemetry/train_steps.csv"
STABILITY = "metrics/stability.json"  # the report stage's checks: "pass" per check
POLL_S = 2.0
REF_WAIT_S = 60.0  # how long a finished experiment's ref may take to appear (finished_rev)
WORKER_GRACE_S = 15.0  # a worker may take this long to start and pick a task
MAX_RESTARTS = 3
DONE = ("Success", "Failed")


class ReplicateError(PipelineError):
    """A replicate that could not be queued, failed, or left nothing to read."""


@dataclass(frozen=True)
class Replicate:
    name: str  # the DVC experiment's name
    arm: str  # which arm of the plan it belongs to, as the caller labels it ("A", "B", "default")
    seed: int
    overrides: tuple[str, ...]  # Hydra overrides (`-S`), the seed not among them

    def sets(self) -> list[str]:
        return [*self.overrides, f"run.seed={self.seed}"]


@dataclass
class Result:
    replicate: Replicate
    items: pd.DataFrame
    meta: object  # item_tables.TableMeta, or None for a table without it
    steps: pd.DataFrame | None  # the training curve (telemetry/train_steps.csv), if it was kept
    rev: str  # the experiment's commit
    failed_checks: list[str] | None = None  # stability checks that did not pass (None: no stability file)

    def source(self):
        """The item table as item_sources reads any other (for predictor_table and the rest)."""
        name = self.replicate.name
        return Source(
            name, name, "dvc-experiment", f"DVC experiment {name} (commit {self.rev[:8]})", self.items, meta=self.meta
        )


def config_digest(overrides: Sequence[str]) -> str:
    """The arm digest of a config composed from conf/ with `overrides`, data left out: what names
    an arm before its data exists (a fresh clone has no shards until the first embed)."""
    from pipeline.core.config import flatten, load_config

    return arm_digest(flatten(load_config(list(overrides))), data="")


def arm_id(overrides: Sequence[str]) -> str:
    """The hex id that names the arm of a config composed with `overrides` in experiment names:
    the arm digest its runs' item tables and MLflow tags will carry (pipeline/core/arm.py), taken
    on the data of the preset's committed seed-variance reference (the data a preset's runs are
    scored on; a fresh clone has no shards to read it from before the first embed). For a preset
    without a reference, the digest with the data left out: it cannot know the data yet."""
    from pipeline.core.config import flatten, load_config
    from pipeline.stats.seed_variance import load_references

    flat = flatten(load_config(list(overrides)))
    ref = next((r for r in load_references() if r.preset == flat.get("run.preset")), None)
    return arm_digest(flat, data=ref.data if ref is not None else "")


def plan(prefix: str, arm: str, overrides: Sequence[str], seeds: Iterable[int]) -> list[Replicate]:
    digest = arm_id(overrides)
    return [Replicate(f"{prefix}-{digest}-s{s}", arm, int(s), tuple(overrides)) for s in seeds]


def _dvc(*args: str) -> list[str]:
    return [sys.executable, "-m", "dvc", *args]


def _run(cmd: list[str], root: Path, timeout: float = 600) -> str:
    """A dvc command's output, or ReplicateError. Output goes through a file, not a pipe: `dvc
    queue start` leaves workers behind that inherit its output, and a pipe would stay open (and
    this call blocked) until they exit."""
    with tempfile.TemporaryFile(mode="w+") as out:
        try:
            proc = subprocess.run(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ReplicateError(f"`{' '.join(cmd[2:])}` did not finish in {timeout:.0f} s") from None
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise ReplicateError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}): {text.strip()[-2000:]}")
    return text


def head(root: Path) -> str:
    """The commit experiments queued now are based on (HEAD)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return repo.scm.get_rev()


def experiment_rev(root: Path, name: str, baseline: str | None = None) -> str | None:
    """The commit of the experiment `name` made from `baseline` (default: HEAD), or None."""
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import exp_refs_by_names

    with Repo(str(root)) as repo:
        base = baseline or repo.scm.get_rev()
        refs = exp_refs_by_names(repo.scm, {name}).get(name, [])
        ref = next((r for r in refs if r.baseline_sha == base), None)
        return repo.scm.get_ref(str(ref)) if ref is not None else None


def finished_rev(root: Path, name: str, baseline: str, wait_s: float = REF_WAIT_S) -> str | None:
    """The commit of a just-finished experiment: the queue can say "Success" a moment before the
    experiment's ref is in the repository (seen with one experiment in the queue), so look again
    for up to `wait_s` seconds. None if it never comes (collect then says so)."""
    deadline = time.monotonic() + wait_s
    while True:
        rev = experiment_rev(root, name, baseline)
        if rev is not None or time.monotonic() > deadline:
            return rev
        time.sleep(POLL_S)


def read_at_rev(root: Path, rev: str, path: str) -> bytes | None:
    """A file as committed at `rev` (from git, or DVC's cache for an output), None if absent."""
    import dvc.api
    from dvc.exceptions import DvcException

    try:
        with dvc.api.open(path, repo=str(root), rev=rev, mode="rb") as f:
            return f.read()
    except (FileNotFoundError, DvcException):
        return None


def collect(root: Path, rep: Replicate, rev: str | None = None, baseline: str | None = None) -> Result:
    """What the experiment of `rep` (made from `baseline`, default HEAD) made: its item table (with
    metadata) and training curve."""
    rev = rev or experiment_rev(root, rep.name, baseline)
    if rev is None:
        raise ReplicateError(f"{rep.name}: no such DVC experiment made from this commit (dvc exp show lists them)")
    raw = read_at_rev(root, rev, ITEMS_PATH)
    if raw is None:
        raise ReplicateError(
            f"{rep.name} (commit {rev[:8]}): no {ITEMS_PATH}: the experiment did not reach the evaluate stage "
            f"(dvc queue logs {rep.name} shows why)"
        )
    items, meta = read_items(raw)
    steps_raw = read_at_rev(root, rev, STEPS)
    steps = pd.read_csv(io.BytesIO(steps_raw)) if steps_raw else None
    return Result(rep, items, meta, steps, rev, failed_checks(read_at_rev(root, rev, STABILITY)))


def failed_checks(raw: bytes | None) -> list[str] | None:
    """The names of the stability checks whose "pass" is false in a metrics/stability.json (None
    when there is no such file or it cannot be read: nothing is known)."""
    import json

    if raw is None:
        return None
    try:
        checks = json.loads(raw)
    except ValueError:
        return None
    return sorted(k for k, v in checks.items() if isinstance(v, dict) and v.get("pass") is False)


class Queue:
    """DVC's experiment queue for a set of replicates; a context manager that stops what it
    started (and kills its running experiments when left by an error or Ctrl-C)."""

    def __init__(self, root: Path = REPO_ROOT, jobs: int = 1, log: Callable[[str], None] = print):
        self.root, self.jobs, self.log = Path(root), int(jobs), log
        self._queued: list[str] = []
        self._started = False

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, kind, value, tb) -> None:
        running = [n for n, s in self.status(self._queued).items() if s not in DONE] if self._queued else []
        if kind is not None and running:
            self.log(f"stopping: killing {len(running)} queued or running experiment(s): {', '.join(running)}")
            for cmd in (("queue", "kill", "--force", *running), ("queue", "remove", *running)):
                subprocess.run(_dvc(*cmd), cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Only to live workers: DVC's broker keeps a stop that no worker took, and the next worker
        # started (by the next command) would take it and quit after its first experiment.
        if self._started and self.workers():
            subprocess.run(
                _dvc("queue", "stop"), cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300
            )

    def workers(self) -> int:
        from dvc.repo import Repo

        with Repo(str(self.root)) as repo:
            return len(repo.experiments.celery_queue.worker_status())

    def untracked(self) -> list[str]:
        """Files git does not track and does not ignore: a queued experiment runs on a copy made
        from git (commit and uncommitted changes of tracked files), so it does not see them."""
        proc = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard"], cwd=self.root, capture_output=True, text=True
        )
        return [f for f in proc.stdout.splitlines() if f]

    def submit(self, reps: Sequence[Replicate], replace: Sequence[str] = ()) -> None:
        """Queue each replicate and start the workers once. `replace`: names of experiments that
        exist but left nothing to read (DVC refuses a name in use without --force, which also
        re-runs every stage)."""
        missing = self.untracked()
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            self.log(
                f"warning: {len(missing)} untracked file(s) will not be in the queued experiments (DVC copies what "
                f"git tracks): {shown}; `git add` the ones the pipeline needs"
            )
        # A task of the same name left failed in the queue by an earlier attempt: out of the way.
        stale = [n for n, st in self.status([r.name for r in reps]).items() if st == "Failed"]
        if stale:
            _run(_dvc("queue", "remove", *stale), self.root)
        for rep in reps:
            args = ["exp", "run", "--queue", *(["--force"] if rep.name in replace else []), "-n", rep.name]
            for s in rep.sets():
                args += ["-S", s]
            _run(_dvc(*args), self.root)
            self._queued.append(rep.name)
        if reps and not self._started:
            _run(_dvc("queue", "start", "-j", str(self.jobs)), self.root)
            self._started = True

    def status(self, names: Iterable[str]) -> dict[str, str]:
        """Each name's queue status: Queued, Running, Success, Failed (absent: not in the queue)."""
        from dvc.repo import Repo

        wanted = set(names)
        with Repo(str(self.root)) as repo:
            found = {t.get("name"): t.get("status") for t in repo.experiments.celery_queue.status()}
        return {n: found.get(n, "Unknown") for n in wanted}

    def wait(self, reps: Sequence[Replicate], done: Callable[[Replicate, str], None] | None = None) -> None:
        """Until every replicate has finished; `done(rep, status)` as each does. A failed one
        stops the wait with its log's tail (its arm cannot be compared without it)."""
        left = {r.name: r for r in reps}
        idle_since, restarts = None, 0
        while left:
            for name, status in self.status(left).items():
                if status in DONE:
                    rep = left.pop(name)
                    if done is not None:
                        done(rep, status)
                    if status == "Failed":
                        logs = subprocess.run(
                            _dvc("queue", "logs", name), cwd=self.root, capture_output=True, text=True
                        )
                        raise ReplicateError(
                            f"experiment {name} (arm {rep.arm}, seed {rep.seed}) failed; the end of its log "
                            f"(dvc queue logs {name}):\n{(logs.stdout + logs.stderr)[-3000:]}"
                        )
            if left and not self.workers():
                # Experiments left and no worker to run them (one quit, or was stopped by hand):
                # start workers again, a few times, rather than wait for ever.
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > WORKER_GRACE_S:
                    if restarts >= MAX_RESTARTS:
                        raise ReplicateError(
                            f"no DVC queue worker is running and {len(left)} experiment(s) are still queued "
                            f"({', '.join(left)}); `dvc queue start` started workers {restarts} times"
                        )
                    self.log("no queue worker is running: starting them again (dvc queue start)")
                    _run(_dvc("queue", "start", "-j", str(self.jobs)), self.root)
                    restarts, idle_since = restarts + 1, None
            else:
                idle_since = None
            if left:
                time.sleep(POLL_S)


def run_replicates(reps: Sequence[Replicate], jobs: int, root: Path = REPO_ROOT, label: str = "seeds") -> list[Result]:
    """Each replicate's Result: read back when its experiment exists, else queued and waited for."""
    from tqdm import tqdm

    # The commit the experiments are made from, fixed now: a commit made while they train must not
    # make them unfindable (DVC files an experiment under the commit it was queued from).
    baseline = head(root)
    done, todo, replace = {}, [], []
    for rep in reps:
        rev = experiment_rev(root, rep.name, baseline)
        if rev is not None:
            try:
                done[rep.name] = collect(root, rep, rev)
                continue
            except ReplicateError:
                replace.append(rep.name)  # made, but left nothing to read: train it again
        todo.append(rep)
    if done:
        print(f"[{label}] {len(done)} of {len(reps)} already made from this commit: read back", file=sys.stderr)
    if todo:
        print(
            f"[{label}] training {len(todo)} experiment(s) through DVC's queue with {jobs} worker(s): "
            + ", ".join(r.name for r in todo),
            file=sys.stderr,
        )
        bar = tqdm(total=len(todo), desc=label, unit="run", file=sys.stderr)
        with Queue(root, jobs, log=lambda m: print(f"[{label}] {m}", file=sys.stderr)) as queue:
            queue.submit(todo, replace=replace)

            def finished(rep, status):
                bar.update(1)
                bar.set_postfix_str(f"seed {rep.seed}: {status}")

            queue.wait(todo, finished)
        bar.close()
        for rep in todo:
            done[rep.name] = collect(root, rep, finished_rev(root, rep.name, baseline), baseline=baseline)
    return [done[r.name] for r in reps]


def measure_arm(results: Sequence[Result], preset: str, command: str) -> Reference:
    """The seed-variance reference of one arm's replicates (`./dev seeds`), with where and how it
    was measured."""
    from pipeline.core.numerics import cpu_model
    from pipeline.tracking.provenance import GIT_COMMIT, GIT_DIRTY, git_provenance

    metas = [r.meta for r in results]
    if any(m is None for m in metas):
        raise PipelineError("an item table carries no metadata (made by an older version): re-run it")
    arms = {m.arm_digest for m in metas}
    datas = {m.data for m in metas}
    if len(arms) > 1 or len(datas) > 1:
        raise PipelineError(f"the replicates are not one arm on one dataset: arms {sorted(arms)}, data {sorted(datas)}")
    _, (values,) = shared_values([[predictor_table(r.source()) for r in results]])
    git, _ = git_provenance()  # the commit and dirty flag a tracked run records
    measured = {
        "command": command,
        "commit": git[GIT_COMMIT],
        "dirty": git[GIT_DIRTY] == "true",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "experiments": [r.replicate.name for r in results],
    }
    arm = {"digest": metas[0].arm_digest, "name": metas[0].arm_name}
    return measure(preset, metas[0].data, arm, [m.seed for m in metas], values, measured)
