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

from pipeline.stats import seed_variance
from pipeline.stats.compare import compare
from pipeline.stats.item_sources import ITEMS_PATH, CompareError, Side, Source, load, load_side
from pipeline.stats.item_tables import TableMeta, write_items
from pipeline.stats.metrics import METRICS
from pipeline.tracking.metric_names import mlflow_key
from tools import compare as cmp

pytestmark = pytest.mark.e2e

RESAMPLES = 1000  # the least the command takes; enough for these checks, and quick
SEED = 20261123  # the bootstrap seed the library-level check was written with


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
    for b in ("identity", "ridge", "nearest"):
        df[f"{b}_rank"], df[f"{b}_group_rank"] = rank + 30, group_rank + 30
        df[f"{b}_cosine"], df[f"{b}_mse"] = cosine - 0.3, mse + 0.003
    return df


def write(tmp_path, name: str, df: pd.DataFrame, meta: TableMeta | None = None) -> str:
    path = tmp_path / f"{name}.parquet"
    if meta is None:
        df.to_parquet(path, index=False)
    else:
        write_items(df, path, meta)
    return str(path)


def meta(arm: str, seed: int, preset: str = "smoke", data: str = "d1") -> TableMeta:
    return TableMeta(preset, f"{arm}digest", f"smoke {arm}", seed, data)


def replicates(tmp_path, arm: str, hit_rate: float, cos_mean: float, seeds=(0, 1, 2), n: int = 600) -> str:
    """Item tables of one arm's runs (a comma list of files): the same items, each seed moving
    the whole run a little."""
    paths = []
    for s in seeds:
        df = table(
            n, hit_rate + 0.01 * (s - 1), seed=100 * s + int(hit_rate * 100), cos_mean=cos_mean + 0.003 * (s - 1)
        )
        paths.append(write(tmp_path, f"{arm}-s{s}", df, meta(arm, s)))
    return ",".join(paths)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    rc = cmp.main([*args, "--resamples", str(RESAMPLES)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def run_json(capsys, *args: str) -> tuple[dict, str]:
    rc, out, err = run_main(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out), err


@pytest.fixture
def reference_dir(tmp_path, monkeypatch):
    """An empty seed-variance reference directory in place of the committed one."""
    d = tmp_path / "references"
    d.mkdir()
    monkeypatch.setattr(seed_variance, "REFERENCE_DIR", d)
    return d


def test_replicates_of_a_clearly_better_arm_win_with_an_interval_around_the_true_difference(tmp_path, capsys):
    a = replicates(tmp_path, "a", 0.3, 0.40)
    b = replicates(tmp_path, "b", 0.7, 0.55)
    result, err = run_json(capsys, a, b)
    assert result["shared_items"] == 600 and result["difference"] == "b - a" and not result["same_arm"]
    assert result["luck"]["covers_seeds"] and "3 runs of" in result["luck"]["covers"]
    assert [r["seed"] for r in result["a"]["runs"]] == [0, 1, 2] and result["a"]["arm"]["digest"] == "adigest"
    truth = {"group_top1": 0.4, "cosine": 0.15, "mse": -0.15 / 192}  # population differences, B - A
    for m, true in truth.items():
        r = result["metrics"][m]
        assert r["ci_low"] <= true <= r["ci_high"], (m, r)
        assert r["outcome"] == "better" and r["prob_b_better"] > 0.99, (m, r)
        assert r["difference"] == pytest.approx(r["b"] - r["a"], abs=2e-6)
    assert result["metrics"]["group_top1"]["verdict"].startswith("smoke b is better than smoke a on group_top1: +0.")
    assert "mse (lower is better)" in result["metrics"]["mse"]["verdict"]
    swapped, _ = run_json(capsys, b, a)
    assert swapped["metrics"]["group_top1"]["outcome"] == "worse"
    assert swapped["metrics"]["group_top1"]["verdict"].startswith("smoke a is worse than smoke b on group_top1: -0.")
    # The flips: items hit by most of A's runs and missed by most of B's, and the other way.
    f = result["flipped"]
    assert f["metric"] == "group_top1" and f["b_only"] > f["a_only"] > 0
    first = f["b_only_items"][0]
    assert first["a_hit_rate"] < 0.5 < first["b_hit_rate"] and first["input"].startswith("question ")
    # In words: the table, each verdict, and what the intervals cover.
    rc, text, _ = run_main(capsys, a, b, "--show", "2")
    assert rc == 0 and "3 runs (seeds 0, 1, 2)" in text and "the interval covers: test items and training seeds" in text
    for m in METRICS:
        assert any(line.startswith(f"{m} ") for line in text.splitlines()), m


def test_single_runs_without_a_reference_are_never_better_and_say_why(tmp_path, capsys, reference_dir):
    a = write(tmp_path, "a", table(600, 0.3, seed=1, cos_mean=0.40), meta("a", 0))
    b = write(tmp_path, "b", table(600, 0.7, seed=2, cos_mean=0.55), meta("b", 0))
    result, _ = run_json(capsys, a, b)
    assert not result["luck"]["covers_seeds"] and "NOT covered" in result["luck"]["covers"]
    assert {r["outcome"] for r in result["metrics"].values()} == {"inconclusive"}
    assert all(r["seeds_needed"] >= 2 for r in result["metrics"].values())
    rc, text, _ = run_main(capsys, a, b)
    assert rc == 0 and "Training luck is NOT covered" in text and "./dev decide" in text


def test_single_runs_with_the_presets_reference_are_covered(tmp_path, capsys, reference_dir):
    # The preset's reference (as ./dev seeds writes it) for these data: 8 seeds of one arm.
    rng = np.random.default_rng(0)
    base = table(600, 0.5, seed=3, cos_mean=0.5)
    per = []
    for s in range(8):
        df = base.copy()
        df["cosine"] = base["cosine"] + rng.normal(0, 0.003) + rng.normal(0, 0.01, len(df))
        per.append(df)
    from pipeline.stats.item_sources import predictor_table, runs_values

    tables = [predictor_table(Source(f"s{i}", f"s{i}", "file", "", t)) for i, t in enumerate(per)]
    values = runs_values(tables, list(base["id"]))
    ref = seed_variance.measure("smoke", "d1", {"digest": "adigest", "name": "smoke a"}, list(range(8)), values, {})
    seed_variance.write_reference(ref, reference_dir / "smoke.json")
    a = write(tmp_path, "a", per[0], meta("a", 0))

    def gain(i: int):
        out = per[i].copy()
        out["cosine"] = out["cosine"] + 0.05
        return out

    # One run of another arm borrows nothing: the reference covers the arm it was measured on.
    b = write(tmp_path, "b", gain(1), meta("b", 0))
    result, _ = run_json(capsys, a, b)
    assert not result["luck"]["covers_seeds"] and "needs replicates of its own" in result["luck"]["covers"]
    assert result["metrics"]["cosine"]["outcome"] == "inconclusive"
    # Three runs of it that spread as the reference's do (an F test): they share its spread.
    b = ",".join(write(tmp_path, f"b{i}", gain(i), meta("b", i)) for i in (1, 3, 4))
    result, _ = run_json(capsys, a, b)
    assert result["luck"]["covers_seeds"] and "reference" in result["luck"]["covers"], result["luck"]
    assert result["luck"]["references"] == [str(reference_dir / "smoke.json")]
    assert result["metrics"]["cosine"]["outcome"] == "better"
    # Two seeds of one arm: luck, and said so.
    same = write(tmp_path, "a1", per[2], meta("a", 1))
    aa, err = run_json(capsys, a, same)
    assert aa["same_arm"] and "differing only in their seeds" in err
    assert aa["metrics"]["cosine"]["outcome"] in ("inconclusive", "equivalent")


def test_identical_tables_differ_in_nothing(tmp_path, capsys):
    a = write(tmp_path, "a", table(300, 0.5, seed=3))
    result, _ = run_json(capsys, a, a)
    assert result["a"]["label"] == f"{a} (A)" and result["b"]["label"] == f"{a} (B)"
    assert result["identical"] and "300 items" in result["message"]


def test_a_side_must_be_replicates_of_one_arm_each_seed_once(tmp_path, capsys):
    a0, a1 = (
        write(tmp_path, "a0", table(50, 0.5, 1), meta("a", 0)),
        write(tmp_path, "a1", table(50, 0.5, 2), meta("a", 1)),
    )
    b0 = write(tmp_path, "b0", table(50, 0.5, 3), meta("b", 0))
    again = write(tmp_path, "a0-again", table(50, 0.5, 4), meta("a", 0))
    for args, message in (
        ([f"{a0},{b0}", a1], "A (" + f"{a0},{b0}) mixes arms"),
        ([a1, f"{a0},{again}"], "holds seed 0 twice"),
    ):
        rc, out, err = run_main(capsys, *args)
        assert rc == 2 and out == "" and err.count("\n") == 1 and message in err, (args, err)


def test_the_same_seed_gives_the_same_numbers_and_resamples_below_1000_are_refused(tmp_path, capsys):
    a = replicates(tmp_path, "a", 0.4, 0.5, n=200)
    b = replicates(tmp_path, "b", 0.5, 0.5, n=200)
    first, _ = run_json(capsys, a, b, "--seed", "11")
    again, _ = run_json(capsys, a, b, "--seed", "11")
    other, _ = run_json(capsys, a, b, "--seed", "12")
    assert first == again and first["seed"] == 11 and first["resamples"] == RESAMPLES
    assert first["metrics"]["cosine"]["ci_low"] != other["metrics"]["cosine"]["ci_low"]
    with pytest.raises(SystemExit) as e:
        cmp.main([a, b, "--resamples", "999"])
    assert e.value.code == 2 and "at least 1000" in capsys.readouterr().err


def test_margins_decide_equivalence_and_are_checked(tmp_path, capsys):
    a = replicates(tmp_path, "a", 0.5, 0.5, seeds=range(6), n=2000)
    b = replicates(tmp_path, "b", 0.5, 0.501, seeds=range(6), n=2000)  # not identical tables: those stop early
    wide, _ = run_json(capsys, a, b, "--margin", "cosine=0.05")
    assert wide["metrics"]["cosine"]["margin"] == 0.05 and wide["metrics"]["cosine"]["outcome"] == "equivalent"
    for bad in ("cosine", "cosine=-1", "acc=0.1", "cosine=x"):
        with pytest.raises(SystemExit):
            cmp.main([a, b, "--margin", bad])
        assert "--margin" in capsys.readouterr().err


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
        ([good, "--baseline", "lasso"], "baselines in it: identity, nearest, ridge"),
    ):
        rc, out, err = run_main(capsys, *args)
        assert rc == 2 and out == "" and err.count("\n") == 1 and expected in err, (args, err)
    with pytest.raises(SystemExit) as e:
        cmp.main([good])  # one table and no --baseline
    assert e.value.code == 2


def test_a_model_against_a_baseline_of_its_own_table(tmp_path, capsys):
    # Replicates of the model against the ridge baseline scored beside them: the baseline has no
    # training luck, the model's seeds have.
    a = replicates(tmp_path, "a", 0.5, 0.5)
    result, _ = run_json(capsys, a, "--baseline", "ridge")
    assert result["a"]["predictor"] == "ridge" and result["b"]["predictor"] == "model"
    assert result["luck"]["covers_seeds"] and "3 runs of smoke a" in result["luck"]["covers"]
    assert result["metrics"]["group_top1"]["verdict"].startswith("smoke a is better than smoke a:ridge on group_top1")
    assert result["metrics"]["cosine"]["difference"] == pytest.approx(0.3, abs=1e-6)
    # One run and no reference: the baseline's side has no luck, the model's is not covered.
    one = write(tmp_path, "one", table(300, 0.5, seed=12))
    single, _ = run_json(capsys, one, "--baseline", "ridge")
    assert not single["luck"]["covers_seeds"] and single["metrics"]["cosine"]["outcome"] == "inconclusive"


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
    assert result["a"]["runs"][0]["kind"] == result["b"]["runs"][0]["kind"] == "file" and result["shared_items"] == 100


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
    items = repo / ITEMS_PATH
    table(200, 0.3, seed=13).to_parquet(items, index=False)
    git("add", "-A")
    git("commit", "-qm", "first")
    table(200, 0.8, seed=14).to_parquet(items, index=False)
    git("commit", "-qam", "second")
    git("tag", "v2")
    table(200, 0.5, seed=15).to_parquet(items, index=False)  # uncommitted
    old, new = load("HEAD~1", root=repo), load("v2", root=repo)
    assert old.kind == new.kind == "git-revision" and "(commit " in new.description
    assert (new.table["group_rank"] == 1).mean() > 0.7 > (old.table["group_rank"] == 1).mean()
    ws = load("workspace", root=repo)
    assert ws.kind == "workspace" and ws.table.equals(pd.read_parquet(items))
    result = compare(Side("HEAD~1", [old]), Side("v2", [new]), RESAMPLES, SEED)
    assert result["metrics"]["group_top1"]["difference"] > 0.4 and not result["luck"]["covers_seeds"]
    # Several revisions as one side (replicates), resolved as names are.
    both = load_side("HEAD~1,v2", root=repo)
    assert [s.kind for s in both.sources] == ["git-revision", "git-revision"]
    with pytest.raises(CompareError, match="names no item table: .*not a git revision of .*not a DVC experiment"):
        load("nope", root=repo)


# --------------------------------------------------------------------------- as a user would


def _compare_in(root, env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.compare", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # reads the three smoke experiments (tests/conftest.py: three smoke runs to make)
def test_two_smoke_experiments_compared_by_name_and_by_mlflow_run_id(smoke_experiments):
    from mlflow.tracking import MlflowClient

    root = smoke_experiments.root
    env = {k: v for k, v in smoke_experiments.env.items() if k != "ENERGY_FLOW_LOG_DECISIONS"}  # a user's setting
    by_name = _compare_in(root, env, "smoke-a", "smoke-b", "--json", "--show", "5")
    assert by_name.returncode == 0, by_name.stderr[-3000:]
    # One test split, so no warning: the one line is where the decision went in MLflow.
    [logged] = by_name.stderr.splitlines()
    assert logged.startswith("compare: logged to MLflow: decision run "), by_name.stderr[-3000:]
    result = json.loads(by_name.stdout)
    assert result["a"]["runs"][0]["kind"] == result["b"]["runs"][0]["kind"] == "dvc-experiment"
    # The tables say what they came from: the smoke preset's arms, seed 0; its reference covers them.
    assert result["a"]["preset"] == "smoke" and [r["seed"] for r in result["a"]["runs"]] == [0]
    assert result["a"]["arm"]["digest"] != result["b"]["arm"]["digest"]  # another lr: another arm
    # The smoke reference was measured on smoke-a's arm only: smoke-b's single run borrows no spread.
    assert (
        not result["luck"]["covers_seeds"]
        and "smoke-b is another arm than the smoke reference's arm (smoke [" in (result["luck"]["covers"])
    )
    assert "needs replicates of its own" in result["luck"]["covers"]
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
            key = mlflow_key(f"eval/test/model/{m}")  # the headline metrics are on the run (top5 is not)
            if key is None:
                continue
            assert result["metrics"][m][side] == pytest.approx(run.data.metrics[key], abs=2e-6), (name, m)

    decisions = client.get_experiment_by_name("energy-flow-decisions")
    [decision] = client.search_runs([decisions.experiment_id])
    assert logged.split("decision run ")[1].startswith(decision.info.run_id)
    assert decision.data.params["metric"] and decision.data.tags  # (tests/test_tracking_decisions.py: what it holds)

    by_id = _compare_in(
        root, env, runs["smoke-a"].info.run_id, runs["smoke-b"].info.run_id, "--json", "--show", "5", "--no-log"
    )
    assert by_id.returncode == 0 and by_id.stderr == "", by_id.stderr[-3000:]
    same = json.loads(by_id.stdout)
    assert same["a"]["runs"][0]["kind"] == same["b"]["runs"][0]["kind"] == "mlflow-run"
    assert same["a"]["label"] == f"smoke-a (run {runs['smoke-a'].info.run_id[:8]})"

    def relabel(text: str) -> str:
        return text.replace("smoke-a", same["a"]["label"]).replace("smoke-b", same["b"]["label"])

    assert same["metrics"] == {
        m: {**r, "verdict": relabel(r["verdict"]), "why": relabel(r["why"])} for m, r in result["metrics"].items()
    }  # the same tables, the same numbers
    assert same["flipped"] == result["flipped"]

    # In words, a name against a run id, and the workspace (where smoke-a ran).
    text = _compare_in(root, env, "smoke-a", runs["smoke-b"].info.run_id)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "A = smoke-a (arm smoke [" in text.stdout and "DVC experiment smoke-a (commit " in text.stdout
    verdicts = [line for line in text.stdout.splitlines() if line.startswith(("inconclusive on", "smoke-b (run"))]
    assert len(verdicts) == len(METRICS)
    ws = _compare_in(root, env, "workspace", "smoke-b", "--json")
    assert ws.returncode == 0, ws.stderr[-3000:]
    assert json.loads(ws.stdout)["shared_items"] == result["shared_items"]


def test_the_committed_default_run_is_comparable_from_git_on_a_fresh_clone():
    """reports/eval_items.parquet is in git (dvc.yaml: cache: false), so `./dev compare main ...`
    works where DVC's cache holds nothing: the table is read from the commit, with its metadata."""
    from pipeline.core.paths import REPO_ROOT

    committed = load("HEAD", root=REPO_ROOT)
    assert committed.kind == "git-revision" and len(committed.table) > 0
    meta = committed.meta
    assert meta is not None and meta.preset == "default" and meta.seed == 0 and meta.arm_name == "default"


def test_identical_inputs_say_identical_and_stop(tmp_path, capsys):
    # Two copies of one run's table (as `compare main workspace` on a fresh clone finds them).
    df = table(200, 0.5, seed=4)
    a, b = write(tmp_path, "a", df, meta("a", 0)), write(tmp_path, "b", df, meta("a", 0))
    rc, text, err = run_main(capsys, a, b)
    assert rc == 0 and "identical: A (" in text and "nothing to compare" in text
    assert "inconclusive" not in text and "differing only in their seeds" not in err
    result, _ = run_json(capsys, a, b)
    assert result["identical"] and "metrics" not in result
    other = write(tmp_path, "c", table(200, 0.5, seed=5), meta("a", 1))
    assert not run_json(capsys, a, other)[0]["identical"]


def with_mlp(df: pd.DataFrame, seeds, hit_rate: float, cos_mean: float) -> pd.DataFrame:
    """The table with an MLP baseline's replicates (mlp.<seed>_... columns), each seed a little
    different, a replicate of one seed the same in every table that holds it."""
    df = df.copy()
    for s in seeds:
        rep = table(len(df), hit_rate + 0.005 * (s - 2), seed=900 + s, cos_mean=cos_mean, ids=df["id"])
        for c in ("rank", "group_rank", "cosine", "mse"):
            df[f"mlp.{s}_{c}"] = rep[c].to_numpy()
    return df


def mlp_meta(seed: int, mlp_seeds) -> TableMeta:
    trained = {"mlp": {"arm": "mlp-abc", "name": "MLP 8-4-8", "seeds": list(mlp_seeds)}}
    return TableMeta("smoke", "adigest", "smoke a", seed, "d1", trained)


def test_a_model_against_its_mlp_baseline_counts_the_mlps_replicates_and_their_seed_luck(
    tmp_path, capsys, reference_dir
):
    paths = []
    for s in (0, 1):
        df = with_mlp(table(400, 0.62 + 0.01 * s, seed=10 + s, cos_mean=0.6), range(s, s + 3), 0.5, 0.55)
        paths.append(write(tmp_path, f"a-s{s}", df, mlp_meta(s, range(s, s + 3))))
    result, _ = run_json(capsys, ",".join(paths), "--baseline", "mlp", "--no-log")
    # Seeds 0-2 beside the model of seed 0 and 1-3 beside that of seed 1: seeds 0, 1, 2, 3, once each.
    assert [r["seed"] for r in result["a"]["runs"]] == [0, 1, 2, 3]
    assert result["a"]["predictor"] == "mlp" and result["a"]["arm"]["digest"] == "mlp-abc"
    # Both sides have replicates: the interval covers both models' seeds, measured from them.
    assert result["luck"]["covers_seeds"] and "4 runs of" in result["luck"]["covers"]
    assert result["metrics"]["group_top1"]["outcome"] == "better"
    # One model run and no reference: the MLP's seeds are covered, the model's are not.
    result, _ = run_json(capsys, paths[0], "--baseline", "mlp", "--no-log")
    assert len(result["a"]["runs"]) == 3 and not result["luck"]["covers_seeds"]


def test_a_table_without_mlp_replicates_says_to_re_evaluate(tmp_path, capsys):
    path = write(tmp_path, "old", table(50, 0.6, seed=1), meta("a", 0))
    rc, _, err = run_main(capsys, path, "--baseline", "mlp", "--no-log")
    assert rc == 2 and "holds no mlp replicates" in err and "re-run the evaluate stage" in err
