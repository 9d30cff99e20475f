"""The model run as MLflow shows it: the file keys a default run logs (302 before the mapping, in
tests/data/default_run_metric_keys.json) become at most 60 MLflow metrics with one '/' each,
sections named for what they show with the curves first, constants and intervals as tags."""

import json
from pathlib import Path

import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.tracking.metric_names import EVAL_ANSWERS, INTERVAL_TAGS, interval_text, mlflow_key, route
from pipeline.train.telemetry import STEP_COLUMNS

pytestmark = pytest.mark.unit

DEFAULT_RUN = json.loads((Path(__file__).parent / "data" / "default_run_metric_keys.json").read_text())["keys"]
MAX_METRICS = 60
# What the MLP baseline adds to a model run (the evaluate stage logs it): its scores and the model's
# differences from it, as the committed default run's metrics/eval.json has them, and its size.
MLP_BASELINE = [
    *(k for k in json.loads((REPO_ROOT / "metrics" / "eval.json").read_text()) if "mlp/" in k),
    *(f"baseline/mlp/{k}" for k in ("params", "model_params", "hidden", "skip", "seeds")),
]


def mlflow_keys(file_keys) -> set[str]:
    return {k for k in map(mlflow_key, file_keys) if k is not None}


def test_a_default_model_run_has_at_most_60_metrics_each_with_one_slash():
    assert len(DEFAULT_RUN) == 302  # what the run page listed before
    # With the answer model's abstention figures (another stage adds them to metrics/eval.json)
    # and the MLP baseline.
    assert len(MLP_BASELINE) > 60
    keys = mlflow_keys([*DEFAULT_RUN, *EVAL_ANSWERS, *MLP_BASELINE])
    assert len(keys) <= MAX_METRICS, sorted(keys)
    assert all(k.count("/") == 1 for k in keys), [k for k in keys if k.count("/") != 1]
    # No constants, no per-interval metrics, no system/* (the Overview lists those first).
    assert not [k for k in keys if k.startswith(("system/", "mem/")) or k.endswith(("ci95_low", "ci95_high"))]
    # Two file keys never land on one MLflow key (one would overwrite the other's curve), except
    # perf/step_ms, the row's step time and the run's median at the last step, as in the files.
    by_name: dict[str, list[str]] = {}
    for key in DEFAULT_RUN:
        if (name := mlflow_key(key)) is not None:
            by_name.setdefault(name, []).append(key)
    assert {n: ks for n, ks in by_name.items() if len(ks) > 1} == {}


def test_a_cuda_run_stays_within_the_limit_too():
    gpu = [f"system/gpu_0_{m}" for m in ("utilization_percentage", "memory_usage_megabytes", "power_usage_watts")]
    cuda_only = ["perf/kernels", "perf/kernel_us", "perf/gpu_busy", "amp/scale", "mem/device_peak_mb"]
    keys = mlflow_keys([*DEFAULT_RUN, *EVAL_ANSWERS, *MLP_BASELINE, *gpu, *cuda_only])
    # Per GPU two more (use, memory), the GPU busy fraction, and the loss scale with fp16.
    assert len(keys) <= MAX_METRICS + 4, len(keys)
    assert {"machine/gpu0_percent", "machine/gpu0_memory_mb", "speed/gpu_busy"} <= keys


def test_the_training_curves_are_the_first_section_and_the_sections_say_what_they_show():
    keys = mlflow_keys([*DEFAULT_RUN, *MLP_BASELINE])
    sections = sorted({k.split("/")[0] for k in keys})
    assert sections[0] == "curves"
    curves = {k for k in keys if k.startswith("curves/")}
    assert curves == {
        f"curves/{c}" for c in ("loss", "val_loss", "val_cosine", "grad_norm", "update_ratio", "step_ms", "lr")
    }
    assert {"eval/test_group_top1", "eval/test_cosine", "eval_baselines/model_vs_ridge_group_top1"} <= keys
    assert set(sections) <= {
        "curves", "eval", "eval_answers", "eval_baselines", "flow", "gradients", "machine", "memory", "range",
        "speed", "stability",
    }  # fmt: skip
    # The answer model's figures, when evaluate writes them, get a section of their own.
    assert mlflow_keys(EVAL_ANSWERS) == {f"eval_answers/{k.rsplit('/', 1)[1]}" for k in EVAL_ANSWERS}


def test_every_telemetry_column_is_named_or_left_out_on_purpose_and_other_keys_pass_through():
    # Unknown keys of the project's families are left out (a new column cannot add a section by
    # accident); keys of no family (a notebook's, a test's) pass as they are.
    assert mlflow_key("train/some_new_column") is None and mlflow_key("eval/test/model/new/ci95_low") is None
    assert mlflow_key("a/b") == "a/b" and mlflow_key("m") == "m"
    # Mapping is idempotent: a pending file written with MLflow names replays under the same names.
    for key in STEP_COLUMNS:
        name = mlflow_key(key)
        assert name is None or mlflow_key(name) == name, key


def test_constants_become_tags_and_the_headline_intervals_one_tag_each():
    eval_json = {
        "eval/bank_size": 2844,
        "eval/bootstrap_resamples": 2000,
        "eval/test/items": 599,
        "eval/test/model/group_top1": 0.8831,
        "eval/test/model/group_top1/ci95_low": 0.8577,
        "eval/test/model/group_top1/ci95_high": 0.9087,
        "eval/test/model_vs_ridge/group_top1": 0.02671,
        "eval/test/model_vs_ridge/group_top1/ci95_low": 0.01,
        "eval/test/model_vs_ridge/group_top1/ci95_high": 0.04518,
        "eval/test/model_vs_ridge/group_top1/p_value": 0.007996,
        "eval/test/nearest/mrr": 0.8379,
        "eval/test/model/cosine": float("nan"),
    }
    metrics, tags = route(eval_json)
    assert metrics == {"eval/test_group_top1": 0.8831, "eval_baselines/model_vs_ridge_group_top1": 0.02671}
    assert tags == {
        "eval.bank_size": "2844",
        "eval.test.items": "599",
        "eval.test.group_top1": "0.883 [0.858, 0.909]",
        "eval.test.vs_ridge.group_top1": "+0.027 [+0.010, +0.045] p=0.008",
    }
    assert set(INTERVAL_TAGS.values()) >= set(tags) - {"eval.bank_size", "eval.test.items"}
    # The rivals that could win are charted; the floors (identity, nearest: constants of the data)
    # are interval tags, the model's difference from them too.
    floors = {
        "eval/test/identity/group_top1": 0.788,
        "eval/test/identity/group_top1/ci95_low": 0.755,
        "eval/test/identity/group_top1/ci95_high": 0.82,
        "eval/test/model_vs_nearest/group_top1": 0.065,
        "eval/test/model_vs_nearest/group_top1/ci95_low": 0.03,
        "eval/test/model_vs_nearest/group_top1/ci95_high": 0.102,
        "eval/test/mlp/group_top1": 0.876,
        "eval/test/ridge/group_top1": 0.856,
    }
    metrics, tags = route(floors)
    assert metrics == {"eval_baselines/mlp_group_top1": 0.876, "eval_baselines/ridge_group_top1": 0.856}
    assert tags == {
        "eval.test.identity.group_top1": "0.788 [0.755, 0.820]",
        "eval.test.vs_nearest.group_top1": "+0.065 [+0.030, +0.102]",
    }
    # The MLP's per-epoch training is an artifact, not three more curves.
    assert mlflow_key("baseline/mlp/val/cosine") is None
    assert interval_text(0.5, 0.25, 0.75) == "0.500 [0.250, 0.750]"
