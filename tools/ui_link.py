"""The link `./dev ui` prints: the model experiment's runs table, in the saved view with the eval
columns (pipeline/tracking/views.py). Brings an older store's experiment up to date first (its
kind and view), so the link works on runs made before they existed.

    python -m tools.ui_link BASE_URL [--experiment NAME] [--arms]
"""

from __future__ import annotations

import argparse
import sys


def links(base: str, experiment: str | None = None) -> tuple[str, str]:
    """(the runs table in the eval view, the same grouped by arm) on the UI at `base`, the model
    experiment brought up to date first; or, twice, `base` with a note saying why there is no
    experiment to link to. `experiment`: default run.experiment of params.yaml."""
    import mlflow

    from pipeline.core.config import load_config
    from pipeline.tracking import store as tracking
    from pipeline.tracking.views import ARMS_VIEW_KEY, VIEW_KEY, runs_url

    name = experiment or str(load_config([]).run.experiment)
    reason = tracking.unreachable_reason(tracking.tracking_uri())
    if reason:  # (MLflow's client would retry for minutes)
        return (f"{base}  (the tracking server does not answer: {reason})",) * 2
    tracking.use_store()
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        return (f"{base}  (no experiment {name!r} in the store yet: `./dev repro` trains the first model)",) * 2
    tracking.tag_experiment(mlflow.MlflowClient(), found, models=True)
    return runs_url(base, found.experiment_id, VIEW_KEY), runs_url(base, found.experiment_id, ARMS_VIEW_KEY)


def table_links(base: str, experiment: str | None = None) -> list[str]:
    """Lines with the links to the arms table and the decisions table (experiments
    `<experiment>-arms` and `-decisions`), for those the store holds."""
    import mlflow

    from pipeline.core.config import load_config
    from pipeline.tracking.arms import arms_experiment
    from pipeline.tracking.decisions import decisions_experiment
    from pipeline.tracking.views import ARMS_TABLE_VIEW_KEY, DECISIONS_VIEW_KEY, runs_url

    name = experiment or str(load_config([]).run.experiment)
    lines = []
    for what, target, view in (
        (
            "Each arm with its replicates and its difference from the baseline of record:",
            arms_experiment(name),
            ARMS_TABLE_VIEW_KEY,
        ),
        (
            "The decisions (./dev compare, ./dev decide), each with its page:",
            decisions_experiment(name),
            DECISIONS_VIEW_KEY,
        ),
    ):
        found = mlflow.get_experiment_by_name(target)
        if found is not None:
            lines += [what, f"  {runs_url(base, found.experiment_id, view)}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ui_link", description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="where the UI answers, e.g. http://127.0.0.1:5000")
    parser.add_argument("--experiment", help="the model experiment (default: run.experiment of params.yaml)")
    parser.add_argument("--arms", action="store_true", help="the view of the runs grouped by arm (replicates)")
    parser.add_argument(
        "--tables", action="store_true", help="then the links to the arms and the decisions tables, where they exist"
    )
    args = parser.parse_args(argv)
    link = links(args.base, args.experiment)[1 if args.arms else 0]
    print(link)
    if args.tables and "(" not in link:  # (a note in brackets: no store or no experiment to link to)
        for line in table_links(args.base, args.experiment):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
