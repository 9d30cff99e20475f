"""The train stage's telemetry rows to MLflow, through MLflow's own asynchronous logging, with
nothing lost while the tracking store is away. Why MLflow's queue and not a writer process of our
own, what it costs and how an outage is handled: docs/mlflow.md ("Logging stays out of training's
way", "When the tracking server is not there").

What MLflow's queue does not do is keep values through an outage: a batch the store refuses is
reported on its future and dropped. This module adds that: rows are handed to the queue every
`flush_seconds` as one log_batch (up to 1000 values a call), each call's futures kept with its
values; a refused batch is kept and sent again (every RETRY_S while the store is away); `sync()`
(before each checkpoint) waits for every outcome and writes the values not stored to
pending_dir()/<run_id>.jsonl, so a run resumed from that checkpoint cannot lose them; at the end
(every path) the store gets FINAL_TRIES more tries, and what it still refuses stays in the file
for `python -m pipeline.tracking.replay`. A SIGKILL loses the rows after the last sync: the
resumed run logs those steps again.

While the buffer is open (ENV_WHILE_OPEN; undone before the stage logs its model), MLflow's HTTP
client tries each call once with a 10 s timeout (its 7 retries with back-off would hold the queue
and every sync behind one unanswered call), and its queue does not buffer: buffering merges a
second's batches into one call, and when that call fails MLflow reports the error on the first
batch's future only (MLflow 3.17, RunBatch.complete); unbuffered, each future tells the truth.

System metrics are sampled from the first row on, not before: MLflow's compare page plots the
first metric a run was given, and that should be the training loss, not the CPU use.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import math
import threading
import time
from pathlib import Path

from pipeline.core.atomic import atomic_path
from pipeline.core.environment import temporary_env
from pipeline.tracking import store
from pipeline.tracking.metric_names import SYSTEM, mlflow_key
from pipeline.tracking.redact import redact_text

log = logging.getLogger(__name__)

CPU_KEY = SYSTEM["system/cpu_utilization_percentage"]  # in every sample
CURVES_PREFIX = "curves/"
BATCH_LIMIT = 1000  # MLflow's cap on metric values per log_batch
RETRY_S = 2.0  # while the store is away, send the kept values again at most this often
FINAL_TRIES, FINAL_PAUSE_S = 5, 1.0  # at the end: a store back within ~5 s still gets everything
# MLflow's settings while the buffer is open (None: unset; see above).
ENV_WHILE_OPEN = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS": None,
}
# MLflow's queue logs each refused batch at ERROR; the buffer says it once per outage instead. The
# record is an f-string with no field of its own (MLflow 3.17): its text is the only way to tell it
# from the queue's other errors, which still show.
_QUEUE_LOGGER = "mlflow.utils.async_logging.async_logging_queue"


class _DropRefusedBatches(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to log run data" not in record.getMessage()


def write_pending(path: Path, metrics: list) -> None:
    """Metrics as pending-file lines, [key, value, timestamp, step] each, replacing the file whole
    (temp file, then rename: a kill leaves the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps([m.key, m.value, m.timestamp, m.step]) + "\n" for m in metrics))


class MetricBuffer:
    """`buffer(metrics, step)` is the trainer's on_log; `sync()` its checkpoints' before_save.
    Rows keep their own step and timestamp, so MLflow's curves are the same, just up to
    `flush_seconds` late. Tracking off: every call is a no-op."""

    def __init__(self, run_id: str, flush_seconds: float = 0.5, system_metrics_s: float = 0.0):
        self.run_id, self.flush_seconds = run_id, flush_seconds
        self.on = store.enabled()
        self.rows: list[tuple[int, int, dict]] = []  # (step, timestamp ms, row), not handed over yet
        self.inflight: list[tuple[list, list]] = []  # (futures, metrics) handed to MLflow's queue
        self.refused: list = []  # metrics the store refused, to send again
        self.reason = ""  # the store's last refusal
        self.last_try = 0.0  # when refused values were last sent again
        self.last_flush = time.monotonic()
        self.outage: dict | None = None  # the last sync's pending status, while the store is away
        self.sent = 0  # metric values taken so far (each once, however often it is sent again)
        self.pending_file = store.pending_dir() / f"{run_id}.jsonl"
        self._env = contextlib.ExitStack()  # ENV_WHILE_OPEN, undone at close
        self._filter = _DropRefusedBatches()
        self._stop_sampling = threading.Event()
        self._sampler: threading.Thread | None = None
        self._system_metrics_s = system_metrics_s
        if not self.on:
            return
        import mlflow
        from mlflow.tracking import MlflowClient

        mlflow.set_tracking_uri(store.tracking_uri())
        self.client = MlflowClient(store.tracking_uri())
        self._env.enter_context(temporary_env(ENV_WHILE_OPEN))
        logging.getLogger(_QUEUE_LOGGER).addFilter(self._filter)

    def _start_sampler(self) -> None:
        """The system-metrics thread, once the first row is stored (see the module's docstring)."""
        self._sampler = threading.Thread(
            target=sample_system_metrics,
            args=(self.run_id, store.tracking_uri(), self._system_metrics_s, self._stop_sampling),
            daemon=True,
            name="system-metrics",
        )
        self._sampler.start()

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        if not self.on:
            return
        # The row as it is (a shallow copy): unpacking it into Metric objects waits for the flush.
        self.rows.append((step, int(time.time() * 1000), dict(metrics)))
        if self._sampler is None and self._system_metrics_s > 0:
            self._settle()  # the first row is in the store before any system metric
            self._start_sampler()
        elif time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self, force: bool = False) -> None:
        """Hand the held rows to MLflow's queue, with the refused values before them when it is
        time to try those again (`force`: now)."""
        if not self.on:
            return
        from mlflow.entities import Metric

        self._collect()
        new = [
            Metric(name, float(v), ts, step)
            for step, ts, row in self.rows
            for k, v in row.items()
            if isinstance(v, (int, float)) and math.isfinite(v)  # MLflow rejects NaN / inf
            if (name := mlflow_key(k)) is not None
        ]
        # The curves first: the store lists a run's metrics in the order it first saw them, and
        # so do the run page's Metrics table and the compare page's default plot (loss, not a
        # gradient counter). Stable: each curve's points keep their order.
        new.sort(key=lambda m: not m.key.startswith(CURVES_PREFIX))
        self.rows, self.last_flush = [], time.monotonic()
        self.sent += len(new)
        if self.refused and not force and time.monotonic() - self.last_try < RETRY_S:
            self.refused += new  # the store is away: wait with the rest
            return
        if self.refused:
            self.last_try = time.monotonic()
        todo, self.refused = self.refused + new, []
        # Chunked here, not by MLflow's client (which would split as well): one call, one future
        # and one set of values each, so a refused call puts back exactly its own values.
        for i in range(0, len(todo), BATCH_LIMIT):
            chunk = todo[i : i + BATCH_LIMIT]
            ops = self.client.log_batch(self.run_id, metrics=chunk, synchronous=False)
            # RunOperations: MLflow documents it as holding the calls' concurrent.futures.
            self.inflight.append((list(ops._operation_futures), chunk))

    def _collect(self) -> None:
        """Move the values of finished calls the store refused to `refused`."""
        running = []
        for futures, chunk in self.inflight:
            if not all(f.done() for f in futures):
                running.append((futures, chunk))
                continue
            errors = (f.exception() for f in futures)
            error = next((e for e in errors if e is not None), None)
            if error is not None:
                self.refused += chunk
                self.reason = redact_text(f"{type(error).__name__}: {error}")[:500]
        self.inflight = running

    def _settle(self) -> None:
        """Send everything and wait until each call has its outcome (one try per call: at most
        the HTTP timeout while the store is away)."""
        self.flush(force=True)
        concurrent.futures.wait([f for futures, _ in self.inflight for f in futures])
        self._collect()

    def _keep_on_disk(self) -> dict | None:
        """The pending file holds exactly the values not stored; returns the pending status."""
        if not self.refused:
            self.pending_file.unlink(missing_ok=True)
            return None
        write_pending(self.pending_file, self.refused)
        return {"pending": len(self.refused), "file": str(self.pending_file), "reason": self.reason}

    def sync(self) -> None:
        """Before a checkpoint: every value so far is in the store, or in the pending file."""
        if not self.on:
            return
        self._settle()
        status = self._keep_on_disk()
        if status and not self.outage:
            log.warning(
                "the MLflow store is not taking metrics (%s): training goes on; %d values are kept in %s and "
                "sent when it answers again",
                status["reason"],
                status["pending"],
                status["file"],
            )
        elif self.outage and not status:
            log.info("the MLflow store answers again: the %d kept metric values are stored", self.outage["pending"])
        self.outage = status

    def __enter__(self) -> "MetricBuffer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.on:
            return
        try:
            self._stop_sampling.set()
            if self._sampler is not None:
                self._sampler.join(timeout=30)  # its last sample, written before the final flush
            self._settle()
            for _ in range(FINAL_TRIES):
                if not self.refused:
                    break
                time.sleep(FINAL_PAUSE_S)
                self._settle()
            if self._keep_on_disk():
                log.warning(
                    "the MLflow store did not take %d metric values (%s); they are kept in %s: once the store "
                    "answers, run `python -m pipeline.tracking.replay`",
                    len(self.refused),
                    self.reason,
                    self.pending_file,
                )
            elif self.outage:
                log.info("the MLflow store answers again: the kept metric values are stored")
        except Exception as e:  # noqa: BLE001
            if exc_type is None:
                raise
            # Already failing: say what was lost, but never hide the original error.
            log.warning("could not store the last telemetry rows in MLflow: %s", e)
        finally:
            logging.getLogger(_QUEUE_LOGGER).removeFilter(self._filter)
            self._env.close()


def sample_system_metrics(run_id: str, uri: str, interval: float, stop: threading.Event) -> None:
    """MLflow's system-metrics collectors (CPU, memory, disk, network; NVIDIA GPUs through
    pynvml, AMD through pyrsmi, when present), sampled now, every `interval` seconds and once more
    when `stop` is set, and logged under their metric_names keys (`machine/cpu_percent`, ...; the
    rest is left out). Not MLflow's public switch (start_run(log_system_metrics=True) with
    set_system_metrics_sampling_interval): its sampler thread starts with the run, before the first
    row; it publishes only after a full interval and drops the last partial one (a smoke run trains
    for well under a second and would get no sample at all); and it names every value `system/...`
    (the run page would list those first). So the monitor's public methods (collect, aggregate,
    clear) are driven here and the values logged under our keys."""
    from mlflow.entities import Metric
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from mlflow.tracking import MlflowClient

    dropped = 0

    def sample(step: int) -> None:
        nonlocal dropped
        try:
            monitor.collect_metrics()
            values = monitor.aggregate_metrics()
            for part in monitor.monitors:
                part.clear_metrics()
            now = int(time.time() * 1000)
            named = ((mlflow_key(f"system/{k}"), v) for k, v in values.items())
            client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in named if k is not None])
        except Exception as e:  # noqa: BLE001 - context, not telemetry: a sample the store refused is dropped
            dropped += 1
            if dropped == 1:
                log.warning("a system-metrics sample was dropped (%s: %s); sampling goes on", type(e).__name__, e)

    try:
        client = MlflowClient(uri)
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, tracking_uri=uri)
        step = next_sample_step(client, run_id)
        while True:
            sample(step)
            step += 1
            if stop.wait(interval):
                break
        sample(step)
    except Exception as e:  # noqa: BLE001 - system metrics are context: never stop the run for them
        log.warning("system metrics stopped: %s: %s", type(e).__name__, e)


def next_sample_step(client, run_id: str) -> int:
    """A resumed run's samples continue its step count instead of restarting at 0."""
    steps = [m.step for m in client.get_metric_history(run_id, CPU_KEY)]  # a sample every few seconds: short
    return max(steps) + 1 if steps else 0
