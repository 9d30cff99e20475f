"""Ask the trained model: each question's top-k answers from the answer bank, with their scores.

    ./dev ask "What is the capital of France?" ["Another question?" ...] [-k N] [--model URI]
    python -m tools.ask ...            # the same, with the environment already active

The model is the answer model the pipeline logs to the model's run (pipeline/serve/: the teacher embeds the
question, the energy-flow model maps it, the nearest texts of the answer bank are the answers),
loaded in this process. By default it is the model of the run that runs/train.json names (the
last train stage here): the answer model the evaluate stage logged to that run,
`models:/<model_id>` in the project's store (mlflow.db at the repository root, or
MLFLOW_TRACKING_URI). When the evaluate stage recorded that model's local
directory (runs/evaluate.json) and the model's code is this checkout's, it is loaded from there
without MLflow (pipeline/serve/local_model.py: no store lookup, no copy, the same checks of its
bank and teacher); a local --model directory is loaded the same way. Otherwise it goes through
mlflow.pyfunc.load_model. --model takes any MLflow model URI
(models:/<model_id>, runs:/<run_id>/<model name>, a local directory made with
pipeline.serve.log.save_answer_model). Scores are cosines between the model's prediction and each
answer's teacher vector (1 = same direction), best first, one answer per fact. A question whose
top answer is not confident (the rule the evaluate stage calibrated on val: docs/serving.md) is
answered with "no confident answer (why); best guesses:" before its answers; a model logged
before answers carried a confidence says its confidence is unknown. A question longer than the teacher's
window (its max_seq_length tokens) is answered from its beginning, and says so.

Many questions are asked in batches (a multiple of the model's train.batch_size, so the answers
are those of one request, within the serving row limit), each batch's answers printed as it is
done, with a progress bar on a terminal. The questions are checked before the model loads (the
length limit, ENERGY_FLOW_SERVE_MAX_QUESTION_CHARS). A model stored elsewhere is downloaded into
a temporary directory that is removed afterwards, whatever happens.

Exit status: 0 answered; 2 nothing to ask with (no trained model yet, a run without the answer
model, a model that is not an answer model) or a request the model refused, with one line saying
what to do; 130 stopped by Ctrl-C (the answers printed so far stand, and a line says how many).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from pipeline.core.errors import PipelineError

# Defaults main() sets before MLflow and transformers are imported (not at import: importing changes
# nothing): their download and weight-loading progress bars would bury the answers, and the
# bundled teacher loads from its package.
QUIET_ENV = dict(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false", HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_OFFLINE="1")
ANSWER_LOADER = "mlflow.pyfunc.loaders.code_model"


def train_run() -> dict:
    """The run runs/train.json names (the last train stage here), or, with no such file (a fresh
    clone that pulled the model with `dvc pull`: runs/ is not in git), the store's run whose tag
    train.model_sha256 is the workspace model file's digest."""
    from pipeline.tracking import store as tracking

    path = tracking.run_file("train")
    if not path.is_file():
        return _train_run_of_pulled_model(path)
    info = tracking.read_run_file("train")
    if not info["run_id"]:  # written by a version that recorded untracked runs too
        raise PipelineError(
            f"{path} names no MLflow run: the train run it records had tracking off (run.tracking=disabled, or "
            "optional with no server), so no answer model was logged; run ./dev repro with tracking on, or pass "
            "--model URI"
        )
    return info


def _train_run_of_pulled_model(missing: Path) -> dict:
    """The run that trained the workspace's model file, found in the tracking store by its digest.
    The model's bits are the link, not a pointer file: DVC outputs are the same bits for the same
    inputs, so a run id written into one would make every retrain a change, and the tag is what
    every train run carries (stages/train.py)."""
    from pipeline.core.output_dirs import DVC_OUTPUTS
    from pipeline.data.shards import sha256_file
    from pipeline.tracking import store as tracking
    from pipeline.tracking.redact import redact_text

    model = tracking.project_root() / DVC_OUTPUTS["train.out_dir"] / "model.pt"
    if not model.is_file():
        raise PipelineError(
            f"no trained model yet ({missing} and {model} do not exist: the train stage writes them): run ./dev "
            "repro first, `dvc pull` a pushed one (with the team's MLFLOW_TRACKING_URI set), or pass --model URI"
        )
    digest = sha256_file(model)
    uri = tracking.tracking_uri()
    shown = redact_text(uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        # A search would create an empty store here, and find nothing in it.
        raise PipelineError(
            f"{missing} does not exist and there is no tracking store at {shown} to find the run of {model} in: "
            "set MLFLOW_TRACKING_URI to the store the model was trained against (the team's server), or pass "
            "--model URI"
        )
    try:
        run_id = tracking.find_run_by_tag("train.model_sha256", digest)
    except Exception as e:  # noqa: BLE001 - an unreachable server or an unreadable store: one line
        raise PipelineError(
            f"could not look up the run of {model} in the tracking store {shown}: {type(e).__name__}: "
            f"{redact_text(str(e))}"
        ) from None
    if not run_id:
        raise PipelineError(
            f"{missing} does not exist and no run in the tracking store {shown} has tag train.model_sha256 = "
            f"{digest[:12]}... (the digest of {model}): set MLFLOW_TRACKING_URI to the store the model was trained "
            "against, run ./dev repro to train here, or pass --model URI"
        )
    return {"run_id": run_id, "model_sha256": digest}


def default_model_uri() -> tuple[str, str]:
    """(models:/<model_id>, tracking URI) of the answer model of the last train run here (the
    newest the run holds), checked in the store, or an error saying what to do when there is none.
    Not runs:/<run_id>/model: MLflow resolves that by the logged model's name, which is the
    run's own (pipeline.serve.log.model_name)."""
    from pipeline.tracking import store as tracking
    from pipeline.tracking.redact import redact_text

    info, path = train_run(), tracking.run_file("train")
    named = f"which {path} names" if path.is_file() else "found by its model file's digest"
    uri = tracking.tracking_uri()
    recorded = info.get("tracking_uri")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(uri).get_run(info["run_id"])
    except MlflowException:
        elsewhere = f" ({path} says it was logged to {recorded}: set MLFLOW_TRACKING_URI to it)" if recorded else ""
        raise PipelineError(
            f"run {info['run_id']}, {named}, is not in the tracking store {redact_text(uri)}{elsewhere}; "
            "run ./dev repro to train and log a model here, or pass --model URI"
        ) from None
    model_id = run_model_id(MlflowClient(uri), info["run_id"])
    if not model_id:
        raise PipelineError(
            f"run {info['run_id']}, {named}, holds no logged answer model (the evaluate stage logs it): "
            "run ./dev repro, or pass --model URI"
        )
    return f"models:/{model_id}", uri


def run_model_id(client, run_id: str) -> str:
    """The id of the newest model logged to the run ("" if none): an evaluate run again logs a
    new one."""
    outputs = client.get_run(run_id).outputs
    models = (outputs.model_outputs if outputs else None) or []
    if not models:
        return ""
    return max(models, key=lambda o: client.get_logged_model(o.model_id).creation_timestamp).model_id


def recorded_model_dir(train: dict) -> tuple[Path | None, str]:
    """(the local directory of `train`'s answer model, as the evaluate stage recorded it in
    runs/evaluate.json, "") or (None, why there is none to use)."""
    from pipeline.core.stage_outputs import read_json
    from pipeline.tracking import store as tracking

    path = tracking.run_file("evaluate")
    if not path.is_file():
        return None, f"{path} does not exist"
    try:
        rec = read_json(path, "evaluate")
    except PipelineError as e:
        return None, str(e)
    if rec.get("run_id") != train["run_id"]:
        return None, f"{path} is of another run than {tracking.run_file('train')}"
    if tracking.recorded_store(rec) != tracking.store_key():
        return None, f"{path} is of another tracking store"
    model_dir = rec.get("model_dir")
    if not isinstance(model_dir, str) or not model_dir:
        return None, "the store keeps the model elsewhere"
    # Relative: inside the project (pipeline/serve/log.py), wherever the checkout is now.
    found = tracking.project_root() / model_dir
    if not found.is_dir():
        return None, "the store keeps the model elsewhere"
    return found, ""


def local_model(given: str | None):
    """(LocalModel, the name to show) when the model to ask can be loaded without MLflow (see the
    module's docstring), else (None, why not)."""
    from pipeline.serve.local_model import open_local

    if given is None:
        train = train_run()
        path, why = recorded_model_dir(train)
        if path is None:
            return None, why
        model, why = open_local(path)
        if model is None:
            return None, why
        if model.run_id != train["run_id"]:
            return None, f"{path} holds the model of run {model.run_id}"
        recorded = train.get("model_sha256")
        if recorded and model.metadata.get("model_sha256") != recorded:
            return None, f"{path} holds another model file than the train run's"
        return model, f"models:/{model.model_id}" if model.model_id else f"run {train['run_id']}'s model"
    if given.startswith("file://"):
        given = urllib.parse.unquote(urllib.parse.urlparse(given).path)
    elif ":/" in given:  # runs:/, models:/, a remote artifact URI
        return None, "it is not a local directory"
    path = Path(given)
    if not (path / "MLmodel").is_file():
        return None, "it is not a local model directory"
    model, why = open_local(path)
    return (model, given) if model is not None else (None, why)


def check_answer_model(uri: str, name: str | None = None):
    """The model at `uri` (a local directory, as pipeline.serve.local_copy.model_dir gives) exists
    and is an answer model (text in, text out), read from its MLmodel alone: loading an
    embedding-to-embedding model only to fail on the first question is slow and says little.
    `name`: the URI the user gave, for the messages. Returns the MLmodel (mlflow Model)."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    name = name or uri
    try:
        # Model.load reads MLmodel alone (get_model_info would also look the model's id up in the
        # tracking store, which a downloaded model directory's id is not in).
        info = Model.load(uri)
    except (MlflowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(
            f"no MLflow model at {name} ({first}); expected the answer model the evaluate stage logs to the "
            "model's run (models:/<model id>, as `./dev ask` with no --model finds it, or runs:/<run id>/<model "
            "name>: the name is `<preset>-<run name>-<run id's first 8>`, docs/serving.md), a directory made with "
            "mlflow.pyfunc.save_model, or run ./dev repro to log one"
        ) from None
    loader = (info.flavors.get("python_function") or {}).get("loader_module")
    schema = info.signature.inputs if info.signature else None
    inputs = [] if schema is None or schema.is_tensor_spec() else schema.input_names()
    if loader != ANSWER_LOADER or "question" not in inputs:
        takes = f"columns {inputs}" if inputs else "a tensor of embeddings" if schema is not None else "no signature"
        raise PipelineError(
            f"{name} is not an answer model (it takes {takes}; loader {loader}): it was "
            "logged before the model answered questions (an embedding-to-embedding model); re-run the evaluate "
            "stage, which logs the answer model to the model's run (./dev repro -f evaluate), or pass --model URI"
        )
    return info


UNKNOWN = (
    "(confidence unknown: the model was logged before answers said whether they are confident; "
    "re-run the evaluate stage to log one that does)"
)


def verdict(values, confident, rule) -> str | None:
    """The line before a question's answers when its top answer is not confident (None when it is)."""
    if confident is None or (isinstance(confident, float) and confident != confident):
        return UNKNOWN
    if bool(confident):
        return None
    if rule is None or not len(values):
        return "no confident answer; best guesses:"
    top = float(values[0])
    margin = top - float(values[1]) if len(values) > 1 else float("inf")
    if rule.margin_threshold is not None and top >= rule.score_floor and len(values) < 2:
        close = f"the next fact scores within {rule.margin_threshold:.4f} of it"
        return f"no confident answer ({close}: -k 2 shows it); best guess:"
    return f"no confident answer ({rule.why_not(top, margin)}); best guesses:"


def render(
    questions: list[str], answers, scores, truncated=None, window: int | None = None, confident=None, rule=None
) -> str:
    """Each question, then its answers with their scores. `confident` (one per question, None for
    a model without a confidence rule): a question whose top answer is not confident says so,
    and why (`rule`: the model's ConfidenceRule), before its best guesses."""
    lines = []
    cut = truncated if truncated is not None else [False] * len(questions)
    sure = confident if confident is not None else [None] * len(questions)
    for q, texts, values, was_cut, ok in zip(questions, answers, scores, cut, sure):
        lines.append(f"Q: {q}")
        if was_cut:
            lines.append(f"  (truncated: the teacher read only its first {window or 'window of'} tokens of it)")
        note = verdict(values, ok, rule)
        if note:
            lines.append(f"  {note}")
        for rank, (text, score) in enumerate(zip(texts, values), 1):
            lines.append(f"  {rank}. {score:.3f}  {text}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def batch_size(train_batch_size: int, max_rows: int) -> int:
    """Questions per predict call: the largest multiple of the model's train_batch_size within the
    row limit (the model predicts in batches of train_batch_size, so the answers are those of one
    call with every question), or the row limit when one train batch exceeds it."""
    whole = (max_rows // train_batch_size) * train_batch_size if train_batch_size >= 1 else 0
    return whole or max_rows


def progress_bar(total: int, batch: int, stream):
    """A tqdm bar over the questions, on `stream`, shown only when there is more than one batch
    and `stream` is a terminal (a log or a pipe gets the answers alone)."""
    from tqdm.auto import tqdm

    show = total > batch and stream.isatty()
    return tqdm(total=total, unit="question", desc="ask", file=stream, disable=not show, mininterval=0.5)


@dataclass
class Tally:
    total: int
    answered: int = 0


class CtrlC:
    """The SIGINT handler: KeyboardInterrupt on the first Ctrl-C, and later ones ignored (they
    would break the clean-up the first one started: the model's temporary copy). While `held`,
    a Ctrl-C waits for the block to end, so a batch is printed and counted whole. (A flag, not a
    signal mask: a process-wide signal can be delivered to any of torch's threads.)"""

    def __init__(self):
        self.holding = self.pending = False

    def __call__(self, signum, frame):
        if self.holding:
            self.pending = True
            return
        self._stop()

    @staticmethod
    def _stop():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                self._stop()


def answer_all(args, predict, meta: dict, limits, tally: Tally, ctrl_c: CtrlC) -> None:
    """Ask every question through `predict` (a DataFrame of questions, params -> the answers), a
    batch at a time, printing each batch's answers as it is done."""
    import pandas as pd

    from pipeline.answer.confidence import ConfidenceRule

    window = (meta.get("teacher_identity") or {}).get("max_seq_length")
    rule = ConfidenceRule.from_config(meta)  # the metadata records the rule as the config does
    batch = batch_size(int(meta.get("train_batch_size") or 0), limits.max_rows)
    with progress_bar(len(args.questions), batch, sys.stderr) as bar:
        for start in range(0, len(args.questions), batch):
            questions = args.questions[start : start + batch]
            out = predict(pd.DataFrame({"question": questions}), params={"k": args.k})
            # Columns a model logged before them lacks: its answers are shown without them.
            cut = out["truncated"] if "truncated" in out else None
            sure = out["confident"].tolist() if "confident" in out else None
            text = render(questions, out["answers"], out["scores"], cut, window, sure, rule)
            bar.clear()
            with ctrl_c.held():  # the count Ctrl-C reports is what was printed
                print(text + ("\n" if start + batch < len(args.questions) else ""), flush=True)
                tally.answered += len(questions)
            bar.update(len(questions))


def ask(args, tally: Tally, ctrl_c: CtrlC) -> int:
    from pipeline.serve.request import Limits, check_question
    from pipeline.tracking import store as tracking

    limits = Limits.from_env()
    for i, q in enumerate(args.questions):  # before anything loads
        check_question(q, f"question {i + 1}", limits)
    model, why = local_model(args.model)
    if model is not None:
        from pipeline.serve.local_model import load_local

        print(f"[ask] loading {why} from {model.path}", file=sys.stderr)
        digests = tracking.project_root() / ".cache" / "teacher-weights-digest.json"  # the teacher's, kept between runs
        answer_all(args, load_local(model, digests).answer, model.metadata, limits, tally, ctrl_c)
        return 0
    import mlflow

    from pipeline.serve.local_copy import model_dir

    store = tracking.tracking_uri()  # where runs:/ and models:/ URIs are looked up
    mlflow.set_tracking_uri(store)
    uri = args.model or default_model_uri()[0]
    where = f" (store {store})" if uri.startswith(("runs:/", "models:/")) else ""
    with model_dir(uri) as path:
        meta = check_answer_model(str(path), uri).metadata or {}
        print(f"[ask] loading {uri}{where} through MLflow ({why})", file=sys.stderr)
        model = mlflow.pyfunc.load_model(str(path))
        answer_all(args, model.predict, meta, limits, tally, ctrl_c)
    return 0


def user_error(e: Exception) -> str | None:
    """The one line for an error a user can act on (the pipeline's, or a refusal by MLflow or by
    the model), None for any other. MLflow's exception class is looked up only where MLflow was
    imported: an error raised without it is not MLflow's."""
    if isinstance(e, PipelineError):
        return str(e)
    exceptions = sys.modules.get("mlflow.exceptions")
    if exceptions is not None and isinstance(e, exceptions.MlflowException):
        return e.message
    return None


def main(argv: list[str] | None = None) -> int:
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    ap = argparse.ArgumentParser(
        prog="./dev ask", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("questions", nargs="+", metavar="QUESTION", help="one or more questions (quote each)")
    ap.add_argument("-k", type=int, default=5, help="answers per question (default 5)")
    ap.add_argument(
        "--model",
        metavar="URI",
        help="an MLflow model URI or local directory (default: models:/<model_id> of runs/train.json's run)",
    )
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"-k {args.k}: expected 1 or more answers per question")
    tally = Tally(len(args.questions))
    ctrl_c = CtrlC()
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        try:
            return ask(args, tally, ctrl_c)
        except Exception as e:
            message = user_error(e)
            if message is None:
                raise
            print(f"ask: {message}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        so_far = "; their answers are above" if tally.answered else ""
        print(
            f"\nask: stopped (Ctrl-C) after answering {tally.answered} of {tally.total} questions{so_far}",
            file=sys.stderr,
        )
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def exit_now(rc: int) -> NoReturn:
    """Ends the process with status `rc` as sys.exit would, less the interpreter's teardown
    (freeing every module of torch and transformers one by one: about a second of CPU, more
    wall on a busy machine, after the answers are out): stdout and stderr are flushed and the
    atexit handlers run (logging's flush, a temporary directory's removal), then os._exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: Python's own exit says 120
            rc = rc or 120
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(rc)


if __name__ == "__main__":
    exit_now(main())
