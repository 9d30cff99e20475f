"""`./dev ui [PORT]`: the MLflow UI on 127.0.0.1 over the project's store, and its links once it
answers.

    python -m tools.ui [PORT] [--start-timeout S] [--workers N] [--baseline SPEC]

One process: it starts `mlflow ui` in a kept process group (tools/servers.py: the server and its
uvicorn end with this process, however it ends), waits until the server answers /health, brings
the model experiment up to date (its kind and saved views, tools/ui_link.py) and only then prints
the links, so a link that is printed opens. Then it brings the arms up to date (every arm of the
model experiment against the baseline of record, tools/arms.py) and prints their table's link and
the decisions' (pipeline/tracking/decisions.py). Then it stays in the foreground until the server
exits or Ctrl-C stops both. One uvicorn worker unless --workers says more: one researcher's
browser needs no more, and MLflow's default of 4 held 1.5 GB on a 2-core machine. A server that
exits before it answers gives its exit status; one that does not answer within --start-timeout
seconds is stopped, with one line saying so (exit 1)."""

from __future__ import annotations

import argparse
import sys
import time

from pipeline.core.errors import PipelineError
from tools.servers import SERVER_ENV, SERVER_START_TIMEOUT, http_error, run_in_foreground

POLL_S = 0.2


def wait_until_answering(proc, url: str, timeout: float) -> bool:
    """True once `url` answers HTTP 200; False if `proc` exits first; PipelineError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if http_error(url) is None:
            return True
        if time.monotonic() > deadline:
            raise PipelineError(
                f"the MLflow UI did not answer {url} within {timeout:g} s; stopped it (a slow machine: "
                "raise the wait with ./dev ui PORT --start-timeout S)"
            )
        time.sleep(POLL_S)
    return False


def tables(base: str, baseline: str) -> list[str]:
    """The arms brought up to date (a line saying what was done, or why not: the UI serves
    without them), and the links to the arms' and the decisions' tables where they exist."""
    from mlflow.exceptions import MlflowException

    from tools.arms import update
    from tools.ui_link import table_links

    try:
        lines = [f"arms: {update(baseline)}"]
    except (PipelineError, MlflowException, OSError) as e:
        lines = [f"arms: not brought up to date: {e}"]
    return lines + table_links(base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("port", nargs="?", type=int, default=5000, help="loopback port (default 5000)")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=SERVER_START_TIMEOUT,
        metavar="S",
        help=f"seconds to wait for the server to answer (default {SERVER_START_TIMEOUT:g})",
    )
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="uvicorn workers (default 1)")
    parser.add_argument(
        "--baseline",
        default="HEAD",
        metavar="SPEC",
        help="the baseline of record the arms are compared with (default HEAD: the committed run; any ./dev compare "
        "side)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535 or args.start_timeout <= 0 or args.workers < 1:
        parser.error(
            f"port {args.port}, --start-timeout {args.start_timeout}, --workers {args.workers}: expected a port "
            "1-65535, S > 0 and N >= 1"
        )
    import os

    from pipeline.tracking import store as tracking

    uri, root = tracking.tracking_uri(), tracking.project_root()
    base = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(args.port)]
    command += ["--backend-store-uri", uri, "--default-artifact-root", str(root / "mlruns")]
    command += ["--workers", str(args.workers)]

    def started(proc) -> None:
        print(f"[dev] starting the MLflow UI over {uri} (its links follow once it answers)", file=sys.stderr)
        import mlflow  # noqa: F401  (imported while the server starts: seconds, on another core)

        from tools.ui_link import links

        if not wait_until_answering(proc, f"{base}/health", args.start_timeout):
            return  # it exited: its own output says why, its status is this command's
        runs, arms = links(base)  # (after the server's start: it creates a new store's tables)
        print(f"[dev] MLflow UI at {base} (Ctrl-C stops it). The model runs, with their eval columns:", file=sys.stderr)
        print(f"[dev]   {runs}", file=sys.stderr)
        print(
            "[dev] The same, replicates (runs that differ only in the seed) grouped by arm, with their count:",
            file=sys.stderr,
        )
        print(f"[dev]   {arms}", file=sys.stderr, flush=True)
        for line in tables(base, args.baseline):
            print(f"[dev] {line}", file=sys.stderr, flush=True)

    try:
        return run_in_foreground(command, {**os.environ, **SERVER_ENV}, started)
    except PipelineError as e:
        print(f"ui: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the server started: the group is ended already
        return 130


if __name__ == "__main__":
    sys.exit(main())
