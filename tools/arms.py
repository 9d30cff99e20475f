"""Bring the MLflow store's arms up to date: every arm of the model experiment against the
baseline of record, as rows a researcher reads in the MLflow UI (`./dev ui` runs it after
printing its links).

    python -m tools.arms [--baseline SPEC] [--experiment NAME] [--resamples N] [--seed S]

The baseline of record is the committed default run's arm (SPEC `HEAD`: the item table at that
revision says which arm), or any `./dev compare` side (`main`, an experiment, `arm:KEY`). Each
arm becomes one run of `<experiment>-arms` (its replicate count, each headline mean with its
seed-covering interval, its difference from the baseline with interval and outcome), and each
evaluated model run gets the same comparison as its tags `vs_baseline.*`
(pipeline/stats/baseline.py computes, pipeline/tracking/arms.py logs). Only MLflow changes."""

from __future__ import annotations

import argparse
import os
import sys

from pipeline.core.errors import PipelineError
from tools.options import add_bootstrap_options, fill_bootstrap_defaults


def update(
    baseline_spec: str, experiment: str | None = None, resamples: int | None = None, seed: int | None = None
) -> str:
    """Write the arms; one line saying what was done (or why nothing was)."""
    import mlflow

    from pipeline.core.config import load_config
    from pipeline.stats.baseline import against_baseline, baseline_of_record, model_runs
    from pipeline.stats.item_sources import quiet_mlflow
    from pipeline.tracking import store as tracking
    from pipeline.tracking.arms import arms_experiment, log_arms

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr: warnings and errors only
    quiet_mlflow()
    args = argparse.Namespace(resamples=resamples, seed=seed)
    fill_bootstrap_defaults(args)
    name = experiment or str(load_config([]).run.experiment)
    uri = tracking.use_store()
    client = mlflow.MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is None:
        return f"no experiment {name!r} in the store: no arm to show yet"
    runs = model_runs(client, found.experiment_id)
    if not runs:
        return f"no evaluated model run in {name!r}: no arm to show yet"
    baseline = baseline_of_record(baseline_spec)
    rows = against_baseline(runs, baseline, resamples=args.resamples, seed=args.seed)
    for row in rows:  # every run of the arm carries it, a seed evaluated twice included
        of_arm = [r for r in runs if r.arm == row["arm"]["digest"]]
        row["all_run_ids"] = [r.run_id for r in of_arm]
        row["params"] = of_arm[0].params
    target = arms_experiment(name)
    existing = client.get_experiment_by_name(target)
    if existing is None:
        arms_id = client.create_experiment(target, tracking.artifact_location(uri), tags=dict(tracking.EXPERIMENT_KIND))
    else:
        arms_id = existing.experiment_id
    from pipeline.tracking.views import ensure_arms_table_view

    ensure_arms_table_view(client, arms_id, client.get_experiment(arms_id).tags)
    shown = f"{baseline.name} [{baseline.digest}] ({baseline.spec})"
    count = log_arms(client, found.experiment_id, arms_id, rows, shown)
    return f"{count} arm(s) of {name!r} compared with the baseline of record {shown}: experiment {target!r}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.arms", description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="HEAD", help="the baseline of record (default HEAD: the committed run)")
    ap.add_argument("--experiment", help="the model experiment (default: run.experiment of params.yaml)")
    add_bootstrap_options(ap)
    args = ap.parse_args(argv)
    try:
        print(update(args.baseline, args.experiment, args.resamples, args.seed))
    except PipelineError as e:
        print(f"arms: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
