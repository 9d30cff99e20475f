"""The bootstrap's resamples and seed have one home, the evaluate config (evaluate.bootstrap_resamples,
evaluate.bootstrap_seed): `./dev compare`, its --sweep and `./dev decide` take them from there
unless told otherwise (tools/options.py), so a comparison draws the very resamples of the
test items that the evaluate stage drew; a config they cannot read is their usual one-line error."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.answer.bank import build_bank
from pipeline.core import config
from pipeline.core.errors import ConfigError
from pipeline.evaluate.retrieval import evaluate_split
from pipeline.stats.metrics import METRICS
from tools import compare as cmp
from tools import decide
from tools.options import fill_bootstrap_defaults

pytestmark = pytest.mark.unit


def split(n: int, dim: int, rng) -> SimpleNamespace:
    """A test split as the evaluation reads it: n rows, each its own target text, two to a group."""
    return SimpleNamespace(
        ids=np.array([f"q{i:03d}" for i in range(n)], dtype=object),
        input_texts=np.array([f"question {i}" for i in range(n)], dtype=object),
        target_texts=np.array([f"answer {i}" for i in range(n)], dtype=object),
        groups=np.array([f"g{i // 2}" for i in range(n)], dtype=object),
        targets=rng.normal(size=(n, dim)).astype(np.float32),
    )


def evaluated_table(tmp_path, resamples: int, seed: int) -> tuple[str, dict]:
    """The evaluate stage's function on a split where the model and the ridge baseline are about
    as good (so each p-value depends on the very resamples drawn): its item table, written as the
    stage writes it, and its flat metrics."""
    rng = np.random.default_rng(31)
    test = split(200, 16, rng)
    preds = {
        who: (test.targets + rng.normal(0, 1.0, size=test.targets.shape)).astype(np.float32)
        for who in ("model", "identity", "ridge")
    }
    flat, _, items = evaluate_split("test", preds, test, build_bank([test]), resamples, seed)
    path = tmp_path / "eval_items.parquet"
    items.to_parquet(path, index=False)
    return str(path), flat


def test_compare_defaults_to_the_evaluate_configs_resamples_and_seed(tmp_path, capsys):
    ev = config.load_config().evaluate
    path, flat = evaluated_table(tmp_path, ev.bootstrap_resamples, ev.bootstrap_seed)
    # The model's one run against the ridge baseline scored beside it: the items' luck alone (no
    # metadata, so no seed reference), which is what the evaluate stage's intervals cover.
    assert cmp.main([path, "--baseline", "ridge", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["resamples"], result["seed"]) == (ev.bootstrap_resamples, ev.bootstrap_seed)
    p_values = {m: result["metrics"][m]["p_value"] for m in METRICS}
    assert p_values == {m: flat[f"eval/test/model_vs_ridge/{m}/p_value"] for m in METRICS}
    assert 0.01 < min(p_values.values()) and max(p_values.values()) < 1  # each one set by the draws
    # Another seed draws other resamples: the agreement above is not one any seed would give.
    other = ev.bootstrap_seed + 1
    assert cmp.main([path, "--baseline", "ridge", "--json", "--seed", str(other)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["seed"] == other and {m: again["metrics"][m]["p_value"] for m in METRICS} != p_values


def test_the_help_says_where_the_defaults_come_from(capsys):
    for main in (cmp.main, decide.main):
        with pytest.raises(SystemExit) as e:
            main(["--help"])
        assert e.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "default: evaluate.bootstrap_resamples of the project's config, params.yaml" in text
        assert "default: evaluate.bootstrap_seed of the project's config, params.yaml" in text


def test_a_config_the_tools_cannot_read_is_their_one_line_error(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise ConfigError("params.yaml: parameter 'evaluate.bootstrap_seed' = -1: expected >= 0")

    monkeypatch.setattr(config, "load_config", broken)
    for main, argv, prefix in (
        (cmp.main, ["a.parquet", "b.parquet"], "compare: "),
        (cmp.main, ["--sweep", "lr"], "compare: "),
        (decide.main, ["-S", "train.lr=0.001"], "decide: "),
    ):
        assert main(argv) == 2, argv
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith(prefix), (argv, out.err)
        assert "evaluate.bootstrap_seed" in out.err, argv
    # Both given: the config is not needed, and not read.
    args = SimpleNamespace(resamples=1000, seed=5)
    fill_bootstrap_defaults(args)
    assert (args.resamples, args.seed) == (1000, 5)
