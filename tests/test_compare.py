"""`./dev compare A B` (tools/compare.py): two item tables of the evaluate stage compared item by
item, with paired-bootstrap CIs, p-values, verdicts and the items whose outcome flipped.

Unit tests on synthetic tables (parquet files in tmp_path, and one tiny git + DVC repository for a
git revision); then, as a user would, the session's two smoke experiments (tests/conftest.py's
`smoke_experiments`, no extra pipeline run) compared by experiment name and by MLflow run id."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipeline.evaluate.retrieval import METRICS
from tools import compare as cmp

pytestmark = pytest.mark.e2e

RESAMPLES = 1000  # the least the command takes; enough for these checks, and quick


def table(n: int, hit_rate: float, seed: int, cos_mean: float = 0.5, ids=None) -> pd.DataFrame:
    """An item table as the evaluate stage writes it: group_rank 1 on a `hit_rate` share of the
    items, rank >= group_rank, cosine around cos_mean (and mse falling as cosine rises), a ridge
    baseline that is worse on everything."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i:04d}" for i in range(n)] if ids is None else list(ids)
    n = len(ids)
    group_rank = np.where(rng.random(n) < hit_rate, 1, rng.integers(2, 40, n))
    rank = group_rank + rng.integers(0, 3, n)
    cosine = np.clip(cos_mean + 0.1 * rng.standard_normal(n), -1, 1)
    mse = (1 - cosine) / 192
    df = pd.DataFrame(
        {
            "id": ids,
            "group": [f"g{i % 50}" for i in range(n)],
            "input": [f"question {i}" for i in ids],
            "target": [f"answer {i}" for i in ids],
            "rank": rank,
            "group_rank": group_rank,
            "cosine": cosine,
            "mse": mse,
            "top5": [[f"b{j}" for j in range(5)]] * n,
        }
    )
    for b in ("identity", "ridge", "untrained"):
        df[f"{b}_rank"], df[f"{b}_group_rank"] = rank + 30, group_rank + 30
        df[f"{b}_cosine"], df[f"{b}_mse"] = cosine - 0.3, mse + 0.003
    return df


def write(tmp_path, name: str, df: pd.DataFrame) -> str:
    path = tmp_path / f"{name}.parquet"
    df.to_parquet(path, index=False)
    return str(path)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cmp.main([*args, "--resamples", str(RESAMPLES)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def run_json(capsys, *args: str) -> tuple[dict, str]:
    rc, out, err = run_main(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out), err


def test_a_clearly_better_model_wins_with_a_ci_around_the_true_difference(tmp_path, capsys):
    a = write(tmp_path, "a", table(600, 0.3, seed=1, cos_mean=0.40))
    b = write(tmp_path, "b", table(600, 0.7, seed=2, cos_mean=0.55))
    result, err = run_json(capsys, a, b)
    assert err == "" and result["shared_items"] == 600 and result["difference"] == "b - a"
    truth = {"group_top1": 0.4, "cosine": 0.15, "mse": -0.15 / 192}  # population differences, B - A
    for m, true in truth.items():
        r = result["metrics"][m]
        d = r["difference"]
        assert d["ci95_low"] <= true <= d["ci95_high"], (m, d)
        assert d["p_value"] < 0.01 and r["significant"] and r["better"] == "b", (m, r)
        assert d["value"] == pytest.approx(r["b"]["value"] - r["a"]["value"], abs=2e-6)
        assert r["a"]["ci95_low"] <= r["a"]["value"] <= r["a"]["ci95_high"]
    assert result["metrics"]["group_top1"]["verdict"].startswith(f"{b} is better than {a} on group_top1: +0.")
    assert "mse (lower is better)" in result["metrics"]["mse"]["verdict"]
    assert result["metrics"]["mse"]["verdict"].startswith(f"{b} is better than")  # lower mse is better
    # Swapped, B is the worse one.
    swapped, _ = run_json(capsys, b, a)
    assert swapped["metrics"]["group_top1"]["verdict"].startswith(f"{a} is worse than {b} on group_top1: -0.")
    assert swapped["metrics"]["group_top1"]["better"] == "a"
    # The flips: A's hits that B missed and the other way, counted and listed (with --show's limit).
    ta, tb = pd.read_parquet(a), pd.read_parquet(b)
    a_only = ta["id"][(ta.group_rank == 1) & (tb.group_rank > 1)].tolist()
    b_only = ta["id"][(ta.group_rank > 1) & (tb.group_rank == 1)].tolist()
    f = result["flipped"]
    assert (f["a_only"], f["b_only"]) == (len(a_only), len(b_only)) and f["metric"] == "group_top1"
    assert [it["id"] for it in f["b_only_items"]] == b_only[: cmp.DEFAULT_SHOW]
    first = f["a_only_items"][0]
    assert first["a_group_rank"] == 1 and first["b_group_rank"] > 1
    assert first["input"] == f"question {first['id']}" and first["target"] == f"answer {first['id']}"


def test_identical_tables_differ_in_nothing(tmp_path, capsys):
    a = write(tmp_path, "a", table(300, 0.5, seed=3))
    result, _ = run_json(capsys, a, a)
    assert result["a"]["label"] == f"{a} (A)" and result["b"]["label"] == f"{a} (B)"
    for m in METRICS:
        r = result["metrics"][m]
        assert r["difference"] == {"value": 0.0, "ci95_low": 0.0, "ci95_high": 0.0, "p_value": 1.0}, m
        assert not r["significant"] and r["better"] is None
        assert r["verdict"].startswith("no significant difference between"), r["verdict"]
    assert result["flipped"]["a_only"] == result["flipped"]["b_only"] == 0


def test_noise_that_cancels_out_is_no_significant_difference_and_its_flips_are_listed(tmp_path, capsys):
    df = table(400, 0.5, seed=4)
    noisy = df.copy()
    hits, misses = df.index[df.group_rank == 1][:25], df.index[df.group_rank > 1][:25]
    noisy.loc[hits, "group_rank"], noisy.loc[misses, "group_rank"] = 7, 1  # 25 flips each way: mean unchanged
    noisy["cosine"] = df["cosine"] + np.random.default_rng(5).normal(0, 0.05, len(df))
    a, b = write(tmp_path, "a", df), write(tmp_path, "b", noisy)
    result, _ = run_json(capsys, a, b, "--show", "3")
    g = result["metrics"]["group_top1"]
    assert g["difference"]["value"] == 0 and g["difference"]["ci95_low"] < 0 < g["difference"]["ci95_high"]
    assert g["difference"]["p_value"] > 0.5 and not g["significant"]
    assert g["verdict"].startswith(f"no significant difference between {a} and {b} on group_top1: +0.000 [")
    f = result["flipped"]
    assert (f["a_only"], f["b_only"]) == (25, 25)
    assert [it["id"] for it in f["a_only_items"]] == df.loc[hits[:3], "id"].tolist()
    assert [it["id"] for it in f["b_only_items"]] == df.loc[misses[:3], "id"].tolist()
    # The same in words.
    rc, text, _ = run_main(capsys, a, b, "--show", "2")
    assert rc == 0
    for m in METRICS:
        assert any(line.startswith(f"{m} ") for line in text.splitlines()), m
        assert f"on {m}" in text
    assert "25 hit by " in text and ", the first 2:" in text and f"input:  question {df.id[hits[0]]}" in text


def test_the_same_seed_gives_the_same_numbers_and_resamples_below_1000_are_refused(tmp_path, capsys):
    a = write(tmp_path, "a", table(200, 0.4, seed=6))
    b = write(tmp_path, "b", table(200, 0.5, seed=7))
    first, _ = run_json(capsys, a, b, "--seed", "11")
    again, _ = run_json(capsys, a, b, "--seed", "11")
    other, _ = run_json(capsys, a, b, "--seed", "12")
    assert first == again and first["seed"] == 11 and first["resamples"] == RESAMPLES
    assert first["metrics"]["cosine"]["difference"] != other["metrics"]["cosine"]["difference"]
    with pytest.raises(SystemExit) as e:
        cmp.main([a, b, "--resamples", "999"])
    assert e.value.code == 2 and "at least 1000" in capsys.readouterr().err


def test_tables_of_different_splits_are_compared_on_shared_items_with_a_warning(tmp_path, capsys):
    a = write(tmp_path, "a", table(300, 0.5, seed=8, ids=[f"q{i}" for i in range(300)]))
    b = write(tmp_path, "b", table(200, 0.5, seed=9, ids=[f"q{i}" for i in range(200, 400)]))
    result, err = run_json(capsys, a, b)
    assert result["shared_items"] == 100 and (result["a"]["items"], result["b"]["items"]) == (300, 200)
    assert err.count("\n") == 1 and err.startswith("compare: warning: ") and "100 are shared" in err
    assert result["warnings"] == [err.strip().removeprefix("compare: warning: ")]
    # None shared: refused.
    c = write(tmp_path, "c", table(50, 0.5, seed=10, ids=[f"other{i}" for i in range(50)]))
    rc, out, err = run_main(capsys, a, c)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "share no item id" in err


def test_a_name_that_names_nothing_is_one_line_saying_what_was_tried(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tools.compare", "no-such-experiment", "workspace"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    for tried in (
        "'no-such-experiment' names no item table",
        "workspace",
        "not an existing file",
        "not an MLflow run id",
        "not a git revision",
        "not a DVC experiment",
    ):
        assert tried in proc.stderr, (tried, proc.stderr)


def test_bad_tables_and_arguments_are_one_line_errors(tmp_path, capsys):
    good = write(tmp_path, "good", table(20, 0.5, seed=11))
    broken = write(tmp_path, "broken", table(20, 0.5, seed=11).drop(columns=["group_rank"]))
    (tmp_path / "junk.parquet").write_text("not parquet")
    for args, expected in (
        ([good, broken], "no column group_rank"),
        ([good, str(tmp_path / "junk.parquet")], "not a readable parquet file"),
        ([good, "--baseline", "lasso"], "baselines in it: identity, ridge, untrained"),
    ):
        rc, out, err = run_main(capsys, *args)
        assert rc == 2 and out == "" and err.count("\n") == 1 and expected in err, (args, err)
    with pytest.raises(SystemExit) as e:
        cmp.main([good])  # one table and no --baseline
    assert e.value.code == 2


def test_a_model_against_a_baseline_of_its_own_table(tmp_path, capsys):
    a = write(tmp_path, "a", table(300, 0.5, seed=12))
    result, _ = run_json(capsys, a, "--baseline", "ridge")
    assert result["a"]["predictor"] == "ridge" and result["b"]["predictor"] == "model"
    assert result["metrics"]["group_top1"]["verdict"].startswith(f"{a} is better than {a}:ridge on group_top1")
    assert result["metrics"]["cosine"]["difference"]["value"] == pytest.approx(0.3)


def test_dev_compare_takes_a_path_relative_to_where_it_was_started(tmp_path):
    from pipeline.core.paths import REPO_ROOT

    table(100, 0.4, seed=16).to_parquet(tmp_path / "a.parquet", index=False)
    table(100, 0.6, seed=17).to_parquet(tmp_path / "b.parquet", index=False)
    proc = subprocess.run(
        [str(REPO_ROOT / "dev"), "compare", "a.parquet", "b.parquet", "--json", "--resamples", str(RESAMPLES)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["a"]["kind"] == result["b"]["kind"] == "file" and result["shared_items"] == 100


def test_a_git_revision_and_the_workspace_of_a_repository(tmp_path, capsys):
    """A committed table (here in git; the pipeline's is a DVC output, read from DVC's cache the
    same way by dvc.api.open) at HEAD~1 and HEAD, and the working copy's."""
    from tools.fault_matrix import clean_env

    env = clean_env()
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)

    git("init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, env=env, check=True, capture_output=True)
    items = repo / cmp.ITEMS_PATH
    table(200, 0.3, seed=13).to_parquet(items, index=False)
    git("add", "-A")
    git("commit", "-qm", "first")
    table(200, 0.8, seed=14).to_parquet(items, index=False)
    git("commit", "-qam", "second")
    git("tag", "v2")
    table(200, 0.5, seed=15).to_parquet(items, index=False)  # uncommitted
    old, new = cmp.load("HEAD~1", root=repo), cmp.load("v2", root=repo)
    assert old.kind == new.kind == "git-revision" and "(commit " in new.description
    assert (new.table["group_rank"] == 1).mean() > 0.7 > (old.table["group_rank"] == 1).mean()
    ws = cmp.load("workspace", root=repo)
    assert ws.kind == "workspace" and ws.table.equals(pd.read_parquet(items))
    result = cmp.compare(old, new, RESAMPLES)
    assert result["metrics"]["group_top1"]["better"] == "b"
    with pytest.raises(cmp.CompareError, match="names no item table: .*not a git revision of .*not a DVC experiment"):
        cmp.load("nope", root=repo)


# --------------------------------------------------------------------------- as a user would


def _compare_in(root, env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.compare", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_two_smoke_experiments_compared_by_name_and_by_mlflow_run_id(smoke_experiments):
    from mlflow.tracking import MlflowClient

    root, env = smoke_experiments.root, smoke_experiments.env
    by_name = _compare_in(root, env, "smoke-a", "smoke-b", "--json", "--show", "5")
    assert by_name.returncode == 0, by_name.stderr[-3000:]
    assert by_name.stderr == ""  # one test split: no warning
    result = json.loads(by_name.stdout)
    assert result["a"]["kind"] == result["b"]["kind"] == "dvc-experiment"
    assert result["shared_items"] == result["a"]["items"] == result["b"]["items"] > 0
    assert set(result["metrics"]) == set(METRICS)

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("energy-flow")
    runs = {}
    for name in ("smoke-a", "smoke-b"):
        (run,) = client.search_runs([exp.experiment_id], f"tags.stage = 'train' and tags.`dvc.exp_name` = '{name}'")
        runs[name] = run
        # The experiment's table is the one its MLflow run logged: its means are the run's metrics.
        side = "a" if name == "smoke-a" else "b"
        for m in METRICS:
            assert result["metrics"][m][side]["value"] == pytest.approx(
                run.data.metrics[f"eval/test/model/{m}"], abs=2e-6
            ), (name, m)

    by_id = _compare_in(root, env, runs["smoke-a"].info.run_id, runs["smoke-b"].info.run_id, "--json", "--show", "5")
    assert by_id.returncode == 0 and by_id.stderr == "", by_id.stderr[-3000:]
    same = json.loads(by_id.stdout)
    assert same["a"]["kind"] == same["b"]["kind"] == "mlflow-run"
    assert same["a"]["label"] == f"smoke-a (run {runs['smoke-a'].info.run_id[:8]})"
    assert same["metrics"] == {
        m: {**r, "verdict": r["verdict"].replace("smoke-a", same["a"]["label"]).replace("smoke-b", same["b"]["label"])}
        for m, r in result["metrics"].items()
    }  # the same tables, the same numbers
    assert same["flipped"] == result["flipped"]

    # In words, a name against a run id, and the workspace (where smoke-a ran).
    text = _compare_in(root, env, "smoke-a", runs["smoke-b"].info.run_id)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "A = smoke-a: DVC experiment smoke-a (commit " in text.stdout
    assert sum(
        line.startswith(("no significant difference", "smoke-b (run")) for line in text.stdout.splitlines()
    ) == len(METRICS)
    ws = _compare_in(root, env, "workspace", "smoke-b", "--json")
    assert ws.returncode == 0, ws.stderr[-3000:]
    assert json.loads(ws.stdout)["shared_items"] == result["shared_items"]
