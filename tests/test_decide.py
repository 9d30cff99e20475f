"""`./dev decide` (tools/decide.py, pipeline/stats/sequential.py): seed pairs through DVC's queue
until the answer is clear.

Unit: the plan (which seeds, which looks at which levels, the A/A case), the argument checks, and
the page a decision writes. E2E (slow): on the smoke preset in a scratch copy of the project, a
seed-only change reaches "equivalent" and the linear path "better", each within 5 seed pairs,
through real `dvc exp run --queue` experiments, with the decision's files written and no queue
worker left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pipeline.core.errors import PipelineError
from pipeline.stats import sequential
from tools import decide


def args(**kw) -> SimpleNamespace:
    base = dict(preset="smoke", baseline_sets=[], sets=[], first_seed=0, max_seeds=5, metric="cosine", margin=0.05)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.unit
def test_a_change_runs_matched_seeds_and_looks_from_the_first_pair_with_a_reference():
    plan = sequential.make_plan(args(sets=["model.residual=linear"]))
    assert not plan.same_arm and plan.a_seeds == plan.b_seeds == [0, 1, 2, 3, 4]
    assert plan.a_sets == ["preset=smoke"] and plan.b_sets == ["preset=smoke", "model.residual=linear"]
    # The smoke preset has a committed seed-variance reference: the first look after one pair.
    assert plan.looks.first_look == 1 and list(plan.looks.levels) == [1, 2, 3, 4, 5]
    assert sum(1 - v for v in plan.looks.levels.values()) == pytest.approx(0.05)


@pytest.mark.unit
def test_a_seed_only_change_is_an_aa_comparison_on_other_seeds():
    plan = sequential.make_plan(args(sets=["train.log_every=4"]))  # logging only: the same arm
    assert plan.same_arm and plan.b_seeds == [1000, 1001, 1002, 1003, 1004] and plan.a_seeds[0] == 0
    plan = sequential.make_plan(args(sets=["run.seed=77"]))
    assert plan.same_arm and plan.b_seeds[0] == 77 and plan.b_sets == ["preset=smoke"]


@pytest.mark.unit
def test_without_a_reference_the_first_look_waits_for_two_seeds(monkeypatch):
    monkeypatch.setattr(sequential, "load_references", lambda: [])
    plan = sequential.make_plan(args(preset="default", sets=["train.lr=0.001"], max_seeds=4))
    assert plan.looks.first_look == 2 and list(plan.looks.levels) == [2, 3, 4]
    with pytest.raises(PipelineError, match="needs 2 seeds per arm"):
        sequential.make_plan(args(preset="default", sets=["train.lr=0.001"], max_seeds=1))


@pytest.mark.unit
def test_bad_arguments_stop_before_anything_is_queued(capsys):
    for argv, message in (
        ([], "give the change to decide on"),
        (["-S", "train.lr=0.001", "--max-seeds", "0"], "must be >= 1"),
        (["-S", "train.lr=0.001", "--margin", "-1"], "--margin -1"),
        (["-S", "train.lr=0.001", "--name", "a/b"], "--name"),
    ):
        with pytest.raises(SystemExit) as e:
            decide.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err, argv
    # A change Hydra or the schema refuses: one line, exit 2, nothing queued.
    assert decide.main(["-S", "train.nope=1", "--preset", "smoke"]) == 2
    assert "train.nope" in capsys.readouterr().err


@pytest.mark.unit
def test_the_page_shows_the_outcome_the_looks_the_curves_and_the_flips(tmp_path):
    from pipeline.report.decision_page import render_page

    d = {
        "metric": "cosine",
        "higher_is_better": True,
        "a": 0.5,
        "b": 0.8,
        "difference": 0.3,
        "ci_low": 0.25,
        "ci_high": 0.35,
        "level": 0.985,
        "p_value": 0.001,
        "prob_b_better": 1.0,
        "outcome": "better",
        "margin": 0.05,
        "why": "x",
        "seeds_needed": None,
        "covers_seeds": True,
        "verdict": "B is better than A on cosine: +0.300 [+0.250, +0.350], P(B better) 1.00",
    }
    result = {
        "name": "smoke-residual=linear",
        "metric": "cosine",
        "higher_is_better": True,
        "margin": 0.05,
        "outcome": "better",
        "rounds": 2,
        "max_seeds": 5,
        "same_arm": False,
        "a": {
            "label": "A",
            "overrides": ["preset=smoke"],
            "arm": {"digest": "a1", "name": "smoke"},
            "seeds": [0, 1],
            "experiments": ["rep-a-s0", "rep-a-s1"],
        },
        "b": {
            "label": "B",
            "overrides": ["preset=smoke", "model.residual=linear"],
            "arm": {"digest": "b1", "name": "smoke residual=linear"},
            "seeds": [0, 1],
            "experiments": ["rep-b-s0", "rep-b-s1"],
        },
        "method": {"levels": {"1": 0.99, "2": 0.985}},
        "covers": "test items and training seeds",
        "items": 62,
        "looks": [{"rounds": 1, "level": 0.99, **d}, {"rounds": 2, "level": 0.985, **d}],
        "decision": d,
        "metrics": {
            "cosine": d,
            "mse": {
                **d,
                "metric": "mse",
                "higher_is_better": False,
                "difference": -0.01,
                "ci_low": -0.02,
                "ci_high": -0.005,
                "margin": 2e-5,
            },
        },
        "flipped": {
            "metric": "group_top1",
            "a_only": 0,
            "a_only_items": [],
            "b_only": 1,
            "b_only_items": [
                {"id": "q1", "input": "What <b>?", "target": "An answer.", "a_hit_rate": 0.0, "b_hit_rate": 1.0}
            ],
        },
        "curves": {
            "A": {"0": {"step": [2, 4], "loss": [1.0, 0.8]}, "1": {"step": [2, 4], "loss": [1.1, 0.7]}},
            "B": {"0": {"step": [2, 4], "loss": [0.3, 0.2]}},
        },
    }
    page = render_page(result)
    assert page.index("BETTER") < page.index("What the intervals cover") < page.index("The looks")
    assert "62 shared test items" in page and page.count("data:image/png;base64,") == 3
    assert "What &lt;b&gt;?" in page and "<b>?" not in page  # texts are escaped
    assert "rep-b-s1" in page and "smoke residual=linear" in page


# --------------------------------------------------------------------------- e2e: real seed pairs


@pytest.mark.e2e
@pytest.mark.slow
def test_decide_on_the_smoke_preset_equivalent_for_a_seed_only_change_better_for_a_real_one(tmp_path_factory):
    from tools import reference as smoke_reference
    from tools.fault_matrix import project_copy

    root = project_copy(tmp_path_factory.mktemp("decide"))
    env = smoke_reference.reference_env()

    def run(*argv: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.decide", "--preset", "smoke", "-j", "2", "--json", *argv],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "[decide] look after" in proc.stderr  # progress on the terminal
        return json.loads(proc.stdout)

    # A seed-only change: B is the same arm on seeds 1000+. Smoke's test cosine moves by ~0.02
    # from seed to seed (two modes: reference/seed_variance/smoke.json), so the margin is wide.
    same = run("-S", "run.seed=1000", "--metric", "cosine", "--margin", "0.05", "--name", "aa")
    assert same["same_arm"] and same["outcome"] == "equivalent" and same["rounds"] <= 5, same["looks"]
    assert same["b"]["seeds"][0] == 1000 and same["a"]["seeds"][0] == 0
    # A real change: the linear path around the lattice, on the headline retrieval metric.
    real = run("-S", "model.residual=linear", "--metric", "group_top1", "--name", "linear")
    assert real["outcome"] == "better" and real["rounds"] <= 5 and not real["same_arm"]
    assert real["decision"]["covers_seeds"] and real["a"]["seeds"] == list(range(real["rounds"]))
    for name in ("aa", "linear"):
        page = root / "reports" / "decisions" / f"{name}.html"
        assert page.is_file() and (root / "reports" / "decisions" / f"{name}.json").is_file()
    # A/A reused the baseline arm's experiments of the first decision: none trained twice.
    assert set(real["a"]["experiments"]) <= set(same["a"]["experiments"])
    # No queue worker outlives the command.
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "queue", "status"], cwd=root, env=env, capture_output=True, text=True
    )
    assert "Worker status: 0 active, 0 idle" in status.stdout, status.stdout
