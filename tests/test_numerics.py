"""The portable CPU numerics (pipeline/core/numerics.py): pin() sets defaults and keeps the user's values,
a stage process runs under them (MKL's COMPATIBLE branch, ATen at AVX2, a fixed thread count), the
opt-out works, and (slow) the smoke weights are bitwise identical under every emulated machine
(bench.numerics --quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.core import numerics
from pipeline.core.paths import REPO_ROOT
from tests.helpers.bench_runs import bench_json, run_module

pytestmark = pytest.mark.integration


def test_pin_sets_defaults_and_keeps_what_the_user_set():
    env = {"MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "3"}
    record = numerics.pin(env)
    assert record["mode"] == "portable"
    assert record["kept"] == {"MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "3"}
    assert env["MKL_CBWR"] == "AUTO" and env["OMP_NUM_THREADS"] == "3"  # never overridden
    for key, value in numerics.PORTABLE.items():
        if key not in record["kept"]:
            assert env[key] == value and record["set"][key] == value
    assert env[numerics.MODE_VAR] == "portable"
    assert numerics.pin(env)["set"] == {}  # a second call (a child process) changes nothing


def test_native_opts_out_and_a_bad_mode_is_refused():
    env = {numerics.MODE_VAR: "native"}
    assert numerics.pin(env) == {"mode": "native", "set": {}, "kept": {}}
    assert env == {numerics.MODE_VAR: "native"}
    with pytest.raises(ValueError, match="portable, native"):
        numerics.pin({numerics.MODE_VAR: "fast"})


def test_threads_are_fixed_only_under_the_portable_setting(monkeypatch):
    monkeypatch.delenv(numerics.MODE_VAR, raising=False)
    assert numerics.threads(0) == 0 and numerics.threads(4) == 4  # not pinned: the old rules
    monkeypatch.setenv(numerics.MODE_VAR, "portable")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert numerics.threads(0) == numerics.PORTABLE_THREADS and numerics.threads(4) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert numerics.threads(0) == 2
    from pipeline.core.distributed import Dist, threads_per_process

    assert threads_per_process(0, Dist(rank=0, world_size=2, local_rank=0, local_world_size=2)) == 2
    monkeypatch.setenv(numerics.MODE_VAR, "native")
    assert numerics.threads(0) == 0


# What a stage does first (stages/startup.py), then a product, under MKL_VERBOSE (which prints
# the CNR branch MKL runs in) and the numerics a run would log.
STAGE_PROBE = (
    "from stages import startup; pin = startup.begin(); import json, torch; a = torch.ones(64, 64); a @ a; "
    "from pipeline.core import numerics; print(json.dumps({'pin': pin, 'vectors': numerics.vectors_tag(), "
    "**numerics.numerics_info()}))"
)


def probe(**env) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE and k != numerics.MODE_VAR}
    proc = subprocess.run(
        [sys.executable, "-c", STAGE_PROBE],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**base, "MKL_VERBOSE": "1", "PYTHONPATH": str(REPO_ROOT), **env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_a_stage_process_runs_under_the_portable_setting():
    info, verbose = probe()
    assert info["numerics.mode"] == "portable" and not info["pin"]["kept"]
    assert "CNR:COMPATIBLE" in verbose  # MKL read it: its branch for Intel and AMD alike
    assert info["numerics.cpu_capability"] in ("AVX2", "DEFAULT")  # ATen capped (DEFAULT: a CPU without AVX2)
    assert info["numerics.threads"] == str(numerics.PORTABLE_THREADS)
    assert info["numerics.MKL_CBWR"] == "COMPATIBLE" and info["numerics.torch"] and info["numerics.cpu"]
    assert info["vectors"] == "portable/1"  # the embedding cache's key part
    assert probe(OMP_NUM_THREADS="2")[0]["vectors"] == "portable/2"
    # A value the user set wins; the rest is still pinned.
    info, verbose = probe(MKL_CBWR="AUTO")
    assert "CNR:AUTO" in verbose and info["pin"]["kept"] == {"MKL_CBWR": "AUTO"}
    assert info["numerics.cpu_capability"] in ("AVX2", "DEFAULT")
    # The opt-out: every library picks its own path.
    info, verbose = probe(ENERGY_FLOW_NUMERICS="native")
    assert info["numerics.mode"] == "native" and "CNR:OFF" in verbose and info["numerics.MKL_CBWR"] == ""
    assert info["vectors"] == f"native/{info['numerics.cpu']}"


@pytest.mark.slow  # builds the smoke shards and trains ~12 times in fresh processes (a few minutes)
def test_portable_setting_gives_the_same_weights_on_every_emulated_machine():
    res = bench_json(
        "bench.numerics",
        "--quick",
        timeout=1800,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    portable = {k: v for k, v in res["agreement"].items() if k.startswith("portable/")}
    assert len(portable) == len(__import__("bench.numerics").numerics.QUICK)
    ran = [v for v in portable.values() if "skipped" not in v]
    assert len(ran) >= 3 and all(v["weights_identical"] for v in ran), portable
    assert res["portable_all_identical"] and res["portable_val_cosine_spread"] == 0.0
    assert res["train_step_ratio"] > 0 and res["train_step_ratio_probe_normalised"] > 0
    assert res["machine"]["numerics.cpu"]


def test_bench_help_explains_the_figures():
    out = run_module("bench.numerics", "--help", timeout=120).stdout
    assert "agreement" in out and "train_step" in out.replace("training step", "train_step") and "--quick" in out
