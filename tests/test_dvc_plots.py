"""`dvc plots show` / `dvc plots diff` as a researcher gets them: a self-contained page (the chart
libraries inlined from plots/vendor/, no CDN), each plot titled by what it shows, one colour per
plotted field, and no plot of a quantity the run does not have (the fp16 loss scale on an fp32
run; a column only some models write, which DVC would drop with a warning).

The rendering tests run the real `dvc` on a scratch project made of the committed dvc.yaml,
params.yaml and .dvc/ files and a telemetry file in the train stage's columns (an fp32 run:
amp/scale empty, as the train stage writes it without a scaler)."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.core.paths import REPO_ROOT
from tools import vendor_plot_js

DVC = Path(sys.executable).with_name("dvc")
DVC_YAML = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
PLOTS = {name: spec for plot in DVC_YAML["plots"] for name, spec in plot.items()}
STEPS_CSV = "telemetry/train_steps.csv"
SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S)


def plotted(spec: dict) -> list[str]:
    ys = spec["y"][STEPS_CSV]
    return [ys] if isinstance(ys, str) else list(ys)


# --- the page and its libraries -------------------------------------------------------------


@pytest.mark.unit
def test_the_template_inlines_exactly_the_vendored_libraries():
    text = vendor_plot_js.TEMPLATE.read_text(encoding="utf-8")
    assert text == vendor_plot_js.build_template(), "run python -m tools.vendor_plot_js"
    scripts = SCRIPT.findall(text)
    assert [attrs for attrs, _ in scripts] == ["", "", ""], "no script may load from a src"
    recorded = json.loads(vendor_plot_js.VERSIONS.read_text())
    for (_, body), (name, version, build) in zip(scripts, vendor_plot_js.PACKAGES):
        path = vendor_plot_js.VENDOR / name / Path(build).name
        assert body == f"/* {name} {version} */\n{path.read_text(encoding='utf-8')}\n    "
        assert vendor_plot_js.sha256(path) == recorded[name]["sha256"]
        assert (path.parent / "LICENSE").read_text().startswith("Copyright")
    # DVC fills {plot_divs} (and {refresh_tag}) by str.replace; {scripts} would bring the CDN tags.
    assert text.count("{plot_divs}") == 1 and "{scripts}" not in text


@pytest.mark.unit
def test_dvc_config_names_the_offline_template():
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".dvc" / "config")
    # A relative plots.html_template is taken from .dvc/ (DVC's own rule).
    assert REPO_ROOT / ".dvc" / config["plots"]["html_template"] == vendor_plot_js.TEMPLATE


@pytest.mark.unit
def test_a_stale_template_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "offline.html"
    stale.write_text("<html>{plot_divs}</html>")
    monkeypatch.setattr(vendor_plot_js, "TEMPLATE", stale)
    assert vendor_plot_js.main(["--check"]) == 1
    assert "run python -m tools.vendor_plot_js" in capsys.readouterr().err


# --- dvc.yaml -------------------------------------------------------------------------------


@pytest.mark.unit
def test_no_stage_draws_its_own_plot_and_train_steps_stays_a_cached_output():
    for name, stage in DVC_YAML["stages"].items():
        assert "plots" not in stage, f"stage {name} has a plots: entry (an untitled plot of the whole file)"
    assert STEPS_CSV in DVC_YAML["stages"]["train"]["outs"]  # a plain entry: cached, as before


@pytest.mark.unit
def test_every_plot_is_titled_and_colours_by_field():
    for name, spec in PLOTS.items():
        assert spec.get("title") and spec["title"] != name, name
        assert spec.get("x_label") and spec.get("y_label"), name
        assert spec["template"] == "lines", name
    template = json.loads((REPO_ROOT / ".dvc" / "plots" / "lines.json").read_text())
    assert template["encoding"]["color"]["field"] == "line"
    assert any("datum.field" in t.get("calculate", "") for t in template["transform"])


@pytest.mark.unit
def test_no_plot_of_the_loss_scale():
    # DVC has no conditional plots; an fp32 or bf16 run has no scaler (amp/scale empty).
    assert not any("amp/scale" in plotted(spec) for spec in PLOTS.values())


# --- rendered by dvc ------------------------------------------------------------------------


def run_columns(preset: str | None) -> list[str]:
    """The columns the train stage writes to telemetry/train_steps.csv for this preset's model."""
    import torch

    from pipeline.core.config import load_config
    from pipeline.model import EnergyFlowModel
    from pipeline.train.perf_files import is_measured
    from pipeline.train.step_health import StepHealth
    from pipeline.train.telemetry import step_columns

    cfg = load_config([f"preset={preset}"] if preset else [])
    model = EnergyFlowModel.from_config(cfg.model, 8)
    health = StepHealth(
        model,
        grad_clip=1.0,
        grad_warning=5,
        grad_critical=10,
        spike_window=50,
        spike_k=4,
        skip_spikes=False,
        device=torch.device("cpu"),
    )
    return [c for c in step_columns(health.module_names) if not is_measured(c)]


def fp32_project(root: Path, preset: str | None, seed: int = 0) -> Path:
    """A scratch DVC project: the committed plot definitions, templates and config, and a
    telemetry file of an fp32 run (no scaler: amp/scale empty) in the train stage's columns."""
    root.mkdir()
    shutil.copy(REPO_ROOT / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(REPO_ROOT / "params.yaml", root / "params.yaml")
    shutil.copytree(REPO_ROOT / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp", "*.local"))
    rng = np.random.default_rng(seed)
    columns = run_columns(preset)
    rows = pd.DataFrame(rng.random((40, len(columns))), columns=columns)
    rows["step"] = np.arange(5, 205, 5)
    rows["amp/scale"] = np.nan
    (root / "telemetry").mkdir()
    rows.to_csv(root / STEPS_CSV, index=False)
    return root


def dvc(root: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([str(DVC), *args], cwd=root, capture_output=True, text=True, timeout=120)
    # No warning either: DVC warns of a plot whose column the run lacks, and drops it.
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    return out


def rendered(root: Path) -> dict[str, dict]:
    """Plot id -> its vega-lite spec, as `dvc plots show --json` gives them (empty: no data)."""
    data = json.loads(dvc(root, "plots", "show", "--json").stdout)["data"]
    return {name: (entries[0]["content"] if entries else {}) for name, entries in data.items()}


@pytest.mark.integration
@pytest.mark.parametrize("preset", [None, "smoke"])
def test_dvc_renders_the_titled_plots_of_an_fp32_run(tmp_path, preset):
    """The default model (with the residual map) and the smoke one (without) get the same plots,
    each with every value present: nothing plotted that the run does not have."""
    specs = rendered(fp32_project(tmp_path / "p", preset=preset))
    assert list(specs) == list(PLOTS)  # no stray plot of the whole file
    for name, spec in specs.items():
        assert spec["title"]["text"] == PLOTS[name]["title"]
        points = spec["data"]["values"]
        fields = {p["field"] for p in points}
        assert fields == set(plotted(PLOTS[name])), name
        assert "amp/scale" not in fields
        y = spec["encoding"]["y"]["field"].replace("\\", "")
        values = pd.to_numeric(pd.Series([p[y] for p in points]), errors="coerce")
        assert values.notna().all(), f"{name}: a plotted value the run does not have"
    # The module lines are told apart by colour: one colour per field.
    by_module = specs["grad_norm_by_module"]
    assert by_module["encoding"]["color"]["field"] == "line"
    assert len({p["field"] for p in by_module["data"]["values"]}) == 5


@pytest.mark.integration
def test_the_html_loads_nothing_from_the_network(tmp_path):
    root = fp32_project(tmp_path / "p", preset=None)
    dvc(root, "plots", "show", "-o", "html")
    html = (root / "html" / "index.html").read_text(encoding="utf-8")
    scripts = SCRIPT.findall(html)
    assert not [attrs for attrs, _ in scripts if "src" in attrs]
    assert not re.search(r"<(script|link|img)\b[^>]*\b(src|href)\s*=\s*[\"']?https?://", html)
    assert "cdn.jsdelivr" not in html
    assert (vendor_plot_js.VENDOR / "vega" / "vega.min.js").read_text(encoding="utf-8") in html
    assert html.count("vegaEmbed('#") == len(PLOTS)


@pytest.mark.integration
def test_the_page_draws_every_plot_with_the_network_off(tmp_path):
    """In headless Chromium, with every request that is not a local file refused: each plot is drawn."""
    from tools.screenshot import chromium_page

    root = fp32_project(tmp_path / "p", preset="smoke")
    dvc(root, "plots", "show", "-o", "html")
    refused: list[str] = []
    errors: list[str] = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    with chromium_page(1600, 1000, timeout=60) as page:
        page.route("**/*", route)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((root / "html" / "index.html").as_uri())
        for name in PLOTS:
            page.wait_for_selector(f"[id='{name}'] canvas, [id='{name}'] svg")
        sizes = {
            name: page.eval_on_selector(f"[id='{name}']", "d => d.getBoundingClientRect().height") for name in PLOTS
        }
        artifacts = REPO_ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "dvc_plots_offline.png"), full_page=True)
    assert refused == [] and errors == []
    assert all(size > 100 for size in sizes.values()), sizes
