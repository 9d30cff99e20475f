"""Sweeps: `dvc exp run --queue -S run.sweep=NAME -S 'train.lr=a,b' ...` queues one experiment per
combination, every MLflow run of them carries the sweep's tags (pipeline/tracking/store.py:
sweep_tags), and `./dev compare --sweep NAME` (pipeline/stats/sweep.py) ranks the arms (runs that differ
only in the seed are replicates of one) against the top one, with intervals that cover the seeds.

Unit: the ranking on synthetic item tables. Integration: the tags on real runs of a local store,
found and ranked; two processes opening one fresh store at once. E2E (slow): a 2 x 2 smoke sweep
queued and run by two queue workers side by side in a scratch copy of the project, then a second
sweep that reuses one of its combinations from DVC's cache."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.stats import sweep
from pipeline.stats.item_sources import CompareError
from pipeline.stats.item_tables import TableMeta
from tools import compare as cmp

RESAMPLES = 1000  # the least the command takes; enough for these checks, and quick
SEED = 20261123  # the bootstrap seed the ranking checks were written with


def table(n: int, hit_rate: float, seed: int, cos_mean: float = 0.5, ids=None) -> pd.DataFrame:
    """An item table as the evaluate stage writes it (the model's columns): group_rank 1 on a
    `hit_rate` share of the items, cosine around cos_mean, mse falling as cosine rises."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i:04d}" for i in range(n)] if ids is None else list(ids)
    n = len(ids)
    group_rank = np.where(rng.random(n) < hit_rate, 1, rng.integers(2, 40, n))
    cosine = np.clip(cos_mean + 0.1 * rng.standard_normal(n), -1, 1)
    return pd.DataFrame(
        {
            "id": ids,
            "input": [f"question {i}" for i in ids],
            "target": [f"answer {i}" for i in ids],
            "rank": group_rank + rng.integers(0, 3, n),
            "group_rank": group_rank,
            "cosine": cosine,
            "mse": (1 - cosine) / 192,
        }
    )


def run(name: str, df: pd.DataFrame | None, lr: str, hidden: str = "64", seed: int | None = None, **extra):
    """A sweep's model run; with `seed`, its table says which arm (by lr and hidden) and seed it is."""
    params = {"train.lr": lr, "model.carrier_hidden": hidden, "train.epochs": "12", "run.sweep": "s", **extra}
    if seed is not None:
        params["run.seed"] = str(seed)
    rid = (name.encode().hex() + "0" * 32)[:32]
    meta = None
    if seed is not None:
        meta = TableMeta("smoke", f"arm{lr}{hidden}", f"smoke lr={lr}", seed, "data")
    return sweep.SweepRun(name, rid, name, "FINISHED", params, df, "" if df is not None else "no artifact", meta)


def found(*runs: sweep.SweepRun) -> sweep.Found:
    return sweep.Found("s", "sweep.s", "sqlite:///x/mlflow.db", list(runs))


def replicates(prefix: str, lr: str, hit_rate: float, seeds=(0, 1, 2), spread: float = 0.01, n: int = 800):
    """Runs of one arm: the same items, the hit rate moved a little by each seed."""
    return [
        run(
            f"{prefix}-s{s}",
            table(n, hit_rate + spread * (s - 1), 100 * s + len(prefix) + int(hit_rate * 100)),
            lr,
            seed=s,
        )
        for s in seeds
    ]


# --------------------------------------------------------------------------- unit: the ranking


@pytest.mark.unit
def test_arms_not_runs_are_ranked_with_intervals_that_cover_the_seeds():
    # Three arms of 3 seeds on the same 800 items: hit rates about 0.30, 0.50 and 0.55.
    runs = [*replicates("a", "0.001", 0.30), *replicates("b", "0.003", 0.50), *replicates("c", "0.01", 0.55)]
    result = sweep.rank(found(*runs), resamples=RESAMPLES, seed=SEED)
    arms = result["arms"]
    assert [a["arm"]["name"] for a in arms] == ["smoke lr=0.01", "smoke lr=0.003", "smoke lr=0.001"]
    assert [a["rank"] for a in arms] == [1, 2, 3] and all(a["seeds"] == [0, 1, 2] for a in arms)
    assert result["metric"] == "group_top1" and result["higher_is_better"] and result["items"] == 800
    assert result["covers_seeds"] and "training seeds" in result["covers"]
    top = arms[0]
    assert top["top"] and "difference_from_top" not in top
    for a, prefix in zip(arms, "cba"):
        tables = [r.table for r in runs if r.experiment.startswith(prefix)]
        assert a["mean"]["value"] == pytest.approx(np.mean([(t.group_rank == 1).mean() for t in tables]), abs=1e-6)
        assert a["mean"]["ci_low"] < a["mean"]["value"] < a["mean"]["ci_high"]
    middle, worst = arms[1]["difference_from_top"], arms[2]["difference_from_top"]
    assert worst["outcome"] == "worse" and worst["ci_high"] < 0 and worst["prob_b_better"] < 0.01
    # 0.50 against 0.55 over 3 seeds: not separated, so there is no best, only a top arm.
    assert middle["outcome"] != "worse" and result["best"] is None
    assert result["not_separated_from_top"] == ["smoke lr=0.003"] and not top["best"]
    # What the sweep varied, and nothing else (the seed and the label run.sweep never count).
    assert result["swept_params"] == ["train.lr"]
    assert [a["params"] for a in arms] == [{"train.lr": "0.01"}, {"train.lr": "0.003"}, {"train.lr": "0.001"}]
    assert sweep.rank(found(*runs), resamples=RESAMPLES, seed=SEED) == result  # seeded: the same numbers again
    # Without the middle arm the top one is separated from every other: the best.
    alone = sweep.rank(found(*[r for r in runs if not r.experiment.startswith("b")]), resamples=RESAMPLES, seed=SEED)
    assert alone["best"] == "smoke lr=0.01" and alone["arms"][0]["best"]


@pytest.mark.unit
def test_a_seed_run_twice_counts_once():
    runs = [*replicates("a", "0.001", 0.3), *replicates("c", "0.01", 0.6)]
    again = run("c-again", runs[-1].table, "0.01", seed=2)
    result = sweep.rank(found(*runs, again), resamples=RESAMPLES, seed=SEED)
    assert [len(a["seeds"]) for a in result["arms"]] == [3, 3]


@pytest.mark.unit
def test_single_runs_without_a_reference_are_never_separated():
    # One run per arm, tables that say nothing of their seed: the seeds' luck is not covered.
    a, b = table(800, 0.2, 1), table(800, 0.7, 2)
    result = sweep.rank(found(run("s-1", a, "0.001"), run("s-2", b, "0.01")), resamples=RESAMPLES, seed=SEED)
    assert not result["covers_seeds"] and "NOT covered" in result["covers"]
    assert result["best"] is None and result["arms"][1]["difference_from_top"]["outcome"] == "inconclusive"


@pytest.mark.unit
def test_mse_ranks_the_lowest_first_and_every_metric_can_be_chosen():
    low = [run(f"l-s{s}", table(400, 0.5, 40 + s, cos_mean=0.7), "0.003", seed=s) for s in range(3)]
    high = [run(f"h-s{s}", table(400, 0.5, 50 + s, cos_mean=0.4), "0.01", seed=s) for s in range(3)]
    pair = found(*high, *low)
    result = sweep.rank(pair, metric="mse", resamples=RESAMPLES, seed=SEED)
    assert not result["higher_is_better"] and [a["arm"]["name"] for a in result["arms"]] == [
        "smoke lr=0.003",
        "smoke lr=0.01",
    ]
    d = result["arms"][1]["difference_from_top"]
    assert d["difference"] > 0 and d["ci_low"] > 0 and d["outcome"] == "worse"  # higher mse: worse
    for metric in ("cosine", "top1", "top5", "group_top5", "mrr"):
        assert sweep.rank(pair, metric, resamples=RESAMPLES, seed=SEED)["metric"] == metric
    with pytest.raises(CompareError, match="--metric 'acc': expected one of cosine, mse"):
        sweep.rank(pair, "acc", resamples=RESAMPLES, seed=SEED)


@pytest.mark.unit
def test_a_run_without_a_table_is_left_out_with_a_warning_and_two_arms_are_needed():
    a, b = replicates("a", "0.001", 0.4, n=200), replicates("b", "0.01", 0.6, n=200)
    missing = run("s-2", None, "0.003")
    result = sweep.rank(found(*a, missing, *b), "mrr", resamples=1000, seed=SEED)
    assert [x["arm"]["name"] for x in result["arms"]] == ["smoke lr=0.01", "smoke lr=0.001"]
    assert result["skipped"] == [
        {"experiment": "s-2", "run_id": missing.run_id, "status": "FINISHED", "reason": "no artifact"}
    ]
    assert any(w.startswith("s-2 (run ") and w.endswith("left out: no artifact") for w in result["warnings"])
    with pytest.raises(CompareError, match="only the arm smoke lr=0.001 has an item table: at least 2 arms"):
        sweep.rank(found(*a, missing), resamples=RESAMPLES, seed=SEED)
    with pytest.raises(CompareError, match="none of them has an item table"):
        sweep.rank(found(missing), resamples=RESAMPLES, seed=SEED)
    # A table that is not the evaluate stage's is left out the same way, saying what it lacks.
    bad = run("s-3", a[0].table.drop(columns=["group_rank"]), "0.003", seed=0)
    result = sweep.rank(found(*a, bad, *b), "mrr", resamples=1000, seed=SEED)
    assert "no column group_rank" in result["skipped"][0]["reason"]


@pytest.mark.unit
def test_runs_on_partly_different_test_items_are_ranked_over_the_shared_ones():
    a = table(300, 0.4, 9)
    b = table(200, 0.6, 10, ids=[f"q{i:04d}" for i in range(100, 300)])
    result = sweep.rank(found(run("s-1", a, "0.001"), run("s-2", b, "0.01")), resamples=RESAMPLES, seed=SEED)
    assert result["items"] == 200
    assert any("200 to 300 test items, of which 200 are shared" in w for w in result["warnings"])
    other = table(100, 0.5, 11, ids=[f"x{i}" for i in range(100)])
    with pytest.raises(CompareError, match="share no test item id"):
        sweep.rank(found(run("s-1", a, "0.001"), run("s-2", other, "0.01")), resamples=RESAMPLES, seed=SEED)


@pytest.mark.unit
def test_swept_params_are_the_ones_that_differ_a_missing_one_included():
    runs = [
        run("s-1", None, "0.001", "64", seed=0),
        run("s-2", None, "0.001", "128", seed=1, **{"run.sweep": "other", "run.experiment": "x"}),
        sweep.SweepRun("s-3", "c" * 32, "s-3", "FINISHED", {"train.lr": "0.001", "train.epochs": "12"}),
    ]
    assert sweep.swept_params(runs) == ["model.carrier_hidden"]  # run.* labels and the seed never count


@pytest.mark.unit
def test_the_table_shows_the_top_arm_first_with_its_params_seeds_and_intervals():
    runs = [*replicates("a", "0.001", 0.3, n=500), *replicates("b", "0.01", 0.6, n=500)]
    result = sweep.rank(found(*runs), resamples=RESAMPLES, seed=SEED)
    text = cmp.render_sweep(result)
    lines = text.splitlines()
    assert lines[0].startswith(
        "Sweep s: 2 arms (6 model runs) tagged sweep.s in sqlite:///x/mlflow.db, ranked by group_top1"
    )
    head = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    assert lines[head].split()[:4] == ["rank", "arm", "seeds", "train.lr"]
    first, second = lines[head + 2], lines[head + 3]
    assert first.startswith("   1  smoke lr=0.01") and first.rstrip().endswith("best")
    assert second.startswith("   2  smoke lr=0.001") and second.rstrip().endswith("worse") and "0,1,2" in second
    mean = result["arms"][1]["mean"]
    assert f"[{mean['ci_low']:.3f}, {mean['ci_high']:.3f}]" in second
    assert lines[-1].startswith("Best: smoke lr=0.01")


# --------------------------------------------------------------------------- unit: the param


@pytest.mark.unit
def test_run_sweep_is_a_label_with_a_safe_name():
    assert load_config([]).run.sweep == ""
    assert load_config(["run.sweep=lr-x-hidden_2.b"]).run.sweep == "lr-x-hidden_2.b"
    for bad in ("'a b'", "-lead", "'it''s'", "a" * 65):
        with pytest.raises(ConfigError, match=r"run\.sweep"):
            load_config([f"run.sweep={bad}"])


@pytest.mark.unit
def test_the_command_line_keeps_a_sweep_apart_from_a_and_b(capsys):
    for args, message in (
        (["--sweep", "s", "workspace"], "give no A, B or --baseline with it"),
        (["a.parquet", "b.parquet", "--metric", "mse"], "--metric goes with --sweep"),
        ([], "or --sweep NAME"),
    ):
        with pytest.raises(SystemExit) as e:
            cmp.main(args)
        assert e.value.code == 2 and message in capsys.readouterr().err, args


# --------------------------------------------------------------------------- integration: real runs


def _model_run(tracking, name: str, exp_name: str, df: pd.DataFrame | None, tmp_path, **params) -> str:
    """A model run as a stage under `dvc exp run` makes it: new, tagged, its item table logged."""
    import os

    os.environ["DVC_EXP_NAME"] = exp_name
    try:
        with tracking.mlflow_run(name, "smoke", tags={"stage": "train"}) as r:
            tracking.log_params(params)
            if df is not None:
                path = tmp_path / f"{exp_name}.parquet"
                df.to_parquet(path, index=False)
                tracking.log_artifact_file(path.rename(path.with_name("eval_items.parquet")), "evaluate")
        return r.info.run_id
    finally:
        del os.environ["DVC_EXP_NAME"]


@pytest.mark.integration
def test_a_sweeps_runs_are_tagged_found_and_ranked_and_a_reused_run_joins_a_later_sweep(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from pipeline.tracking import store as tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # Outside a sweep, no sweep tag; and no store yet: the command says so.
    assert cmp.main(["--sweep", "lr"]) == 2
    assert "no MLflow store at" in capsys.readouterr().err
    outside = _model_run(tracking, "baseline", "baseline", table(300, 0.5, 20), tmp_path, **{"train.lr": "0.003"})
    tracking.set_sweep("lr")
    ids = {
        "lr-1": _model_run(tracking, "lr-1", "lr-1", table(300, 0.3, 21), tmp_path, **{"train.lr": "0.001"}),
        "lr-2": _model_run(tracking, "lr-2", "lr-2", table(300, 0.7, 22), tmp_path, **{"train.lr": "0.01"}),
        "lr-3": _model_run(tracking, "lr-3", "lr-3", None, tmp_path, **{"train.lr": "0.1"}),  # diverged: no table
    }
    client = MlflowClient(uri)
    for name, rid in ids.items():
        tags = client.get_run(rid).data.tags
        assert tags["sweep"] == "lr" and tags["sweep.lr"] == name, name
    assert "sweep" not in client.get_run(outside).data.tags
    # The ranking: lr-2 best, lr-1 below it, lr-3 left out with a warning; the baseline is in no sweep.
    assert cmp.main(["--sweep", "lr", "--json", "--resamples", "1000"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    ranked = [(a["experiments"], a["run_ids"]) for a in result["arms"]]
    assert ranked == [(["lr-2"], [ids["lr-2"]]), (["lr-1"], [ids["lr-1"]])]
    assert result["tag"] == "sweep.lr" and result["store"] == uri and result["swept_params"] == ["train.lr"]
    # One run an arm, tables that say nothing of their seeds, no reference: never separated.
    assert result["arms"][1]["difference_from_top"]["outcome"] == "inconclusive" and result["best"] is None
    assert result["skipped"][0]["experiment"] == "lr-3"
    assert "lr-3 (run " in out.err and "no artifact evaluate/eval_items.parquet" in out.err
    assert cmp.main(["--sweep", "lr", "--resamples", "1000"]) == 0
    assert cmp.render_sweep(result) == capsys.readouterr().out.rstrip("\n")
    # A later sweep whose combination DVC restores from its cache: only the report stage adds to
    # the earlier run. It joins the new sweep (sweep.lr2) and stays in the one that made it.
    tracking.set_sweep("lr2")
    monkeypatch.setenv("DVC_EXP_NAME", "lr2-1")
    with tracking.adding_to_run(ids["lr-2"], "report"):
        pass
    with tracking.adding_to_run(outside, "report"):  # in no sweep yet: joins it by name
        pass
    monkeypatch.delenv("DVC_EXP_NAME")
    tags = client.get_run(ids["lr-2"]).data.tags
    assert tags["sweep"] == "lr" and tags["sweep.lr"] == "lr-2" and tags["sweep.lr2"] == "lr2-1"
    tags = client.get_run(outside).data.tags
    assert tags["sweep"] == "lr2" and tags["sweep.lr2"] == "lr2-1"
    found_ = sweep.find("lr2")
    assert {(r.experiment, r.run_id) for r in found_.runs} == {("lr2-1", ids["lr-2"]), ("lr2-1", outside)}
    assert any("2 model runs stand for the experiment lr2-1" in w for w in found_.warnings)
    # A name no run carries: which tag, which store, which sweeps there are, how to tag one.
    assert cmp.main(["--sweep", "nope"]) == 2
    err = capsys.readouterr().err
    assert "carries the tag sweep.nope" in err and uri in err and "sweeps there: lr, lr2" in err
    assert "dvc exp run --queue -S run.sweep=nope" in err


def _open_store(uri: str, queue) -> None:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = uri
    from pipeline.tracking import store as tracking

    try:
        tracking.use_store()
        queue.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(e).__name__}: {e}")


@pytest.mark.integration
def test_parallel_stages_create_one_fresh_store_together(tmp_path):
    """`dvc queue start -j 2` on a project without mlflow.db starts two stages that both create
    it. MLflow's table migrations are not safe to run twice at once: three processes opening one
    fresh store with MLflow alone failed in 3 tries of 3 (Alembic's CommandError "expected to
    match one row", sqlite's OperationalError); tracking.use_store serializes the first opening."""
    ctx = multiprocessing.get_context("spawn")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    queue = ctx.Queue()
    procs = [ctx.Process(target=_open_store, args=(uri, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert sorted(queue.get(timeout=5) for _ in procs) == ["ok"] * 3
    assert not list(tmp_path.glob("*lock*"))  # the store's directory may be anyone's: nothing left in it


# --------------------------------------------------------------------------- e2e: a real smoke sweep


@pytest.mark.e2e
@pytest.mark.slow
def test_a_queued_smoke_sweep_runs_every_combination_side_by_side_and_ranks_them(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from tests.conftest import dvc, sh, wait_for_queue
    from tools import reference as smoke_reference
    from tools.fault_matrix import project_copy

    root = project_copy(tmp_path_factory.mktemp("sweep"))
    env = smoke_reference.reference_env()
    grid = {"train.lr": ("0.001", "0.01"), "model.carrier_hidden": ("16", "32")}
    sets = [a for k, values in grid.items() for a in ("-S", f"{k}={','.join(values)}")]
    out = sh(dvc(*"exp run --queue -n sw -S preset=smoke -S run.sweep=sw".split(), *sets), root, env)
    # DVC names them NAME-1.. in the order of the grid's product, the last key varying fastest.
    product = [(lr, h) for lr in grid["train.lr"] for h in grid["model.carrier_hidden"]]
    combos = {f"sw-{i}": combo for i, combo in enumerate(product, start=1)}
    for name, (lr, hidden) in combos.items():
        assert f"Queued experiment '{name}'" in out, out
        assert f"'train.lr={lr}', 'model.carrier_hidden={hidden}'" in out, out
    sh(dvc("queue", "start", "-j", "2"), root, env)  # two workers, each in its own copy under .dvc/tmp/exps
    try:
        for name in combos:
            wait_for_queue(root, env, name, timeout=1200)
    finally:
        subprocess.run(dvc("queue", "stop"), cwd=root, env=env, capture_output=True, timeout=120)
    # DVC: every combination is an experiment with its params and metrics.
    shown = {}
    for baseline in json.loads(sh(dvc("exp", "show", "--json"), root, env)):
        for branch in baseline.get("experiments") or []:
            for exp in branch.get("revs") or []:
                if exp.get("name") in combos:
                    shown[exp["name"]] = exp["data"]
    assert set(shown) == set(combos)
    for name, (lr, hidden) in combos.items():
        params = shown[name]["params"]["params.yaml"]["data"]
        got = (params["run"]["sweep"], str(params["train"]["lr"]), str(params["model"]["carrier_hidden"]))
        assert got == ("sw", lr, hidden), name
        assert np.isfinite(shown[name]["metrics"]["metrics/eval.json"]["data"]["eval/test/model/group_top1"]), name
    # MLflow: one model run per combination in the project's own store (none in DVC's copies),
    # all tagged with the sweep.
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exp_ids, "tags.stage = 'train'")
    assert sorted(r.data.tags["sweep.sw"] for r in runs) == sorted(combos)
    assert {r.data.tags["sweep"] for r in runs} == {"sw"} and {r.info.status for r in runs} == {"FINISHED"}
    assert not list(root.glob(".dvc/tmp/exps/**/mlflow.db")) and not list(root.glob(".dvc/tmp/exps/**/mlruns"))
    # The ranking, as a user runs it from the project: four arms (one seed each), top first. Every
    # arm is another configuration than the smoke reference's (its lr differs), so the reference
    # does not speak for their seed spread: the intervals cover the test items only, and say so.
    ranked = _rank(root, env, "sw")
    arms = ranked["arms"]
    assert sorted(e for a in arms for e in a["experiments"]) == sorted(combos) and ranked["skipped"] == []
    assert ranked["swept_params"] == ["model.carrier_hidden", "train.lr"] and not ranked["covers_seeds"]
    assert "NOT covered" in ranked["covers"] and "needs replicates of its own" in ranked["covers"], ranked["covers"]
    assert ranked["best"] is None  # single runs without a covering reference are never separated
    means = [a["mean"]["value"] for a in arms]
    assert arms[0]["top"] and means == sorted(means, reverse=True)
    for a in arms:
        (experiment,) = a["experiments"]
        assert (a["params"]["train.lr"], a["params"]["model.carrier_hidden"]) == combos[experiment]
        assert a["seeds"] == [0] and a["mean"]["ci_low"] <= a["mean"]["value"] <= a["mean"]["ci_high"]
        if not a["top"]:
            d = a["difference_from_top"]
            assert d["ci_low"] <= d["difference"] <= 0 <= d["p_value"] <= 1
    text = subprocess.run(
        [sys.executable, "-m", "tools.compare", "--sweep", "sw"], cwd=root, env=env, capture_output=True, text=True
    )
    assert text.returncode == 0 and text.stdout.startswith("Sweep sw: 4 arms (4 model runs) tagged sweep.sw"), text
    # A second sweep repeating sw-1's combination: DVC restores its train and evaluate stages from
    # its cache, and the report stage puts the earlier run into this sweep too.
    again_cmd = "exp run --queue -n again -S preset=smoke -S run.sweep=again -S train.lr=0.001,0.02"
    sh(dvc(*again_cmd.split()), root, env)
    sh(dvc("queue", "start", "-j", "2"), root, env)
    try:
        for name in ("again-1", "again-2"):
            wait_for_queue(root, env, name, timeout=1200)
    finally:
        subprocess.run(dvc("queue", "stop"), cwd=root, env=env, capture_output=True, timeout=120)
    (reused,) = next(a for a in arms if a["experiments"] == ["sw-1"])["run_ids"]
    tags = client.get_run(reused).data.tags
    assert tags["sweep"] == "sw" and tags["sweep.sw"] == "sw-1" and tags["sweep.again"] == "again-1"
    again = _rank(root, env, "again")
    assert {e for a in again["arms"] for e in a["experiments"]} == {"again-1", "again-2"}
    assert next(a for a in again["arms"] if a["experiments"] == ["again-1"])["run_ids"] == [reused]


def _rank(root, env, name: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.compare", "--sweep", name, "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def with_mlp(df: pd.DataFrame, seeds, hit_rate: float, digest: str) -> tuple[pd.DataFrame, dict]:
    """The table with an MLP's replicates (mlp.<seed>_...) and the metadata naming them."""
    df = df.copy()
    for s in seeds:
        rep = table(len(df), hit_rate + 0.004 * (s - 2), seed=700 + s + 50 * len(digest), ids=df["id"])
        for c in ("rank", "group_rank", "cosine", "mse"):
            df[f"mlp.{s}_{c}"] = rep[c].to_numpy()
    return df, {"mlp": {"arm": digest, "name": f"MLP {digest}", "seeds": list(seeds)}}


def mlp_run(name, lr, hit_rate, seed, mlp_rate, digest):
    df, trained = with_mlp(
        table(800, hit_rate, seed=seed * 13 + int(hit_rate * 100)), range(seed, seed + 3), mlp_rate, digest
    )
    r = run(name, df, lr, seed=seed)
    r.meta = TableMeta("smoke", r.meta.arm_digest, r.meta.arm_name, seed, "data", trained)
    return r


@pytest.mark.unit
def test_each_arm_is_held_against_its_own_mlp_and_the_sweeps_strongest():
    runs = [mlp_run(f"a-{s}", "0.001", 0.70, s, 0.60, "mlp-aaa") for s in (0, 1, 2)]
    runs += [mlp_run(f"b-{s}", "0.01", 0.45, s, 0.40, "mlp-bbb") for s in (0, 1, 2)]
    result = sweep.rank(found(*runs), resamples=RESAMPLES, seed=SEED)
    by = {row["arm"]["name"]: row for row in result["arms"]}
    a, b = by["smoke lr=0.001"], by["smoke lr=0.01"]
    # Each arm's own MLP: the replicates beside its runs, each seed once (seeds 0-4).
    assert a["vs_mlp"]["mlp_seeds"] == [0, 1, 2, 3, 4] and a["vs_mlp"]["mlp"].endswith("[aaa]")
    assert a["vs_mlp"]["outcome"] == "better" and a["vs_mlp"]["covers_seeds"]
    # The strongest MLP is arm a's: arm b, above its own MLP, is far below it.
    assert result["best_mlp"].endswith("[aaa]") and b["vs_best_mlp"]["mlp"].endswith("[aaa]")
    assert b["vs_best_mlp"]["outcome"] == "worse"
    text = cmp.render_sweep(result)
    assert "Against the MLP baseline of the model's size" in text and "strongest" in text
