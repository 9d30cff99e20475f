"""Every value checked, every message true: the config's values, params.yaml itself, the overrides'
text, and the environment variables the project and MLflow read. Each case ends in one ConfigError
(or tracking refusal) that names the key, file or variable and says what was expected."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
import torch
import yaml

from pipeline.core.config import PARAMS_FILE, load_config
from pipeline.core.config.yaml_file import MAX_BYTES, MAX_VALUES
from pipeline.core.environment import check_environment
from pipeline.core.errors import ConfigError, TrackingUnavailable
from pipeline.core.paths import REPO_ROOT
from pipeline.tracking import store as tracking
from pipeline.tracking.store_check import mlflow_env_problem, store_problem
from pipeline.train.device import slow_precision_warning

pytestmark = pytest.mark.unit

NAME = "a name of letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters"
SEED = "an integer in [0, 4294967295] (what numpy's and torch's random generators accept)"


def refused(overrides, params_file=None) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides, params_file=params_file)
    return str(exc.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.seed=-1", f"parameter 'run.seed' = -1: expected {SEED}"),
        ("run.seed=1e23", f"parameter 'run.seed' = 1e+23: expected {SEED}"),
        ("evaluate.bootstrap_seed=4294967296", f"parameter 'evaluate.bootstrap_seed' = 4294967296: expected {SEED}"),
        ("run.experiment=", f"parameter 'run.experiment' is empty: expected {NAME}"),
        ("run.experiment=-embed", f"parameter 'run.experiment' = '-embed': expected {NAME}"),
        ("run.preset='a b'", f"parameter 'run.preset' = 'a b': expected {NAME}"),
        ("evaluate.samples=-5", "parameter 'evaluate.samples' = -5: expected >= 0 (0 = none)"),
        ("embed.dataset=", "parameter 'embed.dataset' is empty: expected a path (not empty, no NUL character)"),
        ("train.out_dir=''", "parameter 'train.out_dir' is empty: expected a path (not empty, no NUL character)"),
        ("embed.input_field=", "parameter 'embed.input_field' is empty: expected a column name or dotted JSON path"),
        ("embed.teacher=' '", "parameter 'embed.teacher' = ' ': expected a non-empty name or path, one line"),
        ("fault.module='a.b'", "parameter 'fault.module' = 'a.b': expected a module name"),
        ("train.weight_decay=inf", "parameter 'train.weight_decay' = inf: expected a finite number >= 0"),
        ("train.scaler.init_scale=nan", "parameter 'train.scaler.init_scale' = nan: expected a finite number > 0"),
        ("model.max_forward=-inf", "parameter 'model.max_forward' = -inf: expected a finite number > 0"),
        ("report.memory_min_growth_mb=-1", "parameter 'report.memory_min_growth_mb' = -1.0: expected >= 0"),
        ("train.warmup_steps=99999999999999999999", "parameter 'train.warmup_steps' = 99999999999999999999: expected"),
    ],
)
def test_a_value_outside_its_range_is_refused_naming_the_key(override, message):
    assert refused([override]).startswith(message), refused([override])


def test_a_long_value_is_named_shortened_not_echoed_whole():
    message = refused(["run.experiment=" + "x" * 500])
    assert message.startswith("parameter 'run.experiment' = 'xxx") and "(500 characters)" in message
    assert len(message) < 300 and message.endswith(NAME)


def test_the_defaults_and_every_preset_still_load():
    assert load_config([]).run.seed == 0
    assert load_config(["run.experiment=my-exp.v2_1", "evaluate.samples=0", "embed.cache_dir="]).evaluate.samples == 0


def test_a_non_utf8_byte_in_an_override_is_named_as_such_not_as_quoting():
    override = b"run.experiment=caf\xe9".decode("utf-8", "surrogateescape")  # as Python gets it from argv
    message = refused([override])
    assert message == (
        "the override 'run.experiment=caf\\xe9' (key 'run.experiment') is not UTF-8 text: byte 0xe9 at "
        "character 19; write its value in UTF-8 (the shell's or script's encoding)"
    )
    assert "quote" not in message


def test_an_empty_params_file_says_so_and_what_to_do(tmp_path):
    params = tmp_path / "params.yaml"
    for text in ("", "\n# nothing\n", "{}\n"):
        params.write_text(text)
        for overrides in ([], ["embed.dataset=x"]):
            message = refused(overrides, params)
            assert message.startswith(f"{params} is empty; expected the sections run, embed"), message
            assert "git checkout params.yaml" in message and "did you mean" not in message


def test_overriding_a_key_the_params_file_lacks_names_the_missing_section(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("run:\n  seed: 1\nembed: {}\n")
    message = refused(["embed.dataset=x"], params)
    assert message.startswith(f"{params}: cannot override 'embed.dataset': its section 'embed' is missing or empty")
    assert "git checkout params.yaml" in message and "preset=default" in message
    assert refused(["train.lr=0.1"], params).startswith(f"{params}: cannot override 'train.lr': its section 'train'")
    # A key no section has is still an unknown key, never offered itself as the nearest spelling.
    message = refused(["embed.foo=1"], params)
    assert message.startswith("unknown key 'embed.foo'; expected one of the keys of 'embed'"), message
    params.write_text("run:\n")
    assert refused([], params) == (
        f"{params}: section 'run' is empty, expected a mapping of its keys "
        "(allow_external_paths, experiment, preset, seed, sweep, tracking, ...)"
    )


def test_no_key_is_offered_as_its_own_spelling():
    from pipeline.core.config import unknown_key_message

    assert "did you mean" not in unknown_key_message("embed.dataset")
    assert "(did you mean 'train.batch_size'?)" in unknown_key_message("train.batchsize")


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_omegaconf_expands_it(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(alias_bomb())
    message = refused([], params)
    assert message.startswith(f"{params}: its anchors and aliases (&name / *name) expand to more than {MAX_VALUES:,}")
    # `fault=NAME` reads params.yaml only for its preset, through the same check (an odd file: the default).
    assert load_config(["fault=nan_loss"], params_file=params).run.preset == "default"


def test_a_recursive_alias_and_an_oversized_params_file_are_refused(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("run: &r\n  seed: *r\n")
    assert "anchors and aliases" in refused([], params)
    params.write_text("# " + "x" * MAX_BYTES + "\n" + PARAMS_FILE.read_text())
    message = refused([], params)
    assert message.startswith(f"{params}: {params.stat().st_size:,} bytes, more than a config file may hold"), message


def test_a_few_anchors_as_people_write_them_still_load(tmp_path):
    doc = yaml.safe_load(PARAMS_FILE.read_text())
    text = (
        yaml.safe_dump(doc)
        .replace("  lr: 0.003", "  lr: &lr 0.003")
        .replace("  weight_decay: 0.01", "  weight_decay: *lr")
    )
    (tmp_path / "params.yaml").write_text(text)
    assert load_config([], params_file=tmp_path / "params.yaml").train.weight_decay == 0.003


def test_a_non_utf8_params_file_is_named_with_its_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes(b"run:\n  experiment: caf\xe9\n")
    assert refused([], params) == f"{params}: not UTF-8 text (byte 0xe9 at line 2); save it as UTF-8"


# ------------------------------------------------------------------------------- the tracking store


@pytest.fixture
def files(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    with sqlite3.connect(tmp_path / "real.db") as db:
        db.execute("create table t (x)")
    (tmp_path / "empty").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine")
    (tmp_path / "store" / "0").mkdir(parents=True)
    (tmp_path / "store" / "0" / "meta.yaml").write_text("name: Default\n")
    return tmp_path


def test_a_directory_store_needs_mlflows_opt_in_and_then_must_be_a_store(files, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in ("file:///etc", "/etc", f"file://{files / 'empty'}"):
        assert "which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true" in store_problem(uri), uri
        assert "expected sqlite:///PATH" in store_problem(uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert store_problem("file:///etc").startswith("/etc is a directory that is neither empty nor an MLflow file store")
    assert store_problem(str(files / "runs")).startswith(f"{files / 'runs'} is a directory that is neither empty")
    assert store_problem(str(files / "data.csv")).startswith(f"{files / 'data.csv'} is a file")
    for ok in ("empty", "new", "store"):
        assert store_problem(str(files / ok)) is None, ok


def test_a_sqlite_uri_onto_a_file_that_is_no_database_is_refused_naming_it(files):
    assert store_problem(f"sqlite:///{files / 'data.csv'}").startswith(
        f"{files / 'data.csv'} is not a SQLite database (it does not start with SQLite's header)"
    )
    assert store_problem(f"sqlite:///{files}").startswith(f"{files} is a directory; expected sqlite:///PATH")
    for ok in ("real.db", "new.db"):
        assert store_problem(f"sqlite:///{files / ok}") is None, ok
    (files / "empty.db").write_bytes(b"")
    assert store_problem(f"sqlite:///{files / 'empty.db'}") is None


def test_a_bad_store_or_mlflow_variable_stops_a_tracked_stage_naming_the_variable(files, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{files / 'data.csv'}")
    tracking.session().enabled = True
    with pytest.raises(TrackingUnavailable, match=r"^MLFLOW_TRACKING_URI = sqlite:///.*data\.csv: .* is not a SQLite"):
        tracking.configure("required")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{files / 'real.db'}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "soon")
    assert mlflow_env_problem() == "MLFLOW_HTTP_REQUEST_TIMEOUT = 'soon': expected an integer (MLflow reads it)"
    with pytest.raises(TrackingUnavailable, match=r"^MLFLOW_HTTP_REQUEST_TIMEOUT = 'soon': expected an integer"):
        tracking.configure("required")
    tracking.configure("optional")  # goes on untracked, and says so
    assert not tracking.enabled()


# ---------------------------------------------------------------------- the project's own variables


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "environment variable RANK = 'abc': expected an integer >= 0"),
        ({"WORLD_SIZE": "0"}, "environment variable WORLD_SIZE = '0': expected an integer >= 1"),
        ({"RANK": "3", "WORLD_SIZE": "2"}, "environment variable RANK = 3 with WORLD_SIZE = 2: expected a rank below"),
        ({"OMP_NUM_THREADS": "lots"}, "environment variable OMP_NUM_THREADS = 'lots': expected an integer >= 1"),
        ({"MKL_NUM_THREADS": "-1"}, "environment variable MKL_NUM_THREADS = '-1': expected an integer >= 1"),
        ({"ENERGY_FLOW_RUNS_DIR": "/etc/passwd"}, "environment variable ENERGY_FLOW_RUNS_DIR = '/etc/passwd'"),
        ({"ENERGY_FLOW_ROOT": ""}, "environment variable ENERGY_FLOW_ROOT = '': expected a directory"),
    ],
)
def test_a_bad_environment_variable_is_one_line_naming_it(env, message):
    with pytest.raises(ConfigError) as exc:
        check_environment(env)
    assert str(exc.value).startswith(message), str(exc.value)


def test_good_environment_values_pass(tmp_path):
    check_environment({"RANK": "1", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "4", "ENERGY_FLOW_ROOT": str(REPO_ROOT)})
    check_environment({"ENERGY_FLOW_RUNS_DIR": str(tmp_path / "new")})


def test_a_bad_numerics_mode_stops_a_stage_at_its_start_in_one_line():
    code = "import sys; sys.argv = ['stages/train.py']; from stages import startup; startup.begin()"
    env = {"ENERGY_FLOW_NUMERICS": "fast", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "[train] config error: environment variable ENERGY_FLOW_NUMERICS='fast': expected one of portable, native; "
        "fix or unset it"
    )


def test_fp16_on_a_cpu_is_told_with_the_key_and_the_better_choices():
    warning = slow_precision_warning("fp16", torch.device("cpu"))
    assert (
        warning.startswith("train.precision=fp16 on a CPU") and "train.precision=fp32" in warning and "bf16" in warning
    )
    assert slow_precision_warning("fp32", torch.device("cpu")) is None
    assert slow_precision_warning("fp16", torch.device("cuda")) is None


def test_ctrl_c_while_the_config_loads_ends_in_one_line(monkeypatch, capsys):
    import stages._cli as cli
    from stages import evaluate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", interrupted)
    assert evaluate.main([]) == 130
    err = capsys.readouterr().err
    assert err == "[evaluate] stopped by SIGINT while reading its configuration: nothing was done\n", err


@pytest.mark.parametrize(
    "override", ["hydra.job.chdir=true", "hydra.run.dir=/tmp/x", "hydra/launcher=basic", "+hydra.verbose=true"]
)
def test_hydras_own_settings_are_refused_not_silently_ignored(override):
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert f"the override '{override}' sets Hydra's own setting" in str(e.value) and "Remove it" in str(e.value)


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///data/shards/mlflow.db",
        "sqlite:///models/x/runs.db",
        "sqlite:///metrics/mlflow.db",
        "file:./baselines/store",
    ],
)
def test_a_store_inside_a_folder_of_stage_outputs_is_refused(uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    folder = uri.split("///")[-1].split(":")[-1].lstrip("./").split("/")[0]
    said = store_problem(uri)
    assert said and "a folder of stage outputs that DVC deletes and replaces" in said, said
    assert f"is inside {folder}" in said
    assert store_problem(f"sqlite:///{REPO_ROOT / 'mlflow.db'}") is None


def test_an_interpolation_of_the_wrong_kind_names_its_key():
    # Found by tests/test_fuzz_config.py: OmegaConf names no key when an interpolation resolves
    # to a number for a mapping.
    with pytest.raises(ConfigError) as e:
        load_config(["embed.splits=${train.lr}"])
    assert str(e.value) == "parameter 'embed.splits' = '${train.lr}': expected a mapping"
