"""Compare two evaluated models item by item: is B better than A, on which metric, and is the
difference more than the luck of the test items?

    ./dev compare A B [--resamples N] [--seed S] [--show N] [--json]
    ./dev compare A --baseline ridge      # A's model against a baseline scored in the same stage
    ./dev compare --sweep NAME [--metric group_top1] [--json]   # rank a sweep's runs (below)
    python -m tools.compare A B        # the same, with the environment already active

Each of A and B names the item table the evaluate stage writes (reports/eval_items.parquet: one
row per test item with the model's rank, group rank, cosine and mse, and each baseline's). A name
is tried as, in this order (the first that matches is used; one that matches nothing stops with one
line saying what was tried, exit 2):

  1. `workspace`          the working copy's reports/eval_items.parquet;
  2. a file path          an existing item-table parquet file (any name; relative to the
                          directory the command was started in);
  3. an MLflow run id     32 hex characters, a run in the project's store (mlflow.db at the
                          repository root, or MLFLOW_TRACKING_URI): its artifact
                          evaluate/eval_items.parquet (the model run `dvc exp show`'s
                          experiment made; the MLflow UI shows its id);
  4. a git revision       a branch, tag or commit (`main`, `v1`, `HEAD~1`, `3f2a9c1`): the table
                          as committed there, read from DVC's cache;
  5. a DVC experiment     a name from `dvc exp run -n NAME` / `dvc exp show` (a git ref under
                          refs/exps/): the table of that experiment's commit, from DVC's cache.

Git revisions come before experiment names as in DVC itself (`dvc metrics diff`, `dvc plots diff`
resolve a name the same way), so a branch and an experiment of one name mean the branch.

What it prints, over the items both tables hold (matched by id):
- for each metric (cosine, mse, top1, top5, group_top1, group_top5, mrr): A's mean, B's mean and
  the paired difference B - A with its 95 % bootstrap confidence interval and two-sided p-value
  (the items are resampled once for both models, which keeps their pairing: pipeline/evaluate/stats.py;
  seeded, so the same tables always give the same numbers);
- one verdict per metric: "B is better than A on group_top1: +0.031 [0.012, 0.049] (p=0.002)",
  "... is worse than ...", or "no significant difference ..." when the interval holds 0 (for mse
  lower is better);
- the items whose group top-1 outcome flipped: hit by A and missed by B, and the other way, with
  counts and the first --show of each (id, input, target, both group ranks).

Two tables from different test splits (another dataset, split seed or fraction) share only some
items: the comparison is over the shared ones, with a warning; with none shared it refuses (exit 2).
--json prints the same as one JSON object (warnings still go to stderr).

--sweep NAME ranks the model runs of one sweep instead (`dvc exp run --queue -S run.sweep=NAME
-S 'train.lr=1e-3,3e-3,1e-2' ...`, whose runs carry the MLflow tag sweep.NAME): each run's mean of
--metric (default group_top1) with its 95 % CI, best first, and each run's paired difference from
the best with its CI and p-value, beside the params that differ between the runs (tools/sweep.py).

Example, two smoke experiments:

    dvc exp run -n lr-low -S preset=smoke -S train.lr=0.001
    dvc exp run -n lr-high -S preset=smoke -S train.lr=0.01
    ./dev compare lr-low lr-high
    ./dev compare lr-low lr-high --json --show 50 > diff.json
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.evaluate.stats import (
    CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    intervals,
    p_value,
    resample_means,
)

ITEMS_PATH = "reports/eval_items.parquet"  # in the repository (a DVC output of evaluate)
MLFLOW_ARTIFACT = "evaluate/eval_items.parquet"  # in the model's MLflow run
WORKSPACE = "workspace"
MIN_RESAMPLES = 1000
DEFAULT_SHOW = 10
SCORE_COLUMNS = ("rank", "group_rank", "cosine", "mse")  # per predictor; baselines as <name>_<column>
FLIP_METRIC = "group_top1"
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


@dataclass
class _Tried:
    reasons: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.reasons.append(what)


# --------------------------------------------------------------------------- finding a table


def load(name: str, root: Path = REPO_ROOT) -> Source:
    """The item table `name` stands for (see the module doc for the order), or CompareError."""
    root = Path(root)
    tried = _Tried()
    if name == WORKSPACE:
        path = root / ITEMS_PATH
        if not path.is_file():
            raise CompareError(
                f"workspace: {path} does not exist; it is written by the evaluate stage "
                f"(dvc repro evaluate, or dvc exp apply NAME for an experiment's)"
            )
        return Source(name, name, "workspace", f"the working copy's {ITEMS_PATH}", _read_parquet(path, name))
    tried.add(f"not `{WORKSPACE}`")

    path = Path(name)
    if path.is_file():
        return Source(name, name, "file", f"file {path}", _read_parquet(path, name))
    tried.add("not an existing file" + (" (a directory)" if path.is_dir() else ""))

    if _RUN_ID.fullmatch(name):
        found = _from_mlflow(name, tried)
        if found is not None:
            return found
    else:
        tried.add("not an MLflow run id (32 hex characters)")

    found = _from_dvc(name, root, tried)
    if found is not None:
        return found
    raise CompareError(f"{name!r} names no item table: " + "; ".join(tried.reasons))


def _read_parquet(source, name: str) -> pd.DataFrame:
    try:
        return pd.read_parquet(source)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix, said in one line
        raise CompareError(f"{name}: not a readable parquet file ({type(e).__name__}: {e})") from None


def _from_mlflow(run_id: str, tried: _Tried) -> Source | None:
    from pipeline.tracking import store as tracking

    uri = tracking.tracking_uri()
    shown = tracking.redact_text(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        tried.add(f"no MLflow store at {shown} to look up run {run_id} in")  # (and none is created)
        return None
    _quiet_mlflow()
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        tried.add(f"not a run in the MLflow store {shown}")
        return None
    except Exception as e:  # noqa: BLE001 - an unreachable server: say which and go on to git
        tried.add(f"not looked up in the MLflow store {shown} ({type(e).__name__}: {tracking.redact_text(str(e))})")
        return None
    run_name = run.info.run_name or ""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr holds warnings and errors only
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        try:
            local = client.download_artifacts(run_id, MLFLOW_ARTIFACT, tmp)
        except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
            raise CompareError(
                f"MLflow run {run_id} ({run_name or 'unnamed'}) has no artifact {MLFLOW_ARTIFACT}: "
                "it is logged to the model's run by the evaluate stage (an embed run, or a run "
                "evaluated before the item table existed, has none)"
            ) from None
        table = _read_parquet(local, run_id)
    label = f"{run_name} (run {run_id[:8]})" if run_name else f"run {run_id[:8]}"
    return Source(
        run_id,
        label,
        "mlflow-run",
        f"MLflow run {run_id} ({run_name or 'unnamed'}) in {shown}, artifact {MLFLOW_ARTIFACT}",
        table,
    )


def _from_dvc(name: str, root: Path, tried: _Tried) -> Source | None:
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo
    from dvc.repo.experiments.utils import AmbiguousExpRefInfo, resolve_name
    from scmrepo.exceptions import SCMError

    try:
        repo = Repo(str(root))
    except NotDvcRepoError:
        tried.add(f"not a git revision or DVC experiment ({root} is not a DVC repository)")
        return None
    with repo:
        scm = repo.scm
        if not hasattr(scm, "resolve_rev") or type(scm).__name__ == "NoSCM":
            tried.add(f"not a git revision or DVC experiment ({root} is not a git repository)")
            return None
        try:
            sha, kind, what = scm.resolve_rev(name), "git-revision", f"git revision {name}"
        except SCMError:
            tried.add(f"not a git revision of {root}")
            try:
                ref = resolve_name(scm, name).get(name)
            except AmbiguousExpRefInfo:
                raise CompareError(
                    f"{name!r}: several DVC experiments have this name (on different baseline "
                    "commits); name one by its commit (dvc exp show --sha)"
                ) from None
            if ref is None:
                tried.add("not a DVC experiment there (dvc exp show lists them)")
                return None
            sha, kind, what = scm.get_ref(str(ref)), "dvc-experiment", f"DVC experiment {name}"
    table = _read_at_rev(root, sha, f"{what} (commit {sha[:8]})")
    return Source(name, name, kind, f"{what} (commit {sha[:8]}), {ITEMS_PATH} from DVC", table)


def _read_at_rev(root: Path, sha: str, what: str) -> pd.DataFrame:
    """The item table at a commit: from DVC's cache when it is a DVC output there (or from git)."""
    import dvc.api
    from dvc.exceptions import DvcException

    try:
        with dvc.api.open(ITEMS_PATH, repo=str(root), rev=sha, mode="rb") as f:
            raw = f.read()
    except (FileNotFoundError, DvcException) as e:
        missing = isinstance(e, FileNotFoundError) or type(e).__name__ in ("PathMissingError", "OutputNotFoundError")
        why = (
            f"{ITEMS_PATH} is not there (neither in git nor a DVC output: the evaluate stage of that commit "
            "predates the item table, or it never ran)"
            if missing
            else f"{ITEMS_PATH} could not be read from DVC's cache ({type(e).__name__}: {e}; `dvc pull` fetches a "
            "missing one from the remote)"
        )
        raise CompareError(f"{what}: {why}") from None
    return _read_parquet(io.BytesIO(raw), what)


def _quiet_mlflow() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="mlflow")


# --------------------------------------------------------------------------- comparing


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
    from pipeline.evaluate.retrieval import item_metrics

    return item_metrics({c: t[c].to_numpy() for c in SCORE_COLUMNS})


def shared_ids(tables: list[pd.DataFrame]) -> list[str]:
    """The item ids every table holds, in the first table's order."""
    common = set(tables[0]["id"])
    for t in tables[1:]:
        common &= set(t["id"])
    return [i for i in tables[0]["id"] if i in common]


def runs_values(tables: list[pd.DataFrame], ids: list[str]) -> dict[str, np.ndarray]:
    """metric -> (runs, items): each predictor table's per-item values over `ids`, in that order."""
    from pipeline.evaluate.retrieval import METRICS

    per_run = [_per_item(t.set_index("id").loc[ids].reset_index()) for t in tables]
    return {m: np.stack([r[m] for r in per_run]) for m in METRICS}


def compare(
    a: Source, b: Source, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED, show: int = DEFAULT_SHOW
) -> dict:
    """Everything the command prints, as one JSON-able dict."""
    from pipeline.evaluate.retrieval import LOWER_IS_BETTER, METRICS

    ta, tb = predictor_table(a, a.predictor), predictor_table(b, b.predictor)
    shared = ta.merge(tb, on="id", suffixes=("_a", "_b"), how="inner", sort=False)  # A's order
    n = len(shared)
    warnings_ = []
    if n == 0:
        raise CompareError(
            f"{a.label} ({len(ta)} items) and {b.label} ({len(tb)} items) share no item id: they were "
            "evaluated on different test splits (dataset, split seed or fractions), so there is "
            "nothing to pair"
        )
    if n < len(ta) or n < len(tb):
        warnings_.append(
            f"{a.label} has {len(ta)} items and {b.label} {len(tb)}, of which {n} are shared (different "
            f"test splits?): the comparison is over the {n} shared items only"
        )
    ma = _per_item(shared.rename(columns={f"{c}_a": c for c in SCORE_COLUMNS}))
    mb = _per_item(shared.rename(columns={f"{c}_b": c for c in SCORE_COLUMNS}))
    columns = [ma[m] for m in METRICS] + [mb[m] for m in METRICS] + [mb[m] - ma[m] for m in METRICS]
    values = np.stack(columns, axis=1)
    means = resample_means(values, resamples, seed)  # one set of resamples: A, B and B - A all paired
    lows, highs = intervals(means)
    k = len(METRICS)
    metrics = {}
    for i, m in enumerate(METRICS):

        def est(j: int) -> dict:
            return {"value": _r(values[:, j].mean()), "ci95_low": _r(lows[j]), "ci95_high": _r(highs[j])}

        d = 2 * k + i
        diff = {**est(d), "p_value": _r(p_value(values[:, d], means[:, d]))}
        higher = m not in LOWER_IS_BETTER
        significant = diff["ci95_low"] > 0 or diff["ci95_high"] < 0
        better = None if not significant else ("b" if (diff["value"] > 0) == higher else "a")
        metrics[m] = {
            "higher_is_better": higher,
            "a": est(i),
            "b": est(k + i),
            "difference": diff,
            "significant": significant,
            "better": better,
            "verdict": verdict_line(diff, a.label, b.label, m, higher),
        }
    hit_a, hit_b = shared["group_rank_a"].to_numpy() <= 1, shared["group_rank_b"].to_numpy() <= 1
    flipped = {"metric": FLIP_METRIC}
    for key, mask in (("a_only", hit_a & ~hit_b), ("b_only", ~hit_a & hit_b)):
        rows = shared[mask]
        flipped[key] = int(mask.sum())
        flipped[f"{key}_items"] = [
            {
                "id": r.id,
                "input": r.input_a,
                "target": r.target_a,
                "a_group_rank": int(r.group_rank_a),
                "b_group_rank": int(r.group_rank_b),
            }
            for r in rows.head(max(show, 0)).itertuples(index=False)
        ]
    return {
        "a": _describe(a, len(ta)),
        "b": _describe(b, len(tb)),
        "shared_items": n,
        "resamples": resamples,
        "seed": seed,
        "confidence": CONFIDENCE,
        "difference": "b - a",
        "warnings": warnings_,
        "metrics": metrics,
        "flipped": flipped,
    }


def _r(x) -> float:
    return round(float(x), 6)


def _describe(s: Source, items: int) -> dict:
    return {
        "name": s.name,
        "label": s.label,
        "kind": s.kind,
        "source": s.description,
        "predictor": s.predictor,
        "items": items,
    }


def _fmt(x: float, metric: str, sign: bool = False) -> str:
    digits = 6 if metric == "mse" else 3
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def verdict_line(diff: dict, name_a: str, name_b: str, metric: str, higher_is_better: bool) -> str:
    """ "B is better than A on group_top1: +0.031 [0.012, 0.049] (p=0.002)", "... is worse than
    ...", or "no significant difference between A and B on ...": the interval of B - A decides."""
    numbers = (
        f"{_fmt(diff['value'], metric, sign=True)} [{_fmt(diff['ci95_low'], metric)}, "
        f"{_fmt(diff['ci95_high'], metric)}] (p={diff['p_value']:.3g})"
    )
    what = metric if higher_is_better else f"{metric} (lower is better)"
    if not (diff["ci95_low"] > 0 or diff["ci95_high"] < 0):
        return f"no significant difference between {name_a} and {name_b} on {what}: {numbers}"
    word = "better" if (diff["value"] > 0) == higher_is_better else "worse"
    return f"{name_b} is {word} than {name_a} on {what}: {numbers}"


def _short(text: str, width: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render(result: dict, show: int = DEFAULT_SHOW) -> str:
    a, b = result["a"], result["b"]
    lines = [
        f"A = {a['label']}: {a['source']}"
        + ("" if a["predictor"] == "model" else f", baseline {a['predictor']}")
        + f"; {a['items']} items",
        f"B = {b['label']}: {b['source']}"
        + ("" if b["predictor"] == "model" else f", baseline {b['predictor']}")
        + f"; {b['items']} items",
        f"{result['shared_items']} shared items (matched by id). B - A is paired over them: "
        f"{round(result['confidence'] * 100)} % bootstrap CI ({result['resamples']} resamples, seed {result['seed']}), "
        "two-sided p.",
        "",
    ]
    head = f"{'metric':<12} {'A':>10} {'B':>10} {'B - A':>11}   {'95 % CI':<25} {'p':>7}"
    lines += [head, "-" * len(head)]
    for m, r in result["metrics"].items():
        d = r["difference"]
        ci = f"[{_fmt(d['ci95_low'], m, True)}, {_fmt(d['ci95_high'], m, True)}]"
        mark = " *" if r["significant"] else ""
        lines.append(
            f"{m:<12} {_fmt(r['a']['value'], m):>10} {_fmt(r['b']['value'], m):>10} "
            f"{_fmt(d['value'], m, True):>11}   {ci:<25} {d['p_value']:>7.3g}{mark}"
        )
    lines += ["(* the 95 % interval excludes 0; mse: lower is better, every other metric higher)", ""]
    lines += [r["verdict"] for r in result["metrics"].values()]
    f = result["flipped"]
    lines += [
        "",
        f"Items whose {f['metric']} outcome flipped ({f['a_only'] + f['b_only']} of {result['shared_items']}):",
    ]
    for key, hit, miss in (("a_only", a["label"], b["label"]), ("b_only", b["label"], a["label"])):
        items = f[f"{key}_items"]
        more = f", the first {len(items)}" if 0 < len(items) < f[key] else ""
        lines.append(f"  {f[key]} hit by {hit}, missed by {miss}{more}" + (":" if items else ""))
        for it in items:
            lines.append(f"    {it['id']}  (group rank A {it['a_group_rank']}, B {it['b_group_rank']})")
            lines.append(f"      input:  {_short(it['input'])}")
            lines.append(f"      target: {_short(it['target'])}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="./dev compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "a",
        metavar="A",
        nargs="?",
        help="the reference: workspace, a file, an MLflow run id, a git revision or a DVC experiment name",
    )
    ap.add_argument("b", metavar="B", nargs="?", help="the one compared with it (same kinds); differences are B - A")
    ap.add_argument(
        "--baseline",
        metavar="NAME",
        help="with A alone: compare a baseline scored in A's own evaluate "
        "stage (identity, ridge, untrained) as A with A's model as B",
    )
    ap.add_argument(
        "--resamples",
        type=int,
        default=DEFAULT_RESAMPLES,
        help=f"bootstrap resamples (default {DEFAULT_RESAMPLES}, at least {MIN_RESAMPLES})",
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    ap.add_argument(
        "--show",
        type=int,
        default=DEFAULT_SHOW,
        metavar="N",
        help=f"flipped items listed each way (default {DEFAULT_SHOW}; 0: counts only)",
    )
    ap.add_argument(
        "--sweep",
        metavar="NAME",
        help="instead of A and B: rank the model runs tagged sweep.NAME (dvc exp run --queue -S run.sweep=NAME ...) "
        "against the best",
    )
    ap.add_argument(
        "--metric",
        help="with --sweep: the metric to rank by (default group_top1; cosine, mse, top1, top5, group_top5, mrr)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.resamples < MIN_RESAMPLES:
        ap.error(f"--resamples {args.resamples}: expected at least {MIN_RESAMPLES}")
    if args.show < 0:
        ap.error(f"--show {args.show}: expected 0 or more")
    if args.sweep is not None:
        if args.a is not None or args.baseline is not None:
            ap.error("--sweep NAME ranks the sweep's own runs: give no A, B or --baseline with it")
        return _main_sweep(args)
    if args.metric is not None:
        ap.error("--metric goes with --sweep (a comparison of A and B shows every metric)")
    if args.a is None or (args.b is None) == (args.baseline is None):
        ap.error("give two tables (A B), one with --baseline NAME, or --sweep NAME")
    try:
        a = load(args.a)
        if args.baseline:
            b = a
            a = Source(a.name, f"{a.label}:{args.baseline}", a.kind, a.description, a.table, args.baseline)
        else:
            b = load(args.b)
            if a.label == b.label:
                a.label, b.label = f"{a.label} (A)", f"{b.label} (B)"
        result = compare(a, b, args.resamples, args.seed, args.show)
    except PipelineError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"compare: warning: {w}", file=sys.stderr)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else render(result, args.show))
    return 0


def _main_sweep(args) -> int:
    from tools import sweep

    try:
        result = sweep.rank(sweep.find(args.sweep), args.metric or sweep.DEFAULT_METRIC, args.resamples, args.seed)
    except PipelineError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"compare: warning: {w}", file=sys.stderr)
    print(json.dumps(result, indent=2, allow_nan=False) if args.json else sweep.render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
