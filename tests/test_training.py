import math

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.train.loop import train_model
from pipeline.train.optimizer import loss_weights, lr_lambda
from pipeline.train.result import TrainingDiverged
from pipeline.train.telemetry import step_columns
from pipeline.train.validation import evaluate_loss
from tests.helpers.synthetic import linear_task

pytestmark = pytest.mark.unit


def tiny_cfg(**overrides):
    base = ["preset=smoke", "train.epochs=3", "train.log_every=2", "train.device=cpu", "train.batch_size=16"]
    return load_config(base + [f"{k}={v}" for k, v in overrides.items()])


def test_training_learns_and_writes_telemetry():
    x, y = linear_task()
    cfg = tiny_cfg(**{"train.epochs": 6, "train.lr": 0.01})
    res = train_model(cfg, x, y, x[:32], y[:32], progress=False)
    losses = [r["train/loss"] for r in res.rows]
    assert losses[-1] < 0.8 * losses[0]
    assert res.module_names == ["output_mapper", "carrier", "neuron", "lattice", "input_mapper"]
    assert all(set(step_columns(res.module_names)) == set(r) for r in res.rows)
    assert res.summary["train/steps"] == 6 * (192 // 16)
    assert res.summary["train/skipped_steps"] == 0 and res.events == []
    assert [r["step"] for r in res.rows] == list(range(2, 73, 2))
    assert all(r["flow/steps_used"] >= 1 and r["mem/rss_mb"] > 0 for r in res.rows)
    # Every row carries its log step's value ranges, read in the step's one read.
    for r in res.rows:
        for what in ("energy", "hidden", "surface"):
            lo, hi, rms = (r[f"range/{what}_{s}"] for s in ("min", "max", "rms"))
            assert lo <= hi and 0 <= rms <= max(abs(lo), abs(hi)) + 1e-6, (r["step"], what)
    assert math.isfinite(res.summary["val/cosine"])


def test_the_default_s_additions_train_through_the_trainer():
    """The linear path and the InfoNCE term (the default preset's; smoke keeps the prototype's
    model): the trainer builds the path, trains with the term, and its val loss includes it."""
    x, y = linear_task()
    base = {"train.epochs": 6, "train.lr": 0.01}
    plain = train_model(tiny_cfg(**base), x, y, x[:32], y[:32], progress=False)
    cfg = tiny_cfg(**base, **{"model.residual": "linear", "train.nce_weight": 0.1})
    res = train_model(cfg, x, y, x[:32], y[:32], progress=False)
    assert res.module_names[0] == "skip"  # nearest the loss: the path is a trained module
    assert all(r["grad/skip/norm"] > 0 for r in res.rows)
    losses = [r["train/loss"] for r in res.rows]
    assert losses[-1] < 0.5 * losses[0]
    # A linear task: the linear path fits it far better than the 4 x 4 surface alone.
    assert res.summary["val/cosine"] > plain.summary["val/cosine"] + 0.05
    # The val loss is the same loss as training's, InfoNCE term included.
    cpu = torch.device("cpu")
    full = evaluate_loss(res.model, x[:32], y[:32], 16, loss_weights(cfg.train), cpu)
    without = evaluate_loss(res.model, x[:32], y[:32], 16, {"cosine_weight": 1.0}, cpu)
    assert res.summary["val/loss"] == pytest.approx(full["loss"], rel=1e-6)
    assert full["loss"] > without["loss"]


def test_same_seed_same_weights_and_metrics_bitwise():
    x, y = linear_task()
    a = train_model(tiny_cfg(), x, y, x[:32], y[:32], progress=False)
    b = train_model(tiny_cfg(), x, y, x[:32], y[:32], progress=False)
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k

    def metrics(row):  # everything but timings and memory; NaN as None so that NaN == NaN
        return {k: None if v != v else v for k, v in row.items() if not k.startswith(("perf/", "mem/"))}

    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert metrics(ra) == metrics(rb)
    for k in ("train/loss", "val/loss", "val/cosine"):
        assert a.summary[k] == b.summary[k]


def test_nonfinite_steps_are_skipped_counted_and_named():
    x, y = linear_task()
    y = y.copy()
    y[5] = np.nan  # every batch holding row 5 has a NaN loss
    res = train_model(tiny_cfg(), x, y, progress=False)
    epochs = 3
    assert res.summary["train/skipped_steps"] == epochs
    assert len(res.events) == epochs
    assert all(e["kind"] == "nan_loss" and e["action"] == "skipped" for e in res.events)
    # The loss is NaN, so every module's gradient is: the one nearest the loss is named.
    assert all(e["module"] == "output_mapper" for e in res.events)
    assert sum(r["train/skipped"] for r in res.rows) == epochs
    for p in res.model.parameters():
        assert torch.isfinite(p).all()  # skipped steps never reached the weights


def test_consecutive_skips_stop_the_run_with_a_clear_error():
    x, y = linear_task()
    with pytest.raises(TrainingDiverged, match="3 consecutive skipped steps") as err:
        train_model(tiny_cfg(**{"train.max_consecutive_skips": 3}), x, np.full_like(y, np.inf), progress=False)
    assert len(err.value.result.events) == 3


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    f = lr_lambda(warmup=10, total=110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(110) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 110))


def test_process_wide_settings_are_restored_after_a_run():
    x, y = linear_task()
    threads = torch.get_num_threads()
    assert not torch.are_deterministic_algorithms_enabled()
    train_model(tiny_cfg(**{"train.threads": 1, "train.epochs": 1}), x, y, progress=False)
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()
