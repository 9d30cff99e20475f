"""A small MLflow SQLite store with what the project's stores hold, for the tests of copying a
store (tools/team/copy_store.py): two experiments (one with a saved view as an experiment tag),
an embed run with a dataset input, a train run with 150 params (more than one log_batch takes),
MLflow's source tags, metric histories (a NaN among them), a dataset input with its context
tag, artifacts in a folder, and a logged model (params, tags, metrics tied to a dataset, an
MLmodel file naming its ids) as the run's output; a child run of it, a failed run, and a
deleted run that must not be copied."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.tracking.store import artifact_location
from pipeline.tracking.views import VIEW_TAG, view_state

START = 1_700_000_000_000  # ms: fixed times, so that a copy that kept "now" instead shows


def make_small_store(folder: Path) -> tuple[str, dict[str, str]]:
    """The store's URI (sqlite:///folder/mlflow.db, artifacts in folder/mlruns) and the ids of its
    runs by role (embed, train, child, failed, deleted) and of its model (model)."""
    from mlflow import MlflowClient
    from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelOutput, Metric, Param, RunTag

    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    where = artifact_location(uri)
    models_exp = client.create_experiment(
        "energy-flow", artifact_location=where, tags={VIEW_TAG: json.dumps(view_state()), "team": "qa"}
    )
    embed_exp = client.create_experiment("energy-flow-embed", artifact_location=where)
    source_tags = {"mlflow.user": "alice", "mlflow.source.name": "stages/train.py", "mlflow.source.type": "LOCAL"}

    def dataset(name: str, digest: str, context: str) -> DatasetInput:
        """As the stages log theirs: a local source, a schema, a profile, the context tag."""
        data = Dataset(
            name=name,
            digest=digest,
            source_type="local",
            source=json.dumps({"uri": f"data/raw/{name}"}),
            schema=json.dumps({"mlflow_colspec": [{"type": "string", "name": "question"}]}),
            profile=json.dumps({"num_rows": 2}),
        )
        return DatasetInput(data, [InputTag("mlflow.data.context", context), InputTag("rows", "2")])

    ids = {}
    embed = client.create_run(embed_exp, start_time=START, tags={**source_tags, "stage": "embed"}, run_name="embed-1")
    ids["embed"] = embed.info.run_id
    client.log_batch(
        ids["embed"], metrics=[Metric("embed/texts", 2.0, START + 5, 0)], params=[Param("teacher", "bundled")]
    )
    client.log_inputs(ids["embed"], datasets=[dataset("qa_pairs.csv", "f3f0898c", "embed")])
    client.set_terminated(ids["embed"], "FINISHED", end_time=START + 10_000)

    train = client.create_run(
        models_exp,
        start_time=START + 20_000,
        tags={**source_tags, "stage": "train", "embed.run_id": ids["embed"]},
        run_name="default",
    )
    run_id = ids["train"] = train.info.run_id
    params = [Param(f"train.p{i:03d}", str(i * 0.5)) for i in range(150)]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start : start + 100])
    losses = [Metric("train/loss", 1.0 / (s + 1), START + 21_000 + s * 7, s) for s in range(40)]
    losses.append(Metric("train/grad_norm", float("nan"), START + 21_500, 3))
    losses += [Metric("train/grad_norm", 0.5 + s, START + 21_000 + s, s) for s in range(3)]
    client.log_batch(run_id, metrics=losses, tags=[RunTag("arm", "lr=0.003"), RunTag("stability.verdict", "stable")])
    client.log_inputs(run_id, datasets=[dataset("qa_pairs.csv shards", "6dbbb471", "training")])

    notes = folder / "upload"
    (notes / "train").mkdir(parents=True)
    (notes / "train" / "train.json").write_text('{"loss": 0.025}\n')
    (notes / "summary.txt").write_text("trained\n")
    client.log_artifacts(run_id, str(notes))

    model = client.create_logged_model(
        models_exp,
        name="model",
        source_run_id=run_id,
        tags={"mlflow.user": "alice", "flavor": "pyfunc"},
        params={"dim": "384", "bank_size": "2"},
        model_type=None,  # as the project's answer model (a server's API gives it back as "")
    )
    ids["model"] = model.model_id
    files = folder / "model-files"
    files.mkdir()
    (files / "MLmodel").write_text(
        f"artifact_path: {model.artifact_location}\nmodel_id: {model.model_id}\nrun_id: {run_id}\n"
        "flavors:\n  python_function:\n    loader_module: answerer\n"
    )
    (files / "weights.bin").write_bytes(bytes(range(256)) * 4)
    client.log_model_artifacts(model.model_id, str(files))
    scored = [
        Metric(
            "eval/test/model/group_top1",
            0.62,
            START + 30_000,
            0,
            model_id=model.model_id,
            dataset_name="qa_pairs.csv shards",
            dataset_digest="6dbbb471",
        ),
        Metric("eval/test/model/cosine", 0.81, START + 30_000, 0, model_id=model.model_id),
    ]
    client.log_batch(run_id, metrics=scored)
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=39)])
    client.set_terminated(run_id, "FINISHED", end_time=START + 40_000)

    child = client.create_run(
        models_exp, start_time=START + 25_000, tags={"mlflow.parentRunId": run_id, "seed": "1"}, run_name="seed-1"
    )
    ids["child"] = child.info.run_id
    client.log_metric(ids["child"], "train/loss", 0.5, timestamp=START + 26_000, step=0)
    client.set_terminated(ids["child"], "FINISHED", end_time=START + 27_000)

    failed = client.create_run(models_exp, start_time=START + 50_000, run_name="diverged")
    ids["failed"] = failed.info.run_id
    client.log_metric(ids["failed"], "train/loss", float("inf"), timestamp=START + 51_000, step=0)
    client.set_terminated(ids["failed"], "FAILED", end_time=START + 52_000)

    deleted = client.create_run(models_exp, start_time=START + 60_000, run_name="thrown-away")
    ids["deleted"] = deleted.info.run_id
    client.delete_run(ids["deleted"])
    return uri, ids
