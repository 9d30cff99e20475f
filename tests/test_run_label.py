"""A run's name without a DVC experiment: the preset and what differs from it."""

import pytest

from pipeline.core.config import load_config
from pipeline.core.run_label import MAX_NAME, differences, run_label, short_keys
from pipeline.tracking import store as tracking

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "overrides, name",
    [
        ([], "default"),
        (["train.lr=1e-3"], "default lr=0.001"),
        (["preset=smoke"], "smoke"),
        (["preset=smoke", "train.epochs=3", "model.lattice_depth=4"], "smoke lattice_depth=4 epochs=3"),
        (["preset=smoke", "fault=nan_loss"], "smoke fault=nan_loss"),
        (["preset=smoke", "fault=nan_loss", "fault.step=3"], "smoke fault=nan_loss step=3"),
        # Labels of a run, not what makes it: never in the name.
        (["run.sweep=lr", "run.experiment=other", "run.tracking=optional"], "default"),
    ],
)
def test_the_name_is_the_preset_and_the_overrides(overrides, name):
    assert run_label(load_config(overrides)) == name


def test_a_long_list_is_cut_and_the_tag_keeps_it_whole():
    cfg = load_config([f"train.{k}={v}" for k, v in (("lr", 0.01), ("epochs", 3), ("batch_size", 8))] + ["run.seed=7"])
    assert differences(cfg) == {"run.seed": 7, "train.lr": 0.01, "train.epochs": 3, "train.batch_size": 8}
    # In the config's order; batch_size is embed's too, so train's keeps its section.
    assert run_label(cfg) == "default seed=7 epochs=3 train.batch_size=8 lr=0.01"
    long = run_label(cfg, {f"train.key_{i}": "x" * 20 for i in range(8)})
    assert len(long) == MAX_NAME and long.endswith("…")
    assert tracking.overrides_tag(cfg) == {
        "run.overrides": "preset=default run.seed=7 train.epochs=3 train.batch_size=8 train.lr=0.01"
    }
    assert tracking.overrides_tag(load_config([])) == {"run.overrides": "preset=default"}


def test_the_overrides_tag_names_the_preset_and_fault_and_composes_the_run_again():
    from pipeline.core.run_label import differences

    cfg = load_config(["preset=smoke", "fault=nan_loss", "train.epochs=3"])
    tag = tracking.overrides_tag(cfg)["run.overrides"]
    assert tag == "preset=smoke fault=nan_loss train.epochs=3"
    again = load_config(tag.split())
    assert differences(again) == differences(cfg) and again.fault.kind == "nan_loss"


def test_a_key_is_shortened_only_where_its_last_part_is_unique():
    assert short_keys(["train.lr", "fault.step"], ["train.lr", "fault.step", "report.step"]) == {
        "train.lr": "lr",
        "fault.step": "fault.step",
    }


def test_the_dvc_experiment_name_wins(monkeypatch):
    cfg = load_config(["train.lr=1e-3"])
    monkeypatch.setenv("DVC_EXP_NAME", "lr-a")
    assert tracking.run_name(cfg) == "lr-a"
    monkeypatch.delenv("DVC_EXP_NAME")
    assert tracking.run_name(cfg) == "default lr=0.001"
