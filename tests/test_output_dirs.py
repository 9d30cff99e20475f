"""Outputs never destroy inputs: every directory a stage writes or replaces is checked before any
work (pipeline/core/output_dirs.py), and a stage replaces only a directory it made.

Each case runs the real stage entry point in-process against a throwaway project (a copy of the
layout that matters: .git, conf/, pipeline/, stages/, tests/, a dataset) so that a check that
failed to stop the stage could not touch this repository. The teacher is made to fail the test
if it loads: every refusal must come before any work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from pipeline.core import output_dirs, paths
from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.core.output_dirs import MARK, MODEL, SHARDS, claim, ownership_problem
from stages import embed, train
from tests.helpers.shards import fake_shards

pytestmark = pytest.mark.unit

ROWS = 120  # enough for every split of 0.8 / 0.1 / 0.1 to hold rows


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project root with the parts the rules protect, and a dataset at the default path."""
    root = tmp_path / "project"
    for part in (".git", "conf", "pipeline", "stages", "tests", "data/raw"):
        (root / part).mkdir(parents=True)
        (root / part / "keep.txt").write_text(f"{part} must survive\n")
    pd.DataFrame(
        {
            "id": [str(i) for i in range(ROWS)],
            "question": [f"What is item {i}?" for i in range(ROWS)],
            "answer": [f"Item {i} is thing {i % 40}." for i in range(ROWS)],
        }
    ).to_csv(root / "data/raw/qa_pairs.csv", index=False)
    for module in (paths, output_dirs):  # the config's path check asks paths
        monkeypatch.setattr(module, "REPO_ROOT", root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(
        embed,
        "load_teacher",
        lambda *a, **kw: pytest.fail("the teacher loaded: the output check must stop the stage first"),
    )
    monkeypatch.setattr(train, "train_model", lambda *a, **kw: pytest.fail("training started"))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def refused(stage, args: list[str], capsys, root: Path) -> str:
    before = snapshot(root)
    code = stage.main([*args, "run.tracking=disabled"])
    err = capsys.readouterr().err
    assert code == 2, err
    name = stage.__name__.split(".")[-1]
    assert err.startswith(f"[{name}] config error: parameter '") and "Traceback" not in err, err
    assert snapshot(root) == before, "a refused stage changed the project"
    return err


@pytest.mark.parametrize(
    "value, fragment",
    [
        pytest.param(
            "data/raw", "contains the dataset (embed.dataset = 'data/raw/qa_pairs.csv')", id="the dataset's dir"
        ),
        pytest.param("data", "contains the dataset", id="a parent of the dataset"),
        pytest.param("data/raw/qa_pairs.csv", "is the dataset", id="the dataset file"),
        pytest.param(".", "which is the project root", id="the project root"),
        pytest.param("..", "holds the project", id="above the project"),
        pytest.param(".git", "is, holds or lies inside a git repository's .git", id=".git"),
        pytest.param("conf", "is the project's conf/", id="conf"),
        pytest.param("pipeline", "is the project's pipeline/", id="pipeline"),
        pytest.param("stages/shards", "lies inside the project's stages/", id="inside stages"),
        pytest.param("tests", "is the project's tests/", id="tests"),
        pytest.param("models", "is another output: train.out_dir", id="train's output"),
        pytest.param("metrics", "is another output: metrics/ (where the stages write fixed files)", id="metrics/"),
    ],
)
def test_embed_out_dir_that_would_replace_something_not_its_own_is_refused(project, capsys, value, fragment):
    err = refused(embed, [f"embed.out_dir={value}", "run.allow_external_paths=true"], capsys, project)
    assert fragment in err and f"'embed.out_dir' = '{value}'" in err, err
    assert "set embed.out_dir to one (its default is 'data/shards')" in err


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        pytest.param("train.out_dir", "data/shards", "is another output: embed.out_dir", id="model over the shards"),
        pytest.param(
            "train.checkpoint_dir",
            "models/ckpt",
            "lies inside another output: train.out_dir",
            id="checkpoints inside the model dir",
        ),
        pytest.param(
            "embed.cache_dir",
            "data/shards/cache",
            "lies inside another output: embed.out_dir",
            id="cache inside the shards",
        ),
        pytest.param("train.out_dir", "data", "contains the dataset", id="model dir holding the dataset"),
    ],
)
def test_outputs_that_overlap_are_refused_by_every_stage(project, capsys, key, value, fragment):
    for stage in (embed, train):  # one bad key stops every stage, before DVC reaches the one that writes there
        err = refused(stage, [f"{key}={value}"], capsys, project)
        assert f"'{key}' = '{value}'" in err and fragment in err, err


def test_an_existing_directory_the_stage_did_not_create_is_refused(project, capsys):
    notes = project / "notes"
    notes.mkdir()
    (notes / "thesis.md").write_text("months of work\n")
    err = refused(embed, ["embed.out_dir=notes"], capsys, project)
    assert (
        "is an existing directory the embed stage did not create: it holds thesis.md, which replacing it "
        "would delete" in err
    ), err
    assert "move those files elsewhere, or set embed.out_dir to another directory" in err
    err = refused(train, ["train.out_dir=notes"], capsys, project)
    assert "the train stage did not create: it holds thesis.md" in err


def test_an_existing_file_is_refused_before_any_work(project, capsys):
    (project / "shards.txt").write_text("not a directory\n")
    err = refused(embed, ["embed.out_dir=shards.txt"], capsys, project)
    assert "is an existing file, not a directory" in err


@pytest.mark.parametrize(
    "target, fragment",
    [
        pytest.param("data/raw", "contains the dataset", id="to the dataset's dir"),
        pytest.param(".", "is the project root", id="to the project root"),
        pytest.param("conf", "is the project's conf/", id="to conf"),
    ],
)
def test_a_symlink_that_points_into_the_project_is_judged_by_where_it_points(project, capsys, target, fragment):
    link = project / "data" / "shards"
    link.symlink_to(project / target, target_is_directory=True)
    err = refused(embed, ["embed.out_dir=data/shards"], capsys, project)
    assert f"resolves to {(project / target).resolve()}, which {fragment}" in err, err


def test_a_symlink_outside_the_project_needs_allow_external_paths(project, capsys, tmp_path):
    outside = tmp_path / "scratch"
    outside.mkdir()
    (project / "data" / "shards").symlink_to(outside, target_is_directory=True)
    before = snapshot(project)
    assert embed.main(["embed.out_dir=data/shards", "run.tracking=disabled"]) == 2
    assert "outside the project" in capsys.readouterr().err and snapshot(project) == before


def test_a_dataset_inside_an_output_is_refused(project, capsys):
    shards = project / "data" / "shards"
    fake_shards(shards)
    err = refused(embed, ["embed.dataset=data/shards/train.parquet"], capsys, project)
    assert "'embed.out_dir' = 'data/shards'" in err and "contains the dataset" in err


def test_an_os_error_from_a_path_is_one_message_naming_it(project, capsys):
    name = "x" * 300  # longer than any file system allows a name to be
    before = snapshot(project)
    assert embed.main([f"embed.out_dir=data/{name}", "run.tracking=disabled"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"[embed] error: {project / 'data' / name}") and err.count("\n") == 1, err
    assert err.endswith(": File name too long (errno 36); the stage stopped there\n"), err
    assert snapshot(project) == before


# --------------------------------------------------------------------------- marks and what is accepted


def test_written_shards_carry_the_mark_and_are_replaced_again(tmp_path):
    out = tmp_path / "shards"
    fake_shards(out)
    assert json.loads((out / MARK).read_text())["kind"] == "shards"
    assert ownership_problem(out, SHARDS) is None
    fake_shards(out, dim=4)  # replaced: its own
    assert json.loads((out / "manifest.json").read_text())["dim"] == 4


def test_shards_written_before_marks_existed_are_recognised_by_their_manifest(tmp_path):
    out = tmp_path / "shards"
    fake_shards(out)
    (out / MARK).unlink()
    assert ownership_problem(out, SHARDS) is None
    (out / "stray.csv").write_text("x\n")
    assert "it holds stray.csv" in ownership_problem(out, SHARDS)


def test_a_directory_of_another_kind_is_refused_by_its_mark(tmp_path):
    out = tmp_path / "shards"
    fake_shards(out)
    assert ownership_problem(out, MODEL) == "holds embedding shards, marked by the embed stage, not the trained model"


def test_an_empty_directory_is_accepted_and_marked(tmp_path):
    (tmp_path / "models").mkdir()
    claim(tmp_path / "models", MODEL)
    assert json.loads((tmp_path / "models" / MARK).read_text())["kind"] == "model"


def test_claim_removes_only_the_temp_files_of_its_own_writes(tmp_path):
    models = tmp_path / "models"
    claim(models, MODEL)
    (models / ".model.pt.x1y2.tmp").write_bytes(b"killed mid-write")
    (models / "model.pt").write_bytes(b"weights")
    claim(models, MODEL)
    assert sorted(os.listdir(models)) == [MARK, "model.pt"]


def test_a_killed_writers_temporary_shard_directory_is_removed_by_the_next_write(tmp_path):
    out = tmp_path / "shards"
    fake_shards(out)
    leftover = tmp_path / ".shards.abc123.tmp"  # what a SIGKILL mid-write leaves: marked first
    leftover.mkdir()
    (leftover / MARK).write_text((out / MARK).read_text())
    someone_elses = tmp_path / ".shards.keep.tmp"  # same pattern, no mark: not ours
    someone_elses.mkdir()
    fake_shards(out)
    assert not leftover.exists() and someone_elses.is_dir()


def test_default_layout_passes():
    output_dirs.check_outputs(load_config([]), "embed")  # the shipped config, against the real project


def test_refusal_is_a_config_error_naming_the_key(project):
    with pytest.raises(ConfigError, match=r"parameter 'train.checkpoint_dir' = 'models' .* is another output"):
        output_dirs.check_outputs(load_config(["train.checkpoint_dir=models"]), "train")


def test_shards_with_an_empty_split_stop_train_and_evaluate_naming_it(tmp_path, capsys, monkeypatch):
    """Shards made before embed refused empty splits: train and evaluate say so, instead of an
    empty metrics file with exit 0."""
    shards = tmp_path / "shards"
    fake_shards(shards, dim=8, rows=(12, 4, 0))
    from stages import evaluate

    monkeypatch.setattr(evaluate, "load_model", lambda *a, **kw: (None, {"dim": 8}))
    monkeypatch.setattr(evaluate, "check_input_dim", lambda *a, **kw: None)
    monkeypatch.setattr(evaluate.tracking, "read_run_file", lambda *a: {"run_id": ""})
    code = evaluate.main(
        [
            f"embed.out_dir={shards}",
            f"train.out_dir={tmp_path / 'models'}",
            "run.allow_external_paths=true",
            "run.tracking=disabled",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and f"{shards / 'manifest.json'}: split 'test' has 0 rows; expected rows to evaluate on" in err, (
        err
    )


def test_dvc_yaml_declares_the_outputs_at_the_fixed_paths_the_stages_hold_to():
    import yaml

    stages = yaml.safe_load((paths.REPO_ROOT / "dvc.yaml").read_text())["stages"]
    outs = {
        name: [o if isinstance(o, str) else next(iter(o)) for o in spec.get("outs", [])]
        for name, spec in stages.items()
    }
    assert output_dirs.DVC_OUTPUTS["embed.out_dir"] in outs["embed"]
    assert output_dirs.DVC_OUTPUTS["train.out_dir"] in outs["train"]
    assert not any("${" in o for o in sum(outs.values(), [])), outs  # no output placed by a parameter
    defaults = load_config([])
    assert {k: OmegaConf.select(defaults, k) for k in output_dirs.DVC_OUTPUTS} == output_dirs.DVC_OUTPUTS


def test_under_dvc_an_output_elsewhere_than_dvc_yaml_says_is_refused(project, capsys, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "train")
    err = refused(train, ["train.out_dir=models2"], capsys, project)
    assert (
        "parameter 'train.out_dir' = 'models2': under DVC (dvc repro, dvc exp run) the train stage's output is "
        "models, as dvc.yaml declares it" in err
    )
    assert "python -m stages.train train.out_dir=models2" in err
    monkeypatch.delenv("DVC_STAGE")
    assert output_dirs.check_outputs(load_config(["train.out_dir=models2"]), "train") is None  # by hand: allowed


def test_a_file_named_like_a_shard_but_not_in_the_manifest_is_not_the_stages(tmp_path):
    out = tmp_path / "shards"
    fake_shards(out)
    (out / "notes.parquet").write_bytes(b"PAR1 a person's table")
    assert "it holds notes.parquet" not in (ownership_problem(out, SHARDS) or "")
    assert "holds notes.parquet, which the embed stage did not write" in ownership_problem(out, SHARDS)
