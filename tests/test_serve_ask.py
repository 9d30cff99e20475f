"""`./dev ask` (tools/ask.py) as a user runs it, in a subprocess, on a real logged answer model:
the default model is runs/train.json's run; errors a user can act on exit 2 with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.core.paths import REPO_ROOT
from pipeline.serve.bank import bank_from_shards
from tests.helpers.answer_model import AnswerProject

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


def ask(project: AnswerProject, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.ask", *args],
        cwd=project.root,
        env=env or project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ask_prints_each_questions_answers_from_the_last_trained_model(project):
    questions = ["What is the capital of France?", "Which currency does Japan use?"]
    proc = ask(project, *questions, "-k", "2")
    assert proc.returncode == 0, proc.stderr
    bank = set(bank_from_shards(project.shard_dir).texts)
    lines = proc.stdout.splitlines()
    for q in questions:
        i = lines.index(f"Q: {q}")
        for rank in (1, 2):
            prefix, score, text = lines[i + rank].split(maxsplit=2)
            assert prefix == f"{rank}." and -1 <= float(score) <= 1 and text in bank
    assert f"runs:/{project.run_id}/model" in proc.stderr  # which model answered


def test_ask_without_a_trained_model_or_with_a_uri_that_holds_none_says_what_to_do(project, tmp_path):
    nothing = {**project.env, "ENERGY_FLOW_RUNS_DIR": str(tmp_path / "runs")}
    proc = ask(project, "Where is Kabul?", env=nothing)
    assert proc.returncode == 2 and "no trained model yet" in proc.stderr and "run ./dev repro first" in proc.stderr
    proc = ask(project, "Where is Kabul?", "--model", str(tmp_path / "missing"))
    assert proc.returncode == 2 and f"no MLflow model at {tmp_path / 'missing'}" in proc.stderr, proc.stderr


def test_dev_ask_help_explains_the_command():
    proc = subprocess.run([str(REPO_ROOT / "dev"), "ask", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage: ./dev ask" in proc.stdout and "--model URI" in proc.stdout
    assert "runs/train.json" in proc.stdout
