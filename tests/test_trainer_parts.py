"""The trainer's parts on their own: the loss scaler's recovery and its host-free scale read, the
skip events' counts, and fault injection that is absent unless a fault is configured."""

import pytest
import torch

from pipeline.core.config import load_config
from pipeline.train.events import StepEvents, skips
from pipeline.train.faults import FaultInjector, injector_for
from pipeline.train.loop import Trainer
from pipeline.train.loss_scaler import LossScaler, build_scaler
from pipeline.train.step_counters import count_host
from pipeline.train.step_health import INF_GRAD, NAN_LOSS, OVERRUN, SPIKE
from tests.helpers.synthetic import linear_task

pytestmark = pytest.mark.unit


def scaler_cfg(*overrides):
    return load_config(["preset=smoke", *overrides]).train.scaler


def overflowing_step(scaler: LossScaler) -> None:
    """One fp16-style step whose gradient overflowed: scale, backward, unscale_ (finds the inf)."""
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale((w * float("inf")).sum()).backward()
    scaler.unscale_(opt)


@pytest.mark.parametrize("recovery, expected", [("standard", [512.0, 256.0]), ("prototype", [102.4, 10.24])])
def test_loss_scaler_backs_off_by_its_recovery(recovery, expected):
    scaler = LossScaler("cpu", scaler_cfg("train.scaler.init_scale=1024.0", f"train.scaler.recovery={recovery}"))
    seen = []
    for _ in expected:
        overflowing_step(scaler)
        scaler.end_step(overflowed=True)
        seen.append(scaler.get_scale())
    assert seen == pytest.approx(expected)


def test_prototype_recovery_floors_the_scale_at_one():
    scaler = LossScaler("cpu", scaler_cfg("train.scaler.init_scale=2.0", "train.scaler.recovery=prototype"))
    overflowing_step(scaler)
    scaler.end_step(overflowed=True)
    assert scaler.get_scale() == 1.0  # 2 * 0.1, floored


def test_the_scale_tensor_is_read_without_a_host_read():
    scaler = LossScaler("cpu", scaler_cfg("train.scaler.init_scale=8.0"))
    assert scaler.scale_tensor() is None  # nothing scaled yet
    overflowing_step(scaler)
    with count_host() as sample:
        scale = scaler.scale_tensor()
        doubled = scale * 2  # used on the device, as the health read-out does
    assert sample.host_syncs == 0 and doubled.item() == 16.0


def test_ranks_agree_on_the_smallest_scale_and_growth_count():
    """With several ranks the scaler's state is min-reduced after each step (here a stand-in
    all-reduce: another rank backed off to 2 and has counted no growth)."""
    seen = []

    def other_rank_backed_off(state, op):
        seen.append(op)
        state.copy_(torch.minimum(state, torch.tensor([2.0, 0.0], dtype=state.dtype)))
        return state

    scaler = LossScaler("cpu", scaler_cfg("train.scaler.init_scale=8.0"), agree=other_rank_backed_off)
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    scaler.end_step(overflowed=False)
    assert seen == ["min"] and scaler.get_scale() == 2.0 and scaler.state_dict()["_growth_tracker"] == 0


def test_only_fp16_gets_a_scaler():
    cfg = scaler_cfg()
    assert isinstance(build_scaler(cfg, torch.device("cpu"), torch.float16), LossScaler)
    assert build_scaler(cfg, torch.device("cpu"), torch.bfloat16) is None
    assert build_scaler(cfg, torch.device("cpu"), None) is None


def test_events_count_health_skips_but_not_overruns():
    events = StepEvents(report=False)
    assert skips(NAN_LOSS, skip_spikes=False) and skips(OVERRUN, skip_spikes=False)
    assert not skips(SPIKE, skip_spikes=False) and skips(SPIKE, skip_spikes=True)
    events.count(INF_GRAD, skipped=True)
    events.count(OVERRUN, skipped=True)  # the loop's length, not the run's health
    assert (events.consecutive_skips, events.skipped_total, events.overruns_total) == (1, 1, 1)
    events.count(0, skipped=False)
    assert events.consecutive_skips == 0 and events.skipped_total == 1
    events.record(3, INF_GRAD | (1 << 6), 0.5, 1.0, True, ["carrier"], 512.0)
    events.record(4, SPIKE, 9.0, 1.0, False, [], None)
    assert events.events == [
        {"step": 3, "kind": "inf_grad", "module": "carrier", "modules": ["carrier"], "scale": 512.0,
         "action": "skipped; scaler backed off"},
        {"step": 4, "kind": "loss_spike", "loss": 9.0, "threshold": 1.0, "action": "flagged"},
    ]  # fmt: skip
    assert events.spikes_total == 1


def test_no_fault_configured_builds_no_injector():
    model = torch.nn.Linear(2, 2)
    assert injector_for(load_config(["preset=smoke"]).fault, model) is None
    aimed_elsewhere = load_config(["preset=smoke", "fault=nan_loss", "fault.rank=1"]).fault
    assert injector_for(aimed_elsewhere, model, rank=0) is None
    assert isinstance(injector_for(aimed_elsewhere, model, rank=1), FaultInjector)
    x, y = linear_task()
    base = ["preset=smoke", "train.device=cpu", "train.batch_size=16", "train.checkpoint_every=0"]
    assert Trainer(load_config(base), x, y, progress=False).faults is None
    assert Trainer(load_config([*base, "fault=leak"]), x, y, progress=False).faults is not None
