"""Stage entry points refuse bad input before any work, say why, and write nothing."""

import pytest

from stages import embed, evaluate, report, train

pytestmark = pytest.mark.unit


def run_embed(tmp_path, capsys, content: str, name="pairs.csv", *extra):
    data = tmp_path / name
    data.write_text(content)
    out = tmp_path / "shards"
    code = embed.main(
        [
            f"embed.dataset={data}",
            "embed.group_field=null",
            f"embed.out_dir={out}",
            "run.allow_external_paths=true",
            *extra,
        ]
    )
    return code, capsys.readouterr().err, out


def test_missing_field_names_file_and_field(tmp_path, capsys):
    code, err, out = run_embed(tmp_path, capsys, "id,question,reply\n1,What?,This.\n")
    assert code == 1 and "pairs.csv" in err and "'answer'" in err and "reply" in err, err
    assert not out.exists()


def test_empty_dataset_is_refused(tmp_path, capsys):
    code, err, out = run_embed(tmp_path, capsys, "id,question,answer\n")
    assert code == 1 and "pairs.csv" in err and "empty" in err.lower()
    assert not out.exists()


def test_wrong_parameter_type_names_the_key(tmp_path, capsys):
    code, err, out = run_embed(tmp_path, capsys, "id,question,answer\n1,a,b\n", "pairs.csv", "embed.batch_size=many")
    assert code == 2 and "embed.batch_size" in err
    assert not out.exists()


@pytest.mark.parametrize("stage", [embed, train, evaluate, report])
def test_help_explains_the_stage(stage, capsys):
    assert stage.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: python -m stages." in text and "params.yaml" in text and "preset=" in text


def test_train_without_shards_says_to_run_embed(tmp_path, capsys):
    assert train.main([f"embed.out_dir={tmp_path / 'none'}", "run.allow_external_paths=true"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"[train] error: {tmp_path / 'none' / 'manifest.json'}: shard manifest not found; run the embed stage to "
        "(re)create the shards"
    )
