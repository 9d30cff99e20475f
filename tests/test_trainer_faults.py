"""Steps that go wrong: injected faults are skipped or flagged exactly, the schedule and the
scaler react as they should, and persistent trouble stops the run with a clear error."""

import math
import sys
import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pipeline.core.config import CONF_DIR, load_config
from pipeline.core.errors import ConfigError, PipelineError
from pipeline.train import faults, validation
from pipeline.train.faults import FaultInjector
from pipeline.train.loop import Trainer
from pipeline.train.optimizer import lr_lambda
from pipeline.train.result import TrainingDiverged
from pipeline.train.run_settings import run_settings
from tests.helpers.synthetic import linear_task

pytestmark = pytest.mark.unit

K = 7  # the faulty step
STEPS = 3 * (192 // 16)  # tiny_cfg: 3 epochs of 12 steps


def trainer(*overrides, data=None):
    base = [
        "preset=smoke",
        "train.epochs=3",
        "train.log_every=2",
        "train.device=cpu",
        "train.batch_size=16",
        "train.checkpoint_every=0",
    ]
    x, y = data or linear_task()
    return Trainer(load_config(base + list(overrides)), x, y, x[:32], y[:32], progress=False)


def assert_weights_finite(model):
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name


@pytest.mark.parametrize(
    "fault, kind, module", [("nan_loss", "nan_loss", "output_mapper"), ("inf_grad", "inf_grad", "neuron")]
)
def test_nonfinite_step_is_skipped_counted_and_named(fault, kind, module):
    tr = trainer(f"fault={fault}", f"fault.step={K}", "fault.module=neuron")
    res = tr.run()
    assert res.summary["train/skipped_steps"] == 1 and res.summary["train/steps"] == STEPS
    [event] = res.events
    assert event["step"] == K and event["kind"] == kind and event["module"] == module
    assert event["action"] == "skipped"
    if fault == "inf_grad":
        assert event["modules"] == ["neuron"]  # only the module hit
    # The LR schedule did not advance on the skipped step: one step behind a clean run.
    assert tr.sched.last_epoch == STEPS - 1
    assert tr.opt.param_groups[0]["lr"] == pytest.approx(3e-3 * lr_lambda(2, STEPS)(STEPS - 1))
    assert sum(r["train/skipped"] for r in res.rows) == 1 and res.rows[-1]["train/skipped_steps"] == 1
    row = next(r for r in res.rows if r["step"] >= K)
    assert row["grad/nonfinite_steps"] == 1 and row["grad/steps_exploded"] == 1
    assert math.isfinite(res.summary["train/loss"])
    assert_weights_finite(res.model)


def test_skipped_step_leaves_weights_and_optimizer_untouched():
    clean, faulty = trainer("train.epochs=1"), trainer("train.epochs=1", "fault=nan_loss", f"fault.step={K}")
    # Stop both after step K: the faulty one must hold exactly the weights of step K - 1. Under
    # the run's own settings (its thread count: torch's default, 2 threads on 2 busy cores, made
    # these few steps ten times slower).
    for t in (clean, faulty):
        with run_settings(t.t, t.place, t.device, t.amp_dtype):
            t.start()
            t.loader.set_epoch(0)
            batches = t.loader.batches()
            for _ in range(K - 1 if t is clean else K):
                t._train_step(batches)
    for k, v in clean.model.state_dict().items():
        assert torch.equal(v, faulty.model.state_dict()[k]), k
    assert clean.opt.state_dict()["state"][0]["step"] == faulty.opt.state_dict()["state"][0]["step"] == K - 1


def test_persistent_nonfinite_steps_stop_the_run():
    tr = trainer("fault=nan_loss", "fault.step=3", "fault.steps=100", "train.max_consecutive_skips=4")
    with pytest.raises(TrainingDiverged, match=r"4 consecutive skipped steps \(last at step 6, nan_loss") as err:
        tr.run()
    res = err.value.result
    assert [e["step"] for e in res.events] == [3, 4, 5, 6]
    assert res.rows[-1]["step"] == 6 and res.summary["train/skipped_steps"] == 4  # evidence kept


def test_loss_spike_is_flagged_and_optionally_skipped():
    res = trainer("fault=loss_spike", "fault.step=15").run()
    [event] = res.events
    assert event["kind"] == "loss_spike" and event["step"] == 15 and event["action"] == "flagged"
    assert event["loss"] > 100 * event["threshold"] > 0
    assert res.summary["train/spikes"] == 1 and res.summary["train/skipped_steps"] == 0
    res = trainer("fault=loss_spike", "fault.step=15", "train.skip_spikes=true").run()
    assert [(e["step"], e["action"]) for e in res.events] == [(15, "skipped")]
    assert res.summary["train/skipped_steps"] == 1


@pytest.mark.parametrize("fault", ["lr_spike", "lr_jump"])  # one multiplier; lr_jump's preset holds it longer
def test_lr_spike_shows_in_the_logged_lr_and_leaves_the_schedule(fault):
    clean = trainer().run()
    res = trainer(f"fault={fault}", "fault.step=5", "fault.steps=2", "fault.factor=100").run()
    lr = {r["step"]: r["train/lr"] for r in res.rows}
    clean_lr = {r["step"]: r["train/lr"] for r in clean.rows}
    assert lr[6] == pytest.approx(100 * clean_lr[6], rel=0.05)  # window 5-6 applied the spike
    assert lr[8] == pytest.approx(clean_lr[8])  # and then the schedule's own LR again


def test_leak_keeps_every_step_graph_alive_and_its_activations():
    tr = trainer("train.epochs=1", "fault=leak", "fault.step=1", "fault.leak_mb=1")
    tr.run()
    losses = [k for k in tr.faults._kept if isinstance(k, torch.Tensor)]
    [block] = [k for k in tr.faults._kept if not isinstance(k, torch.Tensor)]  # one block of 64 steps
    assert len(losses) == 12 and all(t.grad_fn is not None for t in losses)
    n = 2**20 // 4  # float32 elements in 1 MB
    assert block.size == 64 * n and (block[: 12 * n] == 1.0).all()  # 12 steps written, 1 MB each


class _ReadsFrom(TorchFunctionMode):
    """Counts host reads of a tensor's value (float(t), t.item()) made by code in one file (up the
    stack: the trainer's own counter, when it samples the step, sits between that code and this)."""

    def __init__(self, path: str):
        super().__init__()
        self.path, self.count = path, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("__float__", "item") and _called_from(self.path):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _called_from(path: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename != path:
        frame = frame.f_back
    return frame is not None


NAN = float("nan")


def injector(*overrides) -> FaultInjector:
    return FaultInjector(load_config(["preset=smoke", *overrides]).fault, torch.nn.Linear(2, 2))


def test_sync_bound_preset_reads_the_loss_factor_times_a_micro_batch_from_its_step_on():
    preset = load_config(["preset=smoke", "fault=sync_bound"]).fault
    assert (preset.kind, preset.step, preset.factor) == ("sync_bound", 1, 40.0)
    inj = injector("fault=sync_bound", "fault.step=3", "fault.factor=5")
    loss = torch.tensor(0.5, requires_grad=True) * 2
    with _ReadsFrom(faults.__file__) as reads:
        assert inj.on_loss(1, loss) is loss and inj.on_loss(2, loss) is loss and reads.count == 0
        assert inj.on_loss(3, loss) is loss and reads.count == 5  # the loss itself, untouched
        inj.on_loss(3, loss)  # a second micro-batch of the step: reads again
        inj.on_loss(10_000, loss)  # and it never stops
        assert reads.count == 15
    assert inj.take_overhead() == 0.0  # what the reads cost is the fault, not taken off the step time
    with pytest.raises(ConfigError, match="fault.factor.*whole number of host reads"):
        load_config(["fault=sync_bound", "fault.factor=2.5"])


def test_sync_bound_stands_in_for_a_missing_gpu_and_marks_it_synthetic():
    inj = injector("fault=sync_bound")
    cpu = {"host_syncs": 45.0, "ops": 1800.0, "kernels": NAN, "kernel_us": NAN, "gpu_busy": NAN}
    assert inj.device_figures(cpu, "cpu") == {
        "host_syncs": 45.0,  # counted: always the real ones
        "ops": 1800.0,
        "kernels": 1800.0,  # one kernel per op dispatched
        "kernel_us": 5.0,
        "gpu_busy": 0.05,
        "busy_synthetic": 1.0,
    }
    assert math.isnan(cpu["gpu_busy"]) and "busy_synthetic" not in cpu  # the sample itself is left alone
    # On CUDA the profiler's figures stand, and so does a busy share measured anywhere.
    cuda = {**cpu, "kernels": 900.0, "kernel_us": 30.0, "gpu_busy": 0.4}
    assert inj.device_figures(cuda, "cuda") == {**cuda, "busy_synthetic": 0.0}
    assert inj.device_figures(cuda, "cpu") == {**cuda, "busy_synthetic": 0.0}
    assert math.isnan(inj.device_figures(cpu, "cuda")["gpu_busy"])  # not measured there: stays NaN
    # A row no step was sampled for yet has nothing to stand in for.
    unsampled = dict.fromkeys(cpu, NAN)
    assert inj.device_figures(unsampled, "cpu")["busy_synthetic"] == 0.0
    # Any other fault, or none, passes the sample through.
    for other in ("fault=none", "fault=leak", "fault=nan_loss"):
        out = injector(other).device_figures(cpu, "cpu")
        assert out["busy_synthetic"] == 0.0 and math.isnan(out["gpu_busy"]) and out["ops"] == 1800.0
    assert injector("fault=none").device_figures({**cpu, "busy_synthetic": 1.0}, "cpu")["busy_synthetic"] == 1.0


def test_sync_bound_run_counts_its_reads_as_host_syncs_and_trains_the_same():
    """Through the trainer: every step's 3 reads happen, its step counter sees them as host syncs,
    the rows carry the synthetic device figures on this machine without a GPU, and the training
    itself is the clean run's (a read changes no value)."""
    clean = trainer().run()
    with _ReadsFrom(faults.__file__) as reads:
        res = trainer("fault=sync_bound", "fault.factor=3").run()
    assert reads.count == 3 * STEPS
    assert [r["train/loss"] for r in res.rows] == [r["train/loss"] for r in clean.rows]
    sampled = [(a, b) for a, b in zip(clean.rows, res.rows) if math.isfinite(b["perf/host_syncs"])]
    assert sampled and all(b["perf/host_syncs"] == a["perf/host_syncs"] + 3 for a, b in sampled)
    if not torch.cuda.is_available():
        assert all(b["perf/busy_synthetic"] == 1.0 and b["perf/gpu_busy"] == 0.05 for _, b in sampled)
        assert all(a["perf/busy_synthetic"] == 0.0 and math.isnan(a["perf/gpu_busy"]) for a, _ in sampled)


def test_fp16_scaler_backs_off_from_an_overflowing_scale_then_trains():
    tr = trainer(
        "train.precision=fp16",
        "train.scaler.init_scale=1099511627776.0",
        "train.scaler.backoff_factor=0.25",
        "train.max_consecutive_skips=30",
    )
    res = tr.run()
    skipped = [e for e in res.events if e["action"].startswith("skipped")]
    assert skipped and [e["step"] for e in skipped] == list(range(1, len(skipped) + 1))  # leading overflows
    scales = [e["scale"] for e in skipped]
    assert scales == [2.0**40 * 0.25**i for i in range(1, len(skipped) + 1)]  # backoff_factor each time
    assert res.summary["train/steps"] == STEPS and math.isfinite(res.summary["train/loss"])
    assert_weights_finite(res.model)


def test_fp16_scaler_grows_a_tiny_scale_every_growth_interval():
    res = trainer(
        "train.precision=fp16",
        "train.scaler.init_scale=0.0009765625",
        "train.scaler.growth_factor=2.0",
        "train.scaler.growth_interval=3",
        "train.log_every=1",
    ).run()
    assert res.events == []
    scale = {r["step"]: r["amp/scale"] for r in res.rows}  # the scale each step used
    assert [scale[s] for s in (1, 3, 4, 6, 7)] == [2.0**-10, 2.0**-10, 2.0**-9, 2.0**-9, 2.0**-8]


def test_scaler_recovery_standard_halves_prototype_divides_by_ten_floored_at_one():
    """The same five injected inf gradients (steps K..K+4) under each train.scaler.recovery: the
    scale after each overflow is x backoff_factor (0.5) for standard, x 0.1 floored at 1 for the
    prototype's recovery (docs/prototype.md); both skip exactly those steps and finish."""
    scales = {}
    for recovery in ("standard", "prototype"):
        res = trainer(
            "train.precision=fp16",
            "train.scaler.init_scale=1024.0",
            f"train.scaler.recovery={recovery}",
            "fault=inf_grad",
            f"fault.step={K}",
            "fault.steps=5",
        ).run()
        assert [e["step"] for e in res.events] == list(range(K, K + 5))
        assert res.summary["train/skipped_steps"] == 5 and res.summary["train/steps"] == STEPS
        assert math.isfinite(res.summary["train/loss"])
        assert_weights_finite(res.model)
        scales[recovery] = [e["scale"] for e in res.events]
        assert res.summary["amp/scale"] == scales[recovery][-1]  # no overflow after the injected ones
    assert scales["standard"] == [1024.0 * 0.5**i for i in range(1, 6)]
    assert scales["prototype"] == pytest.approx([102.4, 10.24, 1.024, 1.0, 1.0], rel=1e-6)


def test_scaler_recovery_must_be_standard_or_prototype():
    with pytest.raises(ConfigError, match=r"'train.scaler.recovery' = 'proto': expected one of standard, prototype"):
        load_config(["train.scaler.recovery=proto"])


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cpu_autocast_runs_without_onednn_and_restores_it(precision):
    # oneDNN caches a kernel per matmul shape in fp16/bf16: RSS kept climbing over a smoke run.
    # The run turns it off and leaves the process-wide flag as it found it.
    seen = []
    tr = trainer(f"train.precision={precision}", "train.epochs=1")  # 12 steps: 6 rows to look at
    tr.on_log = lambda row, step: seen.append(torch.backends.mkldnn.enabled)
    before = torch.backends.mkldnn.enabled
    tr.run()
    assert seen and not any(seen)
    assert torch.backends.mkldnn.enabled == before


def test_bf16_trains_finite():
    res = trainer("train.precision=bf16").run()
    assert res.summary["train/skipped_steps"] == 0 and math.isfinite(res.summary["train/loss"])
    assert all(math.isnan(r["amp/scale"]) for r in res.rows)  # no scaler without fp16


def test_grad_accumulation_matches_the_full_batch():
    x, y = linear_task()
    common = ["model.adaptive_stop=false", "train.epochs=1", "train.lr=0.01"]
    full = trainer(*common, data=(x, y)).run()
    accum = trainer(*common, "train.batch_size=8", "train.grad_accum=2", data=(x, y)).run()
    assert accum.summary["train/effective_batch"] == 16 and accum.summary["train/steps"] == 12
    for k, v in full.model.state_dict().items():
        torch.testing.assert_close(accum.model.state_dict()[k], v, atol=1e-5, rtol=1e-4)


def test_gradient_health_rows_are_consistent():
    res = trainer("train.log_every=1", "train.epochs=1").run()  # a row for each of 12 steps
    mods = [f"grad/{m}/norm" for m in res.module_names]
    for r in res.rows:
        assert math.sqrt(sum(r[m] ** 2 for m in mods)) == pytest.approx(r["grad/global_norm"], rel=1e-6)
        assert r["grad/clipped_norm"] == pytest.approx(min(r["grad/global_norm"], 1.0), rel=1e-6)
        assert r["grad/clip_fraction"] == float(r["grad/global_norm"] > 1.0)
        assert r["grad/max_norm"] == pytest.approx(r["grad/global_norm"])
        assert sum(r[f"grad/steps_{z}"] for z in ("healthy", "warning", "critical", "exploded")) == 1
        assert r["perf/step_ms"] >= r["perf/forward_ms"] + r["perf/backward_ms"] > 0
    # With log_every=1 a row reports the previous step's update (sampled after the step's read).
    ratios = [r["grad/update_ratio"] for r in res.rows]
    assert ratios[0] == 0 and all(0 < v < 0.1 for v in ratios[1:]) and len(set(ratios)) == len(ratios)


def test_zones_follow_the_thresholds():
    res = trainer(
        "train.grad_warning=0.001", "train.grad_critical=0.002", "report.grad_healthy_min=0.0001", "train.epochs=1"
    ).run()
    assert all(r["grad/zone"] == 2 and r["grad/steps_critical"] == 2 for r in res.rows)


@pytest.mark.filterwarnings("ignore:Error detected in")  # anomaly mode's own report of the forward trace
def test_anomaly_detection_names_the_backward_op():
    with pytest.raises(PipelineError, match="anomaly detection.*returned nan"):
        trainer("fault=nan_loss", "fault.step=2", "train.detect_anomaly_steps=3").run()
    res = trainer("fault=nan_loss", "fault.step=5", "train.detect_anomaly_steps=3").run()  # after the window
    assert res.summary["train/skipped_steps"] == 1


def test_fault_presets_compose_and_bad_fault_settings_are_refused():
    names = sorted(p.stem for p in (CONF_DIR / "fault").glob("*.yaml"))
    assert names == ["inf_grad", "leak", "loss_spike", "lr_jump", "lr_spike", "nan_loss", "none", "sync_bound"]
    for name in names:
        assert load_config(["preset=smoke", f"fault={name}"]).fault.kind == name
    with pytest.raises(ConfigError, match="fault.kind"):
        load_config(["fault.kind=boom"])
    with pytest.raises(ConfigError, match="fault.module.*carrier"):
        trainer("fault=inf_grad", "fault.module=nowhere")
    with pytest.raises(ConfigError, match="train.checkpoint_every"):
        load_config(["train.log_every=5", "train.checkpoint_every=12"])
    with pytest.raises(ConfigError, match="train.precision"):
        load_config(["train.precision=fp8"])


def test_too_few_rows_for_one_step_is_a_clear_error():
    x, y = linear_task(n=20)
    with pytest.raises(PipelineError, match="20 rows.*batch_size \\* train.grad_accum = 32"):
        trainer("train.grad_accum=2", data=(x, y))


def test_validation_time_is_not_counted_as_step_time(monkeypatch):
    # The default run showed a step-time spike at every epoch boundary: the val pass.
    real = validation.evaluate_loss

    def slow_validation(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(validation, "evaluate_loss", slow_validation)
    res = trainer("train.epochs=3").run()
    assert res.summary.get("val/loss") is not None  # validation ran, three times
    assert max(r["perf/step_ms"] for r in res.rows) < 250  # a 500 ms pause would show as >= 250
