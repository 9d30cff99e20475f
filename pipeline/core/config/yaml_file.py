"""Reading a config file (params.yaml, conf/config.yaml) before Hydra and OmegaConf see it.

A file that does not parse into a mapping of sections is named with its line, not a traceback from
deep inside Hydra (an edited params.yaml, a merge conflict left in it). A file that is too large, or
whose anchors and aliases expand to more values than any config holds (a "billion laughs" alias
bomb: ten lines that OmegaConf would copy out into millions of nodes for minutes), is refused
before anything expands it. PyYAML's own loader keeps an alias as one shared object, so parsing
and counting here costs what the file's text costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pipeline.core.config.schema import Config
from pipeline.core.errors import ConfigError

# The committed params.yaml is a few kilobytes with a few hundred values; the limits leave room
# for a hundred times that and refuse a file no config needs. They are not config keys: they
# guard the reading of the config itself.
MAX_BYTES = 1 << 20
MAX_VALUES = 100_000  # values after every alias is expanded, as OmegaConf would copy them out
SECTIONS = "run, embed, model, train, ..."


def load_checked(path: Path) -> dict:
    """`path` parsed with yaml.safe_load into {section: mapping}, or one ConfigError that names it."""
    import yaml

    loader = yaml.SafeLoader(_read(path))
    try:
        root = loader.get_single_node()  # parsed once: counted, then built (what yaml.safe_load does)
        values = _expanded_size(root, {})
        if values > MAX_VALUES:
            raise ConfigError(
                f"{path}: its anchors and aliases (&name / *name) expand to more than {MAX_VALUES:,} values; "
                f"a config holds a few hundred: expected the sections {SECTIONS} written out, as in conf/config.yaml "
                f"(`git diff {path.name}` shows what changed)"
            )
        doc = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}: not valid YAML{where} ({problem}); expected the sections {SECTIONS} as in conf/config.yaml "
            f"(`git diff {path.name}` shows what changed)"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config; expected the sections {SECTIONS}") from None
    finally:
        loader.dispose()
    if doc is None or doc == {}:
        raise ConfigError(
            f"{path} is empty; expected the sections {SECTIONS} as conf/ composes them: restore it with "
            f"`git checkout {path.name}`, or compose conf/ instead with a preset (`preset=default` on the "
            "command line, or `dvc exp run -S preset=default`)"
        )
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: holds a {type(doc).__name__}, expected a mapping of sections (run, embed, ...)")
    for section, value in doc.items():
        if section in Config.__dataclass_fields__ and not isinstance(value, dict):
            shown = "empty" if value is None else repr(value)
            raise ConfigError(
                f"{path}: section '{section}' is {shown}, expected a mapping of its keys "
                f"({', '.join(sorted(OmegaConf.structured(Config)[section].keys())[:6])}, ...)"
            )
    return doc


def _read(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(
                f"{path}: {size:,} bytes, more than a config file may hold ({MAX_BYTES:,}); expected the sections "
                f"{SECTIONS} as in conf/config.yaml (`git diff {path.name}` shows what changed)"
            )
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}); save it as UTF-8"
        ) from None


def _expanded_size(node: Any, seen: dict[int, int]) -> int:
    """How many values `node` stands for once every alias is copied out; an alias is the same node
    object as its anchor, so each distinct node is counted once and reused."""
    import yaml

    key = id(node)
    if key in seen:
        return seen[key]
    seen[key] = MAX_VALUES + 1  # a node that refers to itself (a recursive alias) never ends
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_size(k, seen) + _expanded_size(v, seen) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_size(v, seen) for v in node.value)
    else:
        total = 1
    seen[key] = min(total, MAX_VALUES + 1)
    return seen[key]
