"""Serve the answer model over REST, with the request limits in force before a body is parsed.

    ./dev serve [--model URI] [--host 127.0.0.1] [--port 5001] [--max-body-bytes N]
                [--max-rows N] [--max-question-chars N]

MLflow's scoring server (the app `mlflow models serve` runs: POST /invocations, GET /ping) with
this project's wrapper in front of it (pipeline/serve/body_limit.py): MLflow reads and parses a
request's whole body before the model sees it, and offers no bound on its size, so a body over
the limit is answered here with HTTP 413 and never read into memory. The model itself refuses a
request of too many questions or too long a question (HTTP 400), and reports a question the
teacher read only in part (`truncated`). Each refusal names its limit and how to raise it: the
flags here, or their environment variables (ENERGY_FLOW_SERVE_MAX_BODY_BYTES,
ENERGY_FLOW_SERVE_MAX_ROWS, ENERGY_FLOW_SERVE_MAX_QUESTION_CHARS); a request that runs past
MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT seconds gets a 504 that names it.

One process (uvicorn in it, one worker): Ctrl-C or SIGTERM stops it, and the model's temporary
copy goes with it. The default model is runs/train.json's run, as for ./dev ask; --model takes any
MLflow model URI or local directory. Exit status: 2 with one line when there is no model to serve
or a limit is not an integer >= 1; 130 after Ctrl-C, 143 after SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from pipeline.core.errors import PipelineError
from pipeline.serve.request import BODY_VAR, CHARS_VAR, ROWS_VAR
from tools.ask import QUIET_ENV

DEFAULT_PORT = 5001  # docs/serving.md's examples use it
LIMIT_FLAGS = {"max_body_bytes": BODY_VAR, "max_rows": ROWS_VAR, "max_question_chars": CHARS_VAR}


class Terminated(Exception):
    """SIGTERM, raised in the main thread so that the model's temporary copy is removed."""


def _on_sigterm(signum, frame):
    raise Terminated


def serve(args) -> None:
    import uvicorn
    from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
    from mlflow.pyfunc import scoring_server

    from pipeline.serve.body_limit import BodyLimit
    from pipeline.serve.local_copy import model_dir
    from pipeline.serve.request import Limits
    from pipeline.tracking import store as tracking
    from tools.ask import check_answer_model, default_model_uri

    for flag, var in LIMIT_FLAGS.items():  # the model reads them from the environment when it loads
        if getattr(args, flag) is not None:
            os.environ[var] = str(getattr(args, flag))
    limits = Limits.from_env()
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri())  # where runs:/ and models:/ URIs are looked up
    uri = args.model or default_model_uri()[0]
    with model_dir(uri) as path:
        check_answer_model(str(path), uri)
        print(f"[serve] loading {uri}", file=sys.stderr, flush=True)
        model = scoring_server.load_model_with_mlflow_config(str(path))
        timeout = MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get()
        app = BodyLimit(scoring_server.init(model), limits.max_body_bytes, timeout)
        print(
            f"[serve] http://{args.host}:{args.port}/invocations: at most {limits.max_rows} questions of "
            f"{limits.max_question_chars} characters and {limits.max_body_bytes} bytes a request, "
            f"{timeout} s each; Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./dev serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", metavar="URI", help="an MLflow model URI or local directory (default: as ./dev ask)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    for flag, var in LIMIT_FLAGS.items():
        ap.add_argument(f"--{flag.replace('_', '-')}", type=int, metavar="N", help=f"sets {var} (see above)")
    args = ap.parse_args(argv)
    for flag in LIMIT_FLAGS:
        value = getattr(args, flag)
        if value is not None and value < 1:
            ap.error(f"--{flag.replace('_', '-')} {value}: expected an integer >= 1")
    for k, v in QUIET_ENV.items():  # before MLflow and transformers are imported (serve imports them)
        os.environ.setdefault(k, v)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from mlflow.exceptions import MlflowException

        try:
            serve(args)
        except (PipelineError, MlflowException) as e:
            print(f"serve: {e.message if isinstance(e, MlflowException) else e}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("[serve] stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except Terminated:
        print("[serve] stopped (SIGTERM)", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
