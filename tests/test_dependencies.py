"""pyproject.toml declares the direct dependencies and requirements.lock pins everything: the two
agree, torch is the CPU build, and the environment the tests run in is exactly the lock."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

import pytest
from packaging.utils import canonicalize_name

from pipeline.core.paths import REPO_ROOT

pytestmark = pytest.mark.unit

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def _lock() -> dict[str, str]:
    pins = {}
    for n, line in enumerate((REPO_ROOT / "requirements.lock").read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"requirements.lock line {n}: {line!r} is not NAME==VERSION"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"requirements.lock pins {name} twice"
        pins[name] = match.group(2)
    return pins


def _declared() -> dict[str, str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for spec in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        match = PIN.match(spec)
        assert match, f"pyproject.toml: {spec!r} is not pinned (NAME==VERSION)"
        out[canonicalize_name(match.group(1))] = match.group(2)
    return out


def test_every_declared_dependency_is_pinned_to_the_locks_version():
    lock = _lock()
    declared = _declared()
    assert {name: (version, lock.get(name)) for name, version in declared.items() if lock.get(name) != version} == {}


def test_the_lock_pins_the_cpu_build_of_torch():
    assert _lock()["torch"] == "2.13.0+cpu"
    assert _declared()["torch"] == "2.13.0+cpu"


def test_the_environment_is_the_lock():
    wrong = {}
    for name, version in _lock().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert wrong == {}, "installed packages differ from requirements.lock (./dev re-installs when the lock changes)"
