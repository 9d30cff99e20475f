"""The stability report as a reader sees it: a real report (checks, plots, HTML) from synthetic
telemetry, opened in headless Chromium and screenshotted. The picture must be the whole page,
not blank, and show the verdict first: a green (stable) or red (unstable) banner near the top.

Chromium is required, not optional: `./dev test` installs Debian's package, and Playwright
(tools/screenshot.py) drives it. Without it these tests fail with find_chromium's message saying
what to install. Each screenshot is copied to test-artifacts/ (git-ignored) for a human to look at.
"""

import shutil
import stat

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pipeline.core.atomic import write_text
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.report.checks import run_checks
from pipeline.report.layout import STATUS_COLOURS
from pipeline.report.plots import make_plots
from pipeline.report.render import render_html
from tools import screenshot as shot_mod
from tools.screenshot import find_chromium, main, screenshot

pytestmark = pytest.mark.integration

ARTIFACTS = REPO_ROOT / "test-artifacts"
N = 100
NAN_STEPS = range(40, 46)  # 6 % of the run: over the 1 % limit, so nonfinite fails
PARAMS = {"planned_steps": N}
EVAL = {
    "eval/test/model/cosine": 0.81,
    "eval/test/model/mse": 0.0021,
    "eval/test/model/top1": 0.42,
    "eval/test/model/top5": 0.77,
    "eval/val/model/cosine": 0.80,
    "eval/test/ridge/cosine": 0.74,
    "eval/test/identity/cosine": 0.31,
    "eval/test/nearest/cosine": 0.02,
}
BANNER = {"stable": STATUS_COLOURS["pass"], "unstable": STATUS_COLOURS["fail"]}
OTHER = {"stable": "unstable", "unstable": "stable"}
TOP_PX = 250  # the verdict must be on the first screen, above the check table


def telemetry(unstable: bool, seed: int = 0) -> pd.DataFrame:
    """One logged row per step. Unstable: NaN loss and gradient at steps 40-45 (skipped) and host
    RSS climbing 3 MB per step."""
    rng = np.random.default_rng(seed)
    step = np.arange(1, N + 1)
    loss = 2 + 3 * np.exp(-step / 30) + rng.normal(0, 0.05, N)
    norm = rng.uniform(0.5, 3, N)
    rss = 1500 + rng.uniform(-5, 5, N)
    skipped = np.zeros(N, dtype=int)
    if unstable:
        bad = np.isin(step, NAN_STEPS)
        loss[bad], norm[bad], skipped[bad] = np.nan, np.nan, 1
        rss += 3.0 * step
    return pd.DataFrame(
        {
            "step": step,
            "epoch": 0,
            "train/loss": loss,
            "train/skipped": skipped,
            "grad/global_norm": norm,
            "grad/clipped_norm": np.minimum(norm, 1.0),
            "train/lr": 1e-3,
            "perf/step_ms": 20 + rng.normal(0, 1, N),
            "mem/rss_mb": rss,
            "flow/steps_used": rng.integers(5, 9, N),
        }
    )


def events(unstable: bool) -> list[dict]:
    if not unstable:
        return []
    return [{"step": s, "kind": "nan_loss", "module": "carrier", "action": "skipped"} for s in NAN_STEPS]


def build_report(kind: str, out_dir) -> tuple:
    """(report.html, run_checks result): the report stage's calls (stages/report.py) on synthetic data."""
    unstable = kind == "unstable"
    steps, evs = telemetry(unstable), events(unstable)
    result = run_checks(steps, evs, PARAMS, EVAL)
    assert result["verdict"] == kind, f"synthetic {kind} run judged {result['verdict']}: {result['failed']}"
    plots = make_plots(steps, evs, PARAMS, out_dir / "plots")
    info = {
        "run_id": f"synthetic-{kind}",
        "preset": "test",
        "train/steps": N,
        "train/skipped_steps": int(steps["train/skipped"].sum()),
    }
    html_path = out_dir / "stability.html"
    write_text(html_path, render_html(result, plots, info, EVAL))
    return html_path, result


def keep(png, name: str):
    """Copy a screenshot to test-artifacts/ for a human to look at; the copy's path."""
    ARTIFACTS.mkdir(exist_ok=True)
    dest = ARTIFACTS / name
    shutil.copyfile(png, dest)
    print(f"screenshot: {dest}")
    return dest


def pixels(png) -> np.ndarray:
    with Image.open(png) as im:
        return np.asarray(im.convert("RGB")).astype(np.int16)


def colour_rows(img: np.ndarray, hex_colour: str, tol: int = 8) -> np.ndarray:
    """Per row, the fraction of its pixels that are `hex_colour` (within `tol` per channel)."""
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return (np.abs(img - rgb) <= tol).all(axis=2).mean(axis=1)


def assert_verdict_first(img: np.ndarray, kind: str, where) -> None:
    """The verdict banner (.verdict: 960 px wide of 1280) fills a band within the top TOP_PX px;
    the other verdict's colour fills no row there (badges are ~50 px, far below the bar)."""
    top = img[:TOP_PX]
    band = np.flatnonzero(colour_rows(top, BANNER[kind]) >= 0.4)
    assert len(band) >= 25, f"no {kind} banner ({BANNER[kind]}) in the top {TOP_PX} px of {where}"
    # The band is one banner: its rows are contiguous apart from the text lines inside it.
    assert band[-1] - band[0] < 150, f"{kind} colour scattered over rows {band[0]}-{band[-1]} of {where}"
    other = colour_rows(top, BANNER[OTHER[kind]])
    assert other.max() < 0.2, f"{OTHER[kind]} banner colour in the top {TOP_PX} px of {where}"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Both reports, built once: {kind: report.html}."""
    out = {}
    for kind in ("stable", "unstable"):
        out[kind], _ = build_report(kind, tmp_path_factory.mktemp(kind))
    return out


@pytest.mark.parametrize("kind", ["stable", "unstable"])
def test_full_page_screenshot_is_the_whole_report_verdict_first(reports, kind, tmp_path):
    png = screenshot(reports[kind], tmp_path / "full.png")
    where = keep(png, f"report-{kind}-full.png")
    img = pixels(png)
    height, width, _ = img.shape
    assert width == 1280 and height > 1000, f"{where} is {width}x{height}"
    # Not blank: text, badges and five plots make thousands of distinct colours.
    colours = len(np.unique(img.reshape(-1, 3) @ np.array([1, 256, 65536])))
    assert colours > 500, f"{where} has only {colours} colours"
    assert_verdict_first(img, kind, where)
    # The whole page, not the first window: it ends in the body's bottom margin (background), with
    # the last table just above it.
    ink = (np.abs(img - 255) > 16).any(axis=2).any(axis=1)
    assert not ink[-10:].any(), f"{where} is cut off: content in its last 10 rows"
    assert ink[-150:].any(), f"{where} ends in more than 150 px of blank: measured height too large?"


@pytest.mark.parametrize("kind", ["stable", "unstable"])
def test_first_screen_shows_the_verdict_banner(reports, kind, tmp_path):
    png = screenshot(reports[kind], tmp_path / "first.png", height=900)
    where = keep(png, f"report-{kind}-first-screen.png")
    img = pixels(png)
    assert img.shape[:2] == (900, 1280), f"{where} is {img.shape[1]}x{img.shape[0]}"
    assert_verdict_first(img, kind, where)


def test_cli_writes_the_png_next_to_the_html(reports, tmp_path, capsys):
    html_path = tmp_path / "stability.html"
    shutil.copyfile(reports["unstable"], html_path)
    assert main([str(html_path), "--height", "300"]) == 0
    png = html_path.with_suffix(".png")
    assert capsys.readouterr().out.strip() == str(png)
    assert pixels(png).shape[:2] == (300, 1280)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stability.html", "stability.png"]  # no temp left


def test_missing_chromium_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(shot_mod.os, "access", lambda *a, **k: False)  # hide /usr/bin/chromium
    with pytest.raises(PipelineError, match=r"apt-get install .*chromium.*\./dev test"):
        find_chromium()
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-such-chrome"))
    with pytest.raises(PipelineError, match="CHROMIUM="):
        find_chromium()


def fake_chromium(tmp_path, body: str) -> str:
    path = tmp_path / "fake-chromium"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    "body, message",
    [
        ("echo 'GPU process crashed: out of cheese' >&2; exit 3", r"(?s)exited with status 3.*out of cheese"),
        ("exit 0", r"exited with status 0 .*It printed nothing"),
        ("sleep 30", r"did not start within 1 s"),
    ],
)
def test_chromium_failures_are_pipeline_errors_with_its_stderr(monkeypatch, tmp_path, body, message):
    html_path = tmp_path / "r.html"
    html_path.write_text("<!DOCTYPE html><html><body>x</body></html>")
    monkeypatch.setenv("CHROMIUM", fake_chromium(tmp_path, body))
    with pytest.raises(PipelineError, match=message):
        screenshot(html_path, tmp_path / "r.png", height=100, timeout=1)
    assert not (tmp_path / "r.png").exists()
