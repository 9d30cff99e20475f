"""The trainer's device telemetry and flow-loop choice, on a CPU: host reads and ops counted over
every source, the masked loop training exactly as the compacting one with one host read per step,
overruns of its fixed length, and the CUDA-graph and precision choices where there is no GPU."""

import math

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.train.cuda_graph import FlowRunner, why_eager
from pipeline.train.device import fastest_precision, precision_candidates
from pipeline.train.loop import Trainer, train_model
from pipeline.train.telemetry import sample_due

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_intra_op_thread")]


def data(n=320, dim=384, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    y = x @ (rng.standard_normal((dim, dim)).astype(np.float32) / 20)
    return x / np.linalg.norm(x, axis=1, keepdims=True), y / np.linalg.norm(y, axis=1, keepdims=True)


def cfg(*overrides):
    return load_config(["preset=smoke", "train.device=cpu", "train.checkpoint_every=0", *overrides])


@pytest.fixture(scope="module")
def runs():
    x, y = data()
    return {loop: train_model(cfg(f"train.flow_loop={loop}"), x, y, progress=False) for loop in ("compact", "masked")}


def test_masked_loop_trains_as_the_compacting_loop(runs):
    compact, masked = runs["compact"], runs["masked"]
    assert masked.summary["flow/loop"] == 1.0 and compact.summary["flow/loop"] == 0.0
    a = [r["train/loss"] for r in compact.rows]
    b = [r["train/loss"] for r in masked.rows]
    assert np.allclose(a, b, rtol=1e-5, atol=0)
    assert [r["flow/steps_used"] for r in compact.rows] == [r["flow/steps_used"] for r in masked.rows]
    assert masked.summary["flow/overruns"] == 0
    for p, q in zip(compact.model.parameters(), masked.model.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


def test_host_reads_counted_from_every_source(runs):
    compact, masked = runs["compact"], runs["masked"]
    # The masked loop: the step's one read (health read-out, flow counters with it). The
    # compacting loop: that one plus one live-flow count per flow step.
    assert masked.summary["perf/host_syncs_per_step"] == 1.0
    steps = compact.summary["flow/steps_used"]
    assert compact.summary["perf/host_syncs_per_step"] == 1.0 + steps
    assert compact.summary["perf/ops_per_step"] > 500
    sampled = [r for r in compact.rows if math.isfinite(r["perf/host_syncs"])]
    assert sampled and sampled[0]["step"] >= 3  # rows from the first sampled step on
    # No device here: kernels and busy time are not measured, and not made up.
    assert all(math.isnan(r["perf/gpu_busy"]) and r["perf/busy_synthetic"] == 0.0 for r in compact.rows)
    assert math.isnan(compact.summary["perf/kernels_per_step"])


def test_flow_step_time_is_step_time_over_flow_steps(runs):
    for r in runs["compact"].rows:
        assert r["perf/flow_step_ms"] == pytest.approx(r["perf/step_ms"] / r["flow/steps_used"])


def test_sampled_steps_are_sparse_and_never_both():
    counted = [s for s in range(1, 1000) if sample_due(s, "cuda") == "count"]
    profiled = [s for s in range(1, 1000) if sample_due(s, "cuda") == "profile"]
    assert counted[:3] == [3, 13, 113] and len(counted) == 11
    assert profiled == [s + 1 for s in counted]
    assert all(sample_due(s, "cpu") != "profile" for s in range(1, 1000))


def test_an_overrun_is_not_applied_and_lengthens_the_loop():
    x, y = data()
    trainer = Trainer(cfg("train.flow_loop=masked", "train.epochs=1"), x, y, progress=False)
    trainer.model.fixed_steps = 1  # shorter than any batch needs: step 1 overruns
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.run()
    overruns = [e for e in result.events if e["kind"] == "flow_overrun"]
    assert overruns and overruns[0]["step"] == 1
    assert result.summary["flow/overruns"] == len(overruns)
    assert result.summary["train/skipped_steps"] == 0  # not a health skip
    assert trainer.model.fixed_steps >= result.summary["flow/steps_used"]
    assert any(not torch.equal(p, b) for p, b in zip(trainer.model.parameters(), before))


def test_no_cuda_graph_without_cuda():
    x, y = data(64)
    trainer = Trainer(cfg("train.flow_loop=masked"), x, y, progress=False)
    assert not trainer.runner.enabled
    assert "not CUDA" in trainer.runner.why_not
    reasons = why_eager(trainer.model, torch.device("cpu"), processes=2, grad_accum=2, anomaly=True)
    assert len(reasons) == 4
    with pytest.raises(PipelineError, match="train.cuda_graph=always.*not CUDA"):
        FlowRunner(trainer.model, trainer.model, torch.device("cpu"), "always", reasons)


def test_precision_auto_is_fp32_off_cuda():
    assert precision_candidates("auto", torch.device("cpu")) == [None]
    assert precision_candidates("bf16", torch.device("cpu")) == [torch.bfloat16]
    assert precision_candidates("tf32", torch.device("cpu")) == [None]


def test_precision_auto_keeps_the_faster_and_changes_nothing(monkeypatch):
    """The choice itself (it runs on CUDA only): both candidates timed on the first batch, the
    faster kept, no update made. Synchronising is the one CUDA call in it; here there is nothing
    to wait for."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    x, y = data(64)
    trainer = Trainer(cfg(), x, y, progress=False)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    chosen = fastest_precision(trainer, [None, torch.bfloat16])
    assert set(trainer.precision_ms) == {"fp32", "bf16"}
    fastest = min(trainer.precision_ms, key=trainer.precision_ms.get)
    assert chosen == (None if fastest == "fp32" else torch.bfloat16)
    assert all(torch.equal(p, b) for p, b in zip(trainer.model.parameters(), before))
    assert all(p.grad is None for p in trainer.model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a CUDA graph captures GPU kernels")
def test_on_cuda_the_graphed_masked_loop_trains_as_the_eager_one_and_is_measured():
    x, y = data()
    base = ["train.device=cuda", "train.precision=fp32", "train.flow_loop=masked", "train.epochs=2"]
    eager = train_model(cfg(*base, "train.cuda_graph=never"), x, y, progress=False)
    graphed = train_model(cfg(*base, "train.cuda_graph=always"), x, y, progress=False)
    assert graphed.summary["perf/cuda_graph"] == 1.0 and eager.summary["perf/cuda_graph"] == 0.0
    a = [r["train/loss"] for r in eager.rows]
    b = [r["train/loss"] for r in graphed.rows]
    assert np.allclose(a, b, rtol=1e-3, atol=1e-5)
    for run in (eager, graphed):
        assert run.summary["perf/host_syncs_per_step"] == 1.0
        assert run.summary["perf/kernels_per_step"] > 0 and 0 < run.summary["perf/gpu_busy"] <= 1
