"""bench.ask_start runs end to end (--quick) on a real logged answer model, loaded as ./dev ask
loads it, and reports what it promises; no timing is asserted (tests check behaviour)."""

import json

import pytest

from bench import ask_start as bench
from tests.helpers.answer_model import AnswerProject
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def project(answer_project) -> AnswerProject:
    return answer_project  # (tests/conftest.py: one project for every module that asks the model)


@pytest.mark.slow  # three ./dev ask runs in subprocesses (~20 s on 2 cores): not in the default suite
def test_quick_run_prints_one_json_line_with_the_figures(project):
    # (recorded relative to the checkout: a copied checkout finds its own)
    model_dir = str(project.root / json.loads((project.root / "runs" / "evaluate.json").read_text())["model_dir"])
    res = bench_json("bench.ask_start", "--quick", "--model", model_dir, env=project.env)
    assert res["runs"] == 2 and len(res["cpu_s_runs"]) == len(res["wall_s_runs"]) == 2
    assert res["path"] == "local" and model_dir in res["loading"]  # the fast path, without MLflow
    assert res["figures"]["cpu_s"] == res["cpu_s"] > 0 and res["context"]["wall_s"] > 0
    imports = res["imports_traced_s"]
    assert set(imports) == set(bench.PACKAGES) and imports["torch"] > 0
    # The bundled teacher answers without sentence-transformers or MLflow being imported.
    assert imports["sentence_transformers"] == imports["mlflow"] == 0


def test_import_seconds_take_each_packages_first_cumulative_time():
    trace = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:       120 |     900000 |   torch",
            "import time:        10 |         10 |     torch",
            "import time:       500 |    1500000 | transformers",
            "import time:        50 |      40000 | pandas.core",
        ]
    )
    got = bench.import_seconds(trace)
    assert got["torch"] == 0.9 and got["transformers"] == 1.5 and got["pandas"] == 0.0 and got["mlflow"] == 0.0
