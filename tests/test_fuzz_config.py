"""Property-based: an adversarial value for any parameter or environment variable is either accepted
(and then valid) or refused in one message that names it; never another exception.

- Overrides `key=value` over every key of the schema (and embed.splits' fractions), with values a
  careless or hostile user writes: negative, huge, NaN, inf, empty, long, non-ASCII text, bytes that
  are not UTF-8 (as Python gets them from argv, by surrogateescape), lists, mappings, nulls,
  interpolations. load_config returns a config that passes validation again, or raises
  ConfigError whose message names the key.
- Values for every environment variable the project reads (pipeline/core/environment.py), for
  MLFLOW_TRACKING_URI and for some of MLflow's own: check_environment raises ConfigError naming the
  variable or passes; the store check and the MLflow check return a line naming it, or None.

The default (unit) tier runs a fixed, derandomized set of examples; `-m slow` runs thirty times as many
(FUZZ_CONFIG_EXAMPLES sets that number for a longer local run) and every listed value on every key,
split into one test per key or per share of the keys so that parallel workers share them.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.config import Config, load_config, validate
from pipeline.core.config.param import parameters
from pipeline.core.environment import VARIABLES, check_environment
from pipeline.core.errors import ConfigError
from pipeline.tracking.store_check import mlflow_env_problem, store_problem

pytestmark = pytest.mark.unit

KEYS = [p.key for p in parameters(Config) if p.key != "embed.splits"] + [
    "embed.splits",
    "embed.splits.train",
    "embed.splits.test",
]
NOT_UTF8 = [b.decode("utf-8", "surrogateescape") for b in (b"caf\xe9", b"\xff", b"\xc3", b"a\x80b")]
VALUES = [
    "-1",
    "-5",
    "0",
    "1",
    "0.5",
    "1e23",
    "-1e23",
    "1e309",
    "nan",
    "inf",
    "-inf",
    "4294967296",
    "9" * 40,
    "-9223372036854775809",
    "",
    "''",
    "' '",
    "null",
    "true",
    "[]",
    "[1, 2]",
    "{}",
    "{a: 1}",
    "x" * 500,
    "-embed",
    "café",
    "日本語",
    "'a\\nb'",
    "'..'",
    "'/'",
    "${train.lr}",
    "${oc.env:HOME}",
    "${oc.env:NO_SUCH_VARIABLE_HERE}",
    *NOT_UTF8,
]
# A load composes with Hydra: ~0.1 s each idle, ~0.3 s on 2 shared cores under load. The unit tier
# draws a fixed 20 (a sample, as test_config.py's override fuzz), the slow tier 600.
EXAMPLES = 20
SLOW_EXAMPLES = int(os.environ.get("FUZZ_CONFIG_EXAMPLES", "0")) or 600
SHARDS = 4  # the slow runs' examples split over as many tests, each drawing from every SHARDS-th key
COMMON = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))

values = st.one_of(st.sampled_from(VALUES), st.text(max_size=12), st.integers().map(str), st.floats().map(repr))


def names_it(message: str, key: str) -> bool:
    """The message names the key, or the key it is part of / a part of it (embed.splits.val for
    embed.splits), or, for a value Hydra cannot parse, the override as written."""
    parent = key.rsplit(".", 1)[0]
    return key in message or (parent.count(".") >= 1 and parent in message)


def check_override(key: str, value: str) -> None:
    override = f"{key}={value}"
    try:
        cfg = load_config([override])
    except ConfigError as e:
        assert names_it(str(e), key), (override, str(e))
        assert "\n" not in str(e), str(e)  # one line
        return
    validate(cfg)  # what was accepted holds: every range, rule and path again


@settings(max_examples=EXAMPLES, derandomize=True, **COMMON)
@given(key=st.sampled_from(KEYS), value=values)
def test_any_value_for_any_key_loads_valid_or_is_refused_naming_the_key(key, value):
    check_override(key, value)


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_any_value_for_any_key_loads_valid_or_is_refused_naming_the_key_many(shard):
    @settings(max_examples=SLOW_EXAMPLES // SHARDS, derandomize=False, **COMMON)
    @given(key=st.sampled_from(KEYS[shard::SHARDS]), value=values)
    def check(key, value):
        check_override(key, value)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_every_key_is_tried_with_every_listed_value(key):
    """The listed values, each on each key: the classes the random draws may miss."""
    for value in VALUES[:22] + NOT_UTF8[:1]:
        check_override(key, value)


# ---------------------------------------------------------------------------- environment variables

MLFLOW_VARIABLES = ["MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_ALLOW_FILE_STORE"]
URIS = [
    "file:///etc",
    "/etc",
    "/",
    "file:///",
    "sqlite:///etc/passwd",
    "sqlite:///",
    "sqlite://",
    "sqlite:////etc",
    "sqlite:///no/such/dir/m.db",
    "http://[::1",
    "mlfow://typo",
    "postgresql+psycopg2://u@h/db",
    "C:\\mlruns",
    "file://host/x",
    "file:///%00",
    "sqlite:///%2e%2e",
]
env_values = st.one_of(st.sampled_from(VALUES + URIS), st.text(max_size=12).filter(lambda v: "\0" not in v))


def check_variable(name: str, value: str) -> None:
    try:
        check_environment({name: value})
    except ConfigError as e:
        assert name in str(e), (name, value, str(e))
    if name == "MLFLOW_TRACKING_URI":
        problem = store_problem(value)
        assert problem is None or isinstance(problem, str)
    elif name.startswith("MLFLOW_"):
        with mock.patch.dict(os.environ, {name: value}):
            problem = mlflow_env_problem()
        assert problem is None or problem.startswith(f"{name} = "), problem


@settings(max_examples=EXAMPLES, derandomize=True, **COMMON)
@given(name=st.sampled_from(sorted(VARIABLES) + MLFLOW_VARIABLES), value=env_values)
def test_any_value_of_a_variable_the_project_reads_passes_or_is_named(name, value):
    check_variable(name, value)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, derandomize=False, **COMMON)
@given(name=st.sampled_from(sorted(VARIABLES) + MLFLOW_VARIABLES), value=env_values)
def test_any_value_of_a_variable_the_project_reads_passes_or_is_named_many(name, value):
    check_variable(name, value)
