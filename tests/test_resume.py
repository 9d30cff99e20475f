"""Kill-and-resume: a training process killed with SIGKILL and started again ends with exactly
the weights (bitwise, CPU, same seed) and the telemetry of an uninterrupted run."""

import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.train.checkpoints import Checkpointing
from pipeline.train.loop import train_model
from pipeline.train.resume_state import STATE_FILE, fingerprint, load_state
from tests.helpers.synthetic import linear_task

pytestmark = pytest.mark.integration

REPO = __import__("pipeline.core.paths", fromlist=["REPO_ROOT"]).REPO_ROOT


def worker(out, *args):
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.resume_worker", str(out), *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # 11-14 s; tests/test_e2e.py kills and resumes the real train stage in the default suite
def test_sigkilled_run_resumes_to_the_uninterrupted_weights(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    assert worker(whole).returncode == 0
    first = worker(killed, 14)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert not (killed / "final.pt").exists()
    state = torch.load(killed / STATE_FILE, weights_only=True)
    assert state["step"] == 12  # the last checkpoint before the kill at 14
    second = worker(killed)
    assert second.returncode == 0, second.stderr
    assert "resumed from the checkpoint at step 12" in second.stderr
    a = torch.load(whole / "final.pt", weights_only=True)
    b = torch.load(killed / "final.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert [r["step"] for r in b["rows"]] == [r["step"] for r in a["rows"]]
    for ra, rb in zip(a["rows"], b["rows"]):
        assert ra["train/loss"] == rb["train/loss"] and ra["grad/global_norm"] == rb["grad/global_norm"]
    assert b["summary"]["train/resumed_from_step"] == 12 and a["summary"]["train/resumed_from_step"] == 0
    for k in ("train/loss", "val/loss", "val/cosine", "train/steps"):
        assert a["summary"][k] == b["summary"][k]


def _cfg(*extra):
    return load_config(
        [
            "preset=smoke",
            "train.epochs=1",
            "train.batch_size=16",
            "train.log_every=2",
            "train.device=cpu",
            "train.checkpoint_every=4",
            *extra,
        ]
    )


def test_checkpoint_holds_everything_to_resume_and_loads_without_pickle(tmp_path):
    x, y = linear_task()
    cfg = _cfg("train.precision=fp16")
    path = tmp_path / STATE_FILE
    train_model(cfg, x, y, progress=False, checkpointing=Checkpointing(path, "fp", 4, extra={"run_id": "abc"}))
    state = torch.load(path, weights_only=True)  # raises on any non-tensor, non-plain object
    assert state["step"] == 12 and state["epoch"] == 0 and state["epoch_step"] == 12
    assert set(state) >= {
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "rng",
        "spikes",
        "counters",
        "rows",
        "events",
        "extra",
        "fingerprint",
    }
    assert state["scaler"]["scale"] == 1024.0 and state["extra"] == {"run_id": "abc"}
    assert len(state["rows"]) == 6 and math.isfinite(state["counters"]["elapsed"])


def test_checkpoint_of_another_config_is_not_resumed(tmp_path, caplog):
    x, y = linear_task()
    path = tmp_path / STATE_FILE
    cfg = _cfg()
    train_model(cfg, x, y, progress=False, checkpointing=Checkpointing(path, fingerprint(cfg, "d"), 4))
    assert load_state(path, fingerprint(cfg, "d"))["step"] == 12
    assert fingerprint(_cfg("train.log_every=4"), "d") == fingerprint(cfg, "d")  # logging only: same run
    for other in (fingerprint(_cfg("train.lr=0.01"), "d"), fingerprint(cfg, "other data")):
        assert other != fingerprint(cfg, "d")
        with caplog.at_level("WARNING"):
            assert load_state(path, other) is None
        assert "another config or dataset" in caplog.text
    path.write_bytes(b"not a checkpoint")
    with caplog.at_level("WARNING"):
        assert load_state(path, fingerprint(cfg, "d")) is None
    assert "unreadable" in caplog.text


@pytest.mark.parametrize(
    "flow_loop, stop_at",
    [("compact", 10), ("masked", 14)],  # masked: a state after it fitted its length (step 10)
)
def test_resume_in_process_continues_where_the_state_left_off(tmp_path, flow_loop, stop_at):
    """The same as the kill test without a subprocess: a state taken a log step before `stop_at`
    and resumed."""
    x, y = linear_task()
    cfg = _cfg("train.epochs=2", f"train.flow_loop={flow_loop}")
    whole = train_model(cfg, x, y, progress=False)
    path = tmp_path / STATE_FILE

    class Stop(Exception):
        pass

    def stop(metrics, step):
        if step == stop_at:
            raise Stop

    try:
        train_model(cfg, x, y, progress=False, on_log=stop, checkpointing=Checkpointing(path, "f", 4))
    except Stop:
        pass
    state = load_state(path, "f")
    assert state["step"] == stop_at - 2
    resumed = train_model(cfg, x, y, progress=False, checkpointing=Checkpointing(path, "f", 4, resume_from=state))
    for k, v in whole.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert np.array_equal([r["train/loss"] for r in whole.rows], [r["train/loss"] for r in resumed.rows])


def test_sigterm_mid_run_checkpoints_the_step_it_finishes_and_resumes_to_the_same_weights(tmp_path):
    """SIGTERM arrives inside step 7 (between two log boundaries): the step is finished, its
    telemetry row closed and a checkpoint of step 7 written, then the run stops with Terminated;
    run again, it ends bitwise where an uninterrupted run ends."""
    import os

    import pytest

    from pipeline.core.errors import Terminated
    from pipeline.train.loop import Trainer

    x, y = linear_task()
    cfg = _cfg("train.checkpoint_every=8")
    whole = train_model(cfg, x, y, progress=False)
    path = tmp_path / STATE_FILE
    trainer = Trainer(cfg, x, y, progress=False, checkpointing=Checkpointing(path, "fp", 8))
    original = trainer.health.measure  # once a step, after backward, before the optimizer step

    def signal_in_step_7(*args, **kwargs):  # mid-step
        if trainer.step == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    trainer.health.measure = signal_in_step_7
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        trainer.run()
    assert signal.getsignal(signal.SIGTERM) is before  # the held-signal handler was for the run only
    state = load_state(path, "fp")
    assert state["step"] == 7 and state["rows"][-1]["step"] == 7  # the partial window's row is kept
    resumed = train_model(cfg, x, y, progress=False, checkpointing=Checkpointing(path, "fp", 8, resume_from=state))
    assert resumed.summary["train/resumed_from_step"] == 7
    for k, v in whole.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
