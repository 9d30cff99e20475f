"""evaluate: the trained model and four baselines (identity; ridge fitted on train; nearest, the
answer of the nearest training question; mlp, the baseline stage's MLP of the model's size, its
replicates' mean) scored on the same val and test items: cosine, MSE,
exact-text and group retrieval (top-1, top-5, MRR) over a bank of every distinct target text of the
dataset; on test each with a paired bootstrap 95 % CI, and the model's paired difference from each
baseline (CI and p-value).
Writes metrics/eval.json, reports/eval_items.parquet (one row per test item: ranks, top-5 bank
ids, cosine; in its metadata the preset, arm, seed and data it came from; `./dev compare` reads
it) and reports/eval_samples.csv (decoded examples).
Calibrates the answer model's confidence rule on val (pipeline/evaluate/abstention.py: when its
top answer is right often enough to be given as an answer) and measures it on test and on
questions whose answer is not in the bank (evaluate.out_of_bank_questions): eval/answer/... keys.
Logs them once, to the model's MLflow run and its logged model, the headline metrics under their
MLflow names (pipeline/tracking/metric_names.py) and their intervals as tags. The logged
model is the trained model as a text-in, text-out service (pipeline/serve/: questions in, the
bank's nearest answers out, each saying whether it is confident), logged to the model's run with
the bank it was scored on and the rule calibrated here, named after the run (`smoke-a-1a2b3c4d`);
runs/evaluate.json records its models:/ URI."""

from __future__ import annotations

if __name__ == "__main__":  # run as a stage: before the imports below (stages/startup.py says why)
    from stages import startup

    startup.begin()

import logging
import sys

import pandas as pd

from pipeline.answer.bank import build_bank
from pipeline.answer.prediction import predict
from pipeline.baselines.files import MLP_FILE, load_mlps
from pipeline.baselines.mlp import predict as mlp_predict
from pipeline.core import resources
from pipeline.core.arm import arm_of, data_digest
from pipeline.core.atomic import atomic_path, write_json
from pipeline.core.output_transaction import outputs
from pipeline.core.paths import METRICS_DIR, REPORTS_DIR, check_readable_inside, repo_path
from pipeline.core.preflight import Need, check_memory
from pipeline.data.shards import load_manifest, open_split, sha256_file
from pipeline.evaluate import abstention
from pipeline.evaluate.retrieval import BASELINES, evaluate_split, predictions, ridge_fit, sample_table
from pipeline.model.model_file import check_input_dim, load_model
from pipeline.serve.log import log_answer_model, logged_model_record, model_name
from pipeline.stats.bootstrap import resample_bytes, verdict
from pipeline.stats.defaults import preset_defaults
from pipeline.stats.item_tables import TableMeta, write_items
from pipeline.stats.metrics import LOWER_IS_BETTER, METRICS
from pipeline.stats.seed_variance import find_reference
from pipeline.tracking import store as tracking
from pipeline.tracking.datasets import shards_dataset
from pipeline.tracking.provenance import stage_lock_tags
from pipeline.tracking.run_note import update_note

from ._cli import run_stage

log = logging.getLogger(__name__)

EVAL_JSON = METRICS_DIR / "eval.json"
SAMPLES_CSV = REPORTS_DIR / "eval_samples.csv"
ITEMS_PARQUET = REPORTS_DIR / "eval_items.parquet"
SPLITS = ("val", "test")
SECTIONS = "run, embed.out_dir, embed.batch_size, train.out_dir, train.batch_size, evaluate"


def run(cfg) -> dict:
    # Written aside and put in place together when the stage succeeds (pipeline/core/output_transaction.py):
    # a failure keeps the previous metrics, item table and samples as they were.
    with outputs("evaluate", [EVAL_JSON, ITEMS_PARQUET, SAMPLES_CSV]) as tx:
        return _run(cfg, tx)


def _run(cfg, tx) -> dict:
    shard_dir, model_path = repo_path(cfg.embed.out_dir), repo_path(cfg.train.out_dir) / "model.pt"
    model, payload = load_model(model_path)
    manifest = load_manifest(shard_dir)
    check_input_dim(model_path, payload, manifest, shard_dir)  # before any work
    # The run that trained this very model (found by its digest if runs/train.json names another).
    run_info = tracking.read_run_file("train", model_path) if tracking.enabled() else {}
    shards = {
        s: open_split(shard_dir, s, need_rows=why)
        for s, why in (("train", "to fit the ridge baseline on"), ("val", "to evaluate on"), ("test", "to evaluate on"))
    }
    mlps = load_mlps(repo_path(MLP_FILE))
    check_mlp_data(mlps, manifest, shard_dir)
    bank = build_bank([shards[s] for s in ("train", "val", "test")])
    w = ridge_fit(shards["train"].inputs, shards["train"].targets, cfg.evaluate.ridge_alpha)
    ev = cfg.evaluate
    # The preset's committed seed-variance reference, if it was measured on these very data: the
    # model's intervals then cover its training seed's luck as well as the test items'.
    reference = find_reference(str(cfg.run.preset), data_digest(manifest))
    covered = covers(reference, str(cfg.run.preset))
    metrics = {
        "eval/bank_size": bank.size,
        "eval/bootstrap_resamples": ev.bootstrap_resamples,
        "eval/test/seed_reference_seeds": len(reference.seeds) if reference else 0,
        # What "equivalent" means in the learning check: the preset's margins (pipeline/stats/defaults.py).
        **{f"eval/test/margin/{m}": v for m, v in preset_defaults(str(cfg.run.preset)).margins.items()},
    }
    for split in SPLITS:
        # The batch size the model trained with: max_active_flows caps flows per *batch*, so a
        # bigger batch would give each sample fewer flows than it learned with.
        pred = predict(model, shards[split].inputs, cfg.train.batch_size)
        flat, estimates, items = evaluate_split(
            split,
            predictions(pred, shards[split], w, shards["train"]),
            shards[split],
            bank,
            ev.bootstrap_resamples,
            ev.bootstrap_seed,
            with_ci=split == "test",
            seed_luck=reference.metrics if reference and split == "test" else None,
            replicates={"mlp": [(r.seed, mlp_predict(r.module, shards[split].inputs)) for r in mlps.replicates]},
        )
        metrics.update(flat)
        if split == "test":
            test_items, test_estimates = items, estimates
    answers = abstention.measure(
        model, shards, bank, ev.answer_precision, ev.answer_floor_keep, out_of_bank_inputs(cfg, manifest)
    )
    metrics.update(answers.metrics)
    if answers.rule.margin_threshold is None:
        log.warning(
            "answer confidence: no margin threshold reaches precision %.2f on val (evaluate.answer_precision): "
            "the logged model is never confident",
            ev.answer_precision,
        )
    write_json(tx.path(EVAL_JSON), metrics)
    with atomic_path(tx.path(ITEMS_PARQUET)) as tmp:
        write_items(test_items, tmp, table_meta(cfg, payload, manifest, mlps))
    with atomic_path(tx.path(SAMPLES_CSV)) as tmp:
        pd.DataFrame(
            sample_table(test_items, bank, ev.samples),
            columns=["id", "input", "target", "decoded", "correct", "group_correct"],
        ).to_csv(tmp, index=False)
    if run_info:
        manifest_path = shard_dir / "manifest.json"
        # The metrics are measured on these shards: the logged model's page names them with the values.
        dataset = shards_dataset(shard_dir, manifest, sha256_file(manifest_path), str(cfg.run.preset))
        with tracking.adding_to_run(run_info["run_id"], "evaluate", tags=stage_lock_tags("train")) as run:
            # The model as a service, logged here rather than by train: it answers from this very
            # bank (its digest in the model's metadata), and train does not depend on serving code.
            logged = log_answer_model(
                model_path,
                shard_dir,
                cfg.train.batch_size,
                cfg.embed.batch_size,
                answers.rule,
                answers.calibration,
                *model_label(run, str(cfg.run.preset)),
            )
            bank_tag = {"eval.bank_sha256": logged.metadata["bank_sha256"]} if logged else {}
            tracking.set_tags({"eval.ci_covers": covered, **bank_tag})
            tracking.log_metrics(metrics, model_id=getattr(logged, "model_id", None), dataset=dataset)
            log_mlp(mlps)
            update_note()
            for path in (EVAL_JSON, ITEMS_PARQUET, SAMPLES_CSV):
                tracking.log_artifact_file(tx.path(path), "evaluate")
        if logged:  # where the answer model is, so ./dev ask need not look it up in the store
            tracking.write_run_file("evaluate", logged_model_record(logged), tx)
    for line in summary_lines(test_estimates, bank.size, len(test_items), covered):
        log.info("%s", line)
    log.info("%s", answers.summary())
    return metrics


def out_of_bank_inputs(cfg, manifest: dict):
    """The out-of-bank questions (evaluate.out_of_bank_questions) embedded as the served model
    embeds a question: the shards' teacher, embed.batch_size, stored at the shards' dtype. None
    when the parameter is "" (no such list)."""
    given = str(cfg.evaluate.out_of_bank_questions or "")
    if not given:
        return None
    import numpy as np

    from pipeline.embed.teacher import encode_texts, load_teacher
    from pipeline.serve.log import teacher_load_name

    path = check_readable_inside(repo_path(given), "parameter 'evaluate.out_of_bank_questions'")
    questions = abstention.read_questions(path)
    teacher = load_teacher(teacher_load_name(dict(manifest.get("teacher") or {})))
    x = encode_texts(teacher, questions, int(cfg.embed.batch_size), progress=False)
    return x.astype(str(manifest.get("dtype", "float32")), copy=False).astype(np.float32, copy=False)


def model_label(run, preset: str) -> tuple[str, dict[str, str]]:
    """The logged model's name (`smoke-a-1a2b3c4d`) and tags: which run and preset it is."""
    run_name = run.info.run_name or ""
    tags = {"preset": preset, "run_name": run_name, "run_id": run.info.run_id}
    overrides = (getattr(run, "data", None) and run.data.tags.get("run.overrides")) or ""
    if overrides:
        tags["run.overrides"] = overrides
    return model_name(preset, run_name, run.info.run_id), tags


def covers(reference, preset: str) -> str:
    """What the test intervals cover, in words (the MLflow tag eval.ci_covers, the log)."""
    if reference is not None:
        return f"test items and training seeds (the model's seed spread from {reference.describe()})"
    return (
        f"test items only: training (seed) luck is not covered (no seed-variance reference for the preset {preset} "
        "on these data; `./dev seeds --preset NAME` measures one, `./dev compare` of several seeds covers it)"
    )


def table_meta(cfg, payload: dict, manifest: dict, mlps=None) -> TableMeta:
    """What the item table came from. The seed is the one the model file records (the model's
    own), the arm and preset the config's: under DVC both are the params.yaml that trained it;
    `mlps`, the MLP baseline's replicates in it (their arm and seeds)."""
    arm = arm_of(cfg, manifest)
    seed = (payload.get("extra") or {}).get("seed", cfg.run.seed)
    data = data_digest(manifest)
    trained = {}
    if mlps is not None:
        trained["mlp"] = {"arm": mlps.digest(), "name": mlps.describe(), "seeds": mlps.seeds}
    return TableMeta(str(cfg.run.preset), arm.digest, arm.name, int(seed), data, trained)


def check_mlp_data(mlps, manifest: dict, shard_dir) -> None:
    """Before any scoring: the MLP baseline was trained on these very shards."""
    if mlps.data != data_digest(manifest):
        from pipeline.core.errors import PipelineError

        raise PipelineError(
            f"{MLP_FILE} was trained on other shards (data digest {mlps.data}) than those in {shard_dir} "
            f"({data_digest(manifest)}): train it on these (dvc repro baseline; by hand: python -m stages.baseline "
            "embed.out_dir=...)"
        )


def log_mlp(mlps) -> None:
    """The MLP baseline on the model's run: its size (tags baseline.mlp.*) and every replicate's
    training, per epoch, as the artifact baseline/mlp_history.json (not as metrics: three more
    curves per run would put a section before the model's own curves and the run past 60 metrics)."""
    s = mlps.shape
    tracking.log_metrics(
        {
            "baseline/mlp/params": s.params,
            "baseline/mlp/model_params": mlps.model_params,
            "baseline/mlp/hidden": s.hidden,
            "baseline/mlp/skip": int(s.skip),
            "baseline/mlp/seeds": len(mlps.replicates),
        }
    )
    history = [{"seed": r.seed, "epochs": r.history} for r in mlps.replicates]
    tracking.log_dict({"replicates": history}, "baseline/mlp_history.json")


def summary_lines(estimates: dict, bank_size: int, items: int, covered: str = "test items") -> list[str]:
    """What a reader needs from the log: each predictor's headline numbers with CIs, then the
    model against each baseline in words."""
    lines = [
        f"test: {items} items, retrieval over {bank_size} distinct target texts (95 % CIs)",
        f"  the intervals cover: {covered}",
    ]
    for who in ("model", *BASELINES):
        if f"{who}/cosine" in estimates:
            parts = [
                f"{m} {estimates[f'{who}/{m}'].value:.3f} [{estimates[f'{who}/{m}'].low:.3f}, "
                f"{estimates[f'{who}/{m}'].high:.3f}]"
                for m in ("group_top1", "group_top5", "mrr", "cosine")
            ]
            lines.append(f"  {who:9s} " + " | ".join(parts))
    for b in BASELINES:
        for m in ("group_top1", "cosine"):
            est = estimates.get(f"model_vs_{b}/{m}")
            if est is not None:
                lines.append("  " + verdict(est, "model", b, m, higher_is_better=m not in LOWER_IS_BETTER))
    return lines


def costs(cfg, processes: int) -> None:
    """Before any work: the test split's bootstrap (every predictor's metrics and the model's
    differences from each baseline, resampled together) must fit this node's memory."""
    manifest = load_manifest(repo_path(cfg.embed.out_dir))
    items = int(manifest["splits"].get("test", {}).get("count", 0))
    columns = len(METRICS) * (1 + 2 * len(BASELINES))
    resamples = int(cfg.evaluate.bootstrap_resamples)
    boot_mb = resample_bytes(resamples, items, columns) / 2**20
    held = resources.rss_mb()
    parts = (
        f"this process {held:,.0f} MB + the bootstrap {boot_mb:,.0f} MB: {resamples:,} resamples x {columns} "
        f"metrics x 8 bytes, twice, over {items:,} test items"
    )
    check_memory(Need(held + boot_mb, parts, "evaluate.bootstrap_resamples"), processes, held_mb=held)


def main(argv: list[str] | None = None) -> int:
    return run_stage("evaluate", __doc__, SECTIONS, run, argv, costs=costs)


if __name__ == "__main__":
    sys.exit(main())
