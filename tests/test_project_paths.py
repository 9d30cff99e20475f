"""Every path a stage reads resolves inside the project unless run.allow_external_paths=true: the
teacher given as a directory, the telemetry and metrics the report reads, the shards, the model
and the checkpoint, whether the path itself or a symbolic link on the way leads out. One rule
(pipeline/core/paths.py), stated once per stage run (stages/_cli.py), asked by every reader."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.core import paths
from pipeline.core.config import load_config, teacher_path
from pipeline.core.errors import ConfigError
from pipeline.core.paths import check_readable_inside, reading_rule
from pipeline.core.stage_outputs import read_csv, read_json
from pipeline.data.shard_writer import write_shards
from pipeline.data.shards import open_split
from pipeline.embed.teacher import load_teacher
from pipeline.model.model_file import load_model
from pipeline.train.resume_state import load_state
from stages._cli import run_stage

pytestmark = pytest.mark.unit

OUTSIDE = r"outside the project .*set run\.allow_external_paths=true to allow it"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root of its own in tmp_path, and a directory beside it (outside it)."""
    root, outside = tmp_path / "project", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    monkeypatch.setattr(paths, "REPO_ROOT", root)
    return root, outside


# --------------------------------------------------------------------------- the teacher


def test_a_teacher_directory_outside_the_project_is_refused_with_the_config_and_allowed_with_the_flag(tmp_path):
    teacher = tmp_path / "my-teacher"
    teacher.mkdir()
    with pytest.raises(ConfigError, match=rf"parameter 'embed.teacher' = '{teacher}' resolves to .*{OUTSIDE}"):
        load_config([f"embed.teacher={teacher}"])
    assert load_config([f"embed.teacher={teacher}", "run.allow_external_paths=true"]).embed.teacher == str(teacher)


@pytest.mark.parametrize("name", ["bundled", "sentence-transformers/all-MiniLM-L6-v2", "all-mpnet-base-v2"])
def test_the_bundled_teacher_and_model_names_need_no_flag(name):
    assert teacher_path(name) is None
    assert load_config([f"embed.teacher={name}"]).embed.teacher == name


@pytest.mark.parametrize("given", ["/nonexistent/teacher", "../teacher", "~/teacher", "./teacher"])
def test_a_teacher_written_as_a_path_is_a_path_even_before_it_exists(given):
    assert teacher_path(given) is not None


def test_loading_a_teacher_from_outside_is_refused_before_it_is_read(project):
    _, outside = project
    (outside / "config.json").write_text("{}")
    with reading_rule(False), pytest.raises(ConfigError, match=rf"'embed.teacher' = '{outside}' .*{OUTSIDE}"):
        load_teacher(str(outside))


# --------------------------------------------------------------------------- telemetry and metrics


def test_the_report_s_inputs_behind_a_symlink_out_of_the_project_are_refused(project):
    root, outside = project
    (outside / "train_steps.csv").write_text("step,loss\n1,0.5\n")
    (outside / "train.json").write_text('{"train/loss": 0.5}')
    (root / "telemetry").symlink_to(outside)
    (root / "metrics").mkdir()
    (root / "metrics" / "train.json").symlink_to(outside / "train.json")
    steps, metrics = root / "telemetry" / "train_steps.csv", root / "metrics" / "train.json"
    with reading_rule(False):
        with pytest.raises(ConfigError, match=rf"the train stage's output = '{steps}' resolves to {outside}/"):
            read_csv(steps, "train", required=("step",))
        with pytest.raises(ConfigError, match=rf"{metrics}' resolves to {outside / 'train.json'}, {OUTSIDE}"):
            read_json(metrics, "train")
    with reading_rule(True):  # the flag lets them in
        assert read_csv(steps, "train", required=("step",))["loss"].tolist() == [0.5]
        assert read_json(metrics, "train") == {"train/loss": 0.5}


def test_a_stage_states_the_rule_from_its_config(project):
    """run_stage sets the rule from run.allow_external_paths around the stage's work, so a reader
    refuses (exit 2, one line) without being handed the config."""
    _, outside = project
    seen = []

    def body(cfg):
        seen.append(cfg.run.allow_external_paths)
        check_readable_inside(outside / "x.json", "the train stage's output")

    assert run_stage("report", "a test stage", "", body, argv=["run.tracking=disabled"]) == 2
    assert (
        run_stage("report", "a test stage", "", body, ["run.tracking=disabled", "run.allow_external_paths=true"]) == 0
    )
    assert seen == [False, True]
    check_readable_inside(outside / "x.json", "anything")  # outside a stage: no rule stated, nothing refused


# --------------------------------------------------------------------------- shards, model, checkpoint


def _frame(n):
    return pd.DataFrame({"id": [str(i) for i in range(n)], "input_text": ["q"] * n, "target_text": ["a"] * n})


def test_a_shard_file_linked_out_of_the_project_is_refused(project):
    root, outside = project
    shards = root / "shards"
    write_shards(shards, {"train": (_frame(3), np.ones((3, 2)), np.ones((3, 2)))}, {"name": "t"})
    name = "train-00000_inputs.npy"
    (shards / name).rename(outside / name)
    (shards / name).symlink_to(outside / name)
    with reading_rule(False), pytest.raises(ConfigError, match=rf"the shards' file .*{outside / name}, {OUTSIDE}"):
        open_split(shards, "train")
    with reading_rule(True):
        assert open_split(shards, "train").count == 3


def test_a_model_or_checkpoint_linked_out_of_the_project_is_refused(project):
    root, outside = project
    torch.save({"fingerprint": "fp"}, outside / "last.pt")
    for name in ("model.pt", "last.pt"):
        (root / name).symlink_to(outside / "last.pt")
    with reading_rule(False):
        with pytest.raises(ConfigError, match=rf"the model file \(train.out_dir\) .*{OUTSIDE}"):
            load_model(root / "model.pt")
        with pytest.raises(ConfigError, match=rf"the checkpoint \(train.checkpoint_dir\) .*{OUTSIDE}"):
            load_state(root / "last.pt", "fp")
    with reading_rule(True):
        assert load_state(root / "last.pt", "fp") == {"fingerprint": "fp"}
