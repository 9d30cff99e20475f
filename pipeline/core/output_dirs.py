"""Where a stage may write, and what it may replace: outputs never destroy inputs.

Every directory a stage writes into or replaces is named by a config key (OUTPUTS);
`check_outputs(cfg, stage)` refuses, before any work and naming the key, one placed where it
would overwrite or delete what is not its own, and a directory a stage creates carries its mark
(MARK). docs/bad-inputs.md ("Paths that are let in, and outputs that never destroy inputs") lists
the rules, and why under DVC (DVC_STAGE set) embed.out_dir and train.out_dir stay at DVC_OUTPUTS.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from omegaconf import OmegaConf

from pipeline.core.errors import ConfigError
from pipeline.core.output_transaction import is_staging
from pipeline.core.paths import REPO_ROOT

MARK = ".energy-flow-output.json"
# Parts of the project no output may be, contain or lie inside (besides the root itself).
PROJECT_PARTS = (
    ".git",
    ".dvc",
    ".ci",
    ".venv",
    "conf",
    "pipeline",
    "stages",
    "tools",
    "tests",
    "bench",
    "docs",
    "mlruns",
    ".mlflow-pending",
)
# Where stages write fixed files (dvc.yaml): a configured output directory must not overlap them.
FIXED_OUTPUT_DIRS = ("metrics", "telemetry", "reports", "baselines")
_SHOWN = 3  # files named in a message when a directory holds more


def _temp_of(names: Iterable[str]) -> Callable[[str], bool]:
    """A hidden temp file atomic.py writes beside one of `names` (`.model.pt.<pid>.<random>.tmp`)."""
    pattern = re.compile(r"^\.(" + "|".join(re.escape(n) for n in names) + r")\..+\.tmp$")
    return lambda name: bool(pattern.match(name))


@dataclass(frozen=True)
class Kind:
    """What a stage keeps in a directory of its own. A directory made before marks existed is
    recognised by what it holds: the `files` named here, or (shards, the embedding cache, which
    have no fixed names) their own layout (see _foreign_files)."""

    name: str
    stage: str
    what: str  # for messages: "embedding shards"
    replaces: bool  # the stage swaps the whole directory (anything else in it would be lost)
    files: tuple[str, ...] = ()  # the files it writes there (beside MARK); () = no fixed names


SHARDS = Kind("shards", "embed", "embedding shards", replaces=True)
EMBEDDING_CACHE = Kind("embedding-cache", "embed", "the embedding cache", replaces=False)
MODEL = Kind("model", "train", "the trained model", replaces=False, files=("model.pt", "run.json"))
CHECKPOINTS = Kind("checkpoints", "train", "resumable checkpoints", replaces=False, files=("last.pt",))


# What dvc.yaml declares as the `outs` of embed and train (tests/test_output_dirs.py holds the two
# to each other).
DVC_OUTPUTS = {"embed.out_dir": "data/shards", "train.out_dir": "models"}

# key -> what its directory holds
OUTPUTS = {
    "embed.out_dir": SHARDS,
    "embed.cache_dir": EMBEDDING_CACHE,
    "train.out_dir": MODEL,
    "train.checkpoint_dir": CHECKPOINTS,
}


# --------------------------------------------------------------------------- marks


def mark_text(kind: Kind) -> str:
    """The mark's content: fixed per kind, so identical runs give identical DVC outputs."""
    note = (
        f"this directory holds {kind.what}; the {kind.stage} stage made it, writes into it"
        f"{' and replaces it as a whole' if kind.replaces else ''}. A stage writes only into a directory it "
        "made (this file says so), an empty one, or one holding only its own files."
    )
    mark = {"kind": kind.name, "made_by": f"the energy-flow {kind.stage} stage", "note": note}
    return json.dumps(mark, indent=2, sort_keys=True) + "\n"


def write_mark(directory: Path, kind: Kind) -> None:
    (Path(directory) / MARK).write_text(mark_text(kind), encoding="utf-8")


def read_mark(directory: Path) -> str | None:
    """The kind named by the mark in `directory`, "?" for an unreadable mark, None for none."""
    path = Path(directory) / MARK
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


# What the embed stage writes in a shard directory (pipeline/data/shards.py, formats 1 and 2).
_SHARD_FILE = re.compile(r"^(manifest\.json|[A-Za-z0-9][A-Za-z0-9_-]*(\.parquet|(-\d{5})?_(inputs|targets)\.npy))$")


def _not_shards(directory: Path, names: list[str]) -> list[str]:
    """The entries that are not the embed stage's: a shard directory holds manifest.json and the
    files it lists (or, where the manifest is unreadable, files named as shards are)."""
    try:
        listed = set(json.loads((directory / "manifest.json").read_text(encoding="utf-8"))["files"])
        ours = lambda n: n == "manifest.json" or n in listed  # noqa: E731
    except (OSError, ValueError, KeyError, TypeError):
        ours = _SHARD_FILE.match  # a person's notes.parquet would pass here: only without a manifest
    return [n for n in names if not (ours(n) and (directory / n).is_file())]


def _legacy_cache(directory: Path, names: list[str]) -> bool:
    """<root>/<24 hex: teacher key>/part-N.parquet (pipeline/embed/cache.py), and temp parts."""
    for n in names:
        sub = directory / n
        if not (re.fullmatch(r"[0-9a-f]{24}", n) and sub.is_dir() and not sub.is_symlink()):
            return False
        if not all(re.fullmatch(r"\.?part-.*\.(parquet|tmp)", p.name) for p in sub.iterdir()):
            return False
    return True


def _foreign_files(directory: Path, kind: Kind, names: list[str]) -> list[str]:
    """The entries of an unmarked `directory` that `kind`'s stage did not write."""
    if kind is SHARDS:  # made before marks: only with its manifest is it recognisably shards
        return _not_shards(directory, names) if "manifest.json" in names else names
    if kind is EMBEDDING_CACHE:
        return [] if _legacy_cache(directory, names) else names
    temp = _temp_of(kind.files)
    return [n for n in names if n not in kind.files and not temp(n) and not is_staging(n)]


def _listing(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(sorted(names)[:_SHOWN]) + more


def ownership_problem(directory: Path, kind: Kind) -> str | None:
    """Why `kind`'s stage may not write into (or replace) `directory`, or None when it may: it does
    not exist yet, is empty, carries `kind`'s mark, or holds only what that stage writes."""
    directory = Path(directory)
    if not directory.exists() and not directory.is_symlink():
        return None
    if not directory.is_dir():
        what = "a symlink to nowhere" if directory.is_symlink() and not directory.exists() else "an existing file"
        return f"is {what}, not a directory"
    names = sorted(n for n in os.listdir(directory) if n != MARK)
    found = read_mark(directory)
    if found is not None and found != kind.name:
        made = next((k for k in OUTPUTS.values() if k.name == found), None)
        holds = f"{made.what}, marked by the {made.stage} stage" if made else f"a mark it cannot read ({MARK})"
        return f"holds {holds}, not {kind.what}"
    if found is None:
        foreign = _foreign_files(directory, kind, names)
        if foreign:
            return f"is an existing directory the {kind.stage} stage did not create: it holds {_listing(foreign)}" + (
                ", which replacing it would delete" if kind.replaces else ""
            )
        return None
    if kind is SHARDS and names:
        # Marked: the stage made it; but it is replaced as a whole, so nothing else may be in it.
        foreign = _not_shards(directory, names)
        if foreign:
            return (
                f"holds {_listing(foreign)}, which the embed stage did not write (its manifest does not list "
                "them) and replacing the directory would delete"
            )
    return None


def claim(directory: str | os.PathLike, kind: Kind, key: str | None = None) -> Path:
    """Make `directory` (parents included) if it is missing, check it is `kind`'s, mark it, and
    remove the hidden temp files a killed writer of `kind` left in it. Returns the path."""
    directory = Path(directory)
    problem = ownership_problem(directory, kind)
    if problem:
        raise ConfigError(
            _message(
                key or "output directory", str(directory), directory.resolve(), problem, _ownership_advice(kind, key)
            )
        )
    directory.mkdir(parents=True, exist_ok=True)
    if read_mark(directory) != kind.name:
        write_mark(directory, kind)
    if kind.files:
        temp = _temp_of(kind.files)
        for name in os.listdir(directory):
            if temp(name):
                with contextlib.suppress(OSError):
                    (directory / name).unlink()
    return directory


def remove_stale_siblings(directory: Path, kind: Kind) -> None:
    """Temporary directories a killed writer left beside `directory` (`.shards.x1y2.tmp`, `.old`):
    each is removed only if it carries `kind`'s mark, which the writer puts in first."""
    directory = Path(directory)
    if not directory.parent.is_dir():
        return
    for sibling in directory.parent.glob(f".{glob.escape(directory.name)}.*"):
        if (
            sibling.suffix in (".tmp", ".old")
            and sibling.is_dir()
            and not sibling.is_symlink()
            and read_mark(sibling) == kind.name
        ):
            shutil.rmtree(sibling, ignore_errors=True)


# --------------------------------------------------------------------------- the whole layout


def _resolve(value: str) -> Path:
    p = Path(value)
    return (p if p.is_absolute() else REPO_ROOT / p).resolve()


def _related(a: Path, b: Path) -> str | None:
    """How path a relates to b: "is", "lies inside", "contains", or None."""
    if a == b:
        return "is"
    if a.is_relative_to(b):
        return "lies inside"
    if b.is_relative_to(a):
        return "contains"
    return None


def _dataset_paths(spec: str) -> list[Path]:
    """What embed.dataset names, resolved: the file or directory, or each glob match."""
    if any(c in spec for c in "*?["):
        pattern = spec if os.path.isabs(spec) else str(REPO_ROOT / spec)
        return sorted({Path(m).resolve() for m in glob.glob(pattern)})
    return [_resolve(spec)]


def _message(key: str, value: str, resolved: Path, problem: str, advice: str) -> str:
    where = f" resolves to {resolved}, which" if str(resolved) != value else ""
    return f"parameter '{key}' = {value!r}{where} {problem}; {advice}"


def _default_value(key: str):
    from pipeline.core.config import default_values

    return OmegaConf.select(default_values(), key)


def _default(key: str | None) -> str:
    value = _default_value(key) if key else None
    return f" (its default is {value!r})" if value else ""


def _layout_advice(kind: Kind, key: str) -> str:
    what = "replaces it as a whole" if kind.replaces else "writes into it"
    return f"the {kind.stage} stage {what}, so it needs a directory of its own: set {key} to one{_default(key)}"


def _ownership_advice(kind: Kind, key: str | None) -> str:
    what = "replaces" if kind.replaces else "writes into"
    return (
        f"the {kind.stage} stage {what} only a new or empty directory, or one it made (marked by the file {MARK}): "
        f"move those files elsewhere, or set {key or 'the output directory'} to another directory{_default(key)}"
    )


def layout_problems(cfg) -> list[tuple[str, str, Path, str]]:
    """(key, value, resolved, problem) for every configured output directory placed where it would
    overwrite or delete something that is not its own (see the module doc); from config alone,
    except for expanding embed.dataset's glob. Empty when all is well."""
    root = REPO_ROOT.resolve()
    outputs = [(key, str(v), _resolve(str(v))) for key in OUTPUTS if (v := OmegaConf.select(cfg, key))]
    fixed = [(f"{d}/ (where the stages write fixed files)", root / d) for d in FIXED_OUTPUT_DIRS]
    inputs = _dataset_paths(str(cfg.embed.dataset))
    problems: dict[str, tuple[str, str, Path, str]] = {}
    for key, value, path in outputs:
        problem = None
        if path == root or root.is_relative_to(path):
            problem = "is the project root" if path == root else f"holds the project ({root})"
        elif any(part == ".git" for part in path.parts) or (path / ".git").exists():
            problem = "is, holds or lies inside a git repository's .git"
        else:
            for part in PROJECT_PARTS:
                how = _related(path, root / part)
                if how:
                    problem = f"{how} the project's {part}/"
                    break
        if problem is None:
            for data in inputs:
                how = _related(path, data)
                if how:
                    problem = (
                        f"{how} the dataset (embed.dataset = {str(cfg.embed.dataset)!r}"
                        f"{'' if data == _resolve(str(cfg.embed.dataset)) else f', which reads {data}'})"
                    )
                    break
        if problem:
            problems[key] = (key, value, path, problem)
    # Outputs against each other, once a pair, and not against one already refused above (inside a
    # project that is itself an output, everything overlaps). A pair is reported on the key that
    # differs from its default (the one just changed), else on the later one.
    placed = [(k, v, p) for k, v, p in outputs if k not in problems]
    changed = {k for k, v, _ in placed if v != _default_value(k)}
    for i, (key, value, path) in enumerate(placed):
        for other_key, other in [(k, p) for k, _, p in placed[:i]] + fixed:
            how = _related(path, other)
            if not how or key in problems or other_key in problems:
                continue
            if other_key in changed and key not in changed:  # blame the other one, from its side
                other_value = next(v for k, v, _ in placed if k == other_key)
                problem = f"{_related(other, path)} another output: {key} ({path})"
                problems[other_key] = (other_key, other_value, other, problem)
            else:
                shown = other_key if other_key.endswith(")") else f"{other_key} ({other})"
                problems[key] = (key, value, path, f"{how} another output: {shown}")
    return [problems[key] for key in OUTPUTS if key in problems]


def check_outputs(cfg, stage: str) -> None:
    """Before any work: the layout of every output (all stages: one bad key stops them all, before
    DVC reaches the stage that would write there), then that each directory `stage` writes is
    its own to write (ownership_problem). Raises ConfigError naming the key."""
    if os.environ.get("DVC_STAGE"):
        for key, declared in DVC_OUTPUTS.items():
            value = str(OmegaConf.select(cfg, key))
            if _resolve(value) != _resolve(declared):
                stage_of = OUTPUTS[key].stage
                raise ConfigError(
                    f"parameter '{key}' = {value!r}: under DVC (dvc repro, dvc exp run) the {stage_of} stage's output "
                    f"is {declared}, as dvc.yaml declares it; DVC would neither track nor restore {value}. Set "
                    f"{key}={declared}, or run the stage by hand to write elsewhere "
                    f"(python -m stages.{stage_of} {key}={value})"
                )
    problems = [
        _message(key, value, path, problem, _layout_advice(OUTPUTS[key], key))
        for key, value, path, problem in layout_problems(cfg)
    ]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"{len(problems)} output directories are misplaced:\n{listing}")
    for key, kind in OUTPUTS.items():
        value = OmegaConf.select(cfg, key)
        if kind.stage != stage or not value:
            continue
        path = _resolve(str(value))
        problem = ownership_problem(path, kind)
        if problem:
            raise ConfigError(_message(key, str(value), path, problem, _ownership_advice(kind, key)))
