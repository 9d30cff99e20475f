"""dvc.yaml keeps its contract: each stage depends on its own script and on every pipeline module
it imports (directly or through other modules), so editing one re-runs exactly the stages that
use it."""

import ast
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import Config
from pipeline.core.config.param import parameters
from pipeline.core.paths import REPO_ROOT

pytestmark = pytest.mark.unit

DVC = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())


def module_file(name: str) -> Path | None:
    base = REPO_ROOT / Path(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def local_imports(path: Path) -> set[Path]:
    """Files of pipeline/, stages/ and tools/ that `path` imports, followed transitively."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        pkg = ".".join(f.relative_to(REPO_ROOT).with_suffix("").parts)
        if f.name != "__init__.py":
            pkg = pkg.rsplit(".", 1)[0]
        else:
            pkg = pkg.removesuffix(".__init__")
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] in ("pipeline", "stages", "tools"):
                    target = module_file(name)
                    if target:
                        todo.append(target)
    return seen


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO_ROOT)
    if rel.name == "__init__.py" and "import" not in path.read_text():
        return True  # a docstring-only package marker changes nothing
    return any(rel == Path(d) or Path(d) in rel.parents for d in deps)


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_lists_the_params_the_schema_declares_for_it(stage):
    """The schema declares, per key, the stages that depend on it (`stages=` of param() and
    section() in pipeline/core/config/schema.py): the stage's `params:` names exactly those keys, a
    section whole where it depends on every key of the section, so a key edit re-runs exactly them."""
    declared = list(parameters(Config))
    assert {s for p in declared for s in p.stages} <= set(DVC["stages"]), "the schema names a stage dvc.yaml lacks"
    reads = {p.key for p in declared if stage in p.stages}
    whole = {p.key.split(".")[0] for p in declared} - {p.key.split(".")[0] for p in declared if p.key not in reads}
    expected = whole | {k for k in reads if k.split(".")[0] not in whole}
    listed = set(DVC["stages"][stage].get("params", []))
    assert not listed - expected, (
        f"stage {stage}: dvc.yaml lists {sorted(listed - expected)}, the schema declares no such stage"
    )
    assert not expected - listed, (
        f"stage {stage}: dvc.yaml lacks {sorted(expected - listed)}, which the schema declares it reads"
    )


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_depends_on_its_script_and_every_module_it_uses(stage):
    spec = DVC["stages"][stage]
    assert spec["cmd"] == f"python -m stages.{stage}"
    script = REPO_ROOT / "stages" / f"{stage}.py"
    missing = [str(f.relative_to(REPO_ROOT)) for f in sorted(local_imports(script)) if not covered(f, spec["deps"])]
    assert not missing, f"stage {stage} uses but does not list as deps: {missing}"


def test_stage_deps_list_library_folders_not_modules():
    """Whole packages of pipeline/, so a module added to a package is covered without an edit."""
    for stage, spec in DVC["stages"].items():
        code = [d.split()[0] for d in spec["deps"] if str(d).startswith("pipeline/")]
        assert [d for d in code if d.endswith(".py") and d != "pipeline/__init__.py"] == [], stage
        assert all((REPO_ROOT / d).is_dir() for d in code if d != "pipeline/__init__.py"), stage


def test_train_neither_imports_nor_lists_the_report():
    """A change to the report's checks or HTML must not re-train the model."""
    script = REPO_ROOT / "stages" / "train.py"
    report = REPO_ROOT / "pipeline" / "report"
    assert not [f for f in local_imports(script) if report in f.parents]
    assert not [d for d in DVC["stages"]["train"]["deps"] if str(d).startswith("pipeline/report")]
    assert not [d for d in DVC["stages"]["train"]["deps"] if str(d).startswith("tools")]


def test_no_stage_imports_the_tools():
    for stage in DVC["stages"]:
        tools = [
            f
            for f in local_imports(REPO_ROOT / "stages" / f"{stage}.py")
            if "tools" in f.relative_to(REPO_ROOT).parts[:1]
        ]
        assert tools == [], stage


def test_every_plotted_telemetry_column_is_written_by_every_model():
    """DVC drops a plot, with a warning, for a run whose file lacks one of its columns: every
    plotted column must be one that each preset's model (and the default) writes."""
    from pipeline.core.config import load_config
    from pipeline.model import EnergyFlowModel
    from pipeline.train.step_health import StepHealth
    from pipeline.train.telemetry import step_columns

    def columns(overrides: list[str]) -> set[str]:
        model = EnergyFlowModel.from_config(load_config(overrides).model, 8)
        health = StepHealth(
            model,
            grad_clip=1.0,
            grad_warning=5,
            grad_critical=10,
            spike_window=50,
            spike_k=4,
            skip_spikes=False,
            device=__import__("torch").device("cpu"),
        )
        return set(step_columns(health.module_names))

    overrides = [[]] + [[f"preset={p.stem}"] for p in (REPO_ROOT / "conf" / "preset").glob("*.yaml")]
    written = {" ".join(o) or "default": columns(o) for o in overrides}
    for plot in yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["plots"]:
        for name, spec in plot.items():
            ys = spec["y"].get("telemetry/train_steps.csv", [])
            cols = {ys} if isinstance(ys, str) else set(ys)
            for model, have in written.items():
                assert cols <= have, (name, model, cols - have)
