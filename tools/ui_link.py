"""The link `./dev ui` prints: the model experiment's runs table, in the saved view with the eval
columns (pipeline/tracking/views.py). Brings an older store's experiment up to date first (its
kind and view), so the link works on runs made before they existed.

    python -m tools.ui_link BASE_URL [--experiment NAME]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ui_link", description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="where the UI answers, e.g. http://127.0.0.1:5000")
    parser.add_argument("--experiment", help="the model experiment (default: run.experiment of params.yaml)")
    parser.add_argument("--arms", action="store_true", help="the view of the runs grouped by arm (replicates)")
    args = parser.parse_args(argv)
    import mlflow

    from pipeline.core.config import load_config
    from pipeline.tracking import store as tracking
    from pipeline.tracking.views import ARMS_VIEW_KEY, VIEW_KEY, runs_url

    name = args.experiment or str(load_config([]).run.experiment)
    reason = tracking.unreachable_reason(tracking.tracking_uri())
    if reason:  # (MLflow's client would retry for minutes)
        print(f"{args.base}  (the tracking server does not answer: {reason})")
        return 0
    tracking.use_store()
    found = mlflow.get_experiment_by_name(name)
    if found is None:
        print(f"{args.base}  (no experiment {name!r} in the store yet: `./dev repro` trains the first model)")
        return 0
    tracking.tag_experiment(mlflow.MlflowClient(), found, models=True)
    print(runs_url(args.base, found.experiment_id, ARMS_VIEW_KEY if args.arms else VIEW_KEY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
