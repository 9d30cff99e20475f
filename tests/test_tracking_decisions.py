"""A decision recorded in MLflow (pipeline/tracking/decisions.py): one run per `./dev compare` or
`./dev decide` in the experiment `<model experiment>-decisions`, with its params, per-metric
metrics, outcome tags, the model runs of each arm and the decision page. Synthetic result dicts
and item tables, a SQLite store in tmp_path; nothing trains."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.stats.item_tables import TableMeta, write_items
from pipeline.tracking.decisions import SWITCH, decisions_experiment, log_decision, record
from pipeline.tracking.views import DECISIONS_VIEW_TAG, decisions_view_state


def _metric(outcome: str, diff: float, low: float, high: float, **extra) -> dict:
    return {
        "metric": "x",
        "a": 0.5,
        "b": 0.5 + diff,
        "difference": diff,
        "ci_low": low,
        "ci_high": high,
        "prob_b_better": 0.9,
        "p_value": 0.1,
        "level": 0.985,
        "margin": 0.01,
        "outcome": outcome,
        "seeds_needed": None,
        "verdict": f"{outcome} on x",
        **extra,
    }


def decide_result(**extra) -> dict:
    """What pipeline/stats/sequential.run returns, cut to what the record reads."""
    return {
        "name": "smoke-lr",
        "metric": "cosine",
        "margin": 0.002,
        "outcome": "worse",
        "rounds": 2,
        "a": {
            "label": "A",
            "overrides": ["preset=smoke"],
            "arm": {"digest": "aaaaaaaaaa", "name": "smoke"},
            "seeds": [0, 1],
            "experiments": ["rep-aaaaaaaa-s0", "rep-aaaaaaaa-s1"],
        },
        "b": {
            "label": "B",
            "overrides": ["preset=smoke", "train.lr=0.0003"],
            "arm": {"digest": "bbbbbbbbbb", "name": "smoke lr=0.0003"},
            "seeds": [0, 1],
            "experiments": ["rep-bbbbbbbb-s0", "rep-bbbbbbbb-s1"],
        },
        "method": {"levels": {"1": 0.985, "2": 0.989, "3": 0.991}, "resamples": 1000, "seed": 7},
        "covers": "test items and training seeds (seed variance from the smoke reference; 19 degrees of freedom)",
        "items": 62,
        "looks": [{"rounds": 1}, {"rounds": 2}],
        "metrics": {
            "cosine": _metric("worse", -0.364, -0.423, -0.307),
            "mse": _metric("inconclusive", 0.0001, -0.0002, 0.0004),
        },
        **extra,
    }


@pytest.mark.unit
def test_a_decide_result_becomes_params_per_metric_metrics_and_outcome_tags():
    extra = {
        "exploratory": True,
        "first_decision": {"name": "smoke-lr", "metric": "group_top1", "at": "2026-11-29"},
        "left_out": [{"experiment": "rep-bbbbbbbbbb-s1", "reason": "step time"}],
        "margin_why": "the smoke reference's seed SD",
    }
    rec = record(decide_result(**extra), "decide", {"a": ["r1", "r2"], "b": ["r3"]})
    assert rec.name == "smoke-lr"
    p = rec.params
    assert p["a"] == "preset=smoke (arm smoke [aaaaaaaaaa])"
    assert p["change"] == "train.lr=0.0003" and p["metric"] == "cosine" and p["margin"] == "0.002"
    assert p["looks"] == "2" and p["method"].startswith("sequential: 2 of 3 planned looks")
    assert p["resamples"] == "1000" and p["items"] == "62"
    assert rec.metrics["cosine/difference"] == -0.364 and rec.metrics["cosine/ci_high"] == -0.307
    assert rec.metrics["mse/prob_b_better"] == 0.9 and "cosine/verdict" not in rec.metrics
    t = rec.tags
    assert t["outcome"] == "worse" and t["outcome.cosine"] == "worse" and t["outcome.mse"] == "inconclusive"
    assert t["interval"] == "-0.364 [-0.423, -0.307]" and t["interval.mse"] == "+0.000100 [-0.000200, +0.000400]"
    assert t["luck.covers_seeds"] == "true" and "training seeds" in t["luck.covers"]
    assert t["a.run_ids"] == "r1,r2" and t["b.run_ids"] == "r3" and t["b.seeds"] == "0,1"
    assert t["exploratory"] == "true" and t["decision.kind"] == "decide"
    assert t["first_decision"] == "smoke-lr on group_top1" and t["left_out"] == "rep-bbbbbbbbbb-s1"
    assert p["margin_why"] == "the smoke reference's seed SD" and "baseline_commit" not in p
    # --baseline REV: the change is the code (and any -S).
    assert record(decide_result(baseline_commit="0123456789abcdef"), "decide").params["change"] == (
        "the code at 0123456789ab -> the workspace's; train.lr=0.0003"
    )
    assert t["mlflow.note.content"].startswith("**WORSE** on cosine: B - A = -0.364")
    # A field the result lacks is left out, not an error; a compare result has no decided metric.
    compare = {
        "a": {"name": "main", "label": "main", "runs": [{"source": "git revision main", "seed": 0}]},
        "b": {"name": "workspace", "label": "workspace", "runs": [{"source": "workspace", "seed": 0}]},
        "luck": {"covers": "test items only: training (seed) luck NOT covered", "covers_seeds": False},
        "level": 0.95,
        "shared_items": 599,
        "metrics": {"group_top1": _metric("inconclusive", 0.007, -0.008, 0.022)},
    }
    rec = record(compare, "compare")
    assert rec.name == "main vs workspace" and rec.params["looks"] == "1" and rec.params["level"] == "0.95"
    assert rec.params["metric"].startswith("none") and rec.params["margin"] == "group_top1=0.01"
    assert rec.tags["outcome"] == "inconclusive on 1 of 1 metrics" and rec.tags["luck.covers_seeds"] == "false"
    assert rec.tags["exploratory"] == "false" and "a.run_ids" not in rec.tags
    identical = {k: v for k, v in compare.items() if k not in ("metrics", "luck")}
    assert record({**identical, "identical": True}, "compare").tags["outcome"] == "identical"


@pytest.mark.integration
def test_a_decision_is_a_run_of_the_decisions_experiment_linked_to_its_model_runs(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv(SWITCH)
    client = MlflowClient(uri)
    models = client.create_experiment("models", (tmp_path / "art").as_uri())
    made = {}
    for arm, seed in (("aaaaaaaaaa", 0), ("aaaaaaaaaa", 1), ("bbbbbbbbbb", 0), ("bbbbbbbbbb", 5)):
        run = client.create_run(models, tags={"arm.digest": arm})
        client.log_param(run.info.run_id, "run.seed", str(seed))
        made[arm, seed] = run.info.run_id
    page = tmp_path / "smoke-lr.html"
    page.write_text("<html>the page</html>")
    (tmp_path / "smoke-lr.json").write_text("{}")
    ids = log_decision(decide_result(), "decide", files=[tmp_path / "smoke-lr.json", page], model_experiment="models")
    assert isinstance(ids, tuple), ids
    experiment_id, run_id = ids
    experiment = client.get_experiment(experiment_id)
    assert experiment.name == decisions_experiment("models") == "models-decisions"
    assert json.loads(json.loads(experiment.tags[DECISIONS_VIEW_TAG])["state"]) == decisions_view_state()
    run = client.get_run(run_id)
    assert run.info.run_name == "smoke-lr" and run.info.status == "FINISHED"
    assert run.data.params["change"] == "train.lr=0.0003"
    assert run.data.metrics["cosine/ci_low"] == -0.423
    # Each arm's replicates: its arm's runs of its seeds (seed 5 of B's arm is not one of them).
    assert run.data.tags["a.run_ids"] == f"{made['aaaaaaaaaa', 0]},{made['aaaaaaaaaa', 1]}"
    assert run.data.tags["b.run_ids"] == made["bbbbbbbbbb", 0]
    names = {f.path for f in client.list_artifacts(run_id, "decision")}
    assert names == {"decision/smoke-lr.html", "decision/smoke-lr.json"}
    # Found by the filters the docs give.
    found = client.search_runs([experiment_id], "tags.outcome = 'worse' and params.metric = 'cosine'")
    assert [r.info.run_id for r in found] == [run_id]


def _items(n: int, hit_rate: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    group_rank = np.where(rng.random(n) < hit_rate, 1, rng.integers(2, 40, n))
    cosine = np.clip(0.5 + 0.1 * rng.standard_normal(n), -1, 1)
    return pd.DataFrame(
        {
            "id": [f"q{i:04d}" for i in range(n)],
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


@pytest.mark.integration
def test_compare_logs_its_decision_and_no_log_does_not(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from tools import compare as cmp

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv(SWITCH)
    sides = []
    for name, rate in (("a", 0.3), ("b", 0.6)):
        path = tmp_path / f"{name}.parquet"
        write_items(_items(200, rate, len(sides)), path, TableMeta("smoke", f"{name}digest", f"smoke {name}", 0, "d"))
        sides.append(str(path))
    assert cmp.main([*sides, "--resamples", "1000", "--no-log", "--show", "0"]) == 0
    assert "MLflow" not in capsys.readouterr().err
    assert MlflowClient(uri).get_experiment_by_name("energy-flow-decisions") is None
    assert cmp.main([*sides, "--resamples", "1000", "--show", "0"]) == 0
    err = capsys.readouterr().err
    assert "logged to MLflow: decision run" in err, err
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("energy-flow-decisions")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["decision.kind"] == "compare" and run.data.tags["a.arm"] == "smoke a [adigest]"
    assert "group_top1/difference" in run.data.metrics
    names = {f.path for f in client.list_artifacts(run.info.run_id, "decision")}
    assert names == {"decision/decision.json", "decision/decision.txt"}


@pytest.mark.unit
def test_a_store_that_does_not_answer_is_a_note_and_the_switch_is_silence(monkeypatch):
    from pipeline.tracking.decisions import record_decision
    from tools.servers import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    assert record_decision(decide_result(), "decide") is None  # ENERGY_FLOW_LOG_DECISIONS=0 (conftest)
    monkeypatch.delenv(SWITCH)
    line = record_decision(decide_result(), "decide")
    assert line.startswith("the decision is not in MLflow: the tracking server http://127.0.0.1:"), line
    assert "does not answer" in line
