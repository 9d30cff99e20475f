"""Which files a dataset spec names: one file, a directory's dataset files, or a glob's matches;
and what each entry that is not read was skipped for."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from pipeline.core.errors import ConfigError, DatasetError
from pipeline.data.readers.common import EXTENSIONS


def dataset_files(spec: str | os.PathLike, *, allowed_root: Path | None = None) -> list[Path]:
    """The files a dataset spec names: one file, every file with a known extension in a
    directory (sorted, not recursive; hidden files are not read), or a glob pattern (sorted).
    With `allowed_root`, every file must resolve (`..` and symlinks followed) inside it, else
    ConfigError."""
    return dataset_listing(spec, allowed_root=allowed_root)[0]


def dataset_listing(
    spec: str | os.PathLike, *, allowed_root: Path | None = None
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(files to read, [(path, reason) for every directory entry or glob match not read])."""
    text = str(spec)
    path = Path(text)
    skipped: list[tuple[Path, str]] = []
    try:
        if any(c in text for c in "*?["):
            files, skipped, where = _glob_files(text, path)
        elif not path.exists():
            raise not_found(path, directory=text.endswith(("/", os.sep)))
        elif path.is_dir():
            files, skipped = _directory_files(path)
            where = "the directory holds"
        else:
            files, where = [path], "the file"
        if allowed_root is not None:
            root = Path(allowed_root).resolve()
            for f in files:
                real = f.resolve()
                if not real.is_relative_to(root):
                    raise ConfigError(
                        f"embed.dataset = {text!r}: {where} {f}, which resolves to {real}, outside the project "
                        f"({root}); expected files inside it, or set run.allow_external_paths=true to allow it"
                    )
    except OSError as e:
        raise DatasetError(
            f"{text}: cannot be listed ({e.strerror or e}: {e.filename or text}); expected a "
            "readable dataset file, directory or glob pattern"
        ) from e
    except ValueError as e:  # a NUL in the path
        raise DatasetError(
            f"{text!r}: not a usable path ({e}); expected a dataset file, directory or glob pattern"
        ) from None
    return files, skipped


def _glob_files(text: str, path: Path) -> tuple[list[Path], list[tuple[Path, str]], str]:
    root = Path(path.anchor) if path.is_absolute() else Path(".")
    pattern = str(path.relative_to(root)) if path.is_absolute() else text
    try:
        matches = sorted(root.glob(pattern))
    except (ValueError, NotImplementedError) as e:
        raise DatasetError(
            f"{text}: invalid glob pattern ({e}); expected a pattern such as 'data/raw/part-*.jsonl'"
        ) from None
    # A pattern whose last part does not start with '.' does not mean hidden files (.DS_Store,
    # macOS's ._name.csv resource forks), though pathlib's glob matches them.
    files, skipped = _partition(matches, hidden_ok=path.name.startswith("."), need_extension=False)
    if not files:
        held = f" (it matches only: {_describe(skipped)})" if skipped else ""
        fixed = Path(
            *[p for p in path.parts[: next(i for i, p in enumerate(path.parts) if any(c in p for c in "*?["))]] or ["."]
        )
        near = "" if fixed.is_dir() else f"; {fixed} does not exist (nearest existing parent: {_nearest_parent(fixed)})"
        raise DatasetError(f"{text}: no file matches this pattern{held}{near}; expected one or more dataset files")
    return files, skipped, "the glob matches"


def _partition(paths: list[Path], hidden_ok: bool, need_extension: bool) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the paths read, [(path, why not)] for the others), in the given order."""
    files, skipped = [], []
    for p in paths:
        reason = _skip_reason(p, hidden_ok=hidden_ok, need_extension=need_extension)
        if reason:
            skipped.append((p, reason))
        else:
            files.append(p)
    return files, skipped


def _directory_files(path: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    files, skipped = _partition(sorted(path.iterdir()), hidden_ok=False, need_extension=True)
    if not files:
        held = f"it holds: {_describe(skipped)}" if skipped else "it is empty"
        raise DatasetError(
            f"{path}: directory holds no dataset file ({held}); expected files ending in "
            f"{', '.join(sorted(EXTENSIONS))}"
        )
    return files, skipped


def _skip_reason(p: Path, hidden_ok: bool, need_extension: bool) -> str:
    """Why a directory entry or glob match is not read ("" = it is read)."""
    if p.name.startswith(".") and not hidden_ok:
        return "hidden file (name starts with '.')" if not p.is_dir() else "hidden directory"
    if p.is_dir():
        return "a directory (subdirectories are not read)"
    if not p.exists() and p.is_symlink():
        return f"broken symbolic link (to {os.readlink(p)})"
    if not p.is_file():
        return "not a regular file"
    if need_extension and p.suffix.lower() not in EXTENSIONS:
        return f"unsupported extension {p.suffix.lower() or '(none)'!r}"
    return ""


def _describe(entries: list[tuple[Path, str]], limit: int = 10) -> str:
    shown = [f"{p.name} ({why})" for p, why in entries[:limit]]
    more = f" and {len(entries) - limit} more" if len(entries) > limit else ""
    return ", ".join(shown) + more


def _nearest_parent(path: Path) -> str:
    for parent in path.parents:
        if parent.is_dir():
            return str(parent) if str(parent) != "." else "the current directory"
    return "none"


def not_found(path: Path, directory: bool = False) -> DatasetError:
    """'not found' for a path that does not exist: the nearest existing parent, a close name."""
    if path.is_symlink():
        return DatasetError(
            f"{path}: broken symbolic link (it points to {os.readlink(path)}, which does not "
            "exist); expected a dataset file"
        )
    near = _nearest_parent(path)
    close = ""
    if path.parent.is_dir():
        try:
            names = [p.name for p in path.parent.iterdir()]
        except OSError:
            names = []
        match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
        close = f"; did you mean {match[0]!r}?" if match else ""
    ext = path.suffix.lower()
    if directory:
        path = f"{path}{os.sep}"
    elif ext:
        fmt = EXTENSIONS.get(ext)
        what = f"a {fmt} dataset" if fmt else "a dataset file"
        return DatasetError(f"{path}: file not found (nearest existing parent: {near}{close}); expected {what}")
    return DatasetError(
        f"{path}: does not exist (no such file or directory; nearest existing parent: {near}"
        f"{close}); expected a dataset file, a directory of dataset files or a glob pattern"
    )
