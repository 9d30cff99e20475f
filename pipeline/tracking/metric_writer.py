"""The tracking sidecar: a child process that writes the train stage's telemetry rows to MLflow
(log_batch, up to 1000 values a call) and samples its system metrics, so that neither competes
with training for the interpreter.

Why a process: MLflow's own asynchronous logging (log_batch with synchronous=False) writes from
threads of the training process. SQLAlchemy's inserts are Python and hold the GIL while the
training loop needs it: with MLflow's queue (batching a second of rows) and its system-metrics
sampler, a step of the smoke model (a row of 35 values every 2 steps of ~12 ms) took 1.23x as
long, against 1.015x through this sidecar; on the default model (a row every 5 steps of ~115 ms)
both stayed within 1.03x (`python -m bench.tracking`, and with `--preset default`; AMD EPYC, 2
cores; the README has the figures). Here the training process only pickles rows down a pipe and
the writing happens in another process, at a lower priority.

Protocol, over the child's stdin / stdout (pickles, in order):
  ("run", (run_id, pending_file, system_metrics_s))  first: the run to write to (the child
                     imports MLflow before it comes, and opens the store after)
  ("rows", [(step, timestamp_ms, {key: value}), ...])  write these (non-finite and non-numeric
                     values are dropped: MLflow rejects NaN/inf)
  ("sync", n)        reply ("synced", n, status) once everything before it is written, or kept:
                     status is None when the store has every value, else {"pending": values not
                     stored yet, "file": the pending file, "reason": the store's last error}
  end of input       write what is left, stop the system-metrics sampler, exit 0

A store that stops answering (a tracking server restarted, a network blip) does not stop
training: values it refuses are kept in memory and appended to a pending file (JSON lines, one
[key, value, timestamp, step] a line, fsync'd) before the next sync returns, so a checkpoint's
promise holds; they are sent again with the next rows, every few seconds while idle, and a last
time at the end. Once stored, the file is removed. One left behind (the store never came back)
is replayed by `python -m pipeline.tracking.replay`. The child talks to the store without MLflow's
own retries (7 with back-off per call, about 4 minutes by MLflow's own estimate, which would hold
every later row behind it).

The child ignores SIGINT and SIGTERM: Ctrl-C and a scheduler's SIGTERM reach the whole process
group, and the child must outlive the parent's unwinding to write the last rows. It ends when its
input closes, which also happens if the parent is killed outright (SIGKILL): the rows already
sent are written even then.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipeline.core.atomic import atomic_path
from pipeline.core.errors import PipelineError

BATCH_LIMIT = 1000  # MLflow's cap on metric values per log_batch
SYNC_TIMEOUT_S = 300.0  # a store that takes longer than this to take the buffered rows is stuck
RETRY_IDLE_S = 2.0  # with values pending and no rows coming, try the store again this often
FINAL_TRIES, FINAL_PAUSE_S = 5, 1.0  # at the end: a store back within ~5 s still gets everything
# The child's MLflow client: one attempt per call, 10 s to answer (see the module docstring).
NO_RETRY_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the directory that holds pipeline/


class MetricWriter:
    """Parent side: start the sidecar on the store at `tracking_uri`; `attach` it to its run;
    `send` rows, `sync` to wait until the store has them, `close` at the end (also on every error
    path).

    Started before the run exists (tracking.early_writer, at the top of the train stage), the
    child imports MLflow while the stage does its own set-up and opens the store once attached,
    so its start (3.4 CPU-seconds in all, bench.tracking's per_arm.sidecar.cpu_children_s) is not
    spent beside the first training steps."""

    def __init__(self, tracking_uri: str):
        env = {
            **os.environ,
            **NO_RETRY_ENV,
            "MLFLOW_TRACKING_URI": tracking_uri,
            "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH")])),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.tracking.metric_writer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.syncs = 0
        self.run_id: str | None = None

    def attach(self, run_id: str, pending_file: Path, system_metrics_s: float = 0.0) -> None:
        """The run the rows go to (once): values the store refuses wait in `pending_file`; system
        metrics are sampled every `system_metrics_s` seconds (0: none)."""
        if self.run_id is not None:
            raise ValueError(f"this metric writer already writes to run {self.run_id}")
        self.run_id = run_id
        self._put(("run", (run_id, str(pending_file), float(system_metrics_s))))

    def _put(self, message) -> None:
        try:
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise PipelineError(
                f"the MLflow metric writer (pid {self.proc.pid}) has exited with status "
                f"{self.proc.poll()}; its error is printed above"
            ) from None

    def send(self, rows: list[tuple[int, int, dict]]) -> None:
        if not rows:
            return
        if self.run_id is None:
            raise ValueError("attach the metric writer to a run before sending rows")
        self._put(("rows", rows))

    def sync(self, timeout: float = SYNC_TIMEOUT_S) -> dict | None:
        """Block until everything sent is in the store, or kept in the pending file when the store
        refuses it; return None, or the pending status (see the module docstring)."""
        self.syncs += 1
        self._put(("sync", self.syncs))
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise PipelineError(
                f"the MLflow metric writer did not confirm its writes within {timeout:g} s: "
                "is the tracking store reachable (MLFLOW_TRACKING_URI)?"
            )
        try:
            _, n, status = pickle.load(self.proc.stdout)
        except EOFError:
            raise PipelineError(
                f"the MLflow metric writer (pid {self.proc.pid}) exited with status "
                f"{self.proc.wait()}; its error is printed above"
            ) from None
        if n != self.syncs:  # replies come in order, one per sync: anything else is a bug here
            raise PipelineError(f"the MLflow metric writer answered sync {n}, expected {self.syncs}")
        return status

    def close(self, timeout: float = SYNC_TIMEOUT_S) -> None:
        """End of input: the child writes what is left and exits. Never raises; kills a child
        that does not exit in time."""
        if self.run_id is None and self.proc.poll() is None:
            self.proc.kill()  # never attached: nothing to write, and no need to wait for its import
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
    this process is still importing MLflow (seconds); None marks the end of input."""
    os.nice(10)  # background work, like the writing (this thread's own priority)
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

    dropped = 0

    def sample() -> None:
        nonlocal dropped
        try:
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
        except Exception as e:  # noqa: BLE001 - context, not telemetry: a sample the store refused is dropped
            dropped += 1
            if dropped == 1:
                print(
                    f"[metric writer] a system-metrics sample was dropped ({type(e).__name__}: {e}); sampling goes on",
                    file=sys.stderr,
                )

    try:
        # resume_logging: a resumed run's samples continue its step count instead of restarting.
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, resume_logging=True, tracking_uri=uri)
        while True:
            sample()
            if stop.wait(interval):
                break
        sample()
        monitor.mlflow_logger.flush()
    except Exception as e:  # noqa: BLE001 - system metrics are context: never stop the run for them
        print(f"[metric writer] system metrics stopped: {type(e).__name__}: {e}", file=sys.stderr)


def write_pending(path: Path, metrics: list, append: bool = False) -> None:
    """Metrics as pending-file lines, [key, value, timestamp, step] each: appended in place
    (fsync'd), or replacing the file whole (temp file, then rename)."""
    lines = [json.dumps([m.key, m.value, m.timestamp, m.step]) + "\n" for m in metrics]
    if not append:
        with atomic_path(path) as tmp:
            tmp.write_text("".join(lines), encoding="utf-8")
        return
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())


class _Pending:
    """Values the store refused, in order: in memory, and in the pending file (append-only while
    the store is away, so each flush costs what it adds; rewritten only after a partial write)."""

    def __init__(self, path: Path):
        self.path, self.items = path, []

    def keep(self, metrics: list, new: list) -> None:
        """`metrics` are now pending, of which `new` were not in the file yet (the rest are)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if len(metrics) - len(new) != len(self.items):  # part of the old backlog got stored
            write_pending(self.path, metrics)
        elif new:
            write_pending(self.path, new, append=True)
        self.items = metrics

    def clear(self) -> None:
        self.items = []
        self.path.unlink(missing_ok=True)


def _serve(inp, out) -> None:
    messages: queue.Queue = queue.Queue()
    threading.Thread(target=_read_all, args=(inp, messages), daemon=True, name="pipe-reader").start()

    import logging

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Started monitoring system metrics."
    # MLflow is imported; now wait for the run. The parent creates it (and, on a new store, the
    # store's tables): the store is opened only after that, never while it is being created.
    first = messages.get()
    if first is None:  # the parent ended (an error in its set-up) before it had a run: nothing to write
        return
    kind, payload = first
    if kind != "run":  # the parent's side (MetricWriter.send) refuses rows before attach: a bug here
        raise RuntimeError(f"the metric writer got {kind!r} before the run it writes to")
    run_id, pending_file, system_metrics_s = payload
    pending_path = Path(pending_file)
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(uri)
    # Open the store now (its engine and schema check; a store that is away is tried again by the
    # first write). With MLflow's import above, this is most of the CPU a writer spends in a run
    # (bench.tracking: per_arm.sidecar.cpu_children_s), and it is done at the priority the process
    # started with: niced from the start, it was left for the end of the run on a busy machine,
    # where the trainer's final sync then waited for all of it.
    with contextlib.suppress(Exception):
        client.get_run(run_id)
    # Background work from here on: where it competes with training for a core, training comes
    # first; the rows wait, and sync() waits for them at a checkpoint or the end. (os.nice applies
    # to this thread and the threads it starts from now on; the pipe reader niced itself.)
    os.nice(10)
    stop_sampling = threading.Event()
    sampler = None
    if system_metrics_s > 0:
        sampler = threading.Thread(
            target=_sample_system,
            args=(run_id, uri, system_metrics_s, stop_sampling),
            daemon=True,
            name="system-metrics",
        )
        sampler.start()
    pending = _Pending(pending_path)
    reason = None

    def write(new: list) -> None:
        """Store the pending values and `new` after them, in order; keep what the store refuses."""
        nonlocal reason
        todo = pending.items + new
        done = 0
        try:
            while done < len(todo):
                client.log_batch(run_id, metrics=todo[done : done + BATCH_LIMIT])
                done += len(todo[done : done + BATCH_LIMIT])
        except Exception as e:  # noqa: BLE001 - any refusal: keep the values, say why at the next sync
            reason = f"{type(e).__name__}: {e}"[:500]
            pending.keep(todo[done:], new)
            return
        if pending.items:
            pending.clear()
        reason = None

    def status() -> dict | None:
        return {"pending": len(pending.items), "file": str(pending.path), "reason": reason} if pending.items else None

    try:
        while True:
            try:
                message = messages.get(timeout=RETRY_IDLE_S if pending.items else None)
            except queue.Empty:
                write([])  # the store may be back
                continue
            if message is None:
                break
            kind, payload = message
            if kind == "rows":
                write(
                    [
                        Metric(k, float(v), ts, step)
                        for step, ts, row in payload
                        for k, v in row.items()
                        if isinstance(v, (int, float)) and math.isfinite(v)
                    ]
                )
            elif kind == "sync":
                if pending.items:
                    write([])
                pickle.dump(("synced", payload, status()), out)
                out.flush()
        for _ in range(FINAL_TRIES):
            if not pending.items:
                break
            time.sleep(FINAL_PAUSE_S)
            write([])
        if pending.items:
            print(
                f"[metric writer] the MLflow store did not take {len(pending.items)} metric values ({reason}); "
                f"they are kept in {pending.path}: once the store answers, run `python -m pipeline.tracking.replay`",
                file=sys.stderr,
            )
    finally:
        stop_sampling.set()
        if sampler is not None:
            sampler.join(timeout=60)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Replies go to the real stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, out)
    # Everything is written (each log_batch committed); skip the interpreter's teardown and
    # MLflow's exit hooks, which took ~0.4 s that the parent spends waiting for us.
    out.close()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
