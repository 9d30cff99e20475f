"""What a bench saves as the source of the docs' figures (bench/results.py), how two saved sets
are compared (bench/agreement.py), and the CPU-time clock the benches measure with
(bench/clock.py). No timing is asserted (benchmarks report ratios, tests check behaviour)."""

import json

import pytest

from bench import agreement, clock, results
from bench.probe import Probe

pytestmark = pytest.mark.unit


def test_the_recorded_command_leaves_out_save_and_its_path():
    assert results.command("model", ["--quick", "--save"]) == "python -m bench.model --quick"
    assert results.command("model", ["--save", "/tmp/x.json", "--quick"]) == "python -m bench.model --quick"
    assert results.command("serve", ["--save=/tmp/x.json", "-k", "3"]) == "python -m bench.serve -k 3"
    assert results.command("data", ["--save", "--quick"]) == "python -m bench.data --quick"


def test_a_figure_with_a_reason_is_null_and_the_reason_kept():
    out = results.figures({"ratio": 1.9, "speedup": 3.0}, {"ratio": "needs more cores", "speedup": None})
    assert out == {"figures": {"ratio": None, "speedup": 3.0}, "unreliable": {"ratio": "needs more cores"}}


def test_save_writes_the_figures_with_their_provenance(tmp_path, capsys):
    res = {"a": 1.0, "nan": float("nan"), **results.figures({"a": 1.0})}
    path = tmp_path / "sub" / "model.json"
    results.finish("model", res, str(path), ["--quick", "--save", str(path)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["a"] == 1.0  # printed as before
    rec = json.loads(path.read_text())
    assert rec["bench"] == "model" and rec["command"] == "python -m bench.model --quick"
    assert rec["figures"] == {"a": 1.0} and rec["unreliable"] == {}
    assert rec["cpu_model"] and rec["torch"] and rec["date"].endswith("Z") and rec["gpu_model"] is None
    assert rec["result"]["nan"] is None  # valid JSON: no NaN


def test_without_save_nothing_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    results.finish("model", {"a": 1}, None)
    assert list(tmp_path.iterdir()) == [] and json.loads(capsys.readouterr().out) == {"a": 1}


def record(figures, unreliable=None):
    return {"figures": figures, "unreliable": unreliable or {}, "cpu_model": "x", "date": "d", "torch": "t"}


def test_agreement_compares_every_figure_of_both_sets(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "model.json").write_text(json.dumps(record({"speedup": 100.0, "mfu": 0.5, "nested": {"x": 2.0}})))
    (b / "model.json").write_text(json.dumps(record({"speedup": 105.0, "mfu": 0.4, "nested": {"x": 2.0}})))
    (a / "scaling.json").write_text(json.dumps(record({"ratio": None}, {"ratio": "2 cores"})))
    (b / "scaling.json").write_text(json.dumps(record({"ratio": 0.9})))
    (a / "serve.json").write_text(json.dumps(record({"x": 1.0})))
    res = agreement.compare(agreement.load(a), agreement.load(b), 0.10)
    by = {(r["bench"], r["figure"]): r for r in res["figures"]}
    assert by[("model", "speedup")]["ratio"] == pytest.approx(1.05) and by[("model", "speedup")]["agrees"]
    assert by[("model", "mfu")]["agrees"] is False and by[("model", "nested.x")]["agrees"]
    assert by[("scaling", "ratio")]["skipped"] == "2 cores"
    assert res["compared"] == 3 and res["outside_tolerance"] == 1 and res["only_in_a"] == ["serve"]
    with pytest.raises(SystemExit) as end:
        agreement.main([str(a), str(b), "model"])
    assert end.value.code == 1


def test_a_bench_named_like_a_project_directory_is_a_bench(tmp_path, monkeypatch, capsys):
    # `data` is both bench/data.py and the project's data/ directory: the bench is meant.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for d in (a, b):
        (d / "data.json").write_text(json.dumps(record({"x": 1.0})))
        (d / "model.json").write_text(json.dumps(record({"y": 1.0})))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    res = agreement.main([str(a), str(b), "data"])
    assert [r["bench"] for r in res["figures"]] == ["data"] and res["compared"] == 1
    # The option may come between the names (argparse keeps positionals apart otherwise).
    assert agreement.main(["--tolerance", "0.1", str(a), str(b), "data"])["compared"] == 1
    assert agreement.main([str(a), "--tolerance", "0.1", str(b), "data"])["compared"] == 1
    with pytest.raises(SystemExit) as end:
        agreement.main([str(a), str(b), "no_such_bench"])
    assert end.value.code == 2 and "neither a result directory nor a bench" in capsys.readouterr().err


def test_interleaved_ratio_alternates_the_arms_and_takes_the_median_of_pairs():
    calls = []
    res = clock.interleaved_ratio(lambda: calls.append("a"), lambda: calls.append("b"), pairs=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # each warmed once, then ab, ba, ab
    assert len(res["pair_ratios"]) == 3 and res["ratio"] > 0


def test_a_wall_ratio_across_thread_counts_needs_the_cores_and_a_quiet_machine():
    assert "needs" in clock.wall_ratio_unreliable(False, clock.cores() + 1)
    assert "busy" in clock.wall_ratio_unreliable(True, 1)
    assert clock.wall_ratio_unreliable(False, 1) is None


def test_probes_keep_their_cpu_seconds_too():
    p = Probe(threads=1, n=32, reps=2)
    p.take(3)
    assert len(p.cpu_times) == 3 and p.peak_flops_cpu() == pytest.approx(p.flops / min(p.cpu_times))


def test_a_median_needs_three_samples_for_an_interval_and_narrows_with_more():
    assert clock.median_half_width([1.0, 2.0]) is None
    assert clock.median_half_width([1.0, 1.0, 1.0]) == 0.0
    few, many = clock.median_half_width([1.0, 2.0, 3.0, 4.0]), clock.median_half_width([1.0, 2.0, 3.0, 4.0] * 4)
    assert 0 < many < few


def test_a_figure_is_reported_only_when_its_spread_is_within_the_agreement_tolerance():
    assert clock.spread_unreliable(1.0, clock.AGREEMENT / 2, "range") is None
    assert "range: 0.5" in clock.spread_unreliable(1.0, 0.5, "range")
    assert "too few" in clock.spread_unreliable(1.0, None, "range")
    assert clock.spread_unreliable(None, 0.0, "range") == "nothing was measured"


def test_agreement_defaults_to_the_benches_tolerance(capsys):
    with pytest.raises(SystemExit):
        agreement.main(["--help"])
    assert f"default {clock.AGREEMENT:g}" in " ".join(capsys.readouterr().out.split())
