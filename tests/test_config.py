import json

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.core.config import (
    CONF_DIR,
    PARAMS_FILE,
    Config,
    DataFormat,
    EmptyText,
    FaultKind,
    Precision,
    ShardDtype,
    SplitKey,
    Tracking,
    compose_raw,
    default_values,
    describe,
    flatten,
    load_config,
)
from pipeline.core.config.param import parameters
from pipeline.core.errors import ConfigError

pytestmark = pytest.mark.unit

ABSENT = "<absent>"


def leaves(d, prefix=""):
    """{"train.scaler.init_scale": 1024.0, "embed.splits.val": 0.1, ...}"""
    out = {}
    for k, v in d.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def differing(a, b):
    """Leaves of `a` and `b` that are not the same value of the same type (1 == 1.0 == True, yet a
    YAML that writes 1 where the schema says 1.0 differs), with both values."""
    la, lb = leaves(a), leaves(b)
    return [
        f"{k}: {la.get(k, ABSENT)!r} != {lb.get(k, ABSENT)!r}"
        for k in sorted(la.keys() | lb.keys())
        if k not in la or k not in lb or type(la[k]) is not type(lb[k]) or la[k] != lb[k]
    ]


def as_plain(cfg):
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def test_each_default_has_one_home_conf_config_yaml_and_params_yaml_is_its_composition():
    # The schema declares types, ranges and meanings only: every value comes from conf/config.yaml
    # (DVC composes params.yaml from it, in its own process, without the schema). conf/ must write
    # every parameter the schema declares, each as the schema types it (1 where the schema says 1.0
    # differs), and params.yaml must be what that composition gives with the default preset: what
    # `dvc exp run` would write is what `dvc repro` reads.
    schema = leaves(OmegaConf.to_container(OmegaConf.structured(Config)))
    assert {k: v for k, v in schema.items() if v != "???"} == {}, "the schema holds a default"
    assert set(schema) == {p.key for p in parameters(Config)}
    conf = as_plain(compose_raw(["preset=default"])[0])  # as Hydra composes it: nothing filled in
    typed = as_plain(load_config(["preset=default"]))
    params = as_plain(OmegaConf.load(PARAMS_FILE))
    written = {"embed.splits" if k.startswith("embed.splits.") else k for k in leaves(conf)}
    assert written == {p.key for p in parameters(Config)}
    assert not differing(conf, typed), (
        "conf/ with preset=default writes a value unlike the schema's type:\n" + "\n".join(differing(conf, typed))
    )
    assert not differing(params, conf), "params.yaml differs from conf/ with preset=default:\n" + "\n".join(
        differing(params, conf)
    )
    assert not differing(as_plain(load_config([])), as_plain(load_config(["preset=default"])))
    assert not differing(as_plain(default_values()), typed)


def test_every_parameter_says_what_it_means():
    assert [p.key for p in parameters(Config) if not p.doc.strip()] == []


def test_a_key_a_params_file_lacks_takes_its_default_from_conf(tmp_path):
    partial = yaml.safe_load(PARAMS_FILE.read_text())
    del partial["train"]["lr"], partial["report"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(partial))
    cfg = load_config([], params_file=tmp_path / "params.yaml")
    assert cfg.train.lr == 0.003 and not differing(as_plain(cfg.report), as_plain(default_values().report))


def test_help_shows_each_parameters_default_type_range_and_meaning():
    text = describe("embed.out_dir, train")
    lines = text.splitlines()
    assert "  train.lr = 0.003  (float; a finite number > 0)" in lines
    assert lines[lines.index("  train.lr = 0.003  (float; a finite number > 0)") + 1] == "      peak learning rate"
    assert "  train.precision = auto  (one of auto, fp32, tf32, bf16, fp16)" in lines
    assert "  train.grad_warning = 5.0  (float; 0 < grad_warning < train.grad_critical (10.0))" in lines
    assert "  embed.out_dir = data/shards  (str; a path (not empty, no NUL character))" in lines
    assert "embed.dataset" not in text
    assert "train.scaler.init_scale = 1024.0" in text and "model." not in text


def test_differing_names_each_leaf_that_differs():
    a = {"train": {"lr": 0.003, "epochs": 12, "scaler": {"init_scale": 1024.0}}, "run": {"seed": 0}}
    b = {"train": {"lr": 0.003, "epochs": 12.0, "scaler": {"init_scale": 2048.0}}, "run": {}}
    assert differing(a, b) == [
        "run.seed: 0 != '<absent>'",
        "train.epochs: 12 != 12.0",
        "train.scaler.init_scale: 1024.0 != 2048.0",
    ]


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml")))
def test_every_preset_composes_and_validates(preset):
    cfg = load_config([f"preset={preset}"])
    assert cfg.run.preset == preset


def test_overrides_apply_and_are_typed():
    cfg = load_config(["train.lr=0.01", "model.lattice_depth=4"])
    assert cfg.train.lr == 0.01 and cfg.model.lattice_depth == 4
    assert load_config(["preset=smoke", "train.epochs=1"]).train.epochs == 1


@pytest.mark.parametrize(
    "override, named",
    [
        ("train.lr=abc", "train.lr"),  # wrong type
        ("train.lr=0", "train.lr"),  # impossible value
        ("train.foo=1", "train.foo"),  # unknown key (Hydra refuses to add it)
        ("+train.foo=1", "train.foo"),  # unknown key (schema refuses it)
        ("model.lattice_width=0", "model.lattice_width"),
        ("model.min_forward=0", "model.min_forward"),
        ("embed.splits.val=0.3", "embed.splits"),  # fractions not summing to 1
        ("embed.format=xml", "embed.format"),
        ("train.batch_size=-4", "train.batch_size"),
    ],
)
def test_bad_values_stop_with_the_key_named(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config([override])


def test_unknown_key_in_params_file_is_named(tmp_path):
    bad = yaml.safe_load(PARAMS_FILE.read_text())
    bad["model"]["lattice_widht"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"model\.lattice_widht"):
        load_config([], params_file=tmp_path / "params.yaml")


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["preset=smok"],
            "preset=smok: there is no conf/preset/smok.yaml (did you mean preset=smoke?); expected one of: ",
        ),
        (["fault=nan_los"], "fault=nan_los: there is no conf/fault/nan_los.yaml (did you mean fault=nan_loss?)"),
        (
            ["fault=nan"],
            "fault=nan: there is no conf/fault/nan.yaml (did you mean fault=nan_loss?); expected one of: "
            "inf_grad, leak, loss_spike, lr_jump, lr_spike, nan_loss, none, sync_bound",
        ),
        (
            ["embed.delimiter=;"],
            "cannot parse the override 'embed.delimiter=;': Hydra reads the value as an expression",
        ),
        (["train.lr=[1"], "cannot parse the override 'train.lr=[1'"),
        (["embed.splits.val=0", "embed.splits.train=0.9"], "'embed.splits.val' = 0: expected > 0"),
        (["embed.device=gpu"], "'embed.device' = 'gpu': expected auto, cpu, cuda or cuda:N"),
        (["embed.delimiter=ab"], "'embed.delimiter' = 'ab': expected one character"),
    ],
)
def test_config_mistakes_name_what_to_write_instead(overrides, fragment):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides)
    assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_an_unknown_key_under_a_mapping_is_named_with_the_keys_conf_gives_it():
    # The schema holds no values, so a mapping's keys (embed.splits) come from conf/config.yaml.
    with pytest.raises(ConfigError) as exc:
        load_config(["embed.splits.extra=0.1"])
    assert str(exc.value).endswith("expected one of the keys of 'embed.splits': test, train, val"), str(exc.value)
    assert str(exc.value).startswith("unknown key 'embed.splits.extra'")


def test_a_quoted_delimiter_and_an_empty_id_field_are_accepted():
    cfg = load_config(["embed.delimiter=';'", "embed.id_field="])
    assert cfg.embed.delimiter == ";" and cfg.embed.id_field == ""


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("run:\n  preset: default\n embed: [\n", "not valid YAML at line 3, column 2"),
        ("- a list\n", "holds a list, expected a mapping of sections"),
        ("run: 5\n", "section 'run' is 5, expected a mapping of its keys"),
    ],
)
def test_a_broken_params_file_is_named_with_its_line(tmp_path, text, fragment):
    params = tmp_path / "params.yaml"
    params.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config([], params_file=params)
    assert str(exc.value).startswith(f"{params}: ") and fragment in str(exc.value), str(exc.value)


def test_a_cuda_device_this_machine_lacks_is_a_config_error():
    import torch

    from pipeline.core.distributed import available_device

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"parameter 'embed.device' = 'cuda', but this machine has no CUDA device"):
        available_device("embed.device", "cuda")
    assert available_device("embed.device", "auto") == "cpu"


OVERRIDE_KEYS = [
    "train.lr",
    "embed.splits",
    "embed",
    "train",
    "preset",
    "fault",
    "run.seed",
    "model.lattice_width",
    "embed.splits.val",
    "+x",
    "~train.lr",
    "train.scaler",
    "embed.delimiter",
    "embed.id_field",
    "hydra.run",
    "defaults",
    "embed.splits.extra",
    "run",
    "+embed.splits.x",
    "train.device",
    "embed.dataset",
]
OVERRIDE_VALUES = [
    "null",
    "[1,2]",
    "{a: 1}",
    "nan",
    "inf",
    "1e999",
    "true",
    "''",
    "${x}",
    "${oc.env:HOME}",
    "abc",
    "-1",
    "0x10",
    "1_000",
    "[",
    "]]",
    "{",
    "'a",
    '"',
    "\\",
    "=",
    "a=b",
    "${train.lr}",
    "${oc.decode:'[1]'}",
    "{train: 0.5, val: 0.5}",
    "smoke",
    "nan_loss",
    "",
]


@pytest.mark.parametrize(
    "examples",
    # The unit tier's 50 fixed (derandomized) examples, ~0.06 s each; the slow run's 1500 as four
    # tests, so that parallel workers share them.
    [pytest.param(50, id="default")] + [pytest.param(375, id=f"many-{i}", marks=pytest.mark.slow) for i in range(4)],
)
def test_any_override_loads_or_is_one_config_error(examples):
    """Whatever a command line holds, load_config returns a config or raises ConfigError: never a
    Hydra or OmegaConf exception from its internals (a traceback for the user)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=examples == 50,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(OVERRIDE_KEYS), st.one_of(st.sampled_from(OVERRIDE_VALUES), st.text(max_size=10))
            ),
            min_size=1,
            max_size=3,
        )
    )
    def check(pairs):
        try:
            load_config([f"{k}={v}" for k, v in pairs])
        except ConfigError:
            pass

    check()


# ---------------------------------------------------------------- values checked once, by the schema


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.spike_window=5",
            "parameter 'train.spike_window' = 5: expected an integer >= 10 (the mean and std of "
            "fewer losses flag ordinary noise as spikes)",
        ),
        ("train.spike_k=0", "parameter 'train.spike_k' = 0.0: expected > 0"),
        (
            "train.grad_warning=20",
            "parameter 'train.grad_warning' = 20.0: expected 0 < grad_warning < train.grad_critical (10.0)",
        ),
        ("report.warmup_steps=-1", "parameter 'report.warmup_steps' = -1: expected >= 0"),
        ("report.memory_alpha=1.5", "parameter 'report.memory_alpha' = 1.5: expected in (0, 1)"),
        ("report.memory_alpha=0", "parameter 'report.memory_alpha' = 0.0: expected in (0, 1)"),
        ("report.step_time_max_ratio=0", "parameter 'report.step_time_max_ratio' = 0.0: expected > 0"),
        (
            "report.grad_healthy_min=5",
            "parameter 'report.grad_healthy_min' = 5.0: expected 0 < grad_healthy_min < train.grad_warning (5.0)",
        ),
        (
            "report.grad_max_critical_fraction=1.5",
            "parameter 'report.grad_max_critical_fraction' = 1.5: expected a fraction in [0, 1]",
        ),
        (
            "report.nonfinite_warn_fraction=-0.1",
            "parameter 'report.nonfinite_warn_fraction' = -0.1: expected a fraction in [0, 1]",
        ),
        (
            "report.spike_fail_factor=1.0",
            "parameter 'report.spike_fail_factor' = 1.0: expected > 1 (a spike this many "
            "times the trailing mean loss fails)",
        ),
        (
            "report.spike_fail_factor=0.5",
            "parameter 'report.spike_fail_factor' = 0.5: expected > 1 (a spike this many "
            "times the trailing mean loss fails)",
        ),
        ("report.scaler_min_scale=0", "parameter 'report.scaler_min_scale' = 0.0: expected > 0"),
        ("report.scaler_min_scale=-1", "parameter 'report.scaler_min_scale' = -1.0: expected > 0"),
        (
            "report.scaler_max_backoff_fraction=-0.01",
            "parameter 'report.scaler_max_backoff_fraction' = -0.01: expected a fraction in [0, 1]",
        ),
        (
            "report.scaler_max_backoff_fraction=1.5",
            "parameter 'report.scaler_max_backoff_fraction' = 1.5: expected a fraction in [0, 1]",
        ),
        ("report.learning_min_drop=-0.1", "parameter 'report.learning_min_drop' = -0.1: expected a share in [0, 1)"),
        ("report.learning_min_drop=1", "parameter 'report.learning_min_drop' = 1.0: expected a share in [0, 1)"),
    ],
)
def test_the_reports_thresholds_are_refused_at_load(override, message):
    # Once refused only by the report, after training had run to the end (and by a diverged
    # run's report): now by the schema, when any stage loads its config.
    with pytest.raises(ConfigError) as exc:
        load_config([override])
    assert str(exc.value) == message


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.spike_window=10"],
        ["report.spike_fail_factor=1.01"],
        ["report.scaler_min_scale=1e-9"],
        [
            "report.scaler_max_backoff_fraction=0",
            "report.grad_max_critical_fraction=1",
            "report.nonfinite_warn_fraction=0",
        ],
        ["report.warmup_steps=0", "report.learning_min_drop=0"],
    ],
)
def test_the_edges_of_the_reports_ranges_are_accepted(overrides):
    load_config(overrides)


def test_a_short_spike_window_stops_the_train_stage_before_any_work(tmp_path, capsys, monkeypatch):
    from stages import train

    monkeypatch.setattr(train, "run", lambda cfg: pytest.fail("the stage's work started"))
    code = train.main(
        [
            "train.spike_window=5",
            "run.tracking=disabled",
            "run.allow_external_paths=true",
            f"train.out_dir={tmp_path / 'models'}",
            f"train.checkpoint_dir={tmp_path / 'ckpt'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "parameter 'train.spike_window' = 5: expected an integer >= 10" in err, err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- choices


CHOICES = {
    "run.tracking": Tracking,
    "embed.format": DataFormat,
    "embed.split_key": SplitKey,
    "embed.empty_text": EmptyText,
    "embed.dtype": ShardDtype,
    "train.precision": Precision,
    "fault.kind": FaultKind,
}


@pytest.mark.parametrize("key", CHOICES)
def test_every_choice_is_written_as_before_and_reads_as_its_string(key):
    choices = CHOICES[key]
    for member in choices:
        cfg = load_config([f"{key}={member.name}"])
        value = OmegaConf.select(cfg, key)
        # The YAML value is the member's name, and the member is that string wherever code looks.
        assert value is member and value == member.name and f"{value}" == str(value) == member.name
        assert flatten(cfg)[key] == member.name and type(flatten(cfg)[key]) is str  # MLflow params
        assert json.dumps(value) == f'"{member.name}"'


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.precision=f16",
            "parameter 'train.precision' = 'f16': expected one of auto, fp32, tf32, bf16, fp16 "
            "(did you mean train.precision=fp16?)",
        ),
        ("embed.format=xml", "parameter 'embed.format' = 'xml': expected one of auto, csv, tsv, jsonl, json, parquet"),
        (
            "fault.kind=boom",
            "parameter 'fault.kind' = 'boom': expected one of none, nan_loss, inf_grad, loss_spike, lr_spike, "
            "lr_jump, leak, sync_bound",
        ),
        ("run.tracking=null", "parameter 'run.tracking' = None: expected one of required, optional, disabled"),
        ("embed.dtype=16", "parameter 'embed.dtype' = 16: expected one of float32, float16"),
        ("embed.split_key=[pair]", "parameter 'embed.split_key' = ['pair']: expected one of pair, input, target"),
        (
            "embed.empty_text=Skip",
            "parameter 'embed.empty_text' = 'Skip': expected one of fail, skip (did you mean embed.empty_text=skip?)",
        ),
    ],
)
def test_a_bad_choice_names_the_key_the_value_and_the_choices(override, message):
    with pytest.raises(ConfigError) as exc:
        load_config([override])
    assert str(exc.value) == message


def test_choices_print_as_the_yaml_writes_them():
    cfg = load_config(["preset=fp16_fixed", "fault=nan_loss"])
    text = OmegaConf.to_yaml(cfg)
    assert "  precision: fp16\n" in text and "  kind: nan_loss\n" in text and "  tracking: required\n" in text


@pytest.mark.parametrize(
    "overrides",
    [["preset=default"], ["preset=fp16_unstable", "fault=loss_spike", "embed.format=csv", "run.tracking=optional"]],
)
def test_choices_leave_the_run_digests_as_their_strings_give(overrides):
    # settings_digest (telemetry/train_perf.json) and fingerprint (resumable checkpoints) hash
    # config values: a choice must hash as its string did, or every recorded digest goes stale.
    from pipeline.train.perf_files import settings_digest
    from pipeline.train.resume_state import fingerprint

    cfg = load_config(overrides)
    plain = OmegaConf.create(as_plain(cfg))  # the same values, choices as plain strings
    assert settings_digest(cfg, "d") == settings_digest(plain, "d")
    assert fingerprint(cfg, "d") == fingerprint(plain, "d") and fingerprint(cfg, "d", 2) == fingerprint(plain, "d", 2)
