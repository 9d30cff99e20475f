"""Property-based: a malformed dataset file never gives a traceback or a wrong-but-silent result.

Each example starts from a valid small dataset (id, question, answer; some non-ASCII text) in one
of the five formats and mutates it: fields dropped, repeated, renamed or retyped (number, null,
list, nested object, bool), NULs and lone surrogates injected, ids repeated, rows with extra or
missing cells, another delimiter, unbalanced quotes, other encodings (UTF-16 with and without a
byte-order mark, Latin-1, cp1252), bytes flipped, inserted or deleted, the file truncated. Some
examples get only harmless changes (CRLF line ends, a UTF-8 byte-order mark, blank lines, the
right embed.delimiter for the file) and must read back exactly.

- `read_dataset` must return a valid frame (every text a non-empty str that encodes as UTF-8 and
  holds no NUL; ids unique) or raise DatasetError/ConfigError naming the file.
- The embed stage, in-process, must exit 0, 1 or 2; on an error print one `[embed] error:` (or
  `config error:`) message naming the file, with no traceback, and leave the previous shards byte
  for byte and nothing else written; on success the shards open and the dataset is unchanged.

The default suite runs a fixed (derandomized) set of examples; `-m slow` runs ten times as many
(FUZZ_READERS_EXAMPLES sets that number for a longer local run).
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import ConfigError, DatasetError
from pipeline.data.readers.dataset import read_dataset
from pipeline.data.shards import open_split
from stages import embed
from tests.helpers.shards import fake_shards

pytestmark = pytest.mark.integration  # runs a stage or a bench: outside the ~2-minute unit tier

FIELDS = ("id", "question", "answer")
QUESTIONS = [
    "What is 2+2?",
    "Capital of France?",
    "Qu'est-ce qu'un café ?",
    "Was heißt Grüße?",
    "日本の首都は？",
    "Why 😀?",
    'Who said "hi, there"?',
    "a, b; c | d",
    "Ωμέγα or ALPHA?",
    "multi\nline question",
    "NA",
    "null",
]
ANSWERS = [
    "4",
    "Paris",
    "Une boisson.",
    "Greetings",
    "東京",
    "Because.",
    "Someone",
    "tab\tinside",
    "naïve résumé",
    "ça va",
    "None",
    "0",
]
FORMATS = {"csv": ".csv", "tsv": ".tsv", "jsonl": ".jsonl", "json": ".json", "parquet": ".parquet"}

STRUCTURAL = [
    "drop_field",
    "retype",
    "inject_char",
    "dup_field",
    "dup_id",
    "rename_field",
    "nest",
    "empty_text",
    "delimiter",
    "extra_cell",
    "missing_cell",
    "unbalanced_quote",
]
BYTE_LEVEL = ["flip", "insert", "delete", "truncate", "encoding", "nul_byte", "quote_byte"]
HARMLESS = ["crlf", "bom", "blank_lines", "indent"]

ODD_VALUES = st.one_of(
    st.integers(-(10**20), 10**20),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.sampled_from(["x", "y"]), max_size=2),
    st.just({"text": "nested"}),
    st.just(""),
    st.just("  \t "),
    st.just({}),
    st.just([]),
)


# --------------------------------------------------------------------------- the generator


@st.composite
def rows_strategy(draw, min_rows: int, max_rows: int) -> list[dict]:
    n = draw(st.integers(min_rows, max_rows))
    return [
        {
            "id": f"r{i}",
            "question": f"{draw(st.sampled_from(QUESTIONS))} #{i}",
            "answer": f"{draw(st.sampled_from(ANSWERS))} ({i})",
        }
        for i in range(n)
    ]


def _delimited(rows: list[dict], sep: str, header: list[str], cells: dict, quote_all: bool, eol: str) -> str:
    out = io.StringIO()
    w = csv.writer(out, delimiter=sep, lineterminator=eol, quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
    w.writerow(header)
    for i, r in enumerate(rows):
        vals = [_as_text(r.get(h, "")) for h in header]
        w.writerow(cells.get(i, lambda v: v)(vals))
    return out.getvalue()


def _as_text(v) -> str:
    return "" if v is None else v if isinstance(v, str) else json.dumps(v)


def _json_obj(r: dict, dup: str | None, ensure_ascii: bool) -> str:
    items = [(k, v) for k, v in r.items()]
    if dup and dup in r:
        items.append((dup, "second value"))
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=ensure_ascii)}" for k, v in items) + "}"


def _has_surrogate(v) -> bool:
    return isinstance(v, str) and any("\ud800" <= c <= "\udfff" for c in v)


def _arrow(values: list):
    if any(_has_surrogate(v) for v in values):  # stored as the bytes a sloppy writer would leave
        return pa.array(
            [None if v is None else _as_text(v).encode("utf-8", "surrogatepass") for v in values], pa.binary()
        ).view(pa.string())
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.array([None if v is None else _as_text(v) for v in values], pa.string())


def _parquet(rows: list[dict], dup: str | None, invalid_utf8: str | None) -> bytes:
    names = list(dict.fromkeys(k for r in rows for k in r))
    arrays = [_arrow([r.get(name) for r in rows]) for name in names]
    if invalid_utf8 in names:
        arrays[names.index(invalid_utf8)] = pa.array([b"bad \xff\xfe bytes"] * len(rows), pa.binary()).view(pa.string())
    if dup in names:
        arrays.append(arrays[names.index(dup)])
        names.append(dup)
    buf = io.BytesIO()
    try:
        pq.write_table(pa.table(arrays, names=names), buf)
    except (pa.ArrowException, ValueError, TypeError):  # e.g. a struct with no fields: written as text
        buf = io.BytesIO()
        arrays = [
            a if pa.types.is_string(a.type) else _arrow([_as_text(v) if v is not None else None for v in a.to_pylist()])
            for a in arrays
        ]
        pq.write_table(pa.table(arrays, names=names), buf)
    return buf.getvalue()


@st.composite
def dataset_files(draw, min_rows: int = 3, max_rows: int = 6, formats=tuple(FORMATS)) -> dict:
    """{"name", "bytes", "options" (read_dataset keyword arguments), "mutations", "rows",
    "harmless_only"} for one (possibly) malformed file."""
    fmt = draw(st.sampled_from(formats))
    rows = draw(rows_strategy(min_rows, max_rows))
    kind = draw(st.sampled_from(["structural", "bytes", "both", "harmless"]))
    mutations: list[str] = []
    if kind in ("structural", "both"):
        mutations += draw(st.lists(st.sampled_from(STRUCTURAL), min_size=1, max_size=3))
    if kind in ("bytes", "both"):
        mutations += draw(st.lists(st.sampled_from(BYTE_LEVEL), min_size=1, max_size=3))
    harmless = draw(st.lists(st.sampled_from(HARMLESS), max_size=2)) if kind == "harmless" else []

    def pick_row() -> int:
        return draw(st.integers(0, len(rows) - 1))

    def pick_field() -> str:
        return draw(st.sampled_from(FIELDS))

    dup_field = None
    header = list(FIELDS)
    sep_default = "\t" if fmt == "tsv" else ","
    sep = sep_default
    cells: dict = {}
    invalid_utf8 = None
    for m in mutations:
        if m == "drop_field":
            f = pick_field()
            for i in [pick_row()] if draw(st.booleans()) else range(len(rows)):
                rows[i].pop(f, None)
            if draw(st.booleans()) and f in header:
                header.remove(f)
        elif m == "retype":
            rows[pick_row()][pick_field()] = draw(ODD_VALUES)
        elif m == "inject_char":
            r, f = pick_row(), draw(st.sampled_from(FIELDS))
            v = rows[r].get(f)
            if isinstance(v, str):
                at = draw(st.integers(0, len(v)))
                ch = draw(st.sampled_from(["\x00", "\ud800", "\udfff", "\ud83d", "\x01", "\u2028", "\x85"]))
                rows[r][f] = v[:at] + ch + v[at:]
        elif m == "dup_field":
            dup_field = pick_field()
            header.append(dup_field)
        elif m == "dup_id":
            rows[pick_row()]["id"] = rows[pick_row()].get("id", "r0")
        elif m == "rename_field":
            f = pick_field()
            new = draw(st.sampled_from([f.upper(), f" {f}", f"{f}.text", f + "s"]))
            for r in rows:
                if f in r:
                    r[new] = r.pop(f)
            header = [new if h == f else h for h in header]
        elif m == "nest":
            f = draw(st.sampled_from(["question", "answer"]))
            for r in rows:
                if f in r:
                    r[f] = {"text": r[f]}
        elif m == "empty_text":
            rows[pick_row()][draw(st.sampled_from(["question", "answer"]))] = draw(st.sampled_from(["", " ", None]))
        elif m == "delimiter":
            sep = draw(st.sampled_from([";", "|", "\t", ","]))
        elif m == "extra_cell":
            cells[pick_row()] = lambda v: v + ["extra"]
        elif m == "missing_cell":
            cells[pick_row()] = lambda v: v[:-1]
        elif m == "unbalanced_quote":
            pass  # applied to the text below
        if m in ("inject_char",) and fmt == "parquet" and draw(st.booleans()):
            invalid_utf8 = draw(st.sampled_from(["question", "answer"]))

    ensure_ascii = draw(st.booleans())
    if fmt in ("csv", "tsv"):
        text = _delimited(
            rows, sep, header, cells, quote_all=draw(st.booleans()), eol="\r\n" if "crlf" in harmless else "\n"
        )
        if "unbalanced_quote" in mutations:
            at = draw(st.integers(0, len(text)))
            text = text[:at] + '"' + text[at:]
    elif fmt == "jsonl":
        text = "".join(_json_obj(r, dup_field, ensure_ascii) + "\n" for r in rows)
    elif fmt == "json":
        indent = "\n  " if "indent" in harmless else " "
        text = "[" + indent + ("," + indent).join(_json_obj(r, dup_field, ensure_ascii) for r in rows) + "\n]\n"
    if fmt == "parquet":
        data = _parquet(rows, dup_field, invalid_utf8)
    else:
        if "crlf" in harmless and fmt in ("json", "jsonl"):  # JSON escapes the newlines inside strings
            text = text.replace("\n", "\r\n")
        if "blank_lines" in harmless and fmt != "csv" and fmt != "tsv":
            text = "\n" + text.replace("\n", "\n\n")
        data = text.encode("utf-8", "surrogatepass")
        if "bom" in harmless:
            data = b"\xef\xbb\xbf" + data

    for m in mutations:
        if m == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
        elif m == "insert":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif m == "delete" and data:
            at = draw(st.integers(0, len(data) - 1))
            data = data[:at] + data[at + draw(st.integers(1, 16)) :]
        elif m == "truncate":
            data = data[: draw(st.integers(0, len(data)))]
        elif m == "encoding" and fmt != "parquet":
            enc = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"]))
            try:
                text = data.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:  # bytes flipped before: re-encode what they read as in Latin-1
                text = data.decode("latin-1")
            data = text.encode(enc, "replace" if enc in ("latin-1", "cp1252") else "surrogatepass")
        elif m == "nul_byte":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + b"\x00" + data[at:]
        elif m == "quote_byte":
            at = draw(st.integers(0, len(data)))
            data = data[:at] + b'"' + data[at:]

    options: dict = {"id_field": draw(st.sampled_from(["id", "id", None, ""])), "skip_empty": draw(st.booleans())}
    if fmt in ("csv", "tsv") and sep != sep_default and draw(st.booleans()):
        options["delimiter"] = {"\t": "tab"}.get(sep, sep)
    elif fmt in ("csv", "tsv") and "delimiter" not in mutations and kind == "harmless" and draw(st.booleans()):
        options["delimiter"] = {"\t": "tab"}.get(sep, sep)  # the format's own, said explicitly
    name = "pairs" + FORMATS[fmt]
    harmless_only = kind == "harmless"
    return {
        "name": name,
        "bytes": data,
        "options": options,
        "mutations": mutations + harmless,
        "rows": rows,
        "harmless_only": harmless_only,
        "fmt": fmt,
    }


# --------------------------------------------------------------------------- read_dataset


def check_frame(df: pd.DataFrame, id_field) -> None:
    assert list(df.columns) == ["id", "input_text", "target_text", "group"]
    assert len(df) > 0
    for col in ("input_text", "target_text", "id"):
        for v in df[col]:
            assert isinstance(v, str) and v.strip(), (col, v)
            v.encode("utf-8")  # no lone surrogate
            assert "\x00" not in v, (col, v)
    if id_field:
        assert df["id"].is_unique
    else:  # content hashes: equal pairs share one (prepare_pairs numbers or drops the repeats)
        assert df.drop_duplicates(["input_text", "target_text"])["id"].is_unique


def check_read(tmp: Path, case: dict, as_directory: bool = False) -> None:
    folder = tmp / "data"
    folder.mkdir()
    path = folder / case["name"]
    path.write_bytes(case["bytes"])
    spec = path
    if as_directory:  # a good file beside the bad one: ids and skipped entries across files
        (folder / "a-good.jsonl").write_text(
            json.dumps({"id": "good-1", "question": "Good question?", "answer": "Good answer."}) + "\n"
        )
        (folder / "notes.txt").write_text("not data")
        spec = folder
    try:
        df = read_dataset(spec, "question", "answer", **case["options"])
    except (DatasetError, ConfigError) as e:
        event("refused")
        assert str(spec) in str(e), f"{case['mutations']}: the message does not name {spec}: {e}"
        assert not case["harmless_only"], f"{case['mutations']}: a harmless change was refused: {e}"
        return
    event("read")
    check_frame(df, case["options"]["id_field"])
    if as_directory:
        assert [p.name for p, _ in df.attrs["files_skipped"]] == ["notes.txt"]
    if case["harmless_only"] and not as_directory:
        want = case["rows"]
        assert df["input_text"].tolist() == [r["question"] for r in want]
        assert df["target_text"].tolist() == [r["answer"] for r in want]
        if case["options"]["id_field"]:
            assert df["id"].tolist() == [r["id"] for r in want]


COMMON = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
READ_EXAMPLES = 500
SLOW_EXAMPLES = int(os.environ.get("FUZZ_READERS_EXAMPLES", "0")) or 10 * READ_EXAMPLES


@settings(max_examples=READ_EXAMPLES, derandomize=True, **COMMON)
@given(case=dataset_files(), as_directory=st.booleans())
def test_read_dataset_refuses_or_returns_valid_frames(tmp_path, case, as_directory):
    check_read(Path(tempfile.mkdtemp(dir=tmp_path)), case, as_directory)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, derandomize=False, database=None, **COMMON)
@given(case=dataset_files(max_rows=12), as_directory=st.booleans())
def test_read_dataset_refuses_or_returns_valid_frames_many(tmp_path, case, as_directory):
    check_read(Path(tempfile.mkdtemp(dir=tmp_path)), case, as_directory)


# --------------------------------------------------------------------------- the embed stage


@pytest.fixture(scope="module")
def teacher():
    from pipeline.embed.teacher import load_teacher

    return load_teacher("bundled")


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under root: file -> bytes, directory -> None."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


# Equal thirds: a small dataset still fills every split (the stage refuses an empty one).
SPLITS = ["embed.splits.train=0.34", "embed.splits.val=0.33", "embed.splits.test=0.33"]


def check_stage(base: Path, case: dict, capsys, monkeypatch) -> None:
    folder, scratch, out = base / "data", base / "tmp", base / "shards"
    folder.mkdir()
    scratch.mkdir()
    data = folder / case["name"]
    data.write_bytes(case["bytes"])
    fake_shards(out, dim=8, rows=(6, 2, 2))  # a previous run's output, which a failed run must keep
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = listing(base)
    opts = case["options"]
    args = [
        f"embed.dataset={data}",
        "embed.group_field=null",
        f"embed.out_dir={out}",
        "embed.cache_dir=",
        "run.allow_external_paths=true",
        "run.tracking=disabled",
        *SPLITS,
        "embed.id_field=null" if opts["id_field"] is None else f"embed.id_field='{opts['id_field']}'",
        f"embed.empty_text={'skip' if opts['skip_empty'] else 'fail'}",
    ]
    if opts.get("delimiter"):
        args.append(f"embed.delimiter='{opts['delimiter']}'")
    capsys.readouterr()
    code = embed.main(args)
    err = capsys.readouterr().err
    event(f"exit {code}")
    assert code in (0, 1, 2), f"{case['mutations']}: exit {code}: {err}"
    if code:
        assert err.startswith(("[embed] error: ", "[embed] config error: ")), f"{case['mutations']}: {err}"
        assert err.count("[embed]") == 1, err
        assert "Traceback" not in err, err
        assert str(data) in err, f"{case['mutations']}: the message does not name {data}: {err}"
        assert listing(base) == before, f"{case['mutations']}: files changed or left behind after: {err}"
        return
    assert data.read_bytes() == case["bytes"]
    for split in ("train", "val", "test"):
        shard = open_split(out, split)
        assert len(shard.ids) > 0
    assert not list(scratch.iterdir()), list(scratch.iterdir())
    after = {k: v for k, v in listing(base).items() if not k.startswith("shards")}
    assert after == {k: v for k, v in before.items() if not k.startswith("shards")}


STAGE_EXAMPLES = 25  # ~7 s on 2 cores: a stage run each (the default suite keeps its 10 minutes)
SLOW_STAGE_EXAMPLES = 400


@settings(max_examples=STAGE_EXAMPLES, derandomize=True, **COMMON)
@given(case=dataset_files(min_rows=12, max_rows=16))
def test_embed_stage_on_malformed_files(tmp_path, capsys, monkeypatch, teacher, case):
    monkeypatch.setattr(embed, "load_teacher", lambda *a, **kw: teacher)
    check_stage(Path(tempfile.mkdtemp(dir=tmp_path)), case, capsys, monkeypatch)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("FUZZ_READERS_STAGE_EXAMPLES", "0")) or SLOW_STAGE_EXAMPLES,
    derandomize=False,
    database=None,
    **COMMON,
)
@given(case=dataset_files(min_rows=12, max_rows=16))
def test_embed_stage_on_malformed_files_many(tmp_path, capsys, monkeypatch, teacher, case):
    monkeypatch.setattr(embed, "load_teacher", lambda *a, **kw: teacher)
    check_stage(Path(tempfile.mkdtemp(dir=tmp_path)), case, capsys, monkeypatch)
