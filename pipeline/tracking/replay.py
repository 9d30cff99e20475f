"""Replay metric values the tracking store refused while it was away.

    python -m pipeline.tracking.replay [FILE ...]

The train stage's metric buffer (pipeline/tracking/metric_buffer.py) keeps what the MLflow store
refuses in <project>/.mlflow-pending/<run_id>.jsonl and sends it itself when the store answers
again within the run; a file left after the run (the store stayed away, or the stage was killed
during an outage) is replayed by this command, into the store of MLFLOW_TRACKING_URI (unset: the
project's mlflow.db). Without FILE, every pending file is replayed. A file is removed once every
value in it is stored; one that fails stays, and the command exits 1 naming it. Replaying cannot
double a point: values the run already holds (same key, step, timestamp and value) are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.tracking import store as tracking
from pipeline.tracking.metric_names import mlflow_key


def read_pending(path: Path) -> list:
    """The file's values as MLflow Metrics, under their MLflow names (metric_names: a file from a
    version that wrote the telemetry's own keys is renamed as the buffer now sends them; the
    buffer's own files hold MLflow names already, which map to themselves); a line that is not
    one (a hand-edited file) is skipped."""
    from mlflow.entities import Metric

    metrics = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            key, value, timestamp, step = json.loads(line)
        except (ValueError, TypeError):
            print(f"[metric replay] {path}:{n}: not a [key, value, timestamp, step] line; skipped", file=sys.stderr)
            continue
        name = mlflow_key(str(key))
        if name is not None:
            metrics.append(Metric(name, float(value), int(timestamp), int(step)))
    return metrics


def not_stored(client, run_id: str, metrics: list) -> list:
    """`metrics` less the values the run already holds (a batch the store took after the file was
    written: its answer was lost, or the stage was killed before its next sync)."""
    held = {
        (m.key, m.step, m.timestamp, m.value)
        for key in sorted({m.key for m in metrics})
        for m in client.get_metric_history(run_id, key)
    }
    return [m for m in metrics if (m.key, m.step, m.timestamp, m.value) not in held]


def replay(path: Path) -> int:
    """Store the file's values in its run (the file name is the run id) that it does not hold
    yet; remove the file; return how many were stored."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    metrics = not_stored(client, path.stem, read_pending(path))
    # MLflow's client splits the values into calls of up to 1000. If one fails, the file stays
    # whole: the next replay skips what this one stored.
    if metrics:
        client.log_batch(path.stem, metrics=metrics)
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
