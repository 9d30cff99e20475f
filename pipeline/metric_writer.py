"""The tracking sidecar: a child process that writes the train stage's telemetry rows to MLflow
(log_batch, up to 1000 values a call) and samples its system metrics, so that neither competes
with training for the interpreter.

Why a process: MLflow's own asynchronous logging (log_batch with synchronous=False) writes from
threads of the training process. SQLAlchemy's inserts are Python, ~75 us of CPU per metric
value on the SQLite store, and hold the GIL while the training loop needs it: on the smoke model
(a row of 35 values every 2 steps of ~6 ms) the training span took 1.21-1.26x as long with that
logging as without (bench.tracking), although the rows' own step times barely moved. Here the
training process only pickles rows down a pipe (~1 ms per second of rows) and the writing happens
on another core.

Protocol, over the child's stdin / stdout (pickles, in order):
  ("rows", [(step, timestamp_ms, {key: value}), ...])  write these (non-finite and non-numeric
                     values are dropped: MLflow rejects NaN/inf)
  ("sync", n)        reply ("synced", n, error) once everything before it is written; error is
                     the first failure since the last sync (None if there was none)
  end of input       write what is left, stop the system-metrics sampler, exit 0

The child ignores SIGINT and SIGTERM: Ctrl-C and a scheduler's SIGTERM reach the whole process
group, and the child must outlive the parent's unwinding to write the last rows. It ends when its
input closes, which also happens if the parent is killed outright (SIGKILL): the rows already
sent are written even then.
"""
from __future__ import annotations

import math
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .errors import PipelineError

BATCH_LIMIT = 1000  # MLflow's cap on metric values per log_batch
SYNC_TIMEOUT_S = 300.0  # a store that takes longer than this to take the buffered rows is stuck
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class MetricWriter:
    """Parent side: start the sidecar for `run_id` on the store at `tracking_uri`; `send` rows,
    `sync` to wait until the store has them, `close` at the end (also on every error path)."""

    def __init__(self, tracking_uri: str, run_id: str, system_metrics_s: float = 0.0):
        env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri,
               "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.metric_writer", run_id, str(system_metrics_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.syncs = 0

    def _put(self, message) -> None:
        try:
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise PipelineError(f"the MLflow metric writer (pid {self.proc.pid}) has exited with status "
                                f"{self.proc.poll()}; its error is printed above") from None

    def send(self, rows: list[tuple[int, int, dict]]) -> None:
        if rows:
            self._put(("rows", rows))

    def sync(self, timeout: float = SYNC_TIMEOUT_S) -> None:
        """Block until everything sent is in the store; raise if writing any of it failed."""
        self.syncs += 1
        self._put(("sync", self.syncs))
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise PipelineError(f"the MLflow metric writer did not confirm its writes within {timeout:g} s: "
                                "is the tracking store reachable (MLFLOW_TRACKING_URI)?")
        try:
            _, n, error = pickle.load(self.proc.stdout)
        except EOFError:
            raise PipelineError(f"the MLflow metric writer (pid {self.proc.pid}) exited with status "
                                f"{self.proc.wait()}; its error is printed above") from None
        if n != self.syncs:  # replies come in order, one per sync: anything else is a bug here
            raise PipelineError(f"the MLflow metric writer answered sync {n}, expected {self.syncs}")
        if error:
            raise PipelineError(f"MLflow could not store metrics: {error}")

    def close(self, timeout: float = SYNC_TIMEOUT_S) -> None:
        """End of input: the child writes what is left and exits. Never raises; kills a child
        that does not exit in time."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def _read_all(inp, messages: queue.Queue) -> None:
    """Take messages off the pipe as they come, so the parent never blocks on a full pipe while
    this process is still importing MLflow (~2 s); None marks the end of input."""
    try:
        while True:
            messages.put(pickle.load(inp))
    except (EOFError, OSError, pickle.UnpicklingError):
        messages.put(None)


def _sample_system(run_id: str, uri: str, interval: float, stop: threading.Event) -> None:
    """MLflow's system-metrics collectors (CPU, memory, disk, network; NVIDIA GPUs through
    pynvml, AMD through pyrsmi, when present), sampled now, every `interval` seconds and once more
    when training ends, as `system/...` metrics. Driven here rather than by MLflow's own sampler
    thread, which publishes only after a full interval and drops the last partial one: a
    smoke run trains for well under a second and would get no sample at all."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    try:
        # resume_logging: a resumed run's samples continue its step count instead of restarting.
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, resume_logging=True, tracking_uri=uri)
        while True:
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            if stop.wait(interval):
                break
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as e:  # noqa: BLE001 - system metrics are context: never stop the run for them
        print(f"[metric writer] system metrics stopped: {type(e).__name__}: {e}", file=sys.stderr)


def _serve(run_id: str, system_metrics_s: float, inp, out) -> None:
    messages: queue.Queue = queue.Queue()
    threading.Thread(target=_read_all, args=(inp, messages), daemon=True, name="pipe-reader").start()

    import logging

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Started monitoring system metrics."
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    stop_sampling = threading.Event()
    sampler = None
    if system_metrics_s > 0:
        sampler = threading.Thread(target=_sample_system, args=(run_id, uri, system_metrics_s, stop_sampling),
                                   daemon=True, name="system-metrics")
        sampler.start()
    error = None
    try:
        while (message := messages.get()) is not None:
            kind, payload = message
            if kind == "rows":
                metrics = [Metric(k, float(v), ts, step) for step, ts, row in payload for k, v in row.items()
                           if isinstance(v, (int, float)) and math.isfinite(v)]
                try:
                    for i in range(0, len(metrics), BATCH_LIMIT):
                        client.log_batch(run_id, metrics=metrics[i:i + BATCH_LIMIT])
                except Exception as e:  # noqa: BLE001 - reported to the parent at its next sync
                    error = error or f"{type(e).__name__}: {e}"
            elif kind == "sync":
                pickle.dump(("synced", payload, error), out)
                out.flush()
                error = None
    finally:
        stop_sampling.set()
        if sampler is not None:
            sampler.join(timeout=60)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Background work: where it competes with training for a core (a preset using every core),
    # training comes first; the rows wait, and sync() waits for them at a checkpoint or the end.
    os.nice(10)
    # Replies go to the real stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(argv[0], float(argv[1]), sys.stdin.buffer, out)
    # Everything is written (each log_batch committed); skip the interpreter's teardown and
    # MLflow's exit hooks, which took ~0.4 s that the parent spends waiting for us.
    out.close()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
