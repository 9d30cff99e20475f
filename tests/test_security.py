"""Nothing let in: no pickle on the data path, checkpoints and models read with
weights_only=True (an object that would run code on load is refused, and does not run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.model.model_file import load_model
from pipeline.train.resume_state import load_state

pytestmark = pytest.mark.unit

SOURCES = sorted((REPO_ROOT / "pipeline").rglob("*.py")) + sorted((REPO_ROOT / "stages").glob("*.py"))
PICKLE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def calls(tree: ast.AST, dotted: str):
    """Calls of `dotted` (e.g. torch.load) in a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == dotted:
            yield node


def keyword(call: ast.Call, name: str):
    return next((ast.literal_eval(k.value) for k in call.keywords if k.arg == name), None)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_pickle_on_the_data_path(path):
    rel = str(path.relative_to(REPO_ROOT))
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }
    assert not imported & PICKLE_MODULES, f"{rel} imports {imported & PICKLE_MODULES}"
    for call in calls(tree, "torch.load"):
        assert keyword(call, "weights_only") is True, f"{rel}:{call.lineno}: torch.load without weights_only=True"
    for name in ("np.load", "numpy.load", "np.save", "numpy.save"):
        for call in calls(tree, name):
            assert keyword(call, "allow_pickle") is not True, f"{rel}:{call.lineno}: {name}(allow_pickle=True)"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("read_pickle", "to_pickle")]


class RunsCode:
    """Unpickling this would create a file: the proof that a load ran code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran on load"))


def test_a_checkpoint_or_model_that_would_run_code_is_refused_without_running_it(tmp_path, caplog):
    marker = tmp_path / "ran"
    evil = {"fingerprint": "fp", "state_dict": {}, "model_config": {}, "dim": 4, "payload": RunsCode(marker)}
    path = tmp_path / "last.pt"
    torch.save(evil, path)
    assert load_state(path, "fp") is None  # set aside: "unreadable", a fresh start
    assert "is unreadable" in caplog.text and "starting from step 0" in caplog.text
    with pytest.raises(PipelineError, match="not a model file this project wrote") as refused:
        load_model(path)
    message = str(refused.value)
    assert "pickled code" in message and str(path) in message
    assert "weights_only=False" not in message and "weights_only=False" not in caplog.text  # torch's hint never shown
    assert not marker.exists()


@pytest.mark.parametrize(
    "override",
    [
        "embed.out_dir=../elsewhere",
        "embed.dataset=/etc/passwd",
        "train.checkpoint_dir=checkpoints/../../up",
        "embed.dataset=/tmp/*.csv",
        "embed.cache_dir=/var/tmp/cache",
        "train.out_dir=/",
    ],
)
def test_paths_from_config_must_stay_inside_the_project(override):
    from pipeline.core.config import load_config
    from pipeline.core.errors import ConfigError

    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"parameter '{key}' = .* outside the project .*run.allow_external_paths"):
        load_config([override])
    load_config([override, "run.allow_external_paths=true"])  # explicitly allowed: fine


def test_a_symlink_out_of_the_project_is_followed_and_refused(tmp_path, monkeypatch):
    from pipeline.core import config, paths
    from pipeline.core.errors import ConfigError

    project, outside = tmp_path / "project", tmp_path / "outside"
    (project / "data").mkdir(parents=True)
    outside.mkdir()
    (project / "data" / "shards").symlink_to(outside)
    monkeypatch.setattr(paths, "REPO_ROOT", project)
    with pytest.raises(ConfigError, match=rf"'embed.out_dir' = 'data/shards' resolves to {outside}, outside"):
        config.load_config(["embed.out_dir=data/shards"])
    config.load_config(["embed.dataset=data/raw/*.csv", "embed.out_dir=data/other"])  # inside, globs too
