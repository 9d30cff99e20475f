"""Arms against the baseline of record in MLflow (pipeline/stats/baseline.py computes,
pipeline/tracking/arms.py logs, tools/arms.py runs both): one run per arm in
`<model experiment>-arms` with its replicate count, its means with seed-covering intervals and its
difference from the baseline; the same difference as tags on every model run. Synthetic item
tables logged to a SQLite store in tmp_path; nothing trains."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.stats.item_tables import TableMeta, write_items
from pipeline.tracking.views import ARMS_TABLE_VIEW_TAG

pytestmark = pytest.mark.integration


def _items(n: int, hit_rate: float, seed: int, first_id: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    group_rank = np.where(rng.random(n) < hit_rate, 1, rng.integers(2, 40, n))
    cosine = np.clip(0.5 + hit_rate / 2 + 0.05 * rng.standard_normal(n), -1, 1)
    return pd.DataFrame(
        {
            "id": [f"q{i:04d}" for i in range(first_id, first_id + n)],
            "group": [f"g{i % 50}" for i in range(n)],
            "input": [f"question {i}" for i in range(n)],
            "target": [f"answer {i}" for i in range(n)],
            "rank": group_rank,
            "group_rank": group_rank,
            "cosine": cosine,
            "mse": (1 - cosine) / 192,
            "top5": [[f"b{j}" for j in range(5)]] * n,
        }
    )


def test_each_arm_is_one_row_with_its_replicates_and_its_difference_from_the_baseline(tmp_path, monkeypatch):
    import json

    from mlflow.tracking import MlflowClient

    from tools.arms import update

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    models = client.create_experiment("models", (tmp_path / "art").as_uri())
    made: dict[str, list[str]] = {}
    # The baseline arm (3 seeds), a clearly better one (2 seeds), one scored on other items (another
    # split: not comparable) and a run without an item table.
    arms_made = (("basedigest", 0.3, (0, 1, 2), 0), ("betterdig", 0.7, (0, 1), 0), ("otherdig", 0.5, (0, 1), 5000))
    for arm, rate, seeds, first_id in arms_made:
        for seed in seeds:
            path = tmp_path / f"{arm}-{seed}" / "eval_items.parquet"
            path.parent.mkdir()
            meta = TableMeta("custom", arm, f"custom {arm}", seed, "data")
            write_items(_items(300, rate + 0.01 * seed, 10 * seed + len(made), first_id), path, meta)
            run = client.create_run(models, tags={"stage": "train", "arm.digest": arm})
            client.log_param(run.info.run_id, "run.seed", str(seed))
            client.log_artifact(run.info.run_id, str(path), "evaluate")
            made.setdefault(arm, []).append(run.info.run_id)
    bare = client.create_run(models, tags={"stage": "train", "arm.digest": "basedigest"}).info.run_id
    baseline = str(tmp_path / "basedigest-0" / "eval_items.parquet")  # what named the baseline: a file

    line = update(baseline, "models", resamples=1000, seed=1)
    assert "3 arm(s) of 'models'" in line and "custom basedigest [basedigest]" in line, line
    arms = client.get_experiment_by_name("models-arms")
    assert ARMS_TABLE_VIEW_TAG in arms.tags
    rows = {r.data.tags["arm.digest"]: r for r in client.search_runs([arms.experiment_id])}
    assert set(rows) == {"basedigest", "betterdig", "otherdig"}
    assert rows["otherdig"].data.tags["vs_baseline.group_top1"].startswith("no test item shared with the baseline")
    assert rows["otherdig"].data.tags["replicates"] == "2 (seeds 0, 1)"
    better, base = rows["betterdig"], rows["basedigest"]
    assert better.info.run_name == "custom betterdig"
    assert better.data.metrics["replicates"] == 2 and better.data.tags["replicates"] == "2 (seeds 0, 1)"
    assert base.data.tags["replicates"] == "3 (seeds 0, 1, 2)"
    assert better.data.tags["vs_baseline.group_top1"].endswith(" better"), better.data.tags
    assert better.data.tags["vs_baseline.cosine"].endswith(" better")
    assert base.data.tags["vs_baseline.group_top1"] == "this is the baseline"
    # The mean's interval covers the seeds (two arms with replicates: their own spread).
    assert "training seeds" in better.data.tags["luck.covers"]
    low, high = json.loads(better.data.tags["eval.test.group_top1"].split(" ", 1)[1])
    assert low < better.data.metrics["eval/test_group_top1"] < high
    # Every evaluated model run of the arm carries the same comparison; the bare run is left alone.
    for run_id in made["betterdig"]:
        tags = client.get_run(run_id).data.tags
        assert tags["vs_baseline.group_top1"] == better.data.tags["vs_baseline.group_top1"]
        assert tags["arm.replicates"] == "2 (seeds 0, 1)" and tags["baseline"].startswith("custom basedigest")
    assert "vs_baseline.group_top1" not in client.get_run(bare).data.tags
    # Run again: the same arm runs are brought up to date, not duplicated.
    update(baseline, "models", resamples=1000, seed=1)
    assert len(client.search_runs([arms.experiment_id])) == 3
