"""Ask the trained model: each question's top-k answers from the answer bank, with their scores.

    ./dev ask "What is the capital of France?" ["Another question?" ...] [-k N] [--model URI]
    python -m tools.ask ...            # the same, with the environment already active

The model is the answer model the pipeline logs to the model's run (pipeline/serve/: the teacher embeds the
question, the energy-flow model maps it, the nearest texts of the answer bank are the answers),
loaded in this process with mlflow.pyfunc.load_model. By default it is the model of the run that
runs/train.json names (the last train stage here), `runs:/<run_id>/model` in the project's store
(mlflow.db at the repository root, or MLFLOW_TRACKING_URI). --model takes any MLflow model URI
(runs:/<run_id>/model, models:/<model_id>, a local directory made with
pipeline.serve.log.save_answer_model). Scores are cosines between the model's prediction and each
answer's teacher vector (1 = same direction), best first.

Exit status: 0 answered; 2 nothing to ask with (no trained model yet, a run without the answer
model, a model that is not an answer model) or a request the model refused, with one line saying
what to do.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before MLflow and transformers are imported: their download and weight-loading progress bars
# would bury the answers.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled teacher loads from its package

from pipeline.core.errors import PipelineError  # noqa: E402

ANSWER_LOADER = "mlflow.pyfunc.loaders.code_model"


def default_model_uri() -> tuple[str, str]:
    """(runs:/<run_id>/model, tracking URI) of the last train run here, or an error saying what to
    do when there is none."""
    from pipeline.tracking import store as tracking

    path = tracking.run_file("train")
    if not path.is_file():
        raise PipelineError(
            f"no trained model yet ({path} does not exist: the train stage writes it): run ./dev repro first, "
            "or pass --model URI"
        )
    info = tracking.read_run_file("train")
    if not info["run_id"]:  # written by a version that recorded untracked runs too
        raise PipelineError(
            f"{path} names no MLflow run: the train run it records had tracking off (run.tracking=disabled, or "
            "optional with no server), so no answer model was logged; run ./dev repro with tracking on, or pass "
            "--model URI"
        )
    uri = tracking.tracking_uri()
    recorded = info.get("tracking_uri")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(uri).get_run(info["run_id"])
    except MlflowException:
        elsewhere = f" ({path} says it was logged to {recorded}: set MLFLOW_TRACKING_URI to it)" if recorded else ""
        raise PipelineError(
            f"run {info['run_id']}, which {path} names, is not in the tracking store {uri}{elsewhere}; "
            "run ./dev repro to train and log a model here, or pass --model URI"
        ) from None
    return f"runs:/{info['run_id']}/model", uri


def check_answer_model(uri: str) -> None:
    """The model at `uri` exists and is an answer model (text in, text out), read from its MLmodel
    alone: loading an embedding-to-embedding model only to fail on the first question is slow
    and says little."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    try:
        # Model.load reads MLmodel alone (get_model_info would also look the model's id up in the
        # tracking store, which a downloaded model directory's id is not in).
        info = Model.load(uri)
    except (MlflowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PipelineError(
            f"no MLflow model at {uri} ({first}); expected the answer model the pipeline logs as `model` "
            "(run ./dev repro), or a --model URI that holds one"
        ) from None
    loader = (info.flavors.get("python_function") or {}).get("loader_module")
    schema = info.signature.inputs if info.signature else None
    inputs = [] if schema is None or schema.is_tensor_spec() else schema.input_names()
    if loader != ANSWER_LOADER or "question" not in inputs:
        takes = f"columns {inputs}" if inputs else "a tensor of embeddings" if schema is not None else "no signature"
        raise PipelineError(
            f"{uri} is not an answer model (it takes {takes}; loader {loader}): it was "
            "logged before the model answered questions (an embedding-to-embedding model); re-run the evaluate "
            "stage, which logs the answer model to the model's run (./dev repro -f evaluate), or pass --model URI"
        )


def render(questions: list[str], answers, scores) -> str:
    lines = []
    for q, texts, values in zip(questions, answers, scores):
        lines.append(f"Q: {q}")
        for rank, (text, score) in enumerate(zip(texts, values), 1):
            lines.append(f"  {rank}. {score:.3f}  {text}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="./dev ask", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("questions", nargs="+", metavar="QUESTION", help="one or more questions (quote each)")
    ap.add_argument("-k", type=int, default=5, help="answers per question (default 5)")
    ap.add_argument(
        "--model",
        metavar="URI",
        help="an MLflow model URI or local directory (default: runs:/<run_id>/model of runs/train.json's run)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"-k {args.k}: expected 1 or more answers per question")
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    try:
        from pipeline.tracking import store as tracking

        store = tracking.tracking_uri()  # where runs:/ and models:/ URIs are looked up
        mlflow.set_tracking_uri(store)
        uri = args.model or default_model_uri()[0]
        where = f" (store {store})" if uri.startswith(("runs:/", "models:/")) else ""
        check_answer_model(uri)
        print(f"[ask] loading {uri}{where}", file=sys.stderr)
        model = mlflow.pyfunc.load_model(uri)
        out = model.predict(pd.DataFrame({"question": args.questions}), params={"k": args.k})
    except (PipelineError, MlflowException) as e:
        print(f"ask: {e.message if isinstance(e, MlflowException) else e}", file=sys.stderr)
        return 2
    print(render(args.questions, out["answers"], out["scores"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
