"""evaluate: cosine, MSE and retrieval top-1/top-5 on val and test for the trained model and for
three baselines computed here (identity; ridge fitted on train; the same model untrained), plus a
table of decoded samples.
Adds its metrics and artifacts to the model's MLflow run."""
from __future__ import annotations

import logging
import sys

import pandas as pd

from pipeline import tracking
from pipeline.atomic import atomic_path, write_json
from pipeline.checkpoint import check_input_dim, load_model, untrained_model
from pipeline.data.shards import load_manifest, open_split
from pipeline.evaluation import evaluate_split, predict, ridge_fit, sample_table
from pipeline.paths import METRICS_DIR, REPORTS_DIR, repo_path

from ._cli import run_stage

log = logging.getLogger(__name__)

SAMPLES_CSV = REPORTS_DIR / "eval_samples.csv"


def run(cfg) -> dict:
    shard_dir, model_dir = repo_path(cfg.embed.out_dir), repo_path(cfg.train.out_dir)
    run_info = tracking.read_run_file(model_dir)
    model, payload = load_model(model_dir / "model.pt")
    check_input_dim(model_dir / "model.pt", payload, load_manifest(shard_dir), shard_dir)  # before any work
    untrained = untrained_model(payload)
    shards = {s: open_split(shard_dir, s, need_rows=why) for s, why in
              (("train", "to fit the ridge baseline on"), ("val", "to evaluate on"), ("test", "to evaluate on"))}
    w = ridge_fit(shards["train"].inputs, shards["train"].targets, cfg.evaluate.ridge_alpha)
    metrics, samples = {}, []
    for split in ("val", "test"):
        # The batch size the model trained with: max_active_flows caps flows per *batch*, so a
        # bigger batch would give each sample fewer flows than it learned with.
        pred = predict(model, shards[split].inputs, cfg.train.batch_size)
        untrained_pred = predict(untrained, shards[split].inputs, cfg.train.batch_size)
        metrics.update(evaluate_split(split, pred, shards[split], w, untrained_pred))
        if split == "test":
            samples = sample_table(shards[split], pred, cfg.evaluate.samples)
    write_json(METRICS_DIR / "eval.json", metrics)
    with atomic_path(SAMPLES_CSV) as tmp:
        pd.DataFrame(samples, columns=["id", "input", "target", "decoded", "correct"]).to_csv(tmp, index=False)
    with tracking.mlflow_run("evaluate", cfg.run.preset, run_id=run_info["run_id"],
                             tags=tracking.stage_lock_tags("train")):
        tracking.log_metrics(metrics)
        tracking.log_artifact_file(METRICS_DIR / "eval.json", "evaluate")
        tracking.log_artifact_file(SAMPLES_CSV, "evaluate")
    for split in ("val", "test"):
        if f"{split}/cosine" in metrics:
            log.info("%s: model cos %.3f top1 %.3f | untrained cos %.3f | identity cos %.3f top1 %.3f | "
                     "ridge cos %.3f top1 %.3f", split, metrics[f"{split}/cosine"], metrics[f"{split}/top1"],
                     metrics[f"baseline/untrained/{split}/cosine"],
                     metrics[f"baseline/identity/{split}/cosine"], metrics[f"baseline/identity/{split}/top1"],
                     metrics[f"baseline/ridge/{split}/cosine"], metrics[f"baseline/ridge/{split}/top1"])
    return metrics


def main(argv: list[str] | None = None) -> int:
    return run_stage("evaluate", __doc__, "run, embed.out_dir, train.out_dir, train.batch_size, evaluate", run, argv)


if __name__ == "__main__":
    sys.exit(main())
