"""A dataset may be a directory or a glob of files; empty texts can be skipped and counted."""

import pytest

from pipeline.core.errors import DatasetError
from pipeline.data.readers.dataset import read_dataset, read_pairs
from pipeline.data.readers.files import dataset_files

pytestmark = pytest.mark.unit


def write(path, *ids):
    path.write_text("id,question,answer\n" + "".join(f"{i},What is {i}?,It is {i}.\n" for i in ids))
    return path


def test_directory_reads_every_dataset_file_in_name_order(tmp_path):
    write(tmp_path / "b.csv", "3", "4")
    write(tmp_path / "a.csv", "1", "2")
    (tmp_path / "notes.txt").write_text("ignored: not a dataset extension")
    (tmp_path / "c.jsonl").write_text('{"id": "5", "question": "Q5", "answer": "A5"}\n')
    df = read_dataset(tmp_path, "question", "answer", "id")
    assert df["id"].tolist() == ["1", "2", "3", "4", "5"]
    assert [f.name for f in df.attrs["files"]] == ["a.csv", "b.csv", "c.jsonl"]
    assert df.attrs["files_skipped"] == [(tmp_path / "notes.txt", "unsupported extension '.txt'")]


def test_glob_pattern_and_its_errors(tmp_path):
    write(tmp_path / "part-1.csv", "1")
    write(tmp_path / "part-2.csv", "2")
    write(tmp_path / "other.csv", "9")
    assert read_dataset(str(tmp_path / "part-*.csv"), "question", "answer", "id")["id"].tolist() == ["1", "2"]
    with pytest.raises(DatasetError, match="no file matches"):
        dataset_files(str(tmp_path / "nothing-*.csv"))
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(DatasetError, match=r"holds no dataset file \(it is empty\)"):
        dataset_files(empty)


def test_duplicate_id_across_files_names_both_files(tmp_path):
    write(tmp_path / "a.csv", "1", "2")
    write(tmp_path / "b.csv", "2")
    with pytest.raises(DatasetError, match=r"'2'.*a\.csv.*b\.csv"):
        read_dataset(tmp_path, "question", "answer", "id")


def test_empty_texts_fail_by_default_and_are_skipped_and_counted_on_request(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"id": "1", "q": "Q1", "a": "A1"}\n{"id": "2", "q": "", "a": "A2"}\n'
        '{"id": "3", "q": "Q3", "a": null}\n{"id": "4", "q": "Q4", "a": "A4"}\n'
    )
    with pytest.raises(DatasetError, match=r"d\.jsonl.*line 2.*'q'.*empty.*empty_text=skip"):
        read_pairs(path, "q", "a", "id")
    df = read_pairs(path, "q", "a", "id", skip_empty=True)
    assert df["id"].tolist() == ["1", "4"] and df.attrs["rows_skipped_empty"] == 2


def test_duplicate_pairs_are_counted_and_dropped_or_kept_by_parameter(tmp_path):
    from pipeline.core.config import load_config
    from pipeline.embed.embedding import prepare_pairs

    data = tmp_path / "d.csv"
    # 40 distinct pairs, each 4 times: enough rows left after dropping for every split to hold some.
    data.write_text("question,answer\n" + "".join(f"Q{i % 40},A{i % 40}\n" for i in range(160)))
    base = [
        "preset=smoke",
        f"embed.dataset={data}",
        "embed.group_field=null",
        "embed.id_field=null",
        "embed.max_rows=0",
        "run.allow_external_paths=true",
    ]
    cfg = load_config(base)
    dropped = prepare_pairs(cfg.embed, cfg.run.allow_external_paths)
    assert dropped.stats["duplicate_pairs"] == 120 and dropped.stats["duplicates_dropped"] == 120
    assert len(dropped.frame) == 40
    for id_field in ("null", "''"):  # "" is no id column too
        cfg = load_config([*base, "embed.drop_duplicates=false", f"embed.id_field={id_field}"])
        kept = prepare_pairs(cfg.embed, cfg.run.allow_external_paths)
        assert kept.stats["duplicate_pairs"] == 120 and kept.stats["duplicates_dropped"] == 0
        assert len(kept.frame) == 160 and kept.frame["id"].is_unique
