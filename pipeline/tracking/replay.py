"""Replay metric values the tracking store refused while it was away.

    python -m pipeline.tracking.replay [FILE ...]

The train stage's metric writer keeps what the MLflow store refuses in
<project>/.mlflow-pending/<run_id>.jsonl and sends it itself when the store answers again within
the run; a file left after the run (the store stayed away) is replayed by this command, into the
store of MLFLOW_TRACKING_URI (unset: the project's mlflow.db). Without FILE, every pending file
is replayed. A file is removed once every value in it is stored; one that fails stays, and the
command exits 1 naming it. Replaying twice cannot double a point: a file is gone once stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.tracking import store as tracking
from pipeline.tracking.metric_writer import BATCH_LIMIT, write_pending


def read_pending(path: Path) -> list:
    """The file's values as MLflow Metrics; a torn last line (a kill mid-append) is skipped."""
    from mlflow.entities import Metric

    metrics = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            key, value, timestamp, step = json.loads(line)
        except (ValueError, TypeError):
            print(f"[metric replay] {path}:{n}: not a [key, value, timestamp, step] line; skipped", file=sys.stderr)
            continue
        metrics.append(Metric(key, float(value), int(timestamp), int(step)))
    return metrics


def replay(path: Path) -> int:
    """Store the file's values in its run (the file name is the run id); remove it; return the count."""
    from mlflow.tracking import MlflowClient

    metrics = read_pending(path)
    client = MlflowClient(tracking.tracking_uri())
    done = 0
    try:
        while done < len(metrics):
            client.log_batch(path.stem, metrics=metrics[done : done + BATCH_LIMIT])
            done += len(metrics[done : done + BATCH_LIMIT])
    except Exception:
        if done:  # keep only what is not stored: a second replay must not log a point twice
            write_pending(path, metrics[done:])
        raise
    path.unlink()
    return len(metrics)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.tracking.replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="*", type=Path, help="pending files (default: all in <project>/.mlflow-pending)")
    args = ap.parse_args(argv)
    files = args.files or sorted(tracking.pending_dir().glob("*.jsonl"))
    if not files:
        print(f"[metric replay] nothing to replay in {tracking.pending_dir()}")
        return 0
    uri = tracking.redact_text(tracking.tracking_uri())
    failed = 0
    for path in files:
        try:
            n = replay(path)
        except Exception as e:  # noqa: BLE001 - one file's failure must not stop the others
            failed += 1
            print(
                f"[metric replay] {path}: not replayed into {uri} ({type(e).__name__}: {e}); the file is kept",
                file=sys.stderr,
            )
            continue
        print(f"[metric replay] {path}: {n} values stored in run {path.stem} ({uri})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
