"""Every measured figure in README.md and docs/*.md names its source (a committed bench result,
bench/results/<bench>.json, or a committed metrics file) and equals it at the precision printed
(bench/figures.py says how a figure cites its source)."""

import json

import pytest

from bench import figures
from pipeline.core.paths import REPO_ROOT

pytestmark = pytest.mark.unit

DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
README = REPO_ROOT / "README.md"


def relative(path):
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_every_cited_figure_in_the_docs_equals_its_source(path):
    bad = [figures.mismatch(REPO_ROOT, c) for c in figures.citations(path.read_text(), relative(path))]
    assert [b for b in bad if b] == []


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_every_measured_figure_in_the_docs_names_its_source(path):
    assert figures.uncited(path.read_text(), relative(path)) == []


def test_every_cited_figure_in_the_readme_equals_its_source():
    bad = [figures.mismatch(REPO_ROOT, c) for c in figures.citations(README.read_text(), "README.md")]
    assert [b for b in bad if b] == []


def test_every_measured_figure_in_the_readme_names_its_source():
    assert figures.uncited(README.read_text(), "README.md") == []


def test_sources_are_committed_bench_results_with_their_provenance():
    for path in sorted((REPO_ROOT / "bench" / "results").glob("*.json")):
        rec = json.loads(path.read_text())
        for key in ("bench", "command", "date", "torch", "cpu_model", "gpu_model", "figures", "unreliable", "result"):
            assert key in rec, (path.name, key)
        assert rec["bench"] == path.stem and rec["command"].startswith(f"python -m bench.{path.stem}")
        # A figure the bench could not measure reliably is null, with its reason.
        for key in rec["unreliable"]:  # dotted: a figure inside a nested one
            node = rec["figures"]
            for part in key.split("."):
                node = node[part]
            assert node is None, (path.name, key)


def test_a_citation_is_checked_at_the_precision_printed(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"figures": {"speedup": 1.934, "mfu": 0.372}, "n": {"steps": 1368}}))
    text = (
        "fast: 1.9x <!-- fig: r.json#speedup -->, MFU 37 % <!-- fig: r.json#mfu *100 -->,\n"
        "1,368 steps <!-- fig: r.json#n.steps -->; wrong: 2.0x <!-- fig: r.json#speedup -->\n"
        "missing: 3 ms <!-- fig: r.json#nothing -->\n"
    )
    found = list(figures.citations(text, "doc.md"))
    assert [(c.printed, c.key, c.factor) for c in found] == [
        ("1.9", "speedup", 1.0),
        ("37", "mfu", 100.0),
        ("1,368", "n.steps", 1.0),
        ("2.0", "speedup", 1.0),
        ("3", "nothing", 1.0),
    ]
    problems = [figures.mismatch(tmp_path, c) for c in found]
    assert problems[:3] == [None, None, None]
    assert "printed 2.0" in problems[3] and "no 'nothing'" in problems[4]


def test_a_citation_indexes_into_a_list_by_position():
    data = {"arms": [{"mean": {"value": 0.889}}, {"mean": {"value": 0.885}}]}
    assert figures.lookup(data, "arms.1.mean.value") == 0.885
    assert figures.lookup(data, "arms.0.mean") == {"value": 0.889}
    for bad in ("arms.2.mean", "arms.x.mean", "arms.-1.mean"):
        with pytest.raises(KeyError):
            figures.lookup(data, bad)


def test_uncited_finds_measured_numbers_without_a_source():
    text = (
        "1.9x <!-- fig: r.json#a -->\n"
        "takes 4.3 s and 12 s <!-- fig: r.json#b -->\n"
        "a 5 s timeout <!-- fig: setting -->\n"
        "the loss rose 1.59x <!-- fig: example -->\n"
        "`--steps 300` and 3 presets\n"
        "```\n20 ms in a code block\n```\n"
    )
    assert figures.uncited(text, "d.md") == ["d.md:2: 4.3 s"]
