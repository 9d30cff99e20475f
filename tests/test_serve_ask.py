"""`./dev ask` (tools/ask.py) as a user runs it, in a subprocess, on a real logged answer model:
the default model is runs/train.json's run; errors a user can act on exit 2 with one line; Ctrl-C
stops it with one line (exit 130); nothing is left in the system temp directory, whatever the end."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.answer.bank import bank_from_shards
from pipeline.core.paths import REPO_ROOT
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
    assert project.model_uri in proc.stderr  # which model answered


def test_ask_without_a_trained_model_or_with_a_uri_that_holds_none_says_what_to_do(project, tmp_path):
    nothing = {**project.env, "ENERGY_FLOW_RUNS_DIR": str(tmp_path / "runs")}
    proc = ask(project, "Where is Kabul?", env=nothing)
    # No runs/train.json, so the run is looked up by the model file's digest (as on a fresh clone
    # that pulled it), and this project's run carries no train.model_sha256 tag: no run to ask.
    assert proc.returncode == 2 and "no run in the tracking store" in proc.stderr, proc.stderr
    assert "train.model_sha256" in proc.stderr and "run ./dev repro" in proc.stderr
    proc = ask(project, "Where is Kabul?", "--model", str(tmp_path / "missing"))
    assert proc.returncode == 2 and f"no MLflow model at {tmp_path / 'missing'}" in proc.stderr, proc.stderr


def test_dev_ask_help_explains_the_command():
    proc = subprocess.run([str(REPO_ROOT / "dev"), "ask", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage: ./dev ask" in proc.stdout and "--model URI" in proc.stdout
    assert "runs/train.json" in proc.stdout


def leftovers(tmp: Path) -> list[str]:
    """What is in the temp directory `tmp`, but torch's own per-user compile cache directory,
    which importing torch makes (empty) and every later run reuses: it may stay, holding nothing."""
    torch_cache = [p for p in tmp.glob("torchinductor_*") if p.is_dir()]
    assert not [f for d in torch_cache for f in d.rglob("*") if f.is_file()], "torch's cache holds files"
    return sorted(p.name for p in tmp.iterdir() if p not in torch_cache)


def test_ask_leaves_no_model_copy_in_the_system_temp_directory_also_when_it_fails(project, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**project.env, "TMPDIR": str(tmp)}
    proc = ask(project, "Where is Kabul?", env=env)
    assert proc.returncode == 0 and leftovers(tmp) == [], proc.stderr
    # A download that starts, then fails (the run exists, the artifact does not).
    proc = ask(project, "Where is Kabul?", "--model", f"runs:/{project.run_id}/no-such-model", env=env)
    assert proc.returncode == 2 and "no MLflow model at" in proc.stderr and leftovers(tmp) == [], proc.stderr


def test_a_question_over_the_length_limit_is_refused_before_the_model_loads(project):
    proc = ask(project, "Where is Kabul?", "x" * 9000)
    assert proc.returncode == 2 and "[ask] loading" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        "ask: question 2 is too long: 9000 characters, the limit is 8192 per question; shorten it, or raise "
        "the limit with ENERGY_FLOW_SERVE_MAX_QUESTION_CHARS (the environment of the server, or of ./dev ask)"
    )
    proc = ask(project, "Where is Kabul?", env={**project.env, "ENERGY_FLOW_SERVE_MAX_ROWS": "lots"})
    assert proc.returncode == 2 and "ENERGY_FLOW_SERVE_MAX_ROWS='lots': expected an integer >= 1" in proc.stderr


def test_a_long_question_is_answered_and_said_to_be_truncated(project):
    proc = ask(project, "Where is Kabul?", "word " * 300, "-k", "1")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if "truncated" in line]
    assert notes == ["  (truncated: the teacher read only its first 256 tokens of it)"], proc.stdout
    assert proc.stdout.index("truncated") > proc.stdout.index("Q: word")  # under the long one


@pytest.mark.slow  # a long ask in a subprocess, stopped part-way (the model loads twice)
def test_ctrl_c_stops_a_long_ask_in_one_line_saying_what_was_answered(project, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    questions = [f"What is the capital of country number {i}?" for i in range(3000)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.ask", *questions, "-k", "1"],
        cwd=project.root,
        env={**project.env, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # the first batch is printed as soon as it is answered
        assert first.startswith("Q: What is the capital of country number 0?"), first
        proc.send_signal(signal.SIGINT)
        # read(), not communicate(): communicate reads the pipe itself and would miss what readline
        # has already buffered. stderr holds a few lines: it cannot fill its pipe meanwhile. The
        # timer ends an ask that ignored Ctrl-C, so the reads end.
        watchdog = threading.Timer(300, proc.kill)
        watchdog.start()
        try:
            out, err = proc.stdout.read(), proc.stderr.read()
            proc.wait(timeout=30)
        finally:
            watchdog.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(r"ask: stopped \(Ctrl-C\) after answering (\d+) of 3000 questions; their answers are above", last)
    assert m, err
    answered = int(m.group(1))
    assert 0 < answered < 3000 and (first + out).count("\nQ: ") + 1 == answered  # exactly what was printed
    assert leftovers(tmp) == []


# Imports tools.ask and asks in-process, then says whether any part of MLflow was imported.
_NO_MLFLOW = """
import sys
from tools import ask
rc = ask.main(sys.argv[1:])
print("mlflow imported:", any(m == "mlflow" or m.startswith("mlflow.") for m in sys.modules), file=sys.stderr)
sys.exit(rc)
"""


def test_the_recorded_local_model_answers_without_mlflow_or_a_copy(project, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    record = json.loads((project.root / "runs" / "evaluate.json").read_text())
    proc = subprocess.run(
        [sys.executable, "-c", _NO_MLFLOW, "Which currency does Japan use?", "-k", "2"],
        cwd=project.root,
        env={**project.env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "mlflow imported: False" in proc.stderr
    # The store's own directory, recorded relative to the checkout (a copied checkout finds its own).
    assert not Path(record["model_dir"]).is_absolute(), record
    assert f"{project.model_uri} from {project.root / record['model_dir']}" in proc.stderr
    assert leftovers(tmp) == []  # nothing downloaded
    assert "Q: Which currency does Japan use?" in proc.stdout


@pytest.mark.slow  # asks twice, once through MLflow's store and download
def test_the_local_model_answers_as_mlflow_does_and_a_stale_record_goes_through_mlflow(project, tmp_path):
    questions = ["What is the capital of France?", "Who wrote 1984?"]
    fast = ask(project, *questions, "-k", "3")
    assert fast.returncode == 0 and "through MLflow" not in fast.stderr, fast.stderr
    runs = tmp_path / "runs"
    shutil.copytree(project.root / "runs", runs)
    record = json.loads((runs / "evaluate.json").read_text())
    (runs / "evaluate.json").write_text(json.dumps({**record, "run_id": "another"}))
    slow = ask(project, *questions, "-k", "3", env={**project.env, "ENERGY_FLOW_RUNS_DIR": str(runs)})
    assert slow.returncode == 0, slow.stderr
    assert "through MLflow" in slow.stderr and "is of another run than" in slow.stderr
    assert fast.stdout == slow.stdout  # the same answers and scores, to the printed digit
