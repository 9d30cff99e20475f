"""Importing the project (its stages, library, tools/ and bench/) changes nothing in the process: no
environment variable, no umask, no signal handler, no excepthook. Only a stage run as `python -m
stages.<name>` sets up its process (stages/startup.py), and it does so before its imports."""

import json
import os
import subprocess
import sys

import pytest

from pipeline.core.paths import REPO_ROOT

# integration: a fresh interpreter that imports every library and stage (torch, MLflow,
# sentence-transformers: the unit tier's slowest test, 66 s on 2 loaded cores).
pytestmark = pytest.mark.integration

# The libraries first (MLflow, for one, sets an environment variable of its own on import): what
# is compared is what the project's own modules change.
PROBE = """
import json, os, signal, sys
import torch, mlflow, pandas, numpy, omegaconf, hydra, sentence_transformers, matplotlib
before = (dict(os.environ), os.umask(0o022), signal.getsignal(signal.SIGINT), sys.excepthook)
os.umask(before[1])
import stages, stages.embed, stages.train, stages.evaluate, stages.report, stages.startup
import pipeline.core.atomic, pipeline.tracking.store, pipeline.train.loop, pipeline.report.build
import importlib, pkgutil, tools, bench
for pkg in (tools, bench):  # every module of the commands and benchmarks (a __main__ would run one)
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        m.name.endswith("__main__") or importlib.import_module(m.name)
umask = os.umask(0o022)
after = (dict(os.environ), umask, signal.getsignal(signal.SIGINT), sys.excepthook)
print(json.dumps({"env": sorted(set(after[0].items()) ^ set(before[0].items())),
                  "umask": after[1] == before[1], "sigint": after[2] is before[2], "hook": after[3] is before[3]}))
"""


def test_importing_every_stage_and_the_library_changes_nothing_in_the_process():
    env = {k: v for k, v in os.environ.items() if k != "ENERGY_FLOW_NUMERICS"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"env": [], "umask": True, "sigint": True, "hook": True}
