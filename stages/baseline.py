"""baseline: the learned rival the evaluate stage holds the model against. An MLP of the
energy-flow model's parameter count (pipeline/baselines/mlp.py: sized from model.*, so it follows
the model's size), trained on the same train split, with the same loss, AdamW, schedule, batch
size, epochs and batch order as the model (pipeline/baselines/fit.py), once per seed:
baseline.mlp_seeds replicates, seeds run.seed, run.seed + 1, ... Its seed luck is measured from
them, so that the model against it is a decision whose interval covers both models' seeds.

Writes baselines/mlp.pt (every replicate's weights and per-epoch history) and metrics/baseline.json
(its size against the model's, its replicates' val loss and cosine). Logs nothing itself: the
evaluate stage scores it beside identity, ridge and nearest and logs it to the model's MLflow run
(its scores, baseline.mlp.* tags, its training per epoch as baseline/mlp_history.json). DVC
caches it: a change to the model's training that leaves its
inputs alone does not retrain it."""

from __future__ import annotations

if __name__ == "__main__":  # run as a stage: before the imports below (stages/startup.py says why)
    from stages import startup

    startup.begin()

import logging
import sys
import time

import numpy as np
from omegaconf import OmegaConf

from pipeline.baselines.files import MLP_FILE, MLPFile, Replicate, save_mlps
from pipeline.baselines.fit import fit_mlp, val_loss
from pipeline.baselines.mlp import mlp_shape, model_params
from pipeline.core.arm import data_digest
from pipeline.core.atomic import write_json
from pipeline.core.output_transaction import outputs
from pipeline.core.paths import METRICS_DIR, repo_path
from pipeline.data.shards import load_manifest, open_split

from ._cli import run_stage

log = logging.getLogger(__name__)

BASELINE_JSON = METRICS_DIR / "baseline.json"
SECTIONS = "run, embed.out_dir, model, train, baseline"
# The train keys it reads (dvc.yaml lists the same): the MLP is trained as the model is.
TRAIN_KEYS = (
    "epochs",
    "batch_size",
    "lr",
    "warmup_steps",
    "weight_decay",
    "grad_clip",
    "cosine_weight",
    "nce_weight",
    "nce_temperature",
)


def run(cfg) -> dict:
    # Both files put in place together when every replicate has trained (pipeline/core/output_transaction.py).
    with outputs("baseline", [repo_path(MLP_FILE), BASELINE_JSON]) as tx:
        return _run(cfg, tx)


def _run(cfg, tx) -> dict:
    shard_dir = repo_path(cfg.embed.out_dir)
    train = open_split(shard_dir, "train", need_rows="to train the MLP baseline on")
    val = open_split(shard_dir, "val", need_rows="to measure the MLP baseline's val loss on")
    dim_in, dim_out = int(train.inputs.shape[1]), int(train.targets.shape[1])
    budget = model_params(cfg.model, dim_in)
    shape = mlp_shape(budget, dim_in, dim_out)
    seeds = [int(cfg.run.seed) + k for k in range(int(cfg.baseline.mlp_seeds))]
    log.info(
        "MLP baseline: %d -> %d -> %d%s, %s parameters against the model's %s (%+.1f %%); %d replicates, seeds %s",
        dim_in,
        shape.hidden,
        dim_out,
        " with a linear skip path" if shape.skip else "",
        f"{shape.params:,}",
        f"{budget:,}",
        100.0 * (shape.params / budget - 1),
        len(seeds),
        ", ".join(map(str, seeds)),
    )
    replicates = []
    for seed in seeds:
        started = time.process_time()
        module, history = fit_mlp(
            shape,
            train.inputs,
            train.targets,
            cfg.train,
            float(cfg.train.lr),
            seed,
            on_epoch=lambda epoch, m: val_loss(m, val.inputs, val.targets, cfg.train),
        )
        last = history[-1]
        log.info(
            "  seed %d: %d epochs in %.1f s of CPU, val loss %.4f, val cosine %.4f",
            seed,
            len(history),
            time.process_time() - started,
            last["val/loss"],
            last["val/cosine"],
        )
        replicates.append(Replicate(seed, module, history))
    settings = {k: OmegaConf.select(cfg, f"train.{k}") for k in TRAIN_KEYS}
    found = MLPFile(shape, budget, settings, data_digest(load_manifest(shard_dir)), replicates)
    save_mlps(tx.path(repo_path(MLP_FILE)), found)
    metrics = {
        "baseline/mlp/params": shape.params,
        "baseline/mlp/model_params": budget,
        "baseline/mlp/hidden": shape.hidden,
        "baseline/mlp/skip": int(shape.skip),
        "baseline/mlp/seeds": len(seeds),
        "baseline/mlp/val/loss": round(float(np.mean([r.history[-1]["val/loss"] for r in replicates])), 6),
        "baseline/mlp/val/cosine": round(float(np.mean([r.history[-1]["val/cosine"] for r in replicates])), 6),
    }
    write_json(tx.path(BASELINE_JSON), metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    return run_stage("baseline", __doc__, SECTIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
