"""The environment variables the project's own code reads, each checked before a stage works.

A bad value is one line naming the variable, what it holds and what it may hold, not a ValueError
from an int() deep in a stage (RANK=abc) or a library's own warning (OMP_NUM_THREADS=lots). The
MLFLOW_* variables are MLflow's and are checked with the tracking store
(pipeline/tracking/store_check.py); ENERGY_FLOW_NUMERICS is checked where it is first read
(pipeline/core/numerics.py, before torch is imported).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator, Mapping

from pipeline.core.errors import ConfigError


def _integer(low: int) -> Callable[[str], bool]:
    def allows(v: str) -> bool:
        try:
            return int(v.strip()) >= low
        except ValueError:
            return False

    return allows


def _directory(v: str) -> bool:
    try:
        return v != "" and (not Path(v).exists() or Path(v).is_dir())
    except (OSError, ValueError):  # a name too long for the file system, a NUL
        return False


# name: (what it may hold, the test, who reads it)
VARIABLES: dict[str, tuple[str, Callable[[str], bool], str]] = {
    # torchrun sets these for each process it starts; a stage reads them to know its place.
    "WORLD_SIZE": ("an integer >= 1", _integer(1), "torchrun's process count"),
    "RANK": ("an integer >= 0", _integer(0), "this process's rank under torchrun"),
    "LOCAL_RANK": ("an integer >= 0", _integer(0), "this process's rank on its machine"),
    "LOCAL_WORLD_SIZE": ("an integer >= 1", _integer(1), "torchrun's process count on this machine"),
    # The portable numerics fix the intra-op thread count from it (pipeline/core/numerics.py).
    "OMP_NUM_THREADS": ("an integer >= 1", _integer(1), "the CPU thread count of torch and OpenMP"),
    "MKL_NUM_THREADS": ("an integer >= 1", _integer(1), "MKL's thread count"),
    "ENERGY_FLOW_ROOT": ("a directory (the project's checkout)", _directory, "where the project is"),
    "ENERGY_FLOW_RUNS_DIR": ("a directory, or a path to make one at", _directory, "where runs/<stage>.json go"),
}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Each variable of VARIABLES that is set against what it may hold; the first that is not stops,
    named. A rank at or past the world size is refused too."""
    env = os.environ if environ is None else environ
    for name, (expected, allows, meaning) in VARIABLES.items():
        value = env.get(name)
        if value is not None and not allows(value):
            raise ConfigError(
                f"environment variable {name} = {_shown(value)}: expected {expected} ({meaning}); fix or unset it"
            )
    if "RANK" in env and "WORLD_SIZE" in env and int(env["RANK"]) >= int(env["WORLD_SIZE"]):
        raise ConfigError(
            f"environment variable RANK = {env['RANK']} with WORLD_SIZE = {env['WORLD_SIZE']}: expected a rank "
            "below the world size (torchrun sets both; unset them to run one process)"
        )


def _shown(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 10]}...' ({len(value)} characters)"


@contextlib.contextmanager
def temporary_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """`values` in os.environ for the block (None: unset), each variable's previous value (or its
    absence) back after. Not unittest.mock.patch.dict: it restores by emptying os.environ and
    filling it again, and this process's threads (MLflow's logging queue, the system-metrics
    sampler) would meet an empty environment in between; this touches only the named variables."""
    saved = {k: os.environ.get(k) for k in values}

    def put(pairs: Mapping[str, str | None]) -> None:
        for k, v in pairs.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(values)
    try:
        yield
    finally:
        put(saved)
